//! Running things inside a namespace of the lab: commands, background
//! processes (killed on drop, and with the lab's process), threads that enter
//! the namespace, and the TCP reachability check. The free functions take a
//! namespace name; `NetPair` and `Switch` wrap them per side or host.

use std::marker::PhantomData;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{Family, NetPair, Side};
use crate::util::{die_with_parent, unique};

/// `ip netns exec NS args...`, ready to run.
pub fn command_in(netns: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", netns]).args(args);
    cmd
}

/// Run a command inside `netns` and return whatever it did.
pub fn exec_output_in(netns: &str, args: &[&str]) -> Output {
    command_in(netns, args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run ip netns exec {args:?}: {e}"))
}

/// Run a command inside `netns`; panic with its stderr if it fails. Returns stdout.
pub fn exec_in(netns: &str, args: &[&str]) -> String {
    try_exec_in(netns, args).unwrap_or_else(|e| panic!("{e:#}"))
}

/// Run a command inside `netns`; its stdout, or an error with its stderr.
pub fn try_exec_in(netns: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = command_in(netns, args)
        .output()
        .with_context(|| format!("cannot run ip netns exec {netns} {args:?}"))?;
    if !out.status.success() {
        bail!(
            "{args:?} in {netns} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stderr),
            String::from_utf8_lossy(&out.stdout),
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Start a long-running command inside `netns`, owned by `_owner` (the guard
/// of the namespace: the process cannot outlive it). See `NetPair::spawn`.
pub fn spawn_in<'a, T>(owner: &'a T, netns: &str, args: &[&str]) -> Background<'a> {
    spawn_with(owner, netns, args, |_| {})
}

/// `spawn_in`, with `configure` to adjust the command first (e.g. to put it
/// in a cgroup).
pub fn spawn_with<'a, T>(
    owner: &'a T,
    netns: &str,
    args: &[&str],
    configure: impl FnOnce(&mut Command),
) -> Background<'a> {
    try_spawn_with(owner, netns, args, &std::env::temp_dir(), configure)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

/// `spawn_with`, its output in a file of `log_dir` (removed on drop), for a
/// caller that reports failures itself. The bench keeps its servers' logs
/// on tmpfs, where writing them costs no disk I/O during its runs.
pub fn try_spawn_with<'a, T>(
    _owner: &'a T,
    netns: &str,
    args: &[&str],
    log_dir: &Path,
    configure: impl FnOnce(&mut Command),
) -> anyhow::Result<Background<'a>> {
    let log = log_dir.join(format!("{}.log", unique("stalltrace-netlab")));
    let file =
        std::fs::File::create(&log).with_context(|| format!("cannot create {}", log.display()))?;
    let mut cmd = command_in(netns, args);
    cmd.stdin(Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file);
    // `ip netns exec` execs the command in place, so the signal reaches it.
    die_with_parent(&mut cmd);
    configure(&mut cmd);
    let what = format!("{args:?} in {netns}");
    let child = match cmd.spawn() {
        Ok(child) => child,
        Err(e) => {
            // No guard yet to remove the log.
            let _ = std::fs::remove_file(&log);
            bail!("cannot spawn {what}: {e}");
        }
    };
    Ok(Background {
        child,
        log,
        what,
        _owner: PhantomData,
    })
}

/// Run `f` on a thread that has entered `netns` (setns affects only that
/// thread). Sockets made inside stay in that namespace wherever they are used
/// afterwards.
pub fn in_netns_named<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> T {
    try_in_netns_named(netns, f).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `in_netns_named`, an error if the namespace cannot be entered.
pub fn try_in_netns_named<T: Send>(netns: &str, f: impl FnOnce() -> T + Send) -> anyhow::Result<T> {
    let path = format!("/run/netns/{netns}");
    let ns = std::fs::File::open(&path).with_context(|| format!("cannot open {path}"))?;
    std::thread::scope(|s| {
        let thread = s.spawn(|| {
            // SAFETY: setns on a descriptor we own, for this thread only.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            if rc != 0 {
                bail!("setns {path}: {}", std::io::Error::last_os_error());
            }
            Ok(f())
        });
        thread
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e))
    })
}

/// Wait until something listens on TCP `port` in `netns`; panic with the
/// server's log if it exits or 10 s pass first.
pub fn wait_listening_in(netns: &str, port: u16, server: &mut Background) {
    try_wait_listening_in(netns, port, server).unwrap_or_else(|e| panic!("{e:#}"))
}

/// `wait_listening_in`, an error with the server's log instead of a panic.
pub(crate) fn try_wait_listening_in(
    netns: &str,
    port: u16,
    server: &mut Background,
) -> anyhow::Result<()> {
    let filter = format!(":{port}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = try_exec_in(netns, &["ss", "-Hltn", "sport", "=", &filter])?;
        if !out.trim().is_empty() {
            return Ok(());
        }
        if !server.is_running() {
            bail!("{} exited before listening: {}", server.what, server.log());
        }
        if Instant::now() >= deadline {
            bail!(
                "{} not listening on {port} after 10 s: {}",
                server.what,
                server.log()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl NetPair {
    /// `ip netns exec NS args...`, ready to run.
    pub fn command(&self, side: Side, args: &[&str]) -> Command {
        command_in(self.netns(side), args)
    }

    /// Run a command inside a side and return whatever it did.
    pub fn exec_output(&self, side: Side, args: &[&str]) -> Output {
        exec_output_in(self.netns(side), args)
    }

    /// Run a command inside a side; panic with its stderr if it fails. Returns stdout.
    pub fn exec(&self, side: Side, args: &[&str]) -> String {
        exec_in(self.netns(side), args)
    }

    /// Run a command inside a side; its stdout, or an error with its stderr.
    pub fn try_exec(&self, side: Side, args: &[&str]) -> anyhow::Result<String> {
        try_exec_in(self.netns(side), args)
    }

    /// Start a long-running command inside a side. The guard kills it on drop; it
    /// borrows the pair so it cannot outlive the namespace it runs in. The child
    /// also dies with the thread that spawned it (PR_SET_PDEATHSIG), so a test
    /// process killed outright leaves no server behind; spawn from the thread
    /// that keeps the guard (not inside `in_netns` or a short-lived thread).
    pub fn spawn(&self, side: Side, args: &[&str]) -> Background<'_> {
        spawn_in(self, self.netns(side), args)
    }

    /// Run `f` on a thread that has entered the side's namespace (setns affects
    /// only that thread). Sockets made inside stay in that namespace wherever
    /// they are used afterwards.
    pub fn in_netns<T: Send>(&self, side: Side, f: impl FnOnce() -> T + Send) -> T {
        in_netns_named(self.netns(side), f)
    }

    /// `in_netns`, an error if the namespace cannot be entered.
    pub fn try_in_netns<T: Send>(
        &self,
        side: Side,
        f: impl FnOnce() -> T + Send,
    ) -> anyhow::Result<T> {
        try_in_netns_named(self.netns(side), f)
    }

    /// The reachability check (there is no `ping` here): a TCP handshake from
    /// `from` to a listener on the peer's address. Returns how long it took;
    /// panics if it does not complete within 5 s.
    pub fn tcp_ping(&self, from: Side, family: Family) -> Duration {
        self.try_tcp_ping(from, family)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// `tcp_ping`, an error if there is no handshake within 5 s.
    pub fn try_tcp_ping(&self, from: Side, family: Family) -> anyhow::Result<Duration> {
        let to = from.peer();
        let addr = SocketAddr::new(self.addr(to, family), 0);
        let listener = self
            .try_in_netns(to, || TcpListener::bind(addr))?
            .with_context(|| format!("bind {addr} in {to:?}"))?;
        let target = listener.local_addr()?;
        self.try_in_netns(from, || {
            let start = Instant::now();
            TcpStream::connect_timeout(&target, Duration::from_secs(5))
                .with_context(|| format!("no TCP handshake {target} from {from:?}"))?;
            Ok(start.elapsed())
        })?
    }

    /// Wait until something listens on TCP `port` in `side`; panic with the
    /// server's log if it exits or 10 s pass first.
    pub(crate) fn wait_listening(&self, side: Side, port: u16, server: &mut Background) {
        wait_listening_in(self.netns(side), port, server)
    }
}

/// A process running inside a namespace of the lab, killed (and reaped) on drop.
pub struct Background<'a> {
    child: Child,
    log: PathBuf,
    what: String,
    _owner: PhantomData<&'a ()>,
}

impl Background<'_> {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().unwrap().is_none()
    }

    /// Wait for it to end (at most `timeout`); its exit status, or None if it
    /// still runs.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Its stdout and stderr so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The last lines of its log on one line, for an error message.
    pub fn log_tail(&self) -> String {
        let log = self.log();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(5)..].join(" / ")
    }

    /// What it is: `["iperf3", "-s", ...] in NS`.
    pub fn what(&self) -> &str {
        &self.what
    }
}

impl Drop for Background<'_> {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.log);
    }
}
