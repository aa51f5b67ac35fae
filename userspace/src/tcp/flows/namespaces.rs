//! Which network namespaces to sample, and one sock_diag socket in each.
//!
//! Sockets are per namespace, and a netlink socket answers for the namespace
//! it was created in: a short-lived thread enters the namespace (setns moves
//! only the calling thread), opens the socket and hands it back. The socket is
//! kept for the next intervals. It also keeps its namespace alive, so it is
//! closed as soon as the namespace is no longer found (no process in it, no
//! /run/netns name): then nothing but stalltrace would hold it.

use std::collections::hash_map::Entry;
use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use netlink_sys::protocols::NETLINK_SOCK_DIAG;

use crate::host::caps;
use crate::host::netlink::Socket;
use crate::host::netns::{self, NAMED_NETNS_DIR, Netns, is_ns_fd, is_ns_file};

/// At most this many namespaces are sampled per interval; the rest are
/// counted in `lost` (`tcp.flow_netns_over_limit`).
pub const MAX_NAMESPACES: usize = 64;

/// A namespace and a file that names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    pub inode: u32,
    pub path: PathBuf,
}

/// The inode in a `/proc/PID/ns/net` link's text, `net:[4026531840]`.
pub fn parse_ns_link(text: &str) -> Option<u32> {
    text.strip_prefix("net:[")?.strip_suffix(']')?.parse().ok()
}

/// Every namespace that has a process in it or a /run/netns name, this
/// process's own first, each once.
fn all_namespaces() -> Vec<Candidate> {
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    let mut add = |inode: u32, path: PathBuf| {
        if seen.insert(inode) {
            out.push(Candidate { inode, path });
        }
    };
    let own = PathBuf::from("/proc/self/ns/net");
    if let Ok(meta) = std::fs::metadata(&own) {
        add(meta.ino() as u32, own);
    }
    if let Ok(dir) = std::fs::read_dir(NAMED_NETNS_DIR) {
        let mut named: Vec<PathBuf> = dir.flatten().map(|e| e.path()).collect();
        named.sort();
        for path in named {
            if let Ok(meta) = std::fs::metadata(&path)
                && is_ns_file(&path)
            {
                add(meta.ino() as u32, path);
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir("/proc") {
        let mut pids: Vec<u32> = dir
            .flatten()
            .filter_map(|e| e.file_name().to_str()?.parse().ok())
            .collect();
        pids.sort_unstable();
        let mut denied = 0;
        for pid in pids {
            let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
            match std::fs::read_link(&path) {
                Ok(text) => {
                    if let Some(inode) = text.to_str().and_then(parse_ns_link) {
                        add(inode, path);
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::PermissionDenied => denied += 1,
                Err(_) => {} // exited meanwhile
            }
        }
        if denied > 0 {
            caps::degraded_if_lacking(
                "tcp_flow",
                &format!("reading /proc/PID/ns/net of {denied} processes of other users"),
                &[caps::CAP_SYS_PTRACE],
                "a network namespace only such processes are in (a container's, with no \
                 /run/netns name) is not sampled",
            );
        }
    }
    out
}

/// What to sample this interval.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Selection {
    pub sample: Vec<Candidate>,
    /// Found but beyond the limit.
    pub over_limit: usize,
    /// Asked for by inode (`--netns N`) but found nowhere.
    pub missing: Vec<u32>,
}

/// The namespaces to sample: the ones asked for (`--netns`), else every one
/// found. At most `max`: the first found (this process's own), then the ones
/// sampled before (`keep`, so their baselines stay useful), then the rest in
/// the order found.
pub fn select(filter: &[Netns], keep: &HashSet<u32>, max: usize) -> Selection {
    let needs_scan = filter.is_empty() || filter.iter().any(|n| n.path.is_none());
    let found = if needs_scan {
        all_namespaces()
    } else {
        Vec::new()
    };
    let mut missing = Vec::new();
    let wanted = if filter.is_empty() {
        found
    } else {
        let mut wanted = Vec::new();
        let mut seen = HashSet::new();
        for n in filter {
            // `--netns host --netns /proc/self/ns/net` is one namespace: one dump.
            if !seen.insert(n.inode) {
                continue;
            }
            match (&n.path, found.iter().find(|c| c.inode == n.inode)) {
                (Some(path), _) => wanted.push(Candidate {
                    inode: n.inode,
                    path: path.clone(),
                }),
                (None, Some(c)) => wanted.push(c.clone()),
                (None, None) => missing.push(n.inode),
            }
        }
        wanted
    };
    let mut selection = limit(wanted, keep, max);
    selection.missing = missing;
    selection
}

/// [`select`]'s ordering and bound, on a list already found.
pub fn limit(found: Vec<Candidate>, keep: &HashSet<u32>, max: usize) -> Selection {
    let total = found.len();
    let mut order: Vec<(usize, Candidate)> = found.into_iter().enumerate().collect();
    // The first found stays first; then the kept ones; stable otherwise.
    order.sort_by_key(|(i, c)| (*i != 0, !keep.contains(&c.inode), *i));
    order.truncate(max);
    Selection {
        over_limit: total - order.len(),
        sample: order.into_iter().map(|(_, c)| c).collect(),
        missing: Vec::new(),
    }
}

/// Why a namespace has no socket.
#[derive(Debug)]
pub enum OpenError {
    /// The file no longer names it (the process exited, the name was
    /// deleted, or the pid now belongs to a process in another namespace).
    Gone,
    /// It exists but could not be sampled. `kind` names the failure apart from
    /// the namespace (the same in every namespace it hits); `message` says
    /// why, for which namespace, and what to do.
    Failed { kind: String, message: String },
}

/// One open sock_diag socket per namespace inode.
#[derive(Default)]
pub struct Sockets {
    open: HashMap<u32, Socket>,
}

impl Sockets {
    /// The namespace's socket, opened on first use.
    pub fn get(&mut self, c: &Candidate) -> Result<&mut Socket, OpenError> {
        match self.open.entry(c.inode) {
            Entry::Occupied(e) => Ok(e.into_mut()),
            Entry::Vacant(e) => Ok(e.insert(open_in(c)?)),
        }
    }

    /// Close a socket (after a failed dump: the next interval opens a new one).
    pub fn close(&mut self, inode: u32) {
        self.open.remove(&inode);
    }

    /// Close every socket of a namespace not in `keep`, releasing the namespace.
    pub fn retain(&mut self, keep: &HashSet<u32>) {
        self.open.retain(|inode, _| keep.contains(inode));
    }

    pub fn inodes(&self) -> HashSet<u32> {
        self.open.keys().copied().collect()
    }
}

fn open_in(c: &Candidate) -> Result<Socket, OpenError> {
    let failed = |what: &str, e: io::Error| OpenError::Failed {
        kind: format!("{what}: {e}"),
        message: format!(
            "cannot {what} network namespace {} ({}): {e}",
            c.inode,
            c.path.display()
        ),
    };
    let ns = match File::open(&c.path) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Err(OpenError::Gone),
        Err(e) => return Err(failed("open", e)),
    };
    // A pid reused since the scan names another namespace.
    let meta = match ns.metadata() {
        // A name being deleted is an empty file for a moment, not a namespace.
        Ok(_) if !is_ns_fd(&ns) => return Err(OpenError::Gone),
        Ok(meta) if meta.ino() as u32 == c.inode => meta,
        Ok(_) => return Err(OpenError::Gone),
        Err(e) => return Err(failed("open", e)),
    };
    // This thread's namespace: no other thread is needed to open a socket there.
    if netns::is_own(&meta) {
        return Socket::open(NETLINK_SOCK_DIAG).map_err(no_sock_diag);
    }
    let opener = std::thread::Builder::new()
        .name("stalltrace-diag".into())
        .spawn(move || {
            // SAFETY: setns on a descriptor we own; it changes only this thread,
            // which ends right after opening the socket.
            if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                return Err(Entering(io::Error::last_os_error()));
            }
            drop(ns);
            Socket::open(NETLINK_SOCK_DIAG).map_err(Opening)
        })
        .map_err(|e| failed("start a thread for", e))?;
    match opener
        .join()
        .unwrap_or_else(|p| std::panic::resume_unwind(p))
    {
        Ok(socket) => Ok(socket),
        Err(Entering(e)) => Err(OpenError::Failed {
            kind: format!("setns: {e}"),
            message: format!(
                "cannot enter network namespace {} ({}; setns needs CAP_SYS_ADMIN): {e}",
                c.inode,
                c.path.display()
            ),
        }),
        Err(Opening(e)) => Err(no_sock_diag(e)),
    }
}

enum ThreadError {
    Entering(io::Error),
    Opening(io::Error),
}
use ThreadError::{Entering, Opening};

fn no_sock_diag(e: io::Error) -> OpenError {
    OpenError::Failed {
        kind: format!("socket: {e}"),
        message: format!(
            "cannot open a NETLINK_SOCK_DIAG socket ({e}): the kernel needs CONFIG_INET_DIAG \
             (load it with `modprobe inet_diag tcp_diag`)"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(inode: u32) -> Candidate {
        Candidate {
            inode,
            path: PathBuf::from(format!("/proc/{inode}/ns/net")),
        }
    }

    fn inodes(s: &Selection) -> Vec<u32> {
        s.sample.iter().map(|c| c.inode).collect()
    }

    #[test]
    fn parses_the_namespace_link() {
        assert_eq!(parse_ns_link("net:[4026531840]"), Some(4026531840));
        assert_eq!(parse_ns_link("mnt:[4026531840]"), None);
        assert_eq!(parse_ns_link("net:[]"), None);
        assert_eq!(parse_ns_link("net:[4026531840"), None);
    }

    #[test]
    fn within_the_limit_everything_in_order() {
        let s = limit((1..=5).map(c).collect(), &HashSet::new(), 64);
        assert_eq!(inodes(&s), [1, 2, 3, 4, 5]);
        assert_eq!(s.over_limit, 0);
    }

    #[test]
    fn over_the_limit_own_first_then_the_ones_sampled_before() {
        let keep = HashSet::from([9, 7]);
        let s = limit((1..=10).map(c).collect(), &keep, 4);
        assert_eq!(inodes(&s), [1, 7, 9, 2]);
        assert_eq!(s.over_limit, 6);
        let s = limit(Vec::new(), &keep, 4);
        assert_eq!((s.sample.len(), s.over_limit), (0, 0));
    }

    #[test]
    fn finds_this_process_namespace_first_and_each_once() {
        let own = std::fs::metadata("/proc/self/ns/net").unwrap().ino() as u32;
        let all = all_namespaces();
        assert_eq!(all[0].inode, own);
        let unique: HashSet<u32> = all.iter().map(|c| c.inode).collect();
        assert_eq!(unique.len(), all.len());
        // Each path names the inode it was found with.
        for c in &all {
            let Ok(meta) = std::fs::metadata(&c.path) else {
                continue; // a process that exited since
            };
            assert_eq!(meta.ino() as u32, c.inode, "{c:?}");
        }
    }

    #[test]
    fn a_filter_by_bare_inode_is_found_or_reported_missing() {
        let own = std::fs::metadata("/proc/self/ns/net").unwrap().ino() as u32;
        let spec = |inode: u32| Netns {
            spec: inode.to_string(),
            inode,
            path: None,
        };
        let s = select(&[spec(own), spec(1)], &HashSet::new(), 64);
        assert_eq!(inodes(&s), [own]);
        assert_eq!(s.missing, [1]);
    }

    #[test]
    fn a_namespace_named_twice_is_sampled_once() {
        let own = std::fs::metadata("/proc/self/ns/net").unwrap().ino() as u32;
        let by_path = |spec: &str| Netns {
            spec: spec.into(),
            inode: own,
            path: Some(PathBuf::from("/proc/self/ns/net")),
        };
        let s = select(
            &[by_path("host"), by_path("/proc/self/ns/net")],
            &HashSet::new(),
            64,
        );
        assert_eq!(inodes(&s), [own]);
    }

    #[test]
    fn a_namespace_file_that_is_gone_is_not_an_error() {
        let gone = Candidate {
            inode: 1,
            path: PathBuf::from("/proc/4294967294/ns/net"),
        };
        assert!(matches!(
            Sockets::default().get(&gone),
            Err(OpenError::Gone)
        ));
        // A file of another inode (the pid was reused): gone too.
        let own = std::fs::metadata("/proc/self/ns/net").unwrap().ino() as u32;
        let other = Candidate {
            inode: own.wrapping_add(1),
            path: PathBuf::from("/proc/self/ns/net"),
        };
        assert!(matches!(
            Sockets::default().get(&other),
            Err(OpenError::Gone)
        ));
    }
}
