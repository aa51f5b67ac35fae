//! The tls suite's rounds: no stalltrace, `--sql-tls off` and `--sql-tls
//! always` in the order `paired::permuted` gives, each BIO style once per
//! configuration (twice under a daemon: as deployed and with the kernel's
//! accounting on); one daemon per configuration and round. Every run under
//! a daemon is checked: the uprobes attached on the worker under `always`
//! (its links before and after, and in the accounting runs one program run
//! per response), none under `off`; a failed check ends the bench.

use std::fs;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use stalltrace_lab::Bins;

use super::workload::{self, Run, Server};
use super::{
    BIOS, BioRuns, Config, DaemonLife, Measured, RUN_COUNT_TOLERANCE, Settings, TracedRun,
    UPROBE_PROGRAMS, daemon_args, disturbance,
};
use crate::bench::paired::{self, Window};
use crate::bench::quiet::{self, Quiet};
use crate::bench::tracer::programs::total_runs;
use crate::bench::tracer::{ProgramCost, Tracer};

/// How long a daemon may take to find both workers (and attach their uprobes).
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

struct Ctx<'a> {
    settings: &'a Settings,
    bins: &'a Bins,
    servers: &'a [Server],
    scratch: &'a Path,
    /// sysctl kernel.bpf_stats_enabled was 1: every run counts program runs.
    stats_sysctl: bool,
}

impl Ctx<'_> {
    fn label(&self, round: usize, server: &Server, config: &str) -> String {
        format!(
            "round {round}/{} {} {config}",
            self.settings.rounds,
            server.bio.arg()
        )
    }

    fn run(&self, server: &Server, daemon: Option<u32>) -> anyhow::Result<Run> {
        workload::run_client(
            &self.bins.sqlclient,
            server,
            self.settings.runtime_s,
            daemon,
        )
    }
}

/// The quiet-host budget, and every attempt that was disturbed.
struct State<'a> {
    quiet: &'a mut Quiet,
    disturbed: Vec<String>,
}

impl State<'_> {
    /// Before each attempt: the scratch directory there, a quiet host
    /// waited for within the budget.
    fn prepare(&mut self, scratch: &Path, label: &str, ours: &[u64]) -> anyhow::Result<()> {
        fs::create_dir_all(scratch)
            .with_context(|| format!("cannot create {}", scratch.display()))?;
        if let Some(why) = self.quiet.before_run(ours)? {
            eprintln!("bench: {label}: measuring anyway: {why}");
        }
        Ok(())
    }

    /// Keeps `why` (an attempt's disturbance) for the published count.
    fn note(&mut self, label: &str, why: Option<String>) -> Option<String> {
        if let Some(why) = &why {
            self.disturbed.push(format!("{label}: {why}"));
        }
        why
    }
}

pub fn measure(
    settings: &Settings,
    bins: &Bins,
    servers: &[Server],
    scratch: &Path,
    quiet_host: &mut Quiet,
    mut warnings: Vec<String>,
) -> anyhow::Result<Measured> {
    let stats_sysctl = paired::stats_sysctl_on(&mut warnings);
    let ctx = Ctx {
        settings,
        bins,
        servers,
        scratch,
        stats_sysctl,
    };
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
    // Fault in the binaries, the TLS code and the workers' first threads
    // once, so round 1's first runs do not pay for them alone.
    for s in servers {
        ctx.run(s, None)?;
    }
    let mut st = State {
        quiet: quiet_host,
        disturbed: Vec::new(),
    };
    let mut m = Measured {
        bios: BIOS.iter().map(|b| BioRuns::new(*b)).collect(),
        daemons: Vec::new(),
        warnings,
        disturbed: Vec::new(),
        quiet_wait_s: 0.0,
    };
    for round in 1..=settings.rounds {
        let parts = paired::parts(round, servers.len());
        for config in paired::permuted(round, [Config::None, Config::Off, Config::Always]) {
            match config {
                Config::None => untraced(&ctx, &mut st, &mut m, round, &parts)?,
                _ => daemon_block(&ctx, &mut st, &mut m, round, &parts, config)?,
            }
        }
    }
    m.disturbed = st.disturbed;
    m.quiet_wait_s = st.quiet.spent().as_secs_f64();
    Ok(m)
}

fn untraced(
    ctx: &Ctx,
    st: &mut State,
    m: &mut Measured,
    round: usize,
    parts: &[usize],
) -> anyhow::Result<()> {
    for &i in parts {
        let server = &ctx.servers[i];
        let label = ctx.label(round, server, "none");
        let run = quiet::retry_failures(&label, &mut m.warnings, || {
            st.prepare(ctx.scratch, &label, &[])?;
            let before = disturbance(&[]);
            let run = ctx.run(server, None)?;
            Ok((run, st.note(&label, before.or_else(|| disturbance(&[])))))
        })?;
        progress(&label, &run, None);
        m.bios[i].none.push(run);
    }
    Ok(())
}

/// One daemon for the configuration: each BIO style as deployed and with
/// the accounting on. A failure (the daemon gone, a client error) runs the
/// whole block again with a new daemon; a failed check ends the bench.
fn daemon_block(
    ctx: &Ctx,
    st: &mut State,
    m: &mut Measured,
    round: usize,
    parts: &[usize],
    config: Config,
) -> anyhow::Result<()> {
    let block = format!(
        "round {round}/{} {} block",
        ctx.settings.rounds,
        config.name()
    );
    let mut inner = Vec::new();
    let (runs, life) = quiet::retry_failures(&block, &mut m.warnings, || {
        inner.clear();
        st.prepare(ctx.scratch, &block, &[])?;
        Ok((one_daemon(ctx, st, &mut inner, round, parts, config)?, None))
    })?;
    m.warnings.append(&mut inner);
    for (i, stats, run) in runs {
        let label = ctx.label(
            round,
            &ctx.servers[i],
            &paired::config(config.name(), stats),
        );
        if let Err(why) = check(config, stats, &run) {
            bail!("{label}: {why}: the figures would not be what they claim; nothing published");
        }
        m.bios[i].file(config, stats, run);
    }
    m.daemons.push(life);
    Ok(())
}

type BlockRuns = (Vec<(usize, bool, TracedRun)>, DaemonLife);

fn one_daemon(
    ctx: &Ctx,
    st: &mut State,
    warnings: &mut Vec<String>,
    round: usize,
    parts: &[usize],
    config: Config,
) -> anyhow::Result<BlockRuns> {
    let sql_tls = config.sql_tls().expect("a daemon's configuration");
    let tag = format!("r{round}-{sql_tls}");
    let tracer = Tracer::start_with(
        &crate::bench::stalltrace_bin(),
        ctx.scratch,
        &tag,
        &daemon_args(sql_tls),
    )?;
    let policy = &tracer.start["sql_tls"]["policy"];
    if policy != sql_tls {
        bail!("the daemon's start record says sql_tls policy {policy}, not {sql_tls}");
    }
    let workers: Vec<u32> = ctx.servers.iter().map(Server::worker).collect();
    let began = Instant::now();
    let uprobe_ids = await_workers(&tracer, &workers, config)?;
    eprintln!(
        "bench: {:<38} the daemon found both workers {:.1} s after its start record{}",
        format!("round {round}/{} {sql_tls}:", ctx.settings.rounds),
        began.elapsed().as_secs_f64(),
        if uprobe_ids.is_empty() {
            String::new()
        } else {
            format!(" and attached their uprobes (programs {uprobe_ids:?})")
        }
    );
    let mut attached = tracer.attached_programs();
    attached.extend(
        uprobe_ids
            .iter()
            .map(|id| (*id, "sqlserver".to_string(), "uprobe".to_string())),
    );
    let ids: Vec<u64> = attached.iter().map(|(id, _, _)| *id).collect();
    let windows = paired::each_run(round, parts, |i, stats| {
        let server = &ctx.servers[i];
        let label = ctx.label(round, server, &paired::config(sql_tls, stats));
        let win: Window<Run> = quiet::retry(&label, warnings, || {
            st.prepare(ctx.scratch, &label, &ids)?;
            let before = disturbance(&ids);
            let win = paired::window(
                &ids,
                stats,
                || tracer.usage(),
                || ctx.run(server, Some(tracer.pid())),
            )?;
            let disturbed = before.or_else(|| disturbance(&ids)).or_else(|| {
                paired::stats_disturbance(stats, ctx.stats_sysctl, total_runs(&win.counters))
            });
            Ok((win, st.note(&label, disturbed)))
        })?;
        let uprobe_runs: (u64, u64) = win
            .counters
            .iter()
            .filter(|(id, _)| uprobe_ids.contains(id))
            .fold((0, 0), |(n, ns), (_, c)| {
                (n + c.run_count, ns + c.run_time_ns)
            });
        progress(&label, &win.run, stats.then_some(uprobe_runs));
        Ok(win)
    })?;
    let finished = tracer.stop()?;
    let runs = paired::named(windows, &attached, &finished.stop);
    Ok((
        runs,
        DaemonLife {
            stop: finished.stop,
            lifetime_cpu_s: finished.lifetime_cpu_s,
        },
    ))
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
        Config::Off | Config::None => {
            if links > 0 || runs > 0 {
                return Err(format!(
                    "under --sql-tls {} the daemon held {links} uprobe(s) on the worker's \
                     libssl and its uprobe programs ran {runs} times",
                    config.name()
                ));
            }
        }
    }
    Ok(())
}

/// One line per run.
fn progress(label: &str, run: &Run, uprobes: Option<(u64, u64)>) {
    let head = format!("{label}:");
    let programs = uprobes.map_or(String::new(), |(n, ns)| {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::paired::ProcessUse;
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
                .map(|(program, n)| ProgramCost {
                    family: "sqlserver".into(),
                    program: program.to_string(),
                    run_count: *n,
                    run_time_ns: n * 1000,
                    recursion_misses: 0,
                })
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
