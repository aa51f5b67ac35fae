//! A [`Report`] built from a record stream: what the run was, whether the
//! stream is whole and what it lost, and every section the renderers show.
//!
//! Forward compatible by construction: records are read as JSON values, record
//! types this version does not know are counted and ignored, and fields it does
//! not know are never looked at. Only a different schema *major* in `start` is
//! refused, since fields may have changed meaning then.

use std::collections::BTreeMap;
use std::fmt;
use std::io::BufRead;

use serde_json::Value;

use super::episodes::{Episode, Episodes};
use super::fields::{bool_of, f64_of, str_of, u64_of};
use super::network::{BulkFlow, Interface, Network, Retransmits, TcpPeer};
use super::sessions::{Instance, SessionImpact, Sessions, SqlTag};
use super::storage::{Disk, Disks};
use super::time::{clock, parse_us};
use crate::error::UserError;
use crate::output::SCHEMA_VERSION;

/// One probe family as `start` reports it.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyStatus {
    pub family: String,
    pub attached: bool,
    pub mode: Option<String>,
    /// Why it fell back to raw_tp, or why it did not attach.
    pub note: Option<String>,
}

/// What the run was (`start`, `stop`).
#[derive(Clone, Debug, Default)]
pub struct RunInfo {
    pub host: String,
    pub kernel: String,
    pub version: String,
    pub schema: u64,
    pub start_us: i64,
    /// `stop`'s time, or the last time in the stream when it has no `stop`.
    pub end_us: i64,
    /// `stop.reason` (`duration`, `signal`); `None` without a `stop`.
    pub stop_reason: Option<String>,
    pub interval_ms: u64,
    pub duration_ms: Option<u64>,
    pub slow_io_ms: f64,
    pub families: Vec<FamilyStatus>,
    /// Optional hooks that did not attach: `family hook: why`.
    pub missing_hooks: Vec<String>,
    /// What the run was limited to, in words (`ports 1433, 5022`); empty: everything.
    pub filters: Vec<String>,
    /// Intervals seen (distinct `ts` of interval records).
    pub intervals: u64,
}

impl RunInfo {
    pub fn window_ms(&self) -> f64 {
        (self.end_us - self.start_us).max(0) as f64 / 1000.0
    }
}

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

/// Whether the stream is whole.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamHealth {
    /// Non-empty lines read (`from_reader`) or records given (`from_records`).
    pub lines: usize,
    /// Lines in the middle that were not JSON records, skipped.
    pub bad_lines: usize,
    /// Line numbers of the first few of those.
    pub first_bad_lines: Vec<usize>,
    /// The last line stops mid-record (no newline, not JSON): an interrupted write.
    pub truncated_last_line: bool,
    pub has_stop: bool,
    /// `(type, written according to stop.records, found here)` where fewer were found.
    pub missing: Vec<(String, u64, u64)>,
    /// Record types this version does not know, and how many were ignored.
    pub unknown_types: BTreeMap<String, u64>,
    /// Records before the `start` record, ignored.
    pub before_start: usize,
    /// Line where another run's `start` begins; everything from it is ignored.
    pub next_run_line: Option<usize>,
}

impl StreamHealth {
    /// What is wrong with the stream, one sentence each; empty when it is whole.
    pub fn warnings(&self, run: &RunInfo) -> Vec<String> {
        let mut w = Vec::new();
        if !self.has_stop {
            w.push(format!(
                "no `stop` record: the recording was cut short (killed, crashed, or still being written); this report covers it up to {}",
                clock(run.end_us)
            ));
        }
        if self.truncated_last_line {
            w.push("the last line stops mid-record (an interrupted write): it was skipped".into());
        }
        if self.bad_lines > 0 {
            let at: Vec<String> = self.first_bad_lines.iter().map(usize::to_string).collect();
            w.push(format!(
                "{} line{} in the middle of the stream {} not a JSON record (line {}{}): skipped",
                self.bad_lines,
                plural(self.bad_lines),
                if self.bad_lines == 1 { "is" } else { "are" },
                at.join(", "),
                if self.bad_lines > at.len() {
                    ", ..."
                } else {
                    ""
                }
            ));
        }
        if !self.missing.is_empty() {
            let parts: Vec<String> = self
                .missing
                .iter()
                .map(|(t, written, found)| format!("{t} {found} of {written}"))
                .collect();
            w.push(format!(
                "fewer records than the run wrote (found of written, per `stop`): {}",
                parts.join(", ")
            ));
        }
        if self.before_start > 0 {
            w.push(format!(
                "{} record{} before the `start` record ignored",
                self.before_start,
                plural(self.before_start)
            ));
        }
        if let Some(line) = self.next_run_line {
            w.push(format!(
                "another run starts at line {line}: only the first run is reported (split the file to report the others)"
            ));
        }
        w
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
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
}

impl Report {
    /// An episode's place in the ranking (1 = most impact), as every view numbers it.
    pub fn rank_of(&self, id: u64) -> Option<usize> {
        self.episodes.iter().position(|e| e.id == id).map(|i| i + 1)
    }
}

/// Why a stream cannot be reported.
#[derive(Debug)]
pub enum ReportError {
    Empty,
    /// No line is a JSON object; `line` is the first that is not.
    NotJsonLines {
        line: usize,
    },
    /// JSON records, but no `start`: not a stalltrace stream, or its head is cut off.
    NoStart {
        records: usize,
    },
    /// `start.schema` is not one this version reads.
    Schema {
        found: String,
        writer: Option<String>,
    },
    Read(std::io::Error),
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_user_error("the stream"))
    }
}

impl std::error::Error for ReportError {}

impl ReportError {
    /// The one-line error `stalltrace report` prints for `source` (a path, or `stdin`).
    pub fn to_user_error(&self, source: &str) -> UserError {
        const RECORD_IT: &str =
            "give a file written by `stalltrace run --out FILE` (or its stdout saved to a file)";
        match self {
            ReportError::Empty => UserError::new(format!("{source} is empty"), RECORD_IT),
            ReportError::NotJsonLines { line } => UserError::new(
                format!("{source} is not JSON lines (line {line} is not a JSON object)"),
                RECORD_IT,
            ),
            ReportError::NoStart { records } => UserError::new(
                format!(
                    "{source} has no `start` record ({records} JSON records, none of type start): it is not a stalltrace stream, or its beginning was cut off"
                ),
                "give the whole file `stalltrace run` wrote, from its first line",
            ),
            ReportError::Schema { found, writer } => UserError::new(
                format!(
                    "{source} was written with record schema {found}{}; this stalltrace ({}) reads schema {SCHEMA_VERSION}",
                    writer
                        .as_ref()
                        .map(|w| format!(" (by stalltrace {w})"))
                        .unwrap_or_default(),
                    env!("CARGO_PKG_VERSION"),
                ),
                match writer {
                    Some(w) => format!(
                        "report it with stalltrace {w} or a later version that reads schema {found}"
                    ),
                    None => {
                        format!("report it with a stalltrace version that reads schema {found}")
                    }
                },
            ),
            ReportError::Read(e) => UserError::new(
                format!("cannot read {source}: {e}"),
                "check the path and its permissions (`-` reads stdin)",
            ),
        }
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
    done: bool,
    disks: Disks,
    network: Network,
    episodes: Episodes,
    sessions: Sessions,
    /// Lines given to `push_line` so far.
    pushed: usize,
}

impl Report {
    /// A report from records already parsed (e.g. `investigate`'s own).
    pub fn from_records<'a>(
        records: impl IntoIterator<Item = &'a Value>,
    ) -> Result<Self, ReportError> {
        let mut b = ReportBuilder::default();
        for r in records {
            b.health.lines += 1;
            b.record(r, b.health.lines)?;
        }
        b.finish()
    }

    /// A report from JSON lines. A line that is not JSON is counted and
    /// skipped (a stream cut by a crash is normal), not an error.
    pub fn from_reader(mut reader: impl BufRead) -> Result<Self, ReportError> {
        let mut b = ReportBuilder::default();
        let mut buf = Vec::new();
        let mut n = 0;
        loop {
            buf.clear();
            if reader
                .read_until(b'\n', &mut buf)
                .map_err(ReportError::Read)?
                == 0
            {
                break;
            }
            n += 1;
            let terminated = buf.last() == Some(&b'\n');
            // Invalid UTF-8 is a bad line like any other.
            let line = String::from_utf8_lossy(&buf);
            b.line(n, &line, terminated)?;
            if b.done {
                break;
            }
        }
        b.finish()
    }

    pub fn from_text(text: &str) -> Result<Self, ReportError> {
        Self::from_reader(text.as_bytes())
    }
}

impl ReportBuilder {
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

    fn line(&mut self, n: usize, line: &str, terminated: bool) -> Result<(), ReportError> {
        let line = line.trim();
        if line.is_empty() {
            return Ok(());
        }
        self.health.lines += 1;
        match serde_json::from_str::<Value>(line) {
            Ok(v) if v.get("type").and_then(Value::as_str).is_some() => {
                self.parsed += 1;
                self.record(&v, n)
            }
            _ => {
                self.first_bad_line.get_or_insert(n);
                // Only the file's last line can lack its newline: a record
                // cut mid-write, which a crash leaves behind.
                if terminated {
                    self.note_bad(n);
                } else {
                    self.health.truncated_last_line = true;
                }
                if self.parsed == 0 && self.health.lines >= GIVE_UP_AFTER_BAD_LINES {
                    return Err(ReportError::NotJsonLines {
                        line: self.first_bad_line.unwrap_or(n),
                    });
                }
                Ok(())
            }
        }
    }

    fn note_bad(&mut self, n: usize) {
        self.health.bad_lines += 1;
        if self.health.first_bad_lines.len() < BAD_LINES_LISTED {
            self.health.first_bad_lines.push(n);
        }
    }

    fn record(&mut self, r: &Value, n: usize) -> Result<(), ReportError> {
        let Some(kind) = r.get("type").and_then(Value::as_str) else {
            self.note_bad(n);
            return Ok(());
        };
        if kind == "start" {
            if self.run.is_some() {
                self.health.next_run_line = Some(n);
                self.done = true;
                return Ok(());
            }
            self.run = Some(start(r)?);
        }
        let Some(run) = self.run.as_mut() else {
            self.health.before_start += 1;
            return Ok(());
        };
        let ts_us = str_of(r, "ts")
            .as_deref()
            .and_then(parse_us)
            .unwrap_or(self.last_ts_us);
        self.last_ts_us = self.last_ts_us.max(ts_us);
        if kind != "stop" {
            *self.found.entry(kind.to_string()).or_default() += 1;
        }
        match kind {
            "start" => {}
            "block" => {
                self.interval_ends.insert(ts_us);
                self.disks.block(r, ts_us);
            }
            "slow_io" => {
                self.disks.slow_io(r, ts_us);
                if let Some(tag) = r.get("sql").and_then(SqlTag::from_value)
                    && let Some(pid) = tag.pid
                {
                    self.sessions.slow_io(pid, str_of(r, "file"));
                }
            }
            "netdev" => {
                self.interval_ends.insert(ts_us);
                self.network.netdev(r, ts_us);
            }
            "tcp_rtt" => {
                self.interval_ends.insert(ts_us);
                self.network.tcp_rtt(r);
            }
            "tcp_retransmit" => {
                let waited = self.network.tcp_retransmit(r);
                if let Some(tag) = r.get("sql").and_then(SqlTag::from_value) {
                    let segs = u64_of(r, "segs").unwrap_or(1);
                    self.sessions.retransmit(&tag, segs, waited);
                }
            }
            "tcp_flow" => self.network.tcp_flow(r, ts_us),
            "sql_instance" => self.sessions.instance(r),
            "sql_session" => self.sessions.session(r),
            "stall" => {
                if !self.episodes.add(r) {
                    self.note_bad(n);
                }
            }
            "lost" => {
                self.interval_ends.insert(ts_us);
                add_counts(&mut self.lost_sum, r.get("by_source"));
            }
            "stop" => {
                self.health.has_stop = true;
                run.end_us = ts_us;
                run.stop_reason = str_of(r, "reason");
                let mut written = BTreeMap::new();
                add_counts(&mut written, r.get("records"));
                self.written = Some(written);
                let mut lost = BTreeMap::new();
                add_counts(&mut lost, r.get("lost"));
                self.stop_lost = Some(lost);
            }
            other => {
                *self
                    .health
                    .unknown_types
                    .entry(other.to_string())
                    .or_default() += 1
            }
        }
        Ok(())
    }

    fn finish(mut self) -> Result<Report, ReportError> {
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
        if let Some(written) = &self.written {
            for (kind, &w) in written {
                let f = self.found.get(kind).copied().unwrap_or(0);
                if f < w {
                    self.health.missing.push((kind.clone(), w, f));
                }
            }
        }
        let losses = Losses {
            // stop.lost is the run's own total; the lost records can be
            // missing from a cut file. Take the larger, source by source.
            by_source: merge_max(self.lost_sum, self.stop_lost.unwrap_or_default()),
            intervals: self.found.get("lost").copied().unwrap_or(0),
        };
        let mut episodes = self.episodes.finish(run.end_us);
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
        })
    }
}

/// The schema major of a `start` record: `1`, `1.2` and `"1.2"` are all 1.
fn schema_major(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f.trunc() as u64)),
        Value::String(s) => s.split('.').next()?.trim().parse().ok(),
        _ => None,
    }
}

fn start(r: &Value) -> Result<RunInfo, ReportError> {
    let schema = r.get("schema");
    let major = schema.and_then(schema_major);
    if major != Some(u64::from(SCHEMA_VERSION)) {
        return Err(ReportError::Schema {
            found: schema
                .map(|s| s.to_string().trim_matches('"').to_string())
                .unwrap_or_else(|| "(none)".into()),
            writer: str_of(r, "version"),
        });
    }
    let families = r
        .get("families")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|f| {
                    Some(FamilyStatus {
                        family: str_of(f, "family")?,
                        attached: bool_of(f, "attached").unwrap_or(false),
                        mode: str_of(f, "mode"),
                        note: str_of(f, "error").or_else(|| str_of(f, "fallback_reason")),
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    let missing_hooks = r
        .get("probes")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter(|p| {
                    bool_of(p, "optional") == Some(true) && bool_of(p, "attached") == Some(false)
                })
                .filter_map(|p| {
                    Some(format!(
                        "{} {}: {}",
                        str_of(p, "family")?,
                        str_of(p, "hook")?,
                        str_of(p, "error").unwrap_or_else(|| "not attached".into())
                    ))
                })
                .collect::<Vec<_>>()
        })
        .map(|mut v| {
            v.dedup();
            v
        })
        .unwrap_or_default();
    let start_us = str_of(r, "ts").as_deref().and_then(parse_us).unwrap_or(0);
    Ok(RunInfo {
        host: str_of(r, "host").unwrap_or_else(|| "unknown".into()),
        kernel: str_of(r, "kernel").unwrap_or_else(|| "unknown".into()),
        version: str_of(r, "version").unwrap_or_else(|| "unknown".into()),
        schema: major.unwrap_or(0),
        start_us,
        end_us: start_us,
        stop_reason: None,
        interval_ms: u64_of(r, "interval_ms").unwrap_or(0),
        duration_ms: u64_of(r, "duration_ms"),
        slow_io_ms: f64_of(r, "slow_io_ms").unwrap_or(0.0),
        families,
        missing_hooks,
        filters: filters(r.get("filters")),
        intervals: 0,
    })
}

fn filters(f: Option<&Value>) -> Vec<String> {
    let Some(f) = f else { return Vec::new() };
    let list = |key: &str, each: &dyn Fn(&Value) -> Option<String>| -> Vec<String> {
        f.get(key)
            .and_then(Value::as_array)
            .map(|a| a.iter().filter_map(each).collect())
            .unwrap_or_default()
    };
    let mut out = Vec::new();
    let ports = list("ports", &|v| v.as_u64().map(|p| p.to_string()));
    if !ports.is_empty() {
        out.push(format!("TCP ports {}", ports.join(", ")));
    }
    let netns = list("netns", &|v| str_of(v, "spec"));
    if !netns.is_empty() {
        out.push(format!("netns {}", netns.join(", ")));
    }
    let ifaces = list("ifaces", &|v| v.as_str().map(String::from));
    if !ifaces.is_empty() {
        out.push(format!("interfaces {}", ifaces.join(", ")));
    }
    out
}

fn add_counts(into: &mut BTreeMap<String, u64>, map: Option<&Value>) {
    if let Some(m) = map.and_then(Value::as_object) {
        for (k, v) in m {
            if let Some(n) = v.as_u64() {
                *into.entry(k.clone()).or_default() += n;
            }
        }
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
