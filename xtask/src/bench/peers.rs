//! Peers: other tools doing the same job as stalltrace on the same workloads,
//! so its overhead can be read against theirs.
//!
//! The peers that can run here are bpftrace scripts of our own on tracepoints
//! (in `peers/*.bt`, included in the binary): a block issue→complete latency
//! histogram, and every TCP retransmission printed. The usual peers (BCC's
//! biolatency, biosnoop, tcpretrans, tcprtt, and the bpftrace package's own
//! biolatency.bt, biosnoop.bt, tcpretrans.bt) hook kprobes, and BCC also needs
//! kernel headers; whether they run is found out at run time ([`unavailable`]),
//! not assumed, and published with the reason.
//!
//! A peer is measured like stalltrace: its run time per event from the
//! kernel's bpf_stats (turned on by this process with `BPF_ENABLE_STATS` only
//! for the runs that measure it, [`StatsOn`]), its programs told from anyone
//! else's by the pid that holds them (`bpftool perf list`).

use std::fs::{self, File};
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use super::interrupt;
use super::publish::Verdict;
use super::stats::Summary;
use crate::util;

/// One bpftrace script of ours.
pub struct Script {
    /// Its name in the tables and in benchmarks.json.
    pub name: &'static str,
    /// What it does, in words.
    pub job: &'static str,
    /// What of stalltrace's it is compared with.
    pub versus: &'static str,
    pub text: &'static str,
}

pub const BLOCK_LATENCY: Script = Script {
    name: "bpftrace block_latency.bt",
    job: "block issue→complete latency histogram (tracepoints block:block_rq_issue and \
          block:block_rq_complete, a hash map keyed by device and sector)",
    versus: "stalltrace's block family (which also times tag wait and queue, counts \
             requests in flight, and sends slow_io events)",
    text: include_str!("peers/block_latency.bt"),
};

pub const TCP_RETRANSMIT: Script = Script {
    name: "bpftrace tcp_retransmit.bt",
    job: "every TCP retransmission printed with its 4-tuple and state (tracepoint \
          tcp:tcp_retransmit_skb)",
    versus: "stalltrace's network-path families (whose tcp_retransmit records are this \
             job; they also keep per-peer RTT histograms and time every packet's \
             transmit path)",
    text: include_str!("peers/tcp_retransmit.bt"),
};

const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running bpftrace, held as a guard: `Drop` stops it (SIGINT, then
/// SIGKILL), and it dies with this process (PR_SET_PDEATHSIG).
pub struct Bpftrace {
    pid: libc::pid_t,
    reaped: bool,
    out: PathBuf,
    /// Its programs, as `bpftool perf list` shows them attached: (id, tracepoint).
    pub programs: Vec<(u64, String)>,
}

/// The kernel's accounting of one of a peer's programs.
#[derive(Serialize, Clone, Debug, Default)]
pub struct PeerProgram {
    pub tracepoint: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

impl Bpftrace {
    /// Start `script` (written to `dir`), its output to `dir/tag.out`; return
    /// once its BEGIN probe has run, i.e. once every probe is attached.
    pub fn start(script: &Script, dir: &Path, tag: &str) -> anyhow::Result<Self> {
        let bt = dir.join(format!("{tag}.bt"));
        fs::write(&bt, script.text)?;
        let out = dir.join(format!("{tag}.out"));
        let mut cmd = Command::new("bpftrace");
        cmd.args(["-B", "line"])
            .arg(&bt)
            .stdin(Stdio::null())
            .stdout(File::create(&out)?)
            .stderr(File::create(dir.join(format!("{tag}.err")))?);
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(|| match libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGINT) {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            });
        }
        let child = cmd.spawn().context("cannot start bpftrace")?;
        let mut peer = Bpftrace {
            pid: child.id() as libc::pid_t,
            reaped: false,
            out,
            programs: Vec::new(),
        };
        let began = Instant::now();
        loop {
            interrupt::check()?;
            let text = fs::read_to_string(&peer.out).unwrap_or_default();
            if text.lines().any(|l| l.trim() == "ready") {
                break;
            }
            if peer.try_reap().is_some() {
                let err = fs::read_to_string(dir.join(format!("{tag}.err"))).unwrap_or_default();
                bail!("bpftrace exited before it attached: {}", err.trim());
            }
            if began.elapsed() > START_TIMEOUT {
                bail!("bpftrace did not attach within {START_TIMEOUT:?}");
            }
            sleep(Duration::from_millis(20));
        }
        peer.programs = perf_programs(peer.pid as u32);
        if peer.programs.is_empty() {
            bail!(
                "bpftrace (pid {}) runs but bpftool lists no program of its",
                peer.pid
            );
        }
        Ok(peer)
    }

    /// Run counts and times of its programs so far (all zero unless bpf_stats are on).
    pub fn costs(&self) -> Vec<PeerProgram> {
        self.programs
            .iter()
            .map(|(id, tp)| {
                let v: serde_json::Value = util::output(
                    "bpftool",
                    &["prog", "show", "id", &id.to_string(), "--json"],
                )
                .and_then(|t| serde_json::from_str(&t).ok())
                .unwrap_or_default();
                PeerProgram {
                    tracepoint: tp.clone(),
                    run_count: v["run_cnt"].as_u64().unwrap_or(0),
                    run_time_ns: v["run_time_ns"].as_u64().unwrap_or(0),
                }
            })
            .collect()
    }

    /// SIGINT, wait for it to print its maps and exit; its output.
    pub fn stop(mut self) -> anyhow::Result<String> {
        // SAFETY: kill has no memory-safety preconditions; pid is our unreaped child.
        unsafe { libc::kill(self.pid, libc::SIGINT) };
        if !self.wait(Duration::from_secs(20)) {
            bail!("bpftrace did not exit within 20 s of SIGINT; killed it");
        }
        Ok(fs::read_to_string(&self.out).unwrap_or_default())
    }

    fn try_reap(&mut self) -> Option<libc::c_int> {
        let mut status = 0;
        // SAFETY: status outlives the call.
        let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        if rc == 0 {
            return None;
        }
        self.reaped = true;
        Some(status)
    }

    /// Wait up to `limit`; after that SIGKILL and reap it. Whether it exited by itself.
    fn wait(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.try_reap().is_some() {
                return true;
            }
            sleep(Duration::from_millis(20));
        }
        // SAFETY: as in stop(); a blocking waitpid after SIGKILL returns promptly.
        unsafe {
            libc::kill(self.pid, libc::SIGKILL);
            libc::waitpid(self.pid, std::ptr::null_mut(), 0);
        }
        self.reaped = true;
        false
    }
}

impl Drop for Bpftrace {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        eprintln!("bench: stopping bpftrace (pid {})", self.pid);
        // SAFETY: as in stop().
        unsafe { libc::kill(self.pid, libc::SIGINT) };
        self.wait(Duration::from_secs(10));
    }
}

/// The programs `pid` holds attached to tracepoints: (prog id, tracepoint).
fn perf_programs(pid: u32) -> Vec<(u64, String)> {
    let Some(text) = util::output("bpftool", &["perf", "list", "--json"]) else {
        return Vec::new();
    };
    let all: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    all.iter()
        .filter(|p| p["pid"].as_u64() == Some(pid as u64))
        .filter_map(|p| {
            Some((
                p["prog_id"].as_u64()?,
                p["tracepoint"].as_str().unwrap_or("?").to_string(),
            ))
        })
        .collect()
}

/// bpftrace processes this process started that are still running.
pub fn ours_left() -> Vec<String> {
    super::quiet::our_processes(&["bpftrace"])
}

/// The kernel's per-program accounting, on while this is held (`BPF_ENABLE_STATS`;
/// the kernel turns it off when the last such descriptor closes, so it also ends
/// with this process).
pub struct StatsOn {
    _fd: OwnedFd,
}

impl StatsOn {
    pub fn enable() -> anyhow::Result<Self> {
        const BPF_ENABLE_STATS: libc::c_long = 32;
        // union bpf_attr for BPF_ENABLE_STATS: { __u32 type }, BPF_STATS_RUN_TIME = 0.
        let attr = [0u32; 2];
        // SAFETY: attr is a valid, zeroed bpf_attr prefix of the size given.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_ENABLE_STATS,
                attr.as_ptr(),
                std::mem::size_of_val(&attr) as libc::c_uint,
            )
        };
        if fd < 0 {
            return Err(io::Error::last_os_error()).context("BPF_ENABLE_STATS failed");
        }
        // SAFETY: the kernel just returned this descriptor to us and nothing else owns it.
        Ok(StatsOn {
            _fd: unsafe { OwnedFd::from_raw_fd(fd as i32) },
        })
    }
}

/// A peer that could not run here, and why, as found at run time.
#[derive(Serialize, Clone, Debug)]
pub struct Unavailable {
    pub tool: String,
    /// Where it was looked for or what was run.
    pub tried: String,
    pub verdict: String,
}

/// Try the usual peers of `tools` (BCC's `<tool>-bpfcc` or `<tool>`, and
/// the bpftrace package's `<tool>.bt`): what happened to each.
pub fn unavailable(tools: &[&str]) -> Vec<Unavailable> {
    let mut out = Vec::new();
    let host = host_facts();
    for tool in tools {
        // BCC: the Debian name, the upstream name, the upstream install dir.
        let candidates = [
            format!("{tool}-bpfcc"),
            format!("/usr/sbin/{tool}-bpfcc"),
            format!("/usr/share/bcc/tools/{tool}"),
        ];
        let found = candidates.iter().find(|c| {
            if c.starts_with('/') {
                Path::new(c).is_file()
            } else {
                which(c).is_some()
            }
        });
        out.push(match found {
            None => Unavailable {
                tool: format!("BCC {tool}"),
                tried: candidates.join(", "),
                verdict: format!("not installed; could not run here anyway: {host}"),
            },
            Some(path) => {
                let path = which(path).unwrap_or_else(|| PathBuf::from(path));
                let tried = format!("timeout {TRY_S} {}", path.display());
                Unavailable {
                    tool: format!("BCC {tool}"),
                    verdict: try_run(&path, &[], &tried),
                    tried,
                }
            }
        });
        let bt = PathBuf::from(format!("/usr/sbin/{tool}.bt"));
        if bt.is_file() {
            let tried = format!("timeout {TRY_S} bpftrace {}", bt.display());
            out.push(Unavailable {
                tool: format!("bpftrace {tool}.bt"),
                verdict: try_run(Path::new("bpftrace"), &[bt.to_str().unwrap_or("")], &tried),
                tried,
            });
        }
    }
    out
}

/// What this host lacks that kprobe-based and header-compiling tools need.
fn host_facts() -> String {
    let release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut lacks = Vec::new();
    let kprobes = [
        "/sys/kernel/tracing/kprobe_events",
        "/sys/kernel/debug/tracing/kprobe_events",
    ];
    if !kprobes.iter().any(|p| Path::new(p).exists()) {
        lacks.push("no kprobes (no kprobe_events in tracefs)".to_string());
    }
    let headers = format!("/lib/modules/{}/build", release.trim());
    if !Path::new(&headers).exists() && !Path::new("/sys/kernel/kheaders.tar.xz").exists() {
        lacks.push(format!(
            "no kernel headers ({headers} and /sys/kernel/kheaders.tar.xz absent)"
        ));
    }
    if util::output("python3", &["-c", "import bcc"]).is_none() {
        lacks.push("no python3 bcc module".into());
    }
    if lacks.is_empty() {
        "this host has kprobes and headers".into()
    } else {
        lacks.join("; ")
    }
}

fn which(name: &str) -> Option<PathBuf> {
    if name.starts_with('/') {
        return Path::new(name).is_file().then(|| PathBuf::from(name));
    }
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/usr/sbin", "/sbin"])
        .map(|d| Path::new(d).join(name))
        .find(|p| p.is_file())
}

/// How long a usual peer is given to attach (bpftrace's tools attach within a second).
const TRY_S: u64 = 4;

/// Run a peer for at most [`TRY_S`] s; what it said, in one line.
fn try_run(program: &Path, args: &[&str], tried: &str) -> String {
    let out = Command::new("timeout")
        .args(["-s", "INT", &TRY_S.to_string()])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(o) => o,
        Err(e) => return format!("could not start: {e}"),
    };
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    summarize(&text, out.status, tried)
}

/// What a peer's output says about why it cannot trace here, in one line.
fn summarize(text: &str, status: std::process::ExitStatus, tried: &str) -> String {
    // Probes it could not attach: bpftrace says "could not attach probe
    // kprobe:X, skipping" (and runs on, tracing nothing) or "Error attaching
    // probe: 'kprobe:X'" (and exits).
    let mut probes: Vec<String> = text
        .lines()
        .filter_map(|l| {
            let rest = l
                .split_once("could not attach probe ")
                .map(|(_, r)| r)
                .or_else(|| l.split_once("Error attaching probe: ").map(|(_, r)| r))?;
            Some(
                rest.trim()
                    .trim_end_matches(", skipping.")
                    .trim_matches('\'')
                    .to_string(),
            )
        })
        .collect();
    probes.sort();
    probes.dedup();
    let no_kprobe_events = text.contains("kprobe_events): No such file");
    if !probes.is_empty() {
        return format!(
            "cannot trace on this kernel: {} could not attach{}",
            probes.join(", "),
            if no_kprobe_events {
                " (no kprobe_events in tracefs: this kernel has no kprobes)"
            } else {
                ""
            }
        );
    }
    // Otherwise the error lines, shortest form.
    let why: Vec<String> = text
        .lines()
        .map(str::trim)
        .filter(|l| {
            let l = l.to_lowercase();
            (l.contains("error") || l.contains("kprobe") || l.contains("failed"))
                && !l.contains("rlimit_memlock")
        })
        .map(|l| l.trim_start_matches("ERROR: ").to_string())
        .collect();
    if why.is_empty() {
        format!(
            "ran for {TRY_S} s ({status}) and reported no error: it may work here, but this \
             suite does not measure it ({tried})"
        )
    } else {
        let mut said: Vec<String> = why.into_iter().take(3).collect();
        said.dedup();
        format!("cannot run on this kernel: {}", said.join(" / "))
    }
}

/// A peer's cost from its `--bpf-stats`-style rounds: per program and in all.
#[derive(Serialize, Clone, Debug)]
pub struct PeerCost {
    pub programs: Vec<PeerProgram>,
    pub run_time_ns: u64,
}

/// Sum per tracepoint over runs.
pub fn sum_costs<'a>(runs: impl IntoIterator<Item = &'a Vec<PeerProgram>>) -> PeerCost {
    let mut by: std::collections::BTreeMap<String, PeerProgram> = Default::default();
    for p in runs.into_iter().flatten() {
        let e = by
            .entry(p.tracepoint.clone())
            .or_insert_with(|| PeerProgram {
                tracepoint: p.tracepoint.clone(),
                ..Default::default()
            });
        e.run_count += p.run_count;
        e.run_time_ns += p.run_time_ns;
    }
    let programs: Vec<PeerProgram> = by.into_values().collect();
    PeerCost {
        run_time_ns: programs.iter().map(|p| p.run_time_ns).sum(),
        programs,
    }
}

/// The "≥ 3× less overhead than the cheapest peer doing the same job" target.
pub const PEER_FACTOR_TARGET: f64 = 3.0;

/// Verdict material: stalltrace's and the peer's cost per unit of work, both
/// from bpf_stats (kernel run time of every program per I/O or per round
/// trip), and their overheads from the workload's own figures.
#[derive(Serialize, Clone, Debug)]
pub struct Comparison {
    pub unit: String,
    pub stalltrace_ns_per_unit: f64,
    pub peer_ns_per_unit: f64,
    /// peer / stalltrace: at least [`PEER_FACTOR_TARGET`] to meet the target.
    pub factor: f64,
    /// 1 − traced/untraced (or traced/untraced − 1 for latency), as a fraction.
    pub stalltrace_overhead: Summary,
    pub peer_overhead: Summary,
    /// The hooks both attach to, each tool's ns/event on them summed: the
    /// same job's cost per event, without what stalltrace does besides.
    pub same_hooks: Option<SameHooks>,
}

#[derive(Serialize, Clone, Debug)]
pub struct SameHooks {
    pub tracepoints: Vec<String>,
    pub stalltrace_ns_per_event: f64,
    pub peer_ns_per_event: f64,
}

/// [`SameHooks`] from stalltrace's programs (`on_<tracepoint>`, as
/// (program, run_count, run_time_ns)) and the peer's, on `tracepoints`; None
/// when either never ran on one of them.
pub fn same_hooks(
    tracepoints: &[&str],
    stalltrace: &[(String, u64, u64)],
    peer: &PeerCost,
) -> Option<SameHooks> {
    let mut st = 0.0;
    let mut pe = 0.0;
    for tp in tracepoints {
        let (_, n, ns) = stalltrace
            .iter()
            .find(|(p, _, _)| p.strip_prefix("on_") == Some(tp))?;
        let p = peer.programs.iter().find(|p| p.tracepoint == *tp)?;
        if *n == 0 || p.run_count == 0 {
            return None;
        }
        st += *ns as f64 / *n as f64;
        pe += p.run_time_ns as f64 / p.run_count as f64;
    }
    Some(SameHooks {
        tracepoints: tracepoints.iter().map(|t| t.to_string()).collect(),
        stalltrace_ns_per_event: st,
        peer_ns_per_event: pe,
    })
}

pub fn factor_verdict(c: &Comparison, what: &str) -> Verdict {
    let target = format!(
        "{what}: stalltrace's BPF time per {} <= 1/{PEER_FACTOR_TARGET:.0} of the cheapest \
         peer's doing the same job",
        c.unit
    );
    let met = c.factor >= PEER_FACTOR_TARGET;
    let measured = format!("peer/stalltrace {:.2}x", c.factor);
    let same = c.same_hooks.as_ref().map_or(String::new(), |h| {
        format!(
            "; on the hooks both use ({}), per event: stalltrace {:.0} ns, peer {:.0} ns \
             (peer/stalltrace {:.2}x)",
            h.tracepoints.join(" + "),
            h.stalltrace_ns_per_event,
            h.peer_ns_per_event,
            h.peer_ns_per_event / h.stalltrace_ns_per_event.max(f64::MIN_POSITIVE)
        )
    });
    let detail = format!(
        "{} by {}: stalltrace {:.0} ns per {u}, peer {:.0} ns per {u} (every program of each); \
         workload overhead (median of per-round pairs) stalltrace {:+.1}%, peer {:+.1}%{same}",
        if met { "met" } else { "missed" },
        if met {
            format!("{:.2}x to spare", c.factor / PEER_FACTOR_TARGET)
        } else if c.factor > 0.0 {
            format!(
                "a factor {:.1} (stalltrace needs {:.0} ns per {} or less)",
                PEER_FACTOR_TARGET / c.factor,
                c.peer_ns_per_unit / PEER_FACTOR_TARGET,
                c.unit
            )
        } else {
            "all of it (the peer's programs never ran)".into()
        },
        c.stalltrace_ns_per_unit,
        c.peer_ns_per_unit,
        100.0 * c.stalltrace_overhead.median,
        100.0 * c.peer_overhead.median,
        u = c.unit,
    );
    Verdict {
        target,
        measured,
        met,
        detail,
    }
}

/// The peer as published: what it is, what it cost, and the usual peers that
/// could not run here.
#[derive(Serialize)]
pub struct PeerInfo {
    pub name: &'static str,
    pub job: &'static str,
    pub versus: &'static str,
    pub script: &'static str,
    /// Its programs' kernel run time, summed over its bpf_stats runs.
    pub cost: PeerCost,
    /// Runs of its bpf_stats configuration, and how many rounds had one.
    pub bpf_stats_rounds: usize,
    pub unavailable: Vec<Unavailable>,
}

impl PeerInfo {
    pub fn new(
        script: &Script,
        cost: PeerCost,
        bpf_stats_rounds: usize,
        unavailable: Vec<Unavailable>,
    ) -> Self {
        PeerInfo {
            name: script.name,
            job: script.job,
            versus: script.versus,
            script: script.text,
            cost,
            bpf_stats_rounds,
            unavailable,
        }
    }

    /// The "Peers" subsection of a suite; `per_unit` rows are (workload,
    /// unit, stalltrace ns per unit, peer ns per unit), from bpf_stats.
    pub fn markdown(&self, per_unit: &[(String, String, f64, f64)]) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(
            s,
            "\n### Peers\n\n\
             The peer that runs here is `{}`: {}, compared with {}. It ran in every round as \
             configuration \"bpftrace\" (its workload figures are in the tables above), and \
             with bpf_stats on (turned on by the bench with `BPF_ENABLE_STATS`, as \
             `--bpf-stats` does for stalltrace) in the first {} rounds, which give its cost \
             per event; its programs were told from anyone else's by its pid \
             (`bpftool perf list`). The script (from `xtask/src/bench/peers/`):\n\n```\n{}```\n",
            self.name, self.job, self.versus, self.bpf_stats_rounds, self.script
        );
        let rows: Vec<Vec<String>> = self
            .cost
            .programs
            .iter()
            .map(|p| {
                vec![
                    p.tracepoint.clone(),
                    if p.run_count > 0 {
                        format!("{:.0}", p.run_time_ns as f64 / p.run_count as f64)
                    } else {
                        "–".into()
                    },
                    p.run_count.to_string(),
                ]
            })
            .collect();
        s += &super::table::markdown(&["peer program (tracepoint)", "ns/event", "runs"], &rows);
        let rows: Vec<Vec<String>> = per_unit
            .iter()
            .map(|(w, unit, st, peer)| {
                vec![
                    w.clone(),
                    unit.clone(),
                    format!("{st:.0}"),
                    format!("{peer:.0}"),
                    if *st > 0.0 {
                        format!("{:.2}", peer / st)
                    } else {
                        "–".into()
                    },
                ]
            })
            .collect();
        s += "\nBPF run time per unit of work, every program of each tool summed \
              (bpf_stats rounds):\n\n";
        s += &super::table::markdown(
            &[
                "workload",
                "unit",
                "stalltrace ns/unit",
                "peer ns/unit",
                "peer/stalltrace",
            ],
            &rows,
        );
        s += "\nThe usual peers, tried at run time on this host:\n\n";
        let rows: Vec<Vec<String>> = self
            .unavailable
            .iter()
            .map(|u| vec![u.tool.clone(), format!("`{}`", u.tried), u.verdict.clone()])
            .collect();
        s += &super::table::markdown(&["peer", "tried", "result"], &rows);
        s
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn kprobe_failures_are_named() {
        let text = "/usr/sbin/biolatency.bt:17-19: WARNING: blk_account_io_start is not traceable\n\
                    Attaching 6 probes...\n\
                    create_probe_event: open(/sys/kernel/tracing/kprobe_events): No such file or directory\n\
                    WARNING: could not attach probe kprobe:blk_account_io_done, skipping.\n\
                    WARNING: could not attach probe kprobe:blk_account_io_start, skipping.\n";
        let s = super::summarize(text, std::process::ExitStatus::from_raw(0), "x");
        assert_eq!(
            s,
            "cannot trace on this kernel: kprobe:blk_account_io_done, kprobe:blk_account_io_start \
             could not attach (no kprobe_events in tracefs: this kernel has no kprobes)"
        );
        let text = "ERROR: Error attaching probe: 'kprobe:tcp_retransmit_skb'\n";
        let s = super::summarize(text, std::process::ExitStatus::from_raw(0), "x");
        assert!(
            s.contains("kprobe:tcp_retransmit_skb could not attach"),
            "{s}"
        );
    }
}
