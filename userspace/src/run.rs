//! `stalltrace run`: attach, stream records every interval, stop cleanly.

use std::collections::BTreeMap;
use std::io;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

use anyhow::Context;

use crate::cli::{ProbeArgs, RunArgs};
use crate::enrich::Tagger;
use crate::error::UserError;
use crate::host::{self, clock::Clock};
use crate::metrics::{Metrics, Server};
use crate::output::file::Output;
use crate::output::{JsonWriter, OutputQueue};
use crate::probes::stats::program_stats;
use crate::probes::{self, AttachedFamily, Ctx, Family, FamilyFailure, HookStatus};
use crate::records::OUTPUT_LOST;
pub use crate::records::run::FamilyReport;
use crate::records::run::{
    HeartbeatRecord, LostRecord, ProgramCost, StartRecord, StopReason, StopRecord,
};
use crate::records::stall::Phase;
use crate::sqlserver::dmv::{Dmv, DmvConfig};
use crate::sqlserver::live::SqlServer;
use crate::sqlserver::tls::TlsPolicy;
use crate::stall::Detector;

mod bpf_stats;
mod plan;
mod signals;
mod sink;

pub use plan::Plan;
use signals::Signals;
use sink::{STOP_WITHIN, file_budget, finish_output, open_output, output_failed};

/// Per-event records (retransmits, slow I/Os) the stall detector reads per
/// interval at most; past it, they are counted as lost (`stall.records`)
/// rather than held. Each is an `AnyRecord` (888 bytes, the largest variant's
/// size) and its strings, about 1 KiB: this bounds the detector's copy at
/// ~10 MiB in a storm.
const TAP_EVENT_CAP: usize = 10_000;

/// How often the ring buffers are drained between intervals. Events are
/// submitted without a wakeup (a wakeup costs microseconds per event), so this
/// timer is what bounds their delay.
const POLL: Duration = Duration::from_millis(100);

/// Every family this build knows, attached or failed.
pub struct Attached {
    pub families: Vec<Box<dyn Family>>,
    /// SQL Server correlation: kept apart, the other families use it.
    pub sql: Option<SqlServer>,
    pub reports: Vec<FamilyReport>,
    pub hooks: Vec<HookStatus>,
}

/// Attach every family. A family that fails is an error unless `--degrade`.
pub fn attach_all(args: &ProbeArgs, plan: &Plan) -> Result<Attached, UserError> {
    let btf = probes::preflight()?;
    let mut out = Attached {
        families: Vec::new(),
        sql: None,
        reports: Vec::new(),
        hooks: Vec::new(),
    };
    // SQL Server's programs attach first: the programs on one tracepoint run
    // in the order they attached, so its verdict on a retransmission of a
    // session's segment (tcp_retransmit_skb, hooked by both) is in its map
    // before the tcp family's record of the segment is in the ring.
    let sql = match SqlServer::attach(args.probe_mode, plan.sql.clone(), plan.sql_tls, &btf) {
        Err(failure) if !args.degrade => return Err(failure.error),
        sql => sql,
    };
    macro_rules! attach_probes {
        ($($family:ident {
            records: [$($records:tt)*],
            $(attach: $attach:expr,)?
        })*) => {
            $($(accept(
                &mut out,
                stringify!($family),
                attaching(plan, args.probe_mode, &btf, $attach),
                args.degrade,
            )?;)?)*
        };
    }
    with_families!(attach_probes);
    match sql {
        Ok(sql) => {
            report_attached(&mut out, "sqlserver", sql.attached());
            out.sql = Some(sql);
        }
        Err(failure) => report_failed(&mut out, "sqlserver", failure),
    }
    if out.families.is_empty() {
        return Err(UserError::new(
            "no probe family could attach",
            "run `stalltrace check` to see why each probe failed",
        ));
    }
    Ok(out)
}

/// `attach` (a family's, from lib.rs's `with_families!`) run, its family boxed.
fn attaching<P: Family + 'static>(
    plan: &Plan,
    mode: probes::ModeChoice,
    btf: &aya::Btf,
    attach: impl FnOnce(&Plan, probes::ModeChoice, &aya::Btf) -> Result<P, FamilyFailure>,
) -> Result<Box<dyn Family>, FamilyFailure> {
    attach(plan, mode, btf).map(|family| Box::new(family) as Box<dyn Family>)
}

fn accept(
    out: &mut Attached,
    name: &'static str,
    result: Result<Box<dyn Family>, FamilyFailure>,
    degrade: bool,
) -> Result<(), UserError> {
    match result {
        Ok(family) => {
            report_attached(out, name, family.attached());
            out.families.push(family);
            Ok(())
        }
        Err(failure) if degrade => {
            report_failed(out, name, failure);
            Ok(())
        }
        // Returning drops everything attached so far: their links close with their fds.
        Err(failure) => Err(failure.error),
    }
}

fn report_attached(out: &mut Attached, name: &'static str, a: &probes::AttachedFamily) {
    out.hooks.extend(a.hooks.iter().cloned());
    out.reports.push(FamilyReport {
        family: name.to_string(),
        attached: true,
        mode: Some(a.mode),
        fallback_reason: a.fallback_reason.clone(),
        error: None,
    });
}

fn report_failed(out: &mut Attached, name: &'static str, failure: FamilyFailure) {
    out.hooks.extend(failure.hooks);
    out.reports.push(FamilyReport {
        family: name.to_string(),
        attached: false,
        mode: None,
        fallback_reason: None,
        error: Some(failure.error.problem),
    });
}

/// Why the loop ended.
enum Stop {
    /// SIGINT or SIGTERM, noticed at this instant.
    Signal(Instant),
    Duration,
    /// The output failed (disk full, EPIPE, EIO): its error.
    Output(io::Error),
}

pub fn run(args: &RunArgs) -> anyhow::Result<()> {
    // Before anything else: a HUP's default action ends the process, and
    // logrotate may send one at any moment. run_into takes it over.
    signal_hook::flag::register(
        signal_hook::consts::SIGHUP,
        Arc::new(AtomicBool::new(false)),
    )
    .context("installing signal handlers")?;
    run_into(args, open_output(args)?, &mut |_| {})
}

/// Where a run is, after each interval (`investigate` shows it).
pub struct Progress {
    pub elapsed: Duration,
    pub records: u64,
    /// Stall episodes opened so far.
    pub stalls: u64,
}

/// `run`, writing the records to `output`, calling `progress` after each interval.
pub fn run_into(
    args: &RunArgs,
    output: Box<dyn Output>,
    progress: &mut dyn FnMut(&Progress),
) -> anyhow::Result<()> {
    let signals = Signals::install()?;
    let _stats_fd = if args.bpf_stats {
        bpf_stats::enable()?
    } else {
        None
    };
    let (hz, hz_source) = host::kernel::hz();
    let plan = Plan::resolve(args, hz)?;
    // Settings are checked before anything attaches: a bad file is a clean exit.
    let dmv = args
        .sql
        .sql_dmv
        .as_deref()
        .map(|spec| match spec {
            "env" => DmvConfig::from_env(),
            path => DmvConfig::from_file(Path::new(path)),
        })
        .transpose()?;
    // Bound before anything attaches: a port in use is a clean exit.
    let metrics = args
        .prometheus
        .map(|addr| {
            let metrics = Metrics::new(args.prometheus_peers, args.prometheus_containers);
            Server::start(addr, metrics.clone()).map(|server| (metrics, server))
        })
        .transpose()?;
    let Attached {
        mut families,
        mut sql,
        reports,
        hooks,
    } = attach_all(&args.probes, &plan)?;
    if let Some(tls) = sql.as_ref().map(SqlServer::tls_start)
        && let Some(why) = tls.reason.filter(|_| tls.policy != TlsPolicy::Off)
    {
        eprintln!(
            "stalltrace: no SPIDs of encrypted SQL Server sessions from TLS: {why}; they get \
             theirs only from --sql-dmv"
        );
    }
    match (&mut sql, dmv) {
        (Some(sql), Some(config)) => sql.enable_dmv(Dmv::start(config)),
        (None, Some(_)) => eprintln!(
            "stalltrace: no DMV enrichment: the sqlserver family did not attach (see the start record)"
        ),
        _ => {}
    }

    let clock = Clock::new();
    let queue = OutputQueue::start(output, args.out_buffer_kib as usize * 1024)
        .context("starting the output thread")?;
    let mut out = JsonWriter::queued(queue, host::hostname());
    if let Some(budget) = file_budget(args) {
        out.rotate_files(budget);
    }
    if let Some((metrics, _)) = &metrics {
        out.feed(Box::new(metrics.clone()));
    }
    let started = Instant::now();
    let thresholds = args.stalls.thresholds();
    let start = StartRecord {
        version: env!("CARGO_PKG_VERSION").to_string(),
        kernel: host::kernel::release(),
        interval_ms: args.interval.as_millis() as u64,
        duration_ms: args.duration.map(|d| d.as_millis() as u64),
        slow_io_ms: if plan.slow_io.is_some() {
            args.slow_io_ms
        } else {
            0.0
        },
        bpf_stats: args.bpf_stats || host::kernel::bpf_stats_enabled(),
        kernel_hz: hz,
        kernel_hz_source: hz_source.to_string(),
        filters: plan.filters(),
        bulk_mbps: (args.bulk_mbps > 0.0).then_some(args.bulk_mbps),
        prometheus: metrics.as_ref().map(|(_, server)| server.addr),
        stalls: thresholds,
        families: reports,
        probes: hooks,
        sql_tls: sql.as_ref().map(SqlServer::tls_start),
        file: None, // the writer numbers the files after the first
    };
    let mut lost_total = BTreeMap::new();
    let reason = stream(
        args,
        &clock,
        &mut families,
        &mut sql,
        &mut out,
        metrics.as_ref().map(|(m, _)| m),
        &start,
        started,
        &signals,
        &mut lost_total,
        progress,
    )
    .unwrap_or_else(Stop::Output);
    let programs = every_attached(&families, &sql)
        .flat_map(|attached| {
            let name = attached.name;
            program_stats(&attached.ebpf)
                .into_iter()
                .map(move |stats| ProgramCost {
                    family: name.to_string(),
                    ns_per_run: stats.ns_per_run().map(|v| (v * 10.0).round() / 10.0),
                    stats,
                })
        })
        .collect();
    if out.dropped() > 0 {
        lost_total.insert(OUTPUT_LOST.into(), out.dropped());
    }
    let stop_record = StopRecord {
        reason: match reason {
            Stop::Signal(_) => StopReason::Signal,
            Stop::Duration => StopReason::Duration,
            Stop::Output(_) => StopReason::OutputError,
        },
        elapsed_ms: started.elapsed().as_millis() as u64,
        records: out
            .emitted()
            .iter()
            .map(|(kind, n)| ((*kind).to_string(), *n))
            .collect(),
        lost: lost_total,
        programs,
    };
    let ts = Clock::now_rfc3339();
    match reason {
        Stop::Output(e) => {
            // One last try: a disk that was full may have room again.
            if out.direct_after_failure() {
                let _ = out.emit(&ts, &stop_record).and_then(|_| out.flush());
            }
            Err(output_failed(args, &e).into())
        }
        Stop::Signal(noticed) => finish_output(out, &ts, &stop_record, noticed + STOP_WITHIN),
        Stop::Duration => finish_output(out, &ts, &stop_record, Instant::now() + Duration::MAX / 4),
    }
}

/// Every attached family's object and hooks, SQL Server's last: whose
/// programs' run time to report.
fn every_attached<'a>(
    families: &'a [Box<dyn Family>],
    sql: &'a Option<SqlServer>,
) -> impl Iterator<Item = &'a AttachedFamily> {
    families
        .iter()
        .map(|f| f.attached())
        .chain(sql.iter().map(SqlServer::attached))
}

#[allow(clippy::too_many_arguments)]
fn stream(
    args: &RunArgs,
    clock: &Clock,
    families: &mut [Box<dyn Family>],
    sql: &mut Option<SqlServer>,
    out: &mut JsonWriter,
    metrics: Option<&Metrics>,
    start: &StartRecord,
    started: Instant,
    signals: &Signals,
    lost_total: &mut BTreeMap<String, u64>,
    progress: &mut dyn FnMut(&Progress),
) -> io::Result<Stop> {
    let start_ts = Clock::now_rfc3339();
    out.emit(&start_ts, start)?;
    out.flush()?;
    let mut stalls_opened = 0;
    let mut detector = start.stalls.as_ref().map(|th| {
        out.tap(crate::stall::tapped, TAP_EVENT_CAP);
        Detector::new(th.clone(), &start_ts)
    });
    let deadline = args.duration.map(|d| started + d);
    let mut last_collect = started;
    let mut next_collect = started + args.interval;
    loop {
        let now = Instant::now();
        let wake = [Some(next_collect), deadline, Some(now + POLL)]
            .into_iter()
            .flatten()
            .min()
            .unwrap();
        signals.sleep(wake.saturating_duration_since(now).min(POLL));

        if signals.take_reopen() {
            out.reopen(&Clock::now_rfc3339())?;
        }
        let finished = if signals.stopping() {
            Some(Stop::Signal(Instant::now()))
        } else if deadline.is_some_and(|d| Instant::now() >= d) {
            Some(Stop::Duration)
        } else {
            None
        };
        for family in families.iter_mut() {
            let mut ctx = Ctx {
                clock,
                sql: sql.as_mut().map(|s| s as &mut dyn Tagger),
            };
            family.drain_events(&mut ctx, out)?;
            // What a miss made discovery find, after the records that missed.
            if let Some(sql) = sql.as_mut() {
                sql.emit_news(out)?;
            }
        }
        if let Some(sql) = sql.as_mut() {
            sql.poll(&Clock::now_rfc3339());
        }
        let now = Instant::now();
        if now >= next_collect || finished.is_some() {
            let interval = now - last_collect;
            let ts = Clock::now_rfc3339();
            let mut lost = BTreeMap::new();
            let written_before: u64 = out.emitted().values().sum();
            // SQL Server first: the other families tag their records with what it found.
            if let Some(sql) = sql.as_mut() {
                sql.refresh(&ts);
                sql.emit_news(out)?;
                sql.emit_requests(interval.as_millis() as u64, &ts, out)?;
                for (source, n) in sql.lost() {
                    *lost.entry(source.clone()).or_insert(0) += n;
                    *lost_total.entry(source).or_insert(0) += n;
                }
            }
            for family in families.iter_mut() {
                let mut ctx = Ctx {
                    clock,
                    sql: sql.as_mut().map(|s| s as &mut dyn Tagger),
                };
                family.collect(interval, &ts, &mut ctx, out)?;
                for (source, n) in family.lost() {
                    *lost.entry(source.clone()).or_insert(0) += n;
                    *lost_total.entry(source).or_insert(0) += n;
                }
            }
            if let Some(metrics) = metrics {
                for attached in every_attached(families, sql) {
                    metrics.programs(attached.name, &program_stats(&attached.ebpf));
                }
            }
            if let Some(detector) = detector.as_mut() {
                let (records, untapped) = out.take_tapped();
                if untapped > 0 {
                    *lost.entry("stall.records".into()).or_insert(0) += untapped;
                    *lost_total.entry("stall.records".into()).or_insert(0) += untapped;
                }
                let ms = interval.as_secs_f64() * 1000.0;
                for stall in detector.interval(records, &ts, ms) {
                    stalls_opened += u64::from(stall.phase == Phase::Open);
                    out.emit(&ts, &stall)?;
                }
                if finished.is_some() {
                    for stall in detector.finish() {
                        out.emit(&ts, &stall)?;
                    }
                }
            }
            // Records the output queue dropped: said once there is room again
            // (a dropped `lost` record leaves them to the next one).
            let dropped = out.dropped_unreported();
            if dropped > 0 {
                lost.insert(OUTPUT_LOST.into(), dropped);
            }
            if !lost.is_empty() {
                let record = LostRecord {
                    interval_ms: interval.as_millis() as u64,
                    by_source: lost.clone(),
                };
                if out.emit(&ts, &record)? {
                    out.reported_dropped(dropped);
                }
            }
            if out.emitted().values().sum::<u64>() == written_before {
                let interval_ms = interval.as_millis() as u64;
                out.emit(&ts, &HeartbeatRecord { interval_ms })?;
            }
            out.flush()?;
            progress(&Progress {
                elapsed: started.elapsed(),
                records: out.emitted().values().sum(),
                stalls: stalls_opened,
            });
            last_collect = now;
            while next_collect <= now {
                next_collect += args.interval;
            }
        }
        if let Some(reason) = finished {
            return Ok(reason);
        }
    }
}

#[cfg(test)]
mod tests {
    /// A family registered without an `attach` would never be attached by a
    /// run: only SQL Server's correlation, attached apart and first, may be.
    /// `start` lists the families as `attach_all` reports them, the
    /// correlation last: so must the registration, whose order `FAMILIES`,
    /// the schema and the report's inferred families take.
    #[test]
    fn the_run_attaches_every_registered_family() {
        macro_rules! attached_through_family {
            ($($family:ident {
                records: [$($records:tt)*],
                $(attach: $attach:expr,)?
            })*) => {
                &[$($((stringify!($family), stringify!($attach)).0,)?)*]
            };
        }
        let through_family: &[&str] = with_families!(attached_through_family);
        let mut reported: Vec<&str> = through_family.to_vec();
        reported.push("sqlserver");
        assert_eq!(
            reported,
            crate::records::FAMILIES,
            "families as run::attach_all reports them vs as lib.rs registers them"
        );
    }
}
