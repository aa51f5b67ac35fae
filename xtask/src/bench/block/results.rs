//! From raw runs to the published figures: medians and ranges per
//! configuration; per-round ratios (each run over the untraced run of the
//! same round and depth) with their median and 95% interval; per-program
//! cost, summed over the accounting runs and round by round; cost per I/O for
//! stalltrace, the floor under it and the peer, and stalltrace's work over
//! the floor; and the verdict on each target, given only where the interval
//! allows one (see `verdicts`). Everything here is serialized as-is into
//! benchmarks.json.

mod floor;
mod rezolus;
mod verdicts;

use std::collections::BTreeMap;

use serde::Serialize;

use super::{
    Backing, DISK_IOPS_RATIO_TARGET, DepthRuns, IOPS_RATIO_TARGET, Measured, Part, PeerRun,
    Settings, TracedRun,
};
use crate::bench::configs::{self, Configurations};
use crate::bench::fio::{self, FioRun};
use crate::bench::parts::{self, PairedSetup, PartTotals};
use crate::bench::peers::{self, Comparison, PeerCost, PeerInfo, RoundCost};
use crate::bench::publish::{Host, Verdict};
use crate::bench::stats::{Estimate, Summary};
use crate::bench::tracer::ProgramCost;
use crate::bench::tracer::programs::{self, InPart};
use crate::bench::unitcost::{self, PerUnit, UnitCost, rate_text};

#[derive(Serialize)]
pub struct BlockResults {
    pub host: Host,
    pub command: &'static str,
    pub wall_time_s: f64,
    pub setup: Setup,
    pub hooks: Vec<String>,
    pub depths: Vec<DepthResult>,
    /// Summed over every accounting run of every depth, and round by round.
    pub programs: Vec<ProgramResult>,
    /// BPF run time per I/O and the process's own CPU and memory, for
    /// stalltrace and the peer at each depth.
    pub unit_costs: Vec<UnitCost>,
    /// How a BPF time per unit becomes a share of a core at a rate.
    pub unit_cost_formula: &'static str,
    /// Each round's daemon over its whole life: load, verify, attach, its
    /// runs, detach.
    pub daemon_lifetime_cpu_s: Summary,
    /// Records the daemon could not deliver, summed over every daemon's life.
    pub lost: BTreeMap<String, u64>,
    /// Empty programs on the daemon's hooks: what any program there costs
    /// before it does any work of its own. None when no traced block ran.
    pub floor: Option<floor::FloorResult>,
    pub targets: Targets,
    /// The bpftrace peer doing the same job, and the usual peers that cannot run here.
    pub peer: PeerInfo,
    /// The second peer; None when it is not installed (the usual peers list it then).
    pub rezolus: Option<rezolus::RezolusInfo>,
    /// /proc/loadavg before and after: a busy host shows here.
    pub load_average: [String; 2],
    pub warnings: Vec<String>,
}

#[derive(Serialize)]
pub struct Setup {
    #[serde(flatten)]
    pub paired: PairedSetup,
    pub file_mib: u64,
    pub loop_direct_io: bool,
    /// The disk-backed device's: the same file size, on /var/tmp.
    pub disk_loop_direct_io: bool,
    pub fio: String,
    /// The two peers' order within the peer block.
    pub peer_order: &'static str,
}

pub const CONFIGS: &str = "per round and depth: untraced; traced (stalltrace without the \
     accounting: the IOPS and p99 ratios and the IOPS target use it; the daemon's CPU and RSS \
     come from it); traced_bpf_stats (the same daemon with the kernel's accounting on: ns/event \
     and events/s per program come from it; its IOPS pay the accounting on every program run and \
     judge nothing); floor_bpf_stats (right after the daemon stopped, in the same block, empty \
     programs on its hooks with the accounting on: the floor per I/O, and stalltrace's work over \
     it, come from it); bpftrace and bpftrace_bpf_stats (the peer, likewise); rezolus and \
     rezolus_bpf_stats (the second peer, likewise, when installed)";

/// How the two peers share the peer block, for the published setup.
pub const PEER_ORDER: &str = "the peer block holds both peers, one bpftrace then one rezolus or \
     the other way round (when rezolus is installed), each started once for the block and run \
     like the daemon (each depth without and with the accounting); which peer goes first \
     changes every two rounds and the pattern flips every six, so each peer goes first with \
     every order of blocks";

/// What the floor is, for the published setup.
pub const FLOOR_SETUP: &str = "right after each round's daemon stopped, in the same traced \
     block, the bench loads and attaches one program of its own on each hook the daemon \
     attached, with the same attach type (a tracepoint, or the kernel function the daemon \
     used in its place), and runs each depth once under them with the kernel's accounting on";

/// fio's figures over the rounds, and over the untraced run of the same round.
pub type Side = configs::Side<FioRun>;
pub type Ratios = configs::Ratios<FioRun>;

/// The figures every ratio is taken of.
pub const FIGURES: [&str; 3] = ["iops", "p50_us", "p99_us"];

#[derive(Serialize)]
pub struct DepthResult {
    pub backing: Backing,
    pub iodepth: u32,
    /// How the tables name the part: "QD16" (tmpfs), "disk QD16".
    pub label: String,
    #[serde(flatten)]
    pub configs: Configurations<FioRun>,
    /// The floor, with the accounting: shown, judges nothing. None without floor runs.
    pub floor_bpf_stats: Option<Side>,
    pub traced_ratio: Ratios,
    pub floor_ratio: Ratios,
    /// All block programs' run time per I/O fio completed, over every
    /// accounting run of this depth (sum over sum).
    pub bpf_ns_per_io: f64,
    /// The peer's programs' run time per I/O fio completed, likewise.
    pub peer_ns_per_io: f64,
    /// The floor's programs' run time per I/O fio completed, round by round.
    pub floor_ns_per_io: Option<Estimate>,
    /// stalltrace's BPF run time per I/O less the floor's of the same round,
    /// round by round: what its programs do beyond what any program there costs.
    pub work_over_floor_ns_per_io: Option<Estimate>,
    pub peer_cost: PeerCost,
    /// stalltrace against the peer, per I/O, round by round.
    pub versus_peer: Comparison,
    /// The second peer (rezolus) at this depth; None when it did not run.
    pub rezolus: Option<rezolus::RezolusAtDepth>,
    /// stalltrace against the cheaper peer of each round: what the target judges.
    pub versus_cheapest_peer: rezolus::Cheapest,
}

pub type ProgramResult = parts::ProgramResult<ByDepth>;

#[derive(Serialize)]
pub struct ByDepth {
    pub by_depth: Vec<ProgramAtDepth>,
}

#[derive(Serialize)]
pub struct ProgramAtDepth {
    pub backing: Backing,
    pub iodepth: u32,
    pub run_count: u64,
    pub ns_per_event: Option<f64>,
    /// Per second of fio run time, in the accounting runs.
    pub events_per_s: f64,
    pub events_per_io: f64,
}

#[derive(Serialize)]
pub struct Targets {
    /// On the tmpfs-backed device.
    pub iops_ratio_qd16: Verdict,
    pub iops_ratio_qd1: Verdict,
    /// On the disk-backed device.
    pub iops_ratio_disk_qd16: Verdict,
    pub iops_ratio_disk_qd1: Verdict,
    /// Every program together per I/O at QD16.
    pub ns_per_io_qd16: Verdict,
    pub ns_per_event_per_hook: Verdict,
    /// At QD16: stalltrace's BPF time per I/O at most the cheaper peer's of each round.
    pub versus_peer_qd16: Verdict,
    /// At QD16: stalltrace's BPF time per I/O over the floor's.
    pub work_over_floor_qd16: Verdict,
}

fn is_block(family: &str) -> bool {
    family == "block"
}

/// Counters of every block program, summed over `runs`, keyed by (family,
/// program); the daemon's other families (run for the VM's own traffic) are
/// the net suite's business.
fn program_totals<'a>(
    runs: impl IntoIterator<Item = &'a TracedRun>,
) -> BTreeMap<programs::Key, ProgramCost> {
    parts::program_totals(runs, is_block)
}

/// stalltrace's block programs in one accounting run: run time and I/Os.
pub(super) fn round_cost(r: &TracedRun) -> RoundCost {
    RoundCost {
        ns: r
            .programs
            .iter()
            .filter(|p| is_block(&p.family))
            .map(|p| p.run_time_ns as f64)
            .sum(),
        units: r.run.ios as f64,
    }
}

/// A peer's (or the floor's) programs in one accounting run: run time and I/Os.
fn peer_round_cost(r: &PeerRun) -> RoundCost {
    RoundCost::of_all(&r.programs, r.run.ios as f64)
}

fn depth_result(d: &DepthRuns) -> DepthResult {
    let fio_of = |t: &[TracedRun]| t.iter().map(|r| r.run).collect::<Vec<_>>();
    let peer_fio: Vec<FioRun> = d.peer(0).iter().map(|r| r.run).collect();
    let ratios = |other: &[FioRun]| Ratios::of(&FIGURES, &d.untraced, other);
    let st_rounds: Vec<RoundCost> = d.traced_bpf_stats().iter().map(round_cost).collect();
    let peer_rounds: Vec<RoundCost> = d.peer_bpf_stats(0).iter().map(peer_round_cost).collect();
    let peer_cost = peers::sum_costs(d.peer_bpf_stats(0).iter().map(|r| &r.programs));
    let st_programs: Vec<(String, u64, u64)> = program_totals(d.traced_bpf_stats())
        .into_values()
        .map(|p| (p.program, p.run_count, p.run_time_ns))
        .collect();
    let overhead = |runs: &[FioRun]| -> Vec<f64> {
        d.untraced
            .iter()
            .zip(runs)
            .map(|(u, t)| 1.0 - t.iops / u.iops)
            .collect()
    };
    let same = peers::same_hooks(
        &["block_rq_issue", "block_rq_complete"],
        &st_programs,
        &peer_cost,
    );
    let versus_cheapest_peer = rezolus::cheapest(d, &st_rounds, same.clone());
    let versus_peer = Comparison::new(
        "I/O",
        &st_rounds,
        &peer_rounds,
        (overhead(&fio_of(d.traced())), overhead(&peer_fio)),
        same,
    );
    let floor_fio: Vec<FioRun> = d.floor.iter().map(|r| r.run).collect();
    let (floor_ns_per_io, work_over_floor_ns_per_io) = floor::estimates(d);
    DepthResult {
        backing: d.part.backing,
        iodepth: d.part.iodepth,
        label: d.part.label(),
        configs: Configurations::of(d, &FIGURES),
        traced_ratio: ratios(&fio_of(d.traced())),
        floor_ratio: ratios(&floor_fio),
        floor_bpf_stats: (!floor_fio.is_empty()).then(|| Side::of(&floor_fio)),
        bpf_ns_per_io: versus_peer.stalltrace_ns_per_unit,
        peer_ns_per_io: versus_peer.peer_ns_per_unit,
        floor_ns_per_io,
        work_over_floor_ns_per_io,
        peer_cost,
        versus_peer,
        rezolus: rezolus::at_depth(d),
        versus_cheapest_peer,
    }
}

/// Each program over all accounting runs, round by round and depth by depth.
fn program_results(m: &Measured) -> Vec<ProgramResult> {
    let row = |part: &Part, d: &PartTotals, p: InPart| ProgramAtDepth {
        backing: part.backing,
        iodepth: part.iodepth,
        run_count: p.run_count,
        ns_per_event: p.ns_per_event,
        events_per_s: p.events_per_s,
        // A part without any I/O divides by one, not zero.
        events_per_io: p.run_count as f64 / d.units.max(1.0),
    };
    parts::program_results(
        &m.runs.parts,
        m.runs.daemons.iter().map(|l| &l.stop),
        is_block,
        (
            |_, fio: &FioRun| (fio.runtime_s, fio.ios as f64),
            row,
            |by_depth| ByDepth { by_depth },
        ),
    )
}

/// Cost per I/O of stalltrace, of the floor under it and of the peers at each depth.
fn unit_costs(m: &Measured, depths: &[DepthResult]) -> Vec<UnitCost> {
    let mut out = Vec::new();
    for (d, r) in m.runs.parts.iter().zip(depths) {
        let workload = format!("fio {}", d.part.label());
        let iops = |side: &Side| format!("{} IOPS", rate_text(side.figures["iops"].median));
        let per_io = floor::per_io(d);
        let st_ns = d
            .traced_bpf_stats()
            .iter()
            .map(|r| round_cost(r).per_unit());
        let st = PerUnit::new("I/O", st_ns).with_work_over_floor(per_io.work);
        out.push(UnitCost::of_process(
            &workload,
            "stalltrace",
            vec![st],
            &r.configs.daemon,
            iops(&r.configs.traced),
        ));
        if !d.floor.is_empty() {
            out.push(UnitCost::floor(
                &workload,
                vec![PerUnit::new("I/O", per_io.floor)],
            ));
        }
        let bt_ns = d
            .peer_bpf_stats(0)
            .iter()
            .map(|r| peer_round_cost(r).per_unit());
        out.push(UnitCost::of_process(
            &workload,
            "bpftrace (peer)",
            vec![PerUnit::new("I/O", bt_ns)],
            &r.configs.peer_process,
            iops(&r.configs.peer),
        ));
        if let Some(rz) = &r.rezolus {
            out.push(UnitCost::of_process(
                &workload,
                "rezolus (peer)",
                vec![PerUnit::new("I/O", rezolus::per_io(d))],
                &rz.process,
                iops(&rz.fio),
            ));
        }
    }
    out
}

pub fn aggregate(
    settings: &Settings,
    m: &Measured,
    host: Host,
    wall_time_s: f64,
    load_average: [String; 2],
) -> BlockResults {
    let depths: Vec<DepthResult> = m.runs.parts.iter().map(depth_result).collect();
    let programs = program_results(m);
    let lost = programs::lost(m.runs.daemons.iter().map(|l| &l.stop));
    let find = |backing, iodepth| {
        depths
            .iter()
            .find(|d| d.backing == backing && d.iodepth == iodepth)
    };
    let headline = find(Backing::Tmpfs, 16).unwrap_or(&depths[0]);
    let peer_rounds: Vec<PeerCost> = parts::peer_rounds(
        &m.runs.parts,
        settings.rounds,
        |d| d.peer_bpf_stats(0),
        |r| &r.programs,
    );
    let unit_costs = unit_costs(m, &depths);
    let iops = |backing, iodepth, target| {
        find(backing, iodepth).map_or_else(
            || verdicts::not_measured(backing, iodepth),
            |d| verdicts::iops(d, target),
        )
    };
    let ns_per_io = unit_costs
        .iter()
        .find(|u| u.tool == "stalltrace" && u.workload == format!("fio {}", headline.label))
        .and_then(|u| u.per_unit.first())
        .and_then(|p| p.bpf_ns.as_ref());
    BlockResults {
        targets: Targets {
            iops_ratio_qd16: iops(Backing::Tmpfs, 16, IOPS_RATIO_TARGET),
            iops_ratio_qd1: iops(Backing::Tmpfs, 1, IOPS_RATIO_TARGET),
            iops_ratio_disk_qd16: iops(Backing::Disk, 16, DISK_IOPS_RATIO_TARGET),
            iops_ratio_disk_qd1: iops(Backing::Disk, 1, DISK_IOPS_RATIO_TARGET),
            ns_per_io_qd16: verdicts::ns_per_io(ns_per_io, headline.iodepth),
            ns_per_event_per_hook: verdicts::ns_per_event(&programs),
            versus_peer_qd16: verdicts::versus_cheapest(headline),
            work_over_floor_qd16: verdicts::work_over_floor(headline),
        },
        floor: floor::result(settings, m),
        peer: PeerInfo::new(&peers::BLOCK_LATENCY, &peer_rounds, m.unavailable.clone()),
        rezolus: rezolus::info(settings, m),
        unit_cost_formula: unitcost::FORMULA,
        unit_costs,
        daemon_lifetime_cpu_s: Summary::of(
            &m.runs
                .daemons
                .iter()
                .map(|l| l.lifetime_cpu_s)
                .collect::<Vec<_>>(),
        )
        .unwrap_or(Summary {
            median: 0.0,
            min: 0.0,
            max: 0.0,
        }),
        host,
        command: "cargo xtask bench block",
        wall_time_s,
        setup: Setup {
            paired: PairedSetup::new(
                settings,
                crate::bench::tracer::command_line(false),
                CONFIGS,
                FLOOR_SETUP,
            ),
            file_mib: super::FILE_MIB,
            loop_direct_io: m.direct_io,
            disk_loop_direct_io: m.disk_direct_io,
            fio: format!(
                "fio --name=stalltrace-bench --filename=/dev/loopN --iodepth={{16,1}} --runtime={}s {}",
                settings.runtime_s,
                fio::WORKLOAD.join(" ")
            ),
            peer_order: PEER_ORDER,
        },
        hooks: m.hooks.clone(),
        depths,
        programs,
        lost,
        load_average,
        warnings: m.runs.warnings.clone(),
    }
}

#[cfg(test)]
mod tests;
