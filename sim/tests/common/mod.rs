//! Test harness: a `sqlservr` (watchdog + worker) on 127.0.0.1 with a free
//! port and its files in a fresh directory, stopped and removed on drop, so a
//! failing test leaves nothing behind.

#![allow(dead_code)] // each test file uses a different part

pub mod pcap;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

pub struct Server {
    pub child: Child,
    /// The watchdog (the process we started).
    pub parent: u32,
    /// The worker, from its "listening" line.
    pub worker: u32,
    pub port: u16,
    pub dir: PathBuf,
    pub data: PathBuf,
    pub log: PathBuf,
}

/// A directory for this test's files: on /var/tmp (a disk filesystem, so
/// O_DIRECT works; tmpfs would too on 6.18) with a unique name.
pub fn test_dir(name: &str) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    let base = if Path::new("/var/tmp").is_dir() {
        PathBuf::from("/var/tmp")
    } else {
        std::env::temp_dir()
    };
    let dir = base.join(format!(
        "stalltrace-sim-{name}-{}-{nanos}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

impl Server {
    pub fn start(name: &str) -> Server {
        Server::start_with(name, &[], &[])
    }

    /// With more arguments and environment variables (TLS options, SSLKEYLOGFILE).
    pub fn start_with(name: &str, args: &[&str], envs: &[(&str, &Path)]) -> Server {
        let dir = test_dir(name);
        let (data, log) = (dir.join("stalltrace.mdf"), dir.join("stalltrace_log.ldf"));
        let child = Command::new(env!("CARGO_BIN_EXE_sqlservr"))
            .args(args)
            .envs(envs.iter().copied())
            .args([
                "--listen",
                "127.0.0.1:0",
                "--data-size-mb",
                "16",
                "--log-size-mb",
                "8",
            ])
            .arg("--data")
            .arg(&data)
            .arg("--log")
            .arg(&log)
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting sqlservr");
        let parent = child.id();
        // From here on a panic drops the guard, which stops the processes.
        let mut guard = Server {
            child,
            parent,
            worker: 0,
            port: 0,
            dir,
            data,
            log,
        };
        let stdout = guard.child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        // Keeps draining stdout for the server's whole life.
        thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let line = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("sqlservr did not report listening");
        // "sqlservr: worker PID listening on ADDR:PORT"
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(&words[..2], &["sqlservr:", "worker"], "{line}");
        guard.worker = words[2].parse().expect(&line);
        guard.port = words[5].rsplit(':').next().unwrap().parse().expect(&line);
        guard
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGTERM to the watchdog; its exit status once it has gone.
    pub fn terminate(&mut self, within: Duration) -> Option<ExitStatus> {
        signal(self.parent, libc::SIGTERM);
        wait_timeout(&mut self.child, within)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            signal(self.parent, libc::SIGTERM);
            if wait_timeout(&mut self.child, Duration::from_secs(10)).is_none() {
                signal(self.parent, libc::SIGKILL);
                let _ = self.child.wait();
            }
        }
        // The worker dies with its watchdog (PR_SET_PDEATHSIG); make sure,
        // but only if that pid is still our sqlservr.
        if self.worker != 0 && comm(self.worker).as_deref() == Some("sqlservr") {
            signal(self.worker, libc::SIGKILL);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) on a pid we started.
    unsafe {
        libc::kill(pid as i32, sig);
    }
}

pub fn wait_timeout(child: &mut Child, within: Duration) -> Option<ExitStatus> {
    let end = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().ok().flatten() {
            return Some(st);
        }
        if Instant::now() >= end {
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// /proc/PID/comm without the newline; None if the process is gone.
pub fn comm(pid: u32) -> Option<String> {
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .ok()
        .map(|s| s.trim_end().to_string())
}

/// Whether the process exists and is not a zombie (an orphan's zombie may
/// wait for a reaper that never comes in a container).
pub fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rfind(')')
                .and_then(|i| s[i + 1..].split_whitespace().next().map(|st| st != "Z"))
        })
        .unwrap_or(false)
}
