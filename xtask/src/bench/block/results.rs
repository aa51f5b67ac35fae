//! From raw runs to the published figures: medians and ranges per
//! configuration, per-program cost summed over the `--bpf-stats` rounds, and
//! the verdict on each target (IOPS judged on the traced runs without
//! `--bpf-stats`, ns/event on the runs with it). Everything here is serialized
//! as-is into benchmarks.json.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{IOPS_RATIO_TARGET, Measured, NS_PER_EVENT_TARGET, PeerRun, Settings, TracedRun};
use crate::bench::fio::{self, FioRun};
use crate::bench::peers::{self, Comparison, PeerCost, PeerInfo};
use crate::bench::publish::{Host, Verdict};
use crate::bench::stats::{Summary, summary};
use crate::bench::tracer::programs::{self, InPart, ProgramTotal};
use crate::bench::tracer::{self, ProgramCost};

#[derive(Serialize)]
pub struct BlockResults {
    pub host: Host,
    pub command: &'static str,
    pub wall_time_s: f64,
    pub setup: Setup,
    pub hooks: Vec<String>,
    pub depths: Vec<DepthResult>,
    /// Summed over every `--bpf-stats` round of every depth.
    pub programs: Vec<ProgramResult>,
    /// Records the daemon could not deliver, summed over both traced configurations.
    pub lost: BTreeMap<String, u64>,
    /// What any hook costs on this VM before it does anything: not measured by this suite.
    pub floor: Floor,
    pub targets: Targets,
    /// The bpftrace peer doing the same job, and the usual peers that cannot run here.
    pub peer: PeerInfo,
    /// /proc/loadavg before and after: a busy host shows here.
    pub load_average: [String; 2],
    pub warnings: Vec<String>,
}

#[derive(Serialize)]
pub struct Setup {
    pub rounds: usize,
    pub runtime_s: u64,
    pub file_mib: u64,
    pub loop_direct_io: bool,
    pub fio: String,
    /// The "traced" configuration: stalltrace as deployed.
    pub tracer: String,
    /// The "traced_bpf_stats" configuration.
    pub tracer_bpf_stats: String,
    /// What each configuration is for, in words.
    pub configs: &'static str,
}

pub const CONFIGS: &str = "per round and depth, in this order: untraced; traced \
     (stalltrace without --bpf-stats: the IOPS and p99 ratios and the IOPS target use it; \
     the daemon's CPU and RSS come from it); traced_bpf_stats (stalltrace with --bpf-stats: \
     ns/event and events/s per program come from it; its IOPS pay the kernel's accounting \
     on every program run and judge nothing)";

/// Measured separately on this VM with a scratch loader, not by this suite;
/// the figures are constants in the source, published so ns/event can be read
/// against them.
#[derive(Serialize)]
pub struct Floor {
    /// ns/event of an empty tp_btf program on block_rq_issue, bpf_stats on.
    pub empty_tp_btf_ns: f64,
    /// One bpf_ktime_get_ns() call from a program.
    pub ktime_get_ns_call_ns: f64,
    pub source: &'static str,
}

pub const FLOOR: Floor = Floor {
    empty_tp_btf_ns: 60.0,
    ktime_get_ns_call_ns: 60.0,
    source: "measured separately on this VM with a scratch loader, not by this suite",
};

#[derive(Serialize)]
pub struct Side {
    pub iops: Summary,
    pub p50_us: Summary,
    pub p99_us: Summary,
    pub others_user_cpu_pct: Summary,
    pub steal_pct: Summary,
    pub runs: Vec<FioRun>,
}

#[derive(Serialize)]
pub struct DepthResult {
    pub iodepth: u32,
    pub untraced: Side,
    /// Without --bpf-stats: what the ratios and the target are about.
    pub traced: Side,
    /// With --bpf-stats: shown, judges nothing.
    pub traced_bpf_stats: Side,
    /// Medians, traced / untraced.
    pub iops_ratio: f64,
    pub p99_ratio: f64,
    /// Each traced run over the untraced run of the same round: less exposed
    /// to drift on a shared host than the ratio of medians.
    pub paired_iops_ratio: Summary,
    pub paired_p99_ratio: Summary,
    /// Medians, traced_bpf_stats / untraced.
    pub bpf_stats_iops_ratio: f64,
    pub bpf_stats_p99_ratio: f64,
    /// Each traced_bpf_stats run over the untraced run of the same round.
    pub paired_bpf_stats_iops_ratio: Summary,
    /// All programs' run time per I/O fio completed, in the --bpf-stats runs.
    pub bpf_ns_per_io: f64,
    /// From the traced runs (without --bpf-stats).
    pub daemon: Daemon,
    /// The bpftrace peer as run (without bpf_stats), and its ratios to untraced.
    pub peer: Side,
    pub peer_iops_ratio: f64,
    pub peer_p99_ratio: f64,
    pub paired_peer_iops_ratio: Summary,
    /// The peer's programs' run time per I/O fio completed, in its bpf_stats runs.
    pub peer_ns_per_io: f64,
    pub peer_cost: PeerCost,
    /// stalltrace against the peer, per I/O.
    pub versus_peer: Comparison,
}

#[derive(Serialize)]
pub struct Daemon {
    /// While fio ran: CPU time / wall time, in % of one CPU.
    pub cpu_pct_of_one_cpu: Summary,
    /// Whole life of each daemon: load, verify, attach, run, detach.
    pub lifetime_cpu_s: Summary,
    pub peak_rss_mib: Summary,
}

#[derive(Serialize)]
pub struct ProgramResult {
    #[serde(flatten)]
    pub total: ProgramTotal,
    pub by_depth: Vec<ProgramAtDepth>,
}

#[derive(Serialize)]
pub struct ProgramAtDepth {
    pub iodepth: u32,
    pub run_count: u64,
    pub ns_per_event: Option<f64>,
    /// Per second of fio run time, in the --bpf-stats runs.
    pub events_per_s: f64,
    pub events_per_io: f64,
}

#[derive(Serialize)]
pub struct Targets {
    pub iops_ratio_qd16: Verdict,
    pub ns_per_event_per_hook: Verdict,
    /// At QD16: stalltrace's BPF time per I/O at most a third of the peer's.
    pub versus_peer_qd16: Verdict,
}

fn side(runs: &[FioRun]) -> Side {
    Side {
        iops: summary(runs.iter().map(|r| r.iops)),
        p50_us: summary(runs.iter().map(|r| r.p50_us)),
        p99_us: summary(runs.iter().map(|r| r.p99_us)),
        others_user_cpu_pct: summary(runs.iter().map(|r| r.others_user_cpu_pct)),
        steal_pct: summary(runs.iter().map(|r| r.steal_pct)),
        runs: runs.to_vec(),
    }
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
    }
}

/// Counters of every block program, summed over `runs`, keyed by (family,
/// program); the daemon's other families (run for the VM's own traffic) are
/// the net suite's business.
fn program_totals<'a>(
    runs: impl IntoIterator<Item = &'a TracedRun>,
) -> BTreeMap<programs::Key, ProgramCost> {
    programs::totals(runs.into_iter().map(|r| &r.stop), |f| f == "block")
}

fn fio_runs(traced: &[TracedRun]) -> Vec<FioRun> {
    traced.iter().map(|r| r.fio).collect()
}

fn peer_fio(runs: &[PeerRun]) -> Vec<FioRun> {
    runs.iter().map(|r| r.fio).collect()
}

pub fn aggregate(
    settings: &Settings,
    m: &Measured,
    host: Host,
    wall_time_s: f64,
    load_average: [String; 2],
) -> BlockResults {
    let depths: Vec<DepthResult> = m
        .depths
        .iter()
        .map(|d| {
            let (u, t, ts) = (
                side(&d.untraced),
                side(&fio_runs(&d.traced)),
                side(&fio_runs(&d.traced_bpf_stats)),
            );
            let pairs = || d.untraced.iter().zip(&d.traced);
            let stats_pairs = || d.untraced.iter().zip(&d.traced_bpf_stats);
            let ios: u64 = d.traced_bpf_stats.iter().map(|r| r.fio.ios).sum();
            let bpf_ns: u64 = program_totals(&d.traced_bpf_stats)
                .values()
                .map(|p| p.run_time_ns)
                .sum();
            let peer = side(&peer_fio(&d.peer));
            let peer_cost = peers::sum_costs(d.peer_bpf_stats.iter().map(|r| &r.programs));
            let peer_ios: u64 = d.peer_bpf_stats.iter().map(|r| r.fio.ios).sum();
            let peer_ns_per_io = peer_cost.run_time_ns as f64 / peer_ios.max(1) as f64;
            let bpf_ns_per_io = bpf_ns as f64 / ios.max(1) as f64;
            let paired_peer_iops_ratio = summary(
                d.untraced
                    .iter()
                    .zip(&d.peer)
                    .map(|(u, p)| p.fio.iops / u.iops),
            );
            let st_programs: Vec<(String, u64, u64)> = program_totals(&d.traced_bpf_stats)
                .into_values()
                .map(|p| (p.program, p.run_count, p.run_time_ns))
                .collect();
            let versus_peer = Comparison {
                same_hooks: peers::same_hooks(
                    &["block_rq_issue", "block_rq_complete"],
                    &st_programs,
                    &peer_cost,
                ),
                unit: "I/O".into(),
                stalltrace_ns_per_unit: bpf_ns_per_io,
                peer_ns_per_unit: peer_ns_per_io,
                factor: peer_ns_per_io / bpf_ns_per_io.max(f64::MIN_POSITIVE),
                stalltrace_overhead: summary(pairs().map(|(u, t)| 1.0 - t.fio.iops / u.iops)),
                peer_overhead: summary(
                    d.untraced
                        .iter()
                        .zip(&d.peer)
                        .map(|(u, p)| 1.0 - p.fio.iops / u.iops),
                ),
            };
            DepthResult {
                peer_iops_ratio: peer.iops.median / u.iops.median,
                peer_p99_ratio: peer.p99_us.median / u.p99_us.median,
                paired_peer_iops_ratio,
                peer_ns_per_io,
                peer_cost,
                versus_peer,
                peer,
                iodepth: d.iodepth,
                iops_ratio: t.iops.median / u.iops.median,
                p99_ratio: t.p99_us.median / u.p99_us.median,
                paired_iops_ratio: summary(pairs().map(|(u, t)| t.fio.iops / u.iops)),
                paired_p99_ratio: summary(pairs().map(|(u, t)| t.fio.p99_us / u.p99_us)),
                bpf_stats_iops_ratio: ts.iops.median / u.iops.median,
                bpf_stats_p99_ratio: ts.p99_us.median / u.p99_us.median,
                paired_bpf_stats_iops_ratio: summary(
                    stats_pairs().map(|(u, t)| t.fio.iops / u.iops),
                ),
                bpf_ns_per_io,
                untraced: u,
                traced: t,
                traced_bpf_stats: ts,
                daemon: daemon(&d.traced),
            }
        })
        .collect();

    let per_depth: Vec<_> = m
        .depths
        .iter()
        .map(|d| {
            let seconds: f64 = d.traced_bpf_stats.iter().map(|r| r.fio.runtime_s).sum();
            let ios: u64 = d.traced_bpf_stats.iter().map(|r| r.fio.ios).sum();
            (d.iodepth, program_totals(&d.traced_bpf_stats), seconds, ios)
        })
        .collect();
    let programs: Vec<ProgramResult> =
        program_totals(m.depths.iter().flat_map(|d| &d.traced_bpf_stats))
            .into_iter()
            .map(|(key, total)| ProgramResult {
                by_depth: per_depth
                    .iter()
                    .map(|(iodepth, totals, seconds, ios)| {
                        let p = InPart::of(totals, &key, *seconds);
                        ProgramAtDepth {
                            iodepth: *iodepth,
                            run_count: p.run_count,
                            ns_per_event: p.ns_per_event,
                            events_per_s: p.events_per_s,
                            events_per_io: p.run_count as f64 / (*ios).max(1) as f64,
                        }
                    })
                    .collect(),
                total: total.into(),
            })
            .collect();

    let lost = programs::lost(
        m.depths
            .iter()
            .flat_map(|d| d.traced.iter().chain(&d.traced_bpf_stats))
            .map(|r| &r.stop),
    );

    let headline = depths
        .iter()
        .find(|d| d.iodepth == 16)
        .unwrap_or(&depths[0]);
    BlockResults {
        targets: Targets {
            iops_ratio_qd16: iops_verdict(headline.iops_ratio),
            ns_per_event_per_hook: ns_verdict(&programs),
            versus_peer_qd16: peers::factor_verdict(
                &headline.versus_peer,
                &format!("QD{}", headline.iodepth),
            ),
        },
        peer: PeerInfo::new(
            &peers::BLOCK_LATENCY,
            peers::sum_costs(
                m.depths
                    .iter()
                    .flat_map(|d| &d.peer_bpf_stats)
                    .map(|r| &r.programs),
            ),
            settings.rounds.min(super::BPF_STATS_ROUNDS),
            m.unavailable.clone(),
        ),
        host,
        command: "cargo xtask bench block",
        wall_time_s,
        setup: Setup {
            rounds: settings.rounds,
            runtime_s: settings.runtime_s,
            file_mib: super::FILE_MIB,
            loop_direct_io: m.direct_io,
            fio: format!(
                "fio --name=stalltrace-bench --filename=/dev/loopN --iodepth={{16,1}} --runtime={}s {}",
                settings.runtime_s,
                fio::WORKLOAD.join(" ")
            ),
            tracer: tracer::command_line(false),
            tracer_bpf_stats: tracer::command_line(true),
            configs: CONFIGS,
        },
        hooks: m.hooks.clone(),
        depths,
        programs,
        lost,
        floor: FLOOR,
        load_average,
        warnings: m.warnings.clone(),
    }
}

fn iops_verdict(ratio: f64) -> Verdict {
    let met = ratio >= IOPS_RATIO_TARGET;
    let lost_pct = (1.0 - ratio) * 100.0;
    let allowed_pct = (1.0 - IOPS_RATIO_TARGET) * 100.0;
    Verdict {
        target: format!("traced (no --bpf-stats) / untraced IOPS at QD16 >= {IOPS_RATIO_TARGET}"),
        measured: format!("{ratio:.3}"),
        met,
        detail: if met {
            format!(
                "met with {:.3} to spare (traced lost {lost_pct:.1}% of IOPS; {allowed_pct:.0}% allowed)",
                ratio - IOPS_RATIO_TARGET
            )
        } else {
            format!(
                "missed by {:.3} (traced lost {lost_pct:.1}% of IOPS; {allowed_pct:.0}% allowed)",
                IOPS_RATIO_TARGET - ratio
            )
        },
    }
}

fn ns_verdict(programs: &[ProgramResult]) -> Verdict {
    let target = format!("<= {NS_PER_EVENT_TARGET:.0} ns per event, every hook");
    let ran: Vec<(&str, f64)> = programs
        .iter()
        .filter_map(|p| Some((p.total.program.as_str(), p.total.ns_per_event?)))
        .collect();
    let Some(&(worst, worst_ns)) = ran.iter().max_by(|a, b| a.1.total_cmp(&b.1)) else {
        return Verdict {
            target,
            measured: "no program ran".into(),
            met: false,
            detail: "not measured: no program counted a run in the --bpf-stats rounds".into(),
        };
    };
    let over = ran
        .iter()
        .filter(|(_, ns)| *ns > NS_PER_EVENT_TARGET)
        .count();
    let idle: Vec<&str> = programs
        .iter()
        .filter(|p| p.total.ns_per_event.is_none())
        .map(|p| p.total.program.as_str())
        .collect();
    let mut detail = if over == 0 {
        format!(
            "met by every hook; worst {worst} at {worst_ns:.0} ns, {:.0} ns to spare",
            NS_PER_EVENT_TARGET - worst_ns
        )
    } else {
        format!(
            "missed: {over} of {} hooks over; worst {worst} at {worst_ns:.0} ns, over by {:.0} ns ({:.1}x the target)",
            ran.len(),
            worst_ns - NS_PER_EVENT_TARGET,
            worst_ns / NS_PER_EVENT_TARGET
        )
    };
    if !idle.is_empty() {
        detail += &format!("; never ran: {}", idle.join(", "));
    }
    Verdict {
        target,
        measured: format!("worst {worst_ns:.0} ns ({worst})"),
        met: over == 0,
        detail,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::block::{DepthRuns, render};
    use crate::bench::tracer::{ProgramCost, StopRecord};

    fn fio(iops: f64, p99_us: f64) -> FioRun {
        FioRun {
            iops,
            p50_us: p99_us / 2.0,
            p99_us,
            ios: (iops * 10.0) as u64,
            runtime_s: 10.0,
            others_user_cpu_pct: 0.0,
            steal_pct: 0.0,
        }
    }

    fn traced(iops: f64, p99_us: f64, run_count: u64, cpu_s: f64) -> TracedRun {
        TracedRun {
            fio: fio(iops, p99_us),
            stop: StopRecord {
                kind: "stop".into(),
                lost: BTreeMap::new(),
                records: BTreeMap::new(),
                programs: vec![ProgramCost {
                    family: "block".into(),
                    program: "on_block_rq_issue".into(),
                    run_count,
                    run_time_ns: run_count * 100,
                    recursion_misses: 0,
                }],
            },
            cpu_in_window_s: cpu_s,
            window_s: 10.0,
            lifetime_cpu_s: cpu_s,
            peak_rss_kib: 1024,
        }
    }

    /// The ratios and the target come from the runs without --bpf-stats, the
    /// programs' cost from the runs with it, the daemon's figures from the former.
    #[test]
    fn each_figure_comes_from_its_configuration() {
        let m = Measured {
            depths: vec![DepthRuns {
                iodepth: 16,
                untraced: vec![fio(100_000.0, 100.0); 3],
                traced: (0..3).map(|_| traced(98_000.0, 110.0, 0, 0.01)).collect(),
                traced_bpf_stats: (0..3)
                    .map(|_| traced(80_000.0, 150.0, 800_000, 0.02))
                    .collect(),
                peer: (0..3)
                    .map(|_| PeerRun {
                        fio: fio(90_000.0, 120.0),
                        programs: Vec::new(),
                    })
                    .collect(),
                peer_bpf_stats: vec![PeerRun {
                    fio: fio(80_000.0, 150.0),
                    programs: vec![crate::bench::peers::PeerProgram {
                        tracepoint: "block_rq_issue".into(),
                        run_count: 800_000,
                        run_time_ns: 800_000 * 600,
                    }],
                }],
            }],
            direct_io: true,
            hooks: vec!["block_rq_issue (tp_btf)".into()],
            warnings: Vec::new(),
            unavailable: Vec::new(),
        };
        let settings = Settings {
            rounds: 3,
            runtime_s: 10,
        };
        let host = Host {
            date: "today".into(),
            kernel: "6.18".into(),
            cpu_model: "test".into(),
            cpus: 2,
        };
        let r = aggregate(&settings, &m, host, 1.0, [String::new(), String::new()]);
        let d = &r.depths[0];
        assert!((d.iops_ratio - 0.98).abs() < 1e-9);
        assert!((d.p99_ratio - 1.1).abs() < 1e-9);
        assert!((d.bpf_stats_iops_ratio - 0.8).abs() < 1e-9);
        assert!((d.paired_bpf_stats_iops_ratio.median - 0.8).abs() < 1e-9);
        assert!(r.targets.iops_ratio_qd16.met);
        assert!((d.daemon.cpu_pct_of_one_cpu.median - 0.1).abs() < 1e-9);

        let p = &r.programs[0];
        assert_eq!(p.total.run_count, 2_400_000);
        assert_eq!(p.total.ns_per_event, Some(100.0));
        assert!((p.by_depth[0].events_per_s - 80_000.0).abs() < 1e-9);
        assert!((p.by_depth[0].events_per_io - 1.0).abs() < 1e-9);
        assert!((d.bpf_ns_per_io - 100.0).abs() < 1e-9);
        assert!((d.peer_ns_per_io - 600.0).abs() < 1e-9);
        assert!((d.versus_peer.factor - 6.0).abs() < 1e-9);
        assert!(r.targets.versus_peer_qd16.met);
        assert!((d.peer_iops_ratio - 0.9).abs() < 1e-9);

        let md = render::markdown(&r);
        for needle in [
            "QD16 traced+bpf-stats/untraced",
            "Floor on this VM",
            "measured separately (not by this suite)",
        ] {
            assert!(
                md.to_lowercase().contains(&needle.to_lowercase()),
                "{needle}"
            );
        }
    }
}
