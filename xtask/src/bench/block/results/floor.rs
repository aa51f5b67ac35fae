//! The floor's figures (see `bench::floor`): what empty programs on
//! stalltrace's hooks cost per I/O and per event, and stalltrace's work over
//! them, round by round.

use serde::Serialize;

use super::{DepthRuns, Measured, Settings, peer_round_cost, round_cost};
use crate::bench::floor::{self, Description};
use crate::bench::parts;
use crate::bench::peers::{self, PeerProgramResult, RoundCost};
use crate::bench::stats::Estimate;

/// What the floor is, and what its programs cost on each hook.
#[derive(Serialize)]
pub struct FloorResult {
    #[serde(flatten)]
    pub description: Description,
    /// Each program (by section, "tp_btf/block_rq_issue") over every floor
    /// run of both depths, and round by round.
    pub programs: Vec<PeerProgramResult>,
}

/// None when no traced block ran (no daemon, no hooks, no floor).
pub fn result(settings: &Settings, m: &Measured) -> Option<FloorResult> {
    let object = m.runs.floor.as_ref()?;
    let rounds = parts::peer_rounds(
        &m.runs.parts,
        settings.rounds,
        |d| &d.floor,
        |r| &r.programs,
    );
    let cost = peers::sum_costs(rounds.iter().map(|r| &r.programs));
    Some(FloorResult {
        description: Description::of(object),
        programs: peers::program_results(&cost, &rounds),
    })
}

/// One depth's floor per I/O and stalltrace's work over it, both round by
/// round (each round's floor run against the same round's accounting run).
pub struct PerIo {
    pub floor: Vec<f64>,
    pub work: Vec<f64>,
}

pub fn per_io(d: &DepthRuns) -> PerIo {
    let floor: Vec<RoundCost> = d.floor.iter().map(peer_round_cost).collect();
    let stalltrace: Vec<RoundCost> = d.traced_bpf_stats().iter().map(round_cost).collect();
    PerIo {
        work: floor::over_floor(&stalltrace, &floor),
        floor: floor.iter().map(RoundCost::per_unit).collect(),
    }
}

/// The floor per I/O and the work over it at one depth, for [`super::DepthResult`].
pub fn estimates(d: &DepthRuns) -> (Option<Estimate>, Option<Estimate>) {
    let p = per_io(d);
    (Estimate::of(p.floor), Estimate::of(p.work))
}
