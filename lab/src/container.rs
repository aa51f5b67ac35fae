//! Containers under podman on this VM, for the simulator and for the image.
//!
//! [`SimContainer`] runs a program of this host in a container of its own:
//! its root from an image built from Debian's packages ([`SIM_IMAGE`], in
//! podman's storage, so the root is an overlay whose upper directory is in
//! that storage; the program's libraries, libssl among them, are the
//! image's), the program's directory read-only at its own path, and the
//! lab's volumes read-write, each at a path of the container's own (as `-v
//! data:/var/opt/mssql` mounts SQL Server's): the paths the process opens
//! are not the host's. The container has its own cgroup (podman's
//! `libpod-<id>`), mount, pid, UTS and IPC namespaces, and the network
//! namespace the lab names.

use std::os::fd::AsRawFd;
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
    /// Its name (`podman run --name`), unique.
    pub name: String,
    cidfile: PathBuf,
    /// (host directory, where the container sees it)
    volumes: Vec<(PathBuf, PathBuf)>,
}

/// The simulator's image: Debian's minimal base with libssl3, from Debian's
/// packages only (mmdebstrap, as the package test's image), so the worker's
/// libssl is the image's, as SQL Server's is its image's OpenSSL. Built once
/// per host and kept in podman's store under this tag, as a build cache
/// (`podman rmi` it to build it again); the tag names what is in it, so a
/// change of either makes a new one.
pub const SIM_IMAGE: &str = "localhost/stalltrace-lab-sim:bookworm-minbase-libssl3";

/// [`SIM_IMAGE`], built if podman has none; one process at a time builds
/// it (nextest runs tests in processes of their own).
fn sim_image() -> &'static str {
    assert!(
        SIM_IMAGE.contains(crate::systemd_guest::DEBIAN_SUITE),
        "SIM_IMAGE names another suite"
    );
    // One path for every process, whatever its TMPDIR.
    let lock = std::fs::File::create("/run/lock/stalltrace-lab-sim.lock")
        .or_else(|_| std::fs::File::create("/tmp/stalltrace-lab-sim.lock"))
        .expect("the image's lock file");
    // SAFETY: flock(2) on a descriptor we own; released when `lock` closes.
    assert_eq!(
        unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) },
        0,
        "flock"
    );
    let exists = Command::new("podman")
        .args(["image", "exists", SIM_IMAGE])
        .status();
    if exists.is_ok_and(|s| s.success()) {
        return SIM_IMAGE;
    }
    let tar = std::env::temp_dir().join(format!("{}.tar", unique("stalltrace-sim-image")));
    let ran = |cmd: &mut Command| {
        let out = cmd.output().expect("mmdebstrap and podman");
        let _ = (!out.status.success()).then(|| std::fs::remove_file(&tar));
        assert!(
            out.status.success(),
            "{cmd:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    ran(Command::new("mmdebstrap")
        .args([
            "--quiet",
            "--variant=minbase",
            "--include=libssl3",
            crate::systemd_guest::DEBIAN_SUITE,
        ])
        .arg(&tar));
    ran(Command::new("podman")
        .arg("import")
        .arg(&tar)
        .arg(SIM_IMAGE));
    let _ = std::fs::remove_file(&tar);
    SIM_IMAGE
}

impl SimContainer {
    /// A container (not yet started) of [`SIM_IMAGE`] with `volumes`: a host
    /// directory, and the path the container sees it at.
    pub fn new(volumes: &[(&Path, &str)]) -> Self {
        sim_image();
        Self {
            name: unique("stalltrace-sql"),
            cidfile: std::env::temp_dir().join(format!("{}.cid", unique("stalltrace-ctr"))),
            volumes: volumes
                .iter()
                .map(|(host, inside)| (host.to_path_buf(), PathBuf::from(inside)))
                .collect(),
        }
    }

    /// Where the container sees `host_path`: under the volume holding it
    /// (unchanged when none does).
    pub fn inside(&self, host_path: &Path) -> PathBuf {
        self.volumes
            .iter()
            .find_map(|(host, inside)| Some(inside.join(host_path.strip_prefix(host).ok()?)))
            .unwrap_or_else(|| host_path.to_path_buf())
    }

    /// `podman run` of `program` in the container, in network namespace
    /// `netns` (a name under /run/netns), else in none.
    pub(crate) fn command(&self, program: &Path, netns: Option<&str>) -> Command {
        let mut cmd = podman_run();
        // The host's directory at its own path.
        let bind = |host: &Path, mode: &str| format!("--volume={0}:{0}:{mode}", host.display());
        cmd.arg(format!("--cidfile={}", self.cidfile.display()))
            .arg(format!("--name={}", self.name))
            .arg(match netns {
                Some(ns) => format!("--network=ns:/run/netns/{ns}"),
                None => "--network=none".into(),
            })
            .arg(bind(
                program.parent().expect("a program in a directory"),
                "ro",
            ));
        for (host, inside) in &self.volumes {
            cmd.arg(format!(
                "--volume={}:{}:rw",
                host.display(),
                inside.display()
            ));
        }
        cmd.arg(SIM_IMAGE).arg(program);
        cmd
    }

    /// The container's full id (podman's --cidfile), once it was started.
    pub fn id(&self) -> String {
        id_in(&self.cidfile)
    }

    pub(crate) fn cidfile(&self) -> &Path {
        &self.cidfile
    }
}

impl Drop for SimContainer {
    fn drop(&mut self) {
        // `podman run --rm` removes the container when its program ends; one
        // whose `podman run` was killed (SIGKILL: no signal passed on) is
        // still run by its conmon.
        if self.cidfile.exists() {
            let _ = Command::new("podman")
                .args(["rm", "--force", "--ignore", "--cidfile"])
                .arg(&self.cidfile)
                .output();
        }
        let _ = std::fs::remove_file(&self.cidfile);
    }
}

/// podman's API socket at its root default, `/run/podman/podman.sock`
/// (`podman system service`), for as long as this lives; one already
/// there (the `podman.socket` unit's) is used and left alone.
pub struct PodmanApi {
    service: Option<std::process::Child>,
}

impl PodmanApi {
    pub const SOCKET: &str = "/run/podman/podman.sock";

    pub fn start() -> Self {
        let socket = Path::new(Self::SOCKET);
        if std::os::unix::net::UnixStream::connect(socket).is_ok() {
            return Self { service: None };
        }
        // A file no service listens on (left by a killed run).
        let _ = std::fs::remove_file(socket);
        std::fs::create_dir_all(socket.parent().unwrap()).unwrap();
        let service = crate::util::die_with_parent(
            Command::new("podman")
                .args(["system", "service", "--time=0"])
                .arg(format!("unix://{}", Self::SOCKET)),
        )
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("podman system service");
        let api = Self {
            service: Some(service),
        };
        let started = std::time::Instant::now();
        while std::os::unix::net::UnixStream::connect(socket).is_err() {
            assert!(
                started.elapsed() < std::time::Duration::from_secs(20),
                "podman system service made no {} in 20 s",
                Self::SOCKET
            );
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        api
    }
}

impl Drop for PodmanApi {
    fn drop(&mut self) {
        if let Some(mut service) = self.service.take() {
            let _ = service.kill();
            let _ = service.wait();
            let _ = std::fs::remove_file(Self::SOCKET);
        }
    }
}

fn id_in(cidfile: &Path) -> String {
    let id = std::fs::read_to_string(cidfile)
        .unwrap_or_else(|e| panic!("{}: {e} (not started?)", cidfile.display()));
    id.trim().to_string()
}

/// The host's pid of the process the container (by its `cidfile`) numbers
/// `inside` in its own pid namespace: the one whose /proc status ends its
/// NSpid with it and whose cgroup is the container's.
pub(crate) fn host_pid(cidfile: &Path, inside: u32) -> u32 {
    let id = id_in(cidfile);
    let found = std::fs::read_dir("/proc").ok().and_then(|dir| {
        dir.flatten()
            .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
            .find(|pid| {
                let status =
                    std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
                let nspid: Vec<&str> = status
                    .lines()
                    .find_map(|l| l.strip_prefix("NSpid:"))
                    .map(|v| v.split_whitespace().collect())
                    .unwrap_or_default();
                nspid.len() >= 2
                    && nspid.last() == Some(&inside.to_string().as_str())
                    && std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
                        .is_ok_and(|c| c.contains(&id))
            })
    });
    found.unwrap_or_else(|| panic!("no process of container {id} is its pid {inside}"))
}
