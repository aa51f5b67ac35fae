//! The block suite's paired-run driver: every round, the untraced, traced
//! and peer blocks in the order `paired` gives, each part (a device and a
//! depth) once per configuration; one daemon, one floor (right after the daemon, in the
//! traced block), one bpftrace and one rezolus (when installed; both in the
//! peer block) per round.

use std::path::Path;

use super::{Backing, DaemonLife, DepthRuns, Measured, PARTS, Part, PeerRun, Settings};
use crate::bench::fio::{self, FioRun};
use crate::bench::floor::{self, AttachPoint, Floor};
use crate::bench::loopdisk::LoopDisk;
use crate::bench::paired::{self, Block, Window};
use crate::bench::peers::{self, Bpftrace, PeerChild, Rezolus};
use crate::bench::quiet;
use crate::bench::tracer::programs::total_runs;
use crate::bench::tracer::{self, Tracer};

struct Ctx<'a> {
    settings: &'a Settings,
    bin: &'a Path,
    /// The tmpfs-backed device; its directory is the scratch for the tracers' files.
    disk: &'a LoopDisk,
    on_disk: &'a LoopDisk,
    /// sysctl kernel.bpf_stats_enabled was 1: every run counts program runs.
    stats_sysctl: bool,
    /// The second peer's binary, when installed.
    rezolus: Option<&'a Path>,
}

impl Ctx<'_> {
    fn fio(&self, part: Part) -> anyhow::Result<FioRun> {
        let disk = match part.backing {
            Backing::Tmpfs => self.disk,
            Backing::Disk => self.on_disk,
        };
        fio::randread(disk.device(), part.iodepth, self.settings.runtime_s)
    }

    fn label(&self, round: usize, part: Part, config: &str) -> String {
        format!(
            "round {round}/{} {} {config}",
            self.settings.rounds,
            part.label()
        )
    }
}

/// Every round on both devices: `[tmpfs-backed, disk-backed]`.
pub fn measure(
    settings: &Settings,
    bin: &Path,
    [disk, on_disk]: [&LoopDisk; 2],
) -> anyhow::Result<Measured> {
    let mut m = Measured {
        depths: PARTS.into_iter().map(DepthRuns::new).collect(),
        daemons: Vec::new(),
        direct_io: disk.direct_io,
        disk_direct_io: on_disk.direct_io,
        hooks: Vec::new(),
        floor: None,
        rezolus: false,
        warnings: Vec::new(),
        unavailable: Vec::new(),
    };
    eprintln!("bench: trying the usual peers (BCC, the bpftrace package's tools)");
    m.unavailable = peers::unavailable(&["biolatency", "biosnoop"]);
    let rezolus_bin = match peers::rezolus::find() {
        Ok(bin) => Some(bin),
        Err(why) => {
            m.unavailable.push(why);
            None
        }
    };
    m.rezolus = rezolus_bin.is_some();
    for u in &m.unavailable {
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
    let stats_sysctl = paired::stats_sysctl_on(&mut m.warnings);
    // Fault in fio and the devices once, so round 1's first runs do not pay for it alone.
    for d in [disk, on_disk] {
        fio::randread(d.device(), PARTS[0].iodepth, 1)?;
    }
    let ctx = Ctx {
        settings,
        bin,
        disk,
        on_disk,
        stats_sysctl,
        rezolus: rezolus_bin.as_deref(),
    };
    for round in 1..=settings.rounds {
        let parts = paired::parts(round, PARTS.len());
        for block in paired::blocks(round) {
            match block {
                Block::Untraced => untraced(&ctx, &mut m, round, &parts)?,
                Block::Traced => traced(&ctx, &mut m, round, &parts)?,
                Block::Peer => {
                    // Both peers in the one block, taking turns (see `paired::second_peer_first`).
                    let second_first = paired::second_peer_first(round);
                    for second in [second_first, !second_first] {
                        match (second, ctx.rezolus) {
                            (false, _) => peer(&ctx, &mut m, round, &parts)?,
                            (true, Some(bin)) => rezolus(&ctx, &mut m, round, &parts, bin)?,
                            (true, None) => {}
                        }
                    }
                }
            }
        }
    }
    Ok(m)
}

fn untraced(ctx: &Ctx, m: &mut Measured, round: usize, parts: &[usize]) -> anyhow::Result<()> {
    for &i in parts {
        let part = PARTS[i];
        let label = ctx.label(round, part, "untraced");
        let run = quiet::retry(&label, &mut m.warnings, || {
            let before = quiet::block_disturbance(&[]);
            let run = ctx.fio(part)?;
            Ok((run, before.or_else(|| quiet::block_disturbance(&[]))))
        })?;
        progress(&label, &run);
        m.depths[i].untraced.push(run);
    }
    Ok(())
}

/// One run of `part` under a daemon or a peer (`ours`: its programs, for
/// the quiet-host check; `ids`: those whose counters are read), with the
/// accounting on when `stats`; tried again (up to the usual attempts) when
/// disturbed, its warnings into `warnings`.
fn window(
    ctx: &Ctx,
    warnings: &mut Vec<String>,
    label: &str,
    part: Part,
    (ours, ids): (&[u64], &[u64]),
    stats: bool,
    usage: impl Fn() -> anyhow::Result<tracer::Usage>,
) -> anyhow::Result<Window<FioRun>> {
    let w = quiet::retry(label, warnings, || {
        let before = quiet::block_disturbance(ours);
        let w = paired::window(ids, stats, &usage, || ctx.fio(part))?;
        let disturbed = before
            .or_else(|| quiet::block_disturbance(ours))
            .or_else(|| {
                paired::stats_disturbance(stats, ctx.stats_sysctl, total_runs(&w.counters))
            });
        Ok((w, disturbed))
    })?;
    progress(label, &w.run);
    Ok(w)
}

/// One daemon for the round: each depth as deployed and with the accounting
/// on, each run's program counters read around it, and named after the
/// daemon has stopped (by its stop record); then the floor on its hooks.
fn traced(ctx: &Ctx, m: &mut Measured, round: usize, parts: &[usize]) -> anyhow::Result<()> {
    let tag = format!("r{round}-traced");
    let tracer = Tracer::start(ctx.bin, ctx.disk.dir(), &tag, false, &[])?;
    if m.hooks.is_empty() {
        m.hooks = tracer.hooks_of("block");
    }
    let points = floor::points_of(&tracer.start, "block")?;
    let attached = tracer.attached_programs();
    let ids: Vec<u64> = attached.iter().map(|(id, _, _)| *id).collect();
    let ours = tracer.prog_ids();
    let runs = paired::each_run(round, parts, |i, stats| {
        let part = PARTS[i];
        let label = ctx.label(round, part, &paired::config("traced", stats));
        let usage = || tracer.usage();
        window(
            ctx,
            &mut m.warnings,
            &label,
            part,
            (&ours, &ids),
            stats,
            usage,
        )
    })?;
    let finished = tracer.stop()?;
    for (i, stats, run) in paired::named(runs, &attached, &finished.stop) {
        m.depths[i].file_traced(stats, run);
    }
    m.daemons.push(DaemonLife {
        stop: finished.stop,
        lifetime_cpu_s: finished.lifetime_cpu_s,
    });
    floor_runs(ctx, m, round, parts, &points)
}

/// The floor in the daemon's place, in the same block of the same round:
/// empty programs on `points` (the daemon's hooks, as it attached them),
/// each depth once with the accounting on. Compiled once, and again only if
/// a daemon attached other hooks.
fn floor_runs(
    ctx: &Ctx,
    m: &mut Measured,
    round: usize,
    parts: &[usize],
    points: &[AttachPoint],
) -> anyhow::Result<()> {
    if m.floor.as_ref().is_none_or(|o| o.points != points) {
        m.floor = Some(floor::Object::compile(points, ctx.disk.dir())?);
    }
    let attached = Floor::attach(m.floor.as_ref().expect("compiled above"))?;
    let ids = attached.prog_ids();
    let usage = || Ok(Floor::usage());
    for &i in parts {
        let part = PARTS[i];
        let label = ctx.label(round, part, &paired::config("floor", true));
        let w = window(
            ctx,
            &mut m.warnings,
            &label,
            part,
            (&ids, &ids),
            true,
            usage,
        )?;
        m.depths[i].floor.push(PeerRun {
            programs: attached.costs(&w.counters),
            run: w.run,
            usage: w.usage,
        });
    }
    attached.detach()
}

/// One bpftrace for the round, the same two runs per depth as the daemon's.
fn peer(ctx: &Ctx, m: &mut Measured, round: usize, parts: &[usize]) -> anyhow::Result<()> {
    let tag = format!("r{round}-bpftrace");
    let peer = Bpftrace::start(&peers::BLOCK_LATENCY, ctx.disk.dir(), &tag)?;
    let runs = peer_runs(ctx, &mut m.warnings, round, parts, &peer)?;
    peer.stop()?;
    for (i, stats, run) in runs {
        m.depths[i].file_peer(stats, run);
    }
    Ok(())
}

/// One rezolus for the round, the same two runs per depth as bpftrace's.
fn rezolus(
    ctx: &Ctx,
    m: &mut Measured,
    round: usize,
    parts: &[usize],
    bin: &Path,
) -> anyhow::Result<()> {
    let tag = format!("r{round}-rezolus");
    let peer = Rezolus::start(bin, ctx.disk.dir(), &tag)?;
    let runs = peer_runs(ctx, &mut m.warnings, round, parts, &peer)?;
    peer.stop()?;
    for (i, stats, run) in runs {
        m.depths[i].file_second_peer(stats, run);
    }
    Ok(())
}

/// Each part's two runs (without and with the accounting) under a peer
/// started for the block, in this round's order.
fn peer_runs(
    ctx: &Ctx,
    warnings: &mut Vec<String>,
    round: usize,
    parts: &[usize],
    peer: &PeerChild,
) -> anyhow::Result<Vec<(usize, bool, PeerRun)>> {
    let ids = peer.prog_ids();
    paired::each_run(round, parts, |i, stats| {
        let part = PARTS[i];
        let label = ctx.label(round, part, &paired::config(peer.name, stats));
        let w = window(ctx, warnings, &label, part, (&ids, &ids), stats, || {
            peer.usage()
        })?;
        Ok(PeerRun {
            programs: peer.costs(&w.counters),
            run: w.run,
            usage: w.usage,
        })
    })
}

/// One line per run, figures lined up across configurations.
fn progress(label: &str, run: &FioRun) {
    let head = format!("{label}:");
    eprintln!(
        "bench: {head:<38} {:.0} IOPS, p50 {:.1} us, p99 {:.1} us",
        run.iops, run.p50_us, run.p99_us
    );
}
