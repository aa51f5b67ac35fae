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
 *   *_entry (receive)    a packet reached the stack from the driver: 1 in 16 is
 *   tcp_probe            remembered, and timed when TCP processes it
 *
 * Packets, bytes, errors, qdisc drops and backlog are the kernel's own
 * counters, read by the daemon over netlink: no per-packet work for them here.
 *
 * Why skb->tstamp for the qdisc wait, not an enqueue hook: qdisc_enqueue only
 * fires at the root qdisc, not on the empty-qdisc bypass, and a qdisc may
 * split a packet (tbf segments GSO packets), so enqueue/dequeue pairs do not
 * match; and it would cost two hash operations per packet. Packets without a
 * monotonic departure time (forwarded, most UDP) are counted as untimed.
 */
#include "common.bpf.h"
#include "slots.bpf.h"
#include "netdev_rx.bpf.h" /* netdev_stats, rx_slots, the end of the receive path */

#define NETDEV_TX_BUSY_RC 0x10
/* A departure time further back than this is not a qdisc wait but a stale stamp. */
#define MAX_QDISC_WAIT_NS (10ULL * 1000 * 1000 * 1000)

/*
 * The driver call in flight on this CPU, per nesting level (a vlan or bond
 * transmit calls the lower device's inside its own): start_xmit and xmit run
 * back to back on one CPU, so a per-CPU slot pairs them with no hash map.
 */
#define XMIT_NESTING 4

struct xmit_slots {
	struct {
		__u64 skb;
		__u64 start_ns;
	} slot[XMIT_NESTING];
};

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, struct xmit_slots);
} xmit_slots SEC(".maps");

/* Each program's own ptr_key() scratch word (slots.bpf.h). */
enum netdev_program {
	PROG_START_XMIT,
	PROG_XMIT,
	PROG_RX_ENTRY,
	PROG_TCP_PROBE,
};

static __always_inline struct netdev_key key_of(const struct net_device *dev)
{
	struct netdev_key key = {
		.netns = KREAD(dev, nd_net.net, ns.inum),
		.ifindex = KREAD(dev, ifindex),
	};
	return key;
}

HOOK(net_dev_start_xmit, const struct sk_buff *skb, const struct net_device *dev)
{
	struct netdev_key key = key_of(dev);
	struct netdev_stats *stats = netdev_stats_for(&key);
	__u64 now = bpf_ktime_get_ns(), skb_key = ptr_key(skb, PROG_START_XMIT);
	struct xmit_slots *slots;
	__u32 i, zero = 0;
	__s64 departure;

	if (stats) {
		departure = KREAD(skb, tstamp);
		if (departure > 0 && skb_tstamp_is_mono(skb) && now >= (__u64)departure &&
		    now - departure < MAX_QDISC_WAIT_NS)
			hist_add(&stats->qdisc, now - departure);
		else
			__sync_fetch_and_add(&stats->qdisc_untimed, 1);
	}
	slots = bpf_map_lookup_elem(&xmit_slots, &zero);
	if (!slots)
		return 0;
	for (i = 0; i < XMIT_NESTING; i++) {
		/* a slot whose net_dev_xmit never came (a run the kernel skipped) is reused after 1 s */
		if (!slots->slot[i].skb || now - slots->slot[i].start_ns > 1000000000ULL) {
			slots->slot[i].skb = skb_key;
			slots->slot[i].start_ns = now;
			break;
		}
	}
	return 0;
}

/* `skb` may already be freed here: it is only compared, never read. */
HOOK(net_dev_xmit, struct sk_buff *skb, int rc, struct net_device *dev, unsigned int skb_len)
{
	__u64 skb_key = ptr_key(skb, PROG_XMIT), start = 0;
	struct netdev_key key = key_of(dev);
	struct netdev_stats *stats;
	struct xmit_slots *slots;
	__u32 i, zero = 0;

	slots = bpf_map_lookup_elem(&xmit_slots, &zero);
	for (i = 0; slots && i < XMIT_NESTING; i++) {
		if (slots->slot[i].skb == skb_key) {
			start = slots->slot[i].start_ns;
			slots->slot[i].skb = 0;
			break;
		}
	}
	stats = netdev_stats_for(&key);
	if (!stats)
		return 0;
	if (start)
		hist_add(&stats->xmit, bpf_ktime_get_ns() - start);
	if (rc == NETDEV_TX_BUSY_RC)
		__sync_fetch_and_add(&stats->tx_busy, 1);
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
static __always_inline void rx_sample(const struct sk_buff *skb)
{
	struct rx_slots *slots;
	__u32 i, zero = 0;

	if (bpf_get_prandom_u32() % NETDEV_RX_SAMPLE)
		return;
	slots = bpf_map_lookup_elem(&rx_slots, &zero);
	if (!slots)
		return;
	i = bpf_get_prandom_u32() % RX_SLOTS;
	slots->slot[i].skb = ptr_key(skb, PROG_RX_ENTRY);
	slots->slot[i].start_ns = bpf_ktime_get_ns();
	slots->slot[i].dev = key_of(KREAD(skb, dev));
}

HOOK(netif_receive_skb_entry, const struct sk_buff *skb)
{
	rx_sample(skb);
	return 0;
}

HOOK(netif_rx_entry, const struct sk_buff *skb)
{
	rx_sample(skb);
	return 0;
}

HOOK(napi_gro_receive_entry, const struct sk_buff *skb)
{
	rx_sample(skb);
	return 0;
}

HOOK(netif_receive_skb_list_entry, const struct sk_buff *skb)
{
	rx_sample(skb);
	return 0;
}

/*
 * TCP processes a received segment: the end of a sampled packet's receive
 * path. Attached only when the tcp family is not: otherwise the tcp object's
 * tcp_probe does this with these very maps (netdev_rx.bpf.h says why).
 */
HOOK(tcp_probe, struct sock *sk, const struct sk_buff *skb)
{
	netdev_rx_end(skb, PROG_TCP_PROBE);
	return 0;
}
