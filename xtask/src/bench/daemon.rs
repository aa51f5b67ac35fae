//! `bench daemon`: what the stalltrace process itself costs and how it
//! behaves at its limits.
//!
//! On a tmpfs-backed loop device under fio 4k random reads at QD16 (the block
//! suite's headline workload), each round starts two daemons in turn:
//!
//! - "deployed" (`stalltrace run --interval 1s`, the default `--slow-io-ms 50`):
//!   time from launch to its `start` record (programs loaded and attached) and
//!   to its first `block` record (first data), then its CPU (user + sys) and
//!   peak RSS while fio runs.
//! - "every I/O slow" (`--slow-io-ms 0.000001`: every I/O over 1 ns is a
//!   `slow_io` event, far more than the 256 KiB ring buffer drained every
//!   100 ms can carry, so it overflows): the oracle for the `lost` count.
//!   Every request the block layer completed while the daemon was attached is
//!   either a `slow_io` record or counted in `lost` as
//!   `block.slow_io_ringbuf_full`, so records + lost must equal the
//!   completions the kernel counted in /proc/diskstats (every whole disk: the
//!   lost count is not per device) over the same window.
//!
//! Note: `--slow-io-ms 0` turns `slow_io` records off (it does not make every
//! I/O slow), which is why the threshold here is 1 ns.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use serde::Serialize;

use super::fio::{self, FioRun};
use super::loopdisk::{self, LoopDisk};
use super::publish::Host;
use super::settings::Settings;
use super::shell;
use super::stats::Summary;
use super::tracer::Tracer;
use super::{interrupt, quiet, table};

mod render;

const ROUNDS: u64 = 5;
const RUNTIME_S: u64 = 4;
const FILE_MIB: u64 = 256;
const IODEPTH: u32 = 16;
pub const CPU_PCT_TARGET: f64 = 2.0;
pub const RSS_MIB_TARGET: f64 = 40.0;
/// How far records + lost may be from the kernel's completions and still
/// balance: requests in flight when the programs attached (completed, never
/// tracked) and the VM disk's I/O at the edges of the window. A handful at most.
const BALANCE_MARGIN: i64 = 16;

const DEPLOYED: &[&str] = &["run", "--interval", "1s"];
const EVERY_IO_SLOW: &[&str] = &["run", "--interval", "1s", "--slow-io-ms", "0.000001"];

#[derive(Serialize, Clone, Debug)]
struct DeployedRun {
    start_record_ms: f64,
    /// None when no block record came within the run.
    first_block_record_ms: Option<f64>,
    cpu_pct_of_one_cpu: f64,
    peak_rss_mib: f64,
    lifetime_cpu_s: f64,
    fio: FioRun,
}

#[derive(Serialize, Clone, Debug)]
struct BurstRun {
    fio: FioRun,
    /// Completions in /proc/diskstats (reads + writes + discards; flush
    /// requests carry no bio, so no event) of every whole disk, between just after the start record and just before SIGINT.
    completed_all_disks: u64,
    completed_loop: u64,
    slow_io_records: u64,
    slow_io_records_loop: u64,
    lost_ringbuf_full: u64,
    /// Completions the hooks never saw (found afterwards by the daemon, see
    /// `completions_unseen` in docs/records.md): no event can exist for them.
    completions_unseen: u64,
    /// Completions the kernel ran no hook for, declared by the daemon in
    /// `lost` as `block.kernel_skipped` (docs/records.md): no event can
    /// exist for them either. Also in `lost_other`.
    kernel_skipped: u64,
    /// Every other lost source, over the run.
    lost_other: BTreeMap<String, u64>,
    /// slow_io records + lost + unseen + skipped − completions (0 when the
    /// books balance).
    difference: i64,
    cpu_pct_of_one_cpu: f64,
    peak_rss_mib: f64,
}

#[derive(Serialize)]
struct Verdict {
    target: String,
    measured: String,
    met: bool,
    detail: String,
}

#[derive(Serialize)]
struct DaemonResults {
    host: Host,
    command: &'static str,
    wall_time_s: f64,
    rounds: usize,
    runtime_s: u64,
    fio: String,
    deployed_command: String,
    every_io_slow_command: String,
    start_record_ms: Summary,
    first_block_record_ms: Option<Summary>,
    cpu_pct_of_one_cpu: Summary,
    peak_rss_mib: Summary,
    lifetime_cpu_s: Summary,
    fio_iops: Summary,
    burst_cpu_pct_of_one_cpu: Summary,
    burst_peak_rss_mib: Summary,
    burst_fio_iops: Summary,
    deployed: Vec<DeployedRun>,
    burst: Vec<BurstRun>,
    targets: Vec<Verdict>,
    warnings: Vec<String>,
}

pub fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env(ROUNDS, RUNTIME_S)?;
    let began = Instant::now();
    let host = Host::this();
    let bin = super::stalltrace_bin();
    let disk = LoopDisk::create(FILE_MIB)?;
    let scratch = disk.dir().to_path_buf();
    let measured = measure(&settings, &bin, &disk);
    drop(disk);
    let mut leaks = loopdisk::loops_under(&scratch);
    if scratch.exists() {
        leaks.push(format!("{} still exists", scratch.display()));
    }
    let (deployed, burst, warnings) = shell::torn_down(
        measured,
        leaks,
        "loop device detached, tmpfs unmounted, no stalltrace left",
    )?;
    let r = aggregate(
        &settings,
        host,
        began.elapsed().as_secs_f64(),
        deployed,
        burst,
        warnings,
    );
    shell::print_and_publish("daemon", &render::markdown(&r), &r)
}

type Measured = (Vec<DeployedRun>, Vec<BurstRun>, Vec<String>);

fn measure(settings: &Settings, bin: &Path, disk: &LoopDisk) -> anyhow::Result<Measured> {
    let (mut deployed, mut burst, mut warnings) = (Vec::new(), Vec::new(), Vec::new());
    let dev = disk.device();
    let loop_name = dev.trim_start_matches("/dev/").to_string();
    eprintln!(
        "bench: {dev}, {} rounds x 2 daemons x {} s of fio QD{IODEPTH}",
        settings.rounds, settings.runtime_s
    );
    // Fault in fio and the device once.
    fio::randread(dev, IODEPTH, 1)?;
    for round in 1..=settings.rounds {
        let label = format!("round {round}/{} deployed", settings.rounds);
        let run = quiet::retry_failures(&label, &mut warnings, || {
            let before = quiet::block_disturbance(&[]);
            let run = deployed_run(bin, disk, settings.runtime_s, &format!("r{round}-deployed"))?;
            Ok((run, before.or_else(|| quiet::block_disturbance(&[]))))
        })?;
        eprintln!(
            "bench: {label:<28} start record {:.0} ms, first block record {}, CPU {:.2}% of \
             one CPU, peak RSS {:.1} MiB, fio {:.0} IOPS",
            run.start_record_ms,
            run.first_block_record_ms
                .map_or("none".into(), |ms| format!("{ms:.0} ms")),
            run.cpu_pct_of_one_cpu,
            run.peak_rss_mib,
            run.fio.iops
        );
        deployed.push(run);

        let label = format!("round {round}/{} every I/O slow", settings.rounds);
        let run = quiet::retry_failures(&label, &mut warnings, || {
            let before = quiet::block_disturbance(&[]);
            let run = burst_run(bin, disk, &loop_name, settings.runtime_s, round as u64)?;
            Ok((run, before.or_else(|| quiet::block_disturbance(&[]))))
        })?;
        eprintln!(
            "bench: {label:<28} {} completed, {} slow_io records + {} lost = {} ({:+}), \
             CPU {:.2}%, peak RSS {:.1} MiB",
            run.completed_all_disks,
            run.slow_io_records,
            run.lost_ringbuf_full,
            run.slow_io_records + run.lost_ringbuf_full,
            run.difference,
            run.cpu_pct_of_one_cpu,
            run.peak_rss_mib
        );
        burst.push(run);
    }
    Ok((deployed, burst, warnings))
}

fn deployed_run(
    bin: &Path,
    disk: &LoopDisk,
    runtime_s: u64,
    tag: &str,
) -> anyhow::Result<DeployedRun> {
    let launched = Instant::now();
    let tracer = Tracer::start_with(bin, disk.dir(), tag, DEPLOYED)?;
    let start_record_ms = launched.elapsed().as_secs_f64() * 1e3;
    let before = tracer.usage()?;
    let window = Instant::now();
    let out = tracer.out().to_path_buf();
    let (fio, first) = std::thread::scope(|s| {
        let fio = s.spawn(|| fio::randread(disk.device(), IODEPTH, runtime_s));
        let mut first = None;
        while !fio.is_finished() {
            if first.is_none() && has_record(&out, "block") {
                first = Some(launched.elapsed().as_secs_f64() * 1e3);
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        (fio.join().expect("fio thread"), first)
    });
    let fio = fio?;
    let after = tracer.usage()?;
    let window_s = window.elapsed().as_secs_f64();
    let finished = tracer.stop()?;
    // The scratch tmpfs is small: keep only what is still needed.
    let _ = fs::remove_file(&out);
    Ok(DeployedRun {
        start_record_ms,
        first_block_record_ms: first,
        cpu_pct_of_one_cpu: 100.0 * (after.cpu_s - before.cpu_s) / window_s,
        peak_rss_mib: after.peak_rss_kib as f64 / 1024.0,
        lifetime_cpu_s: finished.lifetime_cpu_s,
        fio,
    })
}

fn burst_run(
    bin: &Path,
    disk: &LoopDisk,
    loop_name: &str,
    runtime_s: u64,
    round: u64,
) -> anyhow::Result<BurstRun> {
    let tracer = Tracer::start_with(bin, disk.dir(), &format!("r{round}-burst"), EVERY_IO_SLOW)?;
    let out = tracer.out().to_path_buf();
    let disks0 = completions()?;
    let before = tracer.usage()?;
    let window = Instant::now();
    let fio = fio::randread(disk.device(), IODEPTH, runtime_s)?;
    let after = tracer.usage()?;
    let window_s = window.elapsed().as_secs_f64();
    let disks1 = completions()?;
    let finished = tracer.stop()?;
    interrupt::check()?;
    let delta = |name: Option<&str>| -> u64 {
        disks1
            .iter()
            .filter(|(d, _)| name.is_none_or(|n| n == d.as_str()))
            .map(|(d, n)| n.saturating_sub(disks0.get(d).copied().unwrap_or(0)))
            .sum()
    };
    let text =
        fs::read_to_string(&out).with_context(|| format!("cannot read {}", out.display()))?;
    // ~30 MB per run with every I/O slow: the scratch tmpfs (image + 64 MiB)
    // would fill by the fourth round, and a daemon that cannot write dies.
    let _ = fs::remove_file(&out);
    let (mut records, mut records_loop, mut unseen) = (0, 0, 0);
    for line in text.lines() {
        let Ok(r) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if r["type"] == "block" && r["op"] != "flush" {
            unseen += r["completions_unseen"].as_u64().unwrap_or(0);
        }
        if r["type"] == "slow_io" {
            records += 1;
            if r["dev"] == loop_name {
                records_loop += 1;
            }
        }
    }
    let mut lost_other = finished.stop.lost.clone();
    let lost = lost_other.remove("block.slow_io_ringbuf_full").unwrap_or(0);
    let skipped = lost_other.get("block.kernel_skipped").copied().unwrap_or(0);
    let completed = delta(None);
    Ok(BurstRun {
        fio,
        completed_all_disks: completed,
        completed_loop: delta(Some(loop_name)),
        slow_io_records: records,
        slow_io_records_loop: records_loop,
        lost_ringbuf_full: lost,
        completions_unseen: unseen,
        kernel_skipped: skipped,
        lost_other,
        difference: (records + lost + unseen + skipped) as i64 - completed as i64,
        cpu_pct_of_one_cpu: 100.0 * (after.cpu_s - before.cpu_s) / window_s,
        peak_rss_mib: after.peak_rss_kib as f64 / 1024.0,
    })
}

/// Whether `path` holds a complete record of `kind`.
fn has_record(path: &Path, kind: &str) -> bool {
    let needle = format!("\"type\":\"{kind}\"");
    fs::read_to_string(path)
        .is_ok_and(|t| t.lines().any(|l| l.contains(&needle) && l.ends_with('}')))
}

/// Completed requests per whole disk (those in /sys/block): reads, writes
/// and discards, from /proc/diskstats.
fn completions() -> anyhow::Result<BTreeMap<String, u64>> {
    let text = fs::read_to_string("/proc/diskstats").context("cannot read /proc/diskstats")?;
    Ok(parse_diskstats(&text, |name| {
        Path::new("/sys/block").join(name).exists()
    }))
}

fn parse_diskstats(text: &str, whole: impl Fn(&str) -> bool) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = *f.get(2)?;
            if !whole(name) {
                return None;
            }
            let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            // reads 3, writes 7, discards 14 (absent on old kernels: 0). Not
            // flushes (18): a flush request the block layer makes for an fsync
            // carries no bio, so it is never a slow_io event.
            Some((name.to_string(), n(3) + n(7) + n(14)))
        })
        .collect()
}

fn summary(v: impl IntoIterator<Item = f64>) -> Summary {
    Summary::of(&v.into_iter().collect::<Vec<_>>()).expect("at least one round")
}

fn aggregate(
    settings: &Settings,
    host: Host,
    wall_time_s: f64,
    deployed: Vec<DeployedRun>,
    burst: Vec<BurstRun>,
    warnings: Vec<String>,
) -> DaemonResults {
    let cpu = summary(deployed.iter().map(|d| d.cpu_pct_of_one_cpu));
    let rss = summary(deployed.iter().map(|d| d.peak_rss_mib));
    let burst_cpu = summary(burst.iter().map(|b| b.cpu_pct_of_one_cpu));
    let burst_rss = summary(burst.iter().map(|b| b.peak_rss_mib));
    let firsts: Vec<f64> = deployed
        .iter()
        .filter_map(|d| d.first_block_record_ms)
        .collect();
    let balanced = burst
        .iter()
        .filter(|b| b.difference.abs() <= BALANCE_MARGIN)
        .count();
    let exact = burst.iter().filter(|b| b.difference == 0).count();
    let overflowed = burst.iter().filter(|b| b.lost_ringbuf_full > 0).count();
    // A daemon that sent no slow_io event and counted no loss did not time
    // I/O at all: say so rather than only "unbalanced".
    let silent = burst
        .iter()
        .filter(|b| b.slow_io_records + b.lost_ringbuf_full == 0 && b.completed_all_disks > 0)
        .count();
    let worst = burst
        .iter()
        .map(|b| b.difference)
        .max_by_key(|d| d.abs())
        .unwrap_or(0);
    let targets = vec![
        Verdict {
            target: format!(
                "daemon CPU (user+sys) < {CPU_PCT_TARGET}% of one core at the block workload's rate"
            ),
            measured: format!("{:.2}% (max {:.2}%)", cpu.median, cpu.max),
            met: cpu.max < CPU_PCT_TARGET,
            detail: format!(
                "{} (median {:.2}%, min–max {:.2}–{:.2}%, fio QD{IODEPTH} at {:.0} IOPS); with \
                 every I/O a slow_io event: {:.2}% (max {:.2}%)",
                if cpu.max < CPU_PCT_TARGET {
                    "met in every round"
                } else {
                    "missed in some round"
                },
                cpu.median,
                cpu.min,
                cpu.max,
                summary(deployed.iter().map(|d| d.fio.iops)).median,
                burst_cpu.median,
                burst_cpu.max
            ),
        },
        Verdict {
            target: format!("daemon peak RSS < {RSS_MIB_TARGET:.0} MiB"),
            measured: format!("{:.1} MiB (max)", rss.max),
            met: rss.max < RSS_MIB_TARGET,
            detail: if rss.max < RSS_MIB_TARGET {
                format!(
                    "met with {:.1} MiB to spare; with every I/O slow {:.1} MiB",
                    RSS_MIB_TARGET - rss.max,
                    burst_rss.max
                )
            } else {
                format!(
                    "missed by {:.1} MiB (VmHWM, as deployed); with every I/O slow {:.1} MiB",
                    rss.max - RSS_MIB_TARGET,
                    burst_rss.max
                )
            },
        },
        Verdict {
            target: format!(
                "ring buffer overflow: slow_io records + lost + completions unseen or skipped = I/Os \
                 completed (diskstats), \
                 within ±{BALANCE_MARGIN} (requests in flight at attach and detach)"
            ),
            measured: format!(
                "{balanced} of {} rounds balanced ({exact} exactly)",
                burst.len()
            ),
            met: balanced == burst.len() && overflowed > 0,
            detail: format!(
                "the ring buffer overflowed in {overflowed} of {} rounds (lost {:.0}% of events, \
                 median); worst difference {worst:+} (records + lost + unseen + skipped − completions){}",
                burst.len(),
                100.0
                    * summary(burst.iter().map(|b| {
                        b.lost_ringbuf_full as f64 / (b.completed_all_disks.max(1)) as f64
                    }))
                    .median,
                if silent > 0 {
                    format!(
                        "; in {silent} round(s) the daemon sent no slow_io event and counted no \
                         loss at all although the disks completed I/O: the binary under test \
                         did not time I/O at this threshold"
                    )
                } else {
                    String::new()
                }
            ),
        },
    ];
    DaemonResults {
        host,
        command: "cargo xtask bench daemon",
        wall_time_s,
        rounds: settings.rounds,
        runtime_s: settings.runtime_s,
        fio: format!(
            "fio --name=stalltrace-bench --filename=/dev/loopN --iodepth={IODEPTH} --runtime={}s {}",
            settings.runtime_s,
            fio::WORKLOAD.join(" ")
        ),
        deployed_command: format!("stalltrace {} --out FILE", DEPLOYED.join(" ")),
        every_io_slow_command: format!("stalltrace {} --out FILE", EVERY_IO_SLOW.join(" ")),
        start_record_ms: summary(deployed.iter().map(|d| d.start_record_ms)),
        first_block_record_ms: Summary::of(&firsts),
        cpu_pct_of_one_cpu: cpu,
        peak_rss_mib: rss,
        lifetime_cpu_s: summary(deployed.iter().map(|d| d.lifetime_cpu_s)),
        fio_iops: summary(deployed.iter().map(|d| d.fio.iops)),
        burst_cpu_pct_of_one_cpu: burst_cpu,
        burst_peak_rss_mib: burst_rss,
        burst_fio_iops: summary(burst.iter().map(|b| b.fio.iops)),
        deployed,
        burst,
        targets,
        warnings,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn diskstats_sum_whole_disks_only() {
        let text = "   7       0 loop0 100 0 800 10 5 0 40 1 0 10 11 2 0 16 0 3 0\n\
                    \x20254       0 vda 10 1 80 1 20 2 160 2 0 3 3 0 0 0 0 4 0\n\
                    \x20254       1 vda1 9 1 72 1 19 2 152 2 0 3 3 0 0 0 0 0 0\n";
        let m = super::parse_diskstats(text, |n| !n.ends_with('1'));
        assert_eq!(m["loop0"], 100 + 5 + 2);
        assert_eq!(m["vda"], 10 + 20);
        assert!(!m.contains_key("vda1"));
    }
}
