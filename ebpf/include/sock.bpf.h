/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * sock.bpf.h - socket helpers shared by the tcp and sqlserver families.
 */
#ifndef STALLTRACE_SOCK_BPF_H
#define STALLTRACE_SOCK_BPF_H

#include "core_fixes.h"

/* not in BTF */
#define AF_INET 2
#define AF_INET6 10

/*
 * The inode of a socket's file: what /proc/PID/fd shows as socket:[N] and
 * sock_diag reports, so userspace can tie a kernel socket to a process.
 * 0 for a socket without a file (a request sock, an orphan).
 */
static __always_inline __u64 sock_inode(const struct sock *sk)
{
	struct socket *sock = KREAD(sk, sk_socket);
	struct file *file;

	if (!sock)
		return 0;
	file = KREAD(sock, file);
	if (!file)
		return 0;
	return KREAD(file, f_inode, i_ino);
}

/* Addresses and ports of a socket, v4-mapped v6 folded to v4. */
struct tuple {
	__u8 saddr[16]; /* first: the verifier wants 8-byte stack loads 8-byte aligned */
	__u8 daddr[16];
	__u32 netns;
	__u16 family;
	__u16 sport;
	__u16 dport;
} __attribute__((aligned(8)));

static __always_inline __u16 swap16(__u16 v)
{
	return (v >> 8) | (v << 8);
}

static __always_inline bool v4_mapped(const __u8 *a)
{
	return *(__u64 *)a == 0 && *(__u16 *)(a + 8) == 0 && *(__u16 *)(a + 10) == 0xffff;
}

static __always_inline void common_tuple(const struct sock_common *skc, struct tuple *t)
{
	__builtin_memset(t, 0, sizeof(*t));
	t->netns = KREAD(skc, skc_net.net, ns.inum);
	t->family = KREAD(skc, skc_family);
	t->sport = KREAD(skc, skc_num);
	t->dport = swap16(KREAD(skc, skc_dport));
	if (t->family == AF_INET6) {
		bpf_probe_read_kernel(t->saddr, 16, &skc->skc_v6_rcv_saddr);
		bpf_probe_read_kernel(t->daddr, 16, &skc->skc_v6_daddr);
		if (v4_mapped(t->daddr)) {
			t->family = AF_INET;
			*(__u32 *)t->saddr = *(__u32 *)(t->saddr + 12);
			*(__u32 *)t->daddr = *(__u32 *)(t->daddr + 12);
			__builtin_memset(t->saddr + 4, 0, 12);
			__builtin_memset(t->daddr + 4, 0, 12);
		}
	} else {
		*(__u32 *)t->saddr = KREAD(skc, skc_rcv_saddr);
		*(__u32 *)t->daddr = KREAD(skc, skc_daddr);
	}
}

#endif /* STALLTRACE_SOCK_BPF_H */
