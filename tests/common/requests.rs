//! The request-latency oracle the SQL Server tests share: stalltrace's
//! `sql_requests` and `tcp_retransmit` records against each client's own
//! timing of every request (sqlclient's, and ODBC Driver 18's through
//! odbcload).

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Tracer, bins};
use serde::Deserialize;
use serde_json::Value;
use stalltrace::hist::{Histogram, HistogramRecord, bucket_index, bucket_range};
use stalltrace::records::sql_requests::{SLOW_REQUEST_MS, SqlRequestsRecord};
use stalltrace_lab::net::{NetPair, Side};
use stalltrace_lab::scenario::ScratchDir;
use stalltrace_lab::sql::{ClientReport, Placement, SqlServerSim};
use stalltrace_lab::{
    of_type, requests_untimed, retransmits_in, retransmits_unjudged, retransmits_unseen,
    sql_retransmit_hooks_skipped, sum_segs,
};

/// The simulator in the B namespace of its own veth pair, its files in a
/// scratch directory, started with `sim_args`, under a tracer that has found
/// it: the setup of the tests that drive it over the pair.
pub fn traced_sim(sim_args: &[&str]) -> (NetPair, ScratchDir, Tracer, SqlServerSim) {
    let pair = NetPair::new();
    let files = ScratchDir::new("/var/tmp");
    let mut tracer = Tracer::start(&["--interval", "500ms", "--slow-io-ms", "0"]);
    let sim = sim_found_by(&mut tracer, &pair, &files, sim_args);
    (pair, files, tracer, sim)
}

/// The simulator started in `pair`'s B namespace with its files in `files`,
/// once `tracer` has written its `sql_instance`.
pub fn sim_found_by(
    tracer: &mut Tracer,
    pair: &NetPair,
    files: &ScratchDir,
    sim_args: &[&str],
) -> SqlServerSim {
    let sim = SqlServerSim::start_small(
        &bins(),
        Placement::in_netns(pair.netns(Side::B)),
        &files.0,
        sim_args,
    );
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_instance" && r["pid"] == sim.worker
    });
    sim
}

/// `sql_requests` records of the sessions whose client ports are `ports`.
pub fn requests_of(records: &[Value], worker: u32, ports: &[u16]) -> Vec<SqlRequestsRecord> {
    of_type(records, "sql_requests")
        .into_iter()
        .filter(|r| r["pid"] == worker)
        .map(|r| SqlRequestsRecord::deserialize(r).expect("a sql_requests record"))
        .filter(|r| {
            r.by_session
                .iter()
                .any(|s| s.client.is_some_and(|c| ports.contains(&c.port())))
        })
        .collect()
}

/// One histogram of a run's intervals.
pub fn merged(
    records: &[SqlRequestsRecord],
    part: impl Fn(&SqlRequestsRecord) -> &HistogramRecord,
) -> Histogram {
    let mut h = Histogram::default();
    for r in records {
        for &(index, n) in &part(r).buckets {
            h.record(bucket_range(index).0, n);
        }
    }
    h
}

/// Requests that may have taken the server itself a slow request's time,
/// less a round trip (`fastest`, the client's fastest request).
pub fn server_slow(records: &[SqlRequestsRecord], fastest: u64) -> u64 {
    let server = merged(records, |r| &r.server_us);
    at_least(
        &server,
        (SLOW_REQUEST_MS * 1000).saturating_sub(fastest) * 1000,
    )
}

/// How many values of `h` may be `v` or more: those of every bucket reaching it.
pub fn at_least(h: &Histogram, v: u64) -> u64 {
    h.nonzero_buckets()
        .filter(|&(_, high, _)| high >= v)
        .map(|(_, _, n)| n)
        .sum()
}

/// Each session's (requests, slow) as stalltrace counted them, by client
/// port. A session discovery never saw open (one that came and went within
/// an interval, such as a probe of the port) has no client and is no one's
/// here: a session of the client's own without one would be missing from
/// its port's count, which `assert_counts_match` then says.
pub fn per_session(records: &[SqlRequestsRecord]) -> BTreeMap<u16, (u64, u64)> {
    let mut out: BTreeMap<u16, (u64, u64)> = BTreeMap::new();
    for s in records.iter().flat_map(|r| &r.by_session) {
        let Some(client) = s.client else {
            eprintln!(
                "a session with no client: SPID {}, {} requests",
                s.spid, s.requests
            );
            continue;
        };
        let e = out.entry(client.port()).or_default();
        e.0 += s.requests;
        e.1 += s.slow;
    }
    out
}

/// The client's oracle of one run, by client port: every request it timed.
/// sqlclient times each transaction from just before it wrote it to its
/// kernel's receipt of the response (SO_TIMESTAMPNS), so that the client's
/// own lateness on a busy host is not counted; odbcload times each call to
/// ODBC Driver 18 that sends one request (the `SELECT @@SPID` and its commit,
/// then an UPDATE and a commit per transaction), the driver's and Python's
/// own time included.
pub fn client_timings(name: &str, run: &ClientReport) -> BTreeMap<u16, Vec<u64>> {
    assert_eq!(run.errors(), 0, "{name}: {}", run.0);
    let mut out = BTreeMap::new();
    for s in run.0["sessions"].as_array().unwrap() {
        let transactions = s["transactions"].as_u64().unwrap();
        let (all, expected) = match s.get("request_latencies_us") {
            Some(odbc) => (odbc.as_array().unwrap(), 2 * transactions + 2),
            None => (s["arrival_latencies_us"].as_array().unwrap(), transactions),
        };
        assert_eq!(
            all.len() as u64,
            expected,
            "{name}: the client has no time for some requests"
        );
        let port = s["client_port"].as_u64().unwrap() as u16;
        out.insert(port, all.iter().map(|v| v.as_u64().unwrap()).collect());
    }
    out
}

/// Requests each session makes after its login and does not time (the login
/// itself arrives before the session has a SPID: `without_spid`). sqlclient:
/// its `SELECT @@SPID`. ODBC Driver 18 with autocommit off, as the simulator
/// received them: a transaction manager request that begins a transaction
/// right after the login (inside `connect`), and at the close an RPC to
/// `sp_unprepare` (the UPDATE was prepared) and a rollback.
pub fn untimed_by_client(run: &ClientReport) -> u64 {
    let odbc = run.0["sessions"][0].get("request_latencies_us").is_some();
    if odbc { 3 } else { 1 }
}

/// The value at quantile `q` of sorted `values`, by nearest rank.
pub fn nearest_rank(values: &[u64], q: f64) -> u64 {
    let rank = (q * values.len() as f64).ceil() as usize;
    values[rank.clamp(1, values.len()) - 1]
}

/// Each session's requests as stalltrace counted them equal the client's:
/// those it timed and those it did not (`untimed_by_client`), less those the
/// kernel declared untimed (none on a kernel that skips no hook).
pub fn assert_counts_match(
    name: &str,
    records: &[Value],
    counted: &BTreeMap<u16, (u64, u64)>,
    run: &ClientReport,
) {
    let untimed = requests_untimed(records);
    for (port, latencies) in client_timings(name, run) {
        let (requests, _) = counted.get(&port).copied().unwrap_or_default();
        let theirs = latencies.len() as u64 + untimed_by_client(run);
        assert!(
            requests <= theirs && theirs - requests <= untimed,
            "{name}: requests of the session from port {port}: stalltrace {requests}, the \
             client {theirs}, {untimed} declared untimed"
        );
    }
}

/// stalltrace's p50 and p99 of `total` within a bucket of the client's plus
/// one round trip (the client's fastest request is at least one).
pub fn assert_percentiles_match(name: &str, total: &Histogram, client: &[u64]) {
    for q in [0.5, 0.99] {
        assert_percentile(name, total, client, q, Bound::Both);
    }
}

/// Which way stalltrace's percentile may be off the client's.
#[derive(Clone, Copy, PartialEq)]
pub enum Bound {
    Both,
    /// At most the client's: its clock holds time the server cannot see.
    Below,
}

/// stalltrace's `q` of `total` within a bucket of the client's plus one round
/// trip (the client's fastest request is at least one), or, `Bound::Below`, at
/// most a bucket above it.
pub fn assert_percentile(name: &str, total: &Histogram, client: &[u64], q: f64, bound: Bound) {
    let theirs = nearest_rank(client, q);
    let ours = total.percentile(q).unwrap() / 1000.0;
    let (low, high) = bucket_range(bucket_index(theirs * 1000));
    let bucket = (high - low) as f64 / 1000.0;
    let (off, limit) = match bound {
        Bound::Both => ((ours - theirs as f64).abs(), bucket + client[0] as f64),
        Bound::Below => (ours - theirs as f64, bucket),
    };
    assert!(
        off <= limit,
        "{name}: p{} {ours:.0} µs against the client's {theirs} µs (bound {limit:.0} µs)",
        q * 100.0
    );
}

/// A lossy run's retransmissions of its sessions' responses, as the SQL
/// Server side judged them, against the client. The loss began after the
/// logins, so each of data before the close came during a timed request and
/// is judged; only the server's sends were dropped, so the client had a whole
/// response before it sent its next request, and each held up the response then open, for no
/// longer than the client waited (its slowest request, plus a round trip for
/// a tail probe racing its ACK). Every request the client waited 200 ms or
/// more for met one, the kernel's untimed requests aside, and those that
/// took the server that long (`server_slow`: the simulator's log flush on a
/// busy host). Where the kernel skipped a hook (`retransmits_unjudged`,
/// `requests_untimed`, and `unrecorded`: see `retransmits_unrecorded`), a
/// retransmission may have no record or no verdict.
pub fn assert_retransmits_held_up(
    name: &str,
    records: &[Value],
    server_port: u16,
    client: &BTreeMap<u16, Vec<u64>>,
    server_slow: u64,
    unrecorded: u64,
) {
    let untimed = requests_untimed(records);
    let skipped = untimed + retransmits_unjudged_or_unrecorded(records, unrecorded);
    for (&port, latencies) in client {
        let ours: Vec<&Value> = of_type(records, "tcp_retransmit")
            .into_iter()
            .filter(|r| r["sport"] == server_port && r["dport"] == port)
            .collect();
        // A FIN sent again after the close held up nothing, and has no verdict.
        let open = |r: &Value| r["state"] == "ESTABLISHED" && r["bytes"] != 0;
        let wrong: Vec<&&Value> = ours
            .iter()
            .filter(|r| (r["held_up_response"] == true) != open(r))
            .collect();
        assert!(
            !wrong.iter().any(|r| r["held_up_response"] == true),
            "{name}: port {port}: a retransmission after the close held up a response: {wrong:?}"
        );
        assert!(
            wrong.len() as u64 <= skipped,
            "{name}: port {port}: {} of {} retransmissions not judged to hold up a response \
             ({skipped} hooks skipped): {:?}",
            wrong.len(),
            ours.len(),
            &wrong[..wrong.len().min(3)]
        );
        let (fastest, slowest) = (latencies.iter().min(), latencies.iter().max());
        let longest_ms = (slowest.unwrap() + fastest.unwrap()) as f64 / 1000.0;
        // Each request the retransmissions held up, by its arrival (ns):
        // one session's requests are milliseconds apart.
        let mut arrivals: Vec<i64> = ours
            .iter()
            .filter(|r| r["held_up_response"] == true)
            .map(|r| {
                let waited = r["request_waited_ms"].as_f64().unwrap();
                assert!(
                    waited <= longest_ms,
                    "{name}: port {port}: a request waited {waited} ms for a retransmission, \
                     the client's slowest {longest_ms} ms: {r}"
                );
                let ts = chrono::DateTime::parse_from_rfc3339(r["ts"].as_str().unwrap()).unwrap();
                ts.timestamp_nanos_opt().unwrap() - (waited * 1e6) as i64
            })
            .collect();
        arrivals.sort_unstable();
        let held_up = (0..arrivals.len())
            .filter(|&i| i == 0 || arrivals[i] - arrivals[i - 1] > 1_000_000)
            .count() as u64;
        let slow = latencies
            .iter()
            .filter(|&&v| v >= SLOW_REQUEST_MS * 1000)
            .count() as u64;
        eprintln!(
            "{name}: port {port}: {} retransmissions held up {held_up} requests; the client \
             waited 200 ms or more for {slow}",
            ours.len()
        );
        assert!(
            held_up + skipped + server_slow >= slow,
            "{name}: port {port}: retransmissions held up {held_up} requests, the client waited \
             200 ms or more for {slow} ({skipped} hooks skipped, {server_slow} took the server \
             that long)"
        );
    }
}

/// Segments the server's namespace retransmitted (`kernel_segs`, its
/// `Tcp.RetransSegs` over the run) with no `tcp_retransmit` record: runs of the
/// hook the kernel skipped (on this VM's kernel, silently, while the
/// interrupted task is PID 1), which also cost the sqlserver family its verdict
/// on them, so a request they held up counts as fast. The kernel's count, not
/// only stalltrace's own (`tcp.retransmit_unseen_segs`): that one cannot find
/// those of a socket still open when the tracer stops, or whose close the
/// kernel skipped too.
pub fn retransmits_unrecorded(records: &[Value], netns: u64, kernel_segs: u64) -> u64 {
    let recorded = sum_segs(&retransmits_in(records, netns), |r| r["counted"] == true);
    let unrecorded = kernel_segs.saturating_sub(recorded);
    eprintln!(
        "the server's namespace retransmitted {kernel_segs} segments (RetransSegs), {recorded} \
         in tcp_retransmit records: {unrecorded} without; stalltrace declared {} unseen or \
         unjudged (every namespace)",
        retransmits_unjudged(records)
    );
    unrecorded
}

/// Retransmissions that may have held up a request with no verdict: those
/// the sqlserver family's hook skipped, and those with no record at all, as
/// stalltrace declared them or as the kernel counted them, whichever is more.
pub fn retransmits_unjudged_or_unrecorded(records: &[Value], unrecorded: u64) -> u64 {
    sql_retransmit_hooks_skipped(records) + retransmits_unseen(records).max(unrecorded)
}

/// A run's requests against its client's clock, all but the network's time
/// the server's, with no response sent again.
pub fn assert_server_time(name: &str, records: &[Value], worker: u32, report: &ClientReport) {
    let timings = client_timings(name, report);
    let ports: Vec<u16> = timings.keys().copied().collect();
    let ours = requests_of(records, worker, &ports);
    assert_counts_match(name, records, &per_session(&ours), report);
    let mut client: Vec<u64> = timings.values().flatten().copied().collect();
    client.sort_unstable();
    let (total, server, delivery) = (
        merged(&ours, |r| &r.total_us),
        merged(&ours, |r| &r.server_us),
        merged(&ours, |r| &r.delivery_us),
    );
    eprintln!(
        "{name}: client p50 {} µs p99 {} µs; stalltrace {} requests, total p50 {:?} p99 {:?}, \
         server p50 {:?}, delivery p50 {:?} max {:?}",
        nearest_rank(&client, 0.5),
        nearest_rank(&client, 0.99),
        total.count(),
        total.percentile(0.5),
        total.percentile(0.99),
        server.percentile(0.5),
        delivery.percentile(0.5),
        delivery.max()
    );
    assert_percentiles_match(name, &total, &client);
    let sum = |h: &Histogram| h.mean().unwrap_or(0.0) * h.count() as f64;
    assert!(
        sum(&server) >= 0.9 * sum(&total),
        "{name}: the server's share of the requests' time is {:.0}%",
        100.0 * sum(&server) / sum(&total).max(1.0)
    );
    assert_eq!(
        ours.iter().map(|r| r.counts.retransmitted).sum::<u64>(),
        0,
        "{name}: a response retransmitted on loopback"
    );
}
