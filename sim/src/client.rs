//! The load driver: N TDS sessions ([`connection`]), each logging in (with
//! TLS as `--encrypt` asks), running `SELECT @@SPID` once, and then sending
//! SQL batches on a fixed schedule (its share of the total rate), one at a
//! time, timing each from send to the end of its response.
//!
//! A slow or lossy network must not hang it: connects, writes and responses
//! have a timeout; a timed-out or broken session counts an error, is dropped
//! and logs in again at its next turn.

mod connection;

use std::collections::BTreeMap;
use std::io;
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

pub use connection::{Connection, Encrypt, InForce};

#[derive(Clone, Debug)]
pub struct ClientConfig {
    pub server: String,
    pub sessions: usize,
    /// Total transactions per second over all sessions; 0 = as fast as each
    /// session can go.
    pub rate: f64,
    pub duration: Duration,
    pub sql: String,
    pub user: String,
    pub password: String,
    pub app: String,
    pub database: String,
    /// For connecting, each write, and each whole response.
    pub timeout: Duration,
    pub packet_size: u32,
    pub encrypt: Encrypt,
    /// MARS: each request sent on two logical sessions of the connection at once.
    pub mars: bool,
    /// How long a session waits after its login before its first request,
    /// as a pooled connection opened ahead of use does.
    pub idle_after_login: Duration,
}

/// Why a request or login failed; the JSON counts errors by these names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrorKind {
    Connect,
    Timeout,
    Disconnected,
    Protocol,
    Server,
    Io,
}

impl ErrorKind {
    pub fn name(self) -> &'static str {
        match self {
            ErrorKind::Connect => "connect",
            ErrorKind::Timeout => "timeout",
            ErrorKind::Disconnected => "disconnected",
            ErrorKind::Protocol => "protocol",
            ErrorKind::Server => "server",
            ErrorKind::Io => "io",
        }
    }
}

#[derive(Debug)]
pub struct SessionError {
    pub kind: ErrorKind,
    pub detail: String,
}

impl From<io::Error> for SessionError {
    fn from(e: io::Error) -> Self {
        let kind = match e.kind() {
            io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock => ErrorKind::Timeout,
            io::ErrorKind::UnexpectedEof
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::BrokenPipe => ErrorKind::Disconnected,
            io::ErrorKind::InvalidData => ErrorKind::Protocol,
            _ => ErrorKind::Io,
        };
        SessionError {
            kind,
            detail: e.to_string(),
        }
    }
}

pub(crate) fn protocol(detail: impl Into<String>) -> SessionError {
    SessionError {
        kind: ErrorKind::Protocol,
        detail: detail.into(),
    }
}

/// One login of one session slot (a slot logs in again after an error).
#[derive(Clone, Debug, Serialize)]
pub struct SessionReport {
    pub session: usize,
    /// From the LOGINACK response's packet header.
    pub spid: u16,
    /// What `SELECT @@SPID` answered on the session.
    pub spid_selected: u16,
    pub client_port: u16,
    /// `none`, `login_only`, `full` or `strict`.
    pub encryption: &'static str,
    pub transactions: u64,
    pub errors: u64,
    /// Each transaction's latency, µs, in order.
    pub latencies_us: Vec<u64>,
    /// Each transaction's latency to the kernel's receipt of its response
    /// (SO_TIMESTAMPNS), µs, in order: without this client's scheduling
    /// delays, the oracle a tracer's per-request timing is checked against.
    /// Empty where the kernel gives no receive times.
    pub arrival_latencies_us: Vec<u64>,
}

#[derive(Clone, Debug, Serialize)]
pub struct Report {
    pub server: String,
    pub sessions_requested: usize,
    pub rate_tps: f64,
    pub duration_s: f64,
    pub elapsed_s: f64,
    pub transactions: u64,
    pub errors: u64,
    pub errors_by_kind: BTreeMap<&'static str, u64>,
    /// The first error of each kind, to say what went wrong.
    pub error_samples: BTreeMap<&'static str, String>,
    pub tps: f64,
    pub mean_us: u64,
    pub p50_us: u64,
    pub p90_us: u64,
    pub p99_us: u64,
    pub max_us: u64,
    pub sessions: Vec<SessionReport>,
}

#[derive(Default)]
struct SlotResult {
    latencies_us: Vec<u64>,
    errors: BTreeMap<&'static str, u64>,
    samples: BTreeMap<&'static str, String>,
    logins: Vec<SessionReport>,
}

impl SlotResult {
    fn error(&mut self, e: SessionError) {
        let name = e.kind.name();
        *self.errors.entry(name).or_default() += 1;
        self.samples.entry(name).or_insert(e.detail);
        if let Some(l) = self
            .logins
            .last_mut()
            .filter(|_| e.kind != ErrorKind::Connect)
        {
            l.errors += 1;
        }
    }

    fn login(&mut self, addr: SocketAddr, cfg: &ClientConfig, slot: usize) -> Option<Connection> {
        match Connection::open(addr, cfg, slot as u32) {
            Ok(c) => {
                self.logins.push(SessionReport {
                    session: slot,
                    spid: c.spid,
                    spid_selected: c.spid_selected,
                    client_port: c.client_port,
                    encryption: c.encryption.name(),
                    transactions: 0,
                    errors: 0,
                    latencies_us: Vec::new(),
                    arrival_latencies_us: Vec::new(),
                });
                Some(c)
            }
            Err(e) => {
                self.error(SessionError {
                    kind: ErrorKind::Connect,
                    detail: e.detail,
                });
                None
            }
        }
    }
}

/// Runs the whole load and reports. Sessions log in first; the clock starts
/// when all have tried.
pub fn run(cfg: &ClientConfig) -> anyhow::Result<Report> {
    anyhow::ensure!(cfg.sessions > 0, "--sessions must be at least 1");
    anyhow::ensure!(
        cfg.rate >= 0.0 && cfg.rate.is_finite(),
        "--rate must be a number ≥ 0"
    );
    let addr = cfg
        .server
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| anyhow::anyhow!("{}: no address", cfg.server))?;
    let barrier = Arc::new(Barrier::new(cfg.sessions + 1));
    let handles: Vec<_> = (0..cfg.sessions)
        .map(|slot| {
            let (cfg, barrier) = (cfg.clone(), barrier.clone());
            thread::Builder::new()
                .name(format!("session{slot}"))
                .spawn(move || run_slot(addr, &cfg, slot, &barrier))
        })
        .collect::<Result<_, _>>()?;
    barrier.wait();
    let start = Instant::now();
    let slots: Vec<SlotResult> = handles
        .into_iter()
        .map(|h| h.join().expect("session thread panicked"))
        .collect();
    Ok(report(cfg, start.elapsed(), slots))
}

fn run_slot(addr: SocketAddr, cfg: &ClientConfig, slot: usize, barrier: &Barrier) -> SlotResult {
    let mut res = SlotResult::default();
    let mut conn = res.login(addr, cfg, slot);
    barrier.wait();
    let start = Instant::now();
    let deadline = start + cfg.duration;
    // Each session sends every `interval`; sessions are staggered by
    // 1/rate so the total arrives evenly rather than in bursts of N.
    let (interval, offset) = if cfg.rate > 0.0 {
        (
            Duration::from_secs_f64(cfg.sessions as f64 / cfg.rate),
            Duration::from_secs_f64(slot as f64 / cfg.rate),
        )
    } else {
        (Duration::ZERO, Duration::ZERO)
    };
    for k in 0u32.. {
        // A session that fell behind sends at once until it has caught up,
        // so the count stays rate × duration unless it falls behind for good.
        let due = start + offset + interval * k;
        let now = Instant::now();
        if due >= deadline || now >= deadline {
            break;
        }
        if due > now {
            thread::sleep(due - now);
        }
        let Some(c) = conn.as_mut() else {
            conn = res.login(addr, cfg, slot);
            if conn.is_none() {
                // Back off so a dead server costs one error a second.
                thread::sleep(
                    Duration::from_secs(1).min(deadline.saturating_duration_since(Instant::now())),
                );
            }
            continue;
        };
        let t0 = Instant::now();
        match c.execute_timed(&cfg.sql) {
            Ok((_, arrival)) => {
                let us = t0.elapsed().as_micros() as u64;
                res.latencies_us.push(us);
                if let Some(l) = res.logins.last_mut() {
                    l.transactions += 1;
                    l.latencies_us.push(us);
                    l.arrival_latencies_us
                        .extend(arrival.map(|d| d.as_micros() as u64));
                }
            }
            Err(e) => {
                // A server error leaves the session usable; anything else
                // leaves it out of step, so it logs in again.
                if e.kind != ErrorKind::Server {
                    conn = None;
                }
                res.error(e);
            }
        }
    }
    res
}

fn report(cfg: &ClientConfig, elapsed: Duration, slots: Vec<SlotResult>) -> Report {
    let mut lat: Vec<u64> = Vec::new();
    let mut by_kind: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut samples = BTreeMap::new();
    let mut sessions = Vec::new();
    for s in slots {
        lat.extend(s.latencies_us);
        for (k, n) in s.errors {
            *by_kind.entry(k).or_default() += n;
        }
        for (k, d) in s.samples {
            samples.entry(k).or_insert(d);
        }
        sessions.extend(s.logins);
    }
    lat.sort_unstable();
    let n = lat.len() as u64;
    Report {
        server: cfg.server.clone(),
        sessions_requested: cfg.sessions,
        rate_tps: cfg.rate,
        duration_s: cfg.duration.as_secs_f64(),
        elapsed_s: round3(elapsed.as_secs_f64()),
        transactions: n,
        errors: by_kind.values().sum(),
        errors_by_kind: by_kind,
        error_samples: samples,
        tps: round3(n as f64 / cfg.duration.as_secs_f64().max(1e-9)),
        mean_us: lat.iter().sum::<u64>().checked_div(n).unwrap_or(0),
        p50_us: percentile(&lat, 0.50),
        p90_us: percentile(&lat, 0.90),
        p99_us: percentile(&lat, 0.99),
        max_us: lat.last().copied().unwrap_or(0),
        sessions,
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Nearest-rank percentile of sorted values (0 when empty).
pub fn percentile(sorted: &[u64], q: f64) -> u64 {
    if sorted.is_empty() {
        return 0;
    }
    let rank = (q * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), 50);
        assert_eq!(percentile(&v, 0.9), 90);
        assert_eq!(percentile(&v, 0.99), 99);
        assert_eq!(percentile(&v, 1.0), 100);
        assert_eq!(percentile(&[7], 0.5), 7);
        assert_eq!(percentile(&[], 0.5), 0);
    }

    #[test]
    fn io_errors_map_to_kinds() {
        let k = |e: io::ErrorKind| SessionError::from(io::Error::from(e)).kind;
        assert_eq!(k(io::ErrorKind::TimedOut), ErrorKind::Timeout);
        assert_eq!(k(io::ErrorKind::WouldBlock), ErrorKind::Timeout);
        assert_eq!(k(io::ErrorKind::UnexpectedEof), ErrorKind::Disconnected);
        assert_eq!(k(io::ErrorKind::InvalidData), ErrorKind::Protocol);
    }

    #[test]
    fn a_silent_server_times_out_instead_of_hanging() {
        // Accepts but never answers: the PRELOGIN must fail in ~timeout.
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let hold = thread::spawn(move || listener.accept().map(|(s, _)| s));
        let cfg = ClientConfig {
            server: addr.to_string(),
            sessions: 1,
            rate: 1.0,
            duration: Duration::from_secs(1),
            sql: "SELECT 1".into(),
            user: "u".into(),
            password: String::new(),
            app: "t".into(),
            database: String::new(),
            timeout: Duration::from_millis(300),
            packet_size: 4096,
            encrypt: Encrypt::NotSupported,
            mars: false,
            idle_after_login: Duration::ZERO,
        };
        let t0 = Instant::now();
        let e = Connection::open(addr, &cfg, 0).err().expect("must fail");
        assert_eq!(e.kind, ErrorKind::Timeout, "{e:?}");
        assert!(t0.elapsed() < Duration::from_secs(5));
        drop(hold.join());
    }
}
