//! The second peer, rezolus (see `peers::rezolus`), and the cheaper of the
//! two peers round by round, which the "no more than the cheapest peer's"
//! target judges stalltrace against: each round's cheaper peer, because a
//! peer that is cheap in one round and dear in another is the same tool,
//! and taking the cheaper of the same round keeps the pairing with
//! stalltrace's run of that round.

use serde::Serialize;

use super::{DepthRuns, FIGURES, Ratios, RoundCost, Side, peer_round_cost};
use crate::bench::fio::FioRun;
use crate::bench::parts::{self, ProcessResult, process};
use crate::bench::peers::{self, Comparison, PeerCost, PeerProgramResult, SameHooks, rezolus};
use crate::bench::stats::Estimate;

use super::super::{Measured, Settings};

/// rezolus as published: what it is, how it ran, what its programs cost.
#[derive(Serialize)]
pub struct RezolusInfo {
    pub name: &'static str,
    pub job: &'static str,
    /// The generated config.
    pub config: String,
    pub programs: Vec<PeerProgramResult>,
    pub bpf_stats_rounds: usize,
}

/// None when rezolus was not installed (the usual peers' table says so).
pub fn info(settings: &Settings, m: &Measured) -> Option<RezolusInfo> {
    if !m.rezolus {
        return None;
    }
    let rounds = parts::peer_rounds(
        &m.runs.parts,
        settings.rounds,
        |d| d.peer_bpf_stats(1),
        |r| &r.programs,
    );
    let cost = peers::sum_costs(rounds.iter().map(|r| &r.programs));
    Some(RezolusInfo {
        name: rezolus::NAME,
        job: rezolus::JOB,
        config: rezolus::config("127.0.0.1:<a free port, picked per run>"),
        programs: peers::program_results(&cost, &rounds),
        bpf_stats_rounds: rounds.len(),
    })
}

/// rezolus at one depth.
#[derive(Serialize)]
pub struct RezolusAtDepth {
    pub fio: Side,
    pub ratio: Ratios,
    /// Its programs' run time per I/O fio completed, round by round.
    pub ns_per_io: Option<Estimate>,
    pub cost: PeerCost,
    pub process: ProcessResult,
}

pub fn at_depth(d: &DepthRuns) -> Option<RezolusAtDepth> {
    if d.peer(1).is_empty() && d.peer_bpf_stats(1).is_empty() {
        return None;
    }
    let runs: Vec<FioRun> = d.peer(1).iter().map(|r| r.run).collect();
    Some(RezolusAtDepth {
        ratio: Ratios::of(&FIGURES, &d.untraced, &runs),
        fio: Side::of(&runs),
        ns_per_io: Estimate::of(per_io(d)),
        cost: peers::sum_costs(d.peer_bpf_stats(1).iter().map(|r| &r.programs)),
        process: process(d.peer(1).iter().map(|r| &r.usage)),
    })
}

/// rezolus's BPF ns per I/O in each round's accounting run.
pub fn per_io(d: &DepthRuns) -> Vec<f64> {
    d.peer_bpf_stats(1)
        .iter()
        .map(|r| peer_round_cost(r).per_unit())
        .collect()
}

/// stalltrace against the cheaper peer of each round, and how often each was the cheaper.
#[derive(Serialize)]
pub struct Cheapest {
    pub comparison: Comparison,
    /// Rounds in which bpftrace, and rezolus, cost less per I/O.
    pub bpftrace_rounds: usize,
    pub rezolus_rounds: usize,
}

/// Each round's cheaper peer per I/O (bpftrace alone where rezolus did not
/// run), against stalltrace's `st_rounds`; the workload overhead is that of
/// the same peer's run without the accounting in the same round.
pub fn cheapest(d: &DepthRuns, st_rounds: &[RoundCost], same: Option<SameHooks>) -> Cheapest {
    let mut costs = Vec::new();
    let mut overhead = Vec::new();
    let (mut b, mut r) = (0, 0);
    for (i, bt) in d.peer_bpf_stats(0).iter().enumerate() {
        let bt_cost = peer_round_cost(bt);
        let rz_cost = d.peer_bpf_stats(1).get(i).map(peer_round_cost);
        let (cost, plain) = match rz_cost {
            Some(rz) if rz.per_unit() < bt_cost.per_unit() => {
                r += 1;
                (rz, d.peer(1).get(i))
            }
            _ => {
                b += 1;
                (bt_cost, d.peer(0).get(i))
            }
        };
        costs.push(cost);
        if let (Some(u), Some(p)) = (d.untraced.get(i), plain) {
            overhead.push(1.0 - p.run.iops / u.iops);
        }
    }
    let st_overhead = d
        .untraced
        .iter()
        .zip(d.traced())
        .map(|(u, t)| 1.0 - t.run.iops / u.iops)
        .collect();
    Cheapest {
        comparison: Comparison::new("I/O", st_rounds, &costs, (st_overhead, overhead), same),
        bpftrace_rounds: b,
        rezolus_rounds: r,
    }
}
