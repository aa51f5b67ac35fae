//! The workload's clients, run in the background where a lab places them:
//! the simulator's `sqlclient` (cleartext, or TLS in each of TDS's modes),
//! Microsoft's ODBC Driver 18 through `sim/odbc/odbcload.py` (mssql-python),
//! and FreeTDS's `tsql`. Each reports, per session, its client port (from
//! the kernel) and the SPID the server gave it, which the tests match to
//! what stalltrace saw.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Placement;
use crate::Bins;

/// The mssql-python release whose bundled ODBC Driver 18 (18.6) the lab
/// runs, in the virtual environment `cargo xtask setup` installs it in.
pub const MSSQL_PYTHON: &str = "1.16.0";

/// Microsoft's ODBC Driver 18, as mssql-python bundles it.
#[derive(Clone, Debug)]
pub struct Odbc {
    pub python: PathBuf,
    pub script: PathBuf,
}

impl Odbc {
    /// The project's virtual environment (under ~/.cache/stalltrace).
    pub fn venv() -> PathBuf {
        let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
        Path::new(&home)
            .join(".cache/stalltrace")
            .join(format!("mssql-python-{MSSQL_PYTHON}"))
    }

    /// The installed driver and the load script; panics naming the fix when missing.
    pub fn installed() -> Self {
        let odbc = Self {
            python: std::env::var_os("STALLTRACE_ODBC_PYTHON")
                .map_or_else(|| Self::venv().join("bin/python"), PathBuf::from),
            script: Path::new(env!("CARGO_MANIFEST_DIR")).join("../sim/odbc/odbcload.py"),
        };
        assert!(
            odbc.python.exists(),
            "{} is missing: `cargo xtask setup` installs mssql-python {MSSQL_PYTHON} there",
            odbc.python.display()
        );
        assert!(odbc.script.exists(), "{} is missing", odbc.script.display());
        odbc
    }
}

/// A workload client running in the background; `finish` returns its JSON report.
pub struct SqlClientRun {
    child: Option<Child>,
    /// Who it is, for messages.
    what: String,
}

impl SqlClientRun {
    /// `sqlclient`, cleartext (it offers no encryption, as older drivers could).
    pub fn start(
        bins: &Bins,
        place: Placement,
        server: &str,
        sessions: u32,
        rate: u32,
        secs: u32,
    ) -> Self {
        Self::sqlclient(bins, place, server, "not-supported", sessions, rate, secs)
    }

    /// `sqlclient --encrypt MODE` (`not-supported`, `off`, `on`, `strict`).
    pub fn sqlclient(
        bins: &Bins,
        place: Placement,
        server: &str,
        encrypt: &str,
        sessions: u32,
        rate: u32,
        secs: u32,
    ) -> Self {
        let args = ["--encrypt", encrypt];
        Self::sqlclient_with(bins, place, server, &args, [sessions, rate, secs])
    }

    /// `sqlclient --encrypt MODE --mars` at `[sessions, rate, secs]`: each
    /// request on two MARS sessions of its connection at once.
    pub fn sqlclient_mars(
        bins: &Bins,
        place: Placement,
        server: &str,
        encrypt: &str,
        load: [u32; 3],
    ) -> Self {
        let args = ["--encrypt", encrypt, "--mars"];
        Self::sqlclient_with(bins, place, server, &args, load)
    }

    /// `sqlclient` with `args`, at `[sessions, rate, secs]`.
    pub fn sqlclient_with(
        bins: &Bins,
        place: Placement,
        server: &str,
        args: &[&str],
        [sessions, rate, secs]: [u32; 3],
    ) -> Self {
        let mut cmd = place.command(&bins.sqlclient);
        cmd.args(["--server", server]).args(args);
        let what = format!("sqlclient {}", args.join(" "));
        Self::spawn(cmd, what, sessions, rate, secs)
    }

    /// ODBC Driver 18 with `Encrypt=MODE` (`yes`, its default; `strict`;
    /// `optional`; `no`) to the simulator `sim`, at `server` as the client
    /// reaches it.
    #[allow(clippy::too_many_arguments)]
    pub fn odbc(
        odbc: &Odbc,
        place: Placement,
        sim: &super::SqlServerSim,
        server: &str,
        encrypt: &str,
        sessions: u32,
        rate: u32,
        secs: u32,
    ) -> Self {
        let cmd = Self::odbc_command(odbc, place, sim, server, encrypt);
        let what = format!("ODBC Driver 18 Encrypt={encrypt}");
        Self::spawn(cmd, what, sessions, rate, secs)
    }

    /// ODBC Driver 18 with its default `Encrypt=yes` and MARS on for each
    /// connection, at `[sessions, rate, secs]`.
    pub fn odbc_mars(
        odbc: &Odbc,
        place: Placement,
        sim: &super::SqlServerSim,
        server: &str,
        [sessions, rate, secs]: [u32; 3],
    ) -> Self {
        let mut cmd = Self::odbc_command(odbc, place, sim, server, "yes");
        cmd.arg("--mars");
        let what = "ODBC Driver 18 Encrypt=yes with MARS".to_string();
        Self::spawn(cmd, what, sessions, rate, secs)
    }

    fn odbc_command(
        odbc: &Odbc,
        place: Placement,
        sim: &super::SqlServerSim,
        server: &str,
        encrypt: &str,
    ) -> std::process::Command {
        let mut cmd = place.command(&odbc.python);
        cmd.arg(&odbc.script)
            .args(["--server", server, "--encrypt", encrypt])
            // Strict verifies it whatever TrustServerCertificate says.
            .arg("--server-certificate")
            .arg(&sim.certificate);
        cmd
    }

    fn spawn(
        mut cmd: std::process::Command,
        what: String,
        sessions: u32,
        rate: u32,
        secs: u32,
    ) -> Self {
        cmd.args(["--sessions", &sessions.to_string()])
            .args(["--rate", &rate.to_string()])
            .args(["--duration", &secs.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        let child = cmd.spawn().unwrap_or_else(|e| panic!("spawn {what}: {e}"));
        Self {
            child: Some(child),
            what,
        }
    }

    /// Wait until the server side of `pair` has `n` established connections on
    /// `port`; panics when this client ends first or after `within`.
    pub fn wait_for_sessions(
        &mut self,
        pair: &crate::net::NetPair,
        port: u16,
        n: usize,
        within: Duration,
    ) {
        self.wait_for_segments(pair, port, n, 0, within);
    }

    /// Wait until `n` sessions on `port` are past their login and querying
    /// (`LOGGED_IN_SEGS`): loss begun before would hit the login's first
    /// answer, which no request's timing covers.
    pub fn wait_for_logins(
        &mut self,
        pair: &crate::net::NetPair,
        port: u16,
        n: usize,
        within: Duration,
    ) {
        self.wait_for_segments(pair, port, n, LOGGED_IN_SEGS, within);
    }

    fn wait_for_segments(
        &mut self,
        pair: &crate::net::NetPair,
        port: u16,
        n: usize,
        segments: u64,
        within: Duration,
    ) {
        let deadline = Instant::now() + within;
        loop {
            let now = segments_in(pair, port);
            if now.values().filter(|&&s| s >= segments).count() >= n {
                return;
            }
            assert!(self.is_running(), "{} ended early", self.what);
            assert!(
                Instant::now() < deadline,
                "{n} sessions did not reach {segments} data segments in within {within:?}: {now:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
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
            "{} failed ({}): {text}",
            self.what,
            out.status
        );
        let report = serde_json::from_str(text.trim())
            .unwrap_or_else(|e| panic!("{}'s JSON report ({e}): {text}", self.what));
        ClientReport(report)
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

/// A client's report: totals, latency percentiles, and per session its SPID
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
    /// (client port, SPID) of each session: the SPID `SELECT @@SPID` answered
    /// where the client asked (`spid_selected`, or an ODBC client's `spid`),
    /// else the one in its LOGINACK's header.
    pub fn sessions(&self) -> Vec<(u16, u16)> {
        self.0["sessions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let spid = s["spid_selected"].as_u64().or(s["spid"].as_u64());
                (
                    s["client_port"].as_u64().unwrap() as u16,
                    spid.expect("a session's SPID") as u16,
                )
            })
            .collect()
    }
}

/// FreeTDS's `tsql`, logged in with `encryption = require` (TLS for the
/// whole session), asking `SELECT @@SPID` and then a query at a steady rate.
pub struct FreeTds {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: mpsc::Receiver<String>,
    conf: PathBuf,
    pub spid: u16,
    pub client_port: u16,
}

impl FreeTds {
    /// Log in to `host:port` from `place` (a network namespace) and learn the
    /// session's SPID and client port.
    pub fn login(place: Placement, netns: &str, host: &str, port: u16) -> Self {
        let conf = std::env::temp_dir().join(crate::unique("freetds.conf"));
        std::fs::write(
            &conf,
            format!(
                "[global]\n\ttds version = 7.4\n\tencryption = require\n\n[sim]\n\thost = {host}\n\tport = {port}\n"
            ),
        )
        .expect("writing freetds.conf");
        // tsql's stdio buffers a pipe whole until it exits: line-buffer it.
        // (stdbuf execs tsql: the same pid, which ss names.)
        let mut cmd = place.command(Path::new("stdbuf"));
        cmd.args(["-oL", "tsql", "-S", "sim", "-U", "stalltrace", "-P", "x"])
            .env("FREETDSCONF", &conf)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = cmd
            .spawn()
            .expect("spawn tsql (FreeTDS; cargo xtask setup installs freetds-bin)");
        let (tx, lines) = mpsc::channel();
        for out in [
            Box::new(child.stdout.take().unwrap()) as Box<dyn std::io::Read + Send>,
            Box::new(child.stderr.take().unwrap()),
        ] {
            let tx = tx.clone();
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if tx.send(line).is_err() {
                        break;
                    }
                }
            });
        }
        let mut me = Self {
            stdin: child.stdin.take(),
            child,
            lines,
            conf,
            spid: 0,
            client_port: 0,
        };
        me.send("SELECT @@SPID\ngo\n");
        me.spid = me.await_number(Duration::from_secs(30));
        me.client_port = crate::net::exec_in(
            netns,
            &[
                "ss",
                "-Htnp",
                "state",
                "established",
                &format!("( dport = :{port} )"),
            ],
        )
        .lines()
        .find(|l| l.contains(&format!("pid={},", me.child.id())))
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|local| local.rsplit(':').next()?.parse().ok())
        .expect("tsql's connection in ss");
        me
    }

    fn send(&mut self, text: &str) {
        let stdin = self.stdin.as_mut().expect("tsql's stdin");
        stdin
            .write_all(text.as_bytes())
            .and_then(|()| stdin.flush())
            .expect("writing to tsql");
    }

    /// The first line that is a number alone: a one-row, one-column result.
    fn await_number(&mut self, within: Duration) -> u16 {
        let deadline = Instant::now() + within;
        let mut seen = Vec::new();
        while let Ok(line) = self
            .lines
            .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        {
            if let Ok(n) = line.trim().parse() {
                return n;
            }
            seen.push(line);
        }
        panic!("tsql printed no SPID within {within:?}: {seen:?}");
    }

    /// Run `SELECT 1` every `every` for `secs`; returns how many answered.
    pub fn run_queries(&mut self, every: Duration, secs: u32) -> u64 {
        let until = Instant::now() + Duration::from_secs(secs.into());
        let mut answered = 0;
        while Instant::now() < until {
            self.send("SELECT 1\ngo\n");
            answered += u64::from(self.await_number(Duration::from_secs(30)) == 1);
            std::thread::sleep(every);
        }
        answered
    }
}

impl Drop for FreeTds {
    fn drop(&mut self) {
        drop(self.stdin.take()); // EOF: tsql logs out and exits
        let deadline = Instant::now() + Duration::from_secs(5);
        while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.conf);
    }
}

/// Data segments the server has received on a connection once its client is
/// past its login and querying (enough for ODBC Driver 18 too): sqlclient logs in with 4 at most (PRELOGIN
/// and LOGIN7; with TLS, its ClientHello and Finished flights between them:
/// tshark on the host, each mode), then sends `SELECT @@SPID` and its load.
pub const LOGGED_IN_SEGS: u64 = 12;
/// Client port -> data segments the server side has received on each
/// established connection to `port` (`ss -ti`'s data_segs_in).
pub fn segments_in(pair: &crate::net::NetPair, port: u16) -> BTreeMap<u16, u64> {
    let filter = format!("( sport = :{port} )");
    let out = pair.exec(
        crate::net::Side::B,
        &["ss", "-Htin", "state", "established", &filter],
    );
    let mut segments = BTreeMap::new();
    let mut peer = None;
    for line in out.lines() {
        if !line.starts_with(char::is_whitespace) {
            // "Recv-Q Send-Q local:port peer:port"
            peer = line
                .split_whitespace()
                .nth(3)
                .and_then(|p| p.rsplit(':').next()?.parse::<u16>().ok());
            continue;
        }
        let n = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("data_segs_in:")?.parse::<u64>().ok())
            .unwrap_or(0);
        if let Some(peer) = peer.take() {
            segments.insert(peer, n);
        }
    }
    segments
}
