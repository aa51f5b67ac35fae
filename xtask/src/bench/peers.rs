//! Peers: other tools doing the same job as stalltrace on the same workloads,
//! so its overhead can be read against theirs.
//!
//! The peers that can run here are bpftrace scripts of our own on tracepoints
//! (in `peers/*.bt`, included in the binary): a block issue→complete latency
//! histogram, and every TCP retransmission printed. The usual peers (BCC's
//! biolatency, biosnoop, tcpretrans, tcprtt, and the bpftrace package's own
//! biolatency.bt, biosnoop.bt, tcpretrans.bt) hook kprobes, and BCC also needs
//! kernel headers; whether they run is found out at run time ([`unavailable`],
//! in `usual`), not assumed, and published with the reason.
//!
//! A peer is measured like stalltrace: its run time per event from the
//! kernel's bpf_stats (turned on by this process with `BPF_ENABLE_STATS` only
//! for the runs that measure it, [`StatsOn`]), its programs told from anyone
//! else's by the pid that holds them (`bpftool perf list`); its cost against
//! stalltrace's is in `cost`.

use std::collections::BTreeMap;
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
use super::tracer::programs::Counter;
use super::tracer::{self, Usage};
use crate::util;

mod cost;
mod usual;

pub use cost::{Comparison, PeerCost, PeerInfo, RoundCost, factor_verdict, same_hooks, sum_costs};
pub use usual::{Unavailable, unavailable};

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

/// Run `cmd` (a bpftrace, or what starts one) in a mount namespace of its
/// own with tracefs mounted: bpftrace finds tracepoints and kprobes through
/// tracefs, which a fresh host need not have mounted, and the host's mounts
/// stay as they were. If tracefs cannot be mounted, bpftrace says which
/// probe it could not find.
pub fn with_own_tracefs(cmd: &mut Command) {
    // SAFETY: unshare and mount are async-signal-safe system calls and read
    // only the constant strings passed to them.
    unsafe {
        cmd.pre_exec(|| {
            if libc::unshare(libc::CLONE_NEWNS) != 0 {
                return Err(io::Error::last_os_error());
            }
            let none = std::ptr::null();
            libc::mount(
                c"none".as_ptr(),
                c"/".as_ptr(),
                none,
                libc::MS_REC | libc::MS_PRIVATE,
                none.cast(),
            );
            libc::mount(
                c"tracefs".as_ptr(),
                c"/sys/kernel/tracing".as_ptr(),
                c"tracefs".as_ptr(),
                0,
                none.cast(),
            );
            Ok(())
        });
    }
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
        with_own_tracefs(&mut cmd);
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

    /// Its programs' counters over one run (`delta`, by program id, from two
    /// [`tracer::programs::Snapshot`]s of [`Bpftrace::prog_ids`]), by tracepoint; zero unless
    /// bpf_stats were on.
    pub fn costs(&self, delta: &BTreeMap<u64, Counter>) -> Vec<PeerProgram> {
        self.programs
            .iter()
            .map(|(id, tp)| {
                let c = delta.get(id);
                PeerProgram {
                    tracepoint: tp.clone(),
                    run_count: c.map_or(0, |c| c.run_count),
                    run_time_ns: c.map_or(0, |c| c.run_time_ns),
                }
            })
            .collect()
    }

    /// Its process's CPU and peak RSS so far (an error once it has exited).
    pub fn usage(&self) -> anyhow::Result<Usage> {
        tracer::process_usage(self.pid as u32)
            .with_context(|| format!("bpftrace (pid {}) has exited", self.pid))
    }

    /// The ids of its programs: how its BPF links are told from anyone else's.
    pub fn prog_ids(&self) -> Vec<u64> {
        self.programs.iter().map(|(id, _)| *id).collect()
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
