// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * block.bpf.c - where a block I/O waits, per disk and op.
 *
 *   bio submitted     block_bio_queue     start of `total` and `tag_wait`
 *   request allocated block_getrq         end of `tag_wait`, start of `queue`
 *   issued to driver  block_rq_issue      end of `queue`, start of `device`; in-flight +1
 *   handed back       block_rq_requeue    in-flight -1 (a queue-full signal)
 *   request completed block_rq_complete   end of `device`; in-flight -1; end of `total`
 *                                         for the bios it finishes; slow_io event
 *   bio completed     block_bio_complete  end of `total` on bio-based disks (dm, md)
 *
 * The phases are timed by these hooks alone, so tag_wait + queue + device
 * adds up to total for the bio that allocated the request. The kernel's own
 * rq->start_time_ns is not used: depending on the version it is stamped at
 * allocation or when the plug is flushed, so it cannot split the phases.
 *
 * Everything is aggregated here into per-CPU histograms; only I/Os slower
 * than slow_io_ns cross to userspace one by one. Per-bio and per-request
 * state lives in direct-mapped tables (slots.bpf.h), not hash maps: on the
 * hot path a hash update and delete cost more than everything else together.
 */
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
	__type(key, __u32);
	__type(value, struct block_disk);
} block_disks SEC(".maps");

/*
 * A bio from submission to completion. The kernel keeps no submission time
 * on a bio that is always there (bio->issue_time_ns only with blk-iolatency),
 * and the submitter is unknown by completion, so both are kept here.
 */
struct bio_slot {
	struct slot_head head; /* owner: the bio; stamp_ns: submitted */
	__u64 alloc_ns;        /* request allocated for it (getrq); 0 until then */
	__u32 major;
	__u32 minor;
	__u32 op;
	__u32 tgid;
	__u32 pid;
	__u32 pad;
	char comm[STALLTRACE_COMM_LEN];
};

#define BIO_SLOT_BITS 15 /* 32768 bios in flight; 2 MiB */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << BIO_SLOT_BITS);
	__type(key, __u32);
	__type(value, struct bio_slot);
} bio_slots SEC(".maps");

/*
 * Requests from issue to completion (struct block_rq_slot, abi.h: the daemon
 * reads it too). rq->io_start_time_ns is only set when block stats are on;
 * and keeping our own record makes the in-flight gauge exact: only requests
 * whose issue was seen are ever subtracted, so requests in flight when we
 * attached cannot drive it negative. 1.25 MiB.
 */
#define RQ_SLOT_BITS BLOCK_RQ_SLOT_BITS

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1 << RQ_SLOT_BITS);
	__type(key, __u32);
	__type(value, struct block_rq_slot);
} rq_slots SEC(".maps");

/* slow_io events; submitted without wakeup, the daemon polls on a timer. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} block_events SEC(".maps");

/* Each program's own ptr_key() scratch word (slots.bpf.h). */
enum block_program {
	PROG_BIO_QUEUE,
	PROG_GETRQ,
	PROG_RQ_ISSUE,
	PROG_RQ_REQUEUE,
	PROG_RQ_COMPLETE,
	PROG_BIO_COMPLETE,
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

/* The disk table entry a request slot recorded at issue. */
static __always_inline struct block_disk *disk_of(struct block_rq_slot *slot)
{
	__u32 index = slot->disk_index;
	struct block_disk *disk = bpf_map_lookup_elem(&block_disks, &index);

	return disk && disk->id == slot->disk_id ? disk : NULL;
}

/* The submitter's name: direct loads from current in tp_btf, the helper in raw_tp. */
static __always_inline void current_comm(char *comm)
{
#ifdef STALLTRACE_RAW_TP
	bpf_get_current_comm(comm, STALLTRACE_COMM_LEN);
#else
	struct task_struct *task = bpf_get_current_task_btf();

	((__u64 *)comm)[0] = *(__u64 *)&task->comm[0];
	((__u64 *)comm)[1] = *(__u64 *)&task->comm[8];
#endif
}

/*
 * 5.11 dropped the request_queue argument of block_bio_queue (q, bio) and
 * block_getrq (q, bio, rw), and moved both tracepoints to the block_bio event
 * class in the same change, so their own event structs exist only on kernels
 * with the old prototypes (5.10 and older).
 */
struct trace_event_raw_block_bio_queue___pre_5_11 {
	dev_t dev;
} __attribute__((preserve_access_index));

struct trace_event_raw_block_get_rq___pre_5_11 {
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
	__u64 now, id;
	__u32 index;

	if (!disk)
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
	slot->alloc_ns = 0;
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
	id = bpf_get_current_pid_tgid();
	slot->tgid = id >> 32;
	slot->pid = (__u32)id;
	current_comm(slot->comm);
	return 0;
}

/* Only stamps the allocation: the histograms are fed at issue, where the stats are looked up anyway. */
HOOK(block_getrq)
{
	struct bio *bio = bpf_core_type_exists(struct trace_event_raw_block_get_rq___pre_5_11)
				  ? (struct bio *)TP_ARG(1)
				  : (struct bio *)TP_ARG(0);
	struct bio_slot *slot;
	__u32 index;

	slot = slot_find(&bio_slots, BIO_SLOT_BITS, ptr_key(bio, PROG_GETRQ), &index);

	if (slot)
		slot->alloc_ns = bpf_ktime_get_ns();
	return 0;
}

/*
 * A request is being issued while its slot still says in flight: its last
 * completion never reached the hooks. On this 6.18 kernel that happens for
 * about 1 in 10^4 completions (perf counts the tracepoint, the BPF programs
 * do not run, and no recursion miss is recorded). Settle that earlier life on
 * its own disk and op (with shared tag sets it may have been another disk).
 */
static __always_inline void settle_unseen(struct block_rq_slot *slot)
{
	struct block_stats *stats = stats_for(slot->disk_id >> 32, (__u32)slot->disk_id, slot->op);
	struct block_disk *disk = disk_of(slot);

	if (stats)
		__sync_fetch_and_add(&stats->unseen, 1);
	if (disk)
		__sync_fetch_and_add(&disk->inflight, -1);
	slot->in_flight = 0;
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

	if (!gd)
		return 0;
	now = bpf_ktime_get_ns();
	disk_id = ((__u64)KREAD(gd, major) << 32) | (__u32)KREAD(gd, first_minor);

	slot = slot_find(&rq_slots, RQ_SLOT_BITS, key, &index);
	if (slot && slot->in_flight) {
		settle_unseen(slot);
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

	if (!gd)
		return 0;
	major = KREAD(gd, major);
	minor = KREAD(gd, first_minor);
	stats = stats_for(major, minor, block_op_of(KREAD(rq, cmd_flags), KREAD(rq, __data_len)));
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
 * Request-based disks do not trace bio completion (blk_update_request clears
 * BIO_TRACE_COMPLETION: the request's completion is traced instead), so the
 * bios a completion finishes are walked here: each one's submit-to-complete
 * time goes into `total`. A request holds at most max_segments bios (128-256
 * on common drivers; many only for merged writeback); past
 * MAX_BIOS_PER_COMPLETION the rest are counted as lost. The walk stops at the
 * first bio the request has not finished, so it costs one step per bio done.
 */
#define MAX_BIOS_PER_COMPLETION 256

static __always_inline void complete_bios(struct request *rq, struct block_stats *stats,
					  unsigned int nr_bytes, __u64 now, struct bio_slot *first)
{
	struct bio *bio = KREAD(rq, bio);
	struct bio_slot *slot;
	__u64 done = 0;
	__u32 size, index;
	int i;

	for (i = 0; i < MAX_BIOS_PER_COMPLETION; i++) {
		if (!bio)
			return;
		size = KREAD(bio, bi_iter.bi_size);
		if (done + size > nr_bytes)
			return; /* not finished by this (partial) completion */
		done += size;
		slot = slot_find(&bio_slots, BIO_SLOT_BITS, ptr_key(bio, PROG_RQ_COMPLETE), &index);
		if (slot) {
			if (i == 0)
				*first = *slot;
			__sync_fetch_and_add(&stats->bios, 1);
			hist_add(&stats->total, now - slot->head.stamp_ns);
			slot_release(slot);
		}
		bio = KREAD(bio, bi_next);
	}
	if (bio)
		count_lost(LOST_BIO_CHAIN_TRUNCATED);
}

/*
 * The tag-wait and queue phases of a request's allocating bio are known when
 * its allocation was seen and the stamps are in order. They are not for a
 * request whose slot outlived an earlier life (a flush-machinery request
 * recycled after a requeue that was never issued again): it keeps that life's
 * first-issue stamp, older than this allocation. No sample beats a wrapped one.
 */
static __always_inline bool phases_known(const struct bio_slot *b, __u64 first_issue_ns)
{
	return b->alloc_ns && b->head.stamp_ns <= b->alloc_ns && b->alloc_ns <= first_issue_ns;
}

static __always_inline void send_slow_io(struct request *rq, struct bio_slot *origin, __u32 op,
					 __u64 now, __u64 first_issue_ns, __u64 device_ns, int error)
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
	if (phases_known(origin, first_issue_ns)) {
		/* the queue phase starts at the allocation */
		event->flags = SLOW_IO_HAS_TAG_WAIT | SLOW_IO_HAS_QUEUE;
		event->tag_wait_ns = origin->alloc_ns - origin->head.stamp_ns;
		event->queue_ns = first_issue_ns - origin->alloc_ns;
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
 * `error` was the errno up to 5.15 (int, e.g. -5 for EIO) and is a
 * blk_status_t (u8) by 6.1: the low 32 bits of the argument are either, and
 * slow_io carries them as they are (docs/records.md).
 */
HOOK(block_rq_complete, struct request *rq, int error, unsigned int nr_bytes)
{
	struct gendisk *gd = request_disk(rq);
	__u32 data_len = KREAD(rq, __data_len);
	__u64 now, first_issue_ns, device_ns;
	struct bio_slot first = {};
	struct block_stats *stats;
	struct block_rq_slot *slot;
	struct block_disk *disk;
	__u32 op, index;

	if (!gd)
		return 0;
	op = block_op_of(KREAD(rq, cmd_flags), data_len);
	stats = stats_for(KREAD(gd, major), KREAD(gd, first_minor), op);
	if (!stats)
		return 0;
	now = bpf_ktime_get_ns();
	if (error)
		__sync_fetch_and_add(&stats->errors, 1);
	__sync_fetch_and_add(&stats->bytes, nr_bytes < data_len ? nr_bytes : data_len);
	complete_bios(rq, stats, nr_bytes, now, &first);
	if (nr_bytes < data_len)
		return 0; /* partial completion: the request goes on */

	/*
	 * Only a request whose issue was seen is a device completion. That leaves
	 * out requests issued before we attached, and the flush machinery's
	 * original request, which completes without ever being issued (its
	 * flush_rq is).
	 */
	slot = slot_find(&rq_slots, RQ_SLOT_BITS, ptr_key(rq, PROG_RQ_COMPLETE), &index);
	if (!slot)
		return 0;
	__sync_fetch_and_add(&stats->requests, 1);
	first_issue_ns = slot->head.stamp_ns;
	device_ns = now - slot->issue_ns;
	if (slot->in_flight) {
		hist_add(&stats->device, device_ns);
		hist_add(&stats->inflight, slot->depth);
		disk = disk_of(slot);
		if (disk)
			__sync_fetch_and_add(&disk->inflight, -1);
	}
	/* the allocating bio's wait for a tag, then in the queue until the first issue */
	if (first.head.owner && phases_known(&first, first_issue_ns)) {
		hist_add(&stats->tag_wait, first.alloc_ns - first.head.stamp_ns);
		hist_add(&stats->queue, first_issue_ns - first.alloc_ns);
	}
	slot_release(slot);

	if (slow_io_ns && first.head.owner && now - first.head.stamp_ns >= slow_io_ns)
		send_slow_io(rq, &first, op, now, first_issue_ns, device_ns, error);
	return 0;
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
	stats = stats_for(slot->major, slot->minor, slot->op);
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
