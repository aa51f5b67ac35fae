//! What the run was: its `start` record read into a [`RunInfo`], or, when
//! the stream holds no `start` (its file rotated away), what the records
//! themselves say (schema 2: every record carries `schema`, `run`, `seqno`,
//! `host` and `ts`); and the record schemas this version reads.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::Value;

use super::error::ReportError;
use super::field::{self, READABLE_SCHEMAS};
use super::time::sig3;
use super::typed::typed;
use crate::records::run::{Filters, StartRecord};
use crate::records::{FAMILIES, family_of};

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
    /// `run`, the run's id (schema 2).
    pub run_id: Option<String>,
    /// The run's `start` is not in the stream: this was built from the
    /// records (see [`Inference`]); kernel, version, hooks, filters and the
    /// slow I/O threshold are unknown.
    pub inferred: bool,
    /// The whole run's `(start_us, end_us)` when `report --since/--until`
    /// reported part of it (`start_us`/`end_us` are then that part's).
    pub whole_run: Option<(i64, i64)>,
}

impl RunInfo {
    pub fn window_ms(&self) -> f64 {
        (self.end_us - self.start_us).max(0) as f64 / 1000.0
    }

    /// `kernel 6.18.0, stalltrace 0.1.0, schema 2`; without `start`, the run
    /// id and what is unknown.
    pub fn identity(&self) -> String {
        if self.inferred {
            format!(
                "run {}, schema {}; kernel and stalltrace version unknown (no `start` record)",
                self.run_id.as_deref().unwrap_or("unknown"),
                self.schema
            )
        } else {
            format!(
                "kernel {}, stalltrace {}, schema {}",
                self.kernel, self.version, self.schema
            )
        }
    }

    /// `12 intervals of 1000 ms`: `about` when the length was read off the
    /// records, `length unknown` when none said it.
    pub fn intervals_words(&self) -> String {
        let n = format!(
            "{} interval{}",
            self.intervals,
            if self.intervals == 1 { "" } else { "s" }
        );
        match (self.inferred, self.interval_ms) {
            (_, 0) if self.inferred => format!("{n}, length unknown"),
            (true, ms) => format!("{n} of about {ms} ms"),
            (false, ms) => format!("{n} of {ms} ms"),
        }
    }

    /// The families line's note when they were inferred from the records.
    pub fn families_note(&self) -> Option<&'static str> {
        match (self.inferred, self.families.is_empty()) {
            (false, _) => None,
            (true, false) => Some(
                "inferred from the records here: a family with nothing to report writes none, and the `start` record that lists them is not here",
            ),
            (true, true) => Some("unknown: no `start` record, and no family's records here"),
        }
    }

    /// What `slow_io` records were for: `over 50 ms`.
    pub fn slow_io_words(&self) -> String {
        if self.inferred {
            "over the run's --slow-io-ms, unknown without its `start` record".into()
        } else {
            format!("over {} ms", sig3(self.slow_io_ms))
        }
    }
}

/// What the run was, from its `start` record; a schema this version does not
/// read is refused. The schema is checked on the record as written, before
/// its body is read (a later schema's body may not fit `StartRecord`); the
/// body is then read through its record type (`typed`). A body that does not
/// fit leaves what it would have said unknown (the caller counts the record
/// as unreadable): the run is still reported from its envelope.
pub fn run_info(r: &Value) -> Result<RunInfo, ReportError> {
    let schema = field::schema(r);
    let major = schema.and_then(field::schema_major);
    if !major.is_some_and(|m| READABLE_SCHEMAS.contains(&m)) {
        return Err(ReportError::Schema {
            found: schema
                .map(|s| s.to_string().trim_matches('"').to_string())
                .unwrap_or_else(|| "(none)".into()),
            writer: field::writer_version(r).map(String::from),
        });
    }
    let mut run = RunInfo {
        run_id: field::run(r).map(String::from),
        ..RunInfo::from_envelope(r, major, field::ts_us(r).unwrap_or(0))
    };
    let Some(start) = typed::<StartRecord>(r) else {
        return Ok(run);
    };
    run.kernel = start.kernel;
    run.version = start.version;
    run.interval_ms = start.interval_ms;
    run.duration_ms = start.duration_ms;
    run.slow_io_ms = start.slow_io_ms;
    run.families = start
        .families
        .iter()
        .map(|f| FamilyStatus {
            family: f.family.clone(),
            attached: f.attached,
            mode: f.mode.map(|m| m.name().to_string()),
            note: f.error.clone().or_else(|| f.fallback_reason.clone()),
        })
        .collect();
    run.missing_hooks = start
        .probes
        .iter()
        .filter(|p| p.optional && !p.attached)
        .map(|p| {
            format!(
                "{} {}: {}",
                p.family,
                p.hook,
                p.error.as_deref().unwrap_or("not attached")
            )
        })
        .collect();
    run.missing_hooks.dedup();
    run.filters = filters(&start.filters);
    Ok(run)
}

/// What the run was, from the first record of a stream that holds no
/// `start`: `None` when the record cannot say (no `run`, `seqno` or `ts`: a
/// schema 1 stream, which is refused as before); a schema this version does
/// not read is refused as a `start` of it would be.
pub fn inferred_run_info(r: &Value) -> Result<Option<RunInfo>, ReportError> {
    let (Some(run), Some(_), Some(start_us)) = (field::run(r), field::seqno(r), field::ts_us(r))
    else {
        return Ok(None);
    };
    let Some(schema) = field::schema(r) else {
        return Ok(None);
    };
    let major = field::schema_major(schema);
    match major {
        // Schema 1 carries no run id per record: its records say nothing of the run.
        Some(1) => return Ok(None),
        Some(m) if READABLE_SCHEMAS.contains(&m) => {}
        _ => {
            return Err(ReportError::Schema {
                found: schema.to_string().trim_matches('"').to_string(),
                writer: None,
            });
        }
    }
    Ok(Some(RunInfo {
        run_id: Some(run.to_string()),
        inferred: true,
        ..RunInfo::from_envelope(r, major, start_us)
    }))
}

impl RunInfo {
    /// What any record's envelope says of its run; the rest unknown until a
    /// `start` says it.
    fn from_envelope(r: &Value, major: Option<u64>, start_us: i64) -> Self {
        RunInfo {
            host: field::host(r).unwrap_or("unknown").to_string(),
            kernel: "unknown".into(),
            version: "unknown".into(),
            schema: major.unwrap_or(0),
            start_us,
            end_us: start_us,
            ..RunInfo::default()
        }
    }
}

/// Distinct `interval_ms` values kept: measured lengths cluster around the
/// run's interval, so a few dozen cover any real stream.
const INTERVAL_VALUES_KEPT: usize = 256;

/// What the records of a run without `start` say about it, gathered while
/// reading: the families whose records appear, and the intervals' measured
/// lengths (`interval_ms`).
#[derive(Debug, Default)]
pub struct Inference {
    families: BTreeSet<&'static str>,
    /// `interval_ms` -> records that said it.
    interval_ms: BTreeMap<u64, u64>,
}

impl Inference {
    /// One record of the run, of type `kind`.
    pub fn family(&mut self, kind: &str) {
        if let Some(family) = family_of(kind) {
            self.families.insert(family);
        }
    }

    /// The measured length of an interval, as an interval record said it.
    pub fn interval(&mut self, ms: u64) {
        if ms > 0
            && (self.interval_ms.len() < INTERVAL_VALUES_KEPT || self.interval_ms.contains_key(&ms))
        {
            *self.interval_ms.entry(ms).or_default() += 1;
        }
    }

    /// Put what was gathered into `run`, when it was inferred.
    pub fn apply(&self, run: &mut RunInfo) {
        if !run.inferred {
            return;
        }
        run.families = FAMILIES
            .iter()
            .filter(|f| self.families.contains(*f))
            .map(|f| FamilyStatus {
                family: f.to_string(),
                attached: true,
                mode: None,
                note: None,
            })
            .collect();
        run.interval_ms = self.interval_estimate();
    }

    /// The run's interval: the median of the measured lengths (the run's
    /// last interval is shorter, and each is the clock's, truncated to the
    /// ms: 499 and 500 for `--interval 500ms`), to the nearest 10 ms from
    /// 100 ms up. 0 when no record said.
    fn interval_estimate(&self) -> u64 {
        let n: u64 = self.interval_ms.values().sum();
        let mut seen = 0;
        let Some(median) = self.interval_ms.iter().find_map(|(&ms, &k)| {
            seen += k;
            (seen * 2 >= n).then_some(ms)
        }) else {
            return 0;
        };
        if median >= 100 {
            (median + 5) / 10 * 10
        } else {
            median
        }
    }
}

/// The run's limits, in words (`TCP ports 1433, 5022`).
fn filters(f: &Filters) -> Vec<String> {
    let mut out = Vec::new();
    if !f.ports.is_empty() {
        let ports: Vec<String> = f.ports.iter().map(u16::to_string).collect();
        out.push(format!("TCP ports {}", ports.join(", ")));
    }
    if !f.netns.is_empty() {
        let netns: Vec<&str> = f.netns.iter().map(|n| n.spec.as_str()).collect();
        out.push(format!("netns {}", netns.join(", ")));
    }
    if !f.ifaces.is_empty() {
        out.push(format!("interfaces {}", f.ifaces.join(", ")));
    }
    if !f.disks.is_empty() {
        out.push(format!("disks {}", f.disks.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Without `start`, the interval is the records' measured lengths'
    /// median, rounded as a person would set it; families in `start`'s order.
    #[test]
    fn what_the_records_say_of_a_run_without_start() {
        let mut i = Inference::default();
        for (kind, ms) in [
            ("sql_session", None),
            ("netdev", Some(499)),
            ("block", Some(500)),
            ("tcp_rtt", Some(499)),
            ("lost", Some(501)),
            ("block", Some(212)),
            ("stall", None),
        ] {
            i.family(kind);
            if let Some(ms) = ms {
                i.interval(ms);
            }
        }
        let mut run = RunInfo {
            inferred: true,
            ..RunInfo::default()
        };
        i.apply(&mut run);
        assert_eq!(run.interval_ms, 500);
        let families: Vec<&str> = run.families.iter().map(|f| f.family.as_str()).collect();
        assert_eq!(families, ["block", "tcp", "netdev", "sqlserver"]);
        assert!(run.intervals_words().ends_with("of about 500 ms"));
        // Short intervals are kept to the ms; none said: unknown.
        let mut short = Inference::default();
        for ms in [49, 50, 50] {
            short.family("block");
            short.interval(ms);
        }
        assert_eq!(short.interval_estimate(), 50);
        run.interval_ms = Inference::default().interval_estimate();
        assert_eq!(run.intervals_words(), "0 intervals, length unknown");
        // A run read from its `start` is not touched.
        let mut from_start = RunInfo {
            interval_ms: 1000,
            ..RunInfo::default()
        };
        i.apply(&mut from_start);
        assert_eq!(
            (from_start.interval_ms, from_start.families.len()),
            (1000, 0)
        );
    }
}
