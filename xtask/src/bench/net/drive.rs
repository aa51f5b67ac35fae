//! The net suite on the paired-rounds engine (see `engine`): its parts are
//! the three workloads, run from the client namespace against the servers
//! (restarted when someone else's cleanup kills one, and a failed block run
//! again with a new daemon or peer), its daemon filtered to the client's
//! namespace, its floor on the daemon's network-path hooks, its peer bpftrace.

use std::collections::BTreeMap;
use std::path::Path;

use super::workload::{self, Run, Servers, WORKLOADS, Workload};
use super::{Measured, Settings, Transmits, disturbance, on_net_path, transmits};
use crate::bench::engine::{self, Block, Daemon, Suite};
use crate::bench::floor::{self, AttachPoint};
use crate::bench::netpair::{self, CLIENT, NetPair, SERVER};
use crate::bench::peers::{self, Bpftrace, Peer};
use crate::bench::quiet::Quiet;
use crate::bench::tracer::Tracer;
use crate::bench::tracer::programs::Counter;

struct NetSuite<'a> {
    runtime_s: u64,
    bin: &'a Path,
    scratch: &'a Path,
    filters: [&'a str; 2],
    /// The idle SQL Server worker each daemon must know before its runs.
    sql_worker: u32,
    /// The servers, restarted when someone else's cleanup kills one.
    servers: Servers<'a>,
    /// The quiet-host budget.
    quiet: &'a mut Quiet,
    /// Servers restarted, for the warnings.
    restarted: Vec<String>,
    /// Network-path hooks as the first daemon reported them attached, one string per family.
    hooks: Vec<String>,
    /// The network-path programs of the daemon of the block under way.
    net_ids: Vec<u64>,
}

impl Suite for NetSuite<'_> {
    type Part = &'static Workload;
    type Run = Run;
    type Output = Transmits;
    const RETRY_FAILURES: bool = true;

    fn blocks(&self) -> [Block; 3] {
        [Block::Untraced, Block::Daemon(0), Block::Peers]
    }

    fn parts(&self) -> Vec<&'static Workload> {
        WORKLOADS.iter().collect()
    }

    fn part_name(&self, w: &'static Workload) -> String {
        w.key.to_string()
    }

    fn scratch(&self) -> &Path {
        self.scratch
    }

    fn quiet(&mut self) -> Option<&mut Quiet> {
        Some(self.quiet)
    }

    /// The servers up: someone else's cleanup of a shared host may kill one.
    fn before_attempt(&mut self) -> anyhow::Result<()> {
        for what in self.servers.restart_dead()? {
            let w = format!("restarted a server: {what}");
            eprintln!("bench: {w}");
            self.restarted.push(w);
        }
        Ok(())
    }

    fn disturbance(&self, ours: &[u64]) -> Option<String> {
        disturbance(ours)
    }

    fn run(&mut self, w: &'static Workload, daemon: Option<&Tracer>) -> anyhow::Result<Run> {
        workload::run(&mut self.servers, w, self.runtime_s, daemon)
    }

    /// One line per run, figures lined up across configurations; in a
    /// daemon's accounting run, its network-path programs' runs too.
    fn progress(
        &self,
        label: &str,
        w: &'static Workload,
        run: &Run,
        accounted: Option<&BTreeMap<u64, Counter>>,
    ) {
        let head = format!("{label}:");
        let figures: Vec<String> = w
            .figures
            .iter()
            .map(|f| format!("{} {:.*}", f.header, f.digits, run.figure(f.key)))
            .collect();
        eprintln!(
            "bench: {head:<42} {} (steal {:.1}%)",
            figures.join(", "),
            run.steal_pct
        );
        if let Some(counters) = accounted {
            let (n, ns) = counters
                .iter()
                .filter(|(id, _)| self.net_ids.contains(id))
                .fold((0, 0), |(n, ns), (_, c)| {
                    (n + c.run_count, ns + c.run_time_ns)
                });
            eprintln!(
                "bench: {:<42} {n} network-path program runs ({:.0}/s), {:.0} ns per run",
                "",
                n as f64 / run.seconds,
                ns as f64 / n.max(1) as f64
            );
        }
    }

    fn start_daemon(&mut self, _: usize, _: usize, tag: &str) -> anyhow::Result<Daemon> {
        let mut tracer = Tracer::start(self.bin, self.scratch, tag, false, &self.filters)?;
        tracer.wait_for_sql_worker(self.sql_worker)?;
        if self.hooks.is_empty() {
            self.hooks = tracer
                .families()
                .into_iter()
                .filter(|f| on_net_path(f))
                .map(|f| format!("{f}: {}", tracer.hooks_of(&f).join(", ")))
                .collect();
        }
        let daemon = Daemon::of(tracer);
        self.net_ids = daemon
            .attached
            .iter()
            .filter(|(_, f, _)| on_net_path(f))
            .map(|(id, _, _)| *id)
            .collect();
        Ok(daemon)
    }

    fn floor_points(&self, daemon: &Tracer) -> anyhow::Result<Option<Vec<AttachPoint>>> {
        net_points(&daemon.start).map(Some)
    }

    fn stopped(&mut self, out: &Path, block: &str) -> anyhow::Result<Transmits> {
        let tx = transmits(out, self.servers.pair.veth(CLIENT))?;
        eprintln!(
            "bench: {:<42} hooks saw {} of {} transmits on the client veth",
            format!("{block}:"),
            tx.seen,
            tx.counted
        );
        Ok(tx)
    }

    fn peers(&self) -> usize {
        1
    }

    fn peer_name(&self, _: usize) -> &'static str {
        "bpftrace"
    }

    fn start_peer(&self, _: usize, tag: &str) -> anyhow::Result<Box<dyn Peer>> {
        let peer = Bpftrace::start(&peers::TCP_RETRANSMIT, self.scratch, tag)?;
        Ok(Box::new(peer))
    }
}

pub fn measure(
    settings: &Settings,
    bin: &Path,
    pair: &NetPair,
    sql_worker: u32,
    scratch: &Path,
    quiet_host: &mut Quiet,
    warnings: Vec<String>,
) -> anyhow::Result<Measured> {
    let client_netns = pair.netns(CLIENT).to_string();
    let congestion_control = pair
        .try_exec(CLIENT, &["sysctl", "-n", "net.ipv4.tcp_congestion_control"])?
        .trim()
        .to_string();
    eprintln!("bench: trying the usual peers (BCC, the bpftrace package's tools)");
    let unavailable = peers::unavailable(&["tcpretrans", "tcprtt"]);
    for u in &unavailable {
        eprintln!("bench: peer {}: {}", u.tool, u.verdict);
    }
    pair.try_drop_random(
        SERVER,
        workload::LOSS_PERCENT,
        Some(workload::IPERF3_LOSS_PORT),
    )?;
    let server_addr = pair.v4(SERVER).to_string();
    let port = |p: u16| p.to_string();
    let pinned = |args: &[&str]| workload::pinned(args);
    let mut servers = Servers {
        pair,
        sockperf: netpair::server(
            pair,
            workload::SOCKPERF_PORT,
            &pinned(&[
                "sockperf",
                "server",
                "--tcp",
                "-i",
                &server_addr,
                "-p",
                &port(workload::SOCKPERF_PORT),
            ]),
            scratch,
        )?,
        iperf3: netpair::server(
            pair,
            workload::IPERF3_PORT,
            &pinned(&["iperf3", "-s", "-p", &port(workload::IPERF3_PORT)]),
            scratch,
        )?,
        iperf3_loss: netpair::server(
            pair,
            workload::IPERF3_LOSS_PORT,
            &pinned(&["iperf3", "-s", "-p", &port(workload::IPERF3_LOSS_PORT)]),
            scratch,
        )?,
    };
    eprintln!(
        "bench: {} <-> {} over veth {}/{} ({}), congestion control {}, clients and servers \
         on CPU {}, {} rounds x {} s per run",
        pair.netns(CLIENT),
        pair.netns(SERVER),
        pair.veth(CLIENT),
        pair.veth(SERVER),
        server_addr,
        congestion_control,
        workload::CPU,
        settings.rounds,
        settings.runtime_s
    );
    // Fault in the binaries, sockets and the first connection's state once,
    // so round 1's first runs do not pay for them alone.
    for w in &WORKLOADS {
        workload::run(&mut servers, w, 2, None)?;
    }
    let mut suite = NetSuite {
        runtime_s: settings.runtime_s,
        bin,
        scratch,
        filters: ["--netns", client_netns.as_str()],
        sql_worker,
        servers,
        quiet: quiet_host,
        restarted: Vec::new(),
        hooks: Vec::new(),
        net_ids: Vec::new(),
    };
    let mut runs = engine::measure(&mut suite, settings, warnings)?;
    runs.warnings.append(&mut suite.restarted);
    Ok(Measured {
        runs,
        hooks: suite.hooks,
        congestion_control,
        unavailable,
    })
}

/// The network-path hooks the daemon attached (every family but block:
/// tcp, netdev, sqlserver), each attach point once: families share hooks
/// (netdev and sqlserver both attach tcp_probe), and the floor puts one
/// program on a point however many of the daemon's programs sit there.
fn net_points(start: &serde_json::Value) -> anyhow::Result<Vec<AttachPoint>> {
    let mut out: Vec<AttachPoint> = Vec::new();
    let mut families: Vec<&str> = Vec::new();
    let probes = start["probes"].as_array().into_iter().flatten();
    for f in probes.filter_map(|p| p["family"].as_str()) {
        if on_net_path(f) && !families.contains(&f) {
            families.push(f);
        }
    }
    for family in families {
        for p in floor::points_of(start, family)? {
            if !out.iter().any(|o| o.kind == p.kind && o.target == p.target) {
                out.push(p);
            }
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    #[test]
    fn each_network_path_attach_point_once_and_no_block_hook() {
        let probe = |family: &str, hook: &str| {
            json!({"family": family, "hook": hook, "mode": "tp_btf", "attached": true,
                   "via": "tp_btf", "target": hook})
        };
        let start = json!({"type": "start", "probes": [
            probe("block", "block_rq_issue"),
            probe("tcp", "sock_recv_length"),
            probe("netdev", "tcp_probe"),
            probe("netdev", "net_dev_xmit"),
            probe("sqlserver", "tcp_probe"),
            probe("sqlserver", "tcp_sendmsg_locked"),
        ]});
        let points = super::net_points(&start).unwrap();
        let sections: Vec<String> = points.iter().map(|p| p.section()).collect();
        assert_eq!(
            sections,
            [
                "tp_btf/sock_recv_length",
                "tp_btf/tcp_probe",
                "tp_btf/net_dev_xmit",
                "tp_btf/tcp_sendmsg_locked",
            ]
        );
    }
}
