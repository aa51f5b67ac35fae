//! What stalltrace measured of the simulator's requests (`sql_requests`), in
//! a line for a scenario's conclusion: the clients' symptom as the kernel saw
//! it, beside the client's own figures. Read from the records as written; the
//! lab keeps no copy of stalltrace's types, so a record it cannot read shows.

use serde_json::Value;

use super::Outcome;
use crate::of_type;

impl Outcome {
    /// The requests of the scenario's simulator as stalltrace timed them, or
    /// None when it wrote none of them.
    pub fn requests_line(&self) -> Option<String> {
        let ours: Vec<&Value> = of_type(&self.records, "sql_requests")
            .into_iter()
            .filter(|r| self.sessions.iter().any(|s| r["pid"] == s.worker))
            .collect();
        let sum = |field: &str| -> u64 { ours.iter().filter_map(|r| r[field].as_u64()).sum() };
        let requests = sum("requests");
        if requests == 0 {
            return None;
        }
        let secs: f64 = ours
            .iter()
            .filter(|r| r["requests"].as_u64() > Some(0))
            .filter_map(|r| r["interval_ms"].as_f64())
            .sum::<f64>()
            / 1000.0;
        let most = |path: &[&str]| -> f64 {
            ours.iter()
                .filter_map(|r| path.iter().fold(*r, |v, k| &v[*k]).as_f64())
                .fold(0.0, f64::max)
        };
        // Time summed over every request: count × mean, per interval.
        let time = |part: &str| -> f64 {
            ours.iter()
                .map(|r| {
                    r[part]["count"].as_f64().unwrap_or(0.0)
                        * r[part]["mean"].as_f64().unwrap_or(0.0)
                })
                .sum()
        };
        let slowest = ours
            .iter()
            .flat_map(|r| r["by_session"].as_array().into_iter().flatten())
            .max_by_key(|s| s["slowest"]["total_us"].as_u64().unwrap_or(0));
        let mut line = format!(
            "stalltrace timed {requests} requests of the simulator ({:.0}/s over the {:.1} s they \
             ran in), p99 of an interval up to {:.1} ms; {} of {} ms or longer, {} of them with \
             a response retransmitted; {:.0}% of all their time was the network's delivery",
            requests as f64 / secs.max(0.001),
            secs,
            most(&["total_us", "p99"]) / 1000.0,
            sum("slow"),
            ours[0]["slow_ms"],
            sum("slow_retransmitted"),
            100.0 * time("delivery_us") / time("total_us").max(1.0),
        );
        if let Some(s) = slowest {
            let ms = |k: &str| s["slowest"][k].as_f64().unwrap_or(0.0) / 1000.0;
            line.push_str(&format!(
                "; the slowest, SPID {}: {:.1} ms, server {:.1} ms, delivery {:.1} ms",
                s["spid"],
                ms("total_us"),
                ms("server_us"),
                ms("delivery_us")
            ));
        }
        Some(line)
    }
}
