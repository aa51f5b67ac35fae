//! Network namespaces as the user names them (`--netns`) and as the kernel
//! reports them (the inode of the namespace file).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::UserError;

/// Where `ip netns add NAME` puts its namespaces.
pub const NAMED_NETNS_DIR: &str = "/run/netns";

/// A namespace the user asked for.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Netns {
    /// As given on the command line.
    pub spec: String,
    pub inode: u32,
    /// A file to setns() into, when known (not for a bare inode number).
    #[serde(skip)]
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
        let err = resolve("no-such-namespace-here").unwrap_err();
        assert!(err.problem.contains("no-such-namespace-here"), "{err}");
        assert!(err.fix.contains("ip netns list"));
    }
}
