//! A peer's cost from the kernel's accounting, stalltrace's against it, and
//! the peer as the suites publish it.

use std::collections::BTreeMap;
use std::fmt::Write;

use serde::Serialize;

use super::{PeerProgram, Script, Unavailable};
use crate::bench::publish::Verdict;
use crate::bench::stats::{Estimate, Goal, judge};
use crate::bench::table;

/// A peer's cost from its bpf_stats runs: per program and in all.
#[derive(Serialize, Clone, Debug)]
pub struct PeerCost {
    pub programs: Vec<PeerProgram>,
    pub run_time_ns: u64,
}

/// Sum per tracepoint over runs.
pub fn sum_costs<'a>(runs: impl IntoIterator<Item = &'a Vec<PeerProgram>>) -> PeerCost {
    let mut by: BTreeMap<String, PeerProgram> = BTreeMap::new();
    for p in runs.into_iter().flatten() {
        let e = by
            .entry(p.tracepoint.clone())
            .or_insert_with(|| PeerProgram {
                tracepoint: p.tracepoint.clone(),
                ..Default::default()
            });
        e.run_count += p.run_count;
        e.run_time_ns += p.run_time_ns;
    }
    let programs: Vec<PeerProgram> = by.into_values().collect();
    PeerCost {
        run_time_ns: programs.iter().map(|p| p.run_time_ns).sum(),
        programs,
    }
}

/// The net suite's "≥ 3× less overhead than the cheapest peer doing the same job"
/// target (the block suite's is now "no more than the cheapest peer's": see
/// `block::CHEAPEST_PEER_FACTOR_TARGET`).
pub const PEER_FACTOR_TARGET: f64 = 3.0;

/// Verdict material: stalltrace's and the peer's BPF run time per unit of
/// work (every program of each, kernel bpf_stats, per I/O or per round
/// trip), and their overheads from the workload's own figures.
#[derive(Serialize, Clone, Debug)]
pub struct Comparison {
    pub unit: String,
    /// Over all bpf_stats runs (their run time summed over their units summed).
    pub stalltrace_ns_per_unit: f64,
    pub peer_ns_per_unit: f64,
    /// The same, round by round: median and interval.
    pub stalltrace_by_round: Option<Estimate>,
    pub peer_by_round: Option<Estimate>,
    /// peer / stalltrace of the same round: at least [`PEER_FACTOR_TARGET`]
    /// over its whole interval to meet the target.
    pub factor: Option<Estimate>,
    /// 1 − traced/untraced (or traced/untraced − 1 for latency) of each round, as a fraction.
    pub stalltrace_overhead: Option<Estimate>,
    pub peer_overhead: Option<Estimate>,
    /// The hooks both attach to, each tool's ns/event on them summed: the
    /// same job's cost per event, without what stalltrace does besides.
    pub same_hooks: Option<SameHooks>,
}

/// A tool's BPF run time and units of work in one round's bpf_stats runs.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RoundCost {
    pub ns: f64,
    pub units: f64,
}

impl RoundCost {
    /// Every one of a peer's (or the floor's) programs in one run, over the
    /// run's `units`.
    pub fn of_all(programs: &[PeerProgram], units: f64) -> Self {
        RoundCost {
            ns: programs.iter().map(|p| p.run_time_ns as f64).sum(),
            units,
        }
    }

    pub fn per_unit(&self) -> f64 {
        self.ns / self.units
    }
}

impl Comparison {
    /// From each tool's cost in each round (`stalltrace[i]` and `peer[i]`
    /// from round i) and each round's overheads.
    pub fn new(
        unit: &str,
        stalltrace: &[RoundCost],
        peer: &[RoundCost],
        overheads: (Vec<f64>, Vec<f64>),
        same_hooks: Option<SameHooks>,
    ) -> Self {
        let pooled = |r: &[RoundCost]| {
            let units: f64 = r.iter().map(|c| c.units).sum();
            r.iter().map(|c| c.ns).sum::<f64>() / units.max(f64::MIN_POSITIVE)
        };
        Comparison {
            unit: unit.to_string(),
            stalltrace_ns_per_unit: pooled(stalltrace),
            peer_ns_per_unit: pooled(peer),
            stalltrace_by_round: Estimate::of(stalltrace.iter().map(RoundCost::per_unit)),
            peer_by_round: Estimate::of(peer.iter().map(RoundCost::per_unit)),
            factor: Estimate::of(
                stalltrace
                    .iter()
                    .zip(peer)
                    .map(|(s, p)| p.per_unit() / s.per_unit()),
            ),
            stalltrace_overhead: Estimate::of(overheads.0),
            peer_overhead: Estimate::of(overheads.1),
            same_hooks,
        }
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct SameHooks {
    pub tracepoints: Vec<String>,
    pub stalltrace_ns_per_event: f64,
    pub peer_ns_per_event: f64,
}

/// [`SameHooks`] from stalltrace's programs (`on_<tracepoint>`, as
/// (program, run_count, run_time_ns)) and the peer's, on `tracepoints`; None
/// when either never ran on one of them.
pub fn same_hooks(
    tracepoints: &[&str],
    stalltrace: &[(String, u64, u64)],
    peer: &PeerCost,
) -> Option<SameHooks> {
    let mut st = 0.0;
    let mut pe = 0.0;
    for tp in tracepoints {
        let (_, n, ns) = stalltrace
            .iter()
            .find(|(p, _, _)| p.strip_prefix("on_") == Some(tp))?;
        let p = peer.programs.iter().find(|p| p.tracepoint == *tp)?;
        if *n == 0 || p.run_count == 0 {
            return None;
        }
        st += *ns as f64 / *n as f64;
        pe += p.run_time_ns as f64 / p.run_count as f64;
    }
    Some(SameHooks {
        tracepoints: tracepoints.iter().map(|t| t.to_string()).collect(),
        stalltrace_ns_per_event: st,
        peer_ns_per_event: pe,
    })
}

/// "+3.2% [+1.0–+5.1]": an overhead estimate in percent.
fn overhead_text(e: Option<&Estimate>) -> String {
    e.map_or("–".into(), |e| {
        let p = e.scaled(|x| 100.0 * x);
        match p.ci {
            Some(c) => format!("{:+.1}% [{:+.1}–{:+.1}]", p.median, c.low, c.high),
            None => format!("{:+.1}% [{} rounds: no CI]", p.median, p.rounds),
        }
    })
}

/// The target on the per-round factor peer/stalltrace, judged on its
/// interval: at least `factor` (the net suite's [`PEER_FACTOR_TARGET`]; 1
/// for the block suite's "no more than the cheapest peer's").
pub fn factor_verdict(c: &Comparison, what: &str, factor: f64) -> Verdict {
    let share = if factor == 1.0 {
        "the cheapest peer's".to_string()
    } else {
        format!("1/{factor:.0} of the cheapest peer's")
    };
    let target = format!(
        "{what}: stalltrace's BPF time per {} <= {share} doing the same job (per-round factor \
         peer/stalltrace >= {factor:.0})",
        c.unit
    );
    let j = judge(c.factor.as_ref(), Goal::AtLeast(factor), 2);
    let measured = c
        .factor
        .as_ref()
        .map_or("no round measured it".into(), |f| {
            format!("peer/stalltrace {:.2}x [{}]", f.median, f.ci_text(2))
        });
    let same = c.same_hooks.as_ref().map_or(String::new(), |h| {
        format!(
            "; on the hooks both use ({}), per event: stalltrace {:.0} ns, peer {:.0} ns \
             (peer/stalltrace {:.2}x)",
            h.tracepoints.join(" + "),
            h.stalltrace_ns_per_event,
            h.peer_ns_per_event,
            h.peer_ns_per_event / h.stalltrace_ns_per_event.max(f64::MIN_POSITIVE)
        )
    });
    let by_round = |e: &Option<Estimate>| e.as_ref().map_or("–".into(), |e| e.text(0));
    let detail = format!(
        "{}: {}; stalltrace {} ns per {u}, peer {} ns per {u} (every program of each; median \
         [95% CI] of rounds; stalltrace needs {:.0} ns per {u} or less at the peer's median); \
         workload overhead (per-round pairs) stalltrace {}, peer {}{same}",
        j.outcome.word(),
        j.why,
        by_round(&c.stalltrace_by_round),
        by_round(&c.peer_by_round),
        c.peer_by_round.as_ref().map_or(0.0, |p| p.median) / factor,
        overhead_text(c.stalltrace_overhead.as_ref()),
        overhead_text(c.peer_overhead.as_ref()),
        u = c.unit,
    );
    Verdict {
        target,
        measured,
        outcome: j.outcome,
        detail,
    }
}

/// One of the peer's programs over all its bpf_stats runs, and round by round.
#[derive(Serialize)]
pub struct PeerProgramResult {
    pub tracepoint: String,
    pub run_count: u64,
    pub run_time_ns: u64,
    /// Over all runs; None when it never ran.
    pub ns_per_event: Option<f64>,
    /// Per round (every part's run of that round summed): median and interval.
    pub by_round: Option<Estimate>,
}

impl PeerProgramResult {
    /// Its row in a per-program table: tracepoint, ns/event, per round, runs.
    pub fn row(&self) -> Vec<String> {
        vec![
            self.tracepoint.clone(),
            self.ns_per_event
                .map_or("–".into(), |ns| format!("{ns:.0}")),
            self.by_round.as_ref().map_or("–".into(), |e| e.text(0)),
            self.run_count.to_string(),
        ]
    }
}

/// Each program of `cost` (every round's summed) over all runs, and round
/// by round (`rounds`: each round's, every part of it summed).
pub fn program_results(cost: &PeerCost, rounds: &[PeerCost]) -> Vec<PeerProgramResult> {
    cost.programs
        .iter()
        .map(|p| PeerProgramResult {
            tracepoint: p.tracepoint.clone(),
            run_count: p.run_count,
            run_time_ns: p.run_time_ns,
            ns_per_event: (p.run_count > 0).then(|| p.run_time_ns as f64 / p.run_count as f64),
            by_round: Estimate::of(rounds.iter().filter_map(|r| {
                let q = r.programs.iter().find(|q| q.tracepoint == p.tracepoint)?;
                Some(q.run_time_ns as f64 / q.run_count as f64)
            })),
        })
        .collect()
}

/// The peer as published: what it is, what it cost, and the usual peers that
/// could not run here.
#[derive(Serialize)]
pub struct PeerInfo {
    pub name: &'static str,
    pub job: &'static str,
    pub versus: &'static str,
    pub script: &'static str,
    /// Its programs' kernel run time, summed over its bpf_stats runs.
    pub cost: PeerCost,
    pub programs: Vec<PeerProgramResult>,
    /// Rounds with a bpf_stats run.
    pub bpf_stats_rounds: usize,
    pub unavailable: Vec<Unavailable>,
}

impl PeerInfo {
    /// `rounds`: the peer's programs in each round's bpf_stats runs (every
    /// part of the round summed).
    pub fn new(script: &Script, rounds: &[PeerCost], unavailable: Vec<Unavailable>) -> Self {
        let cost = sum_costs(rounds.iter().map(|r| &r.programs));
        PeerInfo {
            name: script.name,
            job: script.job,
            versus: script.versus,
            script: script.text,
            programs: program_results(&cost, rounds),
            cost,
            bpf_stats_rounds: rounds.len(),
            unavailable,
        }
    }

    /// The "Peers" subsection of a suite.
    pub fn markdown(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n### Peers\n\n\
             The peer that runs here is `{}`: {}, compared with {}. It ran in every round as \
             configuration \"bpftrace\" (its workload figures are in the tables above), and in \
             the same bpftrace's life with bpf_stats on (turned on by the bench with \
             `BPF_ENABLE_STATS` for that run only) as \"bpftrace+bpf-stats\" in {} rounds, \
             which give its cost per event; its programs were told from anyone else's by its \
             pid (`bpftool perf list`). The script (from `xtask/src/bench/peers/`):\n\n```\n{}```\n",
            self.name, self.job, self.versus, self.bpf_stats_rounds, self.script
        );
        let rows: Vec<Vec<String>> = self.programs.iter().map(PeerProgramResult::row).collect();
        s += &table::markdown(
            &[
                "peer program (tracepoint)",
                "ns/event",
                "per round: median [95% CI]",
                "runs",
            ],
            &rows,
        );
        s += "\nThe usual peers, tried at run time on this host:\n\n";
        let rows: Vec<Vec<String>> = self
            .unavailable
            .iter()
            .map(|u| vec![u.tool.clone(), format!("`{}`", u.tried), u.verdict.clone()])
            .collect();
        s += &table::markdown(&["peer", "tried", "result"], &rows);
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::stats::Outcome;

    fn prog(tp: &str, n: u64, ns: u64) -> PeerProgram {
        PeerProgram {
            tracepoint: tp.into(),
            run_count: n,
            run_time_ns: ns,
        }
    }

    #[test]
    fn costs_sum_per_tracepoint() {
        let d = vec![prog("a", 5, 600), prog("b", 2, 80)];
        let sum = sum_costs([&d, &d]);
        assert_eq!(sum.run_time_ns, 2 * 680);
        assert_eq!(sum.programs[0].run_count, 10);
    }

    #[test]
    fn the_factor_is_judged_round_by_round() {
        let st = vec![
            RoundCost {
                ns: 100.0,
                units: 1.0
            };
            8
        ];
        let cheap_peer = vec![
            RoundCost {
                ns: 400.0,
                units: 1.0
            };
            8
        ];
        let c = Comparison::new("I/O", &st, &cheap_peer, (vec![0.01; 8], vec![0.1; 8]), None);
        assert!((c.factor.as_ref().unwrap().median - 4.0).abs() < 1e-12);
        let v = factor_verdict(&c, "QD16", PEER_FACTOR_TARGET);
        assert_eq!(v.outcome, Outcome::Met, "{}", v.detail);
        assert_eq!(v.measured, "peer/stalltrace 4.00x [4.00–4.00]");

        // Rounds on both sides of 3: no verdict either way.
        let mixed: Vec<RoundCost> = [200.0, 250.0, 280.0, 320.0, 350.0, 400.0]
            .iter()
            .map(|ns| RoundCost {
                ns: *ns,
                units: 1.0,
            })
            .collect();
        let c = Comparison::new("I/O", &st[..6], &mixed, (vec![], vec![]), None);
        assert_eq!(
            factor_verdict(&c, "QD16", PEER_FACTOR_TARGET).outcome,
            Outcome::Inconclusive
        );

        // Too few rounds for an interval.
        let c = Comparison::new("I/O", &st[..2], &cheap_peer[..2], (vec![], vec![]), None);
        let v = factor_verdict(&c, "QD16", PEER_FACTOR_TARGET);
        assert_eq!(v.outcome, Outcome::Inconclusive);
        assert!(v.detail.contains("needs at least 6"), "{}", v.detail);
    }

    #[test]
    fn peer_programs_per_round() {
        let rounds: Vec<PeerCost> = (1..=6)
            .map(|i| sum_costs([&vec![prog("issue", 100, 100 * (400 + i))]]))
            .collect();
        let script = Script {
            name: "x",
            job: "y",
            versus: "z",
            text: "",
        };
        let info = PeerInfo::new(&script, &rounds, Vec::new());
        assert_eq!(info.bpf_stats_rounds, 6);
        let p = &info.programs[0];
        assert_eq!(p.run_count, 600);
        let e = p.by_round.clone().unwrap();
        assert_eq!((e.min, e.max), (401.0, 406.0));
        assert!(e.ci.is_some());
        assert!(info.markdown().contains("| issue"));
    }
}
