/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * tcp_owner.bpf.h - who owns a TCP socket, and its per-socket state (part of
 * the tcp family; included by tcp.bpf.c after its filters): the process
 * that last sent or received on it, named on the retransmits the kernel
 * sends in softirq; the filters' verdict; the RTT sampling state; and the
 * retransmission count the next retransmit is compared with.
 */
#ifndef STALLTRACE_TCP_OWNER_BPF_H
#define STALLTRACE_TCP_OWNER_BPF_H

/* The filters' verdict on a socket, kept once asked (tcp_owner.rtt_wanted). */
#define RTT_WANTED 1
#define RTT_UNWANTED 2

/*
 * Who owns a socket: the last process that sent or received on it, or
 * connected or listened; and the socket's RTT sampling state.
 */
struct tcp_owner {
	__u32 tgid;
	__u32 pid;
	char comm[STALLTRACE_COMM_LEN];
	__u32 last_total_retrans; /* tp->total_retrans at the last retransmit seen, or when first noted */
	__u32 seen_retrans;       /* last_total_retrans is valid */
	__u32 rtt_una;            /* tp->snd_una at the last RTT sample, or at the first call seen */
	__u8 rtt_seen;            /* rtt_una is valid */
	__u8 rtt_wanted;          /* 0 (not asked yet), RTT_WANTED or RTT_UNWANTED */
	__u8 process_wanted;      /* the owner passes --pid/--comm/--container */
	__u8 pad;
};

/*
 * Where tracing programs may use socket local storage (5.11+: the kernel has
 * the tracing flavour of bpf_sk_storage_get) and the socket is a typed
 * pointer (tp_btf, fentry), the owner lives in the socket itself:
 * sock_send_length and sock_recv_length run on every send and receive, and
 * a lookup there is a pointer walk from the (already hot) socket instead of a
 * hash of its address in a shared table (docs/BENCHMARKS.md, "Driving the
 * cost down"); it is freed with the socket, so nothing is deleted at close.
 * Elsewhere (raw_tp and kprobe arguments are plain numbers, which the
 * sk_storage helpers do not take; 5.10's verifier refuses them to tracing
 * programs) it lives in an LRU hash keyed by the socket's address.
 */
static __always_inline bool owner_in_sk_storage(void)
{
#ifdef STALLTRACE_RAW_TP
	return false;
#else
	return bpf_core_type_exists(btf_bpf_sk_storage_get_tracing);
#endif
}

struct {
	__uint(type, BPF_MAP_TYPE_SK_STORAGE);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, int);
	__type(value, struct tcp_owner);
} sock_owners SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 16384);
	__type(key, __u64); /* struct sock * */
	__type(value, struct tcp_owner);
} sock_owners_by_addr SEC(".maps");

/* The socket's owner as last recorded, or NULL; `program` is the caller's ptr_key() word. */
static __always_inline struct tcp_owner *owner_of(const struct sock *sk, __u32 program)
{
	__u64 key;

	if (owner_in_sk_storage())
		return bpf_sk_storage_get(&sock_owners, (void *)sk, NULL, 0);
	key = ptr_key(sk, program);
	return bpf_map_lookup_elem(&sock_owners_by_addr, &key);
}

/*
 * The sockets the watched processes held when the run started (by inode,
 * from their /proc/PID/fd), filled before attach: a listener or a session
 * older than the run has no owner noted until its next call, and a
 * listener's SYN-ACKs sent again come with no call at all.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PROCESS_SOCKETS_MAX); /* preallocated: a few hundred KiB */
	__type(key, __u64); /* socket inode */
	__type(value, __u8);
} process_sockets SEC(".maps");

/*
 * --pid/--comm/--container: a socket is watched while its owner is one of the
 * watched processes, as judged when the owner was noted (in its own context);
 * until one is, while it is one the watched processes held at the start.
 */
static __always_inline bool owner_wanted(const struct sock *sk, const struct tcp_owner *owner)
{
	__u64 inode;

	if (!process_filtered())
		return true;
	if (owner)
		return owner->process_wanted;
	inode = sock_inode(sk);
	return inode && bpf_map_lookup_elem(&process_sockets, &inode);
}

/*
 * A socket's retransmission count when its owner is first noted (or it
 * connects again): the baseline its first retransmit is compared with, so
 * that attempts before it with no record of their own are found too, not
 * only those between two records. Taken after the entry exists and only if
 * no retransmit has set one meanwhile: read outside the socket's lock, a
 * baseline stored over a newer retransmit's count would report that
 * retransmit again as unseen.
 */
static __always_inline void retrans_baseline(const struct sock *sk, struct tcp_owner *owner)
{
	struct tcp_sock *tp = TCP_SK(sk);
	__u32 total_retrans;

	if (!owner || owner->seen_retrans || !tp)
		return;
	total_retrans = KREAD(tp, total_retrans);
	if (owner->seen_retrans)
		return;
	owner->last_total_retrans = total_retrans;
	owner->seen_retrans = 1;
}

/*
 * Record the caller as the socket's owner when it is new or changed (one
 * lookup otherwise); returns the socket's entry, or NULL.
 */
static __always_inline struct tcp_owner *note_owner(const struct sock *sk, __u32 program)
{
	__u64 id = bpf_get_current_pid_tgid(), key;
	struct tcp_owner *owner = owner_of(sk, program);
	struct tcp_owner fresh = {};

	if (owner && owner->tgid == id >> 32)
		return owner;
	if (owner_in_sk_storage()) {
		/* created zeroed; updated in place (a retransmit racing a change of owner may see a mix) */
		if (!owner) {
			owner = bpf_sk_storage_get(&sock_owners, (void *)sk, NULL, BPF_SK_STORAGE_GET_F_CREATE);
			retrans_baseline(sk, owner);
		}
		if (!owner)
			return NULL;
		owner->tgid = id >> 32;
		owner->pid = (__u32)id;
		bpf_get_current_comm(owner->comm, sizeof(owner->comm));
		owner->process_wanted = current_process_wanted();
		return owner;
	}
	fresh.tgid = id >> 32;
	fresh.pid = (__u32)id;
	bpf_get_current_comm(fresh.comm, sizeof(fresh.comm));
	fresh.process_wanted = current_process_wanted();
	/*
	 * Only the retransmit state carries over. The RTT state starts again:
	 * the address may be a new socket's whose predecessor's close was
	 * missed, and the old filter verdict would be wrong for it (a new
	 * baseline costs one sample at most).
	 */
	if (owner) {
		fresh.last_total_retrans = owner->last_total_retrans;
		fresh.seen_retrans = owner->seen_retrans;
	}
	key = ptr_key(sk, program);
	bpf_map_update_elem(&sock_owners_by_addr, &key, &fresh, BPF_ANY);
	owner = bpf_map_lookup_elem(&sock_owners_by_addr, &key);
	retrans_baseline(sk, owner);
	return owner;
}

#endif
