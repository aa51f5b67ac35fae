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
//! The block suite has a second peer as deployed elsewhere, not a script of
//! ours: rezolus's blockio_latency sampler (in `rezolus`), run when it is
//! installed and listed with the usual peers when not.
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
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use serde::Serialize;

use super::interrupt;
use super::tracer::programs::Counter;
use crate::util;

mod child;
mod cost;
pub mod rezolus;
mod usual;

pub use child::PeerChild;
pub use cost::{
    Comparison, PEER_FACTOR_TARGET, PeerCost, PeerInfo, PeerProgramResult, RoundCost, SameHooks,
    factor_verdict, program_results, same_hooks, sum_costs,
};
pub use rezolus::Rezolus;
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

/// A running bpftrace, held as a guard (see [`PeerChild`]).
pub struct Bpftrace {
    child: PeerChild,
    out: PathBuf,
}

impl std::ops::Deref for Bpftrace {
    type Target = PeerChild;

    fn deref(&self) -> &PeerChild {
        &self.child
    }
}

/// The kernel's accounting of one of a peer's programs.
#[derive(Serialize, Clone, Debug, Default)]
pub struct PeerProgram {
    pub tracepoint: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// bpftrace finds tracepoints and kprobes through tracefs: the lab gives it
/// a mount namespace of its own with tracefs mounted.
pub use stalltrace_lab::bpftrace::with_own_tracefs;

/// A peer process started for one block of runs (bpftrace, rezolus): the
/// paired-rounds engine runs the block's parts under it, then stops it.
pub trait Peer: std::ops::Deref<Target = PeerChild> {
    fn finish(self: Box<Self>) -> anyhow::Result<()>;
}

impl Peer for Bpftrace {
    fn finish(self: Box<Self>) -> anyhow::Result<()> {
        self.stop().map(drop)
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
        with_own_tracefs(&mut cmd);
        let mut peer = Bpftrace {
            child: PeerChild::spawn("bpftrace", &mut cmd, libc::SIGINT)?,
            out,
        };
        let began = Instant::now();
        loop {
            interrupt::check()?;
            let text = fs::read_to_string(&peer.out).unwrap_or_default();
            if text.lines().any(|l| l.trim() == "ready") {
                break;
            }
            if peer.child.try_reap() {
                let err = fs::read_to_string(dir.join(format!("{tag}.err"))).unwrap_or_default();
                bail!("bpftrace exited before it attached: {}", err.trim());
            }
            if began.elapsed() > START_TIMEOUT {
                bail!("bpftrace did not attach within {START_TIMEOUT:?}");
            }
            sleep(Duration::from_millis(20));
        }
        peer.child.programs = perf_programs(peer.pid as u32);
        if peer.programs.is_empty() {
            bail!(
                "bpftrace (pid {}) runs but bpftool lists no program of its",
                peer.pid
            );
        }
        Ok(peer)
    }

    /// SIGINT, wait for it to print its maps and exit; its output.
    pub fn stop(mut self) -> anyhow::Result<String> {
        self.child.stop()?;
        Ok(fs::read_to_string(&self.out).unwrap_or_default())
    }
}

/// `programs` ((id, tracepoint)) with their counters from `delta`, by program id.
fn programs_costs(programs: &[(u64, String)], delta: &BTreeMap<u64, Counter>) -> Vec<PeerProgram> {
    programs
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

/// Peers (bpftrace, rezolus) this process started that are still running.
pub fn ours_left() -> Vec<String> {
    super::quiet::our_processes(&["bpftrace", "rezolus"])
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
