//! From raw runs to the published figures: medians and ranges per
//! configuration, per-program cost summed over traced rounds, and the verdict
//! on each target. Everything here is serialized as-is into benchmarks.json.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{IOPS_RATIO_TARGET, Measured, NS_PER_EVENT_TARGET, Settings, TracedRun};
use crate::bench::fio::{self, FioRun};
use crate::bench::publish::Host;
use crate::bench::stats::Summary;
use crate::bench::tracer;

#[derive(Serialize)]
pub struct BlockResults {
    pub host: Host,
    pub command: &'static str,
    pub wall_time_s: f64,
    pub setup: Setup,
    pub hooks: Vec<String>,
    pub depths: Vec<DepthResult>,
    /// Summed over every traced round of every depth.
    pub programs: Vec<ProgramResult>,
    /// Records the daemon could not deliver, summed over traced rounds.
    pub lost: BTreeMap<String, u64>,
    pub targets: Targets,
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
    pub tracer: String,
}

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
    pub traced: Side,
    /// Medians, traced / untraced.
    pub iops_ratio: f64,
    pub p99_ratio: f64,
    /// Each traced run over the untraced run just before it: less exposed to
    /// drift on a shared host than the ratio of medians.
    pub paired_iops_ratio: Summary,
    pub paired_p99_ratio: Summary,
    /// All programs' run time per I/O fio completed.
    pub bpf_ns_per_io: f64,
    pub daemon: Daemon,
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
    pub family: String,
    pub program: String,
    pub run_count: u64,
    pub run_time_ns: u64,
    pub recursion_misses: u64,
    /// None when it never ran.
    pub ns_per_event: Option<f64>,
    pub by_depth: Vec<ProgramAtDepth>,
}

#[derive(Serialize)]
pub struct ProgramAtDepth {
    pub iodepth: u32,
    pub run_count: u64,
    pub ns_per_event: Option<f64>,
    /// Per second of fio run time.
    pub events_per_s: f64,
    pub events_per_io: f64,
}

#[derive(Serialize)]
pub struct Targets {
    pub iops_ratio_qd16: Verdict,
    pub ns_per_event_per_hook: Verdict,
}

#[derive(Serialize)]
pub struct Verdict {
    pub target: String,
    pub measured: String,
    pub met: bool,
    /// How far inside or outside the target, in words.
    pub detail: String,
}

fn summary(v: impl IntoIterator<Item = f64>) -> Summary {
    Summary::of(&v.into_iter().collect::<Vec<_>>()).expect("at least one round")
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

/// Counters of every program, summed over `runs`, keyed by (family, program).
fn program_totals<'a>(
    runs: impl IntoIterator<Item = &'a TracedRun>,
) -> BTreeMap<(String, String), tracer::ProgramCost> {
    let mut out: BTreeMap<(String, String), tracer::ProgramCost> = BTreeMap::new();
    for p in runs.into_iter().flat_map(|r| &r.stop.programs) {
        let e = out
            .entry((p.family.clone(), p.program.clone()))
            .or_insert_with(|| tracer::ProgramCost {
                run_count: 0,
                run_time_ns: 0,
                recursion_misses: 0,
                ..p.clone()
            });
        e.run_count += p.run_count;
        e.run_time_ns += p.run_time_ns;
        e.recursion_misses += p.recursion_misses;
    }
    out
}

fn ns_per_event(p: &tracer::ProgramCost) -> Option<f64> {
    (p.run_count > 0).then(|| p.run_time_ns as f64 / p.run_count as f64)
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
            let (u, t) = (
                side(&d.untraced),
                side(&d.traced.iter().map(|r| r.fio).collect::<Vec<_>>()),
            );
            let pairs = || d.untraced.iter().zip(&d.traced);
            let ios: u64 = d.traced.iter().map(|r| r.fio.ios).sum();
            let bpf_ns: u64 = program_totals(&d.traced)
                .values()
                .map(|p| p.run_time_ns)
                .sum();
            DepthResult {
                iodepth: d.iodepth,
                iops_ratio: t.iops.median / u.iops.median,
                p99_ratio: t.p99_us.median / u.p99_us.median,
                paired_iops_ratio: summary(pairs().map(|(u, t)| t.fio.iops / u.iops)),
                paired_p99_ratio: summary(pairs().map(|(u, t)| t.fio.p99_us / u.p99_us)),
                bpf_ns_per_io: bpf_ns as f64 / ios.max(1) as f64,
                untraced: u,
                traced: t,
                daemon: daemon(&d.traced),
            }
        })
        .collect();

    let per_depth: Vec<_> = m
        .depths
        .iter()
        .map(|d| {
            let seconds: f64 = d.traced.iter().map(|r| r.fio.runtime_s).sum();
            let ios: u64 = d.traced.iter().map(|r| r.fio.ios).sum();
            (d.iodepth, program_totals(&d.traced), seconds, ios)
        })
        .collect();
    let programs: Vec<ProgramResult> = program_totals(m.depths.iter().flat_map(|d| &d.traced))
        .into_iter()
        .map(|(key, total)| ProgramResult {
            ns_per_event: ns_per_event(&total),
            by_depth: per_depth
                .iter()
                .map(|(iodepth, totals, seconds, ios)| {
                    let p = totals.get(&key);
                    let count = p.map_or(0, |p| p.run_count);
                    ProgramAtDepth {
                        iodepth: *iodepth,
                        run_count: count,
                        ns_per_event: p.and_then(ns_per_event),
                        events_per_s: count as f64 / seconds.max(f64::MIN_POSITIVE),
                        events_per_io: count as f64 / (*ios).max(1) as f64,
                    }
                })
                .collect(),
            family: total.family,
            program: total.program,
            run_count: total.run_count,
            run_time_ns: total.run_time_ns,
            recursion_misses: total.recursion_misses,
        })
        .collect();

    let mut lost = BTreeMap::new();
    for run in m.depths.iter().flat_map(|d| &d.traced) {
        for (source, n) in &run.stop.lost {
            *lost.entry(source.clone()).or_insert(0) += n;
        }
    }

    let headline = depths
        .iter()
        .find(|d| d.iodepth == 16)
        .unwrap_or(&depths[0]);
    BlockResults {
        targets: Targets {
            iops_ratio_qd16: iops_verdict(headline.iops_ratio),
            ns_per_event_per_hook: ns_verdict(&programs),
        },
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
            tracer: format!("stalltrace {} --out FILE", tracer::ARGS.join(" ")),
        },
        hooks: m.hooks.clone(),
        depths,
        programs,
        lost,
        load_average,
        warnings: m.warnings.clone(),
    }
}

fn iops_verdict(ratio: f64) -> Verdict {
    let met = ratio >= IOPS_RATIO_TARGET;
    let lost_pct = (1.0 - ratio) * 100.0;
    let allowed_pct = (1.0 - IOPS_RATIO_TARGET) * 100.0;
    Verdict {
        target: format!("traced/untraced IOPS at QD16 >= {IOPS_RATIO_TARGET}"),
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
        .filter_map(|p| Some((p.program.as_str(), p.ns_per_event?)))
        .collect();
    let Some(&(worst, worst_ns)) = ran.iter().max_by(|a, b| a.1.total_cmp(&b.1)) else {
        return Verdict {
            target,
            measured: "no program ran".into(),
            met: false,
            detail: "not measured: no program counted a run (bpf_stats off?)".into(),
        };
    };
    let over = ran
        .iter()
        .filter(|(_, ns)| *ns > NS_PER_EVENT_TARGET)
        .count();
    let idle: Vec<&str> = programs
        .iter()
        .filter(|p| p.ns_per_event.is_none())
        .map(|p| p.program.as_str())
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
