// SPDX-License-Identifier: GPL-2.0 OR MIT
/*
 * netdev.bpf.c - where packets wait on their way through an interface.
 *
 *   net_dev_start_xmit   handed to the driver: end of the qdisc wait (from the
 *                        departure time TCP stamps on every packet, skb->tstamp),
 *                        start of the driver's transmit call
 *   net_dev_xmit         the driver returned: its call's duration; NETDEV_TX_BUSY
 *   net_dev_xmit_timeout the transmit watchdog fired (a stuck TX queue)
 *   dql_stall_detected   byte queue limits saw completions stall (6.9+, optional)
 *   *_entry (receive)    a packet reached the stack from the driver
 *   tcp_probe            TCP processes a received segment: the end of the receive path
 *
 * Packets, bytes, errors, qdisc drops and backlog are the kernel's own
 * counters, read by the daemon over netlink: no per-packet work for them here.
 *
 * Timing is sampled, in both directions. Every program on a per-packet
 * tracepoint costs its entry and exit before doing anything (an empty one
 * ~55 ns on the development VM with bpf_stats on), and timing a packet adds a
 * clock read (~55 ns there) and the lookup of its interface's entry in a
 * per-CPU hash (~80 ns: jhash, not inlined): on every packet, ~450 ns per
 * transmitted packet. So each hook first counts down a per-CPU counter in an
 * array (an inlined lookup, no helper call) and leaves unless it reaches
 * zero: 1 in NETDEV_TX_SAMPLE transmitted and 1 in NETDEV_RX_SAMPLE received
 * packets per CPU are timed, and only those read the clock and find their
 * interface. The gap to the next sample is random (mean N): a fixed 1 in N
 * would alias with traffic that alternates on a CPU (the two ends of a veth
 * pair, a vlan and its lower device) and time only one of them. On transmit,
 * a CPU also times its first packet after 10 ms without a sample (at most 100
 * more a second, a few µs of CPU), so an interface that sends a few packets
 * now and then is still timed, and one that sends a hundred a second has
 * enough samples in an interval for the stall detector to judge. The counts
 * are exact where they are cheap: tx_busy (the driver's return code is an
 * argument), tx_timeouts, tx_stalls.
 *
 * Why skb->tstamp for the qdisc wait, not an enqueue hook: qdisc_enqueue only
 * fires at the root qdisc, not on the empty-qdisc bypass, and a qdisc may
 * split a packet (tbf segments GSO packets), so enqueue/dequeue pairs do not
 * match; and it would cost two hash operations per packet. Sampled packets
 * without a monotonic departure time (forwarded, most UDP) are counted as
 * untimed.
 */
#include "common.bpf.h"
#include "slots.bpf.h"

#define NETDEV_TX_BUSY_RC 0x10
/* A departure time further back than this is not a qdisc wait but a stale stamp. */
#define MAX_QDISC_WAIT_NS (10ULL * 1000 * 1000 * 1000)
/* The qdisc wait of a sampled packet that had no departure time to time it with. */
#define QDISC_UNTIMED (~0ULL)

/* Set by the daemon at load: HZ / 100 + 1, i.e. the transmit floor of one sample per ~10 ms per CPU. */
const volatile __u64 tx_floor_jiffies = 3;

/* Each program's own ptr_key() scratch word (slots.bpf.h). */
enum netdev_program {
	PROG_START_XMIT,
	PROG_XMIT,
	PROG_NETIF_RECEIVE_SKB,
	PROG_NETIF_RX,
	PROG_NAPI_GRO_RECEIVE,
	PROG_NETIF_RECEIVE_SKB_LIST,
	PROG_TCP_PROBE,
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_HASH);
	__uint(max_entries, 256);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct netdev_key);
	__type(value, struct netdev_stats);
} netdev_stats SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct netdev_stats);
} netdev_stats_zero SEC(".maps");

/*
 * The sampled driver calls in flight on this CPU, per nesting level (a vlan or
 * bond transmit calls the lower device's inside its own, with the same skb,
 * hence the device in the match): start_xmit and xmit run back to back on one
 * CPU, so a per-CPU slot pairs them with no hash map. `armed` lets every
 * unsampled xmit leave after one load.
 */
#define XMIT_NESTING 4

struct xmit_state {
	__u32 countdown;       /* transmits on this CPU until the next sample */
	__u32 armed;           /* bit i: slot[i] holds a sampled packet */
	__u64 sampled_jiffies; /* when this CPU last sampled */
	__u64 rng;             /* next_gap()'s state */
	struct {
		__u64 skb;
		__u64 start_ns; /* the driver call began */
		__u64 qdisc_ns; /* the packet's wait in the qdisc, or QDISC_UNTIMED */
		struct netdev_key dev;
	} slot[XMIT_NESTING];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xmit_state);
} xmit_state SEC(".maps");

/*
 * Sampled received packets, per CPU: the receive softirq usually carries a
 * packet from the driver to TCP on one CPU; a packet that moves (RPS, the
 * socket backlog) is simply not timed. The packets' keys share one cache
 * line, the one every segment's tcp_probe reads; a new sample takes the
 * oldest slot (a sample that never reaches TCP, a non-TCP packet or a
 * handshake segment, stays until then).
 */
#define RX_SLOTS 8

struct rx_slots {
	__u64 skb[RX_SLOTS];
	__u32 countdown; /* received packets on this CPU until the next sample */
	__u32 next;      /* the slot the next sample takes */
	__u64 rng;       /* next_gap()'s state */
	struct {
		__u64 start_ns;
		struct netdev_key dev;
	} slot[RX_SLOTS];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct rx_slots);
} rx_slots SEC(".maps");

static __always_inline struct netdev_key key_of(const struct net_device *dev)
{
	struct netdev_key key = {
		.netns = KREAD(dev, nd_net.net, ns.inum),
		.ifindex = KREAD(dev, ifindex),
	};
	return key;
}

/* The interface's statistics entry, created on first sight. */
static __always_inline struct netdev_stats *netdev_stats_for(struct netdev_key *key)
{
	struct netdev_stats *stats = bpf_map_lookup_elem(&netdev_stats, key);
	__u32 zero = 0;
	void *init;
	long err;

	if (stats)
		return stats;
	init = bpf_map_lookup_elem(&netdev_stats_zero, &zero);
	if (!init)
		return NULL;
	err = bpf_map_update_elem(&netdev_stats, key, init, BPF_NOEXIST);
	stats = bpf_map_lookup_elem(&netdev_stats, key);
	/*
	 * Besides a full map, an insert fails with -EBUSY where this program
	 * interrupted another one holding the same bucket (a softirq receive
	 * inside a transmit, 5.10 to 5.x); the entry that one was adding may be
	 * there by now.
	 */
	if (!stats && err && err != -EEXIST)
		count_lost(LOST_NETDEV_STATS_FULL);
	return stats;
}

/*
 * Packets to the next sample: uniform in [1, 2n - 1], so 1 in n on average
 * (the top says why random). From a per-CPU linear congruential generator
 * (Knuth's MMIX constants; its high bits are the good ones) rather than
 * bpf_get_prandom_u32(), a helper call measured at ~40 ns on the development
 * VM: more than the rest of a hook's unsampled path.
 */
static __always_inline __u32 next_gap(__u64 *rng, __u32 n)
{
	*rng = *rng * 6364136223846793005ULL + 1442695040888963407ULL;
	return 1 + (__u32)(*rng >> 33) % (2 * n - 1);
}

/*
 * The per-CPU state is updated without atomics: a program never nests inside
 * itself, and where start_xmit and xmit (or two receive hooks) interleave on
 * a CPU the worst outcome is one sample lost or a gap one packet off.
 */
HOOK(net_dev_start_xmit, const struct sk_buff *skb, const struct net_device *dev)
{
	__u64 jiffies = bpf_jiffies64(), now;
	struct xmit_state *s;
	__u32 i, zero = 0;
	__s64 departure;

	s = bpf_map_lookup_elem(&xmit_state, &zero);
	if (!s)
		return 0;
	if (s->countdown > 1 && jiffies - s->sampled_jiffies < tx_floor_jiffies) {
		s->countdown--;
		return 0;
	}
	s->countdown = next_gap(&s->rng, NETDEV_TX_SAMPLE);
	s->sampled_jiffies = jiffies;
	now = bpf_ktime_get_ns();
	for (i = 0; i < XMIT_NESTING; i++) {
		/* a slot whose net_dev_xmit never came (a run the kernel skipped) is reused after 1 s */
		if (!(s->armed & (1U << i)) || now - s->slot[i].start_ns > 1000000000ULL)
			break;
	}
	if (i >= XMIT_NESTING)
		return 0;
	departure = KREAD(skb, tstamp);
	if (departure > 0 && skb_tstamp_is_mono(skb) && now >= (__u64)departure &&
	    now - departure < MAX_QDISC_WAIT_NS)
		s->slot[i].qdisc_ns = now - departure;
	else
		s->slot[i].qdisc_ns = QDISC_UNTIMED;
	s->slot[i].skb = ptr_key(skb, PROG_START_XMIT);
	s->slot[i].dev = key_of(dev);
	s->slot[i].start_ns = now;
	s->armed |= 1U << i;
	return 0;
}

/*
 * `skb` may already be freed here: it is only compared, never read. Both
 * histograms are added here, so a sampled packet costs one hash lookup.
 */
HOOK(net_dev_xmit, struct sk_buff *skb, int rc, struct net_device *dev, unsigned int skb_len)
{
	struct netdev_stats *stats;
	struct xmit_state *s;
	struct netdev_key key;
	__u64 skb_key, start, qdisc, end;
	__u32 i, zero = 0;

	if (rc == NETDEV_TX_BUSY_RC) {
		/* every refusal counted, sampled or not: it is rare, and a ring running full */
		key = key_of(dev);
		stats = netdev_stats_for(&key);
		if (stats)
			__sync_fetch_and_add(&stats->tx_busy, 1);
	}
	s = bpf_map_lookup_elem(&xmit_state, &zero);
	if (!s || !s->armed)
		return 0;
	skb_key = ptr_key(skb, PROG_XMIT);
	key = key_of(dev);
	for (i = 0; i < XMIT_NESTING; i++) {
		if ((s->armed & (1U << i)) && s->slot[i].skb == skb_key &&
		    s->slot[i].dev.ifindex == key.ifindex && s->slot[i].dev.netns == key.netns)
			break;
	}
	if (i >= XMIT_NESTING)
		return 0;
	end = bpf_ktime_get_ns();
	start = s->slot[i].start_ns;
	qdisc = s->slot[i].qdisc_ns;
	s->armed &= ~(1U << i);
	stats = netdev_stats_for(&key);
	if (!stats)
		return 0;
	hist_add(&stats->xmit, end - start);
	if (qdisc == QDISC_UNTIMED)
		__sync_fetch_and_add(&stats->qdisc_untimed, 1);
	else
		hist_add(&stats->qdisc, qdisc);
	return 0;
}

HOOK(net_dev_xmit_timeout, struct net_device *dev, int queue_index)
{
	struct netdev_key key = key_of(dev);
	struct netdev_stats *stats = netdev_stats_for(&key);

	if (stats)
		__sync_fetch_and_add(&stats->tx_timeouts, 1);
	return 0;
}

/*
 * dql_stall_detected has no device argument: the device is found from `hist`,
 * which points into the struct dql embedded in the netdev_queue.
 */
OPTIONAL_HOOK(dql_stall_detected, unsigned short thrs, unsigned int len, unsigned long last_reap,
	      unsigned long hist_head, unsigned long now, unsigned long *hist)
{
	__u64 dql = (__u64)hist - bpf_core_field_offset(struct dql, history);
	__u64 txq = dql - bpf_core_field_offset(struct netdev_queue, dql);
	struct net_device *dev = NULL;
	struct netdev_stats *stats;
	struct netdev_key key;

	bpf_probe_read_kernel(&dev, sizeof(dev), (void *)(txq + bpf_core_field_offset(struct netdev_queue, dev)));
	if (!dev)
		return 0;
	key.netns = BPF_CORE_READ(dev, nd_net.net, ns.inum);
	key.ifindex = BPF_CORE_READ(dev, ifindex);
	stats = netdev_stats_for(&key);
	if (stats)
		__sync_fetch_and_add(&stats->tx_stalls, 1);
	return 0;
}

/* Remember 1 in NETDEV_RX_SAMPLE packets entering the stack from a driver. */
static __always_inline void rx_sample(const struct sk_buff *skb, __u32 scratch)
{
	struct rx_slots *slots;
	__u32 i, zero = 0;

	slots = bpf_map_lookup_elem(&rx_slots, &zero);
	if (!slots)
		return;
	if (slots->countdown > 1) {
		slots->countdown--;
		return;
	}
	slots->countdown = next_gap(&slots->rng, NETDEV_RX_SAMPLE);
	i = slots->next++ % RX_SLOTS;
	slots->skb[i] = ptr_key(skb, scratch);
	slots->slot[i].start_ns = bpf_ktime_get_ns();
	slots->slot[i].dev = key_of(KREAD(skb, dev));
}

HOOK(netif_receive_skb_entry, const struct sk_buff *skb)
{
	rx_sample(skb, PROG_NETIF_RECEIVE_SKB);
	return 0;
}

HOOK(netif_rx_entry, const struct sk_buff *skb)
{
	rx_sample(skb, PROG_NETIF_RX);
	return 0;
}

HOOK(napi_gro_receive_entry, const struct sk_buff *skb)
{
	rx_sample(skb, PROG_NAPI_GRO_RECEIVE);
	return 0;
}

HOOK(netif_receive_skb_list_entry, const struct sk_buff *skb)
{
	rx_sample(skb, PROG_NETIF_RECEIVE_SKB_LIST);
	return 0;
}

/*
 * TCP processes a received segment (the top of tcp_rcv_established): the end
 * of a sampled packet's receive path. An unsampled segment costs the compare
 * against this CPU's few slots.
 */
HOOK(tcp_probe, struct sock *sk, const struct sk_buff *skb)
{
	__u64 skb_key = ptr_key(skb, PROG_TCP_PROBE);
	struct netdev_stats *stats;
	struct rx_slots *slots;
	__u32 i, zero = 0;
	__u64 end;

	slots = bpf_map_lookup_elem(&rx_slots, &zero);
	for (i = 0; slots && skb_key && i < RX_SLOTS; i++) {
		if (slots->skb[i] != skb_key)
			continue;
		end = bpf_ktime_get_ns();
		slots->skb[i] = 0;
		stats = netdev_stats_for(&slots->slot[i].dev);
		if (stats)
			hist_add(&stats->rx, end - slots->slot[i].start_ns);
		return 0;
	}
	return 0;
}
