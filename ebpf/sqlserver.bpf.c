// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * sqlserver.bpf.c - the SPID of each SQL Server session, from the TDS header
 * of what the server sends, on the wire or inside TLS.
 *
 *   tcp_sendmsg_locked   a send by a SQL Server worker (their tgids are in
 *                        sql_workers, filled by the daemon's discovery): when
 *                        the send starts at the beginning of the caller's
 *                        buffer, its first 8 bytes are read; if they are a
 *                        server TDS packet header (tabular result, pre-login),
 *                        bytes 4-5 are the session's SPID. The tracepoint is
 *                        6.16+; before, fentry or kprobe on the function.
 *   SSL_write,           uprobes on the libssl a worker maps, attached by the
 *   SSL_write_ex         daemon per worker (sqlserver/tls.rs) while it has
 *                        encrypted sessions without a SPID: the first 8 bytes
 *                        of the plaintext, the same header. The thread's next
 *                        TLS send (inside the call with a socket BIO, right
 *                        after it with memory BIOs) ties the call to its
 *                        socket, when that record's length fits the call's
 *                        (tls_record_fits_write in tds.h). No OpenSSL struct
 *                        is read: the SSL* is only a key.
 *
 *   tcp_probe,           each request's latency, split into server time and
 *   tcp_retransmit_skb,  network delivery, from the turns a worker's socket
 *   inet_sock_set_state  takes (tds_turns.bpf.h), encrypted or not
 *
 * Only those 8 header bytes are ever read, and only from the server's side:
 * never a byte of SQL text or result data, and nothing of a send shorter than
 * a header. With MARS, SMP begins after the login response: each TDS packet
 * then follows a 16-byte SMP header, whose first 8 bytes say so, and the TDS
 * header after it is read instead. So the first response after the one that
 * named the SPID is read too: inside SMP, the session is marked MARS (its
 * requests are not timed: several can be in flight, and turns would pair
 * them wrongly). After that a cleartext socket's sends cost one map lookup.
 * A TLS record instead of a header marks the session encrypted. What the 8
 * bytes are is decided in tds.h, which the Rust tests run on the host.
 *
 * Measured assumption (simulator; not verified against real SQL Server): the
 * server writes each TDS packet with its own send (or SSL_write), starting at
 * the buffer's start, so the first bytes of a send are a header; with TLS,
 * the thread that calls SSL_write sends the record it made before it writes
 * to another connection (docs/sqlserver.md says how to check a real server).
 */
#include "common.bpf.h"
#include "sock.bpf.h"
#include "tds.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32);  /* tgid of a SQL Server worker */
	__type(value, __u8); /* enum sql_worker_flags */
} sql_workers SEC(".maps");

/*
 * enum sql_control_slot. tcp_sendmsg_locked fires for every TCP send on the
 * host, and on a host (or at a moment) without SQL Server the hash lookup in
 * sql_workers was most of its cost: an array lookup is inlined by the
 * verifier into a few instructions, so the hook leaves before any helper call.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, SQL_CTL_SLOTS);
	__type(key, __u32);
	__type(value, __u32);
} sql_control SEC(".maps");

/*
 * Per worker thread: its last SSL_write* (`at_ns` 0 once its record was sent).
 * The entry is made once per thread and then written in place, never built
 * on the stack: the uprobe programs keep their stack under 64 bytes, so that
 * kernels from 6.13 give them no private stack. That stack is per CPU, and a
 * uprobe program, unlike the other kinds, can be preempted (PREEMPT_LAZY, as
 * Debian's 7.x kernels are built) and run again by another thread on the same
 * CPU: the kernel matrix caught one thread's write stored under another's
 * key, which named the wrong SPID. userspace/tests/ebpf_stack.rs holds the
 * limit.
 * An LRU map may also evict an entry and hand its memory to another thread's
 * at any time: the owner is checked before a read and after a write, which
 * narrows that window to a program preempted between the two, not to nothing
 * (per-task storage would close it, from 5.11).
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, __u64); /* pid_tgid of the thread */
	__type(value, struct tls_write);
} tls_writes SEC(".maps");

/* What a thread's entry starts as (a map value, so no stack is needed to insert one). */
static const struct tls_write no_write;

/* The current thread's entry (made if it has none), or NULL; one of another thread's is counted. */
static __always_inline struct tls_write *thread_entry(__u64 *id)
{
	struct tls_write *entry = bpf_map_lookup_elem(&tls_writes, id);

	if (!entry) {
		bpf_map_update_elem(&tls_writes, id, &no_write, BPF_NOEXIST);
		entry = bpf_map_lookup_elem(&tls_writes, id);
		if (!entry)
			return NULL;
		if (!entry->thread) /* fresh, not already another thread's again */
			entry->thread = *id;
	}
	if (entry->thread == *id)
		return entry;
	count_lost(LOST_TLS_WRITE_EVICTED);
	return NULL;
}

/* The current thread's write still waiting for its send, or NULL. */
static __always_inline struct tls_write *pending_write(__u64 *id)
{
	struct tls_write *entry = bpf_map_lookup_elem(&tls_writes, id);

	return entry && entry->thread == *id && entry->at_ns ? entry : NULL;
}

/* A write waits this long at most for its send (a busy host may preempt the thread in between). */
#define TLS_PAIR_WINDOW_NS (1000ULL * 1000 * 1000)

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* socket inode */
	__type(value, struct tds_session);
} tds_sessions SEC(".maps");

/*
 * The iov_iter a send copies from changed shape twice in the kernels
 * stalltrace supports: before 5.14 its kind was a bit in `type` (bit 0 the
 * direction), and before 6.4 the iovec pointer was `iov` (now `__iov`).
 * ITER_UBUF (a single user buffer) exists since 6.0, and the enum's values
 * moved between versions: every one is read from the kernel with CO-RE.
 */
struct iov_iter___pre_5_14 {
	unsigned int type;
} __attribute__((preserve_access_index));

struct msghdr___pre_5_14 {
	struct iov_iter___pre_5_14 msg_iter;
} __attribute__((preserve_access_index));

struct iov_iter___pre_6_4 {
	const struct iovec *iov;
} __attribute__((preserve_access_index));

struct msghdr___pre_6_4 {
	struct iov_iter___pre_6_4 msg_iter;
} __attribute__((preserve_access_index));

#define ITER_DIRECTION_BIT 1U

/*
 * The user buffer a sendmsg copies from, when it is at its start, and in *len
 * how many of the send's bytes lie there contiguously (the whole send for a
 * single buffer, the first segment of an iovec); NULL otherwise.
 */
static __always_inline const void *send_buffer_start(const struct msghdr *msg, __u64 *len)
{
	const struct iovec *iov;
	unsigned int type;
	__u64 first;

	if (KREAD(msg, msg_iter.iov_offset) != 0)
		return NULL; /* a later pass of the send loop: mid-buffer */
	*len = KREAD(msg, msg_iter.count);
	if (bpf_core_field_exists(msg->msg_iter.iter_type))
		type = KREAD(msg, msg_iter.iter_type);
	else
		type = KREAD((const struct msghdr___pre_5_14 *)msg, msg_iter.type) & ~ITER_DIRECTION_BIT;
	if (bpf_core_enum_value_exists(enum iter_type, ITER_UBUF) &&
	    type == bpf_core_enum_value(enum iter_type, ITER_UBUF))
		return KREAD(msg, msg_iter.ubuf);
	if (type != bpf_core_enum_value(enum iter_type, ITER_IOVEC))
		return NULL; /* kernel buffers, pipes: not a TDS send */
	if (bpf_core_field_exists(msg->msg_iter.__iov))
		iov = KREAD(msg, msg_iter.__iov);
	else
		iov = KREAD((const struct msghdr___pre_6_4 *)msg, msg_iter.iov);
	if (!iov)
		return NULL;
	first = BPF_CORE_READ(iov, iov_len);
	if (first < *len)
		*len = first;
	return BPF_CORE_READ(iov, iov_base);
}

static __always_inline bool control_set(__u32 slot)
{
	__u32 *v = bpf_map_lookup_elem(&sql_control, &slot);

	return v && *v;
}

static __always_inline void control_raise(__u32 slot)
{
	__u32 *v = bpf_map_lookup_elem(&sql_control, &slot);

	if (v && !*v)
		*v = 1;
}

/*
 * Set by the daemon at load when it runs in a PID namespace of its own (a
 * container without the host's PID namespace, systemd-nspawn): the device and
 * inode of that namespace. The workers it puts in sql_workers are pids as its
 * /proc shows them, which bpf_get_current_pid_tgid() (the initial namespace's)
 * never matches. 0 (the host's namespace) costs nothing: the branch is gone.
 */
const volatile __u64 pidns_dev = 0;
const volatile __u64 pidns_ino = 0;

/* The current process's tgid as the daemon's /proc numbers it; 0 when it has none there. */
static __always_inline __u32 current_tgid_in_daemon_ns(void)
{
	struct bpf_pidns_info ns = {};

	if (!pidns_ino)
		return bpf_get_current_pid_tgid() >> 32;
	if (bpf_get_ns_current_pid_tgid(pidns_dev, pidns_ino, &ns, sizeof(ns)))
		return 0; /* a task outside the daemon's namespace: no worker of its */
	return ns.tgid;
}

/* The current process's enum sql_worker_flags (and *tgid); 0 when it is no SQL Server worker. */
static __always_inline __u8 current_worker(__u32 *tgid)
{
	__u8 *flags;

	if (!control_set(SQL_CTL_WORKERS_KNOWN))
		return 0;
	*tgid = current_tgid_in_daemon_ns();
	if (!*tgid)
		return 0;
	flags = bpf_map_lookup_elem(&sql_workers, tgid);
	return flags ? *flags : 0;
}

#include "tds_turns.bpf.h"

/* Whether the header just read left its message open (no EOM). */
static __always_inline void message_open(struct tds_session *session, bool open)
{
	if (open)
		session->flags |= TDS_F_MESSAGE_OPEN;
	else
		session->flags &= ~TDS_F_MESSAGE_OPEN;
}

/*
 * A header read on a session whose SPID is known. With MARS, SMP begins
 * after the login response (as Microsoft's drivers do it): so the first
 * message after the one that named the SPID says, inside SMP or not,
 * whether the session is a MARS one; a header that continues an open
 * message (the login response's next packet) says nothing yet.
 */
static __always_inline void after_login_header(struct tds_session *session, bool open)
{
	if (!(session->flags & TDS_F_MESSAGE_OPEN))
		session->flags |= TDS_F_MARS_KNOWN;
	message_open(session, open);
}

/*
 * A TLS send of the current thread: it carries the record of the thread's
 * pending SSL_write*, which it consumes whether it fits or not (the next
 * write starts afresh). A fit names the socket's SPID, or, on a socket that
 * has one from TLS already, must name the same one.
 */
static __always_inline void pair_tls_write(const struct sock *sk, struct tds_session *session,
					   const __u8 *hdr, __u64 len)
{
	__u64 id = bpf_get_current_pid_tgid();
	struct tls_write *pending = pending_write(&id);
	struct tls_write write;

	if (!pending)
		return;
	write = *pending;
	if (write.thread != id)
		return; /* evicted and reused while read: not ours to consume */
	pending->at_ns = 0;
	if (write.ambiguous || !write.spid)
		return; /* counted when it became ambiguous; no SPID to give */
	if (bpf_ktime_get_ns() - write.at_ns > TLS_PAIR_WINDOW_NS ||
	    !tls_record_fits_write(hdr, len, write.plain_len)) {
		count_lost(LOST_TLS_UNPAIRED);
		return;
	}
	if (write.mars && !(session->flags & TDS_F_MARS)) {
		session->flags |= TDS_F_MARS;
		turn_forget(sk);
	}
	if (session->flags & TDS_F_SPID) {
		if (session->spid != write.spid && !(session->flags & TDS_F_TLS_CONFLICT)) {
			session->flags |= TDS_F_TLS_CONFLICT;
			count_lost(LOST_TLS_CONFLICT);
		}
		after_login_header(session, write.open);
		return;
	}
	session->headers++;
	session->last_type = TDS_TYPE_TABULAR_RESULT;
	session->spid = write.spid;
	session->flags |= TDS_F_SPID | TDS_F_SPID_TLS;
	message_open(session, write.open);
}

/* A watched send of an encrypted session that still has no SPID: one try fewer. */
static __always_inline void tls_try_failed(struct tds_session *session)
{
	if (session->flags & TDS_F_SPID)
		return;
	if (++session->tls_unpaired >= TLS_GIVE_UP_SENDS && !(session->flags & TDS_F_TLS_GAVE_UP)) {
		session->flags |= TDS_F_TLS_GAVE_UP;
		count_lost(LOST_TLS_GAVE_UP);
	}
}

/*
 * A send on a socket whose session is encrypted: whether the header must be
 * read (a watched write of this thread waits), after the doorbell for a
 * worker whose SSL_write is not watched.
 */
static __always_inline bool tls_send_worth_reading(struct tds_session *session, bool tls_on)
{
	__u64 id = bpf_get_current_pid_tgid();

	if (session->flags & TDS_F_SPID) { /* from TLS: each further pairing must agree */
		if (!tls_on && !(session->flags & TDS_F_MARS_KNOWN)) {
			/* Whether it is MARS is still to be read: it sends, so watch again. */
			session->tls_unpaired++;
			control_raise(SQL_CTL_TLS_WANTED);
		}
		return tls_on && pending_write(&id);
	}
	if (session->flags & TDS_F_TLS_GAVE_UP)
		return false;
	if (!tls_on) {
		/* The daemon watches the worker's SSL_write within 100 ms. */
		control_raise(SQL_CTL_TLS_WANTED);
		return false;
	}
	if (pending_write(&id))
		return true;
	tls_try_failed(session);
	return false;
}

/*
 * What a worker's send (or SSL_write plaintext) starting at `buf` is, its
 * first 8 bytes in `hdr`. With MARS a TDS packet travels after an SMP
 * header: then the 8 bytes after that are read into `hdr` and decide, and
 * *mars says so. Still only a header: SMP's framing, then TDS's.
 */
static __always_inline enum tds_verdict classify_send(const void *buf, __u8 *hdr, __u64 len, __u16 *spid,
						      bool *mars)
{
	enum tds_verdict verdict = tds_classify_send(hdr, len, spid);

	*mars = false;
	if (verdict != TDS_SMP_DATA)
		return verdict;
	if (len < SMP_HEADER_LEN + TDS_HEADER_LEN ||
	    bpf_probe_read_user(hdr, TDS_HEADER_LEN, buf + SMP_HEADER_LEN) ||
	    tds_classify_send(hdr, len - SMP_HEADER_LEN, spid) != TDS_SERVER_HEADER)
		return TDS_NOT_A_HEADER;
	*mars = true;
	return TDS_SERVER_HEADER;
}

static __always_inline int read_tds_header(const struct sock *sk, const struct msghdr *msg)
{
	struct tds_session fresh = {}, *session;
	__u64 ino, len = 0;
	const void *buf;
	__u16 spid = 0;
	__u8 hdr[TDS_HEADER_LEN];
	__u32 tgid = 0;
	__u8 worker = current_worker(&tgid);
	bool tls_on = worker & SQL_WORKER_TLS_WATCHED;
	bool mars;

	if (!worker)
		return 0;
	ino = sock_inode(sk);
	if (!ino)
		return 0;
	session = bpf_map_lookup_elem(&tds_sessions, &ino);
	/* MARS: several requests in flight, so turns would pair them wrongly. */
	if (!session || !(session->flags & TDS_F_MARS))
		turn_on_send(sk, msg, ino, tgid);
	if (session) {
		/* Known from a header on the wire, and whether it is MARS: done. */
		if ((session->flags & TDS_F_SPID) && !(session->flags & TDS_F_SPID_TLS) &&
		    (session->flags & TDS_F_MARS_KNOWN))
			return 0;
		if ((session->flags & TDS_F_ENCRYPTED) && !tls_send_worth_reading(session, tls_on))
			return 0;
	}
	buf = send_buffer_start(msg, &len);
	/* Shorter than a header: neither a header nor worth a read. */
	if (!buf || len < TDS_HEADER_LEN || bpf_probe_read_user(hdr, sizeof(hdr), buf))
		return 0;
	if (!session) {
		bpf_map_update_elem(&tds_sessions, &ino, &fresh, BPF_NOEXIST);
		session = bpf_map_lookup_elem(&tds_sessions, &ino);
		if (!session)
			return 0;
	}
	switch (classify_send(buf, hdr, len, &spid, &mars)) {
	case TDS_TLS_RECORD:
		session->flags |= TDS_F_ENCRYPTED;
		if (!tls_on) {
			control_raise(SQL_CTL_TLS_WANTED);
			return 0;
		}
		pair_tls_write(sk, session, hdr, len);
		tls_try_failed(session);
		return 0;
	case TDS_SERVER_HEADER:
		break;
	default:
		return 0; /* not a server packet header: leave it */
	}
	if (mars) {
		session->flags |= TDS_F_MARS;
		turn_forget(sk);
	}
	if (session->flags & TDS_F_SPID) {
		after_login_header(session, !(hdr[1] & TDS_STATUS_EOM));
		return 0;
	}
	if (session->flags & TDS_F_ENCRYPTED)
		return 0;
	session->headers++;
	session->last_type = hdr[0];
	session->spid = spid;
	if (spid)
		session->flags |= TDS_F_SPID; /* pre-login responses carry SPID 0 */
	message_open(session, !(hdr[1] & TDS_STATUS_EOM));
	return 0;
}

/*
 * An SSL_write* of a worker thread. Its plaintext starts at `buf` (OpenSSL
 * encrypts from the caller's buffer, so it is readable at entry). The write
 * waits in tls_writes for the thread's next TLS send; a write to another
 * connection before that send makes the pairing ambiguous, and then neither
 * write names a SPID.
 */
static __always_inline int on_tls_write(__u64 ssl, const void *buf, __u64 num)
{
	struct tls_write *entry;
	__u64 id, now;
	__u16 spid = 0;
	__u8 hdr[TDS_HEADER_LEN];
	__u32 tgid;
	bool mars;

	if (!(current_worker(&tgid) & SQL_WORKER_TLS_WATCHED))
		return 0;
	id = bpf_get_current_pid_tgid();
	entry = thread_entry(&id);
	if (!entry)
		return 0;
	now = bpf_ktime_get_ns();
	if (entry->at_ns && now - entry->at_ns <= TLS_PAIR_WINDOW_NS) {
		/* Its next record carries the earliest unsent write of a connection. */
		if (entry->ssl != ssl && !entry->ambiguous) {
			entry->ambiguous = 1;
			count_lost(LOST_TLS_AMBIGUOUS);
		}
		return 0;
	}
	if (entry->at_ns && entry->spid && !entry->ambiguous)
		count_lost(LOST_TLS_UNPAIRED); /* never sent by this thread within the window */
	entry->spid = 0; /* 0 for a pre-login packet or no header: a write all the same */
	entry->mars = 0;
	entry->open = 0;
	if (num >= TDS_HEADER_LEN && !bpf_probe_read_user(hdr, sizeof(hdr), buf) &&
	    classify_send(buf, hdr, num, &spid, &mars) == TDS_SERVER_HEADER) {
		entry->spid = spid;
		entry->mars = mars;
		entry->open = !(hdr[1] & TDS_STATUS_EOM);
	}
	entry->ambiguous = 0;
	entry->ssl = ssl;
	entry->plain_len = num;
	entry->at_ns = now;
	if (entry->thread != id) {
		/* Evicted and given to another thread while written: that write is void too. */
		entry->at_ns = 0;
		count_lost(LOST_TLS_WRITE_EVICTED);
	}
	return 0;
}

/* int SSL_write(SSL *ssl, const void *buf, int num) */
SEC("uprobe")
int BPF_KPROBE(on_ssl_write, void *ssl, const void *buf, int num)
{
	return on_tls_write((__u64)ssl, buf, num > 0 ? (__u64)num : 0);
}

/* int SSL_write_ex(SSL *ssl, const void *buf, size_t num, size_t *written) */
SEC("uprobe")
int BPF_KPROBE(on_ssl_write_ex, void *ssl, const void *buf, __u64 num)
{
	return on_tls_write((__u64)ssl, buf, num);
}

/* The tracepoint (6.16+): the cheapest way in. */
HOOK(tcp_sendmsg_locked, const struct sock *sk, const struct msghdr *msg)
{
	return read_tds_header(sk, msg);
}

/*
 * Older kernels: the function the tracepoint sits in, tcp_sendmsg_locked(sk,
 * msg, size), which every TCP send of a process goes through (an exported
 * symbol, so never inlined away).
 */
FUNC_HOOK(tcp_sendmsg_locked, tcp_sendmsg_locked, struct sock *sk, struct msghdr *msg)
{
	return read_tds_header(sk, msg);
}

/* Request timing (tds_turns.bpf.h): what a worker's sockets receive, send again, and close. */
HOOK(tcp_probe, struct sock *sk, const struct sk_buff *skb)
{
	turn_on_receive(sk, skb);
	return 0;
}

HOOK(tcp_retransmit_skb, const struct sock *sk, const struct sk_buff *skb)
{
	turn_on_retransmit(sk, skb);
	return 0;
}

HOOK(inet_sock_set_state, const struct sock *sk, const int oldstate, const int newstate)
{
	turn_on_state(sk, oldstate, newstate);
	return 0;
}
