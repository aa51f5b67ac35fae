//! `bench block`: what stalltrace's block hooks cost an I/O-bound workload.
//!
//! fio 4k random reads on a tmpfs-backed loop device (fast, so the per-I/O
//! cost of the hooks is as visible as it can be) and on a loop device over a
//! file on the VM's own disk (a real device's service time), each at two
//! depths, in many
//! short rounds (see `paired` for the order of play): untraced; traced as
//! deployed (no accounting), which fio's own IOPS and p99 judge, each over
//! the untraced run of the same round; traced with the kernel's per-program
//! accounting on, which gives each program's cost per event (and pays for
//! that accounting on every run, so its IOPS are shown but judge nothing);
//! the peers, bpftrace and rezolus (when installed), with and without the
//! accounting, both in the round's peer block; and the floor (see
//! `floor`): right after each round's daemon stops, empty programs on exactly
//! its hooks, with the accounting on, so that stalltrace's cost per I/O reads
//! as floor + work in the same round. `drive` runs them, `results` turns them
//! into medians, intervals and verdicts, `render` into the section of
//! docs/BENCHMARKS.md.

mod drive;
mod render;
mod results;

use std::path::PathBuf;
use std::time::Instant;

use serde::Serialize;

use super::engine;
use super::fio::FioRun;
use super::loopdisk::{self, LoopDisk};
use super::paired;
use super::peers::{self, PeerProgram};
use super::publish::{self, Host};
pub use super::settings::Settings;
use super::shell;
use super::tracer::ProgramCost;

/// What a loop device reads from.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Backing {
    /// A file on a private tmpfs: no device time, the worst case.
    Tmpfs,
    /// A file on the VM's own disk, read with direct I/O.
    Disk,
}

/// One part of the suite: a device and a depth.
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Part {
    pub backing: Backing,
    pub iodepth: u32,
}

impl Part {
    /// "QD16" on the tmpfs device (the names the suite had before the disk
    /// came), "disk QD16" on the disk-backed one.
    pub fn label(&self) -> String {
        match self.backing {
            Backing::Tmpfs => format!("QD{}", self.iodepth),
            Backing::Disk => format!("disk QD{}", self.iodepth),
        }
    }
}

const fn part(backing: Backing, iodepth: u32) -> Part {
    Part { backing, iodepth }
}

/// On the tmpfs device QD16 is the headline (the targets on the BPF cost
/// are set there); QD1 shows the cost on a latency-bound workload, where
/// the hooks sit on every I/O's critical path. The disk-backed device shows
/// what the same hooks cost against a real device's service time.
const PARTS: [Part; 4] = [
    part(Backing::Tmpfs, 16),
    part(Backing::Tmpfs, 1),
    part(Backing::Disk, 16),
    part(Backing::Disk, 1),
];
const FILE_MIB: u64 = 1024;
pub const IOPS_RATIO_TARGET: f64 = 0.98;
/// traced/untraced IOPS on the disk-backed device, at each depth (issue 30):
/// with a real device's service time per I/O, the hooks' share is smaller.
pub const DISK_IOPS_RATIO_TARGET: f64 = 0.99;
pub const NS_PER_EVENT_TARGET: f64 = 150.0;
/// Every program together, BPF run time per I/O fio completed at QD16 (issue 13).
pub const NS_PER_IO_TARGET: f64 = 300.0;
/// stalltrace's BPF run time per I/O at QD16 at most the cheaper peer's
/// (bpftrace, rezolus) of each round: per-round factor peer/stalltrace at
/// least 1 (issue 30; it replaces "at most a third of the peer's").
pub const CHEAPEST_PEER_FACTOR_TARGET: f64 = 1.0;
/// stalltrace's BPF run time per I/O at QD16 over the floor's of the same
/// round (issue 30): what its programs do, without what any program on
/// those hooks costs.
pub const WORK_OVER_FLOOR_TARGET: f64 = 120.0;

/// Rounds and seconds per fio run (overridable: see [`Settings`]). A round
/// is 32 fio runs (2 devices x 2 depths x untraced, traced, traced with the
/// accounting, the floor with the accounting, bpftrace and rezolus each
/// without and with the accounting), a daemon, a floor, a bpftrace and a
/// rezolus started once each, and a few bpftool readings per run: about 18 s
/// with 1 s runs before rezolus and the disk-backed device came (6 rounds
/// took 115 s), about three times that with them. 12 rounds give a 96%
/// interval from the 3rd to the 10th of the per-round values (6 are the
/// least for any).
const ROUNDS: u64 = 12;
const RUNTIME_S: u64 = 1;

/// A run under a peer or the floor, and one under the daemon (see `paired`).
pub type PeerRun = paired::TracedRun<FioRun, PeerProgram>;
pub type TracedRun = paired::TracedRun<FioRun, ProgramCost>;

/// Every configuration's runs of one part (a device and a depth).
pub type DepthRuns = paired::PartRuns<Part, FioRun>;

/// Everything measured, before aggregation.
pub struct Measured {
    /// Each depth's runs, each round's daemon (it reads nothing from its
    /// output), the floor's programs and the warnings.
    pub runs: engine::Runs<Part, FioRun, ()>,
    /// Whether each loop device (tmpfs-backed, disk-backed) has direct I/O on.
    pub direct_io: bool,
    pub disk_direct_io: bool,
    /// Hooks as the daemon reported them attached: "block_rq_issue (tp_btf)".
    pub hooks: Vec<String>,
    /// rezolus was installed, and ran in every round's peer block.
    pub rezolus: bool,
    /// The usual peers that cannot run here, and why.
    pub unavailable: Vec<peers::Unavailable>,
}

pub fn run() -> anyhow::Result<()> {
    let settings = Settings::for_suite("block", ROUNDS, RUNTIME_S)?;
    let began = Instant::now();
    let host = Host::this();
    let load_before = publish::load_average();
    let bin = super::stalltrace_bin();

    let tmpfs = LoopDisk::create(FILE_MIB)?;
    // Should this fail, `tmpfs` is dropped (torn down) on the way out.
    let on_disk = LoopDisk::create_on_disk(FILE_MIB)?;
    let scratch = [tmpfs.dir().to_path_buf(), on_disk.dir().to_path_buf()];
    let measured = drive::measure(&settings, &bin, [&tmpfs, &on_disk]);
    // Tear down before judging the figures, and check that it happened.
    drop(tmpfs);
    drop(on_disk);
    let measured = shell::torn_down(
        measured,
        leaks(&scratch),
        "loop devices detached, their files deleted, tmpfs unmounted, no stalltrace left",
    )?;

    let results = results::aggregate(
        &settings,
        &measured,
        host,
        began.elapsed().as_secs_f64(),
        [load_before, publish::load_average()],
    );
    shell::print_and_publish("block", &render::markdown(&results), &results)
}

/// What the bench may have left behind in its `scratch` directories.
fn leaks(scratch: &[PathBuf]) -> Vec<String> {
    let mut out = Vec::new();
    for dir in scratch {
        out.extend(loopdisk::loops_under(dir));
        if loopdisk::is_mounted(dir) {
            out.push(format!("{} still mounted", dir.display()));
        }
        if dir.exists() {
            out.push(format!("{} still exists", dir.display()));
        }
    }
    out
}
