//! `bench block`: what stalltrace's block hooks cost an I/O-bound workload.
//!
//! fio 4k random reads on a tmpfs-backed loop device (fast, so the per-I/O
//! cost of the hooks is as visible as it can be) at two depths, in many
//! short rounds (see `paired` for the order of play): untraced; traced as
//! deployed (no accounting), which fio's own IOPS and p99 judge, each over
//! the untraced run of the same round; traced with the kernel's per-program
//! accounting on, which gives each program's cost per event (and pays for
//! that accounting on every run, so its IOPS are shown but judge nothing);
//! and the bpftrace peer, with and without the accounting. `drive` runs
//! them, `results` turns them into medians, intervals and verdicts, `render`
//! into the section of docs/BENCHMARKS.md.

mod drive;
mod render;
mod results;

use std::path::Path;
use std::time::Instant;

use anyhow::bail;

use super::fio::FioRun;
use super::loopdisk::{self, LoopDisk};
use super::paired;
use super::peers::{self, PeerProgram};
use super::publish::{self, Host};
pub use super::settings::Settings;
use super::tracer::{self, ProgramCost, StopRecord};

/// QD16 is the headline (the target is set there); QD1 shows the cost on a
/// latency-bound workload, where the hooks sit on every I/O's critical path.
const DEPTHS: [u32; 2] = [16, 1];
const FILE_MIB: u64 = 1024;
pub const IOPS_RATIO_TARGET: f64 = 0.98;
pub const NS_PER_EVENT_TARGET: f64 = 150.0;
/// Every program together, BPF run time per I/O fio completed at QD16 (issue 13).
pub const NS_PER_IO_TARGET: f64 = 300.0;

/// Rounds and seconds per fio run (overridable: see [`Settings`]). A round
/// is 10 fio runs (2 depths x untraced, traced, traced with the accounting,
/// bpftrace, bpftrace with the accounting), a daemon and a bpftrace started
/// once each, and a few bpftool readings per run: about 16 s with 1 s runs,
/// so 12 rounds take about 200 s with the loop device and the usual peers'
/// tries, as 5 rounds of 4 s did before. 12 rounds give a 96% interval from
/// the 3rd to the 10th of the per-round values (6 are the least for any).
const ROUNDS: u64 = 12;
const RUNTIME_S: u64 = 1;

/// A run under the bpftrace peer, and one under the daemon (see `paired`).
pub type PeerRun = paired::TracedRun<FioRun, PeerProgram>;
pub type TracedRun = paired::TracedRun<FioRun, ProgramCost>;

/// One daemon, from start to stop: a round's traced block.
pub struct DaemonLife {
    pub stop: StopRecord,
    /// user + system over its whole life: load, verify and attach included.
    pub lifetime_cpu_s: f64,
}

/// Every configuration's runs at one depth (`part`: the iodepth).
pub type DepthRuns = paired::PartRuns<u32, FioRun>;

/// Everything measured, before aggregation.
pub struct Measured {
    pub depths: Vec<DepthRuns>,
    /// One per round.
    pub daemons: Vec<DaemonLife>,
    pub direct_io: bool,
    /// Hooks as the daemon reported them attached: "block_rq_issue (tp_btf)".
    pub hooks: Vec<String>,
    /// Anything that may have disturbed the figures.
    pub warnings: Vec<String>,
    /// The usual peers that cannot run here, and why.
    pub unavailable: Vec<peers::Unavailable>,
}

pub fn run() -> anyhow::Result<()> {
    let settings = Settings::for_suite("block", ROUNDS, RUNTIME_S)?;
    let began = Instant::now();
    let host = Host::this();
    let load_before = publish::load_average();
    let bin = super::stalltrace_bin();

    let disk = LoopDisk::create(FILE_MIB)?;
    let scratch = disk.dir().to_path_buf();
    let measured = drive::measure(&settings, &bin, &disk);
    // Tear down before judging the figures, and check that it happened.
    drop(disk);
    let leaks = leaks(&scratch);
    let measured = measured?;
    if !leaks.is_empty() {
        bail!("cleanup incomplete: {}", leaks.join("; "));
    }
    eprintln!("bench: cleaned up: loop device detached, tmpfs unmounted, no stalltrace left");

    let results = results::aggregate(
        &settings,
        &measured,
        host,
        began.elapsed().as_secs_f64(),
        [load_before, publish::load_average()],
    );
    let body = render::markdown(&results);
    println!("\n{body}");
    publish::publish("block", &body, serde_json::to_value(&results)?)
}

/// What the bench may have left behind under `scratch`; empty when clean.
fn leaks(scratch: &Path) -> Vec<String> {
    let mut out = loopdisk::loops_under(scratch);
    if loopdisk::is_mounted(scratch) {
        out.push(format!("{} still mounted", scratch.display()));
    }
    if scratch.exists() {
        out.push(format!("{} still exists", scratch.display()));
    }
    out.extend(tracer::our_daemons_left());
    out.extend(peers::ours_left());
    out
}
