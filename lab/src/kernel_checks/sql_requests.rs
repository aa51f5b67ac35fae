//! The request timing part of `sqlserver/spid`: each session's requests in
//! the `sql_requests` records against the client's own count and clock, on
//! every kernel and in both modes (the receive, send, retransmit and close
//! hooks of tds_turns.bpf.h). Bounds of tests/sqlserver.rs (there: quiet and
//! lossy runs, percentiles; here: the slow guest, under loss only).

use serde_json::Value;

use super::Judge;
use crate::records::Buckets;
use crate::sql::ClientReport;
use crate::{of_type, requests_untimed, retransmits_unjudged};

/// The `slow` threshold the records carry, µs (their `slow_ms`).
const SLOW_US: u64 = 200_000;

/// One session: its worker, `--encrypt`, and its client's report.
pub struct Session<'a> {
    pub worker: u32,
    pub encrypt: &'a str,
    pub report: &'a ClientReport,
}

/// `retransmits`: the server namespace's `tcp_retransmit` records.
pub fn judge_requests(
    judge: &mut Judge,
    records: &[Value],
    sessions: &[Session],
    retransmits: &[&Value],
) {
    let requests = of_type(records, "sql_requests");
    let untimed = requests_untimed(records);
    // A retransmission whose hook the kernel skipped in either family may
    // lack its verdict.
    let unjudged = untimed + retransmits_unjudged(records);
    let mut figures = vec![format!(
        "{untimed} requests untimed (hooks the kernel skipped)"
    )];
    for s in sessions {
        let Some(session) = s.report.0["sessions"].as_array().and_then(|a| a.first()) else {
            continue; // the SPID part has failed it already
        };
        let port = session["client_port"].as_u64().unwrap_or(0);
        let transactions = session["transactions"].as_u64().unwrap_or(0);
        let mine: Vec<&Value> = requests
            .iter()
            .filter(|r| r["pid"] == s.worker)
            .flat_map(|r| r["by_session"].as_array().into_iter().flatten())
            .filter(|b| {
                b["client"]
                    .as_str()
                    .and_then(|c| c.rsplit(':').next())
                    .and_then(|p| p.parse::<u64>().ok())
                    == Some(port)
            })
            .collect();
        let counted: u64 = mine
            .iter()
            .map(|b| b["requests"].as_u64().unwrap_or(0))
            .sum();
        let slow: u64 = mine.iter().map(|b| b["slow"].as_u64().unwrap_or(0)).sum();
        let arrivals: Vec<u64> = session["arrival_latencies_us"]
            .as_array()
            .map_or(Vec::new(), |a| a.iter().filter_map(Value::as_u64).collect());
        let client_slow = arrivals.iter().filter(|&&us| us >= SLOW_US).count() as u64;
        figures.push(format!(
            "{}: {counted} requests timed of {transactions} transactions + SELECT @@SPID, {slow} \
             slow (the client: {client_slow})",
            s.encrypt
        ));
        // Its transactions and the `SELECT @@SPID` after its login, less
        // those the kernel declared untimed. An encrypted session's first
        // requests may come before the TLS plaintext named its SPID (its
        // uprobes attach on demand): not timed then, never more than the
        // client made.
        let expected = transactions + 1;
        if s.encrypt == "not-supported" {
            judge.expect(counted <= expected && expected - counted <= untimed, || {
                format!(
                    "cleartext session from port {port}: {counted} requests timed, the client \
                     made {expected}, {untimed} declared untimed"
                )
            });
        } else {
            judge.expect(counted <= expected && counted * 2 >= expected, || {
                format!(
                    "{} session from port {port}: {counted} requests timed, the client made {expected}",
                    s.encrypt
                )
            });
        }
        // Loss began after the logins and only the server's sends were
        // dropped: each data segment sent again before the close held up the
        // response of the request then open.
        let data: Vec<&&Value> = retransmits
            .iter()
            .filter(|r| r["dport"] == port && r["state"] == "ESTABLISHED" && r["bytes"] != 0)
            .collect();
        let held_up = data
            .iter()
            .filter(|r| r["held_up_response"] == true)
            .count();
        figures.push(format!(
            "{held_up} of its {} data retransmissions held up a response",
            data.len()
        ));
        judge.expect((data.len() - held_up) as u64 <= unjudged, || {
            format!(
                "{} session from port {port}: {} of {} data retransmissions not judged to hold \
                 up a response ({unjudged} hooks skipped)",
                s.encrypt,
                data.len() - held_up,
                data.len()
            )
        });
        judge.expect(arrivals.len() as u64 == transactions, || {
            format!(
                "sqlclient gave receive times for {} of {transactions} requests",
                arrivals.len()
            )
        });
    }
    // Every slow request met a retransmission of its response or took the
    // server that long (a TCG guest's disk).
    let mine: Vec<&Value> = requests
        .iter()
        .copied()
        .filter(|r| sessions.iter().any(|s| r["pid"] == s.worker))
        .collect();
    let sum = |field: &str| -> u64 { mine.iter().map(|r| r[field].as_u64().unwrap_or(0)).sum() };
    let (slow, explained) = (sum("slow"), sum("slow_retransmitted"));
    figures.push(format!(
        "{explained} of {slow} slow requests met a retransmission"
    ));
    judge.note(figures.join("; "));
    let server_slow = if mine.is_empty() {
        0
    } else {
        Buckets::merge(&mine, "server_us")
            .count_at_least((SLOW_US / 2) as f64)
            .1
    };
    judge.expect(slow - explained <= server_slow, || {
        format!(
            "{} slow requests met no retransmission and only {server_slow} took the server over \
             {} ms",
            slow - explained,
            SLOW_US / 2000
        )
    });
}
