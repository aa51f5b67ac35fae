//! rezolus, the block suite's second peer: a telemetry agent whose
//! `blockio_latency` sampler does the same job as our bpftrace script with
//! raw_tp programs on block_rq_insert, block_rq_issue and block_rq_complete
//! (a hash map keyed by request). It is a peer as deployed elsewhere, not a
//! script of ours, so it is looked for at run time and, when missing, listed
//! with the usual peers that cannot run instead of failing the suite.

use std::fs::{self, File};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::bail;

use super::{PeerChild, Unavailable, perf_programs};
use crate::bench::interrupt;

/// Its name in the tables and in benchmarks.json.
pub const NAME: &str = "rezolus 5.4.0 blockio_latency";

/// What it does, in words.
pub const JOB: &str = "its blockio_latency sampler: raw_tp programs on block_rq_insert, \
     block_rq_issue and block_rq_complete, a hash map keyed by request, per-operation latency \
     histograms read by the agent; every other sampler off";

/// Where `cargo xtask` expects it (see docs/BENCHMARKS.md, Peers): built
/// with `cargo install --locked` outside the work tree, so a fresh checkout
/// does not rebuild it.
const DEFAULT_BIN: &str = "/var/cache/stalltrace-bench/rezolus/bin/rezolus";
/// Overrides [`DEFAULT_BIN`].
const BIN_VAR: &str = "STALLTRACE_BENCH_REZOLUS";

const START_TIMEOUT: Duration = Duration::from_secs(60);

/// The config it runs with: every sampler off but the one doing our job, so
/// that its cost is that job's alone; its HTTP endpoint on loopback only.
/// The scheduler section is left at its default (SCHED_RR), as deployed.
pub fn config(listen: impl std::fmt::Display) -> String {
    format!(
        "[general]\nlisten = \"{listen}\"\n\n[log]\nlevel = \"info\"\n\n\
         [defaults]\nenabled = false\n\n[samplers.blockio_latency]\nenabled = true\n"
    )
}

/// The binary to run: the env var's, else the cached build.
pub fn binary() -> PathBuf {
    std::env::var_os(BIN_VAR).map_or_else(|| PathBuf::from(DEFAULT_BIN), PathBuf::from)
}

/// The binary if it is there; else why not, as a row of the usual peers' table.
pub fn find() -> Result<PathBuf, Unavailable> {
    let bin = binary();
    if bin.is_file() {
        return Ok(bin);
    }
    Err(Unavailable {
        tool: "rezolus".into(),
        tried: format!("{} (${BIN_VAR}, else {DEFAULT_BIN})", bin.display()),
        verdict: "not installed: see docs/BENCHMARKS.md, Peers, for the `cargo install \
                  --locked` command; the suite ran without it"
            .into(),
    })
}

/// A loopback address nobody listens on now: the kernel picks a free port
/// for a listener of ours, which is closed again for rezolus to take. Only
/// a process binding in between could take it; then rezolus fails to start
/// and says so.
fn free_loopback() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// A running rezolus, held as a guard (see [`PeerChild`]).
pub struct Rezolus {
    child: PeerChild,
}

impl std::ops::Deref for Rezolus {
    type Target = PeerChild;

    fn deref(&self) -> &PeerChild {
        &self.child
    }
}

impl super::Peer for Rezolus {
    fn finish(self: Box<Self>) -> anyhow::Result<()> {
        self.stop()
    }
}

impl Rezolus {
    /// Start `bin` with its config written to `dir/tag.toml`, its output to
    /// `dir/tag.{out,err}`; return once it serves HTTP (it starts its
    /// samplers before it listens) and its programs are attached.
    pub fn start(bin: &Path, dir: &Path, tag: &str) -> anyhow::Result<Self> {
        let listen = free_loopback()?;
        let toml = dir.join(format!("{tag}.toml"));
        fs::write(&toml, config(listen))?;
        let err_path = dir.join(format!("{tag}.err"));
        let mut cmd = Command::new(bin);
        cmd.arg(&toml)
            .stdin(Stdio::null())
            .stdout(File::create(dir.join(format!("{tag}.out")))?)
            .stderr(File::create(&err_path)?);
        // It ignores SIGINT.
        let mut peer = Rezolus {
            child: PeerChild::spawn("rezolus", &mut cmd, libc::SIGTERM)?,
        };
        let began = Instant::now();
        loop {
            interrupt::check()?;
            if TcpStream::connect_timeout(&listen, Duration::from_millis(100)).is_ok() {
                peer.child.programs = perf_programs(peer.pid as u32);
                // Three raw_tp programs; wait for all, should a link come late.
                if peer.programs.len() >= 3 {
                    break;
                }
            }
            if peer.child.try_reap() {
                let err = fs::read_to_string(&err_path).unwrap_or_default();
                bail!("rezolus exited before it attached: {}", err.trim());
            }
            if began.elapsed() > START_TIMEOUT {
                bail!(
                    "rezolus did not listen on {listen} with its programs attached within \
                     {START_TIMEOUT:?} (programs seen: {:?})",
                    peer.programs
                );
            }
            sleep(Duration::from_millis(20));
        }
        Ok(peer)
    }

    /// SIGTERM and wait for it to exit.
    pub fn stop(mut self) -> anyhow::Result<()> {
        self.child.stop()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_latency_sampler_on_loopback() {
        let c = config("127.0.0.1:4242");
        assert!(c.contains("listen = \"127.0.0.1:4242\""), "{c}");
        assert!(c.contains("[defaults]\nenabled = false"), "{c}");
        assert!(
            c.contains("[samplers.blockio_latency]\nenabled = true"),
            "{c}"
        );
        assert_eq!(c.matches("enabled = true").count(), 1, "{c}");
    }
}
