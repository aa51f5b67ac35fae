//! Waiting for a quiet host before each run of the net suite.

use std::time::{Duration, Instant};

use super::disturbance;
use crate::bench::hostcpu::HostCpu;
use crate::bench::interrupt;

/// Waiting for a quiet host, within a budget: up to [`QUIET_BEFORE_SUITE`]
/// before the suite, then up to [`QUIET_PER_RUN`] before each run but no more
/// than [`QUIET_BUDGET`] over all runs, so a neighbour's long build cannot
/// stretch the suite without end (each run is also checked after, and run
/// again when someone else's hooks or load generators were there).
pub struct Quiet {
    spent: Duration,
}

pub const QUIET_BEFORE_SUITE: Duration = Duration::from_secs(10);
pub const QUIET_PER_RUN: Duration = Duration::from_secs(10);
pub const QUIET_BUDGET: Duration = Duration::from_secs(20);
/// More user-space CPU than this from other processes, in % of one CPU, is a busy host.
pub const BUSY_USER_CPU_PCT: f64 = 25.0;
/// How long the host's CPU is watched before each run.
const CPU_SAMPLE: Duration = Duration::from_millis(200);

impl Quiet {
    pub fn new() -> Self {
        Quiet {
            spent: Duration::ZERO,
        }
    }

    /// Wait until the host is quiet: nobody else's network hooks (the
    /// programs `ours` are the bench's own daemon's or peer's) or load
    /// generators, and little user-space CPU (sampled for [`CPU_SAMPLE`]
    /// while no client of ours runs; a daemon or bpftrace of ours may, using
    /// a fraction of a percent). None when it is; else why not, once the
    /// time allowed has passed: then the caller measures anyway.
    pub fn wait(&mut self, limit: Duration, ours: &[u64]) -> anyhow::Result<Option<String>> {
        let began = Instant::now();
        let mut said = began;
        loop {
            interrupt::check()?;
            let cpu = HostCpu::now();
            std::thread::sleep(CPU_SAMPLE);
            let busy = 100.0 * HostCpu::now().since(&cpu).user_s / CPU_SAMPLE.as_secs_f64();
            let why = disturbance(ours).or_else(|| {
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
    pub fn before_run(&mut self, ours: &[u64]) -> anyhow::Result<Option<String>> {
        let began = Instant::now();
        let limit = QUIET_PER_RUN.min(QUIET_BUDGET.saturating_sub(self.spent));
        let why = self.wait(limit, ours)?;
        // The first sample always takes CPU_SAMPLE; only the waiting beyond it counts.
        self.spent += began.elapsed().saturating_sub(CPU_SAMPLE);
        Ok(why)
    }
}
