//! `bench block`: what stalltrace's block hooks cost an I/O-bound workload.
//!
//! fio 4k random reads on a tmpfs-backed loop device (fast, so the per-I/O
//! cost of the hooks is as visible as it can be) in three configurations,
//! taken in turn every round so drift on the host hits them alike: untraced;
//! traced as deployed (no `--bpf-stats`), which fio's own IOPS and p99 judge;
//! and traced with `--bpf-stats`, which gives each program's cost per event
//! from the kernel's accounting (and pays for that accounting on every run,
//! so its IOPS are shown but judge nothing).

mod render;
mod results;

use std::path::Path;
use std::time::Instant;

use anyhow::bail;

use super::fio::{self, FioRun};
use super::loopdisk::{self, LoopDisk};
use super::peers::{self, Bpftrace, PeerProgram, StatsOn};
use super::publish::{self, Host};
use super::quiet;
pub use super::settings::Settings;
use super::tracer::{self, StopRecord, Tracer};

/// QD16 is the headline (the target is set there); QD1 shows the cost on a
/// latency-bound workload, where the hooks sit on every I/O's critical path.
const DEPTHS: [u32; 2] = [16, 1];
const FILE_MIB: u64 = 1024;
pub const IOPS_RATIO_TARGET: f64 = 0.97;
pub const NS_PER_EVENT_TARGET: f64 = 150.0;

/// Rounds and seconds per fio run (overridable: see [`Settings`]). The
/// defaults keep the suite under 4 minutes: 5 rounds x 2 depths x 3 configs
/// (untraced, traced, the bpftrace peer) x 4 s of fio, plus the two
/// `--bpf-stats` configurations in the first [`BPF_STATS_ROUNDS`] rounds only
/// (per-event costs are sums of kernel counters, steady from one round to the
/// next), plus a second or so per daemon or bpftrace to load and attach.
const ROUNDS: u64 = 5;
const RUNTIME_S: u64 = 4;
pub const BPF_STATS_ROUNDS: usize = 2;

/// The bpftrace peer, one run: fio's figures, and its programs' accounting
/// (zero unless bpf_stats were on).
pub struct PeerRun {
    pub fio: FioRun,
    pub programs: Vec<PeerProgram>,
}

/// One traced fio run and what the daemon reported and used during it.
pub struct TracedRun {
    pub fio: FioRun,
    pub stop: StopRecord,
    /// Daemon CPU (user + sys) between its start record and SIGINT, and that window's length.
    pub cpu_in_window_s: f64,
    pub window_s: f64,
    pub lifetime_cpu_s: f64,
    pub peak_rss_kib: u64,
}

pub struct DepthRuns {
    pub iodepth: u32,
    pub untraced: Vec<FioRun>,
    /// stalltrace as deployed, without `--bpf-stats`: its programs count no runs.
    pub traced: Vec<TracedRun>,
    /// stalltrace with `--bpf-stats`: the per-program costs come from these.
    pub traced_bpf_stats: Vec<TracedRun>,
    /// The bpftrace peer, without and with bpf_stats.
    pub peer: Vec<PeerRun>,
    pub peer_bpf_stats: Vec<PeerRun>,
}

/// Everything measured, before aggregation.
pub struct Measured {
    pub depths: Vec<DepthRuns>,
    pub direct_io: bool,
    /// Hooks as the daemon reported them attached: "block_rq_issue (tp_btf)".
    pub hooks: Vec<String>,
    /// Anything that may have disturbed the figures.
    pub warnings: Vec<String>,
    /// The usual peers that cannot run here, and why.
    pub unavailable: Vec<peers::Unavailable>,
}

pub fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env(ROUNDS, RUNTIME_S)?;
    let began = Instant::now();
    let host = Host::this();
    let load_before = publish::load_average();
    let bin = super::stalltrace_bin();

    let disk = LoopDisk::create(FILE_MIB)?;
    let scratch = disk.dir().to_path_buf();
    let measured = measure(&settings, &bin, &disk);
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

fn measure(settings: &Settings, bin: &Path, disk: &LoopDisk) -> anyhow::Result<Measured> {
    let mut m = Measured {
        depths: DEPTHS
            .iter()
            .map(|&iodepth| DepthRuns {
                iodepth,
                untraced: Vec::new(),
                traced: Vec::new(),
                traced_bpf_stats: Vec::new(),
                peer: Vec::new(),
                peer_bpf_stats: Vec::new(),
            })
            .collect(),
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
    // With the sysctl on, the kernel accounts every program run whatever the
    // daemon asks for: the "traced" configuration then pays for bpf_stats too.
    let stats_sysctl = tracer::bpf_stats_sysctl();
    if stats_sysctl {
        let w = "sysctl kernel.bpf_stats_enabled was 1, so the traced runs without \
                 --bpf-stats paid the bpf_stats cost too"
            .to_string();
        eprintln!("bench: warning: {w}");
        m.warnings.push(w);
    }
    for round in 1..=settings.rounds {
        for d in &mut m.depths {
            let (qd, rounds) = (d.iodepth, settings.rounds);
            let label = format!("round {round}/{rounds} QD{qd} untraced");
            let run = quiet::retry(&label, &mut m.warnings, || {
                let before = quiet::block_disturbance(&[]);
                let run = fio::randread(dev, qd, settings.runtime_s)?;
                Ok((run, before.or_else(|| quiet::block_disturbance(&[]))))
            })?;
            progress(&label, &run);
            d.untraced.push(run);

            for bpf_stats in [false, true] {
                if bpf_stats && round > BPF_STATS_ROUNDS {
                    continue;
                }
                let config = if bpf_stats {
                    "traced+bpf-stats"
                } else {
                    "traced"
                };
                let label = format!("round {round}/{rounds} QD{qd} {config}");
                let tag = format!("r{round}-qd{qd}-{config}");
                let (run, hooks) = quiet::retry(&label, &mut m.warnings, || {
                    let (run, hooks, disturbed) = traced(
                        bin,
                        disk,
                        qd,
                        settings.runtime_s,
                        &tag,
                        bpf_stats,
                        stats_sysctl,
                    )?;
                    Ok(((run, hooks), disturbed))
                })?;
                progress(&label, &run.fio);
                if m.hooks.is_empty() {
                    m.hooks = hooks;
                }
                if bpf_stats {
                    d.traced_bpf_stats.push(run);
                } else {
                    d.traced.push(run);
                }
            }

            for bpf_stats in [false, true] {
                if bpf_stats && round > BPF_STATS_ROUNDS {
                    continue;
                }
                let config = if bpf_stats {
                    "bpftrace+bpf-stats"
                } else {
                    "bpftrace"
                };
                let label = format!("round {round}/{rounds} QD{qd} {config}");
                let tag = format!("r{round}-qd{qd}-{config}");
                let run = quiet::retry(&label, &mut m.warnings, || {
                    let before = quiet::block_disturbance(&[]);
                    let peer = Bpftrace::start(&peers::BLOCK_LATENCY, disk.dir(), &tag)?;
                    let stats = bpf_stats.then(StatsOn::enable).transpose()?;
                    let fio = fio::randread(dev, qd, settings.runtime_s)?;
                    let programs = peer.costs();
                    drop(stats);
                    peer.stop()?;
                    let run = PeerRun { fio, programs };
                    Ok((run, before.or_else(|| quiet::block_disturbance(&[]))))
                })?;
                progress(&label, &run.fio);
                if bpf_stats {
                    d.peer_bpf_stats.push(run);
                } else {
                    d.peer.push(run);
                }
            }
        }
    }
    Ok(m)
}

/// One traced fio run, the hooks the daemon attached, and whether the run
/// was disturbed: anyone else's block hooks attached alongside (before or
/// after fio), or, for a run without `--bpf-stats`, the kernel accounting
/// program runs all the same because another process held bpf_stats on
/// (not counted as a disturbance when `stats_sysctl` says they were on for good).
fn traced(
    bin: &Path,
    disk: &LoopDisk,
    qd: u32,
    runtime_s: u64,
    tag: &str,
    bpf_stats: bool,
    stats_sysctl: bool,
) -> anyhow::Result<(TracedRun, Vec<String>, Option<String>)> {
    let tracer = Tracer::start(bin, disk.dir(), tag, bpf_stats, &[])?;
    let hooks = tracer.hooks_of("block");
    let ours = tracer.prog_ids();
    let disturbed = quiet::block_disturbance(&ours);
    let before = tracer.usage()?;
    let window = Instant::now();
    let fio = fio::randread(disk.device(), qd, runtime_s)?;
    let after = tracer.usage()?;
    let window_s = window.elapsed().as_secs_f64();
    let disturbed = disturbed.or_else(|| quiet::block_disturbance(&ours));
    let finished = tracer.stop()?;
    let counted: u64 = finished.stop.programs.iter().map(|p| p.run_count).sum();
    let disturbed = disturbed.or_else(|| {
        (!bpf_stats && !stats_sysctl && counted > 0).then(|| {
            format!(
                "bpf_stats were on although this daemon did not ask for them \
                 (its programs counted {counted} runs): another process held them"
            )
        })
    });
    let run = TracedRun {
        fio,
        stop: finished.stop,
        cpu_in_window_s: after.cpu_s - before.cpu_s,
        window_s,
        lifetime_cpu_s: finished.lifetime_cpu_s,
        peak_rss_kib: after.peak_rss_kib,
    };
    Ok((run, hooks, disturbed))
}

/// One line per run, figures lined up across configurations.
fn progress(label: &str, run: &FioRun) {
    let head = format!("{label}:");
    eprintln!(
        "bench: {head:<36} {:.0} IOPS, p50 {:.1} us, p99 {:.1} us",
        run.iops, run.p50_us, run.p99_us
    );
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
