//! The net suite's workloads and their oracles: sockperf's own round-trip
//! percentiles and iperf3's own received throughput, each run from the
//! client namespace against a server in the server namespace.

use std::collections::BTreeMap;
use std::os::unix::process::CommandExt;
use std::process::Output;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use crate::bench::configs::Figures;
use crate::bench::hostcpu::{self, HostCpu};
use crate::bench::interrupt;
use crate::bench::netpair::{CLIENT, NetPair, SERVER, Server, tcp_segments, tx_packets};
use crate::bench::tracer::{self, Tracer};
use stalltrace_lab::strip_ansi;

/// sockperf's fixed message rate: a steady request/response load, not a
/// saturating one, so its round trip is the latency an application sees.
pub const SOCKPERF_MPS: u32 = 5000;
/// The paced iperf3 of the loss case, and its loss.
pub const LOSS_RATE: &str = "500M";
pub const LOSS_PERCENT: u8 = 2;

/// Every client and server runs on this one CPU (`taskset -c`). Unpinned, the
/// scheduler's placement decides the figures: on this 2-vCPU VM sockperf's
/// p50 was ~17 µs with both ends on one CPU and 60–90 µs across the two (a
/// cross-CPU wake-up in a VM costs an IPI and an exit from idle), switching
/// from run to run; pinned, p50 stayed within 14–22 µs. CPU 0, because the
/// VM's disk interrupts go to CPU 1 here. The daemon is not pinned.
pub const CPU: &str = "0";

/// `taskset -c CPU`, the prefix of every client and server command.
pub fn pinned(args: &[&str]) -> Vec<String> {
    ["taskset", "-c", CPU]
        .iter()
        .chain(args)
        .map(|s| s.to_string())
        .collect()
}

/// Ports inside the bench's own namespaces: fixed, nothing else listens there.
pub const SOCKPERF_PORT: u16 = 11111;
pub const IPERF3_PORT: u16 = 5201;
/// The loss case's own server: the drop rule matches this port only.
pub const IPERF3_LOSS_PORT: u16 = 5202;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// sockperf ping-pong, TCP, `--full-rtt`, at [`SOCKPERF_MPS`].
    PingPong,
    /// iperf3 TCP to `port`, paced at `rate` when given.
    Stream {
        port: u16,
        rate: Option<&'static str>,
    },
}

/// What the hooks' run time takes a share of, as an estimate of their cost
/// that does not depend on run-to-run noise.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Bound {
    /// Every hook runs on the round trip's critical path (both ends on one
    /// CPU, one message in flight): their time per round trip over the round trip.
    RoundTrip,
    /// The workload keeps its one CPU busy: their share of that CPU is the
    /// share of throughput they take.
    OneCpu,
    /// Paced below what the CPU could do: no share to speak of.
    Paced,
}

/// One of a workload's figures, as the tables show it.
pub struct Figure {
    pub key: &'static str,
    pub header: &'static str,
    pub digits: usize,
}

pub struct Workload {
    /// Its key in benchmarks.json.
    pub key: &'static str,
    pub title: &'static str,
    pub kind: Kind,
    /// Shown in the tables, in this order; the first is the one the target is set on.
    pub figures: &'static [Figure],
    /// Whether a larger first figure is better (throughput) or worse (latency).
    pub higher_is_better: bool,
    /// The figure that counts transactions, for "per transaction" costs, and its unit.
    pub unit_figure: &'static str,
    pub unit: &'static str,
    pub bound: Bound,
}

/// The figures both iperf3 workloads report.
const RECEIVED_MBPS: Figure = Figure {
    key: "received_mbps",
    header: "received Mbit/s",
    digits: 0,
};
const RETRANSMITS: Figure = Figure {
    key: "retransmits",
    header: "retransmitted segs",
    digits: 0,
};

pub const WORKLOADS: [Workload; 3] = [
    Workload {
        key: "sockperf",
        title: "sockperf ping-pong TCP, 5000 msg/s, round trip (--full-rtt)",
        kind: Kind::PingPong,
        figures: &[
            Figure {
                key: "p50_us",
                header: "p50 µs",
                digits: 1,
            },
            Figure {
                key: "p99_us",
                header: "p99 µs",
                digits: 1,
            },
            Figure {
                key: "avg_us",
                header: "avg µs",
                digits: 1,
            },
        ],
        higher_is_better: false,
        unit_figure: "round_trips",
        unit: "round trip",
        bound: Bound::RoundTrip,
    },
    Workload {
        key: "iperf3",
        title: "iperf3 TCP, unpaced (CPU-bound on veth), received throughput",
        kind: Kind::Stream {
            port: IPERF3_PORT,
            rate: None,
        },
        figures: &[RECEIVED_MBPS, RETRANSMITS],
        higher_is_better: true,
        unit_figure: "received_mb",
        unit: "MB received",
        bound: Bound::OneCpu,
    },
    Workload {
        key: "iperf3_loss",
        title: "iperf3 TCP paced at 500 Mbit/s, 2% of its packets dropped at the receiver, received throughput",
        kind: Kind::Stream {
            port: IPERF3_LOSS_PORT,
            rate: Some(LOSS_RATE),
        },
        figures: &[
            RECEIVED_MBPS,
            RETRANSMITS,
            Figure {
                key: "dropped_skbs",
                header: "dropped skbs",
                digits: 0,
            },
        ],
        higher_is_better: true,
        unit_figure: "received_mb",
        unit: "MB received",
        bound: Bound::Paced,
    },
];

/// The servers every workload talks to, for the whole suite.
pub struct Servers<'a> {
    pub pair: &'a NetPair,
    pub sockperf: Server<'a>,
    pub iperf3: Server<'a>,
    pub iperf3_loss: Server<'a>,
}

impl Servers<'_> {
    fn user_s(&self) -> f64 {
        // 0 for a server that is gone.
        [&self.sockperf, &self.iperf3, &self.iperf3_loss]
            .iter()
            .map(|s| tracer::process_user_s(s.pid()).unwrap_or(0.0))
            .sum()
    }

    /// Start again any server that died (someone else's cleanup may kill
    /// processes it does not know); what was restarted, for a warning.
    pub fn restart_dead(&mut self) -> anyhow::Result<Vec<String>> {
        let mut restarted = Vec::new();
        for s in [&mut self.sockperf, &mut self.iperf3, &mut self.iperf3_loss] {
            if !s.is_running() {
                interrupt::check()?;
                restarted.push(format!("{} had exited ({})", s.what(), s.log_tail()));
                s.restart()?;
            }
        }
        Ok(restarted)
    }

    fn check_running(&mut self) -> anyhow::Result<()> {
        for s in [&mut self.sockperf, &mut self.iperf3, &mut self.iperf3_loss] {
            if !s.is_running() {
                interrupt::check()?;
                bail!("{} exited during the run: {}", s.what(), s.log_tail());
            }
        }
        Ok(())
    }
}

/// One client run, as its own tool reported it.
#[derive(Serialize, Clone, Debug)]
pub struct Run {
    /// The client's wall time, connection set-up included.
    pub seconds: f64,
    /// sockperf: p50_us, p99_us, avg_us (round trip, its valid window),
    /// round_trips (whole run); iperf3: received_mbps, received_mb,
    /// retransmits (the sender's segments), dropped_skbs (the loss rule's
    /// drops); both: veth_packets (sent by both veth ends while the client
    /// ran), in_segs and out_segs (TCP segments both namespaces received and
    /// sent meanwhile, /proc/net/snmp).
    pub figures: BTreeMap<&'static str, f64>,
    /// User-space CPU of every other process on the host while the client
    /// ran (host user time minus the client's, the servers' and the daemon's),
    /// in % of one CPU.
    pub others_user_cpu_pct: f64,
    /// CPU time the hypervisor gave to other guests, in % of one CPU.
    pub steal_pct: f64,
}

impl Run {
    pub fn figure(&self, key: &str) -> f64 {
        self.figures.get(key).copied().unwrap_or(0.0)
    }
}

impl Figures for Run {
    const AT_TOP: bool = false;

    fn figures(&self) -> Vec<(&'static str, f64)> {
        self.figures.iter().map(|(k, v)| (*k, *v)).collect()
    }

    fn figure(&self, key: &str) -> f64 {
        Run::figure(self, key)
    }

    fn others_user_cpu_pct(&self) -> f64 {
        self.others_user_cpu_pct
    }

    fn steal_pct(&self) -> f64 {
        self.steal_pct
    }
}

/// Run workload `w` for `secs` seconds; `tracer` is the daemon attached
/// meanwhile, if any (its user time is not "others'").
pub fn run(
    servers: &mut Servers,
    w: &Workload,
    secs: u64,
    tracer: Option<&Tracer>,
) -> anyhow::Result<Run> {
    let pair = servers.pair;
    let daemon_user = || {
        tracer
            .and_then(|t| t.usage().ok())
            .map_or(0.0, |u| u.user_s)
    };
    let dropped = || -> anyhow::Result<u64> {
        match w.kind {
            Kind::Stream {
                port: IPERF3_LOSS_PORT,
                ..
            } => pair.try_dropped_packets(SERVER),
            _ => Ok(0),
        }
    };
    let (host0, children0, servers0, daemon0) = (
        HostCpu::now(),
        hostcpu::children_user_s(),
        servers.user_s(),
        daemon_user(),
    );
    let packets =
        || -> anyhow::Result<u64> { Ok(tx_packets(pair, CLIENT)? + tx_packets(pair, SERVER)?) };
    // Both namespaces: every segment of the workload is sent by one and
    // received by the other, and the hooks run at both ends.
    let segments = || -> anyhow::Result<(u64, u64)> {
        let (ci, co) = tcp_segments(pair, CLIENT)?;
        let (si, so) = tcp_segments(pair, SERVER)?;
        Ok((ci + si, co + so))
    };
    let dropped0 = dropped()?;
    let packets0 = packets()?;
    let segments0 = segments()?;
    let began = Instant::now();
    let mut figures = match w.kind {
        Kind::PingPong => sockperf(pair, secs)?,
        Kind::Stream { port, rate } => iperf3(pair, port, rate, secs)?,
    };
    let seconds = began.elapsed().as_secs_f64();
    let host = HostCpu::now().since(&host0);
    let ours = hostcpu::children_user_s() - children0 + servers.user_s() - servers0 + daemon_user()
        - daemon0;
    figures.insert("veth_packets", packets()?.saturating_sub(packets0) as f64);
    let (in_segs, out_segs) = segments()?;
    figures.insert("in_segs", in_segs.saturating_sub(segments0.0) as f64);
    figures.insert("out_segs", out_segs.saturating_sub(segments0.1) as f64);
    if let Kind::Stream { .. } = w.kind {
        figures.insert("dropped_skbs", dropped()?.saturating_sub(dropped0) as f64);
    }
    servers.check_running()?;
    Ok(Run {
        seconds,
        figures,
        others_user_cpu_pct: (100.0 * (host.user_s - ours) / seconds).max(0.0),
        steal_pct: 100.0 * host.steal_s / seconds,
    })
}

/// What runs a client inside the client namespace: pinned, and killed if it
/// runs 30 s past its time.
pub fn client_prefix(secs: u64) -> Vec<String> {
    pinned(&["timeout", "-s", "KILL", &(secs + 30).to_string()])
}

/// A client inside the client namespace (see [`client_prefix`]), stopped
/// (SIGTERM, which `timeout` passes on) if the bench dies.
fn client(pair: &NetPair, secs: u64, args: &[&str]) -> anyhow::Result<Output> {
    let mut full = client_prefix(secs);
    full.extend(args.iter().map(|s| s.to_string()));
    let full: Vec<&str> = full.iter().map(String::as_str).collect();
    let mut cmd = pair.command(CLIENT, &full);
    // SAFETY: prctl is async-signal-safe and touches only the child.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            Ok(())
        });
    }
    let out = cmd
        .output()
        .with_context(|| format!("cannot run {}", args.join(" ")))?;
    // A Ctrl-C stops the client too; say "interrupted", not "it failed".
    interrupt::check()?;
    Ok(out)
}

/// The sockperf client's command line, after `timeout`.
pub fn sockperf_args(addr: &str, secs: u64) -> Vec<String> {
    [
        "sockperf",
        "ping-pong",
        "--tcp",
        "-i",
        addr,
        "-p",
        &SOCKPERF_PORT.to_string(),
        "-t",
        &secs.to_string(),
        &format!("--mps={SOCKPERF_MPS}"),
        "--full-rtt",
    ]
    .map(String::from)
    .to_vec()
}

fn sockperf(pair: &NetPair, secs: u64) -> anyhow::Result<BTreeMap<&'static str, f64>> {
    let addr = pair.v4(SERVER).to_string();
    let args = sockperf_args(&addr, secs);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = client(pair, secs, &args)?;
    // sockperf exits 0 even when it could not connect: judge by the output.
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_sockperf(&text).with_context(|| {
        format!(
            "sockperf ({}) printed no round-trip statistics: {}",
            out.status,
            text.trim()
        )
    })
}

/// The server namespace's address and the options after `-c ADDR -p PORT -t SECS`.
pub fn iperf3_args(addr: &str, port: u16, rate: Option<&str>, secs: u64) -> Vec<String> {
    let mut args: Vec<String> = [
        "iperf3",
        "-c",
        addr,
        "-p",
        &port.to_string(),
        "-t",
        &secs.to_string(),
        "-4",
        "-J",
    ]
    .map(String::from)
    .to_vec();
    if let Some(rate) = rate {
        args.extend(["-b".to_string(), rate.to_string()]);
    }
    args
}

fn iperf3(
    pair: &NetPair,
    port: u16,
    rate: Option<&str>,
    secs: u64,
) -> anyhow::Result<BTreeMap<&'static str, f64>> {
    let addr = pair.v4(SERVER).to_string();
    let args = iperf3_args(&addr, port, rate, secs);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    // An iperf3 server takes a moment to get ready for the next test after
    // one ends, and says "busy" meanwhile.
    for _ in 0..10 {
        let out = client(pair, secs, &args)?;
        let text = String::from_utf8_lossy(&out.stdout);
        let json: serde_json::Value = serde_json::from_str(&text).with_context(|| {
            format!(
                "iperf3 ({}) printed no JSON: {}{}",
                out.status,
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })?;
        if let Some(err) = json.get("error").and_then(|e| e.as_str()) {
            if err.contains("busy") {
                sleep(Duration::from_millis(500));
                continue;
            }
            bail!("iperf3 failed ({}): {err}", out.status);
        }
        if !out.status.success() {
            bail!("iperf3 failed ({})", out.status);
        }
        return parse_iperf3(&json);
    }
    bail!("the iperf3 server on port {port} stayed busy for 5 s")
}

/// sockperf 3.7's client summary of a `--full-rtt` run (colour escapes
/// removed); refuses output without `avg-rtt` (a run without `--full-rtt`
/// prints half the round trip as "avg-latency").
/// ```text
/// sockperf: [Total Run] RunTime=8.000 sec; Warm up time=400 msec; SentMessages=40003; ReceivedMessages=40002
/// sockperf: ====> avg-rtt=82.799 (std-dev=52.710)
/// sockperf: ---> percentile 99.000 =  141.047
/// sockperf: ---> percentile 50.000 =   79.887
/// ```
pub fn parse_sockperf(text: &str) -> Option<BTreeMap<&'static str, f64>> {
    let mut out = BTreeMap::new();
    for line in strip_ansi(text).lines() {
        let line = line.trim_start_matches("sockperf:").trim();
        if let Some(rest) = line.strip_prefix("====> avg-rtt=") {
            out.insert("avg_us", rest.split_whitespace().next()?.parse().ok()?);
        } else if let Some(rest) = line.strip_prefix("[Total Run]") {
            let received = rest.split(';').find_map(|f| {
                f.trim()
                    .strip_prefix("ReceivedMessages=")?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })?;
            out.insert("round_trips", received);
        } else if let Some(rest) = line.strip_prefix("---> percentile ") {
            let (p, v) = rest.split_once('=')?;
            let key = match p.trim() {
                "50.000" => "p50_us",
                "99.000" => "p99_us",
                _ => continue,
            };
            out.insert(key, v.trim().parse().ok()?);
        }
    }
    ["avg_us", "round_trips", "p50_us", "p99_us"]
        .iter()
        .all(|k| out.contains_key(k))
        .then_some(out)
}

/// iperf3's own end-of-test figures: what the receiver got (the sender's
/// figure counts what still sat in buffers at the end) and the sender's
/// retransmitted segments.
pub fn parse_iperf3(json: &serde_json::Value) -> anyhow::Result<BTreeMap<&'static str, f64>> {
    let end = &json["end"];
    let num = |v: &serde_json::Value, what: &str| {
        v.as_f64()
            .with_context(|| format!("iperf3's JSON has no {what}"))
    };
    Ok(BTreeMap::from([
        (
            "received_mbps",
            num(&end["sum_received"]["bits_per_second"], "received bits/s")? / 1e6,
        ),
        (
            "received_mb",
            num(&end["sum_received"]["bytes"], "received bytes")? / 1e6,
        ),
        (
            "retransmits",
            num(&end["sum_sent"]["retransmits"], "retransmits")?,
        ),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sockperf_summary_with_colours() {
        let text = "sockperf: [Total Run] RunTime=2.000 sec; Warm up time=400 msec; SentMessages=10003; ReceivedMessages=10002\n\
            sockperf: ========= Printing statistics for Server No: 0\n\
            sockperf: [Valid Duration] RunTime=1.550 sec; SentMessages=7751; ReceivedMessages=7751\n\
            sockperf: \u{1b}[2;35m====> avg-rtt=82.799 (std-dev=52.710)\u{1b}[0m\n\
            sockperf: ---> percentile 99.999 = 2282.855\n\
            sockperf: ---> percentile 99.000 =  141.047\n\
            sockperf: ---> percentile 50.000 =   79.887\n\
            sockperf: ---> <MIN> observation =   25.447\n";
        let f = parse_sockperf(text).unwrap();
        assert_eq!(f["avg_us"], 82.799);
        assert_eq!(f["p50_us"], 79.887);
        assert_eq!(f["p99_us"], 141.047);
        assert_eq!(f["round_trips"], 10002.0);
    }

    #[test]
    fn sockperf_without_full_rtt_or_statistics_is_refused() {
        assert!(parse_sockperf("sockperf: ====> avg-latency=41.0 (std-dev=1)\n").is_none());
        assert!(parse_sockperf("sockperf: connect failed\n").is_none());
    }

    #[test]
    fn iperf3_received_figures() {
        let json = serde_json::json!({"end": {
            "sum_sent": {"bytes": 2e9, "bits_per_second": 2e9, "retransmits": 12},
            "sum_received": {"bytes": 1e9, "bits_per_second": 1e9}
        }});
        let f = parse_iperf3(&json).unwrap();
        assert_eq!(f["received_mbps"], 1000.0);
        assert_eq!(f["received_mb"], 1000.0);
        assert_eq!(f["retransmits"], 12.0);
        assert!(parse_iperf3(&serde_json::json!({"error": "x"})).is_err());
    }

    #[test]
    fn the_target_figure_comes_first_and_every_workload_counts_transactions() {
        for w in &WORKLOADS {
            let first = w.figures[0].key;
            assert!(matches!(first, "p50_us" | "received_mbps"), "{}", w.key);
            assert!(matches!(w.unit_figure, "round_trips" | "received_mb"));
        }
    }
}
