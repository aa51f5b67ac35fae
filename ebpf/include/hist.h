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
 * floor(log2(v)) for v > 0, by binary search: the bpf target has no
 * count-leading-zeros instruction, and this is 6 compare-and-shift steps.
 */
static __always_inline __u32 hist_log2(__u64 v)
{
	__u32 r = 0, shift;

	shift = (v > 0xFFFFFFFFULL) << 5;
	v >>= shift;
	r |= shift;
	shift = (v > 0xFFFF) << 4;
	v >>= shift;
	r |= shift;
	shift = (v > 0xFF) << 3;
	v >>= shift;
	r |= shift;
	shift = (v > 0xF) << 2;
	v >>= shift;
	r |= shift;
	shift = (v > 0x3) << 1;
	v >>= shift;
	r |= shift;
	r |= (__u32)(v >> 1);
	return r;
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
