//! A Debian guest that boots systemd as PID 1 on this kernel: a root
//! filesystem made by mmdebstrap from Debian's packages, booted by
//! systemd-nspawn. tests/package.rs installs stalltrace's .deb in it and
//! drives the service the way an SRE's host would (apt, systemctl, logrotate).
//!
//! The guest shares the kernel, so what the service attaches is attached to
//! this host's kernel: the test checks that it is all gone afterwards. It has
//! a network namespace of its own (`--private-network`, only loopback), so
//! its traffic stays inside it.
//!
//! The guest is removed on drop (nspawn stopped, root filesystem deleted),
//! also when the test panics.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use crate::util::{die_with_parent, unique};

/// The Debian release of the guest and of the container image.
pub const DEBIAN_SUITE: &str = "bookworm";

/// What nspawn must grant for eBPF inside: the capabilities the unit asks for
/// (nspawn's default set lacks CAP_BPF and CAP_PERFMON), and
/// the `bpf` and `perf_event_open` system calls, which nspawn's own seccomp
/// filter denies to everything the guest's systemd starts. (A process
/// nsenter(1) puts in the guest is not under that filter: `stalltrace check`
/// passes that way while the service fails with EPERM.)
const NSPAWN_CAPABILITIES: &str =
    "CAP_BPF,CAP_PERFMON,CAP_SYS_ADMIN,CAP_SYS_PTRACE,CAP_DAC_READ_SEARCH";
const NSPAWN_SYSCALLS: &str = "bpf perf_event_open";

pub struct SystemdGuest {
    root: PathBuf,
    nspawn: Child,
    /// The guest's PID 1 (its systemd), as this host numbers it.
    pub leader: u32,
}

impl SystemdGuest {
    /// Build a root filesystem with systemd and `packages` and boot it; waits
    /// until systemd reports the system running. Panics (with what nspawn
    /// printed) when it does not boot within a minute.
    pub fn boot(packages: &[&str]) -> Self {
        let name = unique("st-guest");
        let root = std::env::temp_dir().join(&name);
        let mut include = vec!["systemd", "systemd-sysv", "dbus"];
        include.extend_from_slice(packages);
        let include = format!("--include={}", include.join(","));
        let root_arg = root.to_string_lossy().into_owned();
        let built = Command::new("mmdebstrap")
            .args([
                "--quiet",
                "--variant=apt",
                &include,
                DEBIAN_SUITE,
                &root_arg,
            ])
            .output()
            .expect("mmdebstrap (run `cargo xtask setup`)");
        if !built.status.success() {
            // Hundreds of MB of a half-made root: not left behind.
            let _ = std::fs::remove_dir_all(&root);
            panic!(
                "mmdebstrap of the guest failed: {}",
                String::from_utf8_lossy(&built.stderr)
            );
        }
        let log = root.with_extension("nspawn.log");
        let nspawn = die_with_parent(&mut Command::new("systemd-nspawn"))
            .args([
                // No machined or host systemd to register with here.
                "--register=no",
                "--keep-unit",
                "--private-network",
                "--console=passive",
                "--boot",
            ])
            .arg(format!("--machine={}", &name[..name.len().min(60)]))
            .arg(format!("--capability={NSPAWN_CAPABILITIES}"))
            .arg(format!("--system-call-filter={NSPAWN_SYSCALLS}"))
            .arg("--directory")
            .arg(&root)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&log).unwrap())
            .stderr(Stdio::from(
                std::fs::File::options().append(true).open(&log).unwrap(),
            ))
            .spawn()
            .expect("systemd-nspawn (run `cargo xtask setup`: package systemd-container)");
        let mut guest = Self {
            root,
            nspawn,
            leader: 0,
        };
        guest.leader = guest.await_boot(&log);
        guest
    }

    fn await_boot(&mut self, log: &Path) -> u32 {
        let start = Instant::now();
        let mut last = String::new();
        while start.elapsed() < Duration::from_secs(60) {
            if let Ok(Some(status)) = self.nspawn.try_wait() {
                panic!(
                    "systemd-nspawn ended ({status}) before the guest booted:\n{}",
                    std::fs::read_to_string(log).unwrap_or_default()
                );
            }
            if let Some(leader) = pid_one_child_of(self.nspawn.id()) {
                self.leader = leader;
                let out = self.exec(&["systemctl", "is-system-running"]);
                last = String::from_utf8_lossy(&out.stdout).trim().to_string();
                // `degraded`: a unit of the guest's own failed (none of ours
                // exists yet); the system is up.
                if last == "running" || last == "degraded" {
                    return leader;
                }
            }
            std::thread::sleep(Duration::from_millis(250));
        }
        panic!(
            "the guest did not boot within 60 s (systemd says {last:?}):\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }

    /// Run a command in all of the guest's namespaces (as root).
    pub fn exec(&self, args: &[&str]) -> Output {
        Command::new("nsenter")
            .arg(format!("--target={}", self.leader))
            .args(["--all", "--"])
            .args(args)
            .env("DEBIAN_FRONTEND", "noninteractive")
            .output()
            .expect("nsenter")
    }

    /// Like `exec`, and panics with its output when it fails. Returns stdout.
    pub fn sh(&self, args: &[&str]) -> String {
        let out = self.exec(args);
        assert!(
            out.status.success(),
            "in the guest, {args:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// A command of this host run in the guest's network namespace only
    /// (iperf3, sockperf: tools the guest need not install).
    pub fn in_netns(&self, program: &str) -> Command {
        let mut cmd = Command::new("nsenter");
        cmd.arg(format!("--target={}", self.leader))
            .args(["--net", "--", program]);
        cmd
    }

    /// The guest's network namespace inode (the `netns` of its records).
    pub fn netns(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(format!("/proc/{}/ns/net", self.leader))
            .expect("the guest's network namespace")
            .ino()
    }

    /// A path of the guest, as this host reaches it.
    pub fn path(&self, inside: &str) -> PathBuf {
        self.root.join(inside.trim_start_matches('/'))
    }
}

impl Drop for SystemdGuest {
    fn drop(&mut self) {
        // SIGTERM asks nspawn for an orderly shutdown of the guest's systemd.
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.nspawn.id() as i32, libc::SIGTERM) };
        let start = Instant::now();
        let mut ended = false;
        while !ended && start.elapsed() < Duration::from_secs(20) {
            ended = matches!(self.nspawn.try_wait(), Ok(Some(_)));
            std::thread::sleep(Duration::from_millis(100));
        }
        if !ended {
            // nspawn killed does not take the guest with it (no machined
            // scope here): SIGKILL to the guest's PID 1, while that pid still
            // is a PID 1 of nspawn's, ends every process of its namespace.
            if pid_one_child_of(self.nspawn.id()) == Some(self.leader) {
                // SAFETY: kill(2) on the guest's PID 1, checked just above.
                unsafe { libc::kill(self.leader as i32, libc::SIGKILL) };
            }
            let _ = self.nspawn.kill();
        }
        let _ = self.nspawn.wait();
        let _ = std::fs::remove_dir_all(&self.root);
        let _ = std::fs::remove_file(self.root.with_extension("nspawn.log"));
    }
}

/// nspawn's child that is PID 1 of a PID namespace of its own: the guest's
/// systemd (before it exists, nspawn's child is still setting the guest up).
fn pid_one_child_of(nspawn: u32) -> Option<u32> {
    let children =
        std::fs::read_to_string(format!("/proc/{nspawn}/task/{nspawn}/children")).ok()?;
    children
        .split_whitespace()
        .filter_map(|p| p.parse::<u32>().ok())
        .find(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/status")).is_ok_and(|status| {
                status.lines().any(|l| {
                    l.strip_prefix("NSpid:")
                        .is_some_and(|ids| ids.split_whitespace().nth(1) == Some("1"))
                })
            })
        })
}
