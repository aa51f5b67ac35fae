//! The SQL Server lab: the workload simulator (`sim/`: `sqlservr`, `sqlclient`)
//! run as child processes, filesystems on loop devices for its files, and a
//! blkio cgroup that makes one of those devices slow.
//!
//! Every guard here undoes what it made on drop, in the order the fields are
//! declared, so a failing test leaves no process, mount, loop device or cgroup.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{LoopDevice, sh, stalltrace_bin, unique};

/// A binary of the simulator crate: cargo puts every workspace binary beside
/// `stalltrace` (`cargo xtask test` builds the whole workspace).
pub fn sim_bin(name: &str) -> PathBuf {
    let path = stalltrace_bin().with_file_name(name);
    assert!(
        path.exists(),
        "{} is missing: build the simulator (`cargo build -p stalltrace-sim`, or run `cargo xtask test`)",
        path.display()
    );
    path
}

/// Where a simulator process runs: a network namespace and a cgroup, each optional.
#[derive(Default, Clone, Copy)]
pub struct Placement<'a> {
    pub netns: Option<&'a str>,
    pub cgroup: Option<&'a Cgroup>,
}

impl Placement<'_> {
    fn command(&self, program: &Path) -> Command {
        let mut cmd = match self.netns {
            // `ip netns exec` execs the program: the pid stays the same.
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            None => Command::new(program),
        };
        // SAFETY: prctl is async-signal-safe and touches only the child.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        if let Some(cgroup) = self.cgroup {
            let procs = cgroup.procs_file();
            // SAFETY: write(2) of a static buffer is async-signal-safe; "0" is
            // the writing process itself, so the child joins before it execs.
            unsafe {
                cmd.pre_exec(move || {
                    if libc::write(procs.as_raw_fd(), b"0".as_ptr().cast(), 1) != 1 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        cmd
    }
}

// ---- the server ---------------------------------------------------------------

/// `sqlservr`: its watchdog parent (our child) and the worker it starts.
pub struct SqlServerSim {
    watchdog: Child,
    pub worker: u32,
    pub port: u16,
    pub data: PathBuf,
    pub log: PathBuf,
}

impl SqlServerSim {
    /// Start it listening on `listen` (port 0: any free port, which the worker
    /// prints) with its data and log files at the given paths, and wait until
    /// it accepts connections.
    pub fn start(place: Placement, listen: &str, data: &Path, log: &Path, extra: &[&str]) -> Self {
        let mut cmd = place.command(&sim_bin("sqlservr"));
        cmd.arg("--listen")
            .arg(listen)
            .arg("--data")
            .arg(data)
            .arg("--log")
            .arg(log)
            .args(extra)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let mut watchdog = cmd.spawn().expect("spawn sqlservr");
        let stdout = watchdog.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut sim = Self {
            watchdog,
            worker: 0,
            port: 0,
            data: data.to_path_buf(),
            log: log.to_path_buf(),
        };
        // "sqlservr: worker PID listening on ADDR"
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .unwrap_or_else(|_| panic!("sqlservr did not report its listener within 60 s"));
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(
            words.len() == 6 && words[1] == "worker" && words[3] == "listening",
            "unexpected first line from sqlservr: {line}"
        );
        sim.worker = words[2].parse().unwrap();
        sim.port = words[5].rsplit(':').next().unwrap().parse().unwrap();
        sim
    }

    pub fn watchdog_pid(&self) -> u32 {
        self.watchdog.id()
    }
}

impl Drop for SqlServerSim {
    fn drop(&mut self) {
        // SIGTERM: the watchdog passes it on and the worker closes its files.
        // SAFETY: kill(2) on our own child.
        unsafe { libc::kill(self.watchdog.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.watchdog.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.watchdog.kill();
        let _ = self.watchdog.wait();
        // The worker gets SIGTERM when the watchdog dies; wait for it to go.
        let proc = PathBuf::from(format!("/proc/{}", self.worker));
        let deadline = Instant::now() + Duration::from_secs(10);
        while proc.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        if proc.exists() {
            // SAFETY: the worker is the simulator's; it failed to exit.
            unsafe { libc::kill(self.worker as i32, libc::SIGKILL) };
        }
        let _ = std::fs::remove_file(&self.data);
        let _ = std::fs::remove_file(&self.log);
    }
}

// ---- the client ---------------------------------------------------------------

/// `sqlclient` running in the background; `finish` returns its JSON report.
pub struct SqlClientRun {
    child: Option<Child>,
}

impl SqlClientRun {
    pub fn start(place: Placement, server: &str, sessions: u32, rate: u32, secs: u32) -> Self {
        let mut cmd = place.command(&sim_bin("sqlclient"));
        cmd.args(["--server", server])
            .args(["--sessions", &sessions.to_string()])
            .args(["--rate", &rate.to_string()])
            .args(["--duration", &secs.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        Self {
            child: Some(cmd.spawn().expect("spawn sqlclient")),
        }
    }

    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().ok().flatten().is_none())
    }

    /// Wait for it to end; panic unless it succeeded.
    pub fn finish(mut self) -> ClientReport {
        let out = self.child.take().unwrap().wait_with_output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "sqlclient failed ({}): {text}",
            out.status
        );
        ClientReport(serde_json::from_str(text.trim()).expect("sqlclient's JSON report"))
    }
}

impl Drop for SqlClientRun {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// sqlclient's report: totals, latency percentiles, and per session its SPID
/// and client port.
pub struct ClientReport(pub Value);

impl ClientReport {
    pub fn transactions(&self) -> u64 {
        self.0["transactions"].as_u64().unwrap()
    }
    pub fn errors(&self) -> u64 {
        self.0["errors"].as_u64().unwrap()
    }
    pub fn p50_us(&self) -> u64 {
        self.0["p50_us"].as_u64().unwrap()
    }
    /// (client port, SPID) of each session.
    pub fn sessions(&self) -> Vec<(u16, u16)> {
        self.0["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                (
                    s["client_port"].as_u64().unwrap() as u16,
                    s["spid"].as_u64().unwrap() as u16,
                )
            })
            .collect()
    }
}

// ---- filesystems and a slow device ----------------------------------------------

/// An ext4 filesystem on a loop device, mounted on a directory of its own.
pub struct Mounted {
    pub dir: PathBuf,
    pub disk: LoopDevice,
}

impl Mounted {
    pub fn new(disk: LoopDevice) -> Self {
        // Initialised now, so no lazy-init writes from ext4lazyinit land in a test.
        sh(
            "mkfs.ext4",
            &[
                "-q",
                "-F",
                "-E",
                "lazy_itable_init=0,lazy_journal_init=0",
                &disk.dev,
            ],
        );
        let dir = std::env::temp_dir().join(unique("stalltrace-mnt"));
        std::fs::create_dir(&dir).unwrap();
        let mounted = Self { dir, disk };
        sh(
            "mount",
            &[&mounted.disk.dev, &mounted.dir.to_string_lossy()],
        );
        mounted
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        // A loop device detached from a file on this filesystem lets go of the
        // file asynchronously: busy for a moment.
        for _ in 0..100 {
            let ok = Command::new("umount")
                .arg(&self.dir)
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok || !is_mount_point(&self.dir) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn is_mount_point(dir: &Path) -> bool {
    let dir = dir.to_string_lossy();
    std::fs::read_to_string("/proc/self/mounts")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split_whitespace().nth(1) == Some(&*dir))
}

/// A blkio cgroup (cgroup v1 `blkio`, or v2 `io`) whose members' writes to a
/// device are throttled.
///
/// Why this makes a device slow as the block layer sees it: the throttle holds
/// bios before they reach a device's queue, so it is invisible on the
/// throttled device itself. Stacked under a loop device with direct I/O, whose
/// worker submits in the cgroup of the I/O it serves, the wait lands inside
/// the upper device's issue → complete time: a slow disk, as SQL Server sees one.
pub struct Cgroup {
    dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    pub fn new() -> Self {
        let v1 = Path::new("/sys/fs/cgroup/blkio");
        let v2_roots = ["/sys/fs/cgroup/unified", "/sys/fs/cgroup"];
        let (parent, v2) = if v1.join("cgroup.procs").exists() {
            (v1.to_path_buf(), false)
        } else if let Some(root) = v2_roots.iter().map(Path::new).find(|r| {
            std::fs::read_to_string(r.join("cgroup.subtree_control"))
                .is_ok_and(|c| c.split_whitespace().any(|x| x == "io"))
        }) {
            (root.to_path_buf(), true)
        } else {
            panic!("no blkio (v1) or io (v2) cgroup controller to throttle a device with");
        };
        let dir = parent.join(unique("stalltrace-test"));
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        Self { dir, v2 }
    }

    fn procs_file(&self) -> File {
        std::fs::OpenOptions::new()
            .write(true)
            .open(self.dir.join("cgroup.procs"))
            .unwrap()
    }

    /// Allow the members at most `iops` writes per second to `disk`.
    pub fn limit_write_iops(&self, disk: &LoopDevice, iops: u32) {
        let (file, value) = if self.v2 {
            (
                "io.max",
                format!("{}:{} wiops={iops}", disk.major, disk.minor),
            )
        } else {
            (
                "blkio.throttle.write_iops_device",
                format!("{}:{} {iops}", disk.major, disk.minor),
            )
        };
        std::fs::write(self.dir.join(file), &value)
            .unwrap_or_else(|e| panic!("writing {value} to {file}: {e}"));
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        // Empty once its processes are gone (the guards declared after it).
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A slow disk for SQL Server's log: ext4 on a loop device (direct I/O) whose
/// backing file lives on a second, throttled loop device.
pub struct SlowDisk {
    pub upper: Mounted,
    pub lower: Mounted,
}

impl SlowDisk {
    pub fn new(size_mib: u32) -> Self {
        let lower = Mounted::new(LoopDevice::new(super::Backing::Tmpfs, size_mib * 2, false));
        let upper = Mounted::new(LoopDevice::new_in(&lower.dir, size_mib, true));
        Self { upper, lower }
    }

    /// Throttle the lower device for the cgroup's processes.
    pub fn slow_down(&self, cgroup: &Cgroup, write_iops: u32) {
        cgroup.limit_write_iops(&self.lower.disk, write_iops);
    }
}
