//! The tls suite's figures: per round and BIO style, the worker's CPU per
//! response in each configuration and what differs between them (the
//! uprobes' cost: `always` − `off`; stalltrace's without them: `off` over
//! none), the programs' own run time from the accounting runs, and the
//! rest of the uprobes' cost, outside any program (the trap); then the
//! medians over the rounds with their 95% intervals (`stats`).

use std::collections::BTreeMap;

use serde::Serialize;

use super::drive::uprobe_runs;
use super::workload::{Run, tick_s};
use super::{ALWAYS, BATCH_SQL, Bio, Measured, OFF, SESSIONS, Settings, TracedRun, daemon_args};
use crate::bench::publish::Host;
use crate::bench::stats::{Estimate, Summary, summary};
use crate::bench::tracer::ProgramCost;
use crate::bench::tracer::programs::{self, ProgramTotal};

/// A figure in each of a round's five runs of one BIO style.
#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Configs<T> {
    pub none: T,
    pub off: T,
    pub always: T,
    pub off_bpf_stats: T,
    pub always_bpf_stats: T,
}

/// One round of one BIO style.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Round {
    /// The worker's CPU per response, µs.
    pub cpu_us: Configs<f64>,
    pub tps: Configs<f64>,
    /// The uprobes' cost per response, µs: `always` − `off`, as deployed.
    pub uprobe_us: f64,
    /// The same in % of the worker's CPU per response under `off`.
    pub uprobe_pct_of_off: f64,
    /// Worker CPU per response over no stalltrace's.
    pub off_over_none: f64,
    pub always_over_none: f64,
    pub tps_always_over_off: f64,
    pub tps_off_over_none: f64,
    /// With the accounting on: the uprobe programs' ns per call, and per response.
    pub uprobe_program_ns_per_call: f64,
    pub uprobe_programs_ns_per_response: f64,
    /// Every other program's run time per response, `always` − `off` (the
    /// send hook pairing a watched worker's TLS sends with its writes).
    pub other_programs_extra_ns_per_response: f64,
    /// What is left of `uprobe_us` outside any program: the trap, the
    /// kernel's uprobe handling and the return to the worker.
    pub outside_programs_ns_per_response: f64,
    /// Every program of the daemon, per response, host-wide (the client's
    /// sends run the tcp and sqlserver send hooks too).
    pub bpf_ns_per_response_off: f64,
    pub bpf_ns_per_response_always: f64,
    /// The uprobe programs' runs over the responses in the accounting run.
    pub uprobe_runs_per_response: f64,
    /// Under `off`: the sqlserver family's socket hooks (the SPID from the
    /// send, and each request's timing from its connection's turns), per
    /// response, host-wide: what timing the requests costs.
    pub sql_socket_ns_per_response_off: f64,
}

fn total_ns(programs: &[ProgramCost], keep: impl Fn(&ProgramCost) -> bool) -> u64 {
    programs
        .iter()
        .filter(|p| keep(p))
        .map(|p| p.run_time_ns)
        .sum()
}

fn is_uprobe(p: &ProgramCost) -> bool {
    super::UPROBE_PROGRAMS.contains(&p.program.as_str())
}

fn is_sql_socket_hook(p: &ProgramCost) -> bool {
    p.family == "sqlserver" && !is_uprobe(p)
}

impl Round {
    /// The figures of one round from its five runs of one BIO style.
    pub fn of(
        none: &Run,
        off: &TracedRun,
        always: &TracedRun,
        off_stats: &TracedRun,
        always_stats: &TracedRun,
    ) -> Self {
        let cpu_us = Configs {
            none: none.cpu_us_per_response(),
            off: off.run.cpu_us_per_response(),
            always: always.run.cpu_us_per_response(),
            off_bpf_stats: off_stats.run.cpu_us_per_response(),
            always_bpf_stats: always_stats.run.cpu_us_per_response(),
        };
        let tps = Configs {
            none: none.tps,
            off: off.run.tps,
            always: always.run.tps,
            off_bpf_stats: off_stats.run.tps,
            always_bpf_stats: always_stats.run.tps,
        };
        let per = |ns: u64, run: &Run| ns as f64 / run.responses as f64;
        let (uprobe_calls, uprobe_ns) = uprobe_runs(&always_stats.programs);
        let uprobe_per_response = per(uprobe_ns, &always_stats.run);
        let others = |r: &TracedRun| per(total_ns(&r.programs, |p| !is_uprobe(p)), &r.run);
        let other_extra = others(always_stats) - others(off_stats);
        let uprobe_us = cpu_us.always - cpu_us.off;
        let all = |r: &TracedRun| per(total_ns(&r.programs, |_| true), &r.run);
        Round {
            uprobe_us,
            uprobe_pct_of_off: 100.0 * uprobe_us / cpu_us.off,
            off_over_none: cpu_us.off / cpu_us.none,
            always_over_none: cpu_us.always / cpu_us.none,
            tps_always_over_off: tps.always / tps.off,
            tps_off_over_none: tps.off / tps.none,
            uprobe_program_ns_per_call: uprobe_ns as f64 / uprobe_calls as f64,
            uprobe_programs_ns_per_response: uprobe_per_response,
            other_programs_extra_ns_per_response: other_extra,
            outside_programs_ns_per_response: uprobe_us * 1e3 - uprobe_per_response - other_extra,
            bpf_ns_per_response_off: all(off_stats),
            bpf_ns_per_response_always: all(always_stats),
            uprobe_runs_per_response: per(uprobe_calls, &always_stats.run),
            sql_socket_ns_per_response_off: per(
                total_ns(&off_stats.programs, is_sql_socket_hook),
                &off_stats.run,
            ),
            cpu_us,
            tps,
        }
    }
}

/// One program over every accounting run of one configuration.
#[derive(Serialize)]
pub struct ProgramRow {
    #[serde(flatten)]
    pub total: ProgramTotal,
    pub runs_per_response: f64,
}

#[derive(Serialize)]
pub struct BioResult {
    pub bio: Bio,
    /// The libssl function a response goes through, and its program.
    pub symbol: &'static str,
    pub program: &'static str,
    /// The configurations' own figures: median and range over the rounds.
    pub cpu_us: Configs<Summary>,
    pub tps: Configs<Summary>,
    pub p50_us: Configs<Summary>,
    /// Per-round figures: median over the rounds with a 95% interval.
    pub uprobe_us: Option<Estimate>,
    pub uprobe_pct_of_off: Option<Estimate>,
    pub off_over_none: Option<Estimate>,
    pub always_over_none: Option<Estimate>,
    pub tps_always_over_off: Option<Estimate>,
    pub tps_off_over_none: Option<Estimate>,
    pub uprobe_program_ns_per_call: Option<Estimate>,
    pub uprobe_programs_ns_per_response: Option<Estimate>,
    pub other_programs_extra_ns_per_response: Option<Estimate>,
    pub outside_programs_ns_per_response: Option<Estimate>,
    pub bpf_ns_per_response_off: Option<Estimate>,
    pub bpf_ns_per_response_always: Option<Estimate>,
    pub sql_socket_ns_per_response_off: Option<Estimate>,
    /// The uprobe programs' runs over the responses, every accounting run
    /// under `always` (1 when each response trapped once).
    pub uprobe_runs_per_response: Summary,
    /// The daemon's CPU while the client ran (as deployed), % of one core.
    pub daemon_cpu_pct_off: Summary,
    pub daemon_cpu_pct_always: Summary,
    /// Programs that ran, over every accounting run of `off` and of `always`.
    pub programs_off: Vec<ProgramRow>,
    pub programs_always: Vec<ProgramRow>,
    pub rounds: Vec<Round>,
}

fn estimate(rounds: &[Round], f: impl Fn(&Round) -> f64) -> Option<Estimate> {
    Estimate::of(rounds.iter().map(f))
}

/// Programs that ran over `runs`, with their runs per response.
fn program_rows(runs: &[TracedRun]) -> Vec<ProgramRow> {
    let responses: u64 = runs.iter().map(|r| r.run.responses).sum();
    programs::sum(runs.iter().flat_map(|r| &r.programs), |_| true)
        .into_values()
        .filter(|p| p.run_count > 0)
        .map(|p| ProgramRow {
            runs_per_response: p.run_count as f64 / responses.max(1) as f64,
            total: ProgramTotal::from(p),
        })
        .collect()
}

impl BioResult {
    fn of(b: &super::BioRuns) -> Self {
        let (off, always) = (&b.daemons[OFF], &b.daemons[ALWAYS]);
        let rounds: Vec<Round> = (0..b.untraced.len())
            .map(|i| {
                Round::of(
                    &b.untraced[i],
                    &off.plain[i],
                    &always.plain[i],
                    &off.bpf_stats[i],
                    &always.bpf_stats[i],
                )
            })
            .collect();
        let by_config = |f: &dyn Fn(&Run) -> f64| Configs {
            none: summary(b.untraced.iter().map(f)),
            off: summary(off.plain.iter().map(|r| f(&r.run))),
            always: summary(always.plain.iter().map(|r| f(&r.run))),
            off_bpf_stats: summary(off.bpf_stats.iter().map(|r| f(&r.run))),
            always_bpf_stats: summary(always.bpf_stats.iter().map(|r| f(&r.run))),
        };
        let daemon_cpu =
            |runs: &[TracedRun]| summary(runs.iter().map(|r| r.usage.cpu_pct_of_one_cpu()));
        BioResult {
            bio: b.part,
            symbol: b.part.symbol(),
            program: b.part.program(),
            cpu_us: by_config(&Run::cpu_us_per_response),
            tps: by_config(&|r| r.tps),
            p50_us: by_config(&|r| r.p50_us as f64),
            uprobe_us: estimate(&rounds, |r| r.uprobe_us),
            uprobe_pct_of_off: estimate(&rounds, |r| r.uprobe_pct_of_off),
            off_over_none: estimate(&rounds, |r| r.off_over_none),
            always_over_none: estimate(&rounds, |r| r.always_over_none),
            tps_always_over_off: estimate(&rounds, |r| r.tps_always_over_off),
            tps_off_over_none: estimate(&rounds, |r| r.tps_off_over_none),
            uprobe_program_ns_per_call: estimate(&rounds, |r| r.uprobe_program_ns_per_call),
            uprobe_programs_ns_per_response: estimate(&rounds, |r| {
                r.uprobe_programs_ns_per_response
            }),
            other_programs_extra_ns_per_response: estimate(&rounds, |r| {
                r.other_programs_extra_ns_per_response
            }),
            outside_programs_ns_per_response: estimate(&rounds, |r| {
                r.outside_programs_ns_per_response
            }),
            bpf_ns_per_response_off: estimate(&rounds, |r| r.bpf_ns_per_response_off),
            bpf_ns_per_response_always: estimate(&rounds, |r| r.bpf_ns_per_response_always),
            sql_socket_ns_per_response_off: estimate(&rounds, |r| r.sql_socket_ns_per_response_off),
            uprobe_runs_per_response: summary(rounds.iter().map(|r| r.uprobe_runs_per_response)),
            daemon_cpu_pct_off: daemon_cpu(&off.plain),
            daemon_cpu_pct_always: daemon_cpu(&always.plain),
            programs_off: program_rows(&off.bpf_stats),
            programs_always: program_rows(&always.bpf_stats),
            rounds,
        }
    }
}

#[derive(Serialize)]
pub struct TlsResults {
    pub host: Host,
    /// The commit the binaries were built from, and whether the tree differed.
    pub source: String,
    pub command: &'static str,
    pub wall_time_s: f64,
    pub rounds: usize,
    pub runtime_s: u64,
    pub server_command: String,
    pub client_command: String,
    pub daemon_commands: Vec<String>,
    pub load_average_before: String,
    pub load_average_after: String,
    pub bios: Vec<BioResult>,
    /// Runs under `always` (as deployed and with the accounting) whose
    /// uprobes were checked attached, and runs under `off` checked without.
    pub always_runs_checked: usize,
    pub off_runs_checked: usize,
    /// Attempts run again because the host was not quiet, and why.
    pub disturbed: Vec<String>,
    pub quiet_wait_s: f64,
    /// The most steal time in any run, % of the run's CPU time.
    pub max_steal_pct: f64,
    /// One clock tick of /proc/PID/stat in % of the least worker CPU of any run.
    pub tick_pct_of_worker_cpu: f64,
    pub daemon_lifetime_cpu_s: Summary,
    pub lost: BTreeMap<String, u64>,
    pub warnings: Vec<String>,
}

pub fn aggregate(
    settings: &Settings,
    m: Measured,
    (host, source): (Host, String),
    wall_time_s: f64,
    [load_before, load_after]: [String; 2],
) -> TlsResults {
    let bios: Vec<BioResult> = m.runs.parts.iter().map(BioResult::of).collect();
    let checked = |config: usize| -> usize {
        let d = m.runs.parts.iter().map(|b| &b.daemons[config]);
        d.map(|d| d.plain.len() + d.bpf_stats.len()).sum()
    };
    let (always_runs_checked, off_runs_checked) = (checked(ALWAYS), checked(OFF));
    // Every client run of the suite, whatever its configuration.
    let every_run = || {
        m.runs.parts.iter().flat_map(|b| {
            let traced = b
                .daemons
                .iter()
                .flat_map(|d| d.plain.iter().chain(&d.bpf_stats));
            b.untraced.iter().chain(traced.map(|r| &r.run))
        })
    };
    let max_steal_pct = every_run().map(|r| r.steal_pct).fold(0.0, f64::max);
    let least_worker_cpu_s = every_run()
        .map(|r| r.worker_cpu_s)
        .fold(f64::INFINITY, f64::min);
    TlsResults {
        host,
        source,
        command: "cargo xtask bench tls",
        wall_time_s,
        rounds: settings.rounds,
        runtime_s: settings.runtime_s,
        server_command: "sqlservr --listen 127.0.0.1:0 --data F.mdf --log F.ldf \
                         --data-size-mb 16 --log-size-mb 4 --tls-bio {memory,socket}"
            .into(),
        client_command: format!(
            "sqlclient --server 127.0.0.1:PORT --encrypt on --rate 0 --sessions {SESSIONS} \
             --duration {} --batch-sql '{BATCH_SQL}'",
            settings.runtime_s
        ),
        daemon_commands: ["off", "always"]
            .iter()
            .map(|p| format!("stalltrace {} --out FILE", daemon_args(p).join(" ")))
            .collect(),
        load_average_before: load_before,
        load_average_after: load_after,
        bios,
        always_runs_checked,
        off_runs_checked,
        disturbed: m.disturbed,
        quiet_wait_s: m.quiet_wait_s,
        max_steal_pct,
        tick_pct_of_worker_cpu: 100.0 * tick_s() / least_worker_cpu_s,
        daemon_lifetime_cpu_s: summary(m.runs.daemons.iter().map(|d| d.lifetime_cpu_s)),
        lost: programs::lost(m.runs.daemons.iter().map(|d| &d.stop)),
        warnings: m.runs.warnings,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bench::paired::{Accounted, ProcessUse};
    use crate::bench::parts::fixtures::cost;

    fn run(cpu_s: f64, transactions: u64, tps: f64) -> Run {
        Run {
            bio: Bio::Socket,
            transactions,
            logins: 2,
            responses: transactions + 4,
            tps,
            p50_us: 50,
            worker_cpu_s: cpu_s,
            seconds: 2.0,
            steal_pct: 0.0,
            our_uprobes: 0,
        }
    }

    fn traced(run: Run, programs: &[(&str, u64, u64)]) -> TracedRun {
        TracedRun {
            run,
            programs: programs
                .iter()
                .map(|(program, run_count, run_time_ns)| ProgramCost {
                    run_time_ns: *run_time_ns,
                    ..cost("sqlserver", program, *run_count, 0)
                })
                .collect(),
            usage: ProcessUse::default(),
        }
    }

    /// 20 000 responses each: 25 µs of worker CPU per response untraced, 27
    /// under `off`, 37 under `always`; with the accounting the uprobe
    /// program runs once per response at 1000 ns, and the send hook costs
    /// 700 ns per response under `off` and 900 under `always`.
    #[test]
    fn the_uprobes_cost_is_always_minus_off_split_into_programs_and_trap() {
        let none = run(0.5, 19_996, 10_000.0);
        let off = traced(run(0.54, 19_996, 9_000.0), &[]);
        let always = traced(run(0.74, 19_996, 7_200.0), &[]);
        let off_stats = traced(
            run(0.56, 19_996, 8_800.0),
            &[
                ("on_ssl_write", 0, 0),
                ("on_tcp_sendmsg_locked", 40_000, 14_000_000),
            ],
        );
        let always_stats = traced(
            run(0.78, 19_996, 7_000.0),
            &[
                ("on_ssl_write", 20_000, 20_000_000),
                ("on_ssl_write_ex", 0, 0),
                ("on_tcp_sendmsg_locked", 40_000, 18_000_000),
            ],
        );
        let r = Round::of(&none, &off, &always, &off_stats, &always_stats);
        let near = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(near(r.cpu_us.none, 25.0) && near(r.cpu_us.off, 27.0));
        assert!(near(r.cpu_us.always, 37.0) && near(r.cpu_us.always_bpf_stats, 39.0));
        assert!(near(r.uprobe_us, 10.0), "{}", r.uprobe_us);
        assert!(near(r.uprobe_pct_of_off, 100.0 * 10.0 / 27.0));
        assert!(near(r.off_over_none, 27.0 / 25.0) && near(r.always_over_none, 37.0 / 25.0));
        assert!(near(r.tps_always_over_off, 0.8) && near(r.tps_off_over_none, 0.9));
        assert!(near(r.uprobe_program_ns_per_call, 1000.0));
        assert!(near(r.uprobe_programs_ns_per_response, 1000.0));
        assert!(near(r.other_programs_extra_ns_per_response, 200.0));
        // 10 µs in all: 1000 ns in the program, 200 more in the send hook,
        // the rest outside any program.
        assert!(near(r.outside_programs_ns_per_response, 8800.0));
        assert!(near(r.bpf_ns_per_response_off, 700.0));
        // Every program here is the sqlserver family's; the uprobes are not
        // socket hooks.
        assert!(near(r.sql_socket_ns_per_response_off, 700.0));
        assert!(near(r.bpf_ns_per_response_always, 1900.0));
        assert!(near(r.uprobe_runs_per_response, 1.0));

        // Over rounds: medians with intervals, and the programs that ran.
        let six = |r: &TracedRun| (0..6).map(|_| r.clone()).collect();
        let b = super::super::BioRuns {
            part: Bio::Socket,
            untraced: vec![none; 6],
            daemons: vec![
                Accounted {
                    plain: six(&off),
                    bpf_stats: six(&off_stats),
                },
                Accounted {
                    plain: six(&always),
                    bpf_stats: six(&always_stats),
                },
            ],
            peers: Vec::new(),
            floor: Vec::new(),
        };
        let res = BioResult::of(&b);
        assert_eq!(res.rounds.len(), 6);
        let e = res.uprobe_us.unwrap();
        assert!(near(e.median, 10.0) && e.ci.is_some());
        assert!(near(res.cpu_us.always.median, 37.0));
        assert_eq!(res.program, "on_ssl_write");
        let names: Vec<String> = res.programs_always.iter().map(|p| p.total.name()).collect();
        assert_eq!(
            names,
            ["sqlserver/on_ssl_write", "sqlserver/on_tcp_sendmsg_locked"],
            "programs that never ran are left out"
        );
        assert!(near(res.programs_always[0].runs_per_response, 1.0));
        assert!(near(res.programs_off[0].runs_per_response, 2.0));
    }
}
