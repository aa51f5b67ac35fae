//! Network namespaces as the user names them (`--netns`) and as the kernel
//! reports them (the inode of the namespace file).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::UserError;

/// Where `ip netns add NAME` puts its namespaces.
pub const NAMED_NETNS_DIR: &str = "/run/netns";

/// statfs(2) f_type of nsfs, where namespace files live.
const NSFS_MAGIC: i64 = 0x6e73_6673;

/// Whether `path` is a namespace file now. A name under /run/netns that
/// `ip netns del` is deleting is, for a moment, an empty file of /run's
/// tmpfs (unmounted, not yet unlinked): its inode is no namespace's.
pub fn is_ns_file(path: &Path) -> bool {
    std::fs::File::open(path).is_ok_and(|f| is_ns_fd(&f))
}

/// Whether an open file is a namespace file (see [`is_ns_file`]).
pub fn is_ns_fd(file: &std::fs::File) -> bool {
    use std::os::fd::AsRawFd;
    // SAFETY: fstatfs writes into `fs`, valid for writes; all-zero is a valid statfs.
    unsafe {
        let mut fs: libc::statfs = std::mem::zeroed();
        libc::fstatfs(file.as_raw_fd(), &mut fs) == 0 && fs.f_type as i64 == NSFS_MAGIC
    }
}

/// Whether `ns`, the metadata of a namespace file, names the calling thread's
/// own network namespace (same device and inode as /proc/thread-self/ns/net):
/// no setns is needed to work in it, and setns, even into the namespace one
/// is in, needs CAP_SYS_ADMIN.
pub(crate) fn is_own(ns: &std::fs::Metadata) -> bool {
    std::fs::metadata("/proc/thread-self/ns/net")
        .is_ok_and(|own| (own.dev(), own.ino()) == (ns.dev(), ns.ino()))
}

/// Inodes of the network namespaces that exist now, as far as names and
/// processes tell: this process's, every one under /run/netns and every
/// process's (/proc/PID/ns/net). One held only by an open file or a bind mount
/// elsewhere is not found.
pub fn live_inodes() -> std::collections::HashSet<u32> {
    use std::os::unix::fs::MetadataExt;
    let mut inodes = std::collections::HashSet::new();
    if let Ok(meta) = std::fs::metadata("/proc/self/ns/net") {
        inodes.insert(meta.ino() as u32);
    }
    for entry in std::fs::read_dir(NAMED_NETNS_DIR)
        .into_iter()
        .flatten()
        .flatten()
    {
        if let Ok(meta) = std::fs::metadata(entry.path())
            && is_ns_file(&entry.path())
        {
            inodes.insert(meta.ino() as u32);
        }
    }
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        if entry
            .file_name()
            .to_str()
            .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
            && let Ok(link) = std::fs::read_link(entry.path().join("ns/net"))
            && let Some(inode) = link
                .to_str()
                .and_then(|t| t.strip_prefix("net:["))
                .and_then(|t| t.strip_suffix(']'))
                .and_then(|t| t.parse().ok())
        {
            inodes.insert(inode);
        }
    }
    inodes
}

/// A namespace the user asked for (`--netns`).
#[derive(Clone, Debug, Serialize, serde::Deserialize, schemars::JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "netns")]
pub struct Netns {
    /// As given to --netns (on the command line).
    pub spec: String,
    /// Its inode: the network namespace inode the records carry as `netns`.
    pub inode: u32,
    /// A file to setns() into, when known (not for a bare inode number).
    #[serde(skip)]
    #[schemars(skip)]
    pub path: Option<PathBuf>,
}

/// `--netns SPEC`: a name under /run/netns, `host` (this process's namespace),
/// a path such as /proc/PID/ns/net, or an inode number.
pub fn resolve(spec: &str) -> Result<Netns, UserError> {
    if let Ok(inode) = spec.parse::<u32>() {
        return Ok(Netns {
            spec: spec.into(),
            inode,
            path: None,
        });
    }
    let path = if spec == "host" {
        PathBuf::from("/proc/self/ns/net")
    } else if spec.contains('/') {
        PathBuf::from(spec)
    } else {
        Path::new(NAMED_NETNS_DIR).join(spec)
    };
    let inode = std::fs::metadata(&path).map_err(|e| {
        UserError::new(
            format!("--netns {spec}: cannot open {} ({e})", path.display()),
            "give a name listed by `ip netns list`, `host`, a path like /proc/PID/ns/net, or a namespace inode number",
        )
    })?;
    Ok(Netns {
        spec: spec.into(),
        inode: inode.ino() as u32,
        path: Some(path),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_host_inode_and_numbers() {
        let host = resolve("host").unwrap();
        let expected = std::fs::metadata("/proc/self/ns/net").unwrap().ino() as u32;
        assert_eq!(host.inode, expected);
        assert_eq!(resolve("4026531840").unwrap().inode, 4026531840);
        assert!(is_ns_file(Path::new("/proc/self/ns/net")));
        assert!(live_inodes().contains(&host.inode));
        assert!(!is_ns_file(Path::new("/proc/self/status")));
        let err = resolve("no-such-namespace-here").unwrap_err();
        assert!(err.problem.contains("no-such-namespace-here"), "{err}");
        assert!(err.fix.contains("ip netns list"));
    }
}
