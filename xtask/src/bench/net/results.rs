//! From raw runs to the published figures: medians and ranges per workload
//! and configuration; per-round ratios (each run over the untraced run of
//! the same round) with their median and 95% interval, on which the targets
//! are judged (see `verdicts`); per-program cost, summed over the
//! accounting runs and round by round; cost per received and per sent TCP
//! segment for stalltrace, the floor under it and the peer, and
//! stalltrace's work over the floor (see `floor`). Everything here is
//! serialized as-is into benchmarks.json.

mod costs;
mod floor;
mod verdicts;

use std::collections::BTreeMap;

use serde::Serialize;

use super::segments;
use super::workload::{self, Bound, Run, Workload};
use super::{Measured, PeerRun, TracedRun, WorkloadRuns, on_net_path};
use crate::bench::configs::{self, Configurations};
use crate::bench::netpair::Owner;
use crate::bench::parts::{self, PairedSetup, PartTotals};
use crate::bench::peers::{self, Comparison, PeerCost, PeerInfo, RoundCost};
use crate::bench::publish::{Host, Verdict};
use crate::bench::settings::Settings;
use crate::bench::stats::{Estimate, Summary};
use crate::bench::tracer::programs::{self, InPart};
use crate::bench::tracer::{self, ProgramCost};
use crate::bench::unitcost::{self, UnitCost};

#[derive(Serialize)]
pub struct NetResults {
    pub host: Host,
    pub command: &'static str,
    pub wall_time_s: f64,
    pub setup: Setup,
    /// Network-path hooks (every family but block), as the daemon reported them attached.
    pub hooks: Vec<String>,
    pub targets: Vec<Verdict>,
    pub workloads: Vec<WorkloadResult>,
    /// The bpftrace peer doing the same job, and the usual peers that cannot run here.
    pub peer: PeerInfo,
    /// Network-path programs (every family but block), summed over the
    /// accounting runs, and round by round.
    pub programs: Vec<ProgramResult>,
    /// BPF run time per received and per sent segment and the process's own
    /// CPU and memory, for stalltrace and the peer on each workload.
    pub unit_costs: Vec<UnitCost>,
    /// How a BPF time per unit becomes a share of a core at a rate.
    pub unit_cost_formula: &'static str,
    /// Empty programs on stalltrace's network-path hooks, and stalltrace's
    /// work over them; None when no traced block ran.
    pub floor: Option<floor::FloorResult>,
    pub daemon_lives: Lives,
    /// Records the daemon could not deliver, summed over every daemon's life.
    pub lost: BTreeMap<String, u64>,
    /// /proc/loadavg before and after: a busy host shows here.
    pub load_average: [String; 2],
    pub warnings: Vec<String>,
}

#[derive(Serialize)]
pub struct Setup {
    #[serde(flatten)]
    pub paired: PairedSetup,
    pub network: String,
    pub congestion_control: String,
    pub sockperf: String,
    pub iperf3: String,
    pub iperf3_loss: String,
    pub loss_rule: String,
}

pub const CONFIGS: &str = "per round and workload: untraced; traced (stalltrace without the \
     accounting: the ratios and the targets use it; the daemon's CPU and RSS come from it); \
     traced_bpf_stats (the same daemon with the kernel's accounting on: ns/event and events/s \
     per program come from it; its figures pay the accounting on every program run and judge \
     nothing); floor_bpf_stats (right after the daemon stopped, in the same block, empty \
     programs on its network-path hooks with the accounting on: the floor per segment and per \
     transaction, and stalltrace's work over it, come from it); bpftrace and bpftrace_bpf_stats (the peer, likewise)";

/// What the floor is, for the published setup.
pub const FLOOR_SETUP: &str = "right after each round's daemon stopped, in the same traced \
     block, the bench loads and attaches one program of its own on each network-path attach \
     point the daemon used (tcp, netdev, sqlserver; a point two families share once), with the \
     same attach type, and runs each workload once under them with the kernel's accounting on";

/// Each round's daemon, over its whole life (every workload's runs).
#[derive(Serialize)]
pub struct Lives {
    /// Load, verify, attach, its runs, detach.
    pub lifetime_cpu_s: Summary,
    /// Records it wrote, all types, and `tcp_retransmit` records.
    pub records: Summary,
    pub tcp_retransmit_records: Summary,
    /// Transmits on the client's veth its hooks saw over those the kernel
    /// counted (netlink), from its own `netdev` records; 1 when none was missed.
    pub tx_seen_per_counted: Option<Summary>,
}

/// A workload's figures over the rounds, and over the untraced run of the same round.
pub type Side = configs::Side<Run>;
pub type Ratios = configs::Ratios<Run>;

#[derive(Serialize)]
pub struct WorkloadResult {
    pub key: &'static str,
    pub title: &'static str,
    #[serde(flatten)]
    pub configs: Configurations<Run>,
    /// Stalltrace as deployed over untraced, per figure of the workload:
    /// each run over the untraced run of the same round, median and 95%
    /// interval (figures whose untraced value is 0 in every round have none).
    pub ratio: Ratios,
    /// All network-path programs together, in the accounting runs.
    pub bpf: BpfLoad,
    /// A cross-check of the hooks against the kernel's own counters: runs of
    /// netdev's net_dev_start_xmit program over the packets both veth ends
    /// sent (`ip -s link`), per accounting run. At least 1 when no packet
    /// was missed (the daemon also sees packets on other interfaces); None
    /// without that program.
    pub xmit_runs_per_veth_packet: Option<Summary>,
    /// stalltrace against the peer, per transaction, round by round.
    pub versus_peer: Comparison,
}

#[derive(Serialize)]
pub struct BpfLoad {
    /// Run time of the programs over the client's wall time, in % of one CPU.
    pub cpu_pct_of_one_cpu: f64,
    /// An estimate of the hooks' cost free of run-to-run noise: their run
    /// time as a share of what bounds the workload (sockperf: of the untraced
    /// p50 round trip; unpaced iperf3: of the one CPU it keeps busy); None
    /// for a paced workload. Measured with the accounting on, so a little high.
    pub share_of_bound: Option<f64>,
    /// Run time of the programs per transaction (`unit`), over all runs.
    pub ns_per_unit: f64,
    pub unit: &'static str,
    /// Programs on neither path (state changes, timeouts), run time per
    /// segment received or sent, round by round.
    pub other_ns_per_segment: Option<Estimate>,
}

pub type ProgramResult = parts::ProgramResult<ByWorkload>;

#[derive(Serialize)]
pub struct ByWorkload {
    pub by_workload: Vec<ProgramInWorkload>,
}

#[derive(Serialize)]
pub struct ProgramInWorkload {
    pub workload: &'static str,
    pub run_count: u64,
    pub ns_per_event: Option<f64>,
    /// Per second of client run time, in the accounting runs.
    pub events_per_s: f64,
    /// Per transaction (a round trip; a MB received).
    pub events_per_unit: f64,
}

/// Counters of the network-path programs, summed over `runs`, keyed by (family, program).
fn program_totals<'a>(
    runs: impl IntoIterator<Item = &'a TracedRun>,
) -> BTreeMap<programs::Key, ProgramCost> {
    parts::program_totals(runs, on_net_path)
}

/// The network-path programs of one run, as (name, run time).
fn net_programs(r: &TracedRun) -> impl Iterator<Item = (&str, u64)> {
    r.programs
        .iter()
        .filter(|p| on_net_path(&p.family))
        .map(|p| (p.program.as_str(), p.run_time_ns))
}

/// stalltrace's network-path programs in one accounting run: run time and
/// transactions (the workload's unit).
fn round_cost(w: &Workload, r: &TracedRun) -> RoundCost {
    RoundCost {
        ns: net_programs(r).map(|(_, ns)| ns as f64).sum(),
        units: r.run.figure(w.unit_figure),
    }
}

/// A peer's (or the floor's) programs in one accounting run: run time and transactions.
fn peer_round_cost(w: &Workload, r: &PeerRun) -> RoundCost {
    RoundCost::of_all(&r.programs, r.run.figure(w.unit_figure))
}

/// Run time per received segment and per sent segment, one value per run.
fn per_segment<'a>(
    runs: impl IntoIterator<Item = (&'a Run, (f64, f64, f64))>,
) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut out = (Vec::new(), Vec::new(), Vec::new());
    for (run, (rx, tx, other)) in runs {
        let (i, o) = (run.figure("in_segs"), run.figure("out_segs"));
        out.0.push(rx / i);
        out.1.push(tx / o);
        out.2.push(other / (i + o));
    }
    out
}

fn xmit_coverage(runs: &WorkloadRuns) -> Option<Summary> {
    let ratios: Vec<f64> = runs
        .traced_bpf_stats()
        .iter()
        .filter_map(|r| {
            let xmit = r
                .programs
                .iter()
                .find(|p| p.family == "netdev" && p.program.ends_with("net_dev_start_xmit"))?;
            let packets = r.run.figure("veth_packets");
            (packets > 0.0).then(|| xmit.run_count as f64 / packets)
        })
        .collect();
    Summary::of(&ratios)
}

fn bpf_load(runs: &WorkloadRuns, untraced: &Side) -> BpfLoad {
    let w = runs.part;
    let s = runs.traced_bpf_stats();
    let seconds: f64 = s.iter().map(|r| r.run.seconds).sum();
    let units: f64 = s.iter().map(|r| r.run.figure(w.unit_figure)).sum();
    let ns: u64 = program_totals(s).values().map(|p| p.run_time_ns).sum();
    let cpu_pct_of_one_cpu = 100.0 * ns as f64 / 1e9 / seconds.max(f64::MIN_POSITIVE);
    let ns_per_unit = ns as f64 / units.max(f64::MIN_POSITIVE);
    let share_of_bound = match w.bound {
        Bound::RoundTrip => untraced
            .figures
            .get("p50_us")
            .filter(|p50| p50.median > 0.0)
            .map(|p50| ns_per_unit / (p50.median * 1000.0)),
        Bound::OneCpu => Some(cpu_pct_of_one_cpu / 100.0),
        Bound::Paced => None,
    };
    let (_, _, other) = per_segment(s.iter().map(|r| (&r.run, segments::split(net_programs(r)))));
    BpfLoad {
        cpu_pct_of_one_cpu,
        share_of_bound,
        ns_per_unit,
        unit: w.unit,
        other_ns_per_segment: Estimate::of(other),
    }
}

fn workload_result(runs: &WorkloadRuns) -> WorkloadResult {
    let w = runs.part;
    let traced_runs = |t: &[TracedRun]| t.iter().map(|t| t.run.clone()).collect::<Vec<_>>();
    let peer_runs: Vec<Run> = runs.peer(0).iter().map(|p| p.run.clone()).collect();
    let keys: Vec<&'static str> = w.figures.iter().map(|f| f.key).collect();
    let configs = Configurations::of(runs, &keys);
    let key = w.figures[0].key;
    // Overhead as a fraction, positive when the tool made things worse.
    let overhead = |other: &[Run]| -> Vec<f64> {
        runs.untraced
            .iter()
            .zip(other)
            .map(|(u, t)| {
                let r = t.figure(key) / u.figure(key);
                if w.higher_is_better { 1.0 - r } else { r - 1.0 }
            })
            .collect()
    };
    let peer_cost = peers::sum_costs(runs.peer_bpf_stats(0).iter().map(|r| &r.programs));
    let st_programs: Vec<(String, u64, u64)> = program_totals(runs.traced_bpf_stats())
        .into_values()
        .filter(|p| p.family == "tcp")
        .map(|p| (p.program, p.run_count, p.run_time_ns))
        .collect();
    let st_rounds: Vec<RoundCost> = runs
        .traced_bpf_stats()
        .iter()
        .map(|r| round_cost(w, r))
        .collect();
    let peer_rounds: Vec<RoundCost> = runs
        .peer_bpf_stats(0)
        .iter()
        .map(|r| peer_round_cost(w, r))
        .collect();
    let versus_peer = Comparison::new(
        w.unit,
        &st_rounds,
        &peer_rounds,
        (overhead(&traced_runs(runs.traced())), overhead(&peer_runs)),
        peers::same_hooks(&["tcp_retransmit_skb"], &st_programs, &peer_cost),
    );
    WorkloadResult {
        key: w.key,
        title: w.title,
        ratio: Ratios::of(&keys, &runs.untraced, runs.traced().iter().map(|r| &r.run)),
        bpf: bpf_load(runs, &configs.untraced),
        xmit_runs_per_veth_packet: xmit_coverage(runs),
        versus_peer,
        configs,
    }
}

/// Each network-path program over all accounting runs, round by round and
/// workload by workload.
fn program_results(m: &Measured) -> Vec<ProgramResult> {
    let row = |w: &&Workload, t: &PartTotals, p: InPart| ProgramInWorkload {
        workload: w.key,
        run_count: p.run_count,
        ns_per_event: p.ns_per_event,
        events_per_s: p.events_per_s,
        events_per_unit: p.run_count as f64 / t.units.max(f64::MIN_POSITIVE),
    };
    parts::program_results(
        &m.runs.parts,
        m.runs.daemons.iter().map(|l| &l.stop),
        on_net_path,
        (
            |w: &&Workload, run: &Run| (run.seconds, run.figure(w.unit_figure)),
            row,
            |by_workload| ByWorkload { by_workload },
        ),
    )
}

pub fn aggregate(
    settings: &Settings,
    m: &Measured,
    host: Host,
    wall_time_s: f64,
    load_average: [String; 2],
) -> NetResults {
    let workloads: Vec<WorkloadResult> = m.runs.parts.iter().map(workload_result).collect();
    let mut targets: Vec<Verdict> = m
        .runs
        .parts
        .iter()
        .zip(&workloads)
        .map(|(runs, r)| verdicts::ratio(runs.part, r))
        .collect();
    // Against the peer only where its job exists: retransmits, in the loss
    // case (elsewhere its one hook never fires; the Peers table shows those).
    for r in workloads.iter().filter(|r| r.key == "iperf3_loss") {
        targets.push(peers::factor_verdict(
            &r.versus_peer,
            r.key,
            peers::PEER_FACTOR_TARGET,
        ));
    }
    let unit_costs = costs::unit_costs(m, &workloads);
    targets.push(verdicts::ns_per_sent_segment(&unit_costs, "sockperf"));
    let peer_rounds: Vec<PeerCost> = parts::peer_rounds(
        &m.runs.parts,
        settings.rounds,
        |w| w.peer_bpf_stats(0),
        |r| &r.programs,
    );
    let filters = ["--netns", "CLIENT_NS"];
    let cmd = |args: Vec<String>| {
        format!(
            "ip netns exec CLIENT_NS {} {}",
            workload::client_prefix(settings.runtime_s).join(" "),
            args.join(" ")
        )
    };
    let addr = "SERVER_ADDR";
    NetResults {
        host,
        command: "cargo xtask bench net",
        wall_time_s,
        setup: Setup {
            paired: PairedSetup::new(
                settings,
                tracer::command_line_with(false, &filters),
                CONFIGS,
                FLOOR_SETUP,
            ),
            network: format!(
                "two network namespaces of the bench's own (client, server) joined by a veth \
                 pair, an IPv4 /30 in 10.201.0.0/16, no route outside; veth defaults (TSO/GSO \
                 on, GRO off, qdisc noqueue); tcp_no_metrics_save=1 in both; every client and \
                 server pinned to CPU {} (taskset), the daemon not",
                workload::CPU
            ),
            congestion_control: m.congestion_control.clone(),
            sockperf: cmd(workload::sockperf_args(addr, settings.runtime_s)),
            iperf3: cmd(workload::iperf3_args(
                addr,
                workload::IPERF3_PORT,
                None,
                settings.runtime_s,
            )),
            iperf3_loss: cmd(workload::iperf3_args(
                addr,
                workload::IPERF3_LOSS_PORT,
                Some(workload::LOSS_RATE),
                settings.runtime_s,
            )),
            loss_rule: format!(
                "in the server namespace: table inet {}, chain input (hook input, priority \
                 filter): meta l4proto {{ tcp, udp }} th dport {port} numgen random mod 100 < \
                 {percent} counter drop, and the same for th sport {port}",
                Owner::Bench.nft_table(),
                port = workload::IPERF3_LOSS_PORT,
                percent = workload::LOSS_PERCENT
            ),
        },
        hooks: m.hooks.clone(),
        targets,
        unit_cost_formula: unitcost::FORMULA,
        unit_costs,
        floor: floor::result(settings, m),
        programs: program_results(m),
        workloads,
        peer: PeerInfo::new(&peers::TCP_RETRANSMIT, &peer_rounds, m.unavailable.clone()),
        daemon_lives: costs::lives(m),
        lost: programs::lost(m.runs.daemons.iter().map(|l| &l.stop)),
        load_average,
        warnings: m.runs.warnings.clone(),
    }
}

#[cfg(test)]
mod tests;
