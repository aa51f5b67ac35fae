//! What the run was: its `start` record read into a [`RunInfo`], and the
//! record schemas this version reads.

use std::ops::RangeInclusive;

use serde_json::Value;

use super::fields::{bool_of, f64_of, str_of, u64_of};
use super::model::ReportError;
use super::time::parse_us;

/// Record schemas (`start.schema` majors) the report reads: 1, and 2 (the
/// run id and file ordinal in every record, compact histograms, records
/// split into parts).
pub const READABLE_SCHEMAS: RangeInclusive<u64> = 1..=2;

/// `schema 1`, `schemas 1 and 2`, `schemas 1 to 3`: for messages.
pub fn readable_schemas() -> String {
    let (lo, hi) = (READABLE_SCHEMAS.start(), READABLE_SCHEMAS.end());
    match hi - lo {
        0 => format!("schema {lo}"),
        1 => format!("schemas {lo} and {hi}"),
        _ => format!("schemas {lo} to {hi}"),
    }
}

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

/// The schema major of a `start` record: `1`, `1.2` and `"1.2"` are all 1.
fn schema_major(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f.trunc() as u64)),
        Value::String(s) => s.split('.').next()?.trim().parse().ok(),
        _ => None,
    }
}

/// What the run was, from its `start` record; a schema this version does not
/// read is refused.
pub fn run_info(r: &Value) -> Result<RunInfo, ReportError> {
    let schema = r.get("schema");
    let major = schema.and_then(schema_major);
    if !major.is_some_and(|m| READABLE_SCHEMAS.contains(&m)) {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer's schema is one the report reads: a bump without teaching
    /// the report fails here.
    #[test]
    fn the_report_reads_the_schema_this_version_writes() {
        assert!(READABLE_SCHEMAS.contains(&u64::from(crate::output::SCHEMA_VERSION)));
        assert_eq!(readable_schemas(), "schemas 1 and 2");
    }
}
