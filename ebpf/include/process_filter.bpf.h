/* SPDX-License-Identifier: GPL-2.0 OR MIT */
/*
 * process_filter.bpf.h - --pid, --comm and --container: is the
 * current task one of the processes a run watches? Asked only in process
 * context, of the task doing the work: at a bio's submission (block.bpf.c:
 * writeback and other kernel threads' I/O is no process's) and where a
 * socket's owner is noted (tcp.bpf.c). Each kind given must match; an absent
 * kind matches every process. A run without these flags loads with the
 * three constants at 0, and the verifier drops every check. The task is
 * read with probe reads (bpf_get_current_task): its BTF pointer needs 5.11.
 */
#ifndef STALLTRACE_PROCESS_FILTER_BPF_H
#define STALLTRACE_PROCESS_FILTER_BPF_H

#include "common.bpf.h"

/* Set by the daemon at load time: 1 when the map of that kind is filled. */
const volatile __u64 filter_tgids = 0;
const volatile __u64 filter_comms = 0;
const volatile __u64 filter_mntns = 0;

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PROCESS_FILTER_MAX);
	__type(key, __u32); /* tgid, as the host's /proc numbers it */
	__type(value, __u8);
} process_tgid_filter SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PROCESS_FILTER_MAX);
	__type(key, char[STALLTRACE_COMM_LEN]); /* zero-padded, as the kernel keeps it */
	__type(value, __u8);
} process_comm_filter SEC(".maps");

/*
 * A container is known by its mount namespace, as Inspektor Gadget knows it:
 * every runtime gives a container one of its own, and unlike a cgroup it
 * reads the same under cgroup v1 and v2, and in any cgroup namespace.
 */
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, PROCESS_FILTER_MAX);
	__type(key, __u32); /* mount namespace inode, as /proc/PID/ns/mnt links it */
	__type(value, __u8);
} process_mntns_filter SEC(".maps");

static __always_inline bool process_filtered(void)
{
	return filter_tgids || filter_comms || filter_mntns;
}


static __always_inline bool current_process_wanted(void)
{
	struct task_struct *task = (struct task_struct *)bpf_get_current_task();
	char comm[STALLTRACE_COMM_LEN] = {};
	__u32 tgid, mntns;

	if (filter_tgids) {
		tgid = bpf_get_current_pid_tgid() >> 32;
		if (!bpf_map_lookup_elem(&process_tgid_filter, &tgid))
			return false;
	}
	if (filter_comms) {
		/*
		 * The process's name (/proc/PID/comm), not the thread's: a thread may
		 * name itself. Read up to its NUL, so the rest stays zero.
		 */
		bpf_probe_read_kernel_str(comm, sizeof(comm), BPF_CORE_READ(task, group_leader)->comm);
		if (!bpf_map_lookup_elem(&process_comm_filter, comm))
			return false;
	}
	if (filter_mntns) {
		mntns = BPF_CORE_READ(task, nsproxy, mnt_ns, ns.inum);
		if (!bpf_map_lookup_elem(&process_mntns_filter, &mntns))
			return false;
	}
	return true;
}

#endif /* STALLTRACE_PROCESS_FILTER_BPF_H */
