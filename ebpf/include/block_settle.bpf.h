/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * block_settle.bpf.h - ending a request's life that the hooks did not end,
 * for block.bpf.c: the completion hook's notes of what it left unsettled,
 * and the settling itself, shared by the issue hook (a request issued again
 * while its slot still says in flight) and the settle pass (a request the
 * kernel has freed while its slot still says in flight), whose program is at
 * the end: block.bpf.c is its only includer.
 */
#ifndef STALLTRACE_BLOCK_SETTLE_BPF_H
#define STALLTRACE_BLOCK_SETTLE_BPF_H

#include "block_state.bpf.h"

/* The completion hook leaves `key` unsettled: note it for settle_missed() (rq_unsettled_*). */
static __always_inline void note_unsettled(__u64 key, __u64 now)
{
	__u32 home = slot_home(key, RQ_SLOT_BITS);
	__u64 *owner = bpf_map_lookup_elem(&rq_unsettled_key, &home);
	__u64 *at = bpf_map_lookup_elem(&rq_unsettled_ns, &home);

	if (owner && at) {
		*at = now;
		*owner = key;
	}
}

/* Whether the completion hook ran for `key` at or after `since` and left it unsettled (rq_unsettled_*). */
static __always_inline bool hook_left_unsettled(__u64 key, __u64 since)
{
	__u32 home = slot_home(key, RQ_SLOT_BITS);
	__u64 *owner = bpf_map_lookup_elem(&rq_unsettled_key, &home);
	__u64 *at = bpf_map_lookup_elem(&rq_unsettled_ns, &home);

	return owner && at && *owner == key && *at >= since;
}

static __always_inline void count_unsettled(__u32 major, __u32 minor, __u32 op)
{
	struct block_key key = { .major = major, .minor = minor, .op = op };
	__u64 one = 1, *n;

	n = bpf_map_lookup_elem(&block_unsettled, &key);
	if (!n && !bpf_map_update_elem(&block_unsettled, &key, &one, BPF_NOEXIST))
		return;
	if (!n) /* created meanwhile by another CPU */
		n = bpf_map_lookup_elem(&block_unsettled, &key);
	if (n)
		__sync_fetch_and_add(n, 1);
}

/*
 * Settle a life whose completion the hook did not settle, on its own disk and
 * op (with shared tag sets it may have been another disk): the daemon counts
 * it in `count` either way, with no sample in the histograms.
 */
static __always_inline void settle_missed(struct block_rq_slot *slot, __u64 key)
{
	__u32 major = slot->disk_id >> 32, minor = (__u32)slot->disk_id;
	struct block_disk *disk = disk_of(slot);
	/* looked up either way: the daemon writes records for the (disk, op)s it has statistics for */
	struct block_stats *stats = stats_of(disk, major, minor, slot->op);

	if (hook_left_unsettled(key, slot->issue_ns))
		count_unsettled(major, minor, slot->op);
	else if (stats)
		__sync_fetch_and_add(&stats->unseen, 1);
	if (disk)
		__sync_fetch_and_add(&disk->inflight, -1);
	slot->in_flight = 0;
}

/* What the requeue hook would have done for a requeue the kernel did not run it for. */
static __always_inline void settle_requeue(struct block_rq_slot *slot)
{
	struct block_disk *disk = disk_of(slot);
	struct block_stats *stats = stats_of(disk, slot->disk_id >> 32, (__u32)slot->disk_id, slot->op);

	if (stats)
		__sync_fetch_and_add(&stats->requeues, 1);
	if (disk)
		__sync_fetch_and_add(&disk->inflight, -1);
	slot->in_flight = 0;
}

/*
 * The settle pass, run by the daemon once an interval over every request
 * slot (block/settle.rs), SETTLE_CHUNK slots a run from slot ctx->args[0]:
 * never attached, so nothing of it is on any I/O's path. (A map element
 * iterator would visit the slots by itself, but some kernels refuse to load
 * one, this VM's among them; a raw_tp program run with BPF_PROG_RUN loads
 * wherever the fallback does, 5.10 included.) A completion the kernel
 * skipped the hook for leaves its slot in flight, and the disk's gauge one
 * too high, until the same struct request is issued again (block.bpf.c's
 * issue hook). On a busy disk that can be never: blk-mq hands out the first free
 * tag of a bitmap word, so a request taken in a burst above the usual depth
 * waits for the next such burst (seen: fio at QD1 on this VM's kernel, which
 * skips the hook over PID 1, read 2 in flight at most issues of a 4 s run
 * after 6 skipped completions). The kernel marks a request MQ_RQ_IDLE when
 * it frees or requeues it, after the completion and requeue tracepoints have
 * run, and MQ_RQ_IN_FLIGHT right after the issue tracepoint: a slot issued a
 * while ago whose request is idle ended without the hooks. One requeued that
 * way is counted as a completion the hook missed, since the two cannot be
 * told apart here; its next issue starts a new life.
 */
#define SETTLE_AFTER_NS (100ULL * 1000 * 1000)

/*
 * A global function: the verifier checks it once, on its own, rather than
 * once per slot of the caller's loop (inlined, the loop's paths exceed its
 * budget of a million instructions).
 */
__noinline int settle_if_freed(__u32 index, __u64 now)
{
	struct block_rq_slot *slot = bpf_map_lookup_elem(&rq_slots, &index);
	enum mq_rq_state state;
	__u64 owner, issue_ns;

	if (!slot || !slot->in_flight)
		return 0;
	owner = slot->head.owner;
	issue_ns = slot->issue_ns;
	if (!owner || !slot_stale(now, issue_ns, SETTLE_AFTER_NS))
		return 0;
	/* a read that faults (the disk and its requests are gone) settles nothing; the sweep frees those */
	if (BPF_CORE_READ_INTO(&state, (struct request *)owner, state))
		return 0;
	if (state != bpf_core_enum_value(enum mq_rq_state, MQ_RQ_IDLE))
		return 0;
	/*
	 * Completed (the hook clears in_flight, then releases the slot) or issued
	 * again meanwhile, on another CPU or in an interrupt: that hook settled
	 * the life. (An issue between here and settle_missed() would be counted
	 * twice: a compare-and-swap needs 5.12.)
	 */
	if (*(volatile __u64 *)&slot->issue_ns != issue_ns || !*(volatile __u32 *)&slot->in_flight ||
	    *(volatile __u64 *)&slot->head.owner != owner)
		return 0;
	settle_missed(slot, owner);
	return 1;
}

SEC("raw_tp")
int run_settle_freed_requests(struct bpf_raw_tracepoint_args *ctx)
{
	__u64 now = bpf_ktime_get_ns();
	__u32 first = (__u32)ctx->args[0], i;

	for (i = 0; i < SETTLE_CHUNK; i++)
		settle_if_freed(first + i, now);
	return 0;
}

#endif /* STALLTRACE_BLOCK_SETTLE_BPF_H */
