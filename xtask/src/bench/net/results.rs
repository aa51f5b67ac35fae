//! From raw runs to the published figures: medians and ranges per workload
//! and configuration, ratios traced / untraced (the targets are judged on the
//! traced runs without `--bpf-stats`), per-program cost summed over the
//! `--bpf-stats` runs. Everything here is serialized as-is into benchmarks.json.

use std::collections::BTreeMap;

use serde::Serialize;

use super::workload::{self, Bound, Run, Workload};
use super::{Measured, RATIO_TARGET, TracedRun, WorkloadRuns, on_net_path};
use crate::bench::netpair::NFT_TABLE;
use crate::bench::peers::{self, Comparison, PeerInfo};
use crate::bench::publish::{Host, Verdict};
use crate::bench::settings::Settings;
use crate::bench::stats::{Summary, summary};
use crate::bench::tracer::programs::{self, InPart, ProgramTotal};
use crate::bench::tracer::{self, ProgramCost};

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
    /// Network-path programs (every family but block), summed over the `--bpf-stats` runs.
    pub programs: Vec<ProgramResult>,
    /// Records the daemon could not deliver, summed over both traced configurations.
    pub lost: BTreeMap<String, u64>,
    /// /proc/loadavg before and after: a busy host shows here.
    pub load_average: [String; 2],
    pub warnings: Vec<String>,
}

#[derive(Serialize)]
pub struct Setup {
    pub rounds: usize,
    pub runtime_s: u64,
    pub network: String,
    pub congestion_control: String,
    pub sockperf: String,
    pub iperf3: String,
    pub iperf3_loss: String,
    pub loss_rule: String,
    /// The "traced" configuration: stalltrace as deployed.
    pub tracer: String,
    /// The "traced_bpf_stats" configuration.
    pub tracer_bpf_stats: String,
    pub configs: &'static str,
}

pub const CONFIGS: &str = "per round and workload, in this order: untraced; traced \
     (stalltrace without --bpf-stats: the ratios and the targets use it; the daemon's CPU \
     and RSS come from it); traced_bpf_stats (stalltrace with --bpf-stats: ns/event and \
     events/s per program come from it; its figures pay the kernel's accounting on every \
     program run and judge nothing)";

#[derive(Serialize)]
pub struct Side {
    /// Every figure the workload's tool gave, over the rounds.
    pub figures: BTreeMap<&'static str, Summary>,
    pub others_user_cpu_pct: Summary,
    pub steal_pct: Summary,
    pub runs: Vec<Run>,
}

#[derive(Serialize)]
pub struct WorkloadResult {
    pub key: &'static str,
    pub title: &'static str,
    pub untraced: Side,
    /// Without --bpf-stats: what the ratios and the targets are about.
    pub traced: Side,
    /// With --bpf-stats: shown, judges nothing.
    pub traced_bpf_stats: Side,
    /// Medians, traced / untraced, per figure (where the untraced median is not 0).
    pub ratio: BTreeMap<&'static str, f64>,
    /// Medians, traced_bpf_stats / untraced.
    pub bpf_stats_ratio: BTreeMap<&'static str, f64>,
    /// The target figure of each traced run over the untraced run of the same
    /// round: less exposed to drift on a shared host than the ratio of medians.
    pub paired_ratio: Summary,
    pub paired_bpf_stats_ratio: Summary,
    /// From the traced runs (without --bpf-stats).
    pub daemon: Daemon,
    /// All network-path programs together, in the --bpf-stats runs.
    pub bpf: BpfLoad,
    /// A cross-check of the hooks against the kernel's own counters: runs of
    /// netdev's net_dev_start_xmit program over the packets both veth ends
    /// sent (`ip -s link`), per --bpf-stats run. At least 1 when no packet
    /// was missed (the daemon also sees packets outside the client's window
    /// and on other interfaces); None without that program.
    pub xmit_runs_per_veth_packet: Option<Summary>,
    /// The same from the daemon's own records, in both traced configurations:
    /// transmits on the client's veth its hooks saw over those the kernel
    /// counted (netlink), over the daemon's whole life; 1 when none was missed.
    pub tx_seen_per_counted: Coverage,
    /// The bpftrace peer as run (without bpf_stats), its ratios to untraced,
    /// and its cost per transaction against stalltrace's.
    pub peer: Side,
    pub peer_ratio: BTreeMap<&'static str, f64>,
    pub paired_peer_ratio: Summary,
    pub versus_peer: Comparison,
}

#[derive(Serialize)]
pub struct Coverage {
    pub traced: Option<Summary>,
    pub traced_bpf_stats: Option<Summary>,
}

fn coverage(runs: &[TracedRun]) -> Option<Summary> {
    let ratios: Vec<f64> = runs
        .iter()
        .filter(|r| r.tx_counted > 0)
        .map(|r| r.tx_seen as f64 / r.tx_counted as f64)
        .collect();
    Summary::of(&ratios)
}

#[derive(Serialize)]
pub struct Daemon {
    /// While the client ran: CPU time / wall time, in % of one CPU.
    pub cpu_pct_of_one_cpu: Summary,
    /// Whole life of each daemon: load, verify, attach, run, detach.
    pub lifetime_cpu_s: Summary,
    pub peak_rss_mib: Summary,
    /// Records it wrote per run, all types, and `tcp_retransmit` records.
    pub records: Summary,
    pub tcp_retransmit_records: Summary,
}

#[derive(Serialize)]
pub struct BpfLoad {
    /// Run time of the programs over the client's wall time, in % of one CPU.
    pub cpu_pct_of_one_cpu: f64,
    /// An estimate of the hooks' cost free of run-to-run noise: their run
    /// time as a share of what bounds the workload (sockperf: of the untraced
    /// p50 round trip; unpaced iperf3: of the one CPU it keeps busy); None
    /// for a paced workload. Measured with bpf_stats on, so a little high.
    pub share_of_bound: Option<f64>,
    /// Run time of the programs per transaction (`unit`).
    pub ns_per_unit: f64,
    pub unit: &'static str,
}

#[derive(Serialize)]
pub struct ProgramResult {
    #[serde(flatten)]
    pub total: ProgramTotal,
    pub by_workload: Vec<ProgramInWorkload>,
}

#[derive(Serialize)]
pub struct ProgramInWorkload {
    pub workload: &'static str,
    pub run_count: u64,
    pub ns_per_event: Option<f64>,
    /// Per second of client run time, in the --bpf-stats runs.
    pub events_per_s: f64,
    /// Per transaction (a round trip; a MB received).
    pub events_per_unit: f64,
}

fn side(runs: &[Run]) -> Side {
    let keys: Vec<&'static str> = runs
        .iter()
        .flat_map(|r| r.figures.keys().copied())
        .collect();
    Side {
        figures: keys
            .into_iter()
            .map(|k| (k, summary(runs.iter().map(|r| r.figure(k)))))
            .collect(),
        others_user_cpu_pct: summary(runs.iter().map(|r| r.others_user_cpu_pct)),
        steal_pct: summary(runs.iter().map(|r| r.steal_pct)),
        runs: runs.to_vec(),
    }
}

fn ratios(num: &Side, den: &Side) -> BTreeMap<&'static str, f64> {
    num.figures
        .iter()
        .filter_map(|(k, n)| {
            let d = den.figures.get(k)?.median;
            (d > 0.0).then(|| (*k, n.median / d))
        })
        .collect()
}

fn paired(untraced: &[Run], traced: &[TracedRun], key: &str) -> Summary {
    summary(
        untraced
            .iter()
            .zip(traced)
            .map(|(u, t)| t.run.figure(key) / u.figure(key)),
    )
}

fn daemon(traced: &[TracedRun]) -> Daemon {
    Daemon {
        cpu_pct_of_one_cpu: summary(
            traced
                .iter()
                .map(|t| 100.0 * t.cpu_in_window_s / t.window_s),
        ),
        lifetime_cpu_s: summary(traced.iter().map(|t| t.lifetime_cpu_s)),
        peak_rss_mib: summary(traced.iter().map(|t| t.peak_rss_kib as f64 / 1024.0)),
        records: summary(
            traced
                .iter()
                .map(|t| t.stop.records.values().sum::<u64>() as f64),
        ),
        tcp_retransmit_records: summary(
            traced
                .iter()
                .map(|t| t.stop.records.get("tcp_retransmit").copied().unwrap_or(0) as f64),
        ),
    }
}

/// Counters of the network-path programs, summed over `runs`, keyed by (family, program).
fn program_totals<'a>(
    runs: impl IntoIterator<Item = &'a TracedRun>,
) -> BTreeMap<programs::Key, ProgramCost> {
    programs::totals(runs.into_iter().map(|r| &r.stop), on_net_path)
}

/// Client seconds and transactions of the --bpf-stats runs of one workload.
fn exposure(runs: &WorkloadRuns) -> (f64, f64) {
    let unit = runs.workload.unit_figure;
    let s = &runs.traced_bpf_stats;
    (
        s.iter().map(|r| r.run.seconds).sum(),
        s.iter().map(|r| r.run.figure(unit)).sum(),
    )
}

fn xmit_coverage(runs: &WorkloadRuns) -> Option<Summary> {
    let ratios: Vec<f64> =
        runs.traced_bpf_stats
            .iter()
            .filter_map(|r| {
                let xmit =
                    r.stop.programs.iter().find(|p| {
                        p.family == "netdev" && p.program.ends_with("net_dev_start_xmit")
                    })?;
                let packets = r.run.figure("veth_packets");
                (packets > 0.0).then(|| xmit.run_count as f64 / packets)
            })
            .collect();
    Summary::of(&ratios)
}

fn bpf_load(runs: &WorkloadRuns, untraced: &Side) -> BpfLoad {
    let (seconds, units) = exposure(runs);
    let ns: u64 = program_totals(&runs.traced_bpf_stats)
        .values()
        .map(|p| p.run_time_ns)
        .sum();
    let cpu_pct_of_one_cpu = 100.0 * ns as f64 / 1e9 / seconds.max(f64::MIN_POSITIVE);
    let ns_per_unit = ns as f64 / units.max(f64::MIN_POSITIVE);
    let share_of_bound = match runs.workload.bound {
        Bound::RoundTrip => untraced
            .figures
            .get("p50_us")
            .filter(|p50| p50.median > 0.0)
            .map(|p50| ns_per_unit / (p50.median * 1000.0)),
        Bound::OneCpu => Some(cpu_pct_of_one_cpu / 100.0),
        Bound::Paced => None,
    };
    BpfLoad {
        cpu_pct_of_one_cpu,
        share_of_bound,
        ns_per_unit,
        unit: runs.workload.unit,
    }
}

pub fn aggregate(
    settings: &Settings,
    m: &Measured,
    host: Host,
    wall_time_s: f64,
    load_average: [String; 2],
) -> NetResults {
    let workloads: Vec<WorkloadResult> = m
        .workloads
        .iter()
        .map(|runs| {
            let w = runs.workload;
            let traced_runs = |t: &[TracedRun]| t.iter().map(|t| t.run.clone()).collect::<Vec<_>>();
            let (u, t, ts) = (
                side(&runs.untraced),
                side(&traced_runs(&runs.traced)),
                side(&traced_runs(&runs.traced_bpf_stats)),
            );
            let key = w.figures[0].key;
            let peer_runs: Vec<Run> = runs.peer.iter().map(|p| p.run.clone()).collect();
            let peer = side(&peer_runs);
            let bpf = bpf_load(runs, &u);
            let peer_cost = peers::sum_costs(runs.peer_bpf_stats.iter().map(|r| &r.programs));
            let peer_units: f64 = runs
                .peer_bpf_stats
                .iter()
                .map(|r| r.run.figure(w.unit_figure))
                .sum();
            let peer_ns_per_unit = peer_cost.run_time_ns as f64 / peer_units.max(f64::MIN_POSITIVE);
            // Overhead as a fraction, positive when the tool made things worse.
            let overhead = |u: &Run, t: &Run| {
                let r = t.figure(key) / u.figure(key);
                if w.higher_is_better { 1.0 - r } else { r - 1.0 }
            };
            let st_programs: Vec<(String, u64, u64)> = program_totals(&runs.traced_bpf_stats)
                .into_values()
                .filter(|p| p.family == "tcp")
                .map(|p| (p.program, p.run_count, p.run_time_ns))
                .collect();
            let versus_peer = Comparison {
                same_hooks: peers::same_hooks(&["tcp_retransmit_skb"], &st_programs, &peer_cost),
                unit: w.unit.to_string(),
                stalltrace_ns_per_unit: bpf.ns_per_unit,
                peer_ns_per_unit,
                factor: peer_ns_per_unit / bpf.ns_per_unit.max(f64::MIN_POSITIVE),
                stalltrace_overhead: summary(
                    runs.untraced
                        .iter()
                        .zip(&runs.traced)
                        .map(|(u, t)| overhead(u, &t.run)),
                ),
                peer_overhead: summary(
                    runs.untraced
                        .iter()
                        .zip(&runs.peer)
                        .map(|(u, p)| overhead(u, &p.run)),
                ),
            };
            WorkloadResult {
                peer_ratio: ratios(&peer, &u),
                paired_peer_ratio: summary(
                    runs.untraced
                        .iter()
                        .zip(&runs.peer)
                        .map(|(u, p)| p.run.figure(key) / u.figure(key)),
                ),
                versus_peer,
                peer,
                key: w.key,
                title: w.title,
                ratio: ratios(&t, &u),
                bpf_stats_ratio: ratios(&ts, &u),
                paired_ratio: paired(&runs.untraced, &runs.traced, key),
                paired_bpf_stats_ratio: paired(&runs.untraced, &runs.traced_bpf_stats, key),
                daemon: daemon(&runs.traced),
                bpf,
                xmit_runs_per_veth_packet: xmit_coverage(runs),
                tx_seen_per_counted: Coverage {
                    traced: coverage(&runs.traced),
                    traced_bpf_stats: coverage(&runs.traced_bpf_stats),
                },
                untraced: u,
                traced: t,
                traced_bpf_stats: ts,
            }
        })
        .collect();

    let per_workload: Vec<_> = m
        .workloads
        .iter()
        .map(|runs| {
            let (seconds, units) = exposure(runs);
            (
                runs.workload.key,
                program_totals(&runs.traced_bpf_stats),
                seconds,
                units,
            )
        })
        .collect();
    let programs: Vec<ProgramResult> =
        program_totals(m.workloads.iter().flat_map(|w| &w.traced_bpf_stats))
            .into_iter()
            .map(|(key, total)| ProgramResult {
                by_workload: per_workload
                    .iter()
                    .map(|(workload, totals, seconds, units)| {
                        let p = InPart::of(totals, &key, *seconds);
                        ProgramInWorkload {
                            workload,
                            run_count: p.run_count,
                            ns_per_event: p.ns_per_event,
                            events_per_s: p.events_per_s,
                            events_per_unit: p.run_count as f64 / units.max(f64::MIN_POSITIVE),
                        }
                    })
                    .collect(),
                total: total.into(),
            })
            .collect();

    let lost = programs::lost(
        m.workloads
            .iter()
            .flat_map(|w| w.traced.iter().chain(&w.traced_bpf_stats))
            .map(|r| &r.stop),
    );

    let mut targets: Vec<Verdict> = m
        .workloads
        .iter()
        .zip(&workloads)
        .map(|(runs, r)| verdict(runs.workload, r))
        .collect();
    // Against the peer only where its job exists: retransmits, in the loss
    // case (elsewhere its one hook never fires; the Peers table shows those).
    for r in workloads.iter().filter(|r| r.key == "iperf3_loss") {
        targets.push(peers::factor_verdict(&r.versus_peer, r.key));
    }
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
            rounds: settings.rounds,
            runtime_s: settings.runtime_s,
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
                "in the server namespace: table inet {NFT_TABLE}, chain input (hook input, \
                 priority filter): tcp dport {} numgen random mod 100 < {} counter drop",
                workload::IPERF3_LOSS_PORT,
                workload::LOSS_PERCENT
            ),
            tracer: tracer::command_line_with(false, &filters),
            tracer_bpf_stats: tracer::command_line_with(true, &filters),
            configs: CONFIGS,
        },
        hooks: m.hooks.clone(),
        targets,
        workloads,
        peer: PeerInfo::new(
            &peers::TCP_RETRANSMIT,
            peers::sum_costs(
                m.workloads
                    .iter()
                    .flat_map(|w| &w.peer_bpf_stats)
                    .map(|r| &r.programs),
            ),
            settings.rounds.min(super::BPF_STATS_ROUNDS),
            m.unavailable.clone(),
        ),
        programs,
        lost,
        load_average,
        warnings: m.warnings.clone(),
    }
}

/// The target on a workload's first figure: within 2% of untraced.
fn verdict(w: &Workload, r: &WorkloadResult) -> Verdict {
    let fig = &w.figures[0];
    let name = match w.key {
        "sockperf" => "sockperf round-trip p50".to_string(),
        "iperf3" => "iperf3 unpaced received throughput".to_string(),
        key => format!("{key} received throughput"),
    };
    let Some(&ratio) = r.ratio.get(fig.key) else {
        return Verdict {
            target: name,
            measured: "no figure".into(),
            met: false,
            detail: "not measured: the untraced median was 0".into(),
        };
    };
    let (bound, met, change, what) = if w.higher_is_better {
        let bound = 1.0 - RATIO_TARGET;
        (bound, ratio >= bound, (1.0 - ratio) * 100.0, "lost")
    } else {
        let bound = 1.0 + RATIO_TARGET;
        (bound, ratio <= bound, (ratio - 1.0) * 100.0, "added")
    };
    let op = if w.higher_is_better { ">=" } else { "<=" };
    let allowed = RATIO_TARGET * 100.0;
    let p = &r.paired_ratio;
    let paired = format!(
        "per-round ratios {:.3} ({:.3}–{:.3})",
        p.median, p.min, p.max
    );
    let change = if change >= 0.0 {
        format!("traced {what} {change:.1}%")
    } else {
        let opposite = if what == "lost" { "gained" } else { "took off" };
        format!("traced {opposite} {:.1}%", -change)
    };
    let margin = (allowed
        - (if w.higher_is_better {
            1.0 - ratio
        } else {
            ratio - 1.0
        }) * 100.0)
        .abs();
    Verdict {
        target: format!("{name}, traced / untraced {op} {bound:.2}"),
        measured: format!("{ratio:.3}"),
        met,
        detail: if met {
            format!(
                "met with {margin:.1} points to spare ({change}; {allowed:.0}% allowed; {paired})"
            )
        } else {
            format!("missed by {margin:.1} points ({change}; {allowed:.0}% allowed; {paired})")
        },
    }
}

#[cfg(test)]
mod tests;
