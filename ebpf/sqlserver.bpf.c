// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * sqlserver.bpf.c - the SPID of each SQL Server session, from the TDS header
 * of what the server sends.
 *
 *   tcp_sendmsg_locked   a send by a SQL Server worker (their tgids are in
 *                        sql_workers, filled by the daemon's discovery): when
 *                        the send starts at the beginning of the caller's
 *                        buffer, its first 8 bytes are read; if they are a
 *                        server TDS packet header (tabular result, pre-login),
 *                        bytes 4-5 are the session's SPID. The tracepoint is
 *                        6.16+; before, fentry or kprobe on the function.
 *
 * Only those 8 header bytes are ever read, and only from the server's side:
 * never a byte of SQL text or result data, and nothing of a send shorter than
 * a header. Once a socket's SPID is known, its sends cost one map lookup. A
 * TLS record instead of a header marks the session encrypted (no SPID from
 * headers; DMV enrichment can still give it). What the 8 bytes are is decided
 * in tds.h, which the Rust tests run on the host.
 *
 * Measured assumption (simulator; not verified against real SQL Server): the
 * server writes each TDS packet with its own send, starting at the buffer's
 * start, so the first bytes of a send are a header.
 */
#include "common.bpf.h"
#include "sock.bpf.h"
#include "tds.h"

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32); /* tgid of a SQL Server worker */
	__type(value, __u8);
} sql_workers SEC(".maps");

/*
 * Non-zero once the daemon has put any worker in sql_workers. tcp_sendmsg_locked
 * fires for every TCP send on the host, and on a host (or at a moment) without
 * SQL Server the hash lookup in sql_workers was most of its cost: an array
 * lookup is inlined by the verifier into a few instructions, so the hook now
 * leaves before any helper call.
 */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u32);
} sql_workers_known SEC(".maps");

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

static __always_inline int read_tds_header(const struct sock *sk, const struct msghdr *msg)
{
	struct tds_session fresh = {}, *session;
	__u32 tgid, zero = 0, *known;
	__u64 ino, len = 0;
	const void *buf;
	__u16 spid = 0;
	__u8 hdr[TDS_HEADER_LEN];

	known = bpf_map_lookup_elem(&sql_workers_known, &zero);
	if (!known || !*known)
		return 0;
	tgid = bpf_get_current_pid_tgid() >> 32;
	if (!bpf_map_lookup_elem(&sql_workers, &tgid))
		return 0;
	ino = sock_inode(sk);
	if (!ino)
		return 0;
	session = bpf_map_lookup_elem(&tds_sessions, &ino);
	if (session && (session->flags & (TDS_F_SPID | TDS_F_ENCRYPTED)))
		return 0;
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
	switch (tds_classify_send(hdr, len, &spid)) {
	case TDS_TLS_RECORD:
		session->flags |= TDS_F_ENCRYPTED;
		return 0;
	case TDS_SERVER_HEADER:
		break;
	default:
		return 0; /* not a server packet header: leave it */
	}
	session->headers++;
	session->last_type = hdr[0];
	session->spid = spid;
	if (spid)
		session->flags |= TDS_F_SPID; /* pre-login responses carry SPID 0 */
	return 0;
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
