//! `cargo xtask bench soak --minutes N [--publish]`: everything at once for N
//! minutes under one `stalltrace run`, to see whether the daemon stays flat.
//!
//! Load (all from the lab's pieces, see soak/load.rs): fio mixed random
//! read/write on a tmpfs-backed loop device; two network namespaces with
//! random loss on both inputs (nftables `numgen random`) carrying a paced
//! iperf3 stream and the SQL Server simulator (server in one, a long-lived
//! client and back-to-back short clients in the other), so retransmits, RTOs,
//! SYN retransmits and session churn happen; and namespaces with veth pairs
//! made and removed every half second. The simulator's files are on an ext4
//! loop device of their own, so both disks' books are the soak's alone.
//!
//! Every minute: the daemon's VmRSS and CPU, the occupancy of each of its BPF
//! maps, the records and `lost` counts of the stream written in that minute,
//! and the oracles (/proc/diskstats of the two disks, RetransSegs and
//! TCPTimeouts of the two namespaces). At the end the load stops, the host
//! is left quiet for a few intervals, and the whole run's books are closed
//! against the same oracles. Results: target/bench/soak.json and soak.md (and
//! the stream's last 16 MiB, soak-tail.jsonl);
//! with `--publish` also the `soak` section of docs/BENCHMARKS.md and a
//! summary under its key of docs/benchmarks.json (a short verification run
//! does not overwrite them). Not part of `bench all`: it runs for as long as
//! it is told.

mod figures;
mod load;
mod maps;
mod report;
mod stream;
mod verdict;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Parser;
use serde::Serialize;
use stalltrace_lab::net::{NetPair, Side};
use stalltrace_lab::scenario::ScratchDir;
use stalltrace_lab::sql::{Mounted, Placement, SqlServerSim};
use stalltrace_lab::{Backing, Bins, LoopDevice};

use super::loopdisk::{self, LoopDisk};
use super::publish::{self, Host};
use super::tracer::{self, Tracer};
use super::{interrupt, quiet};
use crate::util;
use figures::Minute;
use load::{ChurnCounts, ClientCounts, Fio, StopOnDrop};
use report::Results;
use stream::{DiskCounts, Ours, Stream, Tally};

/// Stalltrace as deployed (default thresholds), every family, the whole host.
/// Not `--bpf-stats`: it makes the kernel time every BPF program on the host
/// for the whole soak, other people's benchmarks included.
const DAEMON_ARGS: &[&str] = &["run", "--interval", "1s"];
const FIO_MIB: u64 = 256;
const SQL_DISK_MIB: u32 = 256;
/// After the load stops: long enough for the daemon to write the last
/// intervals and to find completions it missed on idle disks (one idle interval).
const QUIET: Duration = Duration::from_secs(4);

#[derive(Parser)]
#[command(name = "cargo xtask bench soak")]
struct Opts {
    /// How long the load runs (one row of figures per minute).
    #[arg(long, default_value_t = 60)]
    minutes: u64,
    /// Also rewrite the soak section of docs/BENCHMARKS.md and its key of docs/benchmarks.json.
    #[arg(long)]
    publish: bool,
}

/// The oracles at one moment: the kernel's own counts.
#[derive(Serialize, Clone, Default, Debug)]
pub struct Oracle {
    /// Per soak disk, from /proc/diskstats.
    pub disks: BTreeMap<String, DiskCounts>,
    /// RetransSegs, TCPTimeouts and TCPSynRetrans of the two namespaces, summed.
    pub retrans_segs: u64,
    pub timeouts: u64,
    pub syn_retrans: u64,
}

impl Oracle {
    fn read(ours: &Ours, pair: &NetPair) -> Self {
        let (a, b) = (pair.counters(Side::A), pair.counters(Side::B));
        let both = |k: &str| a.get(k) + b.get(k);
        Oracle {
            disks: diskstats(&ours.devs),
            retrans_segs: both("Tcp.RetransSegs"),
            timeouts: both("TcpExt.TCPTimeouts"),
            syn_retrans: both("TcpExt.TCPSynRetrans"),
        }
    }

    fn since(&self, earlier: &Oracle) -> Oracle {
        Oracle {
            disks: self
                .disks
                .iter()
                .map(|(d, c)| {
                    (
                        d.clone(),
                        c.minus(&earlier.disks.get(d).copied().unwrap_or_default()),
                    )
                })
                .collect(),
            retrans_segs: self.retrans_segs - earlier.retrans_segs,
            timeouts: self.timeouts - earlier.timeouts,
            syn_retrans: self.syn_retrans - earlier.syn_retrans,
        }
    }
}

/// /proc/diskstats of `devs`, read here rather than with the code under
/// test: reads + writes completed (fields 4 and 8), sectors (6 and 10) and
/// flush requests (19, since 5.5). A disk that takes flushes also counts, as
/// writes, the empty sync writes the flush machinery completes without ever
/// issuing them (no block issue hook sees those, so stalltrace does not count
/// them): its requests do not balance, its flushes and bytes do.
fn diskstats(devs: &[String]) -> BTreeMap<String, DiskCounts> {
    let text = std::fs::read_to_string("/proc/diskstats").unwrap_or_default();
    text.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let name = *f.get(2)?;
            devs.iter().any(|d| d == name).then(|| {
                let n = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
                let counts = DiskCounts {
                    requests: n(3) + n(7),
                    flushes: n(18),
                    bytes: (n(5) + n(9)) * 512,
                    unseen: 0,
                };
                (name.to_string(), counts)
            })
        })
        .collect()
}

/// The largest request a disk takes, bytes: what a completion whose bytes
/// are unknown (unseen) can have carried at most.
fn max_request_bytes(dev: &str) -> u64 {
    std::fs::read_to_string(format!("/sys/block/{dev}/queue/max_sectors_kb"))
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let opts =
        Opts::try_parse_from(std::iter::once("soak".to_string()).chain(args.iter().cloned()))?;
    if opts.minutes == 0 {
        bail!("--minutes must be 1 or more");
    }
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the soak needs root (loop devices, network namespaces, eBPF)");
    }
    interrupt::install();
    util::build_release(&["stalltrace", "stalltrace-sim"])?;
    // What the binary was built from: the tree is shared and may change during the soak.
    let source = super::publish::source();
    interrupt::check()?;
    // Private copies: the short clients start sqlclient every 10 s for the
    // whole soak, and someone may rebuild target/release meanwhile.
    let copy = super::BinCopy::create()?;
    for sim in ["sqlservr", "sqlclient"] {
        std::fs::copy(
            util::workspace_root().join("target/release").join(sim),
            copy.path().join(sim),
        )
        .with_context(|| format!("cannot copy target/release/{sim}"))?;
    }
    let bins = Bins::beside(super::stalltrace_bin());
    bins.check();
    let began = Instant::now();
    let mut scratch_dirs = Vec::new();
    let outcome = soak(Host::this(), &opts, &bins, source, &mut scratch_dirs);
    let mut leaks: Vec<String> = scratch_dirs
        .iter()
        .flat_map(|d| loopdisk::loops_under(d))
        .collect();
    leaks.extend(tracer::our_daemons_left());
    leaks.extend(quiet::our_processes(&[
        "fio",
        "iperf3",
        "sqlservr",
        "sqlclient",
    ]));
    leaks.extend(our_namespaces_and_mounts());
    if !leaks.is_empty() {
        let leaks = format!("cleanup incomplete: {}", leaks.join("; "));
        return Err(match outcome {
            Ok(_) => anyhow::anyhow!(leaks),
            Err(e) => e.context(leaks),
        });
    }
    let mut r = outcome?;
    eprintln!("soak: cleaned up: no namespace, mount, loop device, daemon or load generator left");
    r.wall_time_s = began.elapsed().as_secs_f64();
    let body = report::markdown(&r);
    println!("\n{body}");
    let dir = util::workspace_root().join("target/bench");
    std::fs::create_dir_all(&dir)?;
    let json = serde_json::to_value(&r)?;
    std::fs::write(
        dir.join("soak.json"),
        serde_json::to_string_pretty(&json)? + "\n",
    )?;
    std::fs::write(dir.join("soak.md"), &body)?;
    eprintln!("soak: wrote {}/soak.json and soak.md", dir.display());
    if opts.publish {
        publish::publish("soak", &body, report::summary(&r))?;
    }
    Ok(())
}

/// Build, load, sample every minute, quiesce, close the books. Guards are
/// declared in build order, so they are removed in reverse, also on error.
fn soak(
    host: Host,
    opts: &Opts,
    bins: &Bins,
    source: String,
    scratch_dirs: &mut Vec<PathBuf>,
) -> anyhow::Result<Results> {
    let secs = opts.minutes * 60;
    let disk = LoopDisk::create(FIO_MIB)?;
    scratch_dirs.push(disk.dir().to_path_buf());
    let sql_disk = Mounted::new(LoopDevice::new(Backing::Tmpfs, SQL_DISK_MIB, true));
    // The lab names its backing files stalltrace-test-PID-N.img in /dev/shm.
    scratch_dirs.push(PathBuf::from(format!(
        "/dev/shm/stalltrace-test-{}-",
        std::process::id()
    )));
    let pair = NetPair::new();
    let files = ScratchDir::new("/var/tmp");
    interrupt::check()?;

    let daemon = Tracer::start_with(&bins.stalltrace, &files.0, "soak", DAEMON_ARGS)?;
    let pid = daemon.pid();
    let families = daemon.families();
    let maps = maps::discover(pid, &daemon.start)?;
    let fio_dev = disk.device().trim_start_matches("/dev/").to_string();
    let ours = Ours {
        devs: vec![fio_dev.clone(), sql_disk.disk.name.clone()],
        netns: vec![pair.netns_inode(Side::A), pair.netns_inode(Side::B)],
    };
    let mut stream = Stream::new(daemon.out());
    let mut pending = Tally::default();
    let base = Oracle::read(&ours, &pair);
    let mut warnings = Vec::new();

    let sim = SqlServerSim::start(
        bins,
        Placement::in_netns(pair.netns(Side::B)),
        "0.0.0.0:0",
        &sql_disk.path("soak.mdf"),
        &sql_disk.path("soak_log.ldf"),
        load::SIM_SERVER_ARGS,
    );
    // Sessions opened once the daemon knows the worker, so it reads their SPIDs.
    let until = Instant::now() + Duration::from_secs(30);
    while !stream.sql_workers.contains(&(sim.worker as u64)) && Instant::now() < until {
        interrupt::check()?;
        stream.poll(&mut pending, &ours)?;
        sleep(Duration::from_millis(200));
    }
    if !stream.sql_workers.contains(&(sim.worker as u64)) {
        warnings.push(format!(
            "the daemon reported no sql_instance for the simulator's worker (pid {}) within 30 s",
            sim.worker
        ));
    }
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let mut client = load::sql_client(bins, &pair, &server, secs);
    client.wait_for_sessions(
        &pair,
        sim.port,
        load::SESSIONS as usize,
        Duration::from_secs(30),
    );
    let iperf_server = pair.iperf3_server(Side::B);
    let mut iperf = load::iperf3_client(&pair, &iperf_server, secs + 60);
    pair.drop_random(Side::A, load::LOSS_PERCENT, None);
    pair.drop_random(Side::B, load::LOSS_PERCENT, None);
    let mut fio = Fio::start(disk.device(), secs + 60, &files.0)?;
    let (churn, clients) = (ChurnCounts::default(), ClientCounts::default());
    let stop = AtomicBool::new(false);
    let mut iperf_restarts = 0;
    eprintln!(
        "soak: {} minutes of load on {fio_dev} and {}, namespaces {} / {}, daemon pid {pid}",
        opts.minutes,
        sql_disk.disk.name,
        pair.netns(Side::A),
        pair.netns(Side::B)
    );

    let t0 = Instant::now();
    let rows = std::thread::scope(|s| -> anyhow::Result<Vec<Minute>> {
        let _stop = StopOnDrop(&stop);
        s.spawn(|| load::churn(&stop, &churn));
        s.spawn(|| load::session_churn(bins, pair.netns(Side::A), &server, &stop, &clients));
        let mut rows: Vec<Minute> = Vec::new();
        let mut last = (base.clone(), maps::usage(pid)?, t0, 0u64);
        let mut total = Tally::default();
        for minute in 1..=opts.minutes {
            let due = t0 + Duration::from_secs(minute * 60);
            while Instant::now() < due {
                interrupt::check()?;
                if !fio.is_running() {
                    bail!("fio stopped before the soak's end");
                }
                if !iperf.is_running() {
                    iperf_restarts += 1;
                    iperf = load::iperf3_client(&pair, &iperf_server, secs + 60);
                }
                maps::usage(pid).context("the daemon died")?;
                sleep(Duration::from_millis(250));
            }
            let usage = maps::usage(pid)?;
            let oracle = Oracle::read(&ours, &pair);
            stream.poll(&mut pending, &ours)?;
            let occupancy = maps::occupancy(&maps);
            let made = churn.made.load(Ordering::Relaxed);
            let now = Instant::now();
            let tally = std::mem::take(&mut pending);
            total.add(&tally);
            let row = Minute::new(
                minute,
                (&last.1, &usage, now.duration_since(last.2).as_secs_f64()),
                tally,
                oracle.since(&last.0),
                figures::differences(&total, &oracle.since(&base)),
                occupancy,
                made - last.3,
            );
            eprintln!("soak: {}", row.progress());
            rows.push(row);
            last = (oracle, usage, now, made);
        }
        stop.store(true, Ordering::SeqCst);
        Ok(rows)
    })?;

    // Quiesce: loss off first (so the closing handshakes are not retransmitted
    // for seconds), then every load generator, then a few quiet intervals.
    let nft_dropped = pair.dropped_packets(Side::A) + pair.dropped_packets(Side::B);
    pair.clear_drops(Side::A);
    pair.clear_drops(Side::B);
    let fio_ios = fio.stop()?;
    drop(iperf);
    let until = Instant::now() + Duration::from_secs(30);
    while client.is_running() && Instant::now() < until {
        sleep(Duration::from_millis(100));
    }
    let long_client = if client.is_running() {
        warnings.push("the long-lived sqlclient had not ended 30 s after the soak".into());
        None
    } else {
        Some(client.finish().0)
    };
    drop(sim);
    sleep(QUIET);
    let end = Oracle::read(&ours, &pair);
    let usage = maps::usage(pid)?;
    stream.poll(&mut pending, &ours)?;
    let stderr = files.0.join("soak.stderr");
    let out = daemon.out().to_path_buf();
    let finished = daemon.stop()?;
    keep_tail(&out);
    // What the daemon said (e.g. a record its stall detector could not read), each line once.
    let mut daemon_stderr: Vec<String> = Vec::new();
    for l in std::fs::read_to_string(&stderr).unwrap_or_default().lines() {
        if daemon_stderr.len() < 20 && !daemon_stderr.iter().any(|s| s == l) {
            daemon_stderr.push(l.to_string());
        }
    }
    stream.poll(&mut pending, &ours)?;
    let mut total = Tally::default();
    for r in &rows {
        total.add(&r.stream);
    }
    total.add(&pending);
    let run = figures::Run {
        daemon: format!("stalltrace {} --out FILE", DAEMON_ARGS.join(" ")),
        families,
        fio_dev,
        sql_dev: sql_disk.disk.name.clone(),
        max_request_bytes: ours
            .devs
            .iter()
            .map(|d| (d.clone(), max_request_bytes(d)))
            .collect(),
        maps,
        rows,
        total,
        kernel: end.since(&base),
        stop_records: finished.stop.records,
        stop_lost: finished.stop.lost,
        lifetime_cpu_s: finished.lifetime_cpu_s,
        peak_rss_mib: usage.hwm_kib as f64 / 1024.0,
        fio_ios,
        nft_dropped,
        iperf_restarts,
        long_client,
        churn,
        clients,
        daemon_stderr,
        warnings,
    };
    Ok(Results::new(host, opts.minutes, source, run))
}

/// How much of the end of the stream is kept: the books close in its last
/// seconds, and the whole of an hour's stream (~500 MB) goes with the scratch
/// directory.
const TAIL_BYTES: u64 = 16 << 20;

/// Keep the stream's last [`TAIL_BYTES`] (from a line boundary) as
/// target/bench/soak-tail.jsonl, to look into books that did not close.
fn keep_tail(stream: &std::path::Path) {
    use std::io::{Read, Seek, SeekFrom};
    let keep = || -> std::io::Result<()> {
        let mut f = std::fs::File::open(stream)?;
        let len = f.metadata()?.len();
        f.seek(SeekFrom::Start(len.saturating_sub(TAIL_BYTES)))?;
        let mut buf = Vec::new();
        f.read_to_end(&mut buf)?;
        let from = if len > TAIL_BYTES {
            buf.iter()
                .position(|&b| b == b'\n')
                .map_or(buf.len(), |i| i + 1)
        } else {
            0
        };
        let dir = util::workspace_root().join("target/bench");
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("soak-tail.jsonl"), &buf[from..])
    };
    if let Err(e) = keep() {
        eprintln!("soak: cannot keep the stream's tail: {e}");
    }
}

/// The lab's namespaces (`stlab-PID-...`) and mounts (`stalltrace-mnt-PID-...`,
/// the bench's `stalltrace-bench-PID`) this process made that are still there.
fn our_namespaces_and_mounts() -> Vec<String> {
    let pid = std::process::id();
    let prefix = format!("stlab-{pid}-");
    let mut left: Vec<String> = std::fs::read_dir("/run/netns")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n.starts_with(&prefix))
        .map(|n| format!("namespace {n} still exists"))
        .collect();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    left.extend(
        mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(1))
            .filter(|m| {
                m.contains(&format!("stalltrace-mnt-{pid}-"))
                    || m.contains(&format!("stalltrace-bench-{pid}"))
            })
            .map(|m| format!("{m} still mounted")),
    );
    left
}
