/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * common.bpf.h - helpers every probe family uses: histogram recording and
 * loss accounting. Included once per .bpf.c, so each object gets its own
 * `lost_counts` map.
 */
#ifndef STALLTRACE_COMMON_BPF_H
#define STALLTRACE_COMMON_BPF_H

#include "core_fixes.h"
#include "abi.h"
#include "hist.h"

/* errno values are not in BTF */
#define EEXIST 17

/* tp_btf programs must be GPL-compatible to read kernel memory. */
char LICENSE[] SEC("license") = "Dual MIT/GPL";

/* Drops, by enum lost_source; per-CPU so counting a drop never contends. */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, LOST_SOURCE_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} lost_counts SEC(".maps");

static __always_inline void count_lost_n(__u32 source, __u64 count)
{
	__u64 *n = bpf_map_lookup_elem(&lost_counts, &source);

	if (n)
		__sync_fetch_and_add(n, count);
}

static __always_inline void count_lost(__u32 source)
{
	count_lost_n(source, 1);
}

/*
 * Record one value. Per-CPU values can still be updated by a nested program
 * (an I/O completing in interrupt context while a task-context hook runs on
 * the same CPU), so increments are atomic: a local, uncontended lock-add is a
 * few cycles, and no count is ever lost.
 */
static __always_inline void hist_add(struct hist *h, __u64 value)
{
	__u32 idx = hist_bucket_index(value);

	if (idx >= HIST_BUCKETS) /* cannot happen; tells the verifier the bound */
		idx = HIST_BUCKETS - 1;
	__sync_fetch_and_add(&h->buckets[idx], 1);
	__sync_fetch_and_add(&h->sum, value);
}

/*
 * Record one value into a histogram that one program alone writes, and that
 * program guarded against running nested in itself (run_alone(),
 * slots.bpf.h): nothing else can interleave with its adds on this CPU, so
 * plain adds are exact, and a locked add costs ~5 ns each (bench block).
 */
static __always_inline void hist_add_alone(struct hist *h, __u64 value)
{
	__u32 idx = hist_bucket_index(value);

	if (idx >= HIST_BUCKETS) /* cannot happen; tells the verifier the bound */
		idx = HIST_BUCKETS - 1;
	h->buckets[idx] += 1;
	h->sum += value;
}

#endif /* STALLTRACE_COMMON_BPF_H */
