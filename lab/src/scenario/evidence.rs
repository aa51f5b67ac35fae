//! Every figure an episode gives as evidence is one its own window's records
//! hold: an episode can only report what was measured while it lasted.
//! Checked for the figures the records carry as they are:
//! - `device_ms_p99` (storage): the device time at p99 of one op's `block`
//!   record of the disk, in an interval of the episode;
//! - `rto_ms_max` (network): a retransmission timeout to the peer, a
//!   `tcp_retransmit` record in the episode's window (or read in its first
//!   interval);
//! - `slow_io_ms_max` (requests): a `slow_io` of the instance's worker, read
//!   in the episode's window.

use serde_json::Value;

use super::Outcome;
use crate::of_type;

/// µs since the epoch of an RFC 3339 time.
fn us(ts: &Value) -> Option<i64> {
    let t = chrono::DateTime::parse_from_rfc3339(ts.as_str()?).ok()?;
    Some(t.timestamp_micros())
}

fn evidence(stall: &Value, signal: &str) -> Option<f64> {
    stall["evidence"]
        .as_array()?
        .iter()
        .find(|e| e["signal"] == signal)?["value"]
        .as_f64()
}

impl Outcome {
    /// The episodes whose evidence figure no record of their window holds:
    /// one line each, naming the figure and the episode. Empty when all hold.
    pub fn evidence_not_in_records(&self) -> Vec<String> {
        let mut wrong = Vec::new();
        let interval_us = of_type(&self.records, "start")
            .first()
            .and_then(|s| s["interval_ms"].as_i64())
            .unwrap_or(1000)
            * 1000;
        for stall in self.episodes() {
            let (Some(start), Some(end)) = (us(&stall["start"]), us(&stall["end"])) else {
                continue;
            };
            let within = |r: &&Value| us(&r["ts"]).is_some_and(|t| t > start && t <= end);
            // An event is read at the collect after it: one that came just
            // before the episode's first interval began can be read in it.
            let read_within =
                |r: &&Value| us(&r["ts"]).is_some_and(|t| t >= start - interval_us && t <= end);
            if let Some(v) = evidence(stall, "device_ms_p99") {
                let held = of_type(&self.records, "block")
                    .into_iter()
                    .filter(within)
                    .filter(|r| r["dev"] == stall["dev"])
                    .filter_map(|r| r["device_us"]["p99"].as_f64())
                    .any(|p99| ((p99 / 1000.0 * 10.0).round() / 10.0 - v).abs() < 1e-9);
                if !held {
                    wrong.push(format!(
                        "device_ms_p99 {v} in no block record of its window: {stall}"
                    ));
                }
            }
            if let Some(v) = evidence(stall, "rto_ms_max") {
                let held = of_type(&self.records, "tcp_retransmit")
                    .into_iter()
                    .filter(read_within)
                    .filter(|r| r["kind"] == "rto" && r["timer"] == true)
                    .filter(|r| stall["peer"].is_null() || r["daddr"] == stall["peer"])
                    .filter_map(|r| r["rto_ms"].as_f64())
                    .any(|rto| (rto - v).abs() < 1e-9);
                if !held {
                    wrong.push(format!(
                        "rto_ms_max {v} in no tcp_retransmit of its window: {stall}"
                    ));
                }
            }
            if let Some(v) = evidence(stall, "slow_io_ms_max") {
                let held = of_type(&self.records, "slow_io")
                    .into_iter()
                    .filter(read_within)
                    .filter(|r| r["sql"]["pid"] == stall["worker_pid"])
                    .filter_map(|r| r["latency_us"].as_f64())
                    .any(|us| ((us / 1000.0 * 10.0).round() / 10.0 - v).abs() < 1e-9);
                if !held {
                    wrong.push(format!(
                        "slow_io_ms_max {v} in no slow_io of the worker in its window: {stall}"
                    ));
                }
            }
        }
        wrong
    }
}
