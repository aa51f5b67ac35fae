//! Test streams: small synthetic records built here, and the real recording in
//! `fixtures/` (see `fixtures/record.sh`) with handcrafted `stall` and
//! `tcp_flow` records (`fixtures/episodes.jsonl`) set in its window.

use std::io::Read;

use serde_json::{Value, json};

pub const HOST: &str = "db-01";

/// The report of a synthetic stream.
pub fn report(records: &[Value]) -> super::model::Report {
    super::model::Report::from_text(&lines(records)).expect("a valid stream")
}

/// The text with its line wrapping undone, to look for phrases.
pub fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}
/// 2026-11-22T10:00:00Z + `s` seconds as a record timestamp.
pub fn ts(s: f64) -> String {
    let t0 = super::time::parse_us("2026-11-22T10:00:00Z").unwrap();
    super::time::rfc3339(t0 + (s * 1e6).round() as i64)
}

pub fn start() -> Value {
    json!({"ts": ts(0.0), "host": HOST, "type": "start", "schema": 1, "version": "0.1.0",
        "kernel": "6.18.0", "interval_ms": 1000, "slow_io_ms": 50, "bpf_stats": false,
        "kernel_hz": 250, "kernel_hz_source": "/proc/config.gz",
        "filters": {"ports": [], "netns": [], "ifaces": []},
        "families": [{"family": "block", "attached": true, "mode": "tp_btf"},
                     {"family": "tcp", "attached": true, "mode": "raw_tp",
                      "fallback_reason": "cannot attach tcp_probe (TpBtf)"}],
        "probes": []})
}

pub fn stop(at: f64, records: Value, lost: Value) -> Value {
    json!({"ts": ts(at), "host": HOST, "type": "stop", "reason": "duration",
        "elapsed_ms": (at * 1000.0) as u64, "records": records, "lost": lost, "programs": []})
}

/// A histogram object from `[low, high, count]` buckets, with the mean given.
pub fn hist(buckets: Value, mean: f64) -> Value {
    let count: u64 = buckets
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b[2].as_u64().unwrap())
        .sum();
    if count == 0 {
        return json!({"count": 0, "mean": null, "p50": null, "p90": null, "p99": null, "max": null, "buckets": []});
    }
    let last = buckets.as_array().unwrap().last().unwrap()[1].clone();
    // The producer's own percentiles are not what the report uses: any
    // plausible number will do here.
    json!({"count": count, "mean": mean, "p50": mean, "p90": mean, "p99": mean, "max": last, "buckets": buckets})
}

/// A `block` record ending at `at` seconds with the given latency and in-flight buckets.
pub fn block(at: f64, dev: &str, op: &str, latency: Value, inflight: Value) -> Value {
    let count: u64 = latency
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b[2].as_u64().unwrap())
        .sum();
    json!({"ts": ts(at), "host": HOST, "type": "block", "dev": dev, "major": 259, "minor": 0,
        "op": op, "interval_ms": 1000, "count": count, "bytes": count * 8192, "bios": count,
        "requeues": 0, "errors": 0, "completions_unseen": 0,
        "latency_us": hist(latency.clone(), 100.0), "tag_wait_us": hist(json!([]), 0.0),
        "queue_us": hist(json!([]), 0.0), "device_us": hist(latency, 100.0),
        "inflight": hist(inflight, 2.0), "inflight_now": 0,
        "queue_limit": {"scheduler": "none", "nr_requests": 32, "hw_queue_depth": 1023, "nr_hw_queues": 2}})
}

pub fn session_tag(spid: u64, port: u16) -> Value {
    json!({"pid": 4242, "kind": "client", "spid": spid, "client": format!("10.0.0.9:{port}")})
}

/// A `stall` record; `end` only for `closed`.
pub fn stall(
    id: u64,
    phase: &str,
    at: f64,
    start: f64,
    end: Option<f64>,
    impact_ms: f64,
    sessions: Value,
) -> Value {
    let mut r = json!({"ts": ts(at), "host": HOST, "type": "stall", "id": id, "phase": phase,
        "start": ts(start), "duration_ms": (end.unwrap_or(at) - start) * 1000.0,
        "kind": "network", "cause": "retransmission_timeouts", "peer": "10.0.0.9", "netns": 4026531840u64,
        "impact_ms": impact_ms,
        "evidence": [{"signal": "rto_ms_max", "value": 408, "threshold": 200, "unit": "ms",
                      "text": "retransmission timeouts up to 408 ms"}],
        "next_step": "Check the link to 10.0.0.9 for errors.", "sessions": sessions});
    if let Some(e) = end {
        r["end"] = json!(ts(e));
    }
    r
}

pub fn retransmit(at: f64, port: u16, spid: u64, timer: bool, rto_ms: f64) -> Value {
    json!({"ts": ts(at), "host": HOST, "type": "tcp_retransmit", "netns": 4026531840u64,
        "family": "ipv4", "saddr": "10.0.0.1", "sport": 1433, "daddr": "10.0.0.9", "dport": port,
        "state": "ESTABLISHED", "kind": "rto", "timer": timer, "synack": false, "ca_state": "loss",
        "segs": 1, "bytes": 1448, "seq": 1, "err": 0, "counted": true, "rto_ms": rto_ms,
        "backoff": 0, "retransmits": 1, "srtt_us": 350, "sql": session_tag(spid, port)})
}

pub fn lines(records: &[Value]) -> String {
    records.iter().map(|r| format!("{r}\n")).collect()
}

// ---- schema 2 -------------------------------------------------------------------

/// A run id, as schema 2 writes one (a UUID).
pub const RUN: &str = "5f0c6a52-3b1e-4c7d-9a8e-2d4f6b8c1a90";

/// Schema 1 records as schema 2 writes them: `schema` and `run` on every
/// record, seqnos from `first_seqno`, and histograms by bucket index.
pub fn as_v2(records: &[Value], run: &str, first_seqno: u64) -> Vec<Value> {
    (first_seqno..)
        .zip(records)
        .map(|(seqno, r)| {
            let mut r = r.clone();
            let o = r.as_object_mut().expect("a record is an object");
            for (key, value) in o.iter_mut() {
                if value.get("buckets").is_some() {
                    let scale = if key.ends_with("_us") { 1e-3 } else { 1.0 };
                    *value = hist_v2(value, scale);
                }
            }
            o.insert("schema".into(), json!(2));
            o.insert("run".into(), json!(run));
            o.insert("seqno".into(), json!(seqno));
            r
        })
        .collect()
}

/// A schema 1 histogram object in schema 2's form, encoded here from its
/// `[low, high, count]` triples (not by the writer's own encoder, so that the
/// two are checked against each other): bucket indexes from the kernel's
/// geometry, counts run-length coded.
pub fn hist_v2(h: &Value, scale: f64) -> Value {
    let mut out = h.clone();
    let o = out.as_object_mut().unwrap();
    let triples = o.remove("buckets").unwrap();
    let mut counts = Vec::new();
    let mut first = None;
    let mut next = 0;
    for t in triples.as_array().unwrap() {
        let low = (t[0].as_f64().unwrap() / scale).round() as u64;
        let index = crate::hist::bucket_index(low);
        let first = *first.get_or_insert(index);
        if index > next && index > first {
            counts.push(json!(-((index - next) as i64)));
        }
        counts.push(t[2].clone());
        next = index + 1;
    }
    o.insert("scale".into(), json!(scale));
    o.insert("first_bucket".into(), json!(first.unwrap_or(0)));
    o.insert("counts".into(), json!(counts));
    out
}

// ---- the recorded stream -------------------------------------------------------

const RECORDED_GZ: &[u8] = include_bytes!("fixtures/recorded.jsonl.gz");
const EPISODES: &str = include_str!("fixtures/episodes.jsonl");

/// The real recording, line by line.
pub fn recorded() -> Vec<String> {
    let mut text = String::new();
    flate2::read::GzDecoder::new(RECORDED_GZ)
        .read_to_string(&mut text)
        .expect("fixtures/recorded.jsonl.gz");
    text.lines().map(str::to_string).collect()
}

pub fn episode_lines() -> Vec<String> {
    EPISODES.lines().map(str::to_string).collect()
}

/// The recording with the handcrafted records inserted before its `stop`,
/// whose totals count them too: a stream as the finished tool would write.
pub fn recorded_with_episodes() -> Vec<String> {
    let mut lines = recorded();
    let stop_line = lines.pop().expect("a stop record");
    let mut stop: Value = serde_json::from_str(&stop_line).unwrap();
    assert_eq!(stop["type"], "stop");
    for l in episode_lines() {
        let v: Value = serde_json::from_str(&l).unwrap();
        let kind = v["type"].as_str().unwrap().to_string();
        let n = stop["records"][&kind].as_u64().unwrap_or(0);
        stop["records"][&kind] = json!(n + 1);
        lines.push(l);
    }
    lines.push(stop.to_string());
    lines
}

/// The contract of the stream this version writes (docs/schema.json).
pub fn schema_validator() -> jsonschema::Validator {
    validator(include_str!("../../../docs/schema.json"))
}

/// Schema 1's contract, as docs/schema.json was when stalltrace wrote it: the
/// report still reads such streams (the recording and the synthetic records
/// here are schema 1).
pub fn schema_1_validator() -> jsonschema::Validator {
    validator(include_str!("fixtures/schema-1.json"))
}

/// Schema 2's contract, as docs/schema.json was when stalltrace wrote it
/// (until `tcp_rtt` named its connection as the other TCP records do): what
/// [`as_v2`] makes, which the report still reads.
pub fn schema_2_validator() -> jsonschema::Validator {
    validator(include_str!("fixtures/schema-2.json"))
}

fn validator(schema: &str) -> jsonschema::Validator {
    let schema: Value = serde_json::from_str(schema).expect("schema is JSON");
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&schema)
        .expect("the schema compiles")
}

/// Panics with every violation when `record` breaks docs/schema.json.
pub fn assert_valid(v: &jsonschema::Validator, record: &Value) {
    let errors: Vec<String> = v
        .iter_errors(record)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect();
    assert!(errors.is_empty(), "{errors:?}\n{record}");
}
