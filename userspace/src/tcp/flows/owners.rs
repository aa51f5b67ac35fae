//! Which processes hold a socket open: the tie from a bulk flow to the
//! process that feeds it (stall detection asks whether the disk that process
//! reads was slow, see stall/flows.rs). sock_diag answers with the socket's
//! inode only; the kernel keeps no owner on a socket, so /proc/PID/fd is read.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use crate::host::procfs;

/// Processes listed per socket at most (a socket shared by more is rare:
/// a shell and the command it runs, a pre-forked server).
pub const MAX_HOLDERS: usize = 8;

/// The processes (pids as /proc shows them) holding each of `inodes` open,
/// by inode; one pass over `proc`.
pub fn holders(proc: &Path, inodes: &HashSet<u64>) -> HashMap<u64, Vec<u32>> {
    let mut out: HashMap<u64, Vec<u32>> = HashMap::new();
    if inodes.is_empty() {
        return out;
    }
    let Ok(dir) = std::fs::read_dir(proc) else {
        return out;
    };
    let mut denied = false;
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        let files = procfs::open_files(&entry.path());
        denied |= files.denied;
        for ino in files.sockets {
            if inodes.contains(&ino) {
                let pids = out.entry(ino).or_default();
                if pids.len() < MAX_HOLDERS {
                    pids.push(pid);
                }
            }
        }
    }
    if denied {
        crate::host::caps::degraded_if_lacking(
            "tcp_flow",
            "reading other users' /proc/PID/fd",
            &procfs::OTHERS_FDS_NEED,
            "tcp_flow records of their sockets have no pids",
        );
    }
    for pids in out.values_mut() {
        pids.sort_unstable();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn finds_this_process_holding_its_own_socket() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let fd = std::os::fd::AsRawFd::as_raw_fd(&listener);
        let ino = std::fs::metadata(format!("/proc/self/fd/{fd}"))
            .unwrap()
            .ino();
        let found = holders(Path::new("/proc"), &[ino].into());
        assert_eq!(found.get(&ino), Some(&vec![std::process::id()]));
        assert!(holders(Path::new("/proc"), &HashSet::new()).is_empty());
    }
}
