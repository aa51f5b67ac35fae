//! The block suite's paired-run driver: every round, the untraced, traced
//! and peer blocks in the order `paired` gives, each depth once per
//! configuration; one daemon and one bpftrace per round.

use std::path::Path;

use super::{DEPTHS, DaemonLife, DepthRuns, Measured, PeerRun, Settings};
use crate::bench::fio::{self, FioRun};
use crate::bench::loopdisk::LoopDisk;
use crate::bench::paired::{self, Block, Window};
use crate::bench::peers::{self, Bpftrace};
use crate::bench::quiet;
use crate::bench::tracer::programs::total_runs;
use crate::bench::tracer::{self, Tracer};

struct Ctx<'a> {
    settings: &'a Settings,
    bin: &'a Path,
    disk: &'a LoopDisk,
    /// sysctl kernel.bpf_stats_enabled was 1: every run counts program runs.
    stats_sysctl: bool,
}

impl Ctx<'_> {
    fn fio(&self, qd: u32) -> anyhow::Result<FioRun> {
        fio::randread(self.disk.device(), qd, self.settings.runtime_s)
    }

    fn label(&self, round: usize, qd: u32, config: &str) -> String {
        format!("round {round}/{} QD{qd} {config}", self.settings.rounds)
    }
}

pub fn measure(settings: &Settings, bin: &Path, disk: &LoopDisk) -> anyhow::Result<Measured> {
    let mut m = Measured {
        depths: DEPTHS.into_iter().map(DepthRuns::new).collect(),
        daemons: Vec::new(),
        direct_io: disk.direct_io,
        hooks: Vec::new(),
        warnings: Vec::new(),
        unavailable: Vec::new(),
    };
    eprintln!("bench: trying the usual peers (BCC, the bpftrace package's tools)");
    m.unavailable = peers::unavailable(&["biolatency", "biosnoop"]);
    for u in &m.unavailable {
        eprintln!("bench: peer {}: {}", u.tool, u.verdict);
    }
    let dev = disk.device();
    eprintln!(
        "bench: {dev} (loop direct I/O {}), {} rounds x {} s per run",
        if disk.direct_io { "on" } else { "off" },
        settings.rounds,
        settings.runtime_s
    );
    let stats_sysctl = paired::stats_sysctl_on(&mut m.warnings);
    // Fault in fio and the device once, so round 1's first run does not pay for it alone.
    fio::randread(dev, DEPTHS[0], 1)?;
    let ctx = Ctx {
        settings,
        bin,
        disk,
        stats_sysctl,
    };
    for round in 1..=settings.rounds {
        let parts = paired::parts(round, DEPTHS.len());
        for block in paired::blocks(round) {
            match block {
                Block::Untraced => untraced(&ctx, &mut m, round, &parts)?,
                Block::Traced => traced(&ctx, &mut m, round, &parts)?,
                Block::Peer => peer(&ctx, &mut m, round, &parts)?,
            }
        }
    }
    Ok(m)
}

fn untraced(ctx: &Ctx, m: &mut Measured, round: usize, parts: &[usize]) -> anyhow::Result<()> {
    for &i in parts {
        let qd = DEPTHS[i];
        let label = ctx.label(round, qd, "untraced");
        let run = quiet::retry(&label, &mut m.warnings, || {
            let before = quiet::block_disturbance(&[]);
            let run = ctx.fio(qd)?;
            Ok((run, before.or_else(|| quiet::block_disturbance(&[]))))
        })?;
        progress(&label, &run);
        m.depths[i].untraced.push(run);
    }
    Ok(())
}

/// One run at depth `qd` under a daemon or a peer (`ours`: its programs, for
/// the quiet-host check; `ids`: those whose counters are read), with the
/// accounting on when `stats`; tried again (up to the usual attempts) when
/// disturbed, its warnings into `warnings`.
fn window(
    ctx: &Ctx,
    warnings: &mut Vec<String>,
    label: &str,
    qd: u32,
    (ours, ids): (&[u64], &[u64]),
    stats: bool,
    usage: impl Fn() -> anyhow::Result<tracer::Usage>,
) -> anyhow::Result<Window<FioRun>> {
    let w = quiet::retry(label, warnings, || {
        let before = quiet::block_disturbance(ours);
        let w = paired::window(ids, stats, &usage, || ctx.fio(qd))?;
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
/// daemon has stopped (by its stop record).
fn traced(ctx: &Ctx, m: &mut Measured, round: usize, parts: &[usize]) -> anyhow::Result<()> {
    let tag = format!("r{round}-traced");
    let tracer = Tracer::start(ctx.bin, ctx.disk.dir(), &tag, false, &[])?;
    if m.hooks.is_empty() {
        m.hooks = tracer.hooks_of("block");
    }
    let attached = tracer.attached_programs();
    let ids: Vec<u64> = attached.iter().map(|(id, _, _)| *id).collect();
    let ours = tracer.prog_ids();
    let runs = paired::each_run(round, parts, |i, stats| {
        let qd = DEPTHS[i];
        let label = ctx.label(round, qd, &paired::config("traced", stats));
        let usage = || tracer.usage();
        window(
            ctx,
            &mut m.warnings,
            &label,
            qd,
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
    Ok(())
}

/// One bpftrace for the round, the same two runs per depth as the daemon's.
fn peer(ctx: &Ctx, m: &mut Measured, round: usize, parts: &[usize]) -> anyhow::Result<()> {
    let tag = format!("r{round}-bpftrace");
    let peer = Bpftrace::start(&peers::BLOCK_LATENCY, ctx.disk.dir(), &tag)?;
    let ids = peer.prog_ids();
    let runs = paired::each_run(round, parts, |i, stats| {
        let qd = DEPTHS[i];
        let label = ctx.label(round, qd, &paired::config("bpftrace", stats));
        let w = window(
            ctx,
            &mut m.warnings,
            &label,
            qd,
            (&ids, &ids),
            stats,
            || peer.usage(),
        )?;
        Ok(PeerRun {
            programs: peer.costs(&w.counters),
            run: w.run,
            usage: w.usage,
        })
    })?;
    peer.stop()?;
    for (i, stats, run) in runs {
        m.depths[i].file_peer(stats, run);
    }
    Ok(())
}

/// One line per run, figures lined up across configurations.
fn progress(label: &str, run: &FioRun) {
    let head = format!("{label}:");
    eprintln!(
        "bench: {head:<38} {:.0} IOPS, p50 {:.1} us, p99 {:.1} us",
        run.iops, run.p50_us, run.p99_us
    );
}
