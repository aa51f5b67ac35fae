//! A real recording replayed through the detector: the episodes it makes are
//! pinned, byte for byte, in `fixtures/replayed.jsonl`, so a change to how
//! records reach the rules (not to the rules) cannot change what they find.
//! `STALLTRACE_BLESS=1` rewrites the file after a change the rules meant.

use std::io::Read;

use serde_json::Value;

use super::{Detector, Thresholds};
use crate::records::AnyRecord;

const RECORDED_GZ: &[u8] = include_bytes!("../report/fixtures/recorded.jsonl.gz");
const REPLAYED: &str = include_str!("fixtures/replayed.jsonl");

/// The record types written once per subject at the end of an interval: the
/// recording's intervals are the runs of records up to those of one `ts`.
fn ends_interval(kind: &str) -> bool {
    matches!(
        kind,
        "block" | "tcp_rtt" | "netdev" | "tcp_flow" | "sql_requests"
    )
}

/// The recording cut into the intervals the daemon fed its detector: each is
/// (end ts, length in ms, records). A record later than the current
/// interval's end begins the next one.
fn intervals(lines: &[Value]) -> Vec<(String, f64, Vec<Value>)> {
    let mut out: Vec<(String, f64, Vec<Value>)> = Vec::new();
    let mut current: Vec<Value> = Vec::new();
    let mut end: Option<(String, f64)> = None;
    for r in lines {
        let ts = r["ts"].as_str().unwrap_or_default().to_string();
        if let Some((end_ts, len)) = &end
            && ts > *end_ts
        {
            out.push((end_ts.clone(), *len, std::mem::take(&mut current)));
            end = None;
        }
        if ends_interval(r["type"].as_str().unwrap_or_default()) && end.is_none() {
            end = Some((ts, r["interval_ms"].as_f64().unwrap_or(1000.0)));
        }
        current.push(r.clone());
    }
    if let Some((end_ts, len)) = end {
        out.push((end_ts, len, current));
    }
    out
}

fn replayed() -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(RECORDED_GZ)
        .read_to_string(&mut text)
        .expect("recorded.jsonl.gz");
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let start = lines[0]["ts"].as_str().expect("the start's ts").to_string();
    let mut detector = Detector::new(Thresholds::default(), &start);
    let mut out = String::new();
    let cut = intervals(&lines);
    assert!(cut.len() > 10, "the recording has {} intervals", cut.len());
    for (end, len_ms, records) in &cut {
        // Read back as a reader of the stream reads a line: every line of
        // the recording is of a type this version knows, and reads as it.
        let typed: Vec<AnyRecord> = records
            .iter()
            .map(|r| {
                let kind = r["type"].as_str().unwrap_or_default();
                AnyRecord::read(kind, r)
                    .unwrap_or_else(|| panic!("{kind}: not a record type"))
                    .unwrap_or_else(|e| panic!("a {kind} line does not read: {e}"))
            })
            .collect();
        for stall in detector.interval(typed, end, *len_ms) {
            out += &serde_json::to_string(&stall).unwrap();
            out.push('\n');
        }
    }
    for stall in detector.finish() {
        out += &serde_json::to_string(&stall).unwrap();
        out.push('\n');
    }
    out
}

#[test]
fn a_recording_replays_to_the_same_episodes() {
    let got = replayed();
    if std::env::var_os("STALLTRACE_BLESS").is_some() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/src/stall/fixtures/replayed.jsonl"
        );
        std::fs::write(path, &got).unwrap();
        return;
    }
    assert!(!got.is_empty(), "the recording makes episodes");
    assert_eq!(got, REPLAYED, "the replayed episodes changed");
}
