/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * core_fixes.h - every place where a kernel field moved between versions,
 * handled with CO-RE existence checks (never with version numbers), and the
 * one switch between the two hook flavours.
 *
 * Each .bpf.c is compiled twice by userspace/build.rs:
 *   - tp_btf (default): arguments are BTF-typed pointers the verifier lets us
 *     load from directly, so KREAD is a plain load (no helper call);
 *   - raw_tp (-DSTALLTRACE_RAW_TP): arguments are untyped, so every load goes
 *     through bpf_probe_read_kernel via BPF_CORE_READ.
 * The daemon loads the raw_tp object only when tp_btf cannot be used.
 */
#ifndef STALLTRACE_CORE_FIXES_H
#define STALLTRACE_CORE_FIXES_H

#include "vmlinux.h"
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>

/*
 * HOOK: a program the family cannot work without. OPTIONAL_HOOK: one on a
 * tracepoint only some kernels have; the daemon attaches it when it can and
 * reports it when it cannot (the name prefix tells it which, see probes/mod.rs).
 *
 * FUNC_HOOK / OPTIONAL_FUNC_HOOK(hook, func, ...): the same hook on a kernel
 * function, for kernels whose tracepoint is missing or lacks what the hook
 * needs: fentry in the tp_btf object (typed arguments, direct loads like
 * tp_btf), kprobe in the raw_tp one (plain numbers, probe reads like raw_tp).
 * The daemon tries a hook's tracepoint program first and its function
 * program only when that cannot load or attach; the program name
 * (<prefix>_<hook>__<func>) ties the two together.
 *
 * TAIL_HOOK: a second program for a hook's tracepoint, never attached: the
 * hook's program tail-calls it through a program array its family fills
 * before attaching (block.bpf.c says why one hook needs two).
 */
#ifdef STALLTRACE_RAW_TP
#define HOOK(tp, args...) SEC("raw_tp/" #tp) int BPF_PROG(on_##tp, ##args)
#define OPTIONAL_HOOK(tp, args...) SEC("raw_tp/" #tp) int BPF_PROG(maybe_##tp, ##args)
#define TAIL_HOOK(tp, args...) SEC("raw_tp/" #tp) int BPF_PROG(tail_##tp, ##args)
#define FUNC_HOOK(hook, func, args...) SEC("kprobe/" #func) int BPF_KPROBE(on_##hook##__##func, ##args)
#define OPTIONAL_FUNC_HOOK(hook, func, args...)                                                        \
	SEC("kprobe/" #func) int BPF_KPROBE(maybe_##hook##__##func, ##args)
#define KREAD(src, ...) BPF_CORE_READ(src, __VA_ARGS__)
#else
#define HOOK(tp, args...) SEC("tp_btf/" #tp) int BPF_PROG(on_##tp, ##args)
#define OPTIONAL_HOOK(tp, args...) SEC("tp_btf/" #tp) int BPF_PROG(maybe_##tp, ##args)
#define TAIL_HOOK(tp, args...) SEC("tp_btf/" #tp) int BPF_PROG(tail_##tp, ##args)
#define FUNC_HOOK(hook, func, args...) SEC("fentry/" #func) int BPF_PROG(on_##hook##__##func, ##args)
#define OPTIONAL_FUNC_HOOK(hook, func, args...)                                                        \
	SEC("fentry/" #func) int BPF_PROG(maybe_##hook##__##func, ##args)
/* Direct loads; vmlinux.h marks every struct preserve_access_index, so each is CO-RE relocated. */
#define KREAD_1(s, a) ((s)->a)
#define KREAD_2(s, a, b) ((s)->a->b)
#define KREAD_3(s, a, b, c) ((s)->a->b->c)
#define KREAD_PICK(_1, _2, _3, name, ...) name
#define KREAD(src, ...) KREAD_PICK(__VA_ARGS__, KREAD_3, KREAD_2, KREAD_1)(src, __VA_ARGS__)
#endif

/*
 * Argument `n` of a tracepoint hook declared without arguments, for
 * tracepoints whose prototype changed between kernels. Each kernel checks a
 * program's reads against its own prototype (tp_btf: when the read is
 * verified; raw_tp: at attach, against the highest argument any reachable
 * read touches), so a read of an argument only some kernels pass must stay
 * on the branch a CO-RE check keeps, which the verifier then never walks on
 * the others. An asm load cannot be hoisted out of that branch by the
 * compiler, as a plain one could.
 */
#define TP_ARG(n)                                                                                      \
	({                                                                                             \
		__u64 __arg;                                                                           \
		asm volatile("%0 = *(u64 *)(%1 + %2)" : "=r"(__arg) : "r"(ctx), "i"((n) * 8));        \
		__arg;                                                                                 \
	})

/*
 * Bitfields: their offsets are relocated too, and loaded with the right width.
 * A struct sock is a tcp_sock only for TCP; in tp_btf the verifier accepts
 * tcp_sock loads only through bpf_skc_to_tcp_sock (NULL if not TCP).
 */
#ifdef STALLTRACE_RAW_TP
#define KREAD_BF(src, field) BPF_CORE_READ_BITFIELD_PROBED(src, field)
#define TCP_SK(sk) ((struct tcp_sock *)(sk))
#else
#define KREAD_BF(src, field) BPF_CORE_READ_BITFIELD(src, field)
#define TCP_SK(sk) bpf_skc_to_tcp_sock((void *)(sk))
#endif

/* ---- tcp ---------------------------------------------------------------------- */

/* Since 6.7 a socket may keep its timestamps (retrans_stamp included) in us instead of ms. */
static __always_inline bool tcp_usec_ts(struct tcp_sock *tp)
{
	if (bpf_core_field_exists(tp->tcp_usec_ts))
		return KREAD_BF(tp, tcp_usec_ts);
	return false;
}

/* ---- netdev ------------------------------------------------------------------- */

/* skb->tstamp_type (6.11+) was the one-bit skb->mono_delivery_time before (5.18+). */
struct sk_buff___pre_6_11 {
	__u8 mono_delivery_time : 1;
} __attribute__((preserve_access_index));

/*
 * Whether skb->tstamp is a CLOCK_MONOTONIC departure time (TCP sets one on
 * every packet since 4.20). Before 5.18 the skb does not say which clock its
 * stamp is on: then it is taken as one, and the caller's check that it lies
 * within seconds before the monotonic now keeps out the others (a
 * CLOCK_REALTIME stamp is decades away from it).
 */
static __always_inline bool skb_tstamp_is_mono(const struct sk_buff *skb)
{
	if (bpf_core_field_exists(skb->tstamp_type))
		return KREAD_BF(skb, tstamp_type) == 1 /* SKB_CLOCK_MONOTONIC */;
	if (bpf_core_field_exists(((struct sk_buff___pre_6_11 *)skb)->mono_delivery_time))
		return KREAD_BF((struct sk_buff___pre_6_11 *)skb, mono_delivery_time);
	return true;
}

/* REQ_OP_BITS is a macro (not in BTF); the op has been the low 8 bits of cmd_flags since 4.10. */
#define STALLTRACE_REQ_OP_MASK ((1U << 8) - 1)

/* ---- block: where the disk of a request or bio lives --------------------- */

/* Before 5.12 a bio pointed at its gendisk directly; since, through its block_device. */
struct bio___pre_5_12 {
	struct gendisk *bi_disk;
} __attribute__((preserve_access_index));

/* Before 5.16 a request carried rq_disk; since, it is reached through its queue. */
struct request___pre_5_16 {
	struct gendisk *rq_disk;
} __attribute__((preserve_access_index));

static __always_inline struct gendisk *bio_disk(struct bio *bio)
{
	if (bpf_core_field_exists(bio->bi_bdev))
		return KREAD(bio, bi_bdev, bd_disk);
	return KREAD((struct bio___pre_5_12 *)bio, bi_disk);
}

static __always_inline struct gendisk *request_disk(struct request *rq)
{
	struct request___pre_5_16 *old = (void *)rq;

	if (bpf_core_field_exists(old->rq_disk))
		return KREAD(old, rq_disk);
	return KREAD(rq, q, disk);
}

#endif /* STALLTRACE_CORE_FIXES_H */
