/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * tds_turns.bpf.h - each SQL Server request's latency, from the turns its
 * socket takes, without reading a byte of it (part of the sqlserver family;
 * included by sqlserver.bpf.c after its maps).
 *
 * Without MARS a TDS connection is strictly request -> response: the
 * client's bytes arrive, the worker answers, the client's next bytes arrive.
 * So on a worker's socket:
 *
 *   tcp_probe            a segment the server receives (top of
 *                        tcp_rcv_established): request bytes after the
 *                        worker answered begin a new request, and end the
 *                        previous one; an ACK covering the response's last
 *                        byte is the earliest proof it was delivered
 *   tcp_sendmsg_locked   the worker hands response bytes to TCP (the
 *                        family's send hook): the last one ends `server`
 *   tcp_retransmit_skb   a segment of the response sent again; every
 *                        retransmission during a timed request is marked,
 *                        held up the response or not, for the tcp family's
 *                        record of it (tds_retransmits)
 *   inet_sock_set_state  the connection leaves ESTABLISHED: its last request
 *                        ends
 *
 *   server   = the request's first byte arrived -> the response's last byte
 *              handed to TCP (what the server took, its queueing included);
 *   delivery = that -> the response's last transmission (its last
 *              retransmission, if any) plus the path's round trip, or the
 *              ACK covering it when that came first. The transmission-based
 *              end stands where the ACK is late for reasons that are not the
 *              network's: a delayed ACK, or an ACK that waits for the
 *              client's next request. The round trip is the socket's minimum
 *              RTT (the kernel's windowed min_rtt), not its smoothed RTT:
 *              request/response traffic feeds srtt with those late ACKs (on
 *              the simulator it climbed to 9 ms on a 100 µs veth).
 *
 * server + delivery is what the client waited for, with the ACK's one-way
 * trip standing in for the request's, which the server cannot see: a request
 * whose own segments were lost or delayed on the way in arrives late, and
 * its wait before that is invisible here (docs/sqlserver.md).
 *
 * A request is sent to userspace when it ends: at the next request's arrival
 * or at the close. Bytes that arrive while the worker is answering (an
 * attention, i.e. a cancel) begin a new request: the cancelled one ends
 * there, and the attention's own answer is timed as a request. A MARS
 * session (several requests in flight) is not followed once its TDS is seen
 * inside SMP (turn_forget), in its first response after the login: the
 * request that response answers is dropped, not timed.
 *
 * Every update happens under the socket's lock (softirq receive, the send
 * call, the retransmit timer, state changes), so a turn is never written by
 * two programs at once.
 */
#ifndef STALLTRACE_TDS_TURNS_BPF_H
#define STALLTRACE_TDS_TURNS_BPF_H

#define TCPHDR_FIN 0x01
#define TCPHDR_ACK 0x10
#define TCP_ESTABLISHED_STATE 1

/* Where a worker's socket stands between two requests. */
struct tds_turn {
	__u64 ino;           /* the socket's inode: a reused struct sock starts afresh */
	__u64 request_at;    /* the request's first byte arrived; 0: no request yet */
	__u64 last_send_at;  /* the response's last send so far; 0: not answered yet */
	__u64 last_tx_at;    /* the response's last retransmission; 0: none */
	__u64 acked_at;      /* the first ACK covering the response's last byte; 0: none yet */
	__u32 tgid;          /* the worker */
	__u32 received_end;  /* the sequence after the last byte received */
	__u32 response_start;
	__u32 response_end;  /* the sequence after the response's last byte handed to TCP */
	__u32 retransmits;
	__u32 request_write_seq; /* write_seq when the request arrived: moved without a send seen, it was answered unseen */
	__u16 spid;          /* the session's SPID when the request arrived */
	__u16 pad[3];
};

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* struct sock address */
	__type(value, struct tds_turn);
} tds_turns SEC(".maps");

/*
 * The local port of every socket ever given a turn (a byte per port, never
 * cleared), checked before the tds_turns lookup: tcp_probe runs on every
 * segment the host receives, and most belong to no worker. A port's byte
 * spares those a hash lookup; a stale byte only costs the lookup it would
 * have cost anyway. Bytes, not bits: setting one is a plain store, safe
 * from two CPUs at once without the atomic OR that 5.10 lacks.
 */
struct tds_worker_ports {
	__u8 seen[65536];
};

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tds_worker_ports);
} tds_worker_ports SEC(".maps");

/* The byte of the socket's local port, NULL only if the map is missing. */
static __always_inline __u8 *worker_port(const struct sock *sk)
{
	struct tds_worker_ports *ports;
	__u32 zero = 0;

	ports = bpf_map_lookup_elem(&tds_worker_ports, &zero);
	if (!ports)
		return NULL;
	return &ports->seen[(__u16)KREAD(sk, __sk_common.skc_num)];
}

/* Could the socket have a turn? False for certain when its port never had one. */
static __always_inline bool maybe_worker_socket(const struct sock *sk)
{
	__u8 *seen = worker_port(sk);

	return seen && *seen;
}

/* Read every poll interval (100 ms): 1 MiB holds 18,000 requests. */
struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1024 * 1024);
} sql_requests SEC(".maps");

/*
 * The verdict on each retransmission of a timed worker socket, for userspace
 * to put on the tcp family's record of it. Read within a poll (100 ms) of
 * the retransmission; 4096 hold the retransmissions of several seconds of
 * heavy loss on every session, and the oldest give way.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 4096);
	__type(key, struct tds_retransmit_key);
	__type(value, struct tds_retransmit_mark);
} tds_retransmits SEC(".maps");

static __always_inline bool seq_before(__u32 a, __u32 b)
{
	return (__s32)(a - b) < 0;
}

static __always_inline bool seq_after(__u32 a, __u32 b)
{
	return seq_before(b, a);
}

/* The request on this turn ends at `now`: sent to userspace when it was answered. */
static __always_inline void end_request(const struct sock *sk, struct tds_turn *turn, __u64 now, __u16 flags)
{
	struct tcp_sock *tp = TCP_SK(sk);
	struct sql_request r = {};
	__u64 sent, end;

	if (!turn->request_at || !turn->last_send_at || !tp)
		return; /* never answered: nothing to time */
	sent = turn->last_tx_at > turn->last_send_at ? turn->last_tx_at : turn->last_send_at;
	end = sent + (__u64)KREAD(tp, rtt_min.s[0].v) * 1000;
	if (turn->acked_at && turn->acked_at < end) {
		end = turn->acked_at;
		flags |= SQL_REQ_ACKED;
	}
	if (end > now)
		end = now;
	if (end < turn->last_send_at)
		end = turn->last_send_at;
	if (turn->retransmits)
		flags |= SQL_REQ_RETRANSMITTED;
	r.ino = turn->ino;
	r.arrived_ns = turn->request_at;
	r.server_ns = turn->last_send_at - turn->request_at;
	r.delivery_ns = end - turn->last_send_at;
	r.tgid = turn->tgid;
	r.response_bytes = turn->response_end - turn->response_start;
	r.retransmits = turn->retransmits;
	r.spid = turn->spid;
	r.flags = flags;
	if (bpf_ringbuf_output(&sql_requests, &r, sizeof(r), BPF_RB_NO_WAKEUP))
		count_lost(LOST_SQL_REQUEST_RINGBUF);
}

static __always_inline void begin_request(struct tds_turn *turn, __u32 write_seq, __u64 now)
{
	struct tds_session *session = bpf_map_lookup_elem(&tds_sessions, &turn->ino);

	turn->request_at = now;
	turn->request_write_seq = write_seq;
	turn->last_send_at = 0;
	turn->last_tx_at = 0;
	turn->acked_at = 0;
	turn->retransmits = 0;
	turn->spid = session && (session->flags & TDS_F_SPID) ? session->spid : 0;
}

/*
 * A worker's send (tcp_sendmsg_locked, once per pass of its copy loop: the
 * send's end, write_seq plus what is left to copy, is the same on each). The
 * first send on a socket only starts its turns: the request it answers was
 * not seen. Nor was one whose bytes TCP took in (rcv_nxt) while the worker
 * was answering, with no tcp_probe run for them (the kernel skips a program
 * that is already running on the CPU): the answer so far ends the previous
 * request, and this one is counted as untimed.
 */
static __always_inline void turn_on_send(const struct sock *sk, const struct msghdr *msg, __u64 ino, __u32 tgid)
{
	struct tcp_sock *tp = TCP_SK(sk);
	struct tds_turn fresh = {}, *turn;
	__u64 key = (__u64)sk, now;
	__u32 write_seq, rcv_nxt, end;

	if (!tp)
		return;
	write_seq = KREAD(tp, write_seq);
	rcv_nxt = KREAD(tp, rcv_nxt);
	end = write_seq + (__u32)KREAD(msg, msg_iter.count);
	turn = bpf_map_lookup_elem(&tds_turns, &key);
	if (!turn || turn->ino != ino) {
		fresh.ino = ino;
		fresh.tgid = tgid;
		fresh.received_end = rcv_nxt;
		if (bpf_map_update_elem(&tds_turns, &key, &fresh, BPF_ANY) == 0) {
			__u8 *seen = worker_port(sk);

			if (seen)
				*seen = 1;
		}
		return;
	}
	now = bpf_ktime_get_ns();
	if (turn->last_send_at && seq_after(rcv_nxt, turn->received_end)) {
		end_request(sk, turn, now, 0);
		count_lost(LOST_SQL_REQUEST_UNTIMED);
		turn->request_at = 0;
		turn->received_end = rcv_nxt;
		return;
	}
	if (!turn->request_at)
		return;
	if (!turn->last_send_at) {
		turn->response_start = write_seq;
		turn->response_end = end;
	} else if (seq_after(end, turn->response_end)) {
		turn->response_end = end;
		turn->acked_at = 0; /* an ACK before these bytes does not cover them */
	}
	turn->last_send_at = now;
}

/*
 * A segment the server's side of a worker socket receives. New bytes while a
 * request is still unanswered are more of it, unless the worker's write_seq
 * moved meanwhile: then it answered with a send the kernel skipped the hook
 * for, and that request is counted as untimed.
 */
static __always_inline void turn_on_receive(const struct sock *sk, const struct sk_buff *skb)
{
	const struct tcp_skb_cb *cb = (const struct tcp_skb_cb *)&skb->cb[0];
	struct tcp_sock *tp = TCP_SK(sk);
	__u64 key = (__u64)sk, now;
	struct tds_turn *turn;
	__u32 seq, end_seq, write_seq;
	__u8 tcp_flags;
	bool data;

	if (!control_set(SQL_CTL_WORKERS_KNOWN) || !tp || !maybe_worker_socket(sk))
		return;
	turn = bpf_map_lookup_elem(&tds_turns, &key);
	if (!turn)
		return;
	now = bpf_ktime_get_ns();
	seq = KREAD(cb, seq);
	end_seq = KREAD(cb, end_seq);
	tcp_flags = KREAD(cb, tcp_flags);
	if (turn->last_send_at && !turn->acked_at && (tcp_flags & TCPHDR_ACK) &&
	    !seq_before(KREAD(cb, ack_seq), turn->response_end))
		turn->acked_at = now;
	/* Bytes (a FIN takes a sequence number, not a byte) not received before. */
	data = end_seq - seq > ((tcp_flags & TCPHDR_FIN) ? 1U : 0U);
	if (!seq_after(end_seq, turn->received_end))
		return;
	turn->received_end = end_seq;
	if (!data)
		return;
	write_seq = KREAD(tp, write_seq);
	if (turn->request_at && !turn->last_send_at) {
		if (write_seq == turn->request_write_seq)
			return; /* more of the request being received */
		count_lost(LOST_SQL_REQUEST_UNTIMED);
	}
	end_request(sk, turn, now, 0);
	begin_request(turn, write_seq, now);
}

/*
 * A retransmission on a worker's socket: of its response's data, or not.
 * Judged only while a timed request is open: before the socket's first
 * timed request (the login's answers, a socket older than the daemon) the
 * client's wait is unknown, and the segment gets no verdict. Data of an
 * answered request's response whose ACK was lost counts as held up: the
 * server cannot tell a lost ACK from lost data.
 */
static __always_inline void turn_on_retransmit(const struct sock *sk, const struct sk_buff *skb)
{
	const struct tcp_skb_cb *cb = (const struct tcp_skb_cb *)&skb->cb[0];
	struct tds_retransmit_mark mark = {};
	struct tds_retransmit_key mark_key = {};
	__u64 key = (__u64)sk;
	struct tds_turn *turn;
	__u32 seq;

	if (!control_set(SQL_CTL_WORKERS_KNOWN) || !maybe_worker_socket(sk))
		return;
	turn = bpf_map_lookup_elem(&tds_turns, &key);
	if (!turn || !turn->request_at)
		return;
	seq = KREAD(cb, seq);
	if (turn->last_send_at && seq_before(seq, turn->response_end) &&
	    seq_after(KREAD(cb, end_seq), turn->response_start)) {
		turn->retransmits++;
		turn->last_tx_at = bpf_ktime_get_ns();
		mark.held_up = 1;
	}
	mark.request_at = turn->request_at;
	mark_key.ino = turn->ino;
	mark_key.seq = seq;
	bpf_map_update_elem(&tds_retransmits, &mark_key, &mark, BPF_ANY);
}

/* The session turned out to be a MARS one: its turns are not followed. */
static __always_inline void turn_forget(const struct sock *sk)
{
	__u64 key = (__u64)sk;

	bpf_map_delete_elem(&tds_turns, &key);
}

/*
 * The connection leaves ESTABLISHED: its last request ends, and its turns
 * with it. No port check (maybe_worker_socket): going straight to CLOSE (a
 * reset) releases a port the kernel picked before this tracepoint, so the
 * socket reads port 0; state changes are rare enough for the lookup.
 */
static __always_inline void turn_on_state(const struct sock *sk, int oldstate, int newstate)
{
	__u64 key = (__u64)sk;
	struct tds_turn *turn;

	if (oldstate != TCP_ESTABLISHED_STATE || newstate == TCP_ESTABLISHED_STATE ||
	    !control_set(SQL_CTL_WORKERS_KNOWN))
		return;
	turn = bpf_map_lookup_elem(&tds_turns, &key);
	if (!turn)
		return;
	end_request(sk, turn, bpf_ktime_get_ns(), SQL_REQ_AT_CLOSE);
	bpf_map_delete_elem(&tds_turns, &key);
}

#endif /* STALLTRACE_TDS_TURNS_BPF_H */
