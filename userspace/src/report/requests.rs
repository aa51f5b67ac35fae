//! SQL Server requests in the report: what each instance's clients waited for
//! over the run (`sql_requests`), split into the server's time and the
//! network's delivery, and the slowest requests with their sessions.

use std::collections::BTreeMap;

use super::merge::{MergedHist, Sparse, Unit};
use super::series::{self, Point, add_sparse};
use crate::records::sql_requests::{RequestCounts, SessionRequests, SqlRequestsRecord};

/// The slowest requests the report keeps per instance.
const SLOWEST_KEPT: usize = 10;

/// One instance's requests over the run.
#[derive(Clone, Debug)]
pub struct InstanceRequests {
    /// The worker.
    pub pid: u32,
    pub counts: RequestCounts,
    pub total: MergedHist,
    pub server: MergedHist,
    pub delivery: MergedHist,
    /// The slowest requests, slowest first, each with its session.
    pub slowest: Vec<SessionRequests>,
    /// What the clients waited for, interval by interval: the latency over time.
    pub series: Vec<RequestPoint>,
    /// The most sessions using MARS at once: their requests are in none of the figures.
    pub mars_sessions: u64,
}

/// One interval of an instance's requests (or several, merged: see `series`).
#[derive(Clone, Debug, PartialEq)]
pub struct RequestPoint {
    /// End of the interval (the record's `ts`), µs since the epoch.
    pub ts_us: i64,
    pub interval_ms: u64,
    pub total: Sparse,
}

impl Point for RequestPoint {
    fn absorb(&mut self, next: Self) {
        self.ts_us = next.ts_us;
        self.interval_ms += next.interval_ms;
        add_sparse(&mut self.total, &next.total);
    }
}

impl InstanceRequests {
    fn new(pid: u32) -> Self {
        Self {
            pid,
            counts: RequestCounts::default(),
            total: MergedHist::new(Unit::Micros),
            server: MergedHist::new(Unit::Micros),
            delivery: MergedHist::new(Unit::Micros),
            slowest: Vec::new(),
            series: Vec::new(),
            mars_sessions: 0,
        }
    }

    /// The share of the time the clients waited that was the network's
    /// delivery (exact: from the histograms' means), when there were requests.
    pub fn delivery_share(&self) -> Option<f64> {
        let delivery = self.delivery.mean()? * self.delivery.count() as f64;
        let total = self.total.mean()? * self.total.count() as f64;
        (total > 0.0).then(|| delivery / total)
    }
}

#[derive(Default)]
pub struct Requests {
    by_worker: BTreeMap<u32, InstanceRequests>,
}

impl Requests {
    /// The record of the interval that ended at `ts_us`.
    pub fn add(&mut self, r: &SqlRequestsRecord, ts_us: i64) {
        let i = self
            .by_worker
            .entry(r.pid)
            .or_insert_with(|| InstanceRequests::new(r.pid));
        i.counts.add(&r.counts);
        i.mars_sessions = i.mars_sessions.max(r.mars_sessions);
        let total = i.total.add_record(&r.total_us);
        series::push(
            &mut i.series,
            RequestPoint {
                ts_us,
                interval_ms: r.interval_ms,
                total,
            },
        );
        i.server.add_record(&r.server_us);
        i.delivery.add_record(&r.delivery_us);
        i.slowest.extend(r.by_session.iter().cloned());
        i.slowest
            .sort_by_key(|s| std::cmp::Reverse(s.slowest.total_us));
        i.slowest.truncate(SLOWEST_KEPT);
    }

    /// Instances with requests, by worker pid.
    pub fn finish(self) -> Vec<InstanceRequests> {
        self.by_worker
            .into_values()
            .filter(|i| i.counts.requests > 0 || i.mars_sessions > 0)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use serde_json::{Value, json};

    use crate::hist::Histogram;
    use crate::report::fixtures::{HOST, lines, start, stop, ts};
    use crate::report::html::render_html;
    use crate::report::model::Report;
    use crate::report::text::render_text;

    /// A histogram record of values in µs, as the daemon writes it.
    fn us(values: &[(u64, u64)]) -> Value {
        let mut h = Histogram::default();
        for &(v, n) in values {
            h.record(v * 1000, n);
        }
        serde_json::to_value(h.to_record(1e-3)).unwrap()
    }

    fn requests(at: f64, spid: u64, total_us: u64, retransmits: u64) -> Value {
        let slow = u64::from(total_us >= 200_000);
        json!({"ts": ts(at), "host": HOST, "type": "sql_requests", "interval_ms": 1000,
            "pid": 4242, "requests": 100, "retransmitted": retransmits, "slow": slow,
            "slow_retransmitted": slow.min(retransmits), "slow_ms": 200, "without_spid": 2,
            "total_us": us(&[(1000, 99), (total_us, 1)]),
            "server_us": us(&[(900, 100)]),
            "delivery_us": us(&[(100, 99), (total_us - 900, 1)]),
            "sessions": 1,
            "by_session": [{"spid": spid, "client": "10.0.0.9:50123", "requests": 100,
                "retransmitted": retransmits, "slow": slow,
                "slowest": {"arrived": ts(at - 0.5), "total_us": total_us, "server_us": 900,
                    "delivery_us": total_us - 900, "retransmits": retransmits, "response_bytes": 61}}]})
    }

    #[test]
    fn requests_are_summed_over_the_run_with_their_split_and_slowest() {
        let text = lines(&[
            start(),
            requests(1.0, 53, 2_000, 0),
            requests(2.0, 54, 244_000, 1),
            stop(2.0, json!({"start": 1, "sql_requests": 2}), json!({})),
        ]);
        let r = Report::from_text(&text).expect("a valid stream");
        assert_eq!(r.stream.unknown_types.len(), 0);
        assert!(r.stream.unreadable.is_empty(), "{:?}", r.stream.unreadable);
        let i = &r.requests[0];
        assert_eq!(
            (
                i.pid,
                i.counts.requests,
                i.counts.slow,
                i.counts.slow_retransmitted
            ),
            (4242, 200, 1, 1)
        );
        assert_eq!(i.slowest[0].spid, 54);
        let out = render_text(&r, 120);
        let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(flat.contains("SQL SERVER REQUESTS"), "{out}");
        assert!(
            flat.contains("sqlservr 4242: 200 requests (100 a second)"),
            "{out}"
        );
        assert!(
            flat.contains("1 took 200 ms or more: 1 met a retransmission"),
            "{out}"
        );
        assert!(
            flat.contains("SPID 54 10.0.0.9:50123 at 10:00:01.500: 244 ms = server 900 µs + delivery 243 ms (1 retransmission)"),
            "{out}"
        );
        assert!(
            flat.contains("4 requests before their session's SPID"),
            "{out}"
        );
        // The latency over time: one column per interval, the slow one's
        // request in its own row, the chart marked as the instance's.
        assert_eq!(i.series.len(), 2);
        assert_eq!(i.series[1].total.iter().map(|&(_, n)| n).sum::<u64>(), 100);
        let html = render_html(&r);
        assert!(html.contains("id=\"requests-section\""));
        let chart = html
            .split("data-worker=\"4242\"")
            .nth(1)
            .expect("a heatmap of the instance's requests");
        let chart = &chart[..chart.find("</svg>").unwrap()];
        assert!(
            chart.contains("sqlservr 4242 request latency over time"),
            "{chart}"
        );
        assert!(chart.contains("class=\"cell\""), "{chart}");
    }

    #[test]
    fn sessions_left_out_for_mars_are_said() {
        let mut mars = requests(2.0, 54, 2_000, 0);
        mars["mars_sessions"] = json!(3);
        let text = lines(&[
            start(),
            requests(1.0, 53, 2_000, 0),
            mars,
            stop(2.0, json!({"start": 1, "sql_requests": 2}), json!({})),
        ]);
        let r = Report::from_text(&text).expect("a valid stream");
        assert_eq!(r.requests[0].mars_sessions, 3);
        let out = render_text(&r, 120);
        let flat = out.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            flat.contains("up to 3 sessions used MARS: their requests are not in these figures"),
            "{out}"
        );
        assert!(render_html(&r).contains("up to 3 sessions used MARS"));
    }
}
