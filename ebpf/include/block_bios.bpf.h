/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * block_bios.bpf.h - the bios a request's completion finishes, for
 * block.bpf.c's completion (its only includer): each one's submission found
 * (the first bio's in the request's slot, where the issue took it over; the
 * others' in their bio slots, released here) and its submit-to-complete time
 * added to `total`.
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

/*
 * The bios a completion finishes after its first, from `next` (the first's
 * bi_next), `done` bytes of the `nr_bytes` completed being the first's
 * (packed: done << 32 | nr_bytes; `place`: fast << 32 | op; five arguments
 * at most). A global function like bio_finished(), for the same reason:
 * verified once, not once per state its caller reaches it in (6.1's
 * verifier walks each of the 256 steps at length: BENCHMARKS.md,
 * "Loading"). Its pointers are numbers, so it reads with probe reads.
 */
__noinline int finish_later_bios(__u64 next, __u64 done_of, __u64 now, __u64 place, __u64 disk_id)
{
	__u64 done = done_of >> 32, nr_bytes = (__u32)done_of;
	struct bio *bio = (struct bio *)next;
	__u32 size;
	int i;

	for (i = 1; i < MAX_BIOS_PER_COMPLETION && bio; i++) {
		size = BPF_CORE_READ(bio, bi_iter.bi_size);
		if (done + size > nr_bytes)
			return 0;
		done += size;
		bio_finished((__u64)bio, now, place >> 32, (__u32)place, disk_id);
		bio = BPF_CORE_READ(bio, bi_next);
	}
	if (bio)
		count_lost(LOST_BIO_CHAIN_TRUNCATED);
	return 0;
}

/*
 * `life` is the request's slot if it belongs to the life now completing,
 * else NULL. Returns whether the first bio's submission was found; `first`
 * then holds it, its disk, and (for an I/O a slow_io event may report) its
 * submitter.
 */
static __always_inline bool complete_bios(struct request *rq, struct block_stats *stats,
					  const struct stats_place *place, unsigned int nr_bytes, __u64 now,
					  struct block_rq_slot *life, struct bio_slot *first)
{
	struct bio *bio = KREAD(rq, bio);
	struct bio_slot *slot;
	__u32 size, index;
	__u64 done;

	/* the first bio inline: its submission is the request's origin (phases, slow_io) */
	if (!bio)
		return false;
	size = KREAD(bio, bi_iter.bi_size);
	if (size > nr_bytes)
		return false; /* not finished by this (partial) completion */
	done = size;
	/* most requests hold one bio: no call, no key, for them */
	if (KREAD(bio, bi_next))
		finish_later_bios(ptr_key(KREAD(bio, bi_next), PROG_RQ_COMPLETE), (__u64)done << 32 | nr_bytes,
				  now, (__u64)place->fast << 32 | place->op, place->disk_id);
	if (life && life->origin_ns) {
		/*
		 * Taken over at the issue (take_origin() in block.bpf.c), and no
		 * completion finished it yet: the kernel advances rq->bio only past
		 * finished bios, so this is that bio. The submitter is in the slot's
		 * second line: read only for a slow one.
		 */
		first->head.owner = 1; /* known */
		first->head.stamp_ns = life->origin_ns;
		first->major = life->disk_id >> 32;
		first->minor = (__u32)life->disk_id;
		if (slow_io_ns && now - life->origin_ns >= slow_io_ns) {
			first->tgid = life->origin_tgid;
			first->pid = life->origin_pid;
			first->reported = life->origin_reported;
			__builtin_memcpy(first->comm, life->origin_comm, sizeof(first->comm));
		}
		life->origin_ns = 0;
	} else {
		slot = slot_find(&bio_slots, BIO_SLOT_BITS, ptr_key(bio, PROG_RQ_COMPLETE), &index);
		if (!slot)
			return false;
		*first = *slot;
		slot_release(slot);
	}
	stats->bios += 1;
	hist_add_alone(&stats->total, now - first->head.stamp_ns);
	return true;
}

#endif /* STALLTRACE_BLOCK_BIOS_BPF_H */
