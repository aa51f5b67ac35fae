//! The SQL Server workload simulator (`sim/`: `sqlservr`, `sqlclient`) run as
//! child processes, in a network namespace and a cgroup of the lab's choosing.
//!
//! Every guard here undoes what it made on drop: the watchdog and its worker
//! are stopped and waited for, the client killed.

use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

use super::Cgroup;
use crate::Bins;
use crate::container::SimContainer;

/// Where a simulator process runs: a network namespace, and a cgroup or a
/// podman container, each optional.
#[derive(Default, Clone, Copy)]
pub struct Placement<'a> {
    pub netns: Option<&'a str>,
    pub cgroup: Option<&'a Cgroup>,
    /// The process runs in this container (in `netns`): the child is
    /// `podman run`, which passes SIGTERM on.
    pub container: Option<&'a SimContainer>,
}

impl Placement<'_> {
    /// Where the process sees `host_path` (in its container's mount namespace).
    pub fn inside(&self, host_path: &Path) -> PathBuf {
        self.container
            .map_or_else(|| host_path.to_path_buf(), |c| c.inside(host_path))
    }
}

impl<'a> Placement<'a> {
    /// In network namespace `netns`, in no cgroup of its own: where most
    /// labs put the simulator or its client.
    pub fn in_netns(netns: &'a str) -> Self {
        Placement {
            netns: Some(netns),
            ..Default::default()
        }
    }

    pub(super) fn command(&self, program: &Path) -> Command {
        let mut cmd = match (self.container, self.netns) {
            (Some(container), netns) => {
                assert!(self.cgroup.is_none(), "a container has its own cgroup");
                container.command(program, netns)
            }
            // `ip netns exec` execs the program: the pid stays the same.
            (None, Some(ns)) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(program);
                c
            }
            (None, None) => Command::new(program),
        };
        // SAFETY: prctl is async-signal-safe and touches only the child.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        if let Some(cgroup) = self.cgroup {
            cgroup.enter_on_exec(&mut cmd);
        }
        cmd
    }
}

// ---- the server ---------------------------------------------------------------

/// `sqlservr`: its watchdog parent (our child) and the worker it starts.
pub struct SqlServerSim {
    watchdog: Child,
    /// The watchdog's stdout, line by line: each worker's listening line.
    lines: mpsc::Receiver<String>,
    /// The worker's pid on the host (the simulator reports its own
    /// namespace's, translated for one in a container).
    pub worker: u32,
    pub port: u16,
    /// The container's --cidfile, when it runs in one.
    cidfile: Option<PathBuf>,
    pub data: PathBuf,
    pub log: PathBuf,
    /// Its self-signed certificate (PEM), which a client verifying it needs
    /// (ODBC Driver 18 with Encrypt=strict).
    pub certificate: PathBuf,
}

/// Data and log files small enough to create in a moment (16 and 4 MiB).
pub const SMALL_FILES: &[&str] = &["--data-size-mb", "16", "--log-size-mb", "4"];

impl SqlServerSim {
    /// The simulator most labs want: in `place`, listening on a port the
    /// kernel picks (never 1433: discovery must find it), with small files
    /// `sales.mdf` and `sales_log.ldf` in `dir`, and `extra` arguments.
    pub fn start_small(bins: &Bins, place: Placement, dir: &Path, extra: &[&str]) -> Self {
        let args: Vec<&str> = SMALL_FILES.iter().chain(extra).copied().collect();
        Self::start(
            bins,
            place,
            "0.0.0.0:0",
            &dir.join("sales.mdf"),
            &dir.join("sales_log.ldf"),
            &args,
        )
    }

    /// Start it listening on `listen` (port 0: any free port, which the worker
    /// prints) with its data and log files at the given paths, and wait until
    /// it accepts connections.
    pub fn start(
        bins: &Bins,
        place: Placement,
        listen: &str,
        data: &Path,
        log: &Path,
        extra: &[&str],
    ) -> Self {
        let certificate = data.with_extension("pem");
        let mut cmd = place.command(&bins.sqlservr);
        if !extra.contains(&"--no-tls") {
            cmd.arg("--certificate-out").arg(place.inside(&certificate));
        }
        cmd.arg("--listen")
            .arg(listen)
            .arg("--data")
            .arg(place.inside(data))
            .arg("--log")
            .arg(place.inside(log))
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
            lines: rx,
            worker: 0,
            port: 0,
            cidfile: place.container.map(|c| c.cidfile().to_path_buf()),
            data: data.to_path_buf(),
            log: log.to_path_buf(),
            certificate,
        };
        sim.await_listener(Duration::from_secs(60));
        sim
    }

    /// Read the next worker's "sqlservr: worker PID listening on ADDR" line;
    /// take its pid and port.
    fn await_listener(&mut self, within: Duration) {
        let line = self.lines.recv_timeout(within).unwrap_or_else(|_| {
            panic!("sqlservr did not report a listening worker within {within:?}")
        });
        let words: Vec<&str> = line.split_whitespace().collect();
        assert!(
            words.len() == 6 && words[1] == "worker" && words[3] == "listening",
            "unexpected line from sqlservr: {line}"
        );
        let reported = words[2].parse().unwrap();
        self.worker = match &self.cidfile {
            Some(cidfile) => crate::container::host_pid(cidfile, reported),
            None => reported,
        };
        self.port = words[5].rsplit(':').next().unwrap().parse().unwrap();
    }

    /// SIGKILL the worker and wait for the watchdog to start the next one
    /// (`sqlservr --restart-worker`); `worker` and `port` become the new
    /// one's. Returns when the new worker said it listens.
    pub fn kill_worker_and_await_restart(&mut self, within: Duration) -> SystemTime {
        let old = self.worker;
        // SAFETY: kill(2) on the simulator's worker, which the watchdog reaps.
        unsafe { libc::kill(old as i32, libc::SIGKILL) };
        self.await_listener(within);
        assert_ne!(self.worker, old, "the watchdog did not start a new worker");
        SystemTime::now()
    }

    /// The watchdog's pid (`podman run`'s for a simulator in a container).
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
        let _ = std::fs::remove_file(&self.certificate);
    }
}
