//! The floor's figures in the net suite (see `bench::floor`): what empty
//! programs on stalltrace's network-path hooks cost per received and per
//! sent segment and per transaction, and stalltrace's work over them, round
//! by round (each round's floor runs against the same round's accounting runs).

use serde::Serialize;

use super::{net_programs, peer_round_cost, per_segment, round_cost};
use crate::bench::floor::{self, AttachPoint, Description};
use crate::bench::net::segments::{self, Direction};
use crate::bench::net::{Measured, PeerRun, WorkloadRuns, on_net_path};
use crate::bench::parts;
use crate::bench::peers::{self, PeerProgramResult, RoundCost};
use crate::bench::settings::Settings;
use crate::bench::stats::Estimate;

/// What the floor is, what its programs cost, and its figures per workload.
#[derive(Serialize)]
pub struct FloorResult {
    /// One program per network-path attach point the daemon used.
    #[serde(flatten)]
    pub description: Description,
    /// Each program over every floor run of every workload, and round by round.
    pub programs: Vec<FloorProgram>,
    pub workloads: Vec<WorkloadFloor>,
}

#[derive(Serialize)]
pub struct FloorProgram {
    /// `tracepoint` is its section, "tp_btf/tcp_probe".
    #[serde(flatten)]
    pub cost: PeerProgramResult,
    pub hook: String,
    /// stalltrace's program on the same hook (the first, where families
    /// share one), whose path this one is counted on.
    pub stalltrace_program: Option<String>,
    pub path: Direction,
}

/// One workload's floor and stalltrace's work over it, median [95% interval] of rounds.
#[derive(Serialize)]
pub struct WorkloadFloor {
    pub workload: &'static str,
    /// The transaction: a round trip, a MB received.
    pub unit: &'static str,
    pub floor_ns_per_received_segment: Option<Estimate>,
    pub floor_ns_per_sent_segment: Option<Estimate>,
    pub floor_ns_per_unit: Option<Estimate>,
    pub work_over_floor_ns_per_received_segment: Option<Estimate>,
    pub work_over_floor_ns_per_sent_segment: Option<Estimate>,
    pub work_over_floor_ns_per_unit: Option<Estimate>,
}

/// Each floor program's section, and the path it is counted on.
pub struct Paths(Vec<(String, Direction)>);

impl Paths {
    fn of(&self, section: &str) -> Direction {
        self.0
            .iter()
            .find(|(s, _)| s == section)
            .map_or(Direction::Other, |(_, d)| *d)
    }
}

/// For each point, stalltrace's network-path program on its hook, by the
/// rule that names programs (`on_<hook>`, `maybe_<hook>`; see
/// `programs::resolve`), from the daemons' stop records.
fn stalltrace_program(m: &Measured, point: &AttachPoint) -> Option<String> {
    m.runs
        .daemons
        .iter()
        .flat_map(|l| &l.stop.programs)
        .filter(|p| on_net_path(&p.family))
        .find(|p| p.program.ends_with(point.hook.as_str()))
        .map(|p| p.program.clone())
}

/// Each floor program on the path of stalltrace's program on the same hook,
/// so that the floor per segment covers exactly the hooks stalltrace's
/// figure per segment does; a hook without one goes by its own name.
pub fn paths(m: &Measured) -> Paths {
    let points = m.runs.floor.as_ref().map_or(&[][..], |o| &o.points[..]);
    Paths(
        points
            .iter()
            .map(|p| {
                let name = stalltrace_program(m, p).unwrap_or_else(|| p.hook.clone());
                (p.section(), segments::direction(&name))
            })
            .collect(),
    )
}

/// The floor's programs in one run: run time on the receive path, on the
/// send path, and on neither.
fn split(paths: &Paths, r: &PeerRun) -> (f64, f64, f64) {
    let mut out = (0.0, 0.0, 0.0);
    for p in &r.programs {
        let ns = p.run_time_ns as f64;
        match paths.of(&p.tracepoint) {
            Direction::Receive => out.0 += ns,
            Direction::Send => out.1 += ns,
            Direction::Other => out.2 += ns,
        }
    }
    out
}

/// One workload's floor and stalltrace's work over it, one value per round:
/// per received segment, per sent segment, per transaction.
pub struct PerRound {
    pub floor: [Vec<f64>; 3],
    pub work: [Vec<f64>; 3],
}

pub fn per_round(paths: &Paths, runs: &WorkloadRuns) -> PerRound {
    let w = runs.part;
    let (f_rx, f_tx, _) = per_segment(runs.floor.iter().map(|r| (&r.run, split(paths, r))));
    let (s_rx, s_tx, _) = per_segment(
        runs.traced_bpf_stats()
            .iter()
            .map(|t| (&t.run, segments::split(net_programs(t)))),
    );
    let f_unit: Vec<RoundCost> = runs.floor.iter().map(|r| peer_round_cost(w, r)).collect();
    let s_unit: Vec<RoundCost> = runs
        .traced_bpf_stats()
        .iter()
        .map(|r| round_cost(w, r))
        .collect();
    // Round i's accounting run less round i's floor run.
    let less = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(a, b)| a - b).collect();
    PerRound {
        work: [
            less(&s_rx, &f_rx),
            less(&s_tx, &f_tx),
            floor::over_floor(&s_unit, &f_unit),
        ],
        floor: [f_rx, f_tx, f_unit.iter().map(RoundCost::per_unit).collect()],
    }
}

/// None when no traced block ran (no daemon, no hooks, no floor).
pub fn result(settings: &Settings, m: &Measured) -> Option<FloorResult> {
    let object = m.runs.floor.as_ref()?;
    let paths = paths(m);
    let rounds = parts::peer_rounds(
        &m.runs.parts,
        settings.rounds,
        |w| &w.floor,
        |r| &r.programs,
    );
    let cost = peers::sum_costs(rounds.iter().map(|r| &r.programs));
    let programs = peers::program_results(&cost, &rounds)
        .into_iter()
        .map(|c| {
            let point = object.points.iter().find(|p| p.section() == c.tracepoint);
            FloorProgram {
                hook: point.map_or_else(String::new, |p| p.hook.clone()),
                stalltrace_program: point.and_then(|p| stalltrace_program(m, p)),
                path: paths.of(&c.tracepoint),
                cost: c,
            }
        })
        .collect();
    let workloads = m
        .runs
        .parts
        .iter()
        .map(|runs| {
            let PerRound {
                floor: [f_rx, f_tx, f_unit],
                work: [w_rx, w_tx, w_unit],
            } = per_round(&paths, runs);
            WorkloadFloor {
                workload: runs.part.key,
                unit: runs.part.unit,
                floor_ns_per_received_segment: Estimate::of(f_rx),
                floor_ns_per_sent_segment: Estimate::of(f_tx),
                floor_ns_per_unit: Estimate::of(f_unit),
                work_over_floor_ns_per_received_segment: Estimate::of(w_rx),
                work_over_floor_ns_per_sent_segment: Estimate::of(w_tx),
                work_over_floor_ns_per_unit: Estimate::of(w_unit),
            }
        })
        .collect();
    Some(FloorResult {
        description: Description::of(object),
        programs,
        workloads,
    })
}
