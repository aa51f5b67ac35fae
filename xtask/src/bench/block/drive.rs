//! The block suite on the paired-rounds engine (see `engine`): its parts are
//! fio's depths on the two loop devices, its daemon attaches as deployed,
//! its floor sits on the daemon's block hooks, and its peer block holds
//! bpftrace and rezolus (when installed).

use std::collections::BTreeMap;
use std::path::Path;

use super::{Backing, Measured, PARTS, Part, Settings};
use crate::bench::engine::{self, Block, Daemon, Suite};
use crate::bench::fio::{self, FioRun};
use crate::bench::floor::{self, AttachPoint};
use crate::bench::loopdisk::LoopDisk;
use crate::bench::peers::{self, Bpftrace, Peer, Rezolus};
use crate::bench::quiet;
use crate::bench::tracer::Tracer;
use crate::bench::tracer::programs::Counter;

struct BlockSuite<'a> {
    runtime_s: u64,
    bin: &'a Path,
    /// The tmpfs-backed device; its directory is the scratch for the tracers' files.
    disk: &'a LoopDisk,
    on_disk: &'a LoopDisk,
    /// The second peer's binary, when installed.
    rezolus: Option<&'a Path>,
    /// Hooks as the first daemon reported them attached.
    hooks: Vec<String>,
}

impl Suite for BlockSuite<'_> {
    type Part = Part;
    type Run = FioRun;
    type Output = ();

    fn blocks(&self) -> [Block; 3] {
        [Block::Untraced, Block::Daemon(0), Block::Peers]
    }

    fn parts(&self) -> Vec<Part> {
        PARTS.to_vec()
    }

    fn part_name(&self, part: Part) -> String {
        part.label()
    }

    fn scratch(&self) -> &Path {
        self.disk.dir()
    }

    fn disturbance(&self, ours: &[u64]) -> Option<String> {
        quiet::block_disturbance(ours)
    }

    fn run(&mut self, part: Part, _daemon: Option<&Tracer>) -> anyhow::Result<FioRun> {
        let disk = match part.backing {
            Backing::Tmpfs => self.disk,
            Backing::Disk => self.on_disk,
        };
        fio::randread(disk.device(), part.iodepth, self.runtime_s)
    }

    /// One line per run, figures lined up across configurations.
    fn progress(&self, label: &str, _: Part, run: &FioRun, _: Option<&BTreeMap<u64, Counter>>) {
        let head = format!("{label}:");
        eprintln!(
            "bench: {head:<38} {:.0} IOPS, p50 {:.1} us, p99 {:.1} us",
            run.iops, run.p50_us, run.p99_us
        );
    }

    fn start_daemon(&mut self, _: usize, _: usize, tag: &str) -> anyhow::Result<Daemon> {
        let tracer = Tracer::start(self.bin, self.disk.dir(), tag, false, &[])?;
        if self.hooks.is_empty() {
            self.hooks = tracer.hooks_of("block");
        }
        Ok(Daemon::of(tracer))
    }

    fn floor_points(&self, daemon: &Tracer) -> anyhow::Result<Option<Vec<AttachPoint>>> {
        floor::points_of(&daemon.start, "block").map(Some)
    }

    fn stopped(&mut self, _: &Path, _: &str) -> anyhow::Result<()> {
        Ok(())
    }

    fn peers(&self) -> usize {
        1 + usize::from(self.rezolus.is_some())
    }

    fn peer_name(&self, peer: usize) -> &'static str {
        ["bpftrace", "rezolus"][peer]
    }

    fn start_peer(&self, peer: usize, tag: &str) -> anyhow::Result<Box<dyn Peer>> {
        let dir = self.disk.dir();
        Ok(match self.rezolus.filter(|_| peer == 1) {
            Some(bin) => Box::new(Rezolus::start(bin, dir, tag)?),
            None => Box::new(Bpftrace::start(&peers::BLOCK_LATENCY, dir, tag)?),
        })
    }
}

/// Every round on both devices: `[tmpfs-backed, disk-backed]`.
pub fn measure(
    settings: &Settings,
    bin: &Path,
    [disk, on_disk]: [&LoopDisk; 2],
) -> anyhow::Result<Measured> {
    eprintln!("bench: trying the usual peers (BCC, the bpftrace package's tools)");
    let mut unavailable = peers::unavailable(&["biolatency", "biosnoop"]);
    let rezolus = match peers::rezolus::find() {
        Ok(bin) => Some(bin),
        Err(why) => {
            unavailable.push(why);
            None
        }
    };
    for u in &unavailable {
        eprintln!("bench: peer {}: {}", u.tool, u.verdict);
    }
    let on = |d: &LoopDisk| if d.direct_io { "on" } else { "off" };
    eprintln!(
        "bench: {} on tmpfs (loop direct I/O {}), {} on the VM's disk (loop direct I/O {}), \
         {} rounds x {} s per run",
        disk.device(),
        on(disk),
        on_disk.device(),
        on(on_disk),
        settings.rounds,
        settings.runtime_s
    );
    // Fault in fio and the devices once, so round 1's first runs do not pay for it alone.
    for d in [disk, on_disk] {
        fio::randread(d.device(), PARTS[0].iodepth, 1)?;
    }
    let mut suite = BlockSuite {
        runtime_s: settings.runtime_s,
        bin,
        disk,
        on_disk,
        rezolus: rezolus.as_deref(),
        hooks: Vec::new(),
    };
    let runs = engine::measure(&mut suite, settings, Vec::new())?;
    Ok(Measured {
        runs,
        direct_io: disk.direct_io,
        disk_direct_io: on_disk.direct_io,
        hooks: suite.hooks,
        rezolus: rezolus.is_some(),
        unavailable,
    })
}
