/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * netdev_rx.bpf.h - the netdev family's per-interface statistics and the end
 * of its sampled receive path, included by netdev.bpf.c and tcp.bpf.c.
 *
 * Why two objects: the receive path of a sampled packet ends when TCP
 * processes it, at tcp_probe, and the tcp family hooks tcp_probe too (for the
 * RTT). Two programs on one tracepoint each pay a program's entry and exit on
 * every received segment (measured with bpf_stats: netdev's tcp_probe cost
 * ~85 ns/event, most of it that fixed cost; docs/BENCHMARKS.md, "Driving the
 * cost down"). So when both families attach, the daemon shares these maps
 * between the two objects (pinned by name for the time of loading, then
 * unpinned) and the tcp object's tcp_probe calls netdev_rx_end() first;
 * netdev's own tcp_probe is then not attached. When the tcp family is not
 * there, netdev attaches its own tcp_probe, which calls the same function.
 *
 * The maps below exist in both objects; in the tcp object they are used only
 * when netdev_rx_end_here is set, i.e. when they are netdev's maps.
 */
#ifndef STALLTRACE_NETDEV_RX_BPF_H
#define STALLTRACE_NETDEV_RX_BPF_H

#include "common.bpf.h"
#include "slots.bpf.h"

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
 * Sampled received packets, per CPU: the receive softirq usually carries a
 * packet from the driver to TCP on one CPU; a packet that moves (RPS, the
 * socket backlog) is simply not timed.
 */
#define RX_SLOTS 8

struct rx_slots {
	struct {
		__u64 skb;
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

/*
 * The interface's statistics entry, created on first sight. A failure is
 * counted in the including object's lost_counts (the tcp family's when its
 * tcp_probe ends the receive path).
 */
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
 * TCP processes a received segment: the end of a sampled packet's receive
 * path. `scratch` is the calling program's ptr_key() word (slots.bpf.h).
 */
static __always_inline void netdev_rx_end(const struct sk_buff *skb, __u32 scratch)
{
	__u64 skb_key = ptr_key(skb, scratch);
	struct netdev_stats *stats;
	struct rx_slots *slots;
	__u32 i, zero = 0;

	slots = bpf_map_lookup_elem(&rx_slots, &zero);
	for (i = 0; slots && i < RX_SLOTS; i++) {
		if (slots->slot[i].skb != skb_key)
			continue;
		slots->slot[i].skb = 0;
		stats = netdev_stats_for(&slots->slot[i].dev);
		if (stats)
			hist_add(&stats->rx, bpf_ktime_get_ns() - slots->slot[i].start_ns);
		return;
	}
}

#endif /* STALLTRACE_NETDEV_RX_BPF_H */
