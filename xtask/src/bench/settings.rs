//! How long a suite measures: rounds and seconds per run, with defaults per
//! suite and the same environment overrides for all of them (so
//! `STALLTRACE_BENCH_ROUNDS=2 cargo xtask bench all` is a quick look at every
//! suite). The published figures say what they were made with.

use anyhow::bail;

pub struct Settings {
    pub rounds: usize,
    pub runtime_s: u64,
}

impl Settings {
    /// `STALLTRACE_BENCH_ROUNDS` and `STALLTRACE_BENCH_RUNTIME_S`, or the suite's defaults.
    pub fn from_env(default_rounds: u64, default_runtime_s: u64) -> anyhow::Result<Self> {
        Ok(Settings {
            rounds: whole_number("STALLTRACE_BENCH_ROUNDS", default_rounds)? as usize,
            runtime_s: whole_number("STALLTRACE_BENCH_RUNTIME_S", default_runtime_s)?,
        })
    }
}

fn whole_number(name: &str, default: u64) -> anyhow::Result<u64> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => match v.parse::<u64>() {
            Ok(n) if n >= 1 => Ok(n),
            _ => bail!("{name}={v}: expected a whole number of 1 or more"),
        },
    }
}
