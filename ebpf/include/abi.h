/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * abi.h - every struct and constant shared by the eBPF programs and the Rust
 * daemon. This file is the single definition: the Rust side is generated from
 * it by bindgen (userspace/build.rs), so a field added here reaches both sides
 * or the build fails.
 *
 * Rules for this file: fixed-width types only, explicit padding, no pointers,
 * nothing that depends on vmlinux.h (bindgen reads it with <linux/types.h>).
 */
#ifndef STALLTRACE_ABI_H
#define STALLTRACE_ABI_H

#ifndef __VMLINUX_H__
#include <linux/types.h>
#endif

#define STALLTRACE_COMM_LEN 16

/*
 * Log-linear histogram geometry (hist.h holds the bucket math, hist.rs the
 * Rust twin). Values below 2^HIST_GROUPING_POWER get one exact bucket each;
 * every power of two above is split into 2^HIST_GROUPING_POWER linear
 * sub-buckets, so a bucket is at most 1/16 = 6.25% wide relative to its lower
 * bound. 976 buckets cover all of u64.
 */
#define HIST_GROUPING_POWER 4
#define HIST_SUBBUCKETS (1 << HIST_GROUPING_POWER)
#define HIST_BUCKETS ((64 - HIST_GROUPING_POWER + 1) * HIST_SUBBUCKETS)

/*
 * Counts are u32 per CPU to halve kernel memory (a block_stats value is
 * per-CPU and per device and op). Userspace reads them every interval and
 * takes wrapping deltas, so a bucket would have to take 2^32 events on one
 * CPU between two reads to lose anything.
 */
struct hist {
	__u64 sum;                   /* sum of recorded values: gives the mean */
	__u32 buckets[HIST_BUCKETS]; /* per-bucket counts, wrapping */
};

/* ---- block family ------------------------------------------------------ */

/* Request operations stalltrace keeps apart (the kernel has more; see block.bpf.c). */
enum block_op {
	BLOCK_OP_READ = 0,
	BLOCK_OP_WRITE = 1,
	BLOCK_OP_FLUSH = 2,
	BLOCK_OP_DISCARD = 3,
	BLOCK_OP_OTHER = 4,
	BLOCK_OP_COUNT = 5,
};

/* Key of the per-CPU block statistics: one whole disk (not a partition), one op. */
struct block_key {
	__u32 major;
	__u32 minor; /* the disk's first minor */
	__u32 op;    /* enum block_op */
};

/* Per-CPU, per (disk, op) aggregate. Everything is a running total; userspace takes deltas. */
struct block_stats {
	__u64 requests;     /* requests completed by the device (issue seen) */
	__u64 bytes;        /* bytes completed by requests */
	__u64 bios;         /* bios completed (what submitters see; more than requests under merging) */
	__u64 requeues;     /* requests handed back by the driver: a queue-full signal */
	__u64 errors;       /* requests completed with an error, and bios failed before reaching one */
	__u64 unseen;       /* requests whose completion never reached the hooks (found out later) */
	struct hist total;    /* bio submitted -> bio completed, ns */
	struct hist tag_wait; /* bio submitted -> request allocated, ns */
	struct hist queue;    /* request allocated -> issued to the driver, ns */
	struct hist device;   /* issued -> completed, ns */
	struct hist inflight; /* requests in flight on the disk at the issue of each completed request (a count) */
};

/*
 * The disk table: one entry per disk seen, shared by all CPUs, holding the
 * in-flight gauge. A direct-mapped array (see slots.bpf.h); userspace reads
 * all of it each interval.
 */
#define BLOCK_DISK_TABLE_BITS 8 /* 256 disks */

/* --disk: a run limited to disks names at most this many (block_selected_disks). */
#define BLOCK_SELECTED_DISKS_MAX 64

/* The disks --disk names, major << 32 | first minor, in its first `disk_filter` places. */
struct block_selected_disks {
	__u64 ids[BLOCK_SELECTED_DISKS_MAX];
};

/* --pid, --comm, --container (process_filter.bpf.h): how many of each a run may name. */
#define PROCESS_FILTER_MAX 64
/* The sockets the watched processes held at the start that the kernel is told of (tcp.bpf.c). */
#define PROCESS_SOCKETS_MAX 4096

struct block_disk {
	__u64 id;         /* major << 32 | first minor; 0 = free slot */
	__u64 claimed_ns; /* when the disk was first seen */
	__u32 claims;     /* slots.bpf.h's claim count (the disk table is a slot table) */
	__u32 fast;       /* 1 + the disk's first entry in block_stats_fast; 0: its statistics are in block_stats */
	/*
	 * Requests issued and not yet completed or requeued. Every issue and
	 * completion writes it, often on different CPUs: on a cache line of its
	 * own (the table is page-aligned), so that the fields above, which every
	 * hook reads, stay in every CPU's cache.
	 */
	__s64 inflight __attribute__((aligned(64)));
};

/*
 * The disks present when the daemon starts keep their read, write and flush
 * statistics in a per-CPU array (block_stats_fast), BLOCK_FAST_OPS entries a
 * disk from block_disk.fast - 1, which the hooks index without the hash
 * lookup block_stats costs; the daemon enters those disks in the disk table
 * before any hook runs. At most BLOCK_FAST_DISKS_MAX disks; the rest, and
 * disks that appear later, are in block_stats.
 */
#define BLOCK_FAST_OPS 3 /* BLOCK_OP_READ, BLOCK_OP_WRITE, BLOCK_OP_FLUSH */
#define BLOCK_FAST_DISKS_MAX 64

/*
 * Per-object slots (see slots.bpf.h): a key's home slot is the top bits of
 * key * SLOT_HASH_MULTIPLIER (Fibonacci hashing), and it may sit in any of
 * the SLOT_PROBES slots from there. Here because the daemon enters disks in
 * the disk table itself (userspace/src/block/fast.rs). Every slot starts
 * with this head.
 */
#define SLOT_PROBES 4
#define SLOT_HASH_MULTIPLIER 0x9E3779B97F4A7C15ULL

struct slot_head {
	__u64 owner;    /* the object's address; 0 = free */
	__u64 stamp_ns; /* when it was claimed */
	__u32 claims;   /* claimers holding or trying for the slot (slots.bpf.h) */
	__u32 pad;
};

/*
 * An owner whose completion was never seen (a lost event) would hold its slot
 * forever: after 10 minutes a claimer takes it over, and the daemon frees it
 * (block/sweep.rs). The kernel's own I/O timeouts (30 s SCSI, 30 s NVMe) end
 * any real request long before that.
 */
#define SLOT_STALE_NS (600ULL * 1000 * 1000 * 1000)

/*
 * A bio from submission to completion (block.bpf.c). The submitter is unknown
 * by completion, and the kernel's own submission stamp is not always there
 * (bio->bi_issue, later issue_time_ns: cgroup kernels only, and from 6.18
 * only on disks with blk-iolatency on), so both are kept here. The daemon
 * reads these only to free stale ones.
 */
#define BLOCK_BIO_SLOT_BITS 15 /* 32768 bios in flight; 2 MiB */

struct bio_slot {
	struct slot_head head; /* owner: the bio; stamp_ns: submitted */
	__u32 major;
	__u32 minor;
	__u32 op;
	__u32 tgid;
	__u32 pid;
	__u32 reported; /* its submitter passes --pid/--comm/--container: it may send slow_io */
	char comm[STALLTRACE_COMM_LEN];
};

/* One cache line each: the table is page-aligned, as rq_slots below. */
_Static_assert(sizeof(struct bio_slot) == 64, "a bio slot is one cache line");

/*
 * A request from issue to completion (block.bpf.c). The daemon reads these
 * only to settle requests whose completion never reached the hooks.
 *
 * The completion usually runs on another CPU than the issue, and each slot
 * line it reads is a transfer between the two CPUs' caches, most of what the
 * block hooks cost (BENCHMARKS.md, "Driving the cost down"). So the issue
 * takes over the request's first bio from its bio slot (when it was
 * submitted, and by whom), and frees that slot on the CPU that claimed it:
 * the completion then reads one line, the first 64 bytes; the submitter, in
 * the second, only for a slow_io event. The table is page-aligned
 * (BPF_F_MMAPABLE, block_state.bpf.h), so each slot starts a cache line.
 */
#define BLOCK_RQ_SLOT_BITS 15 /* 32768 requests in flight; 4 MiB */

/* The settle pass (block.bpf.c) visits this many request slots a run. */
#define SETTLE_CHUNK 256

struct __attribute__((aligned(64))) block_rq_slot {
	struct slot_head head; /* owner: the request; stamp_ns: first issued */
	__u64 issue_ns;        /* last issued (after a requeue, the re-issue) */
	__u64 disk_id;         /* major << 32 | first minor */
	/* the first bio's submission, taken from its slot at the first issue; 0: not taken, or finished */
	__u64 origin_ns;
	__u32 op;         /* enum block_op */
	__u32 in_flight;  /* 0 after a requeue, until the request is issued again */
	__u32 depth;      /* requests in flight on the disk at its (last) issue, itself included */
	__u32 disk_index; /* the disk's entry in the disk table */
	/* the second cache line: the first bio's submitter, as its bio slot had it (bio_slot) */
	__u32 origin_tgid;
	__u32 origin_pid;
	__u32 origin_reported;
	char origin_comm[STALLTRACE_COMM_LEN];
};

_Static_assert(sizeof(struct block_rq_slot) == 128, "a request slot is two cache lines");

/* ---- events carried by ring buffers ------------------------------------ */

enum event_kind {
	EVENT_SLOW_IO = 1,
	EVENT_TCP_RETRANSMIT = 2,
};

/* Which phases a slow_io event carries (a phase the hooks did not see is left out). */
enum slow_io_phase_flags {
	SLOW_IO_HAS_TAG_WAIT = 1,
	SLOW_IO_HAS_QUEUE = 2,
};

/* An I/O slower than the slow-I/O threshold, sent when its request completes. */
struct slow_io_event {
	__u32 kind; /* EVENT_SLOW_IO */
	__u32 flags; /* enum slow_io_phase_flags */
	__u64 ts_ns; /* completion, CLOCK_MONOTONIC */
	__u64 total_ns;
	__u64 tag_wait_ns;
	__u64 queue_ns;
	__u64 device_ns;
	__u64 sector;
	__u32 bytes;
	__u32 major;
	__u32 minor;
	__u32 op; /* enum block_op */
	__u32 tgid; /* the submitter of the request's first bio */
	__u32 pid;
	__s32 error; /* blk_status_t of the completion; 0 is success */
	__u32 pad;
	char comm[STALLTRACE_COMM_LEN];
};

/* ---- tcp family ---------------------------------------------------------- */

/* Why a segment was sent again, from the kernel's own state at the retransmit. */
enum tcp_retx_kind {
	TCP_RETX_RTO = 1,  /* in loss recovery: the retransmission timer fired (TCP_CA_Loss) */
	TCP_RETX_FAST = 2, /* fast retransmit / recovery (dupacks, SACK, RACK) */
	TCP_RETX_TLP = 3,  /* tail loss probe */
	TCP_RETX_SYN = 4,  /* a SYN or SYN-ACK sent again */
};

enum tcp_retx_flags {
	TCP_RETX_F_TIMER = 1,   /* sent by the retransmission timer itself (one per timeout) */
	TCP_RETX_F_COUNTED = 2, /* the kernel counted its segments in RetransSegs */
	TCP_RETX_F_SYNACK = 4,  /* a SYN-ACK of a connection not yet accepted */
	TCP_RETX_F_OWNER = 8,   /* tgid/pid/comm are the socket owner's */
	TCP_RETX_F_EPISODE = 16, /* stalled_ms is set */
	TCP_RETX_F_PROBE = 32,   /* probe_after_us is set */
};

/* One retransmission (or attempt: err != 0), sent through the ring buffer. */
struct tcp_retransmit_event {
	__u32 kind;  /* EVENT_TCP_RETRANSMIT */
	__u32 flags; /* enum tcp_retx_flags */
	__u64 ts_ns; /* CLOCK_MONOTONIC */
	__u64 sock_ino; /* inode of the socket's file (0 if none): matches /proc/PID/fd and sock_diag */
	__u32 netns;    /* network namespace inode */
	__u16 family;   /* AF_INET or AF_INET6 (v4-mapped addresses are reported as AF_INET) */
	__u16 sport;    /* local port, host order */
	__u16 dport;    /* remote port, host order */
	__u8 state;     /* TCP state (TCP_ESTABLISHED = 1, ...) */
	__u8 ca_state;  /* congestion-avoidance state (Open 0 .. Loss 4) */
	__u8 retx_kind; /* enum tcp_retx_kind */
	__u8 backoff;   /* icsk_backoff: RTO doublings before this one */
	__u8 retransmits; /* icsk_retransmits: consecutive timeouts so far */
	__u8 pad0;
	__u8 saddr[16]; /* v4 in the first 4 bytes, network order */
	__u8 daddr[16];
	__s32 err;      /* 0 when it went out; see docs/records.md */
	__u32 segs;     /* segments it carries (GSO) */
	__u32 bytes;
	__u32 seq;
	__u32 rto_jiffies; /* icsk_rto; the daemon converts with the kernel's HZ */
	__u32 srtt_us;
	__u32 stalled_ms; /* since this loss episode's first retransmission (or the first SYN) */
	__u32 tgid;
	__u32 pid;
	__u32 probe_after_us; /* a tail-loss probe: since the unacknowledged flight was sent (TCP_RETX_F_PROBE) */
	char comm[STALLTRACE_COMM_LEN];
};

/*
 * One connection: its local and remote ends in one network namespace, the
 * tuple every TCP record names (tcp_rtt's key since schema 3; before, it left
 * the local address out). No implicit padding: the map hashes the bytes.
 */
struct tcp_peer_key {
	__u8 saddr[16]; /* first, 8-byte aligned: v4 in the first 4 bytes */
	__u8 daddr[16];
	__u32 netns;
	__u16 family;
	__u16 sport; /* host order */
	__u16 dport; /* host order */
	__u16 pad;
};

/* Running totals per peer; shared by all CPUs (atomic adds): a per-CPU value this size would cost CPUs x peers. */
struct tcp_peer_stats {
	struct hist srtt; /* smoothed RTT at a send or receive call after an ACK advanced snd_una, ns */
	__u64 retrans_events;
	__u64 retrans_segs; /* counted by the kernel (RetransSegs) */
	__u64 rto_timeouts; /* retransmission timer expiries */
	__u64 fast;
	__u64 tlp;
	__u64 syn;
};

/* ---- netdev family --------------------------------------------------------- */

/* An interface: ifindex is per network namespace. */
struct netdev_key {
	__u32 netns;
	__u32 ifindex;
};

/* Per-CPU, per interface running totals. */
struct netdev_stats {
	__u64 tx_busy;       /* the driver refused a packet (NETDEV_TX_BUSY): its ring was full */
	__u64 tx_timeouts;   /* transmit watchdog fired (net_dev_xmit_timeout) */
	__u64 tx_stalls;     /* byte queue limits saw completions stall (dql_stall_detected) */
	__u64 qdisc_untimed; /* sampled transmits without a departure time to time the qdisc with */
	struct hist qdisc;   /* departure time set by TCP -> handed to the driver, ns (sampled transmits) */
	struct hist xmit;    /* the driver's transmit call, ns (sampled transmits) */
	struct hist rx;      /* driver receive -> TCP socket processing, ns (1 in NETDEV_RX_SAMPLE packets) */
};

/*
 * Timing is sampled, per CPU, with random gaps of mean N (netdev.bpf.c says
 * why): 1 in NETDEV_TX_SAMPLE transmitted packets, plus a CPU's first after
 * 10 ms without a sample; 1 in NETDEV_RX_SAMPLE received packets.
 */
#define NETDEV_TX_SAMPLE 64
#define NETDEV_RX_SAMPLE 16

/* ---- sqlserver family -------------------------------------------------------- */

enum tds_session_flags {
	TDS_F_SPID = 1,         /* spid is the SPID from a server TDS packet header */
	TDS_F_ENCRYPTED = 2,    /* the server sent a TLS record: no headers readable on the wire */
	TDS_F_SPID_TLS = 4,     /* with TDS_F_SPID: the header was read in the TLS plaintext (SSL_write) */
	TDS_F_TLS_CONFLICT = 8, /* a later TLS pairing named another SPID: the pairing is not to be trusted */
	TDS_F_TLS_GAVE_UP = 16, /* TLS_GIVE_UP_SENDS watched sends named no SPID: no more tries */
	TDS_F_MARS = 32,        /* the server sends TDS inside SMP (MARS): its requests are not timed */
	TDS_F_MARS_KNOWN = 64,  /* a response after the login's was read: MARS (SMP begins after the login) or not */
	TDS_F_MESSAGE_OPEN = 128, /* the last header read did not end its message: more of it follows */
};

/*
 * Sends of an encrypted session without a SPID while its worker's SSL_write
 * is watched, after which the kernel stops trying (a server that does not
 * send a record from the thread that wrote it): the first response after the
 * uprobes attach names a session where the pairing works at all.
 */
#define TLS_GIVE_UP_SENDS 64

/* What the 8-byte TDS headers the worker sent on one socket said. */
struct tds_session {
	__u16 spid;
	__u8 flags;         /* enum tds_session_flags */
	__u8 last_type;     /* TDS packet type of the last header read */
	__u32 headers;      /* headers read (sends that started a TDS packet) */
	__u32 tls_unpaired; /* encrypted: sends that left the TLS plaintext still to read (no SPID while
			     * watched; named, MARS or not unknown, while unwatched) */
};

/*
 * The sqlserver family's control words: one array `sql_control` of u32, so
 * the per-send hook reads each with an inlined array lookup, no helper call.
 */
enum sql_control_slot {
	SQL_CTL_WORKERS_KNOWN = 0, /* the daemon has put a worker in sql_workers */
	SQL_CTL_TLS_WANTED = 1,    /* set by the kernel: an encrypted session without a SPID sent, its worker unwatched */
	SQL_CTL_SLOTS = 2,
};

/* The value of a worker's entry in sql_workers. */
enum sql_worker_flags {
	SQL_WORKER_LISTED = 1,      /* a SQL Server worker: its sends are read */
	SQL_WORKER_TLS_WATCHED = 2, /* its SSL_write* are watched: its TLS sends are paired with them */
};

/*
 * A worker thread's last SSL_write / SSL_write_ex (one entry per thread, kept
 * for its life): while `at_ns` is set, it waits for the send of the TLS record
 * it became, the thread's next TLS send, inside the call (a socket BIO) or
 * after it (memory BIOs). `spid` is set when its plaintext began with a server
 * TDS header. The SSL* is only a key: none of OpenSSL's structs is ever read.
 */
struct tls_write {
	__u64 thread;    /* pid_tgid of the thread whose entry it is: a read checks it (an LRU map may reuse it) */
	__u64 ssl;
	__u64 at_ns;     /* bpf_ktime_get_ns() at its last call; 0 before the first and once its record was sent */
	__u64 plain_len; /* the call's length argument */
	__u16 spid;
	__u8 ambiguous;  /* the thread wrote to another connection before sending: pair nothing */
	__u8 mars;       /* the plaintext was an SMP DATA packet (MARS) around the header */
	__u8 open;       /* the header did not end its message (no EOM) */
	__u8 pad[3];
};

/*
 * One SQL Server request, timed from the turns its socket takes (request
 * bytes arrive, the worker answers, the next request arrives): sent when the
 * next request arrives or the connection leaves ESTABLISHED
 * (tds_turns.bpf.h says how each part is measured).
 */
enum sql_request_flags {
	SQL_REQ_RETRANSMITTED = 1, /* a segment of its response was sent again */
	SQL_REQ_ACKED = 2,         /* delivery ended at the client's ACK (not last transmission + min RTT) */
	SQL_REQ_AT_CLOSE = 4,      /* ended by the connection's close, not by the next request */
};

struct sql_request {
	__u64 ino;            /* the session's socket inode */
	__u64 arrived_ns;     /* bpf_ktime_get_ns() when the request's first byte arrived */
	__u64 server_ns;      /* arrival -> the response's last byte handed to TCP */
	__u64 delivery_ns;    /* that -> delivered (see flags) */
	__u32 tgid;           /* the worker, as the daemon's /proc numbers it */
	__u32 response_bytes; /* bytes of the response handed to TCP */
	__u32 retransmits;    /* retransmissions of its response's data */
	__u16 spid;           /* the session's SPID when the request arrived; 0: not known then */
	__u16 flags;          /* enum sql_request_flags */
};

/*
 * A retransmission on a worker socket whose requests are timed, as the
 * sqlserver family judged it, keyed for the tcp family's record of the same
 * segment (its socket inode and first sequence number): userspace joins the
 * two when it enriches that record.
 */
struct tds_retransmit_key {
	__u64 ino; /* the socket's inode */
	__u32 seq; /* the segment's first sequence number */
	__u32 pad;
};

struct tds_retransmit_mark {
	__u64 request_at; /* bpf_ktime_get_ns() when the request then open arrived */
	__u8 held_up;     /* the segment was data of that request's response */
	__u8 pad[7];
};

/* ---- loss accounting ----------------------------------------------------- */

/*
 * Every place where an event or a measurement can be dropped has an index
 * here; each object counts drops in a per-CPU array `lost_counts` indexed by
 * it, and the daemon reports non-zero deltas as `lost` records.
 */
enum lost_source {
	LOST_SLOW_IO_RINGBUF = 0,  /* slow_io event: ring buffer full */
	LOST_BIO_TRACK_FULL = 1,   /* no free slot for a bio: bio not timed */
	LOST_RQ_TRACK_FULL = 2,    /* no free slot for a request: not timed, not counted in flight */
	LOST_BLOCK_STATS_FULL = 3, /* per-(disk, op) entry could not be created (table full or no memory) */
	LOST_DISK_STATE_FULL = 4,  /* disk table full: a disk's in-flight gauge not kept */
	LOST_BIO_CHAIN_TRUNCATED = 5, /* request with more bios than the completion walk covers: some totals missing */
	LOST_STALE_SLOT = 6,       /* a bio or request tracked for over 10 minutes was displaced: its completion had been missed */
	LOST_TCP_RINGBUF = 7,      /* tcp_retransmit event: ring buffer full (the peer counters still have it) */
	LOST_NETDEV_STATS_FULL = 8, /* per-interface entry could not be created */
	LOST_TCP_RETRANS_UNSEEN = 9, /* segments: counted in RetransSegs on a socket with no record of their own (found at its next record or close) */
	LOST_TLS_AMBIGUOUS = 10,   /* a worker thread wrote to a second TLS connection before sending the first: no SPID from either write */
	LOST_TLS_UNPAIRED = 11,    /* a TLS write with a SPID whose thread's next TLS send did not fit it (kind, length, delay): SPID not used */
	LOST_TLS_CONFLICT = 12,    /* a TLS pairing named another SPID than the socket had from TLS: the worker's TLS SPIDs are dropped */
	LOST_TLS_GAVE_UP = 13,     /* an encrypted session whose SPID TLS_GIVE_UP_SENDS watched sends did not name: no more tries */
	LOST_SQL_REQUEST_RINGBUF = 14, /* sql_request event: ring buffer full (the request is not in any figure) */
	LOST_SQL_REQUEST_UNTIMED = 15, /* a request whose arrival or answer the kernel did not run a hook for (a recursion miss): counted here only */
	LOST_TLS_WRITE_EVICTED = 16, /* a thread's TLS write entry held another thread's (the LRU map reused it): no SPID from that write */
	LOST_SOURCE_COUNT = 17,
};

#endif /* STALLTRACE_ABI_H */
