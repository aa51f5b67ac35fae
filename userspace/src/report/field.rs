//! The envelope's fields of a record, as the stream gives them: absent, or
//! of another type than the schema says, they are `None` (a hostile
//! envelope is read as far as it goes, never an error). A record's own
//! fields are read through its record type (`typed`), not here.
//!
//! Also the record schemas this version reads, which the `start` and each
//! record's envelope are held to.

use std::ops::RangeInclusive;

use serde_json::Value;

use crate::report::time::parse_us;

fn str_at<'a>(r: &'a Value, key: &str) -> Option<&'a str> {
    r.get(key).and_then(Value::as_str)
}

fn u64_at(r: &Value, key: &str) -> Option<u64> {
    r.get(key).and_then(Value::as_u64)
}

/// `type`.
pub fn kind(r: &Value) -> Option<&str> {
    str_at(r, "type")
}

/// `run`: the run's id (schema 2).
pub fn run(r: &Value) -> Option<&str> {
    str_at(r, "run")
}

/// `host`.
pub fn host(r: &Value) -> Option<&str> {
    str_at(r, "host")
}

/// `ts`, in µs since the epoch.
pub fn ts_us(r: &Value) -> Option<i64> {
    str_at(r, "ts").and_then(parse_us)
}

/// `seqno` (schema 2).
pub fn seqno(r: &Value) -> Option<u64> {
    u64_at(r, "seqno")
}

/// `file`: a `start`'s file number in its run (absent in the first).
pub fn file(r: &Value) -> Option<u64> {
    u64_at(r, "file")
}

/// `schema`, as written (a number or a string).
pub fn schema(r: &Value) -> Option<&Value> {
    r.get("schema")
}

/// The major of a `schema` as written: `1`, `1.2` and `"1.2"` are all 1.
pub fn schema_major(v: &Value) -> Option<u64> {
    match v {
        Value::Number(n) => n.as_u64().or_else(|| n.as_f64().map(|f| f.trunc() as u64)),
        Value::String(s) => s.split('.').next()?.trim().parse().ok(),
        _ => None,
    }
}

/// `version` of a `start` whose schema this version does not read: who
/// wrote it, for the refusal. The one body field read as written, since
/// such a body is not read through its record type.
pub fn writer_version(r: &Value) -> Option<&str> {
    str_at(r, "version")
}

/// `part` and `parts` of a record written in parts (present: a part).
pub fn is_part(r: &Value) -> bool {
    r.get("part").is_some() || r.get("parts").is_some()
}

/// `part` (1..=parts).
pub fn part(r: &Value) -> Option<u64> {
    u64_at(r, "part")
}

/// `parts`.
pub fn parts(r: &Value) -> Option<u64> {
    u64_at(r, "parts")
}

/// `split`: the top-level array divided among the parts.
pub fn split(r: &Value) -> Option<&str> {
    str_at(r, "split")
}

/// The array `split` names, in a part (the only body field the
/// envelope touches: to put the record back together).
pub fn split_items<'a>(r: &'a Value, split: &str) -> Option<&'a Vec<Value>> {
    r.get(split).and_then(Value::as_array)
}

/// Record schemas (`start.schema` majors) the report reads: 1, 2 (the
/// run id and file ordinal in every record, compact histograms, records
/// split into parts) and 3 (one spelling of a TCP connection: `tcp_rtt`
/// of 1 and 2 reads as 3, `records::tcp`).
pub const READABLE_SCHEMAS: RangeInclusive<u64> = 1..=3;

/// `schema 1`, `schemas 1 and 2`, `schemas 1 to 3`: for messages.
pub fn readable_schemas() -> String {
    let (lo, hi) = (READABLE_SCHEMAS.start(), READABLE_SCHEMAS.end());
    match hi - lo {
        0 => format!("schema {lo}"),
        1 => format!("schemas {lo} and {hi}"),
        _ => format!("schemas {lo} to {hi}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The writer's schema is one the report reads: a bump without teaching
    /// the report fails here.
    #[test]
    fn the_report_reads_the_schema_this_version_writes() {
        assert!(READABLE_SCHEMAS.contains(&u64::from(crate::records::SCHEMA_VERSION)));
        assert_eq!(readable_schemas(), "schemas 1 to 3");
    }
}
