//! Real rsyslogd instances (Debian's package) shipping a tracer's `--out`
//! file, as a host would: a forwarder whose imfile tails the file and sends
//! each line over TCP (omfwd, loopback) to a receiver whose imtcp writes each
//! message's text, and nothing else, to a file.
//!
//! Each instance has its own configuration, work directory, pid file and
//! log, loads no imuxsock or imjournal and sends its own messages to its own
//! log (`processInternalMessages`), so it never reads or writes the host's
//! syslog. Both are stopped, and their directory removed, on drop, also when
//! a test panics. `maxMessageSize` is left at rsyslog's default on purpose:
//! the point is what a stock rsyslog does with stalltrace's lines.
//!
//! The configuration a user installs (docs/shipping.md) is what
//! [`forwarder_config`] and [`receiver_config`] write; the instance-only
//! settings (work directory, own log) are added around it here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::prometheus::free_port;
use crate::util::die_with_parent;

/// rsyslog's default `maxMessageSize`: its documentation says "8k", its
/// code (runtime/glbl.c, `iMaxLine`) says 8096 bytes, and that is what the
/// forwarder checks a line read by imfile against, and what omfwd cuts the
/// message it sends (header and line together) to, without a word.
pub const DEFAULT_MAX_MESSAGE_SIZE: usize = 8096;

/// How imfile notices that the file was written to, truncated or replaced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Follow {
    /// inotify: new lines are read within milliseconds, so imfile is never far
    /// behind when logrotate's copytruncate truncates the file, and a rename
    /// made by the writer itself between two lines (`--out-max-mb`) is
    /// followed. rsyslog 8.2302 drops a renamed file at once, though: lines
    /// the writer adds to it before it reopens (logrotate's create, then
    /// SIGHUP) are never read. Rare with stalltrace's bursts of writes, but
    /// not never (docs/shipping.md).
    Inotify,
    /// Polling every `secs`: imfile keeps reading the renamed file to its
    /// end and switches to the new one only at its next poll, normally long
    /// after the SIGHUP has made the writer reopen (logrotate's create). Up to
    /// `secs` behind, so no match for copytruncate.
    Polling { secs: u32 },
}

/// The forwarder's configuration, as installed in /etc/rsyslog.d/: imfile
/// tails `file`, one line one message, and omfwd sends each to
/// `target:port` over TCP as RFC 5424 with octet-counted framing, so the
/// receiver's `msg` is the line exactly (no header parsing guesses, no
/// leading space), and a queue holds the lines while the receiver is away.
pub fn forwarder_config(file: &Path, target: &str, port: u16, follow: Follow) -> String {
    let module = match follow {
        Follow::Inotify => r#"module(load="imfile" mode="inotify")"#.to_string(),
        Follow::Polling { secs } => {
            format!(r#"module(load="imfile" mode="polling" pollingInterval="{secs}")"#)
        }
    };
    format!(
        r#"# stalltrace: ship each JSON line of the --out file, whole, to the log host.
{module}
input(type="imfile"
      file="{file}"
      tag="stalltrace"
      ruleset="stalltrace_ship"
      # one line, one message: a JSON record never spans lines
      readMode="0"
      # logrotate's copytruncate: read the file again from its start
      reopenOnTruncate="on")
ruleset(name="stalltrace_ship") {{
  action(type="omfwd"
         target="{target}" port="{port}" protocol="tcp"
         tcp_framing="octet-counted"
         template="RSYSLOG_SyslogProtocol23Format"
         queue.type="LinkedList"
         action.resumeRetryCount="-1")
  stop
}}
"#,
        file = file.display(),
    )
}

/// The receiver's configuration, as installed on the log host: imtcp on
/// `port` (of every address, or of `address` only) with a ruleset of its
/// own, which writes each message's text (the stalltrace line, exactly) to
/// `out`, one per line.
pub fn receiver_config(address: Option<&str>, port: u16, out: &Path) -> String {
    let address = address.map_or(String::new(), |a| format!(r#" address="{a}""#));
    format!(
        r#"# stalltrace: JSON lines shipped by the hosts' forwarders, one file.
module(load="imtcp")
input(type="imtcp"{address} port="{port}" ruleset="stalltrace_receive")
template(name="stalltrace_line" type="string" string="%msg%\n")
ruleset(name="stalltrace_receive") {{
  action(type="omfile" file="{out}" template="stalltrace_line")
  stop
}}
"#,
        out = out.display(),
    )
}

/// Where a program is: on PATH, or in the sbin directories a non-login root
/// shell may not have on it.
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|dir| dir.join(name))
        .find(|p| p.is_file())
}

/// One rsyslogd of a test's own, in the foreground (`-n`), with its own
/// configuration, pid file and work directory under `dir`.
pub struct Rsyslogd {
    child: Option<Child>,
    log: PathBuf,
    stderr: PathBuf,
}

impl Rsyslogd {
    /// Validates the configuration (`rsyslogd -N1`), starts the daemon and
    /// waits for its start message. `config` is what a user would install;
    /// this adds the instance's work directory and its own log.
    pub fn start(dir: &Path, role: &str, config: &str) -> Self {
        let rsyslogd = find_program("rsyslogd")
            .expect("rsyslogd is not installed (`cargo xtask setup` installs rsyslog)");
        let work = dir.join(format!("{role}-work"));
        std::fs::create_dir_all(&work).unwrap();
        let log = dir.join(format!("{role}-rsyslogd.log"));
        let conf = dir.join(format!("{role}.conf"));
        let mut text = String::new();
        writeln!(
            text,
            // Its own messages go through its own rules (the last line below),
            // never to the host's /dev/log, which rsyslogd uses by default.
            r#"global(workDirectory="{}" processInternalMessages="on")"#,
            work.display()
        )
        .unwrap();
        text.push_str(config);
        writeln!(text, r#"action(type="omfile" file="{}")"#, log.display()).unwrap();
        std::fs::write(&conf, &text).unwrap();

        let check = Command::new(&rsyslogd)
            .arg("-N1")
            .arg("-f")
            .arg(&conf)
            .output()
            .unwrap();
        assert!(
            check.status.success(),
            "rsyslogd -N1 rejects the {role} configuration: {}{}\n{text}",
            String::from_utf8_lossy(&check.stdout),
            String::from_utf8_lossy(&check.stderr)
        );

        let stderr = dir.join(format!("{role}-rsyslogd.stderr"));
        let child = die_with_parent(&mut Command::new(&rsyslogd))
            .arg("-n")
            .arg("-f")
            .arg(&conf)
            .arg("-i")
            .arg(dir.join(format!("{role}.pid")))
            // Not a systemd service: no readiness notification to anyone's socket.
            .env_remove("NOTIFY_SOCKET")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start rsyslogd: {e}"));
        let mut daemon = Self {
            child: Some(child),
            log,
            stderr,
        };
        daemon.wait_for_log(r#"swVersion="#, "its start message");
        daemon
    }

    /// Its own messages so far (start, errors, warnings).
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn wait_for_log(&mut self, needle: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.log().contains(needle) {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "rsyslogd exited ({status}) before {what}: {}{}",
                    self.log(),
                    std::fs::read_to_string(&self.stderr).unwrap_or_default()
                );
            }
            assert!(
                Instant::now() < deadline,
                "rsyslogd: no {what} within 20 s: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Whether it still runs.
    pub fn running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| c.try_wait().unwrap().is_none())
    }

    /// SIGTERM (rsyslogd flushes its queues and removes its pid file), then
    /// SIGKILL if it is still there 5 s later.
    pub fn stop(&mut self) {
        let Some(mut child) = self.child.take() else {
            return;
        };
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Rsyslogd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Whether something listens on 127.0.0.1:`port` (the kernel's own table:
/// a connection to find out would be a session the receiver logs).
fn listening(port: u16) -> bool {
    let wanted = format!("0100007F:{port:04X}");
    std::fs::read_to_string("/proc/net/tcp")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .any(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            fields.len() > 3 && fields[3] == "0A" && fields[1] == wanted
        })
}

/// The two instances: the forwarder tailing `tailed`, the receiver writing
/// what arrives to `received()`.
pub struct Shipping {
    pub forwarder: Rsyslogd,
    pub receiver: Rsyslogd,
    received: PathBuf,
    dir: PathBuf,
}

impl Shipping {
    /// Starts the receiver on a free loopback port, then the forwarder,
    /// both with their files in a new directory `dir` (removed on drop).
    /// `tailed` need not exist yet: imfile picks it up when it appears.
    pub fn start(dir: &Path, tailed: &Path, follow: Follow) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let received = dir.join("received.jsonl");
        let port = free_port();
        // Loopback only: nothing outside the host reaches a test's receiver.
        let receiver = Rsyslogd::start(
            dir,
            "receiver",
            &receiver_config(Some("127.0.0.1"), port, &received),
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while !listening(port) {
            assert!(
                Instant::now() < deadline,
                "the receiver does not listen on port {port}: {}",
                receiver.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        let forwarder = Rsyslogd::start(
            dir,
            "forwarder",
            &forwarder_config(tailed, "127.0.0.1", port, follow),
        );
        Self {
            forwarder,
            receiver,
            received,
            dir: dir.to_path_buf(),
        }
    }

    /// What the receiver has written so far, whole lines only.
    pub fn received(&self) -> String {
        let mut text = std::fs::read_to_string(&self.received).unwrap_or_default();
        text.truncate(text.rfind('\n').map_or(0, |i| i + 1));
        text
    }

    /// Waits until what was received satisfies `done` and has not grown for
    /// `quiet` (the forwarder has nothing more on its way); returns it.
    pub fn wait_drained(
        &mut self,
        timeout: Duration,
        quiet: Duration,
        done: impl Fn(&str) -> bool,
    ) -> String {
        let deadline = Instant::now() + timeout;
        let mut last = String::new();
        let mut unchanged_since = Instant::now();
        loop {
            let now = self.received();
            if now.len() != last.len() {
                last = now;
                unchanged_since = Instant::now();
            } else if done(&last) && unchanged_since.elapsed() >= quiet {
                return last;
            }
            assert!(
                self.forwarder.running() && self.receiver.running(),
                "an rsyslogd exited: forwarder: {}\nreceiver: {}",
                self.forwarder.log(),
                self.receiver.log()
            );
            assert!(
                Instant::now() < deadline,
                "the receiver did not get everything within {timeout:?} ({} lines so far); \
                 forwarder: {}\nreceiver: {}",
                last.lines().count(),
                self.forwarder.log(),
                self.receiver.log()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Shipping {
    fn drop(&mut self) {
        // The forwarder first, so the receiver takes what it still sends;
        // both before their directory goes.
        self.forwarder.stop();
        self.receiver.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
