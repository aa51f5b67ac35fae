//! `bench tls`: what the `SSL_write` / `SSL_write_ex` uprobes of
//! `--sql-tls` cost the SQL Server worker per server send.
//!
//! A uprobe traps on every call of the probed function by the worker while
//! it is attached, whatever its program then does, so the cost is measured
//! where it is paid: the worker's own CPU time (utime + stime of its pid,
//! every thread) over the TLS responses it sent. Two simulators run for the
//! whole suite, one per BIO style (`--tls-bio memory`: one `SSL_write_ex`
//! per response, then `write()`; `socket`: one `SSL_write`, the send inside
//! it), and an encrypted `sqlclient` asks `SELECT @@SPID` (answered without
//! storage I/O) as fast as it can. Each round runs three configurations,
//! in the order `paired::permuted` gives (all six orders over six rounds):
//! no stalltrace; a daemon with `--sql-tls off`; a daemon with `--sql-tls
//! always` (uprobes on each worker's libssl for the daemon's whole life).
//! Under each daemon every BIO style runs twice: as deployed (the CPU
//! figures) and with the kernel's per-program accounting on (each
//! program's run count and run time, the oracle that the uprobes fired
//! once per response, and the split between the programs and the trap).
//! `drive` runs the rounds, `results` makes per-round differences and
//! ratios into medians with intervals, `render` the section of
//! docs/BENCHMARKS.md.

mod drive;
mod render;
mod results;
mod workload;

use std::path::Path;
use std::time::Instant;

use serde::Serialize;

use super::engine;
use super::paired;
use super::publish::{self, Host};
use super::quiet::{self, Quiet};
use super::settings::Settings;
use super::shell::{self, Scratch};
use super::tracer::{self, ProgramCost};
use workload::{Run, Server};

/// 12 rounds give a 96% interval from the 3rd to the 10th per-round value.
/// A round is 10 client runs (2 BIO styles x none, off, off+bpf-stats,
/// always, always+bpf-stats) and two daemons started and stopped.
const ROUNDS: u64 = 12;
const RUNTIME_S: u64 = 2;
/// Sessions of each client run.
pub const SESSIONS: u32 = 2;
/// The CPU the worker and the client run on (every thread of both), as
/// the net suite's clients and servers do, for the same reason: unpinned,
/// whether a response's wake-up crosses CPUs (an IPI and an exit from idle
/// in a VM, part of the worker's CPU time) is the scheduler's choice from
/// run to run. The daemon is not pinned. (Pinning does not make the figures
/// steady on a busy host: a neighbour's load on the other vCPU slowed every
/// instruction on this one by up to half in trials, which only a quiet
/// host and paired rounds answer.)
pub const CPU: usize = 0;
/// Answered without storage I/O (no O_DIRECT reads, no fdatasync).
pub const BATCH_SQL: &str = "SELECT @@SPID";
/// How far the uprobe programs' run count may be from the responses the
/// worker sent in a run with the accounting on (as a fraction): they are
/// equal when nothing else calls the worker's `SSL_write*`.
pub const RUN_COUNT_TOLERANCE: f64 = 0.01;

/// Processes of others that would compete for the 2 CPUs or touch the
/// workers: another simulator or stalltrace (which would attach its own
/// uprobes to the bench's workers), a tracer, a load generator, a VM.
const OTHERS: &[&str] = &[
    "sqlservr",
    "sqlclient",
    "stalltrace",
    "bpftrace",
    "fio",
    "iperf3",
    "sockperf",
    "qemu-system-x86",
];

/// The simulator's TLS styles (`sqlservr --tls-bio`).
#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Bio {
    Memory,
    Socket,
}

pub const BIOS: [Bio; 2] = [Bio::Memory, Bio::Socket];

impl Bio {
    pub fn arg(self) -> &'static str {
        match self {
            Bio::Memory => "memory",
            Bio::Socket => "socket",
        }
    }

    /// The libssl function each response goes through, and its program.
    pub fn symbol(self) -> &'static str {
        match self {
            Bio::Memory => "SSL_write_ex",
            Bio::Socket => "SSL_write",
        }
    }

    pub fn program(self) -> &'static str {
        match self {
            Bio::Memory => "on_ssl_write_ex",
            Bio::Socket => "on_ssl_write",
        }
    }
}

/// The uprobe programs (both, whichever BIO).
pub const UPROBE_PROGRAMS: [&str; 2] = ["on_ssl_write", "on_ssl_write_ex"];

/// A round's two daemon configurations (the third is no stalltrace).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Config {
    Off,
    Always,
}

impl Config {
    /// `--sql-tls` of the daemon, and the configuration's name.
    pub fn sql_tls(self) -> &'static str {
        match self {
            Config::Off => "off",
            Config::Always => "always",
        }
    }
}

/// The daemon's command line (then `--out FILE`).
pub fn daemon_args(sql_tls: &str) -> Vec<&str> {
    tracer::ARGS
        .iter()
        .copied()
        .chain(["--sql-tls", sql_tls])
        .collect()
}

pub type TracedRun = paired::TracedRun<Run, ProgramCost>;

/// The daemon configurations' places in [`BioRuns::daemons`].
pub const OFF: usize = 0;
pub const ALWAYS: usize = 1;

/// Every configuration's runs of one BIO style: `untraced` is no
/// stalltrace, `daemons` `--sql-tls off` and `always` (see `drive`).
pub type BioRuns = paired::PartRuns<Bio, Run>;

pub struct Measured {
    /// Each BIO style's runs, each daemon's life, the warnings.
    pub runs: engine::Runs<Bio, Run, ()>,
    /// Attempts run again because the host was not quiet, and why.
    pub disturbed: Vec<String>,
    /// Seconds the runs waited for a quiet host (beyond the CPU samples).
    pub quiet_wait_s: f64,
}

pub fn run() -> anyhow::Result<()> {
    let settings = Settings::for_suite("tls", ROUNDS, RUNTIME_S)?;
    let source = publish::source();
    let began = Instant::now();
    let host = Host::this();
    let mut warnings = Vec::new();
    let mut quiet_host = Quiet::new(disturbance);
    shell::quiet_before_suite(&mut quiet_host, &mut warnings)?;
    let load_before = publish::load_average();

    // The daemons' output on tmpfs (no disk I/O during a run); the
    // simulators' files (O_DIRECT: not on tmpfs) and binaries on disk.
    let out = Scratch::on_tmpfs("tls")?;
    let files = Scratch::under("/var/tmp", "tls")?;
    let bins = super::sim_bins(files.path())?;
    let mut servers = Vec::new();
    for bio in BIOS {
        servers.push(Server::start(&bins, files.path(), bio)?);
    }
    let workers: Vec<u32> = servers.iter().map(Server::worker).collect();
    let measured = drive::measure(
        &settings,
        &bins,
        &servers,
        out.path(),
        &mut quiet_host,
        warnings,
    );
    drop(servers);
    let dirs = [out.path().to_path_buf(), files.path().to_path_buf()];
    drop(out);
    drop(files);
    let mut leaks: Vec<String> = dirs
        .iter()
        .filter(|d| d.exists())
        .map(|d| format!("{} still exists", d.display()))
        .collect();
    leaks.extend(
        workers
            .iter()
            .filter(|w| Path::new(&format!("/proc/{w}")).exists())
            .map(|w| format!("sqlservr worker {w} still running")),
    );
    leaks.extend(quiet::our_processes(&["sqlservr", "sqlclient"]));
    let measured = shell::torn_down(
        measured,
        leaks,
        "simulators stopped, their files removed, no stalltrace left",
    )?;

    let results = results::aggregate(
        &settings,
        measured,
        (host, source),
        began.elapsed().as_secs_f64(),
        [load_before, publish::load_average()],
    );
    shell::print_and_publish("tls", &render::markdown(&results), &results)
}

/// Why the host is not quiet right now, if it is not: someone else's
/// uprobe on a libssl (it would trap the workers: another stalltrace
/// attaches to every `sqlservr` it finds), or others' processes (`OTHERS`).
/// `ours`: the programs of the bench's daemon.
fn disturbance(ours: &[u64]) -> Option<String> {
    let theirs: Vec<String> = workload::all_links()
        .into_iter()
        .filter(|l| !ours.contains(&l.prog_id) && l.file.contains("libssl"))
        .map(|l| format!("pid {} on {}", l.owner, l.file))
        .collect();
    if !theirs.is_empty() {
        return Some(format!(
            "{} uprobe(s) not ours on a libssl: {}",
            theirs.len(),
            theirs.join(", ")
        ));
    }
    quiet::foreign_processes(OTHERS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_bio_style_goes_through_its_own_function() {
        assert_eq!(
            (Bio::Memory.symbol(), Bio::Memory.program()),
            ("SSL_write_ex", "on_ssl_write_ex")
        );
        assert_eq!(
            (Bio::Socket.symbol(), Bio::Socket.program()),
            ("SSL_write", "on_ssl_write")
        );
        assert_eq!(
            daemon_args("always"),
            ["run", "--interval", "1s", "--sql-tls", "always"]
        );
        assert_eq!(Config::Always.sql_tls(), "always");
    }
}
