/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * hist.h - log-linear bucket math, written once for C. It compiles both for
 * the bpf target and for the host: userspace/build.rs compiles it into the
 * Rust test binary so that userspace/src/hist.rs (the Rust twin) is checked
 * against this very code at edge values.
 */
#ifndef STALLTRACE_HIST_H
#define STALLTRACE_HIST_H

#include "abi.h"

#ifndef __always_inline
#define __always_inline inline __attribute__((always_inline))
#endif

/*
 * floor(log2(v)) for v > 0, without a branch: the top bit copied into every
 * lower one, then the ones counted. The bpf target has no count-leading-zeros
 * instruction, and the verifier walks every way through a branch: a binary
 * search's five made each histogram add 32 paths to verify, inside the
 * block completion's walk of up to 256 bios a third of a million
 * instructions (block.bpf.c, complete_bios()).
 */
static __always_inline __u32 hist_log2(__u64 v)
{
	v |= v >> 1;
	v |= v >> 2;
	v |= v >> 4;
	v |= v >> 8;
	v |= v >> 16;
	v |= v >> 32;
	v -= (v >> 1) & 0x5555555555555555ULL;
	v = (v & 0x3333333333333333ULL) + ((v >> 2) & 0x3333333333333333ULL);
	v = (v + (v >> 4)) & 0x0F0F0F0F0F0F0F0FULL;
	return (__u32)((v * 0x0101010101010101ULL) >> 56) - 1;
}

/* Bucket index of v, in [0, HIST_BUCKETS). */
static __always_inline __u32 hist_bucket_index(__u64 v)
{
	__u32 power, shift;

	if (v < HIST_SUBBUCKETS)
		return (__u32)v;
	power = hist_log2(v);
	shift = power - HIST_GROUPING_POWER;
	/* (v >> shift) is in [16, 32): its low 4 bits pick the linear sub-bucket. */
	return ((shift + 1) << HIST_GROUPING_POWER) +
	       (__u32)((v >> shift) - HIST_SUBBUCKETS);
}

#endif /* STALLTRACE_HIST_H */
