// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * block.bpf.c - where a block I/O waits, per disk and op.
 *
 *   bio submitted     block_bio_queue     start of `total` and `tag_wait`
 *   request allocated (rq->start_time_ns) end of `tag_wait`, start of `queue`
 *   issued to driver  block_rq_issue      end of `queue`, start of `device`; in-flight +1
 *   handed back       block_rq_requeue    in-flight -1 (a queue-full signal)
 *   request completed block_rq_complete   end of `device`; in-flight -1; end of `total`
 *                                         for the bios it finishes; slow_io event
 *   bio completed     block_bio_complete  end of `total` on bio-based disks (dm, md)
 *
 * The allocation is the kernel's own stamp, read at completion: every
 * kernel stamps rq->start_time_ns when it sets a request up for a bio (where
 * the disk keeps I/O statistics, /sys/block/X/queue/iostats, on by default;
 * 4.18 always). A hook of our own there cost a program run and a clock read
 * on every I/O (docs/BENCHMARKS.md). The stamp is not always the moment the
 * bio got its request: a request taken from a plug's cache (5.16-6.5) keeps
 * the time the cache was filled, and 6.9+ stamps a plug's cached time (the
 * first clock read since the task last slept). Both are at most the time
 * the bio was submitted, never later than the allocation: a bio with such a
 * stamp had a request without waiting, so its tag wait is 0 and the queue
 * phase starts at its own submission (phase_split()). A wait for a tag
 * sleeps, and sleeping drops the plug's cached time, so a bio that waited is
 * stamped when it woke with its request. tag_wait + queue + device adds up
 * to total for the bio that allocated the request either way.
 *
 * Everything is aggregated here into per-CPU histograms; only I/Os slower
 * than slow_io_ns cross to userspace one by one. Per-bio and per-request
 * state lives in direct-mapped tables (slots.bpf.h), not hash maps: on the
 * hot path a hash update and delete cost more than everything else together.
 */
#include "common.bpf.h"
#include "slots.bpf.h"
#include "block_state.bpf.h" /* the statistics, tables and lookups the hooks below keep */
#include "block_settle.bpf.h" /* ending the lives the hooks did not end */
#include "block_bios.bpf.h" /* the bios a completion finishes */
#include "process_filter.bpf.h"

/*
 * The daemon's own process, set at load time: its I/O (the stream it writes
 * with --out on a traced disk) sends no slow_io events, which would be noise
 * about the tracer itself. It stays in the histograms: it is real I/O on the
 * disk. 0: nothing is left out.
 */
const volatile __u64 self_tgid = 0;

/*
 * Set at load time to how many disks the run names (--disk): only those are
 * traced, at one inlined array lookup and that many compares per hook. 0:
 * every disk, and the verifier drops the lookup.
 */
const volatile __u64 disk_filter = 0;

/*
 * For tests only (STALLTRACE_FAULT_SKIP_COMPLETIONS=writes, block/mod.rs):
 * the completion hook returns at once for every write, as if the kernel had
 * not run it. 0 in every real run, and the verifier drops the branch.
 */
const volatile __u64 fault_skip_writes = 0;

static __always_inline bool disk_watched(struct gendisk *disk)
{
	struct block_selected_disks *selected;
	__u32 zero = 0, i;
	__u64 id;

	if (!disk_filter)
		return true;
	selected = bpf_map_lookup_elem(&block_selected_disks, &zero);
	if (!selected)
		return false;
	id = ((__u64)KREAD(disk, major) << 32) | (__u32)KREAD(disk, first_minor);
	for (i = 0; i < BLOCK_SELECTED_DISKS_MAX && i < disk_filter; i++)
		if (selected->ids[i] == id)
			return true;
	return false;
}

/*
 * The submitter (pid, tgid, name) into a bio's slot: direct loads from
 * current in tp_btf where the kernel hands out current's BTF pointer (5.11+;
 * the same check as the helper's typedef test in tcp.bpf.c), the helpers
 * elsewhere. The loads save two helper calls on every bio.
 */
static __always_inline void note_submitter(struct bio_slot *slot)
{
#ifndef STALLTRACE_RAW_TP
	struct task_struct *task;

	if (bpf_core_type_exists(btf_bpf_get_current_task_btf)) {
		task = bpf_get_current_task_btf();
		slot->tgid = task->tgid;
		slot->pid = task->pid;
		((__u64 *)slot->comm)[0] = *(__u64 *)&task->comm[0];
		((__u64 *)slot->comm)[1] = *(__u64 *)&task->comm[8];
		return;
	}
#endif
	__u64 id = bpf_get_current_pid_tgid();

	slot->tgid = id >> 32;
	slot->pid = (__u32)id;
	bpf_get_current_comm(slot->comm, STALLTRACE_COMM_LEN);
}

/*
 * 5.11 dropped the request_queue argument of block_bio_queue (q, bio) and
 * moved it to the block_bio event class in the same change, so its own event
 * struct exists only on kernels with the old prototype (5.10 and older).
 */
struct trace_event_raw_block_bio_queue___pre_5_11 {
	dev_t dev;
} __attribute__((preserve_access_index));

HOOK(block_bio_queue)
{
	struct bio *bio = bpf_core_type_exists(struct trace_event_raw_block_bio_queue___pre_5_11)
				  ? (struct bio *)TP_ARG(1)
				  : (struct bio *)TP_ARG(0);
	struct gendisk *disk = bio_disk(bio);
	struct bio_slot *slot;
	bool stale = false;
	__u64 now;
	__u32 index;

	if (!disk || !disk_watched(disk))
		return 0;
	now = bpf_ktime_get_ns();
	slot = slot_claim(&bio_slots, BIO_SLOT_BITS, ptr_key(bio, PROG_BIO_QUEUE), now, SLOT_STALE_NS, &stale,
			  &index);
	if (stale)
		count_lost(LOST_STALE_SLOT);
	if (!slot) {
		count_lost(LOST_BIO_TRACK_FULL);
		return 0;
	}
	slot->major = KREAD(disk, major);
	slot->minor = KREAD(disk, first_minor);
	slot->op = block_op_of(KREAD(bio, bi_opf), KREAD(bio, bi_iter.bi_size));
	/*
	 * The submitter is read only by slow_io events: without them (slow_io_ns
	 * is a load-time constant, so the verifier drops this branch) the helper
	 * call and the name copy are skipped.
	 */
	if (!slow_io_ns)
		return 0;
	note_submitter(slot);
	/*
	 * A process filter leaves out only the slow_io events of other processes:
	 * the histograms and the in-flight gauge stay the disk's, because the
	 * watched process's I/O queues behind everyone's.
	 */
	slot->reported = current_process_wanted();
	return 0;
}

/*
 * The kernel does not always run the completion hook. It skips a program it
 * finds already running on the CPU (and counts a recursion miss), and some
 * kernels skip without a count: the 6.18 Firecracker kernel of the
 * development VM runs no tracing program at all (not ours, not perf's BPF
 * attachments) while the current task belongs to PID 1, its init. A block
 * completion runs in a softirq on top of whatever task it interrupted, so one
 * that lands on that process is invisible (docs/records.md, `lost`). The
 * request's next issue then finds its slot still in flight.
 *
 * Whether that earlier life ended, or was handed back with the requeue hook
 * skipped the same way: a new life of the same struct request was allocated
 * after the last one completed, so after that life's last issue, while a
 * requeued request keeps its allocation. The allocation is the kernel's
 * rq->start_time_ns (see the top). A plug's cached time can make it older
 * than the allocation: a request freed while a plug is open and allocated
 * again under it would look like a requeue, which needs a skipped completion
 * hook inside one plug as well. Without a stamp, a completion: the kernel
 * skips the completion hook far more often than the requeue hook (the first
 * runs on top of any task, the second mostly in the submitter's context).
 */
static __always_inline bool same_life(struct request *rq, const struct block_rq_slot *slot)
{
	__u64 allocated = KREAD(rq, start_time_ns);

	return allocated && allocated <= slot->issue_ns;
}

/*
 * Whether the slot's last issue belongs to the life now completing. It does
 * not when the kernel skipped both the earlier life's completion hook and
 * this life's issue hook (see above): the slot still holds the earlier
 * issue, and a device time taken from it spans both lives, longer than the
 * request's own total (a 75 ms "flush" among 160 µs ones). A request
 * allocated after that issue is a later life. Without a stamp it cannot
 * tell, and trusts the slot.
 */
static __always_inline bool issued_in_this_life(__u64 allocated, const struct block_rq_slot *slot)
{
	return !allocated || allocated <= slot->issue_ns;
}

/*
 * A new request slot takes over the request's first bio from its bio slot,
 * which is freed here, on the CPU that (most often) claimed it, rather than
 * by the completion on another CPU: abi.h, block_rq_slot. The submitter is
 * copied only when slow_io events can use it (a load-time constant). A bio
 * without a slot (submitted before the run began) is left to the
 * completion's walk, which finds none either.
 */
static __always_inline void take_origin(struct request *rq, struct block_rq_slot *slot)
{
	struct bio *bio = KREAD(rq, bio);
	struct bio_slot *origin;
	__u32 index;

	slot->origin_ns = 0;
	if (!bio)
		return;
	origin = slot_find(&bio_slots, BIO_SLOT_BITS, ptr_key(bio, PROG_RQ_ISSUE), &index);
	if (!origin)
		return;
	slot->origin_ns = origin->head.stamp_ns;
	if (slow_io_ns) {
		slot->origin_tgid = origin->tgid;
		slot->origin_pid = origin->pid;
		slot->origin_reported = origin->reported;
		__builtin_memcpy(slot->origin_comm, origin->comm, sizeof(slot->origin_comm));
	}
	slot_release(origin);
}

/*
 * Issue: only bookkeeping (the slot and the disk's gauge). Every histogram of
 * a request is fed at its completion, where the per-(disk, op) statistics are
 * looked up anyway: one per-CPU hash lookup per I/O instead of two.
 */
HOOK(block_rq_issue, struct request *rq)
{
	struct gendisk *gd = request_disk(rq);
	__u64 key = ptr_key(rq, PROG_RQ_ISSUE), now, disk_id;
	struct block_rq_slot *slot;
	struct block_disk *disk;
	__u32 index, disk_index;
	bool stale = false;
	__s64 depth;

	if (!gd || !disk_watched(gd))
		return 0;
	now = bpf_ktime_get_ns();
	disk_id = ((__u64)KREAD(gd, major) << 32) | (__u32)KREAD(gd, first_minor);

	slot = slot_find(&rq_slots, RQ_SLOT_BITS, key, &index);
	if (slot && slot->in_flight) {
		if (same_life(rq, slot)) {
			settle_requeue(slot); /* then issued again, below */
		} else {
			settle_missed(slot, key);
			slot_release(slot);
			slot = NULL;
		}
	} else if (slot && !issued_in_this_life(KREAD(rq, start_time_ns), slot)) {
		/*
		 * A life the settle pass or the idle reconcile ended (they leave the
		 * slot to the request's next issue): this is a new one, perhaps of
		 * another disk sharing the tag set, and starts from a slot of its own.
		 */
		slot_release(slot);
		slot = NULL;
	}
	if (!slot) {
		slot = slot_claim(&rq_slots, RQ_SLOT_BITS, key, now, SLOT_STALE_NS, &stale, &index);
		if (stale)
			count_lost(LOST_STALE_SLOT);
		if (!slot) {
			count_lost(LOST_RQ_TRACK_FULL);
			return 0;
		}
		slot->disk_id = disk_id;
		slot->op = block_op_of(KREAD(rq, cmd_flags), KREAD(rq, __data_len));
		take_origin(rq, slot);
	}
	/* else: issued again after a requeue */
	slot->issue_ns = now;
	slot->in_flight = 1;

	disk = disk_for(disk_id, now, &disk_index);
	if (!disk) {
		slot->depth = 0;
		return 0;
	}
	/*
	 * A fetch-and-add would need 5.12 (slots.bpf.h): add, then read. Another
	 * CPU's issue between the two is counted too, which it is: both are in
	 * flight at the read.
	 */
	__sync_fetch_and_add(&disk->inflight, 1);
	depth = *(volatile __s64 *)&disk->inflight;
	slot->depth = depth > 0 ? depth : 0;
	slot->disk_index = disk_index;
	return 0;
}

HOOK(block_rq_requeue, struct request *rq)
{
	struct gendisk *gd = request_disk(rq);
	struct block_stats *stats;
	struct block_disk *disk;
	struct block_rq_slot *slot;
	__u32 major, minor, index;

	if (!gd || !disk_watched(gd))
		return 0;
	major = KREAD(gd, major);
	minor = KREAD(gd, first_minor);
	stats = stats_of(disk_find(major, minor), major, minor,
			 block_op_of(KREAD(rq, cmd_flags), KREAD(rq, __data_len)));
	if (stats)
		__sync_fetch_and_add(&stats->requeues, 1);

	slot = slot_find(&rq_slots, RQ_SLOT_BITS, ptr_key(rq, PROG_RQ_REQUEUE), &index);
	if (!slot || !slot->in_flight)
		return 0;
	slot->in_flight = 0;
	disk = disk_of(slot);
	if (disk)
		__sync_fetch_and_add(&disk->inflight, -1);
	return 0;
}

/*
 * The tag-wait and queue phases of a request's allocating bio: known when the
 * kernel stamped the allocation and the stamps are in order. They are not for
 * a request whose slot outlived an earlier life (a flush-machinery request
 * recycled after a requeue that was never issued again): it keeps that
 * life's first-issue stamp, older than this allocation. No sample beats a
 * wrapped one. A stamp older than the bio's submission (a plug's cached
 * time, see the top) means the request was there when the bio came: no tag
 * wait, and the queue phase starts at the submission.
 */
struct phases {
	__u64 tag_wait_ns;
	__u64 queue_ns;
};

static __always_inline bool phase_split(const struct bio_slot *bio, __u64 allocated_ns, __u64 first_issue_ns,
					struct phases *out)
{
	__u64 submitted_ns = bio->head.stamp_ns, queued_ns;

	if (!allocated_ns || allocated_ns > first_issue_ns || submitted_ns > first_issue_ns)
		return false;
	queued_ns = allocated_ns > submitted_ns ? allocated_ns : submitted_ns;
	out->tag_wait_ns = queued_ns - submitted_ns;
	out->queue_ns = first_issue_ns - queued_ns;
	return true;
}

static __always_inline void send_slow_io(struct request *rq, struct bio_slot *origin, __u32 op, __u64 now,
					 const struct phases *phases, bool split, __u64 device_ns, int error)
{
	struct slow_io_event *event;

	event = bpf_ringbuf_reserve(&block_events, sizeof(*event), 0);
	if (!event) {
		count_lost(LOST_SLOW_IO_RINGBUF);
		return;
	}
	event->kind = EVENT_SLOW_IO;
	event->flags = 0;
	event->tag_wait_ns = 0;
	event->queue_ns = 0;
	if (split) {
		event->flags = SLOW_IO_HAS_TAG_WAIT | SLOW_IO_HAS_QUEUE;
		event->tag_wait_ns = phases->tag_wait_ns;
		event->queue_ns = phases->queue_ns;
	}
	event->ts_ns = now;
	event->total_ns = now - origin->head.stamp_ns;
	event->device_ns = device_ns;
	event->sector = KREAD(rq, __sector);
	event->bytes = KREAD(rq, __data_len);
	event->major = origin->major;
	event->minor = origin->minor;
	event->op = op;
	event->tgid = origin->tgid;
	event->pid = origin->pid;
	event->error = error;
	event->pad = 0;
	__builtin_memcpy(event->comm, origin->comm, sizeof(event->comm));
	bpf_ringbuf_submit(event, BPF_RB_NO_WAKEUP);
}

/*
 * A request's completion, under run_alone(): the statistics only this hook
 * writes take plain adds (requests, bytes, the device, in-flight, tag-wait
 * and queue histograms; and a request-based disk's bios and total:
 * block_bio_complete adds to those only for bio-based disks, as the kernel
 * does not trace a bio's completion again once its request's is traced).
 * Fields other hooks write too (errors, unseen, requeues) stay atomic.
 */
static __always_inline void complete_request(struct request *rq, int error, unsigned int nr_bytes, bool in_fast,
					     __u32 fast_index)
{
	struct gendisk *gd = request_disk(rq);
	__u32 data_len = KREAD(rq, __data_len);
	__u64 now, first_issue_ns, device_ns, allocated_ns;
	struct bio_slot first = {};
	struct stats_place place;
	struct phases phases = {};
	bool split = false, this_life, known;
	struct block_stats *stats;
	struct block_rq_slot *slot;
	struct block_disk *disk;
	__u32 op, index;
	__u64 key;

	if (!gd || !disk_watched(gd))
		return;
	op = block_op_of(KREAD(rq, cmd_flags), data_len);
	/* a constant in each caller: each program looks in one map only (see the hooks below) */
	place.op = op;
	place.disk_id = ((__u64)KREAD(gd, major) << 32) | (__u32)KREAD(gd, first_minor);
	if (in_fast) {
		place.fast = fast_index + 1;
		stats = bpf_map_lookup_elem(&block_stats_fast, &fast_index);
	} else {
		place.fast = 0;
		stats = stats_for(place.disk_id >> 32, (__u32)place.disk_id, op);
	}
	if (!stats) {
		/*
		 * Counted as lost. The request stays in flight: its next issue, or its
		 * disk idling, counts it in `count` as one we could not settle, in an
		 * entry that exists by then (settle_missed).
		 */
		if (nr_bytes >= data_len)
			note_unsettled(ptr_key(rq, PROG_RQ_COMPLETE), bpf_ktime_get_ns());
		return;
	}
	now = bpf_ktime_get_ns();
	if (error)
		__sync_fetch_and_add(&stats->errors, 1);
	stats->bytes += nr_bytes < data_len ? nr_bytes : data_len;
	/*
	 * The request's slot before its bios: in the life now completing it
	 * holds the first bio's submission (take_origin()). Only a request whose
	 * issue was seen is a device completion. That leaves out requests issued
	 * before we attached, and the flush machinery's original request, which
	 * completes without ever being issued (its flush_rq is).
	 */
	key = ptr_key(rq, PROG_RQ_COMPLETE);
	slot = slot_find(&rq_slots, RQ_SLOT_BITS, key, &index);
	/* the kernel's allocation stamp (see the top), read once for every use */
	allocated_ns = KREAD(rq, start_time_ns);
	this_life = slot && issued_in_this_life(allocated_ns, slot);
	known = complete_bios(rq, stats, &place, nr_bytes, now, this_life ? slot : NULL, &first);
	if (nr_bytes < data_len)
		return; /* partial completion: the request goes on */
	if (!slot) {
		note_unsettled(key, now);
		return;
	}
	stats->requests += 1;
	if (!this_life) {
		/*
		 * A completion all the same, with no sample of any kind (nor a
		 * slow_io event: its phases are unknown); the earlier life ends as
		 * one the hooks did not settle, as its next issue would have ended it.
		 */
		if (slot->in_flight)
			settle_missed(slot, key);
		slot_release(slot);
		return;
	}
	first_issue_ns = slot->head.stamp_ns;
	device_ns = now - slot->issue_ns;
	if (slot->in_flight) {
		hist_add_alone(&stats->device, device_ns);
		hist_add_alone(&stats->inflight, slot->depth);
		disk = disk_of(slot);
		if (disk)
			__sync_fetch_and_add(&disk->inflight, -1);
	}
	/* the allocating bio's wait for a tag, then in the queue until the first issue */
	if (known)
		split = phase_split(&first, allocated_ns, first_issue_ns, &phases);
	if (split) {
		hist_add_alone(&stats->tag_wait, phases.tag_wait_ns);
		hist_add_alone(&stats->queue, phases.queue_ns);
	}
	/* before the release: the settle pass, on another CPU, reads in_flight first */
	slot->in_flight = 0;
	slot_release(slot);

	if (slow_io_ns && known && now - first.head.stamp_ns >= slow_io_ns && first.reported &&
	    !(self_tgid && first.tgid == self_tgid))
		send_slow_io(rq, &first, op, now, &phases, split, device_ns, error);
}

/*
 * The completion of a request of a disk whose statistics are in the hash
 * (block_stats), tail-called by the hook below. The split kept each
 * program under the verifier's budget while the bio walk carried a
 * statistics pointer from either map; with the walk through bio_finished(),
 * one program for both kinds of disk verifies in about 41 000 instructions
 * (BENCHMARKS.md, "Loading"), so the tail call can go.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PROG_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} block_complete_hashed SEC(".maps");

/*
 * Always 0, but in writable memory, so the verifier does not know it: a tail
 * call with a key it knows is patched into a direct jump that the kernel
 * tracks per program array, and SIGKILLed daemons left such arrays behind
 * (tests/faults.rs `sigkill_at_any_moment_leaves_nothing_behind`).
 */
__u32 complete_hashed_key = 0;

/*
 * `error` was the errno up to 5.15 (int, e.g. -5 for EIO) and is a
 * blk_status_t (u8) by 6.1: the low 32 bits of the argument are either, and
 * slow_io carries them as they are (docs/records.md). A run nested in one
 * of its own (5.10, 5.15: see run_alone()) settles nothing, as the kernel
 * skipping it would: the request's next issue counts it as a completion the
 * hook left unsettled.
 */
static __always_inline int complete_alone(struct request *rq, int error, unsigned int nr_bytes, bool in_fast,
					  __u32 fast_index)
{
	__u32 *running = run_alone(PROG_RQ_COMPLETE);

	if (!running) {
		note_unsettled(ptr_key(rq, PROG_RQ_COMPLETE_NESTED), bpf_ktime_get_ns());
		return 0;
	}
	complete_request(rq, error, nr_bytes, in_fast, fast_index);
	run_done(running);
	return 0;
}

/*
 * A disk the daemon placed in block_stats_fast (abi.h) is completed here,
 * finding its statistics by index; any other (a disk that appeared later, an
 * op past BLOCK_FAST_OPS) in tail_block_rq_complete.
 */
HOOK(block_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	struct gendisk *gd = request_disk(rq);
	struct block_disk *disk;
	__u32 op;

	if (fault_skip_writes && (KREAD(rq, cmd_flags) & STALLTRACE_REQ_OP_MASK) == REQ_OP_WRITE)
		return 0;
	if (!gd || !disk_watched(gd))
		return 0;
	disk = disk_find(KREAD(gd, major), KREAD(gd, first_minor));
	op = block_op_of(KREAD(rq, cmd_flags), KREAD(rq, __data_len));
	if (disk && disk->fast && op < BLOCK_FAST_OPS)
		return complete_alone(rq, error, nr_bytes, true, disk->fast - 1 + op);
	bpf_tail_call(ctx, &block_complete_hashed, complete_hashed_key);
	/* the family fills the array before attaching: never here, but if so, counted as a completion left unsettled */
	note_unsettled(ptr_key(rq, PROG_RQ_COMPLETE), bpf_ktime_get_ns());
	return 0;
}

TAIL_HOOK(block_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	return complete_alone(rq, error, nr_bytes, false, 0);
}

/*
 * Fires for bio-based disks (device-mapper, md), and for bios that failed
 * before they reached a request (e.g. BLK_STS_AGAIN for a REQ_NOWAIT bio that
 * found no free tag: io_uring retries those, so they are errors, not latency).
 */
HOOK(block_bio_complete, struct request_queue *q, struct bio *bio)
{
	__u32 index;
	struct bio_slot *slot = slot_find(&bio_slots, BIO_SLOT_BITS, ptr_key(bio, PROG_BIO_COMPLETE), &index);
	struct block_stats *stats;

	if (!slot)
		return 0;
	stats = stats_of(disk_find(slot->major, slot->minor), slot->major, slot->minor, slot->op);
	if (stats) {
		if (KREAD(bio, bi_status)) {
			__sync_fetch_and_add(&stats->errors, 1);
		} else {
			__sync_fetch_and_add(&stats->bios, 1);
			hist_add(&stats->total, bpf_ktime_get_ns() - slot->head.stamp_ns);
		}
	}
	slot_release(slot);
	return 0;
}
