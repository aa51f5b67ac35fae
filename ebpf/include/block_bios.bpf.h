/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * block_bios.bpf.h - the bios a request's completion finishes, for
 * block.bpf.c's completion (its only includer): each one's slot found and
 * released and its submit-to-complete time added to `total`.
 */
#ifndef STALLTRACE_BLOCK_BIOS_BPF_H
#define STALLTRACE_BLOCK_BIOS_BPF_H

#include "block_state.bpf.h"

/*
 * Request-based disks do not trace bio completion (blk_update_request clears
 * BIO_TRACE_COMPLETION: the request's completion is traced instead), so the
 * bios a completion finishes are walked here: each one's submit-to-complete
 * time goes into `total`. A request holds at most max_segments bios (128-256
 * on common drivers; many only for merged writeback); past
 * MAX_BIOS_PER_COMPLETION the rest are counted as lost. The walk stops at the
 * first bio the request has not finished, so it costs one step per bio done.
 */
#define MAX_BIOS_PER_COMPLETION 256

/*
 * Where a completion's statistics are, as numbers: `fast` is its index in
 * block_stats_fast plus one, or 0 for its (disk, op) entry in block_stats,
 * which the completion has made by the time it calls bio_finished().
 */
struct stats_place {
	__u32 fast;
	__u32 op;
	__u64 disk_id; /* major << 32 | first minor */
};

/*
 * A bio past a completion's first: its slot found and released, its
 * submit-to-complete time added to `total`. A global function, so that the
 * verifier checks it once, on its own, rather than once per step of the walk
 * below: inlined, each step's paths (the slot search's probes, the
 * histogram's bucket) cost the verifier hundreds of instructions, and the
 * walk's 256 steps were most of what loading the block family cost (seconds
 * of kernel time, tens of seconds in a TCG guest: BENCHMARKS.md, "Loading").
 * Its arguments are numbers: 5.10's verifier passes global functions nothing
 * else but the context, so it looks the statistics up again (an array
 * index on the disks the daemon placed in block_stats_fast).
 */
__noinline int bio_finished(__u64 key, __u64 now, __u32 fast, __u32 op, __u64 disk_id)
{
	struct block_key stats_key = { .major = disk_id >> 32, .minor = (__u32)disk_id, .op = op };
	struct block_stats *stats;
	__u32 slot_index, fast_index = fast - 1;
	struct bio_slot *slot;

	slot = slot_find(&bio_slots, BIO_SLOT_BITS, key, &slot_index);
	if (!slot)
		return 0;
	if (fast)
		stats = bpf_map_lookup_elem(&block_stats_fast, &fast_index);
	else
		stats = bpf_map_lookup_elem(&block_stats, &stats_key);
	if (stats) {
		stats->bios += 1;
		hist_add_alone(&stats->total, now - slot->head.stamp_ns);
	}
	slot_release(slot);
	return 1;
}

static __always_inline void complete_bios(struct request *rq, struct block_stats *stats,
					  const struct stats_place *place, unsigned int nr_bytes, __u64 now,
					  struct bio_slot *first)
{
	struct bio *bio = KREAD(rq, bio);
	struct bio_slot *slot;
	__u32 size, index;
	__u64 done;
	int i;

	/* the first bio inline: its slot's copy is the request's origin (phases, slow_io) */
	if (!bio)
		return;
	size = KREAD(bio, bi_iter.bi_size);
	if (size > nr_bytes)
		return; /* not finished by this (partial) completion */
	done = size;
	slot = slot_find(&bio_slots, BIO_SLOT_BITS, ptr_key(bio, PROG_RQ_COMPLETE), &index);
	if (slot) {
		*first = *slot;
		stats->bios += 1;
		hist_add_alone(&stats->total, now - slot->head.stamp_ns);
		slot_release(slot);
	}
	bio = KREAD(bio, bi_next);
	for (i = 1; i < MAX_BIOS_PER_COMPLETION; i++) {
		if (!bio)
			return;
		size = KREAD(bio, bi_iter.bi_size);
		if (done + size > nr_bytes)
			return;
		done += size;
		bio_finished(ptr_key(bio, PROG_RQ_COMPLETE), now, place->fast, place->op, place->disk_id);
		bio = KREAD(bio, bi_next);
	}
	if (bio)
		count_lost(LOST_BIO_CHAIN_TRUNCATED);
}

#endif /* STALLTRACE_BLOCK_BIOS_BPF_H */
