//! sockperf ping-pong inside a pair: the application round trip.

use super::names::next_port;
use super::run::Background;
use super::{NetPair, Side};
use crate::util::strip_ansi;

impl NetPair {
    /// `sockperf server --tcp` on `side`'s IPv4 address (sockperf 3.7 has no
    /// IPv6), returned once it accepts connections.
    pub fn sockperf_server(&self, side: Side) -> SockperfServer<'_> {
        let port = next_port();
        let addr = self.v4(side).to_string();
        let mut process = self.spawn(
            side,
            &[
                "sockperf",
                "server",
                "--tcp",
                "-i",
                &addr,
                "-p",
                &port.to_string(),
            ],
        );
        self.wait_listening(side, port, &mut process);
        SockperfServer {
            side,
            port,
            _process: process,
        }
    }

    /// `sockperf ping-pong --tcp --full-rtt` from the server's peer for `secs`
    /// seconds at `mps` messages per second (None: as fast as it can). Every
    /// figure returned is the application round trip in µs.
    pub fn sockperf(&self, server: &SockperfServer, secs: u32, mps: Option<u32>) -> Sockperf {
        let addr = self.v4(server.side).to_string();
        let mps = format!("--mps={}", mps.map_or("max".to_string(), |n| n.to_string()));
        let (port, secs_s, limit) = (
            server.port.to_string(),
            secs.to_string(),
            (secs + 30).to_string(),
        );
        let out = self.exec_output(
            server.side.peer(),
            &[
                "timeout",
                "-s",
                "KILL",
                &limit,
                "sockperf",
                "ping-pong",
                "--tcp",
                "-i",
                &addr,
                "-p",
                &port,
                "-t",
                &secs_s,
                &mps,
                "--full-rtt",
            ],
        );
        // sockperf exits 0 even when it could not connect: judge by the output.
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        parse_sockperf(&text)
            .unwrap_or_else(|| panic!("sockperf ({}) gave no statistics:\n{text}", out.status))
    }
}

// ---- sockperf ----------------------------------------------------------------------

/// A running `sockperf server --tcp`; stopped on drop.
pub struct SockperfServer<'a> {
    pub side: Side,
    pub port: u16,
    _process: Background<'a>,
}

/// sockperf's statistics of one ping-pong run: round trips in µs (`--full-rtt`).
#[derive(Debug, Clone, Default)]
pub struct Sockperf {
    pub observations: u64,
    pub avg_us: f64,
    pub min_us: f64,
    pub max_us: f64,
    /// (percentile, µs) as printed: 25, 50, 75, 90, 99, 99.9, 99.99, 99.999.
    pub percentiles: Vec<(f64, f64)>,
}

impl Sockperf {
    /// One of the printed percentiles, e.g. `percentile(99.0)`.
    pub fn percentile(&self, p: f64) -> f64 {
        self.percentiles
            .iter()
            .find(|(q, _)| (q - p).abs() < 1e-6)
            .map(|&(_, v)| v)
            .unwrap_or_else(|| panic!("sockperf printed no percentile {p}: {self:?}"))
    }
}

/// Parse sockperf 3.7's client summary of a `--full-rtt` run, which looks like
/// this (colour escapes removed). Without `--full-rtt` sockperf prints
/// "avg-latency" and every figure is half the round trip; such output is
/// refused (None) so the two are never mixed up.
/// ```text
/// sockperf: ====> avg-rtt=200.181 (std-dev=652.896)
/// sockperf: Total 1547 observations; each percentile contains 15.47 observations
/// sockperf: ---> <MAX> observation = 5259.648
/// sockperf: ---> percentile 99.999 = 5259.648
/// ...
/// sockperf: ---> percentile 25.000 =   34.541
/// sockperf: ---> <MIN> observation =   14.852
/// ```
pub fn parse_sockperf(text: &str) -> Option<Sockperf> {
    let mut s = Sockperf::default();
    let (mut avg, mut min, mut max, mut total) = (None, None, None, None);
    for line in strip_ansi(text).lines() {
        let line = line.trim_start_matches("sockperf:").trim();
        let value_after = |sep: &str| {
            line.split_once(sep)
                .and_then(|(_, v)| v.split_whitespace().next()?.parse::<f64>().ok())
        };
        if line.starts_with("====> avg-rtt=") {
            avg = value_after("avg-rtt=");
        } else if let Some(rest) = line.strip_prefix("Total ") {
            total = rest.split_whitespace().next().and_then(|n| n.parse().ok());
        } else if line.starts_with("---> <MAX>") {
            max = value_after("=");
        } else if line.starts_with("---> <MIN>") {
            min = value_after("=");
        } else if let Some(rest) = line.strip_prefix("---> percentile ") {
            let (p, v) = rest.split_once('=')?;
            s.percentiles
                .push((p.trim().parse().ok()?, v.trim().parse().ok()?));
        }
    }
    s.avg_us = avg?;
    s.min_us = min?;
    s.max_us = max?;
    s.observations = total?;
    (!s.percentiles.is_empty()).then_some(s)
}
