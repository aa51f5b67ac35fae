//! The tls suite on the paired-rounds engine (see `engine`): its parts are
//! the two BIO styles' simulators, its three blocks no stalltrace, a daemon
//! with `--sql-tls off` and one with `--sql-tls always`, in the order
//! `paired::permuted` gives; no floor and no peer. Every run under a daemon
//! is checked: the uprobes attached on the worker under `always` (its links
//! before and after, and in the accounting runs one program run per
//! response), none under `off`; a failed check ends the bench.

use std::collections::BTreeMap;
use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::bail;
use stalltrace_lab::Bins;

use super::workload::{self, Run, Server};
use super::{
    ALWAYS, BIOS, Bio, Config, Measured, OFF, RUN_COUNT_TOLERANCE, Settings, TracedRun,
    UPROBE_PROGRAMS, daemon_args, disturbance,
};
use crate::bench::engine::{self, Block, Daemon, Suite};
use crate::bench::quiet::Quiet;
use crate::bench::tracer::programs::Counter;
use crate::bench::tracer::{ProgramCost, Tracer};

/// How long a daemon may take to find both workers (and attach their uprobes).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The daemon configurations, at their places in `BioRuns::daemons` (`OFF`, `ALWAYS`).
const DAEMONS: [Config; 2] = [Config::Off, Config::Always];

struct TlsSuite<'a> {
    rounds: usize,
    runtime_s: u64,
    bins: &'a Bins,
    servers: &'a [Server],
    scratch: &'a Path,
    /// The quiet-host budget.
    quiet: &'a mut Quiet,
    /// Every attempt that was disturbed, and why.
    disturbed: Vec<String>,
    /// The uprobe programs of the daemon of the block under way.
    uprobe_ids: Vec<u64>,
}

impl TlsSuite<'_> {
    fn server(&self, bio: Bio) -> &Server {
        self.servers
            .iter()
            .find(|s| s.bio == bio)
            .expect("a simulator for every BIO style")
    }
}

impl Suite for TlsSuite<'_> {
    type Part = Bio;
    type Run = Run;
    type Output = ();
    const UNTRACED: &'static str = "none";
    const RETRY_FAILURES: bool = true;

    fn blocks(&self) -> [Block; 3] {
        [Block::Untraced, Block::Daemon(OFF), Block::Daemon(ALWAYS)]
    }

    fn daemon_name(&self, config: usize) -> &'static str {
        DAEMONS[config].sql_tls()
    }

    fn parts(&self) -> Vec<Bio> {
        self.servers.iter().map(|s| s.bio).collect()
    }

    fn part_name(&self, bio: Bio) -> String {
        bio.arg().to_string()
    }

    fn scratch(&self) -> &Path {
        self.scratch
    }

    fn quiet(&mut self) -> Option<&mut Quiet> {
        Some(self.quiet)
    }

    fn disturbance(&self, ours: &[u64]) -> Option<String> {
        disturbance(ours)
    }

    /// Keeps `why` (an attempt's disturbance) for the published count.
    fn note(&mut self, label: &str, why: Option<String>) -> Option<String> {
        if let Some(w) = &why {
            self.disturbed.push(format!("{label}: {w}"));
        }
        why
    }

    fn run(&mut self, bio: Bio, daemon: Option<&Tracer>) -> anyhow::Result<Run> {
        workload::run_client(
            &self.bins.sqlclient,
            self.server(bio),
            self.runtime_s,
            daemon.map(Tracer::pid),
        )
    }

    /// One line per run; in a daemon's accounting run, its uprobe programs' runs too.
    fn progress(&self, label: &str, _: Bio, run: &Run, accounted: Option<&BTreeMap<u64, Counter>>) {
        let head = format!("{label}:");
        let programs = accounted.map_or(String::new(), |counters| {
            let (n, ns) = counters
                .iter()
                .filter(|(id, _)| self.uprobe_ids.contains(id))
                .fold((0, 0), |(n, ns), (_, c)| {
                    (n + c.run_count, ns + c.run_time_ns)
                });
            format!(
                ", uprobe programs ran {n} times ({:.3} per response, {:.0} ns each)",
                n as f64 / run.responses.max(1) as f64,
                ns as f64 / n.max(1) as f64
            )
        });
        eprintln!(
            "bench: {head:<38} {:.2} µs worker CPU per response, {:.0} tps, {} responses, \
             steal {:.1}%{programs}",
            run.cpu_us_per_response(),
            run.tps,
            run.responses,
            run.steal_pct
        );
    }

    /// A daemon with the configuration's `--sql-tls`, once it has found
    /// both workers (and, under `always`, attached their uprobes, whose
    /// programs join the ones whose counters are read).
    fn start_daemon(&mut self, config: usize, round: usize, tag: &str) -> anyhow::Result<Daemon> {
        let config = DAEMONS[config];
        let sql_tls = config.sql_tls();
        let tracer = Tracer::start_with(
            &crate::bench::stalltrace_bin(),
            self.scratch,
            tag,
            &daemon_args(sql_tls),
        )?;
        let policy = &tracer.start["sql_tls"]["policy"];
        if policy != sql_tls {
            bail!("the daemon's start record says sql_tls policy {policy}, not {sql_tls}");
        }
        let workers: Vec<u32> = self.servers.iter().map(Server::worker).collect();
        let began = Instant::now();
        self.uprobe_ids = await_workers(&tracer, &workers, config)?;
        eprintln!(
            "bench: {:<38} the daemon found both workers {:.1} s after its start record{}",
            format!("round {round}/{} {sql_tls}:", self.rounds),
            began.elapsed().as_secs_f64(),
            if self.uprobe_ids.is_empty() {
                String::new()
            } else {
                format!(
                    " and attached their uprobes (programs {:?})",
                    self.uprobe_ids
                )
            }
        );
        let mut attached = tracer.attached_programs();
        attached.extend(
            self.uprobe_ids
                .iter()
                .map(|id| (*id, "sqlserver".to_string(), "uprobe".to_string())),
        );
        let ours = attached.iter().map(|(id, _, _)| *id).collect();
        Ok(Daemon {
            tracer,
            attached,
            ours,
        })
    }

    fn stopped(&mut self, _: &Path, _: &str) -> anyhow::Result<()> {
        Ok(())
    }

    fn check(&self, config: usize, stats: bool, run: &TracedRun) -> Result<(), String> {
        check(DAEMONS[config], stats, run)
    }
}

pub fn measure(
    settings: &Settings,
    bins: &Bins,
    servers: &[Server],
    scratch: &Path,
    quiet_host: &mut Quiet,
    warnings: Vec<String>,
) -> anyhow::Result<Measured> {
    eprintln!(
        "bench: sqlservr workers {} (tls-bio memory, socket) on 127.0.0.1, {} rounds x {} s \
         per client run",
        servers
            .iter()
            .map(|s| s.worker().to_string())
            .collect::<Vec<_>>()
            .join(", "),
        settings.rounds,
        settings.runtime_s
    );
    let mut suite = TlsSuite {
        rounds: settings.rounds,
        runtime_s: settings.runtime_s,
        bins,
        servers,
        scratch,
        quiet: quiet_host,
        disturbed: Vec::new(),
        uprobe_ids: Vec::new(),
    };
    // Fault in the binaries, the TLS code and the workers' first threads
    // once, so round 1's first runs do not pay for them alone.
    for bio in BIOS {
        suite.run(bio, None)?;
    }
    let runs = engine::measure(&mut suite, settings, warnings)?;
    Ok(Measured {
        runs,
        disturbed: suite.disturbed,
        quiet_wait_s: suite.quiet.spent().as_secs_f64(),
    })
}

/// Wait until the daemon has found every worker (its `sql_instance`
/// records) and, under `always`, holds a uprobe on each of their libssl
/// for each function; return the programs of its uprobe links.
fn await_workers(tracer: &Tracer, workers: &[u32], config: Config) -> anyhow::Result<Vec<u64>> {
    let began = Instant::now();
    loop {
        crate::bench::interrupt::check()?;
        let text = fs::read_to_string(tracer.out()).unwrap_or_default();
        let found = instances(&text, workers);
        if let Some((pid, why)) = found
            .iter()
            .find(|(_, state)| config == Config::Always && state != "available")
        {
            bail!("worker {pid}'s sql_instance says tls {why}: its uprobes cannot be attached");
        }
        let links = workload::links_of(tracer.pid());
        let attached = workers
            .iter()
            .all(|w| workload::uprobes_on(&links, *w) >= UPROBE_PROGRAMS.len());
        if found.len() == workers.len() && (config != Config::Always || attached) {
            let mut ids: Vec<u64> = links.iter().map(|l| l.prog_id).collect();
            ids.sort_unstable();
            ids.dedup();
            return Ok(ids);
        }
        if began.elapsed() > DISCOVERY_TIMEOUT {
            bail!(
                "within {DISCOVERY_TIMEOUT:?} the daemon reported {} of the {} workers{}",
                found.len(),
                workers.len(),
                if config == Config::Always {
                    format!(" and held {} uprobe link(s)", links.len())
                } else {
                    String::new()
                }
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The `sql_instance` records in `text` of the `workers`, the last of
/// each: (pid, its `tls` state).
fn instances(text: &str, workers: &[u32]) -> Vec<(u32, String)> {
    let mut out: Vec<(u32, String)> = Vec::new();
    for line in text.lines().filter(|l| l.contains("\"sql_instance\"")) {
        let Ok(r) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let Some(pid) = r["pid"].as_u64().map(|p| p as u32) else {
            continue;
        };
        if r["type"] != "sql_instance" || !workers.contains(&pid) {
            continue;
        }
        let state = r["tls"]["state"].as_str().unwrap_or("?").to_string();
        out.retain(|(p, _)| *p != pid);
        out.push((pid, state));
    }
    out
}

/// Runs and run time of the uprobe programs in one run's costs.
pub fn uprobe_runs(programs: &[ProgramCost]) -> (u64, u64) {
    programs
        .iter()
        .filter(|p| UPROBE_PROGRAMS.contains(&p.program.as_str()))
        .fold((0, 0), |(n, ns), p| (n + p.run_count, ns + p.run_time_ns))
}

/// Whether a run under a daemon is what its configuration claims: under
/// `always` the daemon held a uprobe on the worker's libssl for each
/// function before and after the run and, with the accounting on, the
/// uprobe programs ran once per response (within [`RUN_COUNT_TOLERANCE`]);
/// under `off`, no uprobe and no run.
pub fn check(config: Config, stats: bool, run: &TracedRun) -> Result<(), String> {
    let (runs, _) = uprobe_runs(&run.programs);
    let links = run.run.our_uprobes;
    let responses = run.run.responses;
    match config {
        Config::Always => {
            if links < UPROBE_PROGRAMS.len() {
                return Err(format!(
                    "under --sql-tls always the daemon held {links} uprobe(s) on the worker's \
                     libssl, not {}",
                    UPROBE_PROGRAMS.len()
                ));
            }
            let off_by = (runs as f64 - responses as f64).abs();
            if stats && (runs == 0 || off_by > RUN_COUNT_TOLERANCE * responses as f64) {
                return Err(format!(
                    "under --sql-tls always the uprobe programs ran {runs} times for {responses} \
                     responses (allowed: within {:.0}%)",
                    RUN_COUNT_TOLERANCE * 100.0
                ));
            }
        }
        Config::Off => {
            if links > 0 || runs > 0 {
                return Err(format!(
                    "under --sql-tls {} the daemon held {links} uprobe(s) on the worker's \
                     libssl and its uprobe programs ran {runs} times",
                    config.sql_tls()
                ));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::paired::ProcessUse;
    use crate::bench::parts::fixtures::cost;
    use crate::bench::tls::Bio;

    fn traced(links: usize, responses: u64, runs: &[(&str, u64)]) -> TracedRun {
        TracedRun {
            run: Run {
                bio: Bio::Memory,
                transactions: responses - 4,
                logins: 2,
                responses,
                tps: 1.0,
                p50_us: 1,
                worker_cpu_s: 1.0,
                seconds: 2.0,
                steal_pct: 0.0,
                our_uprobes: links,
            },
            programs: runs
                .iter()
                .map(|(program, n)| cost("sqlserver", program, *n, 1000))
                .collect(),
            usage: ProcessUse::default(),
        }
    }

    #[test]
    fn always_needs_its_uprobes_and_one_run_per_response() {
        let ok = traced(
            2,
            10_000,
            &[("on_ssl_write_ex", 10_000), ("on_ssl_write", 0)],
        );
        assert_eq!(check(Config::Always, true, &ok), Ok(()));
        assert_eq!(uprobe_runs(&ok.programs), (10_000, 10_000_000));
        // As deployed the programs count nothing: only the links judge.
        let deployed = traced(2, 10_000, &[("on_tcp_sendmsg_locked", 0)]);
        assert_eq!(check(Config::Always, false, &deployed), Ok(()));
        let detached = traced(0, 10_000, &[]);
        let e = check(Config::Always, false, &detached).unwrap_err();
        assert!(e.contains("held 0 uprobe(s)"), "{e}");
        let never_ran = traced(2, 10_000, &[("on_ssl_write_ex", 0)]);
        assert!(check(Config::Always, true, &never_ran).is_err());
        let half = traced(2, 10_000, &[("on_ssl_write_ex", 5_000)]);
        let e = check(Config::Always, true, &half).unwrap_err();
        assert!(e.contains("ran 5000 times for 10000 responses"), "{e}");
        let close = traced(2, 10_000, &[("on_ssl_write", 10_050)]);
        assert_eq!(check(Config::Always, true, &close), Ok(()));
        let other = traced(2, 10_000, &[("on_tcp_sendmsg_locked", 10_000)]);
        assert!(check(Config::Always, true, &other).is_err(), "not a uprobe");
    }

    #[test]
    fn off_has_neither_uprobes_nor_runs() {
        let clean = traced(
            0,
            10_000,
            &[("on_ssl_write", 0), ("on_tcp_sendmsg_locked", 9)],
        );
        assert_eq!(check(Config::Off, true, &clean), Ok(()));
        assert!(check(Config::Off, false, &traced(2, 10_000, &[])).is_err());
        let ran = traced(0, 10_000, &[("on_ssl_write_ex", 3)]);
        let e = check(Config::Off, true, &ran).unwrap_err();
        assert!(
            e.contains("--sql-tls off") && e.contains("ran 3 times"),
            "{e}"
        );
    }

    #[test]
    fn the_last_instance_record_of_each_worker_counts() {
        let text = r#"{"type":"start"}
{"type":"sql_instance","pid":10,"tls":{"state":"available"}}
{"type":"sql_instance","pid":99,"tls":{"state":"available"}}
{"type":"sql_instance","pid":11,"tls":{"state":"available"}}
{"type":"sql_instance","pid":10,"tls":{"state":"disabled"}}
{"type":"sql_instance","pid":11,"tls":{"state":"off"}"#;
        assert_eq!(
            instances(text, &[10, 11]),
            [(11, "available".to_string()), (10, "disabled".to_string())],
            "99 is not ours; the cut last line is not a record"
        );
    }
}
