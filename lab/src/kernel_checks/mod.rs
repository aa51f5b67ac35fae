//! `stalltrace-kernel-checks`: run inside a small guest booted with a given
//! kernel (`cargo xtask kernels`), it checks that stalltrace measures
//! correctly there, against the guest's own counters. Each check builds its
//! situation with the lab (loop-free: the guest's test disk, network
//! namespaces, the simulator), runs `stalltrace run` as a child, and prints one
//! line on stdout:
//!
//! `STALLTRACE-MATRIX {"check", "family", "mode", "verdict", "detail", "hooks", "secs"}`
//!
//! The comparisons and bounds are the host end-to-end tests' (tests/block.rs,
//! tests/net.rs, tests/sqlserver.rs), not looser ones; where the guest's load
//! differs (shorter, fewer sessions) the detail says so.
//!
//! A check that cannot run (a tool missing, a lab step failing) fails with the
//! reason: the lab panics on any failure, and every check runs under
//! `catch_unwind`, so its guards (namespaces, nft tables, qdiscs) are dropped
//! and the next check runs.
//!
//! Family checks pass `--degrade` to `stalltrace run`, so that one family
//! failing to attach on an old kernel fails that family's checks only; they
//! then require their own family to be attached. `cli/check` runs without
//! `--degrade` and requires every family.

mod block;
mod cli;
mod filters;
mod judge;
mod lifecycle;
mod net;
mod netdev;
mod run;
mod settle;
mod sql;
mod sql_requests;

use std::path::PathBuf;
use std::time::Instant;

use serde_json::json;

pub use judge::Judge;
pub use run::Run;

use crate::Bins;

/// `--mode`: what the checks pass to `stalltrace run`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// No probe flag: stalltrace's own choice (tp_btf, falling back to raw_tp).
    Auto,
    /// `--probe-mode raw_tp`.
    RawTp,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Mode::Auto => "auto",
            Mode::RawTp => "raw_tp",
        }
    }

    /// The flags that select this mode.
    pub fn flags(self) -> &'static [&'static str] {
        match self {
            Mode::Auto => &[],
            Mode::RawTp => &["--probe-mode", "raw_tp"],
        }
    }
}

/// The command line.
#[derive(Clone, Debug)]
pub struct Opts {
    pub bins: Bins,
    pub disk: String,
    pub mode: Mode,
    pub only: Vec<String>,
}

const USAGE: &str = "usage: stalltrace-kernel-checks --stalltrace PATH --sqlservr PATH --sqlclient PATH \
                     --disk /dev/DISK --mode auto|raw_tp [--only CHECK...]";

impl Opts {
    /// Parse `args` (without the program name).
    pub fn parse(args: &[String]) -> Result<Self, String> {
        let (mut stalltrace, mut sqlservr, mut sqlclient, mut disk, mut mode) =
            (None, None, None, None, None);
        let mut only = Vec::new();
        let mut it = args.iter().peekable();
        while let Some(flag) = it.next() {
            let mut value = || {
                it.next()
                    .cloned()
                    .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))
            };
            match flag.as_str() {
                "--stalltrace" => stalltrace = Some(PathBuf::from(value()?)),
                "--sqlservr" => sqlservr = Some(PathBuf::from(value()?)),
                "--sqlclient" => sqlclient = Some(PathBuf::from(value()?)),
                "--disk" => disk = Some(value()?),
                "--mode" => {
                    mode = Some(match value()?.as_str() {
                        "auto" => Mode::Auto,
                        "raw_tp" | "raw-tp" => Mode::RawTp,
                        other => return Err(format!("--mode {other}: auto or raw_tp\n{USAGE}")),
                    })
                }
                "--only" => {
                    only.push(value()?);
                    // `--only a b c` as well as `--only a --only b`.
                    while let Some(next) = it.next_if(|a| !a.starts_with("--")) {
                        only.push(next.clone());
                    }
                }
                "-h" | "--help" => return Err(USAGE.to_string()),
                other => return Err(format!("unknown argument {other}\n{USAGE}")),
            }
        }
        let need = |v: Option<PathBuf>, what: &str| v.ok_or(format!("{what} is required\n{USAGE}"));
        let opts = Self {
            bins: Bins {
                stalltrace: need(stalltrace, "--stalltrace")?,
                sqlservr: need(sqlservr, "--sqlservr")?,
                sqlclient: need(sqlclient, "--sqlclient")?,
            },
            disk: disk.ok_or(format!("--disk is required\n{USAGE}"))?,
            mode: mode.ok_or(format!("--mode is required\n{USAGE}"))?,
            only,
        };
        for name in &opts.only {
            if !CHECKS.iter().chain(ON_DEMAND).any(|c| c.name == *name) {
                let known: Vec<&str> = CHECKS.iter().chain(ON_DEMAND).map(|c| c.name).collect();
                return Err(format!("--only {name}: no such check (known: {known:?})"));
            }
        }
        if !opts.bins.stalltrace.exists() {
            return Err(format!("{} does not exist", opts.bins.stalltrace.display()));
        }
        Ok(opts)
    }
}

/// One check: its name (`family/what`), its family, and the code.
pub struct Check {
    pub name: &'static str,
    pub family: &'static str,
    pub run: fn(&Opts, &mut Judge),
}

/// Every check, in the order they run.
pub const CHECKS: &[Check] = &[
    Check {
        name: "cli/check",
        family: "cli",
        run: cli::check,
    },
    Check {
        name: "block/diskstats",
        family: "block",
        run: block::diskstats,
    },
    Check {
        name: "block/settle",
        family: "block",
        run: settle::skipped_completions,
    },
    Check {
        name: "filters/process",
        family: "block",
        run: filters::process,
    },
    Check {
        name: "tcp/loss",
        family: "tcp",
        run: net::loss,
    },
    Check {
        name: "tcp/rto",
        family: "tcp",
        run: net::rto,
    },
    Check {
        name: "tcp/syn",
        family: "tcp",
        run: net::syn,
    },
    Check {
        name: "sqlserver/spid",
        family: "sqlserver",
        run: sql::spid,
    },
    Check {
        name: "netdev/tbf",
        family: "netdev",
        run: netdev::tbf,
    },
    Check {
        name: "cli/attach-loop",
        family: "cli",
        run: lifecycle::attach_loop,
    },
];

/// Checks that need a guest booted for them, run only when named with `--only`.
pub const ON_DEMAND: &[Check] = &[Check {
    name: "cli/lockdown",
    family: "cli",
    run: lifecycle::lockdown,
}];

/// The prefix of every result line on stdout.
pub const PREFIX: &str = "STALLTRACE-MATRIX ";

/// Run the selected checks, printing one line per check; returns how many failed.
pub fn run_all(opts: &Opts) -> usize {
    install_panic_hook();
    let mut failed = 0;
    let started = Instant::now();
    for check in CHECKS.iter().chain(ON_DEMAND) {
        let named = opts.only.iter().any(|n| n == check.name);
        let by_default = opts.only.is_empty() && !ON_DEMAND.iter().any(|c| c.name == check.name);
        if !named && !by_default {
            continue;
        }
        eprintln!(
            "kernel-checks: [{:>5.1}s] {} ({}) ...",
            started.elapsed().as_secs_f64(),
            check.name,
            opts.mode.name()
        );
        let t0 = Instant::now();
        let judge = Judge::run(opts, check);
        let secs = t0.elapsed().as_secs_f64();
        let pass = judge.passed();
        failed += usize::from(!pass);
        let line = json!({
            "check": check.name,
            "family": check.family,
            "mode": opts.mode.name(),
            "verdict": if pass { "pass" } else { "fail" },
            "detail": judge.detail(),
            "hooks": judge.hooks,
            "secs": (secs * 10.0).round() / 10.0,
        });
        eprintln!(
            "kernel-checks: {} {} in {secs:.1} s: {}",
            check.name,
            if pass { "PASS" } else { "FAIL" },
            judge.detail()
        );
        println!("{PREFIX}{line}");
    }
    failed
}

/// A panic inside a check is its failure, reported in its line: print it
/// briefly on stderr (the progress stream), without a backtrace.
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        eprintln!(
            "kernel-checks: panic{at}: {}",
            judge::panic_text(info.payload())
        );
    }));
}
