// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * tcp.bpf.c - TCP retransmissions, classified from the kernel's own state,
 * and round-trip times per peer.
 *
 *   tcp_retransmit_skb     every retransmission attempt (after the send; err says
 *                          whether it went out): an event, and the peer's counters
 *   tcp_retransmit_synack  a SYN-ACK sent again (a listener's half-open connection)
 *   sock_send_length,      every send and receive call: the socket's owner (the process
 *   sock_recv_length       making the call), kept so retransmits, which run in softirq,
 *                          can name it; and the peer's smoothed RTT, sampled when an ACK
 *                          of new data came since the socket's last sample
 *                          (6.3+; before: tcp_sendmsg / tcp_recvmsg by fentry or kprobe)
 *   inet_sock_set_state    connect() and listen() owners; at close, retransmits since
 *                          the socket's last with no record of their own, and forget it
 *
 * Kernels differ (every difference is found with CO-RE at load, never from
 * the version number):
 *   - tcp_retransmit_skb gained `err` in 6.17 and fires for every attempt
 *     since; before, it fired only once a retransmission had gone out, so
 *     `err` is 0 there by construction and failed attempts (TCPRetransFail)
 *     are not seen;
 *   - the owner lives in the socket's local storage where tracing programs
 *     may use it (5.11+, tp_btf and fentry), else in an LRU hash by address.
 *
 * Classification (the order matters; verified against the kernel's own
 * counters in /proc/net/netstat, see docs/records.md):
 *   SYN flag in the segment          -> syn
 *   icsk_ca_state == TCP_CA_Loss     -> rto (with the timer flag when icsk_pending
 *                                       is 0: the timer handler clears it first)
 *   icsk_pending == LOSS_PROBE, in
 *   Open or CWR, and the segment is
 *   the last one sent                -> tlp (fast retransmits often carry a re-armed
 *                                       LOSS_PROBE timer, hence the other checks)
 *   otherwise                        -> fast
 */
#include "common.bpf.h"
#include "sock.bpf.h"
#include "slots.bpf.h"
#include "process_filter.bpf.h"

#define IPPROTO_TCP 6
#define TCPHDR_SYN 0x02
#define ICSK_TIME_LOSS_PROBE 5
#define TCP_LISTEN_STATE 10
#define TCP_SYN_SENT_STATE 2
#define TCP_CLOSE_STATE 7

/* Set by the daemon at load time (--netns, --port): 1 when the filter map is in use. */
const volatile __u64 filter_netns = 0;
const volatile __u64 filter_ports = 0;

/* ptr_key() scratch words (slots.bpf.h) */
enum tcp_program {
	PROG_RETRANSMIT,
	PROG_SYNACK,
	PROG_SEND,
	PROG_RECV,
	PROG_SET_STATE,
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u32); /* netns inode */
	__type(value, __u8);
} netns_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 64);
	__type(key, __u16); /* port, host order: local or remote */
	__type(value, __u8);
} port_filter SEC(".maps");

#include "tcp_owner.bpf.h"

/*
 * Per-peer aggregates, a peer being one connection (struct tcp_peer_key: the
 * whole tuple), shared and preallocated: max_entries x ~4 KiB of value, the
 * 44-byte key besides. LRU, so the least recently active peers give way when
 * the bound is hit; the daemon sees that from peer_inserts exceeding the
 * entries it finds, and deletes the peers idle for an interval.
 */
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 1024);
	__type(key, struct tcp_peer_key);
	__type(value, struct tcp_peer_stats);
} tcp_peers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} peer_inserts SEC(".maps");

/* An all-zero peer entry to insert from (too big for the stack). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct tcp_peer_stats);
} tcp_peer_zero SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_RINGBUF);
	__uint(max_entries, 1024 * 1024);
} tcp_events SEC(".maps");

static __always_inline bool wanted(const struct tuple *t)
{
	if (filter_netns && !bpf_map_lookup_elem(&netns_filter, &t->netns))
		return false;
	if (filter_ports && !bpf_map_lookup_elem(&port_filter, &t->sport) &&
	    !bpf_map_lookup_elem(&port_filter, &t->dport))
		return false;
	return true;
}

static __always_inline struct tcp_peer_stats *peer_for(const struct tuple *t)
{
	struct tcp_peer_key key = {
		.netns = t->netns,
		.family = t->family,
		.sport = t->sport,
		.dport = t->dport,
	};
	struct tcp_peer_stats *peer;
	__u32 zero = 0;
	__u64 *inserts;
	void *init;

	/* The whole tuple: tcp_rtt names each connection as tcp_retransmit does. */
	__builtin_memcpy(key.saddr, t->saddr, 16);
	__builtin_memcpy(key.daddr, t->daddr, 16);
	peer = bpf_map_lookup_elem(&tcp_peers, &key);
	if (peer)
		return peer;
	init = bpf_map_lookup_elem(&tcp_peer_zero, &zero);
	if (!init)
		return NULL;
	if (bpf_map_update_elem(&tcp_peers, &key, init, BPF_NOEXIST) == 0) {
		inserts = bpf_map_lookup_elem(&peer_inserts, &zero);
		if (inserts)
			__sync_fetch_and_add(inserts, 1);
	}
	return bpf_map_lookup_elem(&tcp_peers, &key);
}

static __always_inline void fill_owner(struct tcp_retransmit_event *e, struct tcp_owner *owner)
{
	if (!owner)
		return;
	e->flags |= TCP_RETX_F_OWNER;
	e->tgid = owner->tgid;
	e->pid = owner->pid;
	__builtin_memcpy(e->comm, owner->comm, sizeof(e->comm));
}

/* 6.17's tcp_retransmit_skb(sk, skb, err) has an event struct of its own, with `err`. */
struct trace_event_raw_tcp_retransmit_skb___6_17 {
	int err;
} __attribute__((preserve_access_index));

/*
 * The event is built on the stack and copied into the ring buffer: with
 * bpf_ringbuf_reserve the verifiers before 6.8 lost track of the
 * reservation across this function's branches ("Unreleased reference").
 */
HOOK(tcp_retransmit_skb, const struct sock *sk, const struct sk_buff *skb)
{
	const struct tcp_skb_cb *cb = (const struct tcp_skb_cb *)&skb->cb[0];
	int err = bpf_core_field_exists(struct trace_event_raw_tcp_retransmit_skb___6_17, err) ? (int)TP_ARG(2)
												 : 0;
	struct tcp_sock *tp = TCP_SK(sk);
	struct tcp_retransmit_event e = {};
	struct tcp_peer_stats *peer;
	struct tcp_owner *owner;
	__u32 total_retrans, stamp, now_ms, segs, flags, since, unseen = 0;
	__u8 ca_state, pending, kind;
	__u64 now, first_tx_us, waited_us;
	bool counted;
	struct tuple t;

	if (!tp)
		return 0;
	common_tuple((const struct sock_common *)sk, &t);
	if (!wanted(&t))
		return 0;
	now = bpf_ktime_get_ns();
	segs = KREAD(cb, tcp_gso_segs);
	ca_state = KREAD_BF(&tp->inet_conn, icsk_ca_state);
	pending = KREAD(tp, inet_conn.icsk_pending);
	total_retrans = KREAD(tp, total_retrans);

	/*
	 * Did the kernel count this attempt in RetransSegs? It adds segs to
	 * tp->total_retrans exactly when it does, so compare with the value at
	 * the socket's previous retransmit, or with the baseline taken when its
	 * owner was first noted; with neither, fall back to err (early exits,
	 * -EBUSY and friends, are not counted; send failures are).
	 * What the kernel counted beyond this attempt since then belongs to
	 * attempts with no record: runs of this program the kernel skipped (a
	 * recursion miss; the development VM's kernel runs none while the
	 * interrupted task is PID 1), or before 6.17 attempts that failed
	 * locally, which fire no tracepoint there. Counted in `lost` and in the
	 * peer's segments, so the books stay whole. An attempt the kernel did not
	 * count after unseen ones that added at least as many is taken for
	 * counted (two rare things at once).
	 */
	owner = owner_of(sk, PROG_RETRANSMIT);
	if (owner && owner->seen_retrans && total_retrans >= owner->last_total_retrans) {
		since = total_retrans - owner->last_total_retrans;
		counted = segs && since >= segs;
		unseen = since - (counted ? segs : 0);
	} else {
		counted = err == 0 || err > 0 || err == -1 /* EPERM */ || err == -105 /* ENOBUFS */;
	}
	if (owner) {
		owner->last_total_retrans = total_retrans;
		owner->seen_retrans = 1;
	}
	/* after the books: a socket that changes owner starts from this count */
	if (!owner_wanted(sk, owner))
		return 0;
	if (unseen)
		count_lost_n(LOST_TCP_RETRANS_UNSEEN, unseen);

	peer = peer_for(&t);
	if (peer) {
		__sync_fetch_and_add(&peer->retrans_events, 1);
		if (counted || unseen)
			__sync_fetch_and_add(&peer->retrans_segs, (counted ? segs : 0) + unseen);
	}

	flags = counted ? TCP_RETX_F_COUNTED : 0;
	if (KREAD(cb, tcp_flags) & TCPHDR_SYN) {
		kind = TCP_RETX_SYN;
	} else if (ca_state == TCP_CA_Loss) {
		kind = TCP_RETX_RTO;
		if (pending == 0)
			flags |= TCP_RETX_F_TIMER;
	} else if (pending == ICSK_TIME_LOSS_PROBE &&
		   (ca_state == TCP_CA_Open || ca_state == TCP_CA_CWR) &&
		   KREAD(cb, end_seq) == KREAD(tp, snd_nxt)) {
		/* the probe is the last segment sent (split off the tail skb if
		 * need be); tcp_schedule_loss_probe arms the timer in Open and CWR
		 * only, so a tail retransmit in Disorder is a fast one under a
		 * stale timer */
		kind = TCP_RETX_TLP;
		/*
		 * How long the probe's flight went unacknowledged: the rate
		 * sampler's first_tx_mstamp (us, the clock of bpf_ktime_get_ns) is
		 * the send of the flight begun from idle, or of the last segment
		 * acknowledged since, and the probe itself does not move it
		 * (packets are in flight). A lone response's probe waits two
		 * round trips plus 200 ms: the stall users see, no RTO involved.
		 */
		first_tx_us = KREAD(tp, first_tx_mstamp);
		waited_us = now / 1000 - first_tx_us;
		if (first_tx_us && now / 1000 > first_tx_us && waited_us <= 0xffffffffULL) {
			e.probe_after_us = (__u32)waited_us;
			flags |= TCP_RETX_F_PROBE;
		}
	} else {
		kind = TCP_RETX_FAST;
	}
	if (peer && err == 0) {
		if (kind == TCP_RETX_RTO && (flags & TCP_RETX_F_TIMER))
			__sync_fetch_and_add(&peer->rto_timeouts, 1);
		else if (kind == TCP_RETX_FAST)
			__sync_fetch_and_add(&peer->fast, 1);
		else if (kind == TCP_RETX_TLP)
			__sync_fetch_and_add(&peer->tlp, 1);
		else if (kind == TCP_RETX_SYN)
			__sync_fetch_and_add(&peer->syn, 1);
	}

	/* retrans_stamp: ms, or us with tcp_usec_ts (6.7+); same clock as bpf_ktime_get_ns */
	stamp = KREAD(tp, retrans_stamp);
	if (stamp) {
		if (tcp_usec_ts(tp))
			now_ms = (__u32)(now / 1000);
		else
			now_ms = (__u32)(now / 1000000);
		e.stalled_ms = tcp_usec_ts(tp) ? (now_ms - stamp) / 1000 : now_ms - stamp;
		flags |= TCP_RETX_F_EPISODE;
	}
	e.kind = EVENT_TCP_RETRANSMIT;
	e.flags = flags;
	e.ts_ns = now;
	e.sock_ino = sock_inode(sk);
	e.netns = t.netns;
	e.family = t.family;
	e.sport = t.sport;
	e.dport = t.dport;
	e.state = KREAD(sk, __sk_common.skc_state);
	e.ca_state = ca_state;
	e.retx_kind = kind;
	e.backoff = KREAD(tp, inet_conn.icsk_backoff);
	e.retransmits = KREAD(tp, inet_conn.icsk_retransmits);
	__builtin_memcpy(e.saddr, t.saddr, 16);
	__builtin_memcpy(e.daddr, t.daddr, 16);
	e.err = err;
	e.segs = segs;
	e.bytes = KREAD(skb, len);
	e.seq = KREAD(cb, seq);
	e.rto_jiffies = KREAD(tp, inet_conn.icsk_rto);
	e.srtt_us = KREAD(tp, srtt_us) >> 3;
	fill_owner(&e, owner);
	if (bpf_ringbuf_output(&tcp_events, &e, sizeof(e), BPF_RB_NO_WAKEUP))
		count_lost(LOST_TCP_RINGBUF);
	return 0;
}

/* A SYN-ACK sent again: `sk` is the listener, the connection is the request sock. */
HOOK(tcp_retransmit_synack, const struct sock *sk, const struct request_sock *req)
{
	struct tcp_retransmit_event e = {};
	struct tcp_owner *owner = owner_of(sk, PROG_SYNACK);
	struct tcp_peer_stats *peer;
	struct tcp_sock *tp;
	struct tuple t;

	/*
	 * sk is a listener, or a Fast Open connection's own socket, whose
	 * total_retrans the kernel has just moved for this SYN-ACK: keep its
	 * books with it, or the next retransmit would count it as unseen.
	 */
	if (owner && owner->seen_retrans && KREAD(sk, __sk_common.skc_state) != TCP_LISTEN_STATE) {
		tp = TCP_SK(sk);
		if (tp)
			owner->last_total_retrans = KREAD(tp, total_retrans);
	}
	common_tuple(&req->__req_common, &t);
	if (!wanted(&t) || !owner_wanted(sk, owner))
		return 0;
	peer = peer_for(&t);
	if (peer) {
		__sync_fetch_and_add(&peer->retrans_events, 1);
		__sync_fetch_and_add(&peer->retrans_segs, 1);
		__sync_fetch_and_add(&peer->syn, 1);
	}
	e.kind = EVENT_TCP_RETRANSMIT;
	e.flags = TCP_RETX_F_COUNTED | TCP_RETX_F_SYNACK;
	e.ts_ns = bpf_ktime_get_ns();
	e.netns = t.netns;
	e.family = t.family;
	e.sport = t.sport;
	e.dport = t.dport;
	e.state = 3; /* TCP_SYN_RECV: the connection's state, not the listener's */
	e.retx_kind = TCP_RETX_SYN;
	e.retransmits = KREAD(req, num_retrans);
	__builtin_memcpy(e.saddr, t.saddr, 16);
	__builtin_memcpy(e.daddr, t.daddr, 16);
	e.segs = 1;
	fill_owner(&e, owner);
	if (bpf_ringbuf_output(&tcp_events, &e, sizeof(e), BPF_RB_NO_WAKEUP))
		count_lost(LOST_TCP_RINGBUF);
	return 0;
}

/*
 * The peer's smoothed RTT, sampled at the socket's send and receive calls
 * rather than at every segment it receives (tcp_probe): a program per received
 * segment costs its entry and exit on each before any work (~55 ns on the
 * development VM with bpf_stats on), then a hash lookup of the peer, and the
 * segments outnumber the calls many times on a bulk stream. The kernel's
 * estimate moves only when an ACK acknowledges new data (tcp_ack ->
 * tcp_rtt_estimator), i.e. when snd_una advances, so a sample is taken only
 * then and at most once per call: a request/response connection gets one per
 * round trip on each side (the ACK of the request comes with the response,
 * seen at the next call), and a bulk sender at most one per send call, not one
 * per ACK. A socket that only receives has no new estimate to sample. The
 * first call seen only takes the baseline: the estimate may date from before
 * we attached.
 *
 * The filters' verdict is kept with the socket: its namespace and ports do not
 * change once it is connected, which it is by the time snd_una has moved.
 */
static __always_inline void sample_rtt(struct sock *sk, struct tcp_owner *owner)
{
	struct tcp_peer_stats *peer;
	struct tcp_sock *tp;
	__u32 una, srtt;
	struct tuple t;
	bool first;

	if (!owner || owner->rtt_wanted == RTT_UNWANTED || !owner_wanted(sk, owner))
		return;
	tp = TCP_SK(sk);
	if (!tp)
		return;
	una = KREAD(tp, snd_una);
	if (owner->rtt_seen && owner->rtt_una == una)
		return;
	first = !owner->rtt_seen;
	owner->rtt_una = una;
	owner->rtt_seen = 1;
	srtt = KREAD(tp, srtt_us) >> 3;
	if (first || !srtt)
		return;
	common_tuple((const struct sock_common *)sk, &t);
	if (!owner->rtt_wanted)
		owner->rtt_wanted = wanted(&t) ? RTT_WANTED : RTT_UNWANTED;
	if (owner->rtt_wanted != RTT_WANTED)
		return;
	peer = peer_for(&t);
	if (peer)
		hist_add(&peer->srtt, (__u64)srtt * 1000);
}

OPTIONAL_HOOK(sock_send_length, struct sock *sk, int ret, int flags)
{
	if (KREAD(sk, sk_protocol) == IPPROTO_TCP)
		sample_rtt(sk, note_owner(sk, PROG_SEND));
	return 0;
}

OPTIONAL_HOOK(sock_recv_length, struct sock *sk, int ret, int flags)
{
	if (KREAD(sk, sk_protocol) == IPPROTO_TCP)
		sample_rtt(sk, note_owner(sk, PROG_RECV));
	return 0;
}

/*
 * Before 6.3 (no sock_*_length tracepoints): the TCP send and receive calls
 * themselves, at their entry; an ACK that came during a call is sampled at the
 * next one.
 */
OPTIONAL_FUNC_HOOK(sock_send_length, tcp_sendmsg, struct sock *sk)
{
	sample_rtt(sk, note_owner(sk, PROG_SEND));
	return 0;
}

OPTIONAL_FUNC_HOOK(sock_recv_length, tcp_recvmsg, struct sock *sk)
{
	sample_rtt(sk, note_owner(sk, PROG_RECV));
	return 0;
}

/*
 * Attempts after a socket's last retransmit with no record of their own
 * (the hook skipped, see tcp_retransmit_skb): no later retransmit finds
 * them, so the close does, as long as the filters want the socket. The
 * baseline is dropped: tcp_disconnect zeroes the count after this, and a
 * socket that connects again takes a new one at SYN_SENT.
 */
static __always_inline void retrans_unseen_at_close(const struct sock *sk)
{
	struct tcp_owner *owner = owner_of(sk, PROG_SET_STATE);
	struct tcp_sock *tp = TCP_SK(sk);
	__u32 total_retrans, unseen;
	struct tcp_peer_stats *peer;
	struct tuple t;

	if (!owner || !owner->seen_retrans || !tp)
		return;
	owner->seen_retrans = 0;
	total_retrans = KREAD(tp, total_retrans);
	if (total_retrans <= owner->last_total_retrans)
		return;
	unseen = total_retrans - owner->last_total_retrans;
	common_tuple((const struct sock_common *)sk, &t);
	/*
	 * Closing released a port the kernel picked (inet_put_port zeroes
	 * skc_num before this tracepoint); inet_sport keeps it, so the segments
	 * go to the connection's own peer entry.
	 */
	if (!t.sport)
		t.sport = swap16(KREAD(tp, inet_conn.icsk_inet.inet_sport));
	if (!wanted(&t) || !owner_wanted(sk, owner))
		return;
	count_lost_n(LOST_TCP_RETRANS_UNSEEN, unseen);
	peer = peer_for(&t);
	if (peer)
		__sync_fetch_and_add(&peer->retrans_segs, unseen);
}

/*
 * connect() (-> SYN_SENT) and listen() (-> LISTEN) run in the owner's context:
 * that names the owner of SYN and SYN-ACK retransmits. Passive opens reach
 * ESTABLISHED in softirq, where the current task is unrelated: not used. A
 * closed socket is forgotten (its address will be reused); socket storage
 * goes with the socket by itself.
 */
HOOK(inet_sock_set_state, const struct sock *sk, const int oldstate, const int newstate)
{
	__u64 key;

	if (KREAD(sk, sk_protocol) != IPPROTO_TCP)
		return 0;
	if (newstate == TCP_SYN_SENT_STATE || newstate == TCP_LISTEN_STATE) {
		/* a socket connecting again keeps its entry: its baseline was dropped at close */
		retrans_baseline(sk, note_owner(sk, PROG_SET_STATE));
	} else if (newstate == TCP_CLOSE_STATE) {
		retrans_unseen_at_close(sk);
		if (!owner_in_sk_storage()) {
			key = ptr_key(sk, PROG_SET_STATE);
			bpf_map_delete_elem(&sock_owners_by_addr, &key);
		}
	}
	return 0;
}
