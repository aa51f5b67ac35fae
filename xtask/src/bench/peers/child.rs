//! A peer tool's process (bpftrace, rezolus), held as a guard: it dies with
//! this process (PR_SET_PDEATHSIG), `Drop` stops it, and what it attached is
//! read from the kernel by its pid.

use std::collections::BTreeMap;
use std::io;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::thread::sleep;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};

use super::{PeerProgram, programs_costs};
use crate::bench::tracer::programs::Counter;
use crate::bench::tracer::{self, Usage};

pub struct PeerChild {
    /// As messages name it: "bpftrace", "rezolus".
    pub name: &'static str,
    pub pid: libc::pid_t,
    /// The signal it stops on (bpftrace prints its maps on SIGINT; rezolus
    /// ignores SIGINT and stops on SIGTERM).
    signal: libc::c_int,
    reaped: bool,
    /// Its programs, as `bpftool perf list` shows them attached: (id, tracepoint).
    pub programs: Vec<(u64, String)>,
}

impl PeerChild {
    /// Spawn `cmd`, which stops on `signal` and is sent it if this process dies.
    pub fn spawn(
        name: &'static str,
        cmd: &mut Command,
        signal: libc::c_int,
    ) -> anyhow::Result<Self> {
        // SAFETY: prctl is async-signal-safe and touches no memory of ours.
        unsafe {
            cmd.pre_exec(move || match libc::prctl(libc::PR_SET_PDEATHSIG, signal) {
                0 => Ok(()),
                _ => Err(io::Error::last_os_error()),
            });
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("cannot start {name}"))?;
        Ok(PeerChild {
            name,
            pid: child.id() as libc::pid_t,
            signal,
            reaped: false,
            programs: Vec::new(),
        })
    }

    /// Its programs' counters over one run (`delta`, by program id, from two
    /// [`tracer::programs::Snapshot`]s of [`PeerChild::prog_ids`]), by
    /// tracepoint; zero unless bpf_stats were on.
    pub fn costs(&self, delta: &BTreeMap<u64, Counter>) -> Vec<PeerProgram> {
        programs_costs(&self.programs, delta)
    }

    /// Its process's CPU and peak RSS so far (an error once it has exited).
    pub fn usage(&self) -> anyhow::Result<Usage> {
        tracer::process_usage(self.pid as u32)
            .with_context(|| format!("{} (pid {}) has exited", self.name, self.pid))
    }

    /// The ids of its programs: how its BPF links are told from anyone else's.
    pub fn prog_ids(&self) -> Vec<u64> {
        self.programs.iter().map(|(id, _)| *id).collect()
    }

    /// Send its stop signal and wait for it to exit (SIGKILL after 20 s: an error).
    pub fn stop(&mut self) -> anyhow::Result<()> {
        // SAFETY: kill has no memory-safety preconditions; pid is our unreaped child.
        unsafe { libc::kill(self.pid, self.signal) };
        if !self.wait(Duration::from_secs(20)) {
            bail!(
                "{} did not exit within 20 s of its stop signal; killed it",
                self.name
            );
        }
        Ok(())
    }

    /// Whether it has exited (and is now reaped).
    pub fn try_reap(&mut self) -> bool {
        let mut status = 0;
        // SAFETY: status outlives the call.
        let rc = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
        self.reaped |= rc != 0;
        rc != 0
    }

    /// Wait up to `limit`; after that SIGKILL and reap it. Whether it exited by itself.
    fn wait(&mut self, limit: Duration) -> bool {
        let until = Instant::now() + limit;
        while Instant::now() < until {
            if self.try_reap() {
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

impl Drop for PeerChild {
    fn drop(&mut self) {
        if self.reaped {
            return;
        }
        eprintln!("bench: stopping {} (pid {})", self.name, self.pid);
        // SAFETY: as in stop().
        unsafe { libc::kill(self.pid, self.signal) };
        self.wait(Duration::from_secs(10));
    }
}
