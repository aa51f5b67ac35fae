//! What the block and net suites share between measuring and publishing:
//! both measure parts (fio's depths, the net workloads), each part in the
//! same five configurations round by round (see `paired`), and both sum the
//! same per-program counters over them. Only the part's name, its unit and
//! the programs a suite keeps differ, so those come in as arguments and the
//! logic stands here once.

use std::collections::BTreeMap;

use serde::Serialize;

use super::paired::{self, PartRuns, ProcessUse, TracedRun};
use super::peers::{self, PeerCost, PeerProgram};
use super::settings::Settings;
use super::stats::Estimate;
use super::table;
use super::tracer::ProgramCost;
use super::tracer::StopRecord;
use super::tracer::programs::{self, InPart, Key, ProgramTotal};

/// What every paired suite publishes of how it ran (flattened into the
/// suite's own setup, beside what it says of its workloads).
#[derive(Serialize)]
pub struct PairedSetup {
    pub rounds: usize,
    pub runtime_s: u64,
    /// The daemon of the traced block: stalltrace as deployed.
    pub tracer: String,
    /// How the runs with the accounting differ.
    pub tracer_bpf_stats: &'static str,
    /// The order of play.
    pub order: &'static str,
    /// What each configuration is for, in words.
    pub configs: &'static str,
    /// How the floor is measured; what it is, under `floor`.
    pub floor: &'static str,
}

impl PairedSetup {
    pub fn new(
        settings: &Settings,
        tracer: String,
        configs: &'static str,
        floor: &'static str,
    ) -> Self {
        PairedSetup {
            rounds: settings.rounds,
            runtime_s: settings.runtime_s,
            tracer,
            tracer_bpf_stats: paired::TRACER_BPF_STATS,
            order: paired::ORDER,
            configs,
            floor,
        }
    }
}

/// A process's use while the workload ran, in the runs without the accounting.
#[derive(Serialize)]
pub struct ProcessResult {
    pub cpu_pct_of_one_cpu: Option<Estimate>,
    /// The largest VmHWM over the rounds.
    pub peak_rss_mib: f64,
}

pub fn process<'a>(uses: impl IntoIterator<Item = &'a ProcessUse>) -> ProcessResult {
    let uses: Vec<&ProcessUse> = uses.into_iter().collect();
    ProcessResult {
        cpu_pct_of_one_cpu: Estimate::of(uses.iter().map(|u| u.cpu_pct_of_one_cpu())),
        peak_rss_mib: uses.iter().map(|u| u.peak_rss_mib()).fold(0.0, f64::max),
    }
}

/// The daemon's own table: its CPU while each part's workload ran (`during`:
/// "fio", "the client") and its peak RSS, one row per part (`part`: the
/// first column's header).
pub fn daemon_table<'a>(
    part: &str,
    during: &str,
    rows: impl IntoIterator<Item = (String, &'a ProcessResult)>,
) -> String {
    let rows: Vec<Vec<String>> = rows
        .into_iter()
        .map(|(label, d)| {
            let cpu = d.cpu_pct_of_one_cpu.as_ref();
            vec![
                label,
                cpu.map_or("–".into(), |e| e.text(2)),
                cpu.map_or("–".into(), |e| e.range_text(2)),
                format!("{:.1}", d.peak_rss_mib),
            ]
        })
        .collect();
    let cpu = format!("CPU % of one CPU while {during} ran, median [95% CI]");
    "\n### The daemon itself (traced runs, without the accounting)\n\n".to_string()
        + &table::markdown(&[part, &cpu, "min–max", "peak RSS MiB (VmHWM)"], &rows)
}

/// Round by round (index i is round i + 1), the runs of every part that
/// has one for that round.
pub fn by_round<'a, P, R>(parts: &'a [P], runs: impl Fn(&'a P) -> &'a [R]) -> Vec<Vec<&'a R>> {
    let rounds = parts.iter().map(|p| runs(p).len()).max().unwrap_or(0);
    (0..rounds)
        .map(|i| parts.iter().filter_map(|p| runs(p).get(i)).collect())
        .collect()
}

/// The peer's programs summed per round over every part, for the first
/// `rounds` rounds.
pub fn peer_rounds<'a, P, R: 'a>(
    parts: &'a [P],
    rounds: usize,
    runs: impl Fn(&'a P) -> &'a [R],
    programs: impl Fn(&'a R) -> &'a Vec<PeerProgram>,
) -> Vec<PeerCost> {
    by_round(parts, runs)
        .into_iter()
        .take(rounds)
        .map(|runs| peers::sum_costs(runs.into_iter().map(&programs)))
        .collect()
}

/// The counters of the programs `keep` selects (by family), summed over
/// `runs`, keyed by (family, program).
pub fn program_totals<'a, R: 'a>(
    runs: impl IntoIterator<Item = &'a TracedRun<R, ProgramCost>>,
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<Key, ProgramCost> {
    programs::sum(runs.into_iter().flat_map(|r| &r.programs), keep)
}

/// One part's accounting runs as the per-program table needs them: its
/// programs' totals, the seconds its client ran and the units it completed.
pub struct PartTotals {
    pub totals: BTreeMap<Key, ProgramCost>,
    pub seconds: f64,
    pub units: f64,
}

/// One program over every accounting run, round by round and part by part
/// (`Rows`: its row in each part, under the suite's own key).
#[derive(Serialize)]
pub struct ProgramResult<Rows> {
    #[serde(flatten)]
    pub total: ProgramTotal,
    /// ns/event in each round's accounting runs (every part): median and interval.
    pub by_round: Option<Estimate>,
    #[serde(flatten)]
    pub by_part: Rows,
}

/// Each program the suite keeps (`keep`: by family), summed over every
/// accounting run of `parts`, with recursion misses from the daemons'
/// `stops`. `seconds_and_units` reads one run (a part's unit: an I/O, a
/// transaction); `row` words one program in one part (a depth's or a
/// workload's own field names), and `rows` names the parts' rows.
pub fn program_results<'a, K, R, X, Rows>(
    parts: &'a [PartRuns<K, R>],
    stops: impl IntoIterator<Item = &'a StopRecord>,
    keep: impl Fn(&str) -> bool + Copy,
    (seconds_and_units, row, rows): (
        impl Fn(&K, &R) -> (f64, f64),
        impl Fn(&K, &PartTotals, InPart) -> X,
        impl Fn(Vec<X>) -> Rows,
    ),
) -> Vec<ProgramResult<Rows>> {
    let per_part: Vec<PartTotals> = parts
        .iter()
        .map(|p| {
            let runs = p.traced_bpf_stats();
            let (seconds, units) = runs
                .iter()
                .map(|r| seconds_and_units(&p.part, &r.run))
                .fold((0.0, 0.0), |(s, u), (rs, ru)| (s + rs, u + ru));
            PartTotals {
                totals: program_totals(runs, keep),
                seconds,
                units,
            }
        })
        .collect();
    let per_round: Vec<BTreeMap<Key, ProgramCost>> = by_round(parts, |p| p.traced_bpf_stats())
        .into_iter()
        .map(|runs| program_totals(runs, keep))
        .collect();
    let all = program_totals(parts.iter().flat_map(|p| p.traced_bpf_stats()), keep);
    let recursion = programs::totals(stops, keep);
    all.into_iter()
        .map(|(key, mut total)| {
            total.recursion_misses = recursion.get(&key).map_or(0, |p| p.recursion_misses);
            ProgramResult {
                by_round: Estimate::of(
                    per_round
                        .iter()
                        .filter_map(|r| programs::ns_per_event(r.get(&key)?)),
                ),
                by_part: rows(
                    parts
                        .iter()
                        .zip(&per_part)
                        .map(|(p, t)| row(&p.part, t, InPart::of(&t.totals, &key, t.seconds)))
                        .collect(),
                ),
                total: total.into(),
            }
        })
        .collect()
}

/// The results tests' harness: what the suites' tests build their runs
/// from, and the checks they make of the results.
#[cfg(test)]
pub mod fixtures {
    use super::{PeerProgram, ProgramCost, Settings};
    use crate::bench::floor::{AttachPoint, Kind};
    use crate::bench::paired::ProcessUse;
    use crate::bench::publish::{Host, Verdict};
    use crate::bench::stats::Outcome;

    pub fn settings(rounds: usize, runtime_s: u64) -> Settings {
        Settings { rounds, runtime_s }
    }

    pub fn peer_program(tracepoint: &str, run_count: u64, ns_each: u64) -> PeerProgram {
        PeerProgram {
            tracepoint: tracepoint.into(),
            run_count,
            run_time_ns: run_count * ns_each,
        }
    }

    /// A floor program's attach point on `hook`'s tracepoint.
    pub fn tp_btf(hook: &str) -> AttachPoint {
        AttachPoint {
            hook: hook.into(),
            kind: Kind::TpBtf,
            target: hook.into(),
        }
    }

    /// Equal but for the last bits of a float.
    #[track_caller]
    pub fn assert_near(actual: f64, expected: f64) {
        assert!(
            (actual - expected).abs() < 1e-9,
            "{actual} is not {expected}"
        );
    }

    /// The verdict's outcome, its detail shown when it is another.
    #[track_caller]
    pub fn assert_outcome(v: &Verdict, outcome: Outcome) {
        assert_eq!(v.outcome, outcome, "{}: {}", v.target, v.detail);
    }

    /// Every one of `needles` in the rendered `md`.
    #[track_caller]
    pub fn assert_shows(md: &str, needles: &[&str]) {
        for needle in needles {
            assert!(md.contains(needle), "{needle}\n---\n{md}");
        }
    }

    pub fn cost(family: &str, program: &str, run_count: u64, ns_each: u64) -> ProgramCost {
        ProgramCost {
            family: family.into(),
            program: program.into(),
            run_count,
            run_time_ns: run_count * ns_each,
            recursion_misses: 0,
        }
    }

    pub fn usage(cpu_s: f64, window_s: f64, peak_rss_kib: u64) -> ProcessUse {
        ProcessUse {
            cpu_s,
            window_s,
            peak_rss_kib,
        }
    }

    pub fn host() -> Host {
        Host {
            date: "today".into(),
            kernel: "6.18".into(),
            cpu_model: "test".into(),
            cpus: 2,
        }
    }
}
