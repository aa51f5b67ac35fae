/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * block_state.bpf.h - the block family's state, for block.bpf.c: the
 * per-(disk, op) statistics, the disk table, the per-bio and per-request
 * slot tables, and the lookups into them. The hooks that keep them are in
 * block.bpf.c.
 */
#ifndef STALLTRACE_BLOCK_STATE_BPF_H
#define STALLTRACE_BLOCK_STATE_BPF_H

#include "common.bpf.h"
#include "slots.bpf.h"

/* Set by the daemon at load time (--slow-io-ms); 0 sends no slow_io events. */
const volatile __u64 slow_io_ns = 0;

/*
 * Per-CPU aggregates per (disk, op). Not preallocated: a value is ~20 KiB
 * per CPU, and only the (disk, op) pairs that see I/O should cost memory
 * (the daemon creates the common ones ahead of the first I/O).
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 320); /* 64 disks x BLOCK_OP_COUNT */
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct block_key);
	__type(value, struct block_stats);
} block_stats SEC(".maps");

/*
 * The same statistics for the disks present at the start (abi.h, block_disk.fast):
 * the daemon sets max_entries at load to BLOCK_FAST_OPS per such disk, so it
 * preallocates only what the hash would hold for them.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct block_stats);
} block_stats_fast SEC(".maps");

/* One all-zero block_stats: the initial value of a new block_stats entry (too big for the stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct block_stats);
} block_stats_zero SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << BLOCK_DISK_TABLE_BITS);
	__uint(map_flags, BPF_F_MMAPABLE); /* page-aligned: an entry's lines are its own (abi.h) */
	__type(key, __u32);
	__type(value, struct block_disk);
} block_disks SEC(".maps");

/*
 * The disks --disk names, filled by the daemon before it attaches; read only
 * by a run that names disks (disk_filter). One array entry, not a hash keyed
 * by disk: the verifier inlines an array lookup, and a run names a few disks,
 * so a few compares cost far less than the hash lookup that every hook paid
 * (about 45 ns a hook, 135 ns per I/O: docs/BENCHMARKS.md, "Driving the cost
 * down").
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct block_selected_disks);
} block_selected_disks SEC(".maps");

#define BIO_SLOT_BITS BLOCK_BIO_SLOT_BITS

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << BIO_SLOT_BITS);
	__uint(map_flags, BPF_F_MMAPABLE); /* page-aligned: each slot starts a cache line (abi.h) */
	__type(key, __u32);
	__type(value, struct bio_slot);
} bio_slots SEC(".maps");

/*
 * Requests from issue to completion (struct block_rq_slot, abi.h: the daemon
 * reads it too). rq->io_start_time_ns is only set when block stats are on;
 * and keeping our own record makes the in-flight gauge exact: only requests
 * whose issue was seen are ever subtracted, so requests in flight when we
 * attached cannot drive it negative. 4 MiB (abi.h says why a slot is 128 bytes).
 */
#define RQ_SLOT_BITS BLOCK_RQ_SLOT_BITS

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << RQ_SLOT_BITS);
	__uint(map_flags, BPF_F_MMAPABLE); /* page-aligned: each slot starts a cache line (abi.h) */
	__type(key, __u32);
	__type(value, struct block_rq_slot);
} rq_slots SEC(".maps");

/*
 * A request whose slot is still in flight when it is issued again, when the
 * kernel has freed it (the settle pass, block.bpf.c) or when its disk
 * idles completed without the completion hook settling it. Either
 * the kernel never ran the hook for that completion (block_stats.unseen: the
 * stream's `block.kernel_skipped`), or the hook ran and could not settle it:
 * it found no slot, or no statistics entry to count it in (the stream's
 * `completions_unseen`). What tells them apart: the hook notes here every
 * completion it leaves unsettled (besides such failures, requests issued
 * before we attached and the flush machinery's original request, which have
 * no slot), the request's address and when it completed, by the request's
 * home slot. Two plain u64 arrays, read by the daemon too (reconcile.rs).
 * Written only on that path: nothing on the common one.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << RQ_SLOT_BITS);
	__type(key, __u32);
	__type(value, __u64);
} rq_unsettled_key SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << RQ_SLOT_BITS);
	__type(key, __u32);
	__type(value, __u64);
} rq_unsettled_ns SEC(".maps");

/* Per (disk, op): completions the hook ran for but left unsettled, found out later (`completions_unseen`). */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 320); /* as block_stats */
	__type(key, struct block_key);
	__type(value, __u64);
} block_unsettled SEC(".maps");

/* slow_io events; submitted without wakeup, the daemon polls on a timer. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} block_events SEC(".maps");

/* Each program's own ptr_key() scratch word (slots.bpf.h). */
enum block_program {
	PROG_BIO_QUEUE,
	PROG_RQ_ISSUE,
	PROG_RQ_REQUEUE,
	PROG_RQ_COMPLETE,
	PROG_BIO_COMPLETE,
	PROG_RQ_COMPLETE_NESTED, /* a completion run nested in another (run_alone()) */
};

static __always_inline __u32 block_op_of(__u32 opf, __u32 bytes)
{
	switch (opf & STALLTRACE_REQ_OP_MASK) {
	case REQ_OP_READ:
		return BLOCK_OP_READ;
	case REQ_OP_WRITE:
		/* fsync's cache flush arrives as an empty write with REQ_PREFLUSH */
		return bytes ? BLOCK_OP_WRITE : BLOCK_OP_FLUSH;
	case REQ_OP_FLUSH:
		return BLOCK_OP_FLUSH;
	case REQ_OP_DISCARD:
	case REQ_OP_SECURE_ERASE:
		return BLOCK_OP_DISCARD;
	default:
		return BLOCK_OP_OTHER;
	}
}

static __always_inline struct block_stats *stats_for(__u32 major, __u32 minor, __u32 op)
{
	struct block_key key = { .major = major, .minor = minor, .op = op };
	struct block_stats *stats;
	__u32 zero = 0;
	void *init;
	long err;

	stats = bpf_map_lookup_elem(&block_stats, &key);
	if (stats)
		return stats;
	init = bpf_map_lookup_elem(&block_stats_zero, &zero);
	if (!init)
		return NULL;
	err = bpf_map_update_elem(&block_stats, &key, init, BPF_NOEXIST);
	stats = bpf_map_lookup_elem(&block_stats, &key);
	/* another CPU, or a program this one interrupted (-EBUSY), may have created it */
	if (!stats && err && err != -EEXIST)
		count_lost(LOST_BLOCK_STATS_FULL);
	return stats;
}

/* The disk's entry in the disk table, claimed on first sight (never displaced); `*index` is its index. */
static __always_inline struct block_disk *disk_for(__u64 id, __u64 now, __u32 *index)
{
	struct block_disk *disk;
	bool stale = false;

	disk = slot_find(&block_disks, BLOCK_DISK_TABLE_BITS, id, index);
	if (disk)
		return disk;
	disk = slot_claim(&block_disks, BLOCK_DISK_TABLE_BITS, id, now, 0, &stale, index);
	if (!disk)
		count_lost(LOST_DISK_STATE_FULL);
	return disk;
}

/* The disk's entry in the disk table, or NULL; never claims one. */
static __always_inline struct block_disk *disk_find(__u32 major, __u32 minor)
{
	__u64 id = ((__u64)major << 32) | minor;
	__u32 index;

	return slot_find(&block_disks, BLOCK_DISK_TABLE_BITS, id, &index);
}

/*
 * The statistics of (major, minor, op): the disk's entries in
 * block_stats_fast when it has them (`disk`, its disk table entry, may be
 * NULL), else block_stats.
 */
static __always_inline struct block_stats *stats_of(struct block_disk *disk, __u32 major, __u32 minor,
						    __u32 op)
{
	struct block_stats *stats;
	__u32 index;

	if (disk && disk->fast && op < BLOCK_FAST_OPS) {
		index = disk->fast - 1 + op;
		stats = bpf_map_lookup_elem(&block_stats_fast, &index);
		if (stats)
			return stats;
	}
	return stats_for(major, minor, op);
}

/* The disk table entry a request slot recorded at issue. */
static __always_inline struct block_disk *disk_of(struct block_rq_slot *slot)
{
	__u32 index = slot->disk_index;
	struct block_disk *disk = bpf_map_lookup_elem(&block_disks, &index);

	return disk && disk->id == slot->disk_id ? disk : NULL;
}

#endif /* STALLTRACE_BLOCK_STATE_BPF_H */
