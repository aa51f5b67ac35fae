//! SQL Server requests: what the clients waited for, and where it went.

use super::{Stats, clean, count};
use crate::report::model::Report;
use crate::report::requests::RequestPoint;
use crate::report::time::{latency_us, thousands};

/// What `total` means, for the legend of either layout.
pub const TOTAL_MEANS: &str = "from the request's arrival at the server to its response's delivery \
     to the client: the server's time, then the network's (the request's own trip in is not seen \
     from the server)";

#[derive(Clone, Debug, PartialEq)]
pub struct RequestsView {
    /// `sqlservr 4242`
    pub instance: String,
    /// `12,345 requests (41.2 a second)`
    pub requests: String,
    /// Percentiles of what the clients waited for.
    pub total: Stats,
    pub server: Stats,
    pub delivery: Stats,
    /// `62% of the time waited was network delivery`
    pub split: String,
    /// `93 took 200 ms or more: 91 met a retransmission of their response`
    pub slow: String,
    /// `4 requests before their session's SPID was known (logins) are not counted`
    pub without_spid: Option<String>,
    /// `up to 2 sessions used MARS: their requests are not in these figures (...)`
    pub mars: Option<String>,
    /// The slowest requests: `SPID 53 10.0.0.9:50123 at 03:12:04.5: 244 ms = server 310 µs + delivery 244 ms (1 retransmission)`
    pub slowest: Vec<String>,
    /// The worker's pid, as episodes name the instance.
    pub pid: u32,
    /// `total` interval by interval, for the chart.
    pub series: Vec<RequestPoint>,
}

pub fn of(report: &Report) -> Vec<RequestsView> {
    let seconds = report.run.window_ms() / 1000.0;
    report
        .requests
        .iter()
        .map(|i| {
            let c = &i.counts;
            let rate = if seconds > 0.0 {
                format!(" ({} a second)", super::super::time::sig3(c.requests as f64 / seconds))
            } else {
                String::new()
            };
            let split = match i.delivery_share() {
                Some(share) => format!(
                    "{:.0}% of the time waited was network delivery, {:.0}% the server",
                    share * 100.0,
                    (1.0 - share) * 100.0
                ),
                None => "-".into(),
            };
            let slow = if c.slow == 0 {
                format!("none took {} ms or more", c.slow_ms)
            } else {
                format!(
                    "{} took {} ms or more: {} met a retransmission of their response{}",
                    thousands(c.slow),
                    c.slow_ms,
                    thousands(c.slow_retransmitted),
                    if c.slow_retransmitted < c.slow {
                        ", the rest were the server's own time or arrived late"
                    } else {
                        ""
                    }
                )
            };
            let slowest = i
                .slowest
                .iter()
                .map(|s| {
                    let r = &s.slowest;
                    let retransmits = if r.retransmits > 0 {
                        format!(" ({})", count(u64::from(r.retransmits), "retransmission", "retransmissions"))
                    } else {
                        String::new()
                    };
                    clean(&format!(
                        "SPID {} {} at {}: {} = server {} + delivery {}{retransmits}",
                        s.spid,
                        s.client.map_or("-".to_string(), |c| c.to_string()),
                        r.arrived.get(11..23).unwrap_or(&r.arrived),
                        latency_us(r.total_us as f64),
                        latency_us(r.server_us as f64),
                        latency_us(r.delivery_us as f64),
                    ))
                })
                .collect();
            RequestsView {
                instance: format!("sqlservr {}", i.pid),
                requests: format!("{}{rate}", count(c.requests, "request", "requests")),
                total: Stats::latency(&i.total),
                server: Stats::latency(&i.server),
                delivery: Stats::latency(&i.delivery),
                split,
                slow,
                without_spid: (c.without_spid > 0).then(|| {
                    format!(
                        "{} before their session's SPID was known (logins) are not in these figures",
                        count(c.without_spid, "request", "requests")
                    )
                }),
                mars: (i.mars_sessions > 0).then(|| {
                    format!(
                        "up to {} used MARS: their requests are not in these figures (several in \
                         flight on one connection cannot be told apart from its turns)",
                        count(i.mars_sessions, "session", "sessions")
                    )
                }),
                slowest,
                pid: i.pid,
                series: i.series.clone(),
            }
        })
        .collect()
}
