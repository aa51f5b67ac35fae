/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * sock.bpf.h - socket helpers shared by the tcp and sqlserver families.
 */
#ifndef STALLTRACE_SOCK_BPF_H
#define STALLTRACE_SOCK_BPF_H

#include "core_fixes.h"

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

#endif /* STALLTRACE_SOCK_BPF_H */
