//! Containers under podman on this VM, for the simulator and for the image.
//!
//! [`SimContainer`] runs a program of this host in a container of its own:
//! a root directory with nothing but mount points, the host's /usr
//! read-only (the program's libraries, libssl among them), the program's
//! directory read-only and the lab's volumes read-write, each at the same
//! path as on the host, so the paths a process opens are the paths on the
//! host. The container has its own cgroup (podman's `libpod-<id>`), mount,
//! UTS and IPC namespaces, and the network namespace the lab names; it keeps
//! the host's pid namespace, so the pids it prints are the host's.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::util::unique;

/// `podman run --rm` as this VM runs containers.
pub fn podman_run() -> Command {
    let mut cmd = Command::new("podman");
    cmd.args([
        // crun cannot start containers on this VM's hybrid cgroup hierarchy
        // ("cgroups in hybrid mode not supported"); runc can.
        "--runtime",
        "runc",
        "run",
        "--rm",
        // podman's default limits (nofile 1048576, nproc 4194304) are above
        // this VM's hard limits, and raising a hard limit needs
        // CAP_SYS_RESOURCE, which no process has here.
        "--ulimit=nofile=4096:4096",
        "--ulimit=nproc=4096:4096",
    ]);
    cmd
}

pub struct SimContainer {
    root: PathBuf,
    cidfile: PathBuf,
    volumes: Vec<PathBuf>,
}

impl SimContainer {
    /// A container (not yet started) whose `volumes` are the host's directories.
    pub fn new(volumes: &[&Path]) -> Self {
        let root = std::env::temp_dir().join(unique("stalltrace-ctr"));
        for dir in ["usr", "etc", "tmp", "proc", "sys", "dev", "run"] {
            std::fs::create_dir_all(root.join(dir)).unwrap();
        }
        // Debian's merged /usr.
        for (link, target) in [
            ("bin", "usr/bin"),
            ("sbin", "usr/sbin"),
            ("lib", "usr/lib"),
            ("lib64", "usr/lib64"),
        ] {
            std::os::unix::fs::symlink(target, root.join(link)).unwrap();
        }
        let cidfile = root.with_extension("cid");
        Self {
            root,
            cidfile,
            volumes: volumes.iter().map(|v| v.to_path_buf()).collect(),
        }
    }

    /// `podman run` of `program` in the container, in network namespace
    /// `netns` (a name under /run/netns), else in none.
    pub(crate) fn command(&self, program: &Path, netns: Option<&str>) -> Command {
        let mut cmd = podman_run();
        let bind = |host: &Path, mode: &str| format!("--volume={0}:{0}:{mode}", host.display());
        cmd.arg(format!("--cidfile={}", self.cidfile.display()))
            .arg("--pid=host")
            .arg(match netns {
                Some(ns) => format!("--network=ns:/run/netns/{ns}"),
                None => "--network=none".into(),
            })
            .arg(bind(Path::new("/usr"), "ro"))
            .arg(bind(
                program.parent().expect("a program in a directory"),
                "ro",
            ));
        for volume in &self.volumes {
            cmd.arg(bind(volume, "rw"));
        }
        // --rootfs: the image argument is a root directory.
        cmd.arg("--rootfs").arg(&self.root).arg(program);
        cmd
    }

    /// The container's full id (podman's --cidfile), once it was started.
    pub fn id(&self) -> String {
        let id = std::fs::read_to_string(&self.cidfile)
            .unwrap_or_else(|e| panic!("{}: {e} (not started?)", self.cidfile.display()));
        id.trim().to_string()
    }
}

impl Drop for SimContainer {
    fn drop(&mut self) {
        // `podman run --rm` removed the container when its program ended.
        let _ = std::fs::remove_dir_all(&self.root);
        let _ = std::fs::remove_file(&self.cidfile);
    }
}
