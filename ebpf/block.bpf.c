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
 * than slow_io_ns cross to userspace one by one.
 */
#include "common.bpf.h"

/* Set by the daemon at load time (--slow-io-ms); 0 sends no slow_io events. */
const volatile __u64 slow_io_ns = 0;

/*
 * Per-CPU aggregates per (disk, op). Not preallocated: a value is ~20 KiB
 * per CPU, and only the (disk, op) pairs that see I/O should cost memory.
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

/* In-flight gauge per disk, shared by all CPUs. Key: major << 32 | first minor. */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 256);
	__type(key, __u64);
	__type(value, struct block_disk_state);
} block_disks SEC(".maps");

/*
 * Per-bio state from submission to completion. The kernel keeps no
 * submission time on a bio that is reliably there (bio->issue_time_ns only
 * exists with cgroup I/O accounting), and the submitter's identity is gone
 * by completion, so both are kept here.
 */
struct bio_track {
	__u64 start_ns;
	__u64 tag_wait_ns;
	__u32 major;
	__u32 minor;
	__u32 op;
	__u32 flags; /* enum slow_io_phase_flags seen so far */
	__u32 tgid;
	__u32 pid;
	char comm[STALLTRACE_COMM_LEN];
};

/*
 * LRU: a bio whose completion is never seen (split off, or past the chain
 * walk's bound) is evicted in time instead of holding a slot forever.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 32768);
	__type(key, __u64); /* struct bio * */
	__type(value, struct bio_track);
} bio_track SEC(".maps");

/*
 * Per-request issue time. Needed because rq->io_start_time_ns is only set
 * when block stats are on; and it makes the in-flight gauge exact: only
 * requests whose issue we saw are ever subtracted, so requests in flight
 * when we attached cannot drive it negative.
 */
struct rq_track {
	__u64 issue_ns;
	__u32 in_flight; /* 0 after a requeue, until the request is issued again */
	__u32 pad;
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 32768);
	__type(key, __u64); /* struct request * */
	__type(value, struct rq_track);
} rq_track SEC(".maps");

/* slow_io events; submitted without wakeup, the daemon polls on a timer. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 256 * 1024);
} block_events SEC(".maps");

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

static __always_inline __u64 disk_id(__u32 major, __u32 minor)
{
	return ((__u64)major << 32) | minor;
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
	if (err && err != -EEXIST /* another CPU created it first */) {
		count_lost(LOST_BLOCK_STATS_FULL);
		return NULL;
	}
	return bpf_map_lookup_elem(&block_stats, &key);
}

static __always_inline struct block_disk_state *disk_state_for(__u32 major, __u32 minor)
{
	__u64 id = disk_id(major, minor);
	struct block_disk_state *state, init = {};
	long err;

	state = bpf_map_lookup_elem(&block_disks, &id);
	if (state)
		return state;
	err = bpf_map_update_elem(&block_disks, &id, &init, BPF_NOEXIST);
	if (err && err != -EEXIST) {
		count_lost(LOST_DISK_STATE_FULL);
		return NULL;
	}
	return bpf_map_lookup_elem(&block_disks, &id);
}

HOOK(block_bio_queue, struct bio *bio)
{
	struct gendisk *disk = bio_disk(bio);
	struct bio_track track = {};
	__u64 key = (__u64)bio;
	__u64 id;

	if (!disk)
		return 0;
	track.start_ns = bpf_ktime_get_ns();
	track.major = KREAD(disk, major);
	track.minor = KREAD(disk, first_minor);
	track.op = block_op_of(KREAD(bio, bi_opf), KREAD(bio, bi_iter.bi_size));
	id = bpf_get_current_pid_tgid();
	track.tgid = id >> 32;
	track.pid = (__u32)id;
	bpf_get_current_comm(track.comm, sizeof(track.comm));
	if (bpf_map_update_elem(&bio_track, &key, &track, BPF_ANY))
		count_lost(LOST_BIO_TRACK_FULL);
	return 0;
}

HOOK(block_getrq, struct bio *bio)
{
	__u64 key = (__u64)bio;
	struct bio_track *track;
	struct block_stats *stats;

	track = bpf_map_lookup_elem(&bio_track, &key);
	if (!track)
		return 0;
	track->tag_wait_ns = bpf_ktime_get_ns() - track->start_ns;
	track->flags |= SLOW_IO_HAS_TAG_WAIT;
	stats = stats_for(track->major, track->minor, track->op);
	if (stats)
		hist_add(&stats->tag_wait, track->tag_wait_ns);
	return 0;
}

HOOK(block_rq_issue, struct request *rq)
{
	struct gendisk *disk = request_disk(rq);
	struct rq_track fresh = {}, *track;
	struct block_disk_state *state;
	struct block_stats *stats;
	__u32 major, minor;
	__u64 key = (__u64)rq, now, bio_key;
	struct bio_track *origin;
	__s64 depth;

	if (!disk)
		return 0;
	now = bpf_ktime_get_ns();
	major = KREAD(disk, major);
	minor = KREAD(disk, first_minor);
	stats = stats_for(major, minor, block_op_of(KREAD(rq, cmd_flags), KREAD(rq, __data_len)));
	if (!stats)
		return 0;

	track = bpf_map_lookup_elem(&rq_track, &key);
	if (track) {
		/* re-issue: after a requeue (not in flight) or a dispatch retry (still counted) */
		track->issue_ns = now;
		if (track->in_flight)
			return 0;
		track->in_flight = 1;
	} else {
		fresh.issue_ns = now;
		fresh.in_flight = 1;
		if (bpf_map_update_elem(&rq_track, &key, &fresh, BPF_NOEXIST)) {
			count_lost(LOST_RQ_TRACK_FULL);
			return 0;
		}
		/* queue: from the allocation by the request's first bio (timed at getrq) */
		bio_key = (__u64)KREAD(rq, bio);
		origin = bio_key ? bpf_map_lookup_elem(&bio_track, &bio_key) : NULL;
		if (origin && (origin->flags & SLOW_IO_HAS_TAG_WAIT))
			hist_add(&stats->queue, now - origin->start_ns - origin->tag_wait_ns);
	}

	state = disk_state_for(major, minor);
	if (!state)
		return 0;
	depth = __sync_fetch_and_add(&state->inflight, 1) + 1;
	hist_add(&stats->inflight, depth > 0 ? depth : 0);
	return 0;
}

HOOK(block_rq_requeue, struct request *rq)
{
	struct gendisk *disk = request_disk(rq);
	struct block_disk_state *state;
	struct block_stats *stats;
	struct rq_track *track;
	__u32 major, minor;
	__u64 key = (__u64)rq;

	if (!disk)
		return 0;
	major = KREAD(disk, major);
	minor = KREAD(disk, first_minor);
	stats = stats_for(major, minor, block_op_of(KREAD(rq, cmd_flags), KREAD(rq, __data_len)));
	if (stats)
		__sync_fetch_and_add(&stats->requeues, 1);

	track = bpf_map_lookup_elem(&rq_track, &key);
	if (!track || !track->in_flight)
		return 0;
	track->in_flight = 0;
	state = disk_state_for(major, minor);
	if (state)
		__sync_fetch_and_add(&state->inflight, -1);
	return 0;
}

/*
 * Request-based disks do not trace bio completion (blk_update_request clears
 * BIO_TRACE_COMPLETION: the request's completion is traced instead), so the
 * bios a completion finishes are walked here: each one's submit-to-complete
 * time goes into `total`. A request holds at most max_segments bios (128-256
 * on common drivers; large only for merged writeback); past
 * MAX_BIOS_PER_COMPLETION the rest are counted as lost. The walk stops at the
 * first bio the request has not finished, so it costs one step per bio done.
 */
#define MAX_BIOS_PER_COMPLETION 256

static __always_inline void complete_bios(struct request *rq, struct block_stats *stats,
					  unsigned int nr_bytes, __u64 now, struct bio_track *first)
{
	struct bio *bio = KREAD(rq, bio);
	struct bio_track *track;
	__u64 done = 0, key;
	__u32 size;
	int i;

	for (i = 0; i < MAX_BIOS_PER_COMPLETION; i++) {
		if (!bio)
			return;
		size = KREAD(bio, bi_iter.bi_size);
		if (done + size > nr_bytes)
			return; /* not finished by this (partial) completion */
		done += size;
		key = (__u64)bio;
		track = bpf_map_lookup_elem(&bio_track, &key);
		if (track) {
			if (i == 0)
				*first = *track;
			__sync_fetch_and_add(&stats->bios, 1);
			hist_add(&stats->total, now - track->start_ns);
			bpf_map_delete_elem(&bio_track, &key);
		}
		bio = KREAD(bio, bi_next);
	}
	if (bio)
		count_lost(LOST_BIO_CHAIN_TRUNCATED);
}

static __always_inline void send_slow_io(struct request *rq, struct bio_track *origin, __u32 op,
					 __u64 now, __u64 queue_ns, __u64 device_ns, int error)
{
	struct slow_io_event *event;

	event = bpf_ringbuf_reserve(&block_events, sizeof(*event), 0);
	if (!event) {
		count_lost(LOST_SLOW_IO_RINGBUF);
		return;
	}
	event->kind = EVENT_SLOW_IO;
	/* the queue phase starts at the allocation, known when the allocation was seen */
	event->flags = origin->flags | (origin->flags & SLOW_IO_HAS_TAG_WAIT ? SLOW_IO_HAS_QUEUE : 0);
	event->ts_ns = now;
	event->total_ns = now - origin->start_ns;
	event->tag_wait_ns = origin->tag_wait_ns;
	event->queue_ns = queue_ns;
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

HOOK(block_rq_complete, struct request *rq, blk_status_t error, unsigned int nr_bytes)
{
	struct gendisk *disk = request_disk(rq);
	__u32 data_len = KREAD(rq, __data_len);
	__u64 key = (__u64)rq, now, queue_ns = 0, device_ns;
	struct bio_track first = {};
	struct block_disk_state *state;
	struct block_stats *stats;
	struct rq_track *track;
	__u32 major, minor, op;

	if (!disk)
		return 0;
	major = KREAD(disk, major);
	minor = KREAD(disk, first_minor);
	op = block_op_of(KREAD(rq, cmd_flags), data_len);
	stats = stats_for(major, minor, op);
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
	 * Only a request whose issue we saw is a device completion. That leaves out
	 * requests issued before we attached, and the flush machinery's original
	 * request, which completes without ever being issued (its flush_rq is).
	 */
	track = bpf_map_lookup_elem(&rq_track, &key);
	if (!track)
		return 0;
	__sync_fetch_and_add(&stats->requests, 1);
	device_ns = now - track->issue_ns;
	if (track->in_flight) {
		hist_add(&stats->device, device_ns);
		state = disk_state_for(major, minor);
		if (state)
			__sync_fetch_and_add(&state->inflight, -1);
	}
	if (first.flags & SLOW_IO_HAS_TAG_WAIT)
		queue_ns = track->issue_ns - first.start_ns - first.tag_wait_ns;
	bpf_map_delete_elem(&rq_track, &key);

	if (slow_io_ns && first.start_ns && now - first.start_ns >= slow_io_ns)
		send_slow_io(rq, &first, op, now, queue_ns, device_ns, error);
	return 0;
}

/*
 * Fires for bio-based disks (device-mapper, md), and for bios that failed
 * before they reached a request (e.g. BLK_STS_AGAIN for a REQ_NOWAIT bio that
 * found no free tag: io_uring retries those, so they are errors, not latency).
 */
HOOK(block_bio_complete, struct request_queue *q, struct bio *bio)
{
	__u64 key = (__u64)bio;
	struct block_stats *stats;
	struct bio_track *track;

	track = bpf_map_lookup_elem(&bio_track, &key);
	if (!track)
		return 0;
	stats = stats_for(track->major, track->minor, track->op);
	if (stats) {
		if (KREAD(bio, bi_status)) {
			__sync_fetch_and_add(&stats->errors, 1);
		} else {
			__sync_fetch_and_add(&stats->bios, 1);
			hist_add(&stats->total, bpf_ktime_get_ns() - track->start_ns);
		}
	}
	bpf_map_delete_elem(&bio_track, &key);
	return 0;
}
