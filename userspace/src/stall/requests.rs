//! Request rules, per SQL Server instance: its requests took the slow
//! threshold or longer (the clients' symptom, `sql_requests`), and what the
//! time went to. The split of the slow requests says which side it was on:
//! the network's delivery of the responses (with the network episodes that
//! hit the instance's sessions), or the server's own time, spent waiting on a
//! disk it keeps files on (with that disk's storage episode) or on nothing
//! stalltrace sees (the server was busy: CPU, locks, the query itself).

use super::interval::{Finding, Interval, SqlState, Tally, held_back_ms};
use super::network::round1;
use crate::records::sql::{SessionKind, SqlTag};
use crate::records::sql_requests::{SessionRequests, SqlRequestsRecord};
use crate::records::stall::{Cause, Evidence, Kind, Subject};

/// Delivery's share of the slow requests' time above which the network, not
/// the server, is what the clients waited for.
const DELIVERY_SHARE: f64 = 0.5;

pub fn slow(iv: &Interval, sql: &SqlState, others: &[Finding]) -> Vec<Finding> {
    iv.requests
        .iter()
        .filter(|q| q.counts.slow > 0)
        .map(|q| instance(iv, sql, others, q))
        .collect()
}

/// Where the slow requests' time went: (server µs, delivery µs), from the
/// slowest request of each listed session that was slow; from the histograms'
/// tails when none of those was (a slow request of a session not listed).
fn split(q: &SqlRequestsRecord, slow: &[&SessionRequests]) -> (f64, f64) {
    if slow.is_empty() {
        let at = q.counts.slow_ms as f64 * 1000.0;
        return (q.server_us.sum_at_least(at), q.delivery_us.sum_at_least(at));
    }
    slow.iter().fold((0.0, 0.0), |(server, delivery), s| {
        (
            server + s.slowest.server_us as f64,
            delivery + s.slowest.delivery_us as f64,
        )
    })
}

fn instance(iv: &Interval, sql: &SqlState, others: &[Finding], q: &SqlRequestsRecord) -> Finding {
    let c = &q.counts;
    let slow_us = c.slow_ms as f64 * 1000.0;
    let slow: Vec<&SessionRequests> = q
        .by_session
        .iter()
        .filter(|s| s.slowest.total_us as f64 >= slow_us)
        .collect();
    let (server_us, delivery_us) = split(q, &slow);
    let delivery_share = delivery_us / (server_us + delivery_us).max(1.0);
    let mut evidence = vec![
        Evidence::new(
            "slow_requests",
            c.slow,
            format!(
                "{} of {} requests took {} ms or longer (p99 {:.1} ms, max {:.1} ms)",
                c.slow,
                c.requests,
                c.slow_ms,
                q.total_us.p99() / 1000.0,
                q.total_us.max() / 1000.0
            ),
        )
        .unit("count"),
    ];
    if let Some(worst) = slow.first() {
        let r = &worst.slowest;
        evidence.push(
            Evidence::new(
                "slowest_request_ms",
                round1(r.total_us as f64 / 1000.0),
                format!(
                    "the slowest, SPID {}{}: {:.1} ms, {:.1} ms of it the server's and {:.1} ms \
                     the network's delivery{}",
                    worst.spid,
                    worst
                        .client
                        .map(|c| format!(" from {c}"))
                        .unwrap_or_default(),
                    r.total_us as f64 / 1000.0,
                    r.server_us as f64 / 1000.0,
                    r.delivery_us as f64 / 1000.0,
                    match r.retransmits {
                        0 => String::new(),
                        1 => " (its response retransmitted once)".to_string(),
                        n => format!(" (its response retransmitted {n} times)"),
                    }
                ),
            )
            .unit("ms")
            .threshold(c.slow_ms as f64),
        );
    }
    evidence.push(
        Evidence::new(
            "delivery_fraction",
            round1(delivery_share * 100.0) / 100.0,
            format!(
                "{:.0}% of the slow requests' time was the network delivering their responses",
                delivery_share * 100.0
            ),
        )
        .unit("fraction")
        .threshold(DELIVERY_SHARE),
    );
    let most = |a: &&Finding, b: &&Finding| a.impact_ms.total_cmp(&b.impact_ms);
    let (cause, next_step) = if delivery_share >= DELIVERY_SHARE {
        evidence.push(
            Evidence::new(
                "slow_retransmitted",
                c.slow_retransmitted,
                format!(
                    "{} of the {} slow requests met a retransmission of their response",
                    c.slow_retransmitted, c.slow
                ),
            )
            .unit("count"),
        );
        // The network episode that hit the slow sessions, else one that hit
        // another session of the instance.
        let hit = |spids: &dyn Fn(Option<u16>) -> bool| {
            others
                .iter()
                .filter(|o| {
                    o.kind == Kind::Network
                        && o.sessions.iter().any(|t| t.pid == q.pid && spids(t.spid))
                })
                .max_by(most)
        };
        let slow_spid = |spid: Option<u16>| slow.iter().any(|s| Some(s.spid) == spid);
        if let Some(net) = hit(&slow_spid).or_else(|| hit(&|_| true)) {
            let place = net
                .subject
                .peer
                .clone()
                .or_else(|| net.subject.iface.clone())
                .unwrap_or_default();
            evidence.push(Evidence::new(
                "network_episode",
                place.clone(),
                format!("meanwhile, on the way to {place}: {}", net.headline()),
            ));
        }
        // The same words whether or not this interval had the network
        // episode: an episode keeps its first interval's next step.
        let next = "the network delivered the responses late: see the network episodes of the \
                    clients' addresses named (retransmission timeouts, loss on the path) and fix \
                    those; the server answered in time"
            .to_string();
        (Cause::NetworkDelivery, next)
    } else {
        let keeps_files = |o: &&Finding| {
            o.kind == Kind::Storage
                && o.subject
                    .dev
                    .as_deref()
                    .and_then(|dev| iv.disk_key(dev))
                    .is_some_and(|key| sql.keeps_files_on(q.pid, &key))
        };
        match others.iter().filter(keeps_files).max_by(most) {
            Some(disk) => {
                let dev = disk.subject.dev.clone().unwrap_or_default();
                let of = disk
                    .role
                    .as_ref()
                    .map(|r| format!(", which holds its {r} files"))
                    .unwrap_or_default();
                evidence.push(Evidence::new(
                    "storage_episode",
                    dev.clone(),
                    format!("meanwhile {dev}{of} was slow: {}", disk.headline()),
                ));
                (
                    Cause::ServerIo,
                    format!(
                        "the server took the time, waiting on {dev}{of}: see the storage episode; \
                         the network delivered in time"
                    ),
                )
            }
            None => (
                Cause::ServerBusy,
                "the server took the time, and neither the network nor a disk of the instance \
                 was slow meanwhile: look inside SQL Server (sys.dm_exec_requests and its wait \
                 statistics for the sessions named: CPU, locks, the query's own work)"
                    .to_string(),
            ),
        }
    };
    // As the session's own records describe it, where they are in the stream.
    let sessions = slow
        .iter()
        .map(|s| {
            sql.session_with_spid(q.pid, s.spid)
                .cloned()
                .unwrap_or_else(|| SqlTag {
                    pid: q.pid,
                    kind: Some(SessionKind::Client),
                    spid: Some(s.spid),
                    client: s.client.map(|c| c.to_string()),
                    ..Default::default()
                })
        })
        .collect();
    Finding {
        kind: Kind::Requests,
        subject: Subject {
            worker_pid: Some(q.pid),
            ..Default::default()
        },
        cause,
        role: None,
        // the requests that took the threshold or longer
        impact_ms: held_back_ms(iv.len_ms, c.slow as f64 / c.requests.max(1) as f64),
        evidence,
        next_step,
        sessions,
        files: Vec::new(),
        tally: Tally::default(),
    }
}

#[cfg(test)]
#[path = "requests_tests.rs"]
mod tests;
