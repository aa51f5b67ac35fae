//! A [`Report`] built from a record stream: what the run was, whether the
//! stream is whole and what it lost, and every section the renderers show.
//!
//! Records are read as JSON values up to `whole`, which checks the envelope
//! and dispatches each record by its `type` into its record type
//! (`crate::records`, through `typed`: the one boundary, with its policy for
//! older streams). Record types this version does not know are counted and
//! ignored, fields it does not know are skipped, and records of a known type
//! that do not fit it are counted as unreadable. Only a different schema
//! *major* in `start` (or, in a stream without one, in the records) is
//! refused, since fields may have changed meaning then.

use std::collections::BTreeMap;
use std::io::BufRead;

use serde_json::Value;

use super::episodes::{Episode, Episodes};
use super::error::ReportError;
use super::field;
use super::health::StreamHealth;
use super::lines::LineRef;
use super::network::{BulkFlow, Interface, Network, Retransmits, TcpPeer};
use super::requests::{InstanceRequests, Requests};
use super::run::{Inference, RunInfo};
use super::sessions::{Instance, SessionImpact, Sessions};
use super::split::Reassembly;
use super::storage::{Disk, Disks};
use super::typed::read;
use super::window::Window;
use crate::records::AnyRecord;

pub(in crate::report) mod envelope;

/// Events and measurements the run could not deliver (`lost`, `stop.lost`).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Losses {
    /// Source -> total over the run: `stop.lost` when the stream has a `stop`
    /// (it is the authority), else the sum of the `lost` records.
    pub by_source: BTreeMap<String, u64>,
    /// `lost` records: intervals in which anything was lost.
    pub intervals: u64,
}

impl Losses {
    pub fn total(&self) -> u64 {
        self.by_source.values().sum()
    }

    pub fn any(&self) -> bool {
        self.total() > 0
    }
}

/// Everything the renderers show, for one run.
#[derive(Clone, Debug)]
pub struct Report {
    pub run: RunInfo,
    pub stream: StreamHealth,
    pub losses: Losses,
    pub instances: Vec<Instance>,
    pub disks: Vec<Disk>,
    pub interfaces: Vec<Interface>,
    /// Worst first.
    pub peers: Vec<TcpPeer>,
    pub retransmits: Retransmits,
    pub flows: Vec<BulkFlow>,
    /// Ranked by impact, largest first.
    pub episodes: Vec<Episode>,
    /// Ranked by time lost, largest first.
    pub sessions: Vec<SessionImpact>,
    /// Each SQL Server instance's requests, by worker pid.
    pub requests: Vec<InstanceRequests>,
}

impl Report {
    /// An episode's place in the ranking (1 = most impact), as every view numbers it.
    pub fn rank_of(&self, id: u64) -> Option<usize> {
        self.episodes.iter().position(|e| e.id == id).map(|i| i + 1)
    }
}

/// Lines of a clearly non-JSON file read before giving up on it.
const GIVE_UP_AFTER_BAD_LINES: usize = 100;
const BAD_LINES_LISTED: usize = 5;

/// Builds a [`Report`] one record (or line) at a time, so a long recording
/// never has to be held in memory.
#[derive(Default)]
pub struct ReportBuilder {
    run: Option<RunInfo>,
    health: StreamHealth,
    parsed: usize,
    first_bad_line: Option<usize>,
    found: BTreeMap<String, u64>,
    written: Option<BTreeMap<String, u64>>,
    lost_sum: BTreeMap<String, u64>,
    stop_lost: Option<BTreeMap<String, u64>>,
    interval_ends: std::collections::BTreeSet<i64>,
    last_ts_us: i64,
    /// Another run began: nothing more is read.
    done: bool,
    /// `run` of the run being reported (schema 2), from its `start` (or,
    /// without one, from its records).
    run_id: Option<String>,
    /// What the records say of a run whose `start` is not in the stream.
    inference: Inference,
    /// The run's `start` came from a later file than the records read first
    /// (a copytruncate tail placed before it): the run began before it.
    primed: bool,
    /// The file being read: an index into `health.files`.
    file: usize,
    /// Nothing read yet from the current file: no record, no record with a seqno.
    first_record_in_file: bool,
    first_seqno_in_file: bool,
    /// A file's last line that stopped mid-record: a bad line once another file follows.
    cut_line: Option<LineRef>,
    /// `run` of the record where another run began.
    next_run_id: Option<String>,
    split: Reassembly,
    disks: Disks,
    network: Network,
    episodes: Episodes,
    sessions: Sessions,
    requests: Requests,
    /// Lines given to `push_line` so far.
    pushed: usize,
    /// `report --since/--until`: measurements outside it are not read.
    window: Option<Window>,
}

/// The record types that measure a moment or an interval: those outside a
/// `--since/--until` window are left out. The run's own records (`start`,
/// `stop`), the SQL Server's state and the episodes (kept when they overlap
/// the window) are read whatever their time.
const MEASUREMENTS: [&str; 9] = [
    "block",
    "sql_requests",
    "slow_io",
    "netdev",
    "tcp_rtt",
    "tcp_retransmit",
    "tcp_flow",
    "lost",
    "heartbeat",
];

impl Report {
    /// A report from records already parsed (e.g. `investigate`'s own).
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = &'a Value>,
    ) -> Result<Self, ReportError> {
        let mut b = ReportBuilder::default();
        for (i, r) in records.into_iter().enumerate() {
            b.health.lines += 1;
            b.current_file().lines += 1;
            b.record(
                r,
                LineRef {
                    file: 0,
                    line: i + 1,
                },
                0,
            )?;
        }
        b.finish()
    }

    /// A report from JSON lines. A line that is not JSON is counted and
    /// skipped (a stream cut by a crash is normal), not an error.
    pub fn from_reader(reader: impl BufRead) -> Result<Self, ReportError> {
        let mut b = ReportBuilder::default();
        b.read_lines(reader)?;
        b.finish()
    }

    pub fn from_text(text: &str) -> Result<Self, ReportError> {
        Self::from_reader(text.as_bytes())
    }
}

impl ReportBuilder {
    /// A builder that reads only what falls in `window` (see [`MEASUREMENTS`]).
    pub fn within(window: Option<Window>) -> Self {
        Self {
            window,
            ..Self::default()
        }
    }

    /// One complete line of a stream as it is written (without its newline),
    /// for a caller that builds the report while recording.
    pub fn push_line(&mut self, line: &str) -> Result<(), ReportError> {
        if self.done {
            return Ok(());
        }
        self.pushed += 1;
        self.line(self.pushed, line, true)
    }

    /// The report of every line pushed.
    pub fn build(self) -> Result<Report, ReportError> {
        self.finish()
    }

    fn note_bad(&mut self, at: LineRef) {
        self.health.bad_lines += 1;
        if self.health.first_bad_lines.len() < BAD_LINES_LISTED {
            self.health.first_bad_lines.push(at);
        }
    }

    /// A record of a known type that does not fit it (see `typed`).
    fn unreadable(&mut self, kind: &str) {
        *self.health.unreadable.entry(kind.to_string()).or_default() += 1;
    }

    /// A whole record of the run (put back together when it was written in
    /// parts), past the envelope's checks (see `envelope`).
    fn whole(&mut self, r: &Value, at: LineRef) -> Result<(), ReportError> {
        let Some(kind) = field::kind(r) else {
            self.note_bad(at);
            return Ok(());
        };
        if kind == "start" && self.run.as_ref().is_none_or(|run| run.inferred) {
            let mut info = super::run::run_info(r)?;
            if let Some(inferred) = self.run.take() {
                // The run's `start` after records of the run read without
                // it (a copytruncate tail piped in before the next file):
                // the run began before it, as with `prime_start`.
                info.start_us = info.start_us.min(inferred.start_us);
                self.primed = true;
            }
            self.run = Some(info);
            self.run_id = field::run(r).map(String::from);
            self.health
                .sequence
                .run_file(field::file(r).unwrap_or(0), at);
        } else if kind == "start" {
            // The same run's `start` repeated at the head of a new file
            // (`envelope` sent another run's elsewhere).
            self.health
                .sequence
                .run_file(field::file(r).unwrap_or(0), at);
        }
        let Some(run) = self.run.as_mut() else {
            self.health.before_start += 1;
            return Ok(());
        };
        let ts_us = field::ts_us(r).unwrap_or(self.last_ts_us);
        self.last_ts_us = self.last_ts_us.max(ts_us);
        if self.primed {
            run.start_us = run.start_us.min(ts_us);
        }
        if run.inferred {
            self.inference.family(kind);
        }
        // Counted as `stop.records` counts: a record written in parts once.
        if kind != "stop" {
            *self.found.entry(kind.to_string()).or_default() += 1;
        }
        if self
            .window
            .is_some_and(|w| !w.contains(ts_us) && MEASUREMENTS.contains(&kind))
        {
            return Ok(());
        }
        // The records that end an interval mark it, read or not.
        if matches!(kind, "block" | "netdev" | "tcp_rtt" | "lost" | "heartbeat") {
            self.interval_ends.insert(ts_us);
        }
        let Some(record) = read(kind, r) else {
            *self
                .health
                .unknown_types
                .entry(kind.to_string())
                .or_default() += 1;
            return Ok(());
        };
        let Some(record) = record else {
            // A stall the episodes cannot use was a bad line before records
            // were typed; it stays one.
            match kind {
                "stall" => self.note_bad(at),
                _ => self.unreadable(kind),
            }
            return Ok(());
        };
        match record {
            // Read by `run_info` above (or for the run's first file).
            AnyRecord::Start(_) => {}
            AnyRecord::Block(b) => {
                self.inference.interval(b.interval_ms);
                self.disks.block(&b, ts_us)
            }
            AnyRecord::SlowIo(s) => {
                self.disks.slow_io(&s, ts_us);
                if let Some(tag) = &s.sql {
                    self.sessions.slow_io(u64::from(tag.pid), s.file.clone());
                }
            }
            AnyRecord::Netdev(n) => {
                self.inference.interval(n.interval_ms);
                self.network.netdev(&n, ts_us)
            }
            AnyRecord::TcpRtt(t) => {
                self.inference.interval(t.interval_ms);
                self.network.tcp_rtt(&t)
            }
            AnyRecord::TcpRetransmit(t) => {
                let waited = self.network.tcp_retransmit(&t);
                if let Some(tag) = &t.sql {
                    self.sessions.retransmit(tag, u64::from(t.segs), waited);
                }
            }
            AnyRecord::TcpFlow(t) => {
                self.inference.interval(t.interval_ms);
                self.network.tcp_flow(&t, ts_us)
            }
            AnyRecord::SqlInstance(i) => self.sessions.instance(&i),
            AnyRecord::SqlSession(s) => self.sessions.session(&s),
            AnyRecord::SqlRequests(q) => {
                self.inference.interval(q.interval_ms);
                self.requests.add(&q, ts_us)
            }
            AnyRecord::Stall(s) => {
                let usable = self.episodes.add(&s);
                if !usable {
                    self.note_bad(at);
                }
            }
            AnyRecord::Lost(l) => {
                self.inference.interval(l.interval_ms);
                add_counts(&mut self.lost_sum, &l.by_source)
            }
            AnyRecord::Heartbeat(h) => self.inference.interval(h.interval_ms),
            AnyRecord::Stop(stop) => {
                self.health.has_stop = true;
                run.end_us = ts_us;
                run.stop_reason = Some(stop.reason.name().to_string());
                self.written = Some(stop.records);
                self.stop_lost = Some(stop.lost);
            }
            // A family's records no section reads (none today: a family
            // registered later): the family itself is in the header, from
            // `start` or inferred from its record types.
            #[allow(unreachable_patterns)]
            _ => {}
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Report, ReportError> {
        self.split.finish();
        self.health.split = std::mem::take(&mut self.split.health);
        let Some(mut run) = self.run.take() else {
            return Err(
                match (self.health.lines, self.parsed, self.first_bad_line) {
                    (0, _, _) => ReportError::Empty,
                    (_, 0, Some(line)) => ReportError::NotJsonLines { line },
                    (_, records, _) => ReportError::NoStart {
                        records: records.max(self.health.before_start),
                    },
                },
            );
        };
        if !self.health.has_stop {
            run.end_us = self.last_ts_us.max(run.start_us);
        }
        run.intervals = self.interval_ends.len() as u64;
        if let Some(w) = self.window
            && !(w.contains(run.start_us) && w.contains(run.end_us))
        {
            run.whole_run = Some((run.start_us, run.end_us));
            run.start_us = run.start_us.max(w.since_us).min(run.end_us);
            run.end_us = run.end_us.min(w.until_us).max(run.start_us);
        }
        self.inference.apply(&mut run);
        if let Some(written) = &self.written {
            self.health.compare_written(written, &self.found);
        }
        let losses = Losses {
            // stop.lost is the run's own total; the lost records can be
            // missing from a cut file. Take the larger, source by source
            // (over the whole run only: a window has its own records' sum).
            by_source: match self.window {
                Some(_) => self.lost_sum,
                None => merge_max(self.lost_sum, self.stop_lost.unwrap_or_default()),
            },
            intervals: self.found.get("lost").copied().unwrap_or(0),
        };
        self.health.sequence.queue_full = losses
            .by_source
            .get(crate::records::OUTPUT_LOST)
            .copied()
            .unwrap_or(0);
        let mut episodes = self.episodes.finish(run.end_us);
        if let Some(w) = self.window {
            episodes.retain(|e| w.overlaps(e.start_us, e.end_us));
        }
        for e in &mut episodes {
            for s in &mut e.sessions {
                self.sessions.hit(s, e.id, e.duration_ms);
                *s = self.sessions.enriched(s);
            }
        }
        let (instances, sessions) = self.sessions.finish();
        let roles: BTreeMap<String, String> = instances
            .iter()
            .flat_map(|i| i.disk_roles.clone())
            .collect();
        let (interfaces, peers, flows, retransmits) = self.network.finish();
        Ok(Report {
            run,
            stream: self.health,
            losses,
            instances,
            disks: self.disks.finish(&roles),
            interfaces,
            peers,
            retransmits,
            flows,
            episodes,
            sessions,
            requests: self.requests.finish(),
        })
    }
}

fn add_counts(into: &mut BTreeMap<String, u64>, counts: &BTreeMap<String, u64>) {
    for (k, n) in counts {
        *into.entry(k.clone()).or_default() += n;
    }
}

fn merge_max(a: BTreeMap<String, u64>, b: BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut out = a;
    for (k, v) in b {
        let e = out.entry(k).or_default();
        *e = (*e).max(v);
    }
    out.retain(|_, v| *v > 0);
    out
}
