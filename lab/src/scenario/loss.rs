//! `loss`: the duplex-mismatch story. The SQL Server simulator's OLTP load
//! (`sqlservr` in one namespace; in the other, an application on Microsoft's
//! ODBC Driver 18 with several sessions, encrypted as the driver does by
//! default) while the client's link drops packets at random (nftables
//! `numgen random` on the client's input: what the server sends is lost on
//! the wire). Each lost response is a retransmission timeout the transaction
//! waits out: the 200 ms tails. The sessions' SPIDs come from the TLS
//! plaintext: no credentials are given to stalltrace.

use std::time::Duration;

use super::{Expected, Fault, Outcome, ScratchDir, Session, tracer_args};
use crate::Bins;
use crate::net::{NetPair, Side, delta};
use crate::sql::{Odbc, Placement, SqlClientRun, SqlServerSim};
use crate::tracer::Tracer;

pub const ABOUT: &str = "SQL Server simulator OLTP load from ODBC Driver 18 (Encrypt=yes, TLS), 4 sessions; fault: 5% random loss on the client's link (received side)";

const SESSIONS: u32 = 4;
const RATE: u32 = 200;
const SECS: u32 = 8;
const LOSS_PERCENT: u8 = 5;

pub fn run(bins: &Bins, fault: Fault) -> Outcome {
    crate::require_root();
    bins.check();
    let odbc = Odbc::installed();
    let pair = NetPair::new();
    let files = ScratchDir::new("/var/tmp");
    let args = tracer_args(&[pair.netns(Side::A), pair.netns(Side::B)]);
    let mut tracer = Tracer::start(&bins.stalltrace, &args);
    let sim = SqlServerSim::start_small(
        bins,
        Placement::in_netns(pair.netns(Side::B)),
        &files.0,
        &[],
    );
    // Sessions opened once stalltrace knows the worker: the kernel reads each
    // one's SPID from its first response (in the TLS plaintext).
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_instance" && r["pid"] == sim.worker
    });
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let before = pair.counters(Side::B);
    let mut client = SqlClientRun::odbc(
        &odbc,
        Placement::in_netns(pair.netns(Side::A)),
        &sim,
        &server,
        "yes",
        SESSIONS,
        RATE,
        SECS,
    );
    client.wait_for_sessions(&pair, sim.port, SESSIONS as usize, Duration::from_secs(20));
    if fault == Fault::Injected {
        // Once the sessions exist: a lost SYN-ACK belongs to no session yet.
        pair.drop_random(Side::A, LOSS_PERCENT, Some(sim.port));
    }
    let report = client.finish();
    let dropped = pair.dropped_packets(Side::A);
    pair.clear_drops(Side::A);
    let k = delta(&before, &pair.counters(Side::B));
    std::thread::sleep(Duration::from_millis(1200));
    let stream = tracer.stop_text();

    let client_ip = pair.v4(Side::A).to_string();
    let sessions = Session::of_client(&report, sim.worker, &client_ip);
    let mut o = Outcome::new("loss", fault, stream);
    o.args = args.iter().map(|s| s.to_string()).collect();
    o.on_pair(&pair);
    o.figures = vec![
        format!(
            "ODBC Driver 18 (Encrypt=yes): {} transactions in {SECS} s over {SESSIONS} sessions, {} errors; latency p50 {} µs, p90 {} µs, p99 {} µs, max {} µs",
            report.transactions(),
            report.errors(),
            report.p50_us(),
            report.0["p90_us"],
            report.0["p99_us"],
            report.0["max_us"]
        ),
        format!(
            "sessions (SPID, client): {}",
            sessions
                .iter()
                .map(|s| format!("{} {}", s.spid, s.client))
                .collect::<Vec<_>>()
                .join(", ")
        ),
        format!(
            "loss: {dropped} packets dropped on the client's input; the server's namespace counted RetransSegs {}, TCPTimeouts {}, TCPLossProbes {}",
            k.get("Tcp.RetransSegs"),
            k.get("TcpExt.TCPTimeouts"),
            k.get("TcpExt.TCPLossProbes")
        ),
    ];
    if fault == Fault::Injected {
        o.expected = vec![Expected {
            kind: "network",
            cause: "retransmission_timeouts",
            field: "peer",
            value: client_ip,
            netns: Some(pair.netns_inode(Side::B)),
            sessions: sessions.clone(),
        }];
        // The symptom: the clients' requests slow, the time the network's
        // delivery of the responses. Which sessions had a slow request in an
        // interval is chance: none is required by name.
        o.expected.push(Expected::requests(
            "network_delivery",
            sim.worker,
            Vec::new(),
        ));
    }
    o.sessions = sessions;
    // Requests the server took 200 ms for without the fault (a busy host):
    // true, if the client saw them too.
    if fault == Fault::Clean {
        let client_max_us = report.0["max_us"].as_f64().unwrap_or(0.0);
        o.confirmed = super::slow_requests_seen_by_client(&o, client_max_us, "ODBC Driver 18");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::super::{Outcome, Session, slow_requests_seen_by_client};
    use super::*;

    const REQUESTS: &str = r#"{"type":"stall","phase":"closed","kind":"requests","cause":"server_busy","worker_pid":7,"start":"2026-11-28T13:00:00Z","end":"2026-11-28T13:00:01Z","evidence":[{"signal":"slow_requests","value":4,"unit":"count"},{"signal":"slowest_request_ms","value":234.9,"threshold":200.0,"unit":"ms"}]}"#;

    fn clean(worker: u32) -> Outcome {
        let mut o = Outcome::new("loss", Fault::Clean, format!("{REQUESTS}\n"));
        o.sessions = vec![Session {
            worker,
            spid: 51,
            client: "10.0.0.1:50000".into(),
        }];
        o
    }

    /// A requests episode of the scenario's simulator is judged: confirmed
    /// when the client saw a request as slow, unexpected when it did not.
    #[test]
    fn a_slow_request_without_the_fault_is_true_only_if_the_client_saw_it() {
        let mut o = clean(7);
        assert_eq!(o.ours().len(), 1);
        o.confirmed = slow_requests_seen_by_client(&o, 233_569.0, "the client");
        assert!(o.verdict().is_ok(), "{:?}", o.verdict());
        let mut o = clean(7);
        o.confirmed = slow_requests_seen_by_client(&o, 27_293.0, "the client");
        assert!(o.verdict().is_err());
        // Another instance's episode is not the scenario's.
        assert!(clean(8).ours().is_empty());
    }
}
