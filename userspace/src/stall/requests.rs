//! Request rules, per SQL Server instance: its requests took the slow
//! threshold or longer (the clients' symptom, `sql_requests`), and what the
//! time went to. The split of the slow requests says which side it was on:
//! the network's delivery of the responses (with the network episodes that
//! hit the instance's sessions), or the server's own time, spent waiting on a
//! disk it keeps files on (with that disk's storage episode) or on nothing
//! stalltrace sees (the server was busy: CPU, locks, the query itself).

use super::interval::{Finding, Interval, SqlState, held_back_ms};
use super::network::round1;
use crate::records::block::SlowIoRecord;
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
    let mut files = Vec::new();
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
                .max_by(|a, b| a.impact_ms.total_cmp(&b.impact_ms))
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
        server_side(iv, sql, others, q.pid, &mut evidence, &mut files)
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
    let subject = Subject {
        worker_pid: Some(q.pid),
        ..Default::default()
    };
    // the requests that took the threshold or longer
    let impact_ms = held_back_ms(iv.len_ms, c.slow as f64 / c.requests.max(1) as f64);
    Finding::new(
        Kind::Requests,
        subject,
        cause,
        impact_ms,
        evidence,
        next_step,
    )
    .with_sessions(sessions)
    .with_files(files)
}

/// The server took the time: what it waited on, if stalltrace saw it. A
/// storage episode on a disk the instance keeps files on, and the instance's
/// own I/Os slow enough to be reported (`slow_io`) in the interval: a log
/// disk that serves a few slow writes a second is below the storage rules'
/// sample floor, yet every commit waited for one.
fn server_side(
    iv: &Interval,
    sql: &SqlState,
    others: &[Finding],
    pid: u32,
    evidence: &mut Vec<Evidence>,
    files: &mut Vec<String>,
) -> (Cause, String) {
    let keeps_files = |o: &&Finding| {
        o.kind == Kind::Storage
            && o.subject
                .dev
                .as_deref()
                .and_then(|dev| iv.disk_key(dev))
                .is_some_and(|key| sql.keeps_files_on(pid, &key))
    };
    let disk = others
        .iter()
        .filter(keeps_files)
        .max_by(|a, b| a.impact_ms.total_cmp(&b.impact_ms));
    // The disk, as "loop3, which holds its log files".
    let disk_named = disk.map(|disk| {
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
        format!("{dev}{of}")
    });
    let own = own_slow_ios(iv, pid);
    if let Some(slowest) = own.first() {
        let like_it = |s: &&&SlowIoRecord| {
            s.dev == slowest.dev && s.op == slowest.op && s.file == slowest.file
        };
        let file = slowest.file.as_deref().unwrap_or("no file of the instance");
        let like = own.iter().filter(like_it).count();
        let op = slowest.op.name();
        evidence.push(
            Evidence::new(
                "slow_io_ms_max",
                round1(slowest.latency_us / 1000.0),
                format!(
                    "the server's own slow I/O meanwhile: {like} {op}{} to {file} on {} (of {} \
                     slow), the slowest {:.1} ms",
                    if like == 1 { "" } else { "s" },
                    slowest.dev,
                    own.len(),
                    slowest.latency_us / 1000.0
                ),
            )
            .unit("ms"),
        );
        let what = format!("{op}s to {file}");
        files.extend(own.iter().filter_map(|s| s.file.clone()));
        files.sort();
        files.dedup();
        let next = match disk_named {
            Some(_) => format!(
                "the server took the time, waiting on its {what} on {}: see the storage \
                 episode; the network delivered in time",
                slowest.dev
            ),
            None => format!(
                "the server took the time, waiting on its {what} on {}: check that disk and \
                 what is under it (its block records, the SAN, throttling); the network \
                 delivered in time",
                slowest.dev
            ),
        };
        return (Cause::ServerIo, next);
    }
    match disk_named {
        Some(disk) => (
            Cause::ServerIo,
            format!(
                "the server took the time, waiting on {disk}: see the storage episode; the \
                 network delivered in time"
            ),
        ),
        None => (
            Cause::ServerBusy,
            "the server took the time, and neither the network nor a disk of the instance was \
             slow meanwhile: look inside SQL Server (sys.dm_exec_requests and its wait \
             statistics for the sessions named: CPU, locks, the query's own work)"
                .to_string(),
        ),
    }
}

/// The instance's own slow I/Os of the interval (submitted by its worker),
/// the slowest first.
fn own_slow_ios(iv: &Interval, pid: u32) -> Vec<&SlowIoRecord> {
    let mut own: Vec<&SlowIoRecord> = iv
        .slow_ios
        .iter()
        .filter(|s| s.sql.as_ref().is_some_and(|t| t.pid == pid))
        .collect();
    own.sort_by(|a, b| b.latency_us.total_cmp(&a.latency_us));
    own
}

#[cfg(test)]
#[path = "requests_tests.rs"]
mod tests;
