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
        let worst_p99_us = ours
            .iter()
            .filter_map(|r| r["total_us"]["p99"].as_f64())
            .fold(0.0, f64::max);
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
            worst_p99_us / 1000.0,
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
        let retransmits: Vec<&Value> = of_type(&self.records, "tcp_retransmit")
            .into_iter()
            .filter(|r| self.sessions.iter().any(|s| r["sql"]["pid"] == s.worker))
            .collect();
        if !retransmits.is_empty() {
            let held_up = retransmits
                .iter()
                .filter(|r| r["held_up_response"] == true)
                .count();
            line.push_str(&format!(
                "; {held_up} of the sessions' {} retransmissions held up a response",
                retransmits.len()
            ));
        }
        Some(line)
    }
}

#[cfg(test)]
mod tests {
    use super::super::{Fault, Outcome, Session};

    const TWO_INTERVALS: &str = r#"{"type":"sql_requests","pid":7,"interval_ms":500,"requests":6,"slow":1,"slow_retransmitted":1,"slow_ms":200,"total_us":{"count":6,"mean":50000.0,"p99":250000.0},"delivery_us":{"count":6,"mean":40000.0},"by_session":[{"spid":51,"slowest":{"total_us":250000,"server_us":300,"delivery_us":249700}}]}
{"type":"sql_requests","pid":7,"interval_ms":500,"requests":4,"slow":0,"slow_retransmitted":0,"slow_ms":200,"total_us":{"count":4,"mean":1000.0,"p99":1500.0},"delivery_us":{"count":4,"mean":100.0},"by_session":[]}
{"type":"tcp_retransmit","sql":{"pid":7,"spid":51},"held_up_response":true}
{"type":"tcp_retransmit","sql":{"pid":7,"spid":51}}
{"type":"tcp_retransmit","sql":{"pid":8,"spid":51},"held_up_response":true}
{"type":"sql_requests","pid":8,"interval_ms":500,"requests":99,"slow":0,"slow_retransmitted":0,"slow_ms":200,"total_us":{"count":99,"mean":1.0},"delivery_us":{"count":99,"mean":1.0},"by_session":[]}
"#;

    /// The scenario's instance only, summed over its intervals; the slowest
    /// request with its split.
    #[test]
    fn the_line_sums_the_scenarios_requests_over_their_intervals() {
        let mut o = Outcome::new("loss", Fault::Injected, TWO_INTERVALS.into());
        assert_eq!(o.requests_line(), None, "no sessions: no instance of ours");
        o.sessions = vec![Session {
            worker: 7,
            spid: 51,
            client: "10.0.0.1:50000".into(),
        }];
        let line = o.requests_line().unwrap();
        for part in [
            "timed 10 requests of the simulator (10/s over the 1.0 s they ran in)",
            "p99 of an interval up to 250.0 ms",
            "1 of 200 ms or longer, 1 of them with a response retransmitted",
            // (6 × 40 ms + 4 × 0.1 ms) of (6 × 50 ms + 4 × 1 ms)
            "79% of all their time was the network's delivery",
            "the slowest, SPID 51: 250.0 ms, server 0.3 ms, delivery 249.7 ms",
            "1 of the sessions' 2 retransmissions held up a response",
        ] {
            assert!(line.contains(part), "{part:?} not in {line}");
        }
    }
}
