/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * slots.bpf.h - per-object state (a bio, a request) keyed by the object's
 * address, without a hash map on the hot path.
 *
 * Measured on the development VM (bpf_stats, tp_btf on block_rq_issue):
 * a BPF hash map update costs ~240 ns and a lookup+delete ~185 ns; the
 * direct-mapped table here costs ~30 ns to claim and ~28 ns to find and free.
 *
 * A table is a BPF_MAP_TYPE_ARRAY whose value type starts with struct
 * slot_head. An object hashes to a home slot and may use the next
 * SLOT_PROBES slots. Claiming a slot is an atomic add to its claim count
 * followed by a read of the count: whoever reads exactly one more than the
 * count it found free owns the slot, and gives the add back otherwise.
 * Of two claimers, the one whose add is later in the count's modification
 * order reads a value that includes both adds (a read after one's own write
 * to a location sees that write or a later one), so at most one wins.
 * A compare-and-swap would do it in one step, but BPF's cmpxchg, like every
 * atomic that returns a value, needs 5.12; a plain atomic add works on every
 * kernel stalltrace runs on (5.10's verifier rejects the whole object if it
 * holds one such instruction, even where it is never reached). The object's
 * hook runs before the object can complete (a bio's submit hook, a request's
 * issue hook), so the fields written after the claim are in place by the
 * time the completion reads them.
 */
#ifndef STALLTRACE_SLOTS_BPF_H
#define STALLTRACE_SLOTS_BPF_H

#include "core_fixes.h"
#include "abi.h" /* struct slot_head */


/*
 * Per-CPU scratch for ptr_key(), one word per program: programs nest on a
 * CPU (a completion in interrupt context can run inside a task-context
 * submit hook), but since 6.1 a program never nests inside itself (the
 * kernel skips and counts such runs), so a word per program is not shared
 * there. 5.10 and 5.15 run it nested: a hook that must not share its
 * per-CPU state takes run_alone() (below).
 */
#define PTR_SCRATCH_WORDS 16

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PTR_SCRATCH_WORDS);
	__type(key, __u32);
	__type(value, __u64);
} ptr_scratch SEC(".maps");

/*
 * A kernel pointer as a plain number, to hash it; `program` is the caller's
 * own scratch word (see above). In tp_btf the verifier
 * forbids arithmetic on typed pointers and partial reloads of a spilled one;
 * a map value is untyped memory, so a pointer stored there reads back as a
 * number (allowed for privileged programs, which these are). raw_tp
 * arguments are numbers already.
 */
static __always_inline __u64 ptr_key(const void *ptr, __u32 program)
{
#ifdef STALLTRACE_RAW_TP
	return (__u64)ptr;
#else
	volatile __u64 *scratch = bpf_map_lookup_elem(&ptr_scratch, &program);

	if (!scratch)
		return 0;
	*scratch = (__u64)ptr;
	return *scratch;
#endif
}

/*
 * Per-CPU: whether a program (one word per program, as ptr_scratch) is
 * running on this CPU. Kernels before 6.1 start a tracing program inside an
 * interrupted run of itself (a completion in an interrupt landing on a
 * task-context completion); since 6.1 the kernel skips such a run. A hook
 * whose per-CPU state is updated with plain stores takes this guard so that
 * every kernel behaves as the newer ones do.
 */
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, PTR_SCRATCH_WORDS);
	__type(key, __u32);
	__type(value, __u32);
} program_running SEC(".maps");

/*
 * Mark `program` running on this CPU; NULL when it already is (this run is
 * nested in it) or the map is unreachable. Plain loads and stores suffice: a
 * nested run starts and ends inside the one it interrupted, so a run that
 * finds the mark clear owns the CPU until it clears the mark with
 * run_done().
 */
static __always_inline __u32 *run_alone(__u32 program)
{
	__u32 *running = bpf_map_lookup_elem(&program_running, &program);

	if (!running || *running)
		return NULL;
	*running = 1;
	return running;
}

static __always_inline void run_done(__u32 *running)
{
	*running = 0;
}

/* Home slot: Fibonacci hashing (the top bits of the product depend on every bit of the key). */
static __always_inline __u32 slot_home(__u64 key, __u32 bits)
{
	return (__u32)((key * SLOT_HASH_MULTIPLIER) >> (64 - bits));
}

/*
 * Whether a slot stamped at `stamp_ns` was claimed more than `stale_ns` before
 * `now`. Signed: a claimer on another CPU may stamp the slot after this one
 * read `now`, and that stamp, later than `now`, must not look ancient (as an
 * unsigned difference it would, and a live slot would be taken).
 */
static __always_inline bool slot_stale(__u64 now, __u64 stamp_ns, __u64 stale_ns)
{
	return (__s64)(now - stamp_ns) > (__s64)stale_ns;
}

/*
 * Take `slot` if its claim count is `held` (0: free; 1: held by an owner being
 * displaced) and nobody else takes it at the same time (see the top). The
 * count is left at held + 1; the caller gives one back after displacing.
 */
static __always_inline bool slot_take(struct slot_head *slot, __u32 held)
{
	__sync_fetch_and_add(&slot->claims, 1);
	if (*(volatile __u32 *)&slot->claims == held + 1)
		return true;
	__sync_fetch_and_add(&slot->claims, -1);
	return false;
}

/*
 * Claim a slot for `key` (non-zero) in `table` (2^bits entries); `*index` is
 * set to its index. Returns NULL when all SLOT_PROBES candidates are held by
 * other owners. A slot still owned by the same key (its last completion was
 * missed) is reused. With `stale_ns` non-zero, an owner claimed longer ago
 * than that is displaced, and `*took_stale` is set.
 */
static __always_inline void *slot_claim(void *table, __u32 bits, __u64 key, __u64 now, __u64 stale_ns,
					bool *took_stale, __u32 *index)
{
	__u32 home = slot_home(key, bits), idx, i;
	struct slot_head *slot;
	__u64 owner;

	if (!key)
		return NULL;
	for (i = 0; i < SLOT_PROBES; i++) {
		idx = (home + i) & ((1U << bits) - 1);
		slot = bpf_map_lookup_elem(table, &idx);
		if (!slot)
			return NULL;
		owner = slot->owner;
		if (owner == key)
			goto claimed;
		if (!owner && !slot->claims && slot_take(slot, 0))
			goto claimed;
		if (owner && stale_ns && slot_stale(now, slot->stamp_ns, stale_ns) && slot_take(slot, 1)) {
			/* taken: look again, the owner may have been a claimer between its take and its stamp */
			if (slot_stale(now, *(volatile __u64 *)&slot->stamp_ns, stale_ns)) {
				__sync_fetch_and_add(&slot->claims, -1); /* the count stays at one: ours now */
				*took_stale = true;
				goto claimed;
			}
			__sync_fetch_and_add(&slot->claims, -1);
		}
	}
	return NULL;
claimed:
	/* the stamp before the owner: a slot whose owner shows carries that owner's stamp */
	*(volatile __u64 *)&slot->stamp_ns = now;
	*(volatile __u64 *)&slot->owner = key;
	*index = idx;
	return slot;
}

/* The slot `key` owns, or NULL; `*index` is set to its index. */
static __always_inline void *slot_find(void *table, __u32 bits, __u64 key, __u32 *index)
{
	__u32 home = slot_home(key, bits), idx, i;
	struct slot_head *slot;

	if (!key)
		return NULL;
	for (i = 0; i < SLOT_PROBES; i++) {
		idx = (home + i) & ((1U << bits) - 1);
		slot = bpf_map_lookup_elem(table, &idx);
		if (slot && slot->owner == key) {
			*index = idx;
			return slot;
		}
	}
	return NULL;
}

static __always_inline void slot_release(void *slot)
{
	struct slot_head *head = slot;

	head->owner = 0;
	__sync_fetch_and_add(&head->claims, -1);
}

#endif /* STALLTRACE_SLOTS_BPF_H */
