//! `--pid`, `--comm` and `--container`: the processes a run
//! watches, resolved once before anything attaches. The kernel side
//! (`ebpf/include/process_filter.bpf.h`, loaded by `probes::process_filter`) asks the same question of the current
//! task; [`ProcessFilter::matches`] asks it of a pid for what userspace finds
//! by itself (sock_diag's flows, SQL Server's discovery).

use std::os::unix::fs::MetadataExt;
use std::path::Path;

use crate::abi;
use crate::error::UserError;
use crate::host::container::{self, Container};
use crate::host::container_lookup::Names;
use crate::host::procfs;

/// The kernel's TASK_COMM_LEN: a comm is at most 15 bytes and a NUL.
pub const COMM_LEN: usize = abi::STALLTRACE_COMM_LEN as usize;

/// The processes a run watches: each kind given must match; an empty kind
/// matches every process.
#[derive(Debug, Clone, Default)]
pub struct ProcessFilter {
    /// Processes (thread-group ids, as the host's /proc numbers them).
    pub tgids: Vec<u32>,
    /// Process names, as /proc/PID/comm gives them.
    pub comms: Vec<String>,
    /// `--container`: the containers' full ids.
    pub containers: Vec<String>,
    /// Their mount namespaces (inodes): a runtime gives each container its
    /// own, and it reads the same under cgroup v1 and v2.
    pub mount_namespaces: Vec<u32>,
}

impl ProcessFilter {
    /// Resolves the flags against this host's /proc.
    pub fn resolve(
        pids: &[u32],
        comms: &[String],
        containers: &[String],
    ) -> Result<Self, UserError> {
        let proc = Path::new("/proc");
        let mut filter = Self::default();
        for &pid in pids {
            let status = std::fs::read_to_string(proc.join(format!("{pid}/status")));
            let tgid = status.ok().and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("Tgid:"))
                    .and_then(|v| v.trim().parse::<u32>().ok())
            });
            match tgid {
                None => {
                    return Err(UserError::new(
                        format!("--pid {pid}: no such process"),
                        "name a running process by the pid `ps` shows on this host (not inside a container's pid namespace)",
                    ));
                }
                Some(tgid) if tgid != pid => {
                    return Err(UserError::new(
                        format!("--pid {pid}: a thread of process {tgid}"),
                        format!("give the process, --pid {tgid}: its threads are all watched"),
                    ));
                }
                Some(_) => push_once(&mut filter.tgids, pid),
            }
        }
        for comm in comms {
            if comm.is_empty() || comm.len() >= COMM_LEN {
                return Err(UserError::new(
                    format!("--comm {comm:?}: a process name is 1 to 15 bytes"),
                    "give the name as `ps -o comm` or /proc/PID/comm shows it (the kernel keeps its first 15 bytes)",
                ));
            }
            push_once(&mut filter.comms, comm.clone());
        }
        for spec in containers {
            let (id, namespaces) = find_container(proc, spec)?;
            push_once(&mut filter.containers, id);
            for ns in namespaces {
                push_once(&mut filter.mount_namespaces, ns);
            }
        }
        filter.bounded()
    }

    pub fn is_empty(&self) -> bool {
        self.tgids.is_empty() && self.comms.is_empty() && self.mount_namespaces.is_empty()
    }

    /// The inodes of the sockets the watched processes hold now, at most
    /// `max`; the second value says whether there were more.
    pub fn socket_inodes(&self, proc_root: &Path, max: usize) -> (Vec<u64>, bool) {
        let mut inodes = Vec::new();
        let Ok(entries) = std::fs::read_dir(proc_root) else {
            return (inodes, false);
        };
        let pids = entries
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok());
        for pid in pids.filter(|&pid| self.matches(proc_root, pid)) {
            let open = procfs::open_files(&proc_root.join(pid.to_string()));
            for inode in open.sockets {
                if inodes.contains(&inode) {
                    continue;
                }
                if inodes.len() == max {
                    return (inodes, true);
                }
                inodes.push(inode);
            }
        }
        (inodes, false)
    }

    /// Whether process `pid` is watched, read from `proc_root` now.
    pub fn matches(&self, proc_root: &Path, pid: u32) -> bool {
        if !self.tgids.is_empty() && !self.tgids.contains(&pid) {
            return false;
        }
        let dir = proc_root.join(pid.to_string());
        if !self.comms.is_empty() {
            let comm = std::fs::read_to_string(dir.join("comm")).unwrap_or_default();
            if !self.comms.iter().any(|c| c == comm.trim_end_matches('\n')) {
                return false;
            }
        }
        if !self.mount_namespaces.is_empty()
            && !mount_namespace(&dir).is_some_and(|ns| self.mount_namespaces.contains(&ns))
        {
            return false;
        }
        true
    }

    fn bounded(self) -> Result<Self, UserError> {
        let max = abi::PROCESS_FILTER_MAX as usize;
        if [
            self.tgids.len(),
            self.comms.len(),
            self.mount_namespaces.len(),
        ]
        .iter()
        .any(|&n| n > max)
        {
            return Err(UserError::new(
                format!(
                    "too many processes named: at most {max} --pid, {max} --comm, and containers with {max} mount namespaces in all"
                ),
                "name fewer",
            ));
        }
        Ok(self)
    }
}

fn push_once<T: PartialEq>(list: &mut Vec<T>, item: T) {
    if !list.contains(&item) {
        list.push(item);
    }
}

/// The mount namespace of the process at `dir` (/proc/PID), by inode.
fn mount_namespace(dir: &Path) -> Option<u32> {
    std::fs::metadata(dir.join("ns/mnt"))
        .ok()
        .map(|m| m.ino() as u32)
}

/// The running container `spec` names (its full id, its name, or a unique
/// prefix of its id, in that order: a name may look like a prefix): its full
/// id and the mount namespaces its processes are in (a process may make one
/// of its own inside it, as systemd's PrivateTmp does).
fn find_container(proc: &Path, spec: &str) -> Result<(String, Vec<u32>), UserError> {
    let not_found = || {
        UserError::new(
            format!("--container {spec}: no running container has this id or name"),
            "give the id or name `podman ps`, `docker ps` or `crictl ps` shows; the container must be running when stalltrace starts",
        )
    };
    if spec.is_empty() {
        return Err(not_found());
    }
    let entries = std::fs::read_dir(proc).map_err(|e| {
        UserError::new(
            format!("--container: reading /proc: {e}"),
            "run stalltrace as root",
        )
    })?;
    // Each container once, with every mount namespace of its processes (the
    // runtimes' monitors are not in the container's cgroup), but the host's
    // and stalltrace's own: a process that joined one of those (nsenter from
    // a privileged pod) would make every process of the host match.
    let shared = [Path::new("/proc/1"), Path::new("/proc/self")].map(mount_namespace);
    let mut found: Vec<(Container, Vec<u32>)> = Vec::new();
    for pid in entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
    {
        let Some(c) = container::of_pid(proc, pid) else {
            continue;
        };
        let ns =
            mount_namespace(&proc.join(pid.to_string())).filter(|ns| !shared.contains(&Some(*ns)));
        match found.iter_mut().find(|(known, _)| known.id == c.id) {
            Some((_, namespaces)) => namespaces.extend(ns.filter(|ns| !namespaces.contains(ns))),
            None => found.push((c, ns.into_iter().collect())),
        }
    }
    let take = |(c, namespaces): &(Container, Vec<u32>)| {
        if namespaces.is_empty() {
            return Err(UserError::new(
                format!("--container {spec}: its processes share the host's mount namespace"),
                "name them with --pid or --comm instead",
            ));
        }
        Ok((c.id.clone(), namespaces.clone()))
    };
    if let Some(exact) = found.iter().find(|(c, _)| c.id == spec) {
        return take(exact);
    }
    // By name: the runtimes' sockets, asked now; a socket that fails once is
    // not asked again (a hung runtime costs one timeout, not one per container).
    let mut failed: Vec<Option<container::Runtime>> = Vec::new();
    for entry in &found {
        if failed.contains(&entry.0.runtime) {
            continue;
        }
        match Names::shared().name_now(&entry.0) {
            Ok(Some(name)) if name == spec => return take(entry),
            Ok(_) => {}
            Err(_) => failed.push(entry.0.runtime),
        }
    }
    let by_id: Vec<&(Container, Vec<u32>)> = found
        .iter()
        .filter(|(c, _)| c.id.starts_with(spec))
        .collect();
    match by_id.as_slice() {
        [one] => take(one),
        [] => Err(not_found()),
        _ => Err(UserError::new(
            format!(
                "--container {spec}: {} containers have ids starting so",
                by_id.len()
            ),
            "give more of the id",
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_comm_longer_than_the_kernel_keeps_is_refused() {
        let err = ProcessFilter::resolve(&[], &["sqlservr-is-too-long".into()], &[]).unwrap_err();
        assert!(err.problem.contains("1 to 15 bytes"), "{}", err.problem);
        assert!(ProcessFilter::resolve(&[], &["sqlservr".into()], &[]).is_ok());
    }

    #[test]
    fn a_missing_pid_is_refused_and_this_one_matches() {
        let me = std::process::id();
        let filter = ProcessFilter::resolve(&[me], &[], &[]).unwrap();
        assert!(filter.matches(Path::new("/proc"), me));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let inode = std::fs::metadata(format!("/proc/self/fd/{}", {
            use std::os::fd::AsRawFd;
            listener.as_raw_fd()
        }))
        .map(|m| std::os::unix::fs::MetadataExt::ino(&m))
        .unwrap();
        let (inodes, more) = filter.socket_inodes(Path::new("/proc"), 4096);
        assert!(inodes.contains(&inode) && !more, "{inode} in {inodes:?}");
        let unknown = ProcessFilter::resolve(&[], &[], &["0123456789ab-none".into()]);
        assert!(
            unknown
                .unwrap_err()
                .problem
                .contains("no running container")
        );
        assert!(!filter.matches(Path::new("/proc"), 1));
        assert!(ProcessFilter::resolve(&[u32::MAX - 1], &[], &[]).is_err());
    }
}
