//! `bench net`: what stalltrace's network-path hooks (tcp, netdev) cost network workloads.
//!
//! Two namespaces of the bench's own joined by a veth pair (see `netpair`),
//! and three workloads from the client namespace to servers in the other:
//! sockperf ping-pong at a fixed message rate (round-trip p50 and p99),
//! iperf3 unpaced (throughput, CPU-bound on veth), and iperf3 paced with 2%
//! of its packets dropped at the receiver (the loss case, where retransmits
//! fire the tracer's rare-event path). Each workload runs every round in three
//! configurations, in turn so drift on the host hits them alike: untraced;
//! traced as deployed (no `--bpf-stats`: the ratios and targets use it, and the
//! daemon's CPU and RSS come from it); traced with `--bpf-stats` (each
//! program's cost per event, from the kernel's accounting, which these runs
//! pay for, so they judge nothing).

mod render;
mod results;
mod workload;

use std::fs;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::hostcpu::HostCpu;
use super::netpair::{self, NetPair, Side};
use super::peers::{self, Bpftrace, PeerProgram, StatsOn};
use super::publish::{self, Host};
use super::settings::Settings;
use super::tracer::{self, StopRecord, Tracer};
use super::{interrupt, quiet};
use workload::{Run, Servers, WORKLOADS, Workload};

/// The acceptance target: round-trip p50 and throughput within 2% of no tracer.
pub const RATIO_TARGET: f64 = 0.02;

/// 5 rounds x 3 workloads x 3 configurations (untraced, traced, the bpftrace
/// peer) x 3 s, the two bpf_stats configurations in the first
/// [`BPF_STATS_ROUNDS`] rounds only, plus a second or so per daemon or
/// bpftrace to load, attach and detach: about 5 minutes (overridable, see [`Settings`]).
const ROUNDS: u64 = 5;
const RUNTIME_S: u64 = 3;
pub const BPF_STATS_ROUNDS: usize = 2;

/// The bpftrace peer, one run: the workload's figures and its programs'
/// accounting (zero unless bpf_stats were on).
pub struct PeerRun {
    pub run: Run,
    pub programs: Vec<PeerProgram>,
}

/// Load generators of other people that would compete for the 2 CPUs.
const LOAD_GENERATORS: &[&str] = &["fio", "iperf3", "sockperf"];

/// Whether a probe family's programs sit on the network path: every family
/// but block (tcp and netdev, and any family added later that hooks the
/// network path; the daemon attaches block too, for the VM's own disk I/O).
pub fn on_net_path(family: &str) -> bool {
    family != "block"
}

/// One traced run and what the daemon reported and used during it.
pub struct TracedRun {
    pub run: Run,
    pub stop: StopRecord,
    /// Daemon CPU (user + sys) while the client ran, and that window's length.
    pub cpu_in_window_s: f64,
    pub window_s: f64,
    pub lifetime_cpu_s: f64,
    pub peak_rss_kib: u64,
    /// Packets the client's veth sent while the daemon ran, as its netdev
    /// programs saw them (`qdisc_us.count + qdisc_untimed`) and as the kernel
    /// counted them (`tx_packets`, from netlink), summed over its `netdev`
    /// records for that interface: the hooks against the kernel's own counter.
    pub tx_seen: u64,
    pub tx_counted: u64,
}

pub struct WorkloadRuns {
    pub workload: &'static Workload,
    pub untraced: Vec<Run>,
    pub traced: Vec<TracedRun>,
    pub traced_bpf_stats: Vec<TracedRun>,
    pub peer: Vec<PeerRun>,
    pub peer_bpf_stats: Vec<PeerRun>,
}

pub struct Measured {
    pub workloads: Vec<WorkloadRuns>,
    /// Network-path hooks as the daemon reported them attached, one string per
    /// family: "tcp: tcp_probe (tp_btf), ...".
    pub hooks: Vec<String>,
    pub congestion_control: String,
    /// Anything that may have disturbed the figures.
    pub warnings: Vec<String>,
    /// The usual peers that cannot run here, and why.
    pub unavailable: Vec<peers::Unavailable>,
}

pub fn run() -> anyhow::Result<()> {
    let settings = Settings::from_env(ROUNDS, RUNTIME_S)?;
    let began = Instant::now();
    let host = Host::this();
    let bin = super::stalltrace_bin();
    let mut warnings = Vec::new();
    let mut quiet_host = Quiet::new();
    if let Some(why) = quiet_host.wait(QUIET_BEFORE_SUITE)? {
        let w = format!("the host never went quiet before the suite began: {why}");
        eprintln!("bench: warning: {w}");
        warnings.push(w);
    }
    let load_before = publish::load_average();

    let scratch = Scratch::create()?;
    let pair = NetPair::create()?;
    let names = pair.names();
    let measured = measure(
        &settings,
        &bin,
        &pair,
        scratch.path(),
        &mut quiet_host,
        warnings,
    );
    // Tear down before judging the figures, and check that it happened.
    drop(pair);
    let scratch_dir = scratch.path().to_path_buf();
    drop(scratch);
    let leaks = leaks(&names, &scratch_dir);
    if !leaks.is_empty() && measured.is_err() {
        eprintln!("bench: cleanup incomplete: {}", leaks.join("; "));
    }
    let measured = measured?;
    if !leaks.is_empty() {
        bail!("cleanup incomplete: {}", leaks.join("; "));
    }
    eprintln!(
        "bench: cleaned up: namespaces {} and {} deleted (veth and nft table with them), \
         no server or stalltrace left",
        names[0], names[1]
    );

    let results = results::aggregate(
        &settings,
        &measured,
        host,
        began.elapsed().as_secs_f64(),
        [load_before, publish::load_average()],
    );
    let body = render::markdown(&results);
    println!("\n{body}");
    publish::publish("net", &body, serde_json::to_value(&results)?)
}

/// Why the host is not quiet right now, if it is not.
fn disturbance(ours: &[u64]) -> Option<String> {
    quiet::net_disturbance(ours).or_else(|| quiet::foreign_processes(LOAD_GENERATORS))
}

/// Waiting for a quiet host, within a budget: up to [`QUIET_BEFORE_SUITE`]
/// before the suite, then up to [`QUIET_PER_RUN`] before each run but no more
/// than [`QUIET_BUDGET`] over all runs, so a neighbour's long build cannot
/// stretch the suite without end (each run is also checked after, and run
/// again when someone else's hooks or load generators were there).
struct Quiet {
    spent: Duration,
}

const QUIET_BEFORE_SUITE: Duration = Duration::from_secs(10);
const QUIET_PER_RUN: Duration = Duration::from_secs(10);
const QUIET_BUDGET: Duration = Duration::from_secs(20);
/// More user-space CPU than this from other processes, in % of one CPU, is a busy host.
const BUSY_USER_CPU_PCT: f64 = 25.0;
/// How long the host's CPU is watched before each run.
const CPU_SAMPLE: Duration = Duration::from_millis(200);

impl Quiet {
    fn new() -> Self {
        Quiet {
            spent: Duration::ZERO,
        }
    }

    /// Wait until the host is quiet: nobody else's network hooks or load
    /// generators, and little user-space CPU (sampled for [`CPU_SAMPLE`]
    /// while nothing of ours runs). None when it is; else why not, once the
    /// time allowed has passed: then the caller measures anyway.
    fn wait(&mut self, limit: Duration) -> anyhow::Result<Option<String>> {
        let began = Instant::now();
        let mut said = began;
        loop {
            interrupt::check()?;
            let cpu = HostCpu::now();
            std::thread::sleep(CPU_SAMPLE);
            let busy = 100.0 * HostCpu::now().since(&cpu).user_s / CPU_SAMPLE.as_secs_f64();
            let why = disturbance(&[]).or_else(|| {
                (busy > BUSY_USER_CPU_PCT)
                    .then(|| format!("other processes used {busy:.0}% of a CPU in user space"))
            });
            let waited = began.elapsed();
            let Some(why) = why else {
                return Ok(None);
            };
            if waited > limit {
                return Ok(Some(why));
            }
            if said.elapsed() >= Duration::from_secs(15) {
                eprintln!("bench: waiting for a quiet host: {why}");
                said = Instant::now();
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Before a run: what is left of the budget, at most [`QUIET_PER_RUN`].
    fn before_run(&mut self) -> anyhow::Result<Option<String>> {
        let began = Instant::now();
        let limit = QUIET_PER_RUN.min(QUIET_BUDGET.saturating_sub(self.spent));
        let why = self.wait(limit)?;
        // The first sample always takes CPU_SAMPLE; only the waiting beyond it counts.
        self.spent += began.elapsed().saturating_sub(CPU_SAMPLE);
        Ok(why)
    }
}

fn measure(
    settings: &Settings,
    bin: &Path,
    pair: &NetPair,
    scratch: &Path,
    quiet_host: &mut Quiet,
    warnings: Vec<String>,
) -> anyhow::Result<Measured> {
    let client_netns = pair.netns(Side::Client).to_string();
    let mut m = Measured {
        workloads: WORKLOADS
            .iter()
            .map(|workload| WorkloadRuns {
                workload,
                untraced: Vec::new(),
                traced: Vec::new(),
                traced_bpf_stats: Vec::new(),
                peer: Vec::new(),
                peer_bpf_stats: Vec::new(),
            })
            .collect(),
        hooks: Vec::new(),
        congestion_control: pair
            .exec(
                Side::Client,
                &["sysctl", "-n", "net.ipv4.tcp_congestion_control"],
            )?
            .trim()
            .to_string(),
        warnings,
        unavailable: Vec::new(),
    };
    eprintln!("bench: trying the usual peers (BCC, the bpftrace package's tools)");
    m.unavailable = peers::unavailable(&["tcpretrans", "tcprtt"]);
    for u in &m.unavailable {
        eprintln!("bench: peer {}: {}", u.tool, u.verdict);
    }
    pair.drop_random(
        Side::Server,
        workload::LOSS_PERCENT,
        workload::IPERF3_LOSS_PORT,
    )?;
    let server_addr = pair.addr(Side::Server).to_string();
    let port = |p: u16| p.to_string();
    let pinned = |args: &[&str]| workload::pinned(args);
    let mut servers = Servers {
        pair,
        sockperf: pair.server(
            Side::Server,
            workload::SOCKPERF_PORT,
            &pinned(&[
                "sockperf",
                "server",
                "--tcp",
                "-i",
                &server_addr,
                "-p",
                &port(workload::SOCKPERF_PORT),
            ]),
            &scratch.join("sockperf-server.log"),
        )?,
        iperf3: pair.server(
            Side::Server,
            workload::IPERF3_PORT,
            &pinned(&["iperf3", "-s", "-p", &port(workload::IPERF3_PORT)]),
            &scratch.join("iperf3-server.log"),
        )?,
        iperf3_loss: pair.server(
            Side::Server,
            workload::IPERF3_LOSS_PORT,
            &pinned(&["iperf3", "-s", "-p", &port(workload::IPERF3_LOSS_PORT)]),
            &scratch.join("iperf3-loss-server.log"),
        )?,
    };
    eprintln!(
        "bench: {} <-> {} over veth {}/{} ({}), congestion control {}, clients and servers \
         on CPU {}, {} rounds x {} s per run",
        pair.netns(Side::Client),
        pair.netns(Side::Server),
        pair.veth(Side::Client),
        pair.veth(Side::Server),
        server_addr,
        m.congestion_control,
        workload::CPU,
        settings.rounds,
        settings.runtime_s
    );
    // Fault in the binaries, sockets and the first connection's state once,
    // so round 1's untraced runs do not pay for them alone.
    for w in &WORKLOADS {
        workload::run(&mut servers, w, 2, None)?;
    }
    let stats_sysctl = tracer::bpf_stats_sysctl();
    if stats_sysctl {
        let w = "sysctl kernel.bpf_stats_enabled was 1, so the traced runs without \
                 --bpf-stats paid the bpf_stats cost too"
            .to_string();
        eprintln!("bench: warning: {w}");
        m.warnings.push(w);
    }
    let filters = ["--netns", client_netns.as_str()];
    let mut restarted = Vec::new();
    let rounds = settings.rounds;
    for round in 1..=rounds {
        for runs in &mut m.workloads {
            let w = runs.workload;
            let label = format!("round {round}/{rounds} {} untraced", w.key);
            let run = quiet::retry_failures(&label, &mut m.warnings, || {
                prepare(&mut servers, scratch, &mut restarted)?;
                if let Some(why) = quiet_host.before_run()? {
                    eprintln!("bench: {label}: measuring anyway: {why}");
                }
                let before = disturbance(&[]);
                let run = workload::run(&mut servers, w, settings.runtime_s, None)?;
                Ok((run, before.or_else(|| disturbance(&[]))))
            })?;
            progress(&label, w, &run);
            runs.untraced.push(run);

            for bpf_stats in [false, true] {
                if bpf_stats && round > BPF_STATS_ROUNDS {
                    continue;
                }
                let config = if bpf_stats {
                    "traced+bpf-stats"
                } else {
                    "traced"
                };
                let label = format!("round {round}/{rounds} {} {config}", w.key);
                let tag = format!("r{round}-{}-{config}", w.key);
                let (run, hooks) = quiet::retry_failures(&label, &mut m.warnings, || {
                    prepare(&mut servers, scratch, &mut restarted)?;
                    if let Some(why) = quiet_host.before_run()? {
                        eprintln!("bench: {label}: measuring anyway: {why}");
                    }
                    let tracer = Tracer::start(bin, scratch, &tag, bpf_stats, &filters)?;
                    let (run, disturbed) = traced(
                        tracer,
                        &mut servers,
                        w,
                        settings.runtime_s,
                        bpf_stats,
                        stats_sysctl,
                    )?;
                    Ok((run, disturbed))
                })?;
                progress(&label, w, &run.run);
                eprintln!(
                    "bench: {:<42} hooks saw {} of {} transmits on the client veth",
                    "", run.tx_seen, run.tx_counted
                );
                if bpf_stats {
                    let (runs, ns) = run
                        .stop
                        .programs
                        .iter()
                        .filter(|p| on_net_path(&p.family))
                        .fold((0, 0), |(r, t), p| (r + p.run_count, t + p.run_time_ns));
                    eprintln!(
                        "bench: {:<42} {runs} program runs ({:.0}/s), {:.0} ns per run",
                        "",
                        runs as f64 / run.run.seconds,
                        ns as f64 / runs.max(1) as f64
                    );
                }
                if m.hooks.is_empty() {
                    m.hooks = hooks;
                }
                if bpf_stats {
                    runs.traced_bpf_stats.push(run);
                } else {
                    runs.traced.push(run);
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
                let label = format!("round {round}/{rounds} {} {config}", w.key);
                let tag = format!("r{round}-{}-{config}", w.key);
                let run = quiet::retry_failures(&label, &mut m.warnings, || {
                    prepare(&mut servers, scratch, &mut restarted)?;
                    if let Some(why) = quiet_host.before_run()? {
                        eprintln!("bench: {label}: measuring anyway: {why}");
                    }
                    let before = disturbance(&[]);
                    let peer = Bpftrace::start(&peers::TCP_RETRANSMIT, scratch, &tag)?;
                    let stats = bpf_stats.then(StatsOn::enable).transpose()?;
                    let run = workload::run(&mut servers, w, settings.runtime_s, None)?;
                    let programs = peer.costs();
                    drop(stats);
                    peer.stop()?;
                    Ok((
                        PeerRun { run, programs },
                        before.or_else(|| disturbance(&[])),
                    ))
                })?;
                progress(&label, w, &run.run);
                if bpf_stats {
                    runs.peer_bpf_stats.push(run);
                } else {
                    runs.peer.push(run);
                }
            }
        }
    }
    m.warnings.extend(restarted);
    Ok(m)
}

/// Before each attempt: the servers up and the scratch directory there
/// (someone else's cleanup of a shared host may remove either).
fn prepare(
    servers: &mut Servers,
    scratch: &Path,
    restarted: &mut Vec<String>,
) -> anyhow::Result<()> {
    fs::create_dir_all(scratch).with_context(|| format!("cannot create {}", scratch.display()))?;
    for what in servers.restart_dead()? {
        let w = format!("restarted a server: {what}");
        eprintln!("bench: {w}");
        restarted.push(w);
    }
    Ok(())
}

/// One traced run of `w` under the daemon `tracer` (stopped here), the tcp
/// and netdev hooks it attached, and whether the run was disturbed: anyone
/// else's network hooks or load generators (before or after the client), or,
/// for a run without `--bpf-stats`, the kernel accounting program runs all
/// the same because another process held bpf_stats on (not counted when
/// `stats_sysctl` says they were on for good).
#[allow(clippy::type_complexity)]
fn traced(
    tracer: Tracer,
    servers: &mut Servers,
    w: &Workload,
    runtime_s: u64,
    bpf_stats: bool,
    stats_sysctl: bool,
) -> anyhow::Result<((TracedRun, Vec<String>), Option<String>)> {
    let hooks = tracer
        .families()
        .into_iter()
        .filter(|f| on_net_path(f))
        .map(|f| format!("{f}: {}", tracer.hooks_of(&f).join(", ")))
        .collect();
    let ours = tracer.prog_ids();
    let disturbed = disturbance(&ours);
    let before = tracer.usage()?;
    let window = Instant::now();
    let run = workload::run(servers, w, runtime_s, Some(&tracer))?;
    let after = tracer.usage()?;
    let window_s = window.elapsed().as_secs_f64();
    let disturbed = disturbed.or_else(|| disturbance(&ours));
    let out = tracer.out().to_path_buf();
    let finished = tracer.stop()?;
    let (tx_seen, tx_counted) = transmits(&out, servers.pair.veth(Side::Client))?;
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
        run,
        stop: finished.stop,
        cpu_in_window_s: after.cpu_s - before.cpu_s,
        window_s,
        lifetime_cpu_s: finished.lifetime_cpu_s,
        peak_rss_kib: after.peak_rss_kib,
        tx_seen,
        tx_counted,
    };
    Ok(((run, hooks), disturbed))
}

/// Transmits on `iface` as the daemon's hooks saw them and as the kernel
/// counted them, summed over the `netdev` records in `out`.
fn transmits(out: &Path, iface: &str) -> anyhow::Result<(u64, u64)> {
    let text = fs::read_to_string(out).with_context(|| format!("cannot read {}", out.display()))?;
    Ok(netdev_transmits(&text, iface))
}

fn netdev_transmits(text: &str, iface: &str) -> (u64, u64) {
    let (mut seen, mut counted) = (0, 0);
    for line in text.lines() {
        let Ok(r) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if r["type"] != "netdev" || r["iface"] != iface {
            continue;
        }
        let n = |v: &serde_json::Value| v.as_u64().unwrap_or(0);
        seen += n(&r["qdisc_us"]["count"]) + n(&r["qdisc_untimed"]);
        counted += n(&r["tx_packets"]);
    }
    (seen, counted)
}

/// One line per run, figures lined up across configurations.
fn progress(label: &str, w: &Workload, run: &Run) {
    let head = format!("{label}:");
    let figures: Vec<String> = w
        .figures
        .iter()
        .map(|f| format!("{} {:.*}", f.header, f.digits, run.figure(f.key)))
        .collect();
    eprintln!(
        "bench: {head:<42} {} (steal {:.1}%)",
        figures.join(", "),
        run.steal_pct
    );
}

/// What the bench may have left behind; empty when clean.
fn leaks(netns: &[String], scratch: &Path) -> Vec<String> {
    let mut out: Vec<String> = netns
        .iter()
        .filter(|n| netpair::netns_exists(n))
        .map(|n| format!("namespace {n} still exists"))
        .collect();
    if scratch.exists() {
        out.push(format!("{} still exists", scratch.display()));
    }
    out.extend(quiet::our_processes(LOAD_GENERATORS));
    out.extend(tracer::our_daemons_left());
    out.extend(peers::ours_left());
    out
}

/// A private directory for the daemons' output and the servers' logs, on
/// tmpfs when there is one (so the daemon's writes cause no disk I/O during
/// a run); removed on drop.
struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    fn create() -> anyhow::Result<Self> {
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        let dir = PathBuf::from(format!(
            "{base}/stalltrace-bench-net-{}",
            std::process::id()
        ));
        // create_dir (not _all) fails if it exists: never adopt someone else's directory.
        fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Scratch { dir })
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("bench: cannot remove {}: {e}", self.dir.display());
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn transmits_of_one_interface_are_summed() {
        let text = r#"{"type":"start"}
{"type":"netdev","iface":"stb1c","tx_packets":10,"qdisc_us":{"count":7},"qdisc_untimed":3}
{"type":"netdev","iface":"eth0","tx_packets":99,"qdisc_us":{"count":1},"qdisc_untimed":0}
{"type":"netdev","iface":"stb1c","tx_packets":5,"qdisc_us":{"count":4},"qdisc_untimed":0}
{"type":"stop"}"#;
        assert_eq!(super::netdev_transmits(text, "stb1c"), (14, 15));
    }
}
