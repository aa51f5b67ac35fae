//! End-to-end tests of encrypted SQL Server sessions, as today's drivers make
//! them: Microsoft's ODBC Driver 18 (mssql-python) with `Encrypt=yes` (its
//! default), `strict` (TDS 8.0) and `optional` (the login only), and FreeTDS
//! with `encryption = require`, against the simulator doing TLS through the
//! host's libssl with each BIO style. stalltrace runs with no SQL Server
//! options and no credentials: the SPIDs of encrypted sessions come from the
//! plaintext of the worker's `SSL_write` (uprobes), tied to each socket by
//! the TLS record its thread sends next.
//!
//! Oracles: each client's own `SELECT @@SPID` on each connection and its
//! client port from the kernel (/proc, ss), and the server namespace's
//! /proc/net/snmp RetransSegs.
//!
//! Run as root (`cargo xtask test`, which installs mssql-python, FreeTDS and
//! builds the statically linked simulator); nextest runs them one at a time
//! with the other privileged tests (.config/nextest.toml).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use common::netlab::{Side, delta};
use common::requests::*;
use common::sqllab::{FreeTds, Odbc, Placement, SqlClientRun, SqlServerSim};
use common::*;
use serde_json::Value;
use stalltrace_lab::scenario::ScratchDir;
use stalltrace_lab::{SqlSide, kernel_objects};

const LOSS_PERCENT: u8 = 4;
const SECS: u32 = 10;

/// One client's sessions: client port -> SPID, and how stalltrace must have learned it.
struct Clients {
    sessions: BTreeMap<u16, u16>,
    source: BTreeMap<u16, &'static str>,
    /// Client port -> which client (driver and its encryption) made it.
    client: BTreeMap<u16, String>,
}

impl Clients {
    fn add(&mut self, what: &str, sessions: Vec<(u16, u16)>, source: &'static str) {
        for (port, spid) in sessions {
            assert!(
                self.sessions.insert(port, spid).is_none(),
                "{what}: client port {port} twice"
            );
            self.source.insert(port, source);
            self.client.insert(port, what.to_string());
        }
    }

    /// Per client, how many of `retransmits` hit its sessions.
    fn hits(&self, retransmits: &[&Value]) -> BTreeMap<&str, usize> {
        let mut hits: BTreeMap<&str, usize> = BTreeMap::new();
        for r in retransmits {
            let port = r["dport"].as_u64().unwrap_or(0) as u16;
            if let Some(client) = self.client.get(&port) {
                *hits.entry(client).or_default() += 1;
            }
        }
        hits
    }
}

/// Every retransmission the server's namespace counts, under loss on the
/// client's link, is in a record naming its session with the SPID that
/// session's client got from `SELECT @@SPID`, whatever the encryption.
fn encrypted_retransmits_name_their_session(bio: &str) {
    require_root();
    let odbc = Odbc::installed();
    let (pair, _files, tracer, sim) = traced_sim(&["--tls-bio", bio]);
    let host = pair.v4(Side::B).to_string();
    let server = format!("{host}:{}", sim.port);
    let client_side = Placement::in_netns(pair.netns(Side::A));
    let before = pair.counters(Side::B);
    let mut runs: Vec<(&str, SqlClientRun)> = [("yes", 2), ("strict", 2), ("optional", 1)]
        .into_iter()
        .map(|(mode, n)| {
            let run = SqlClientRun::odbc(&odbc, client_side, &sim, &server, mode, n, 60, SECS);
            (mode, run)
        })
        .collect();
    let mut freetds = FreeTds::login(client_side, pair.netns(Side::A), &host, sim.port);
    runs[0]
        .1
        .wait_for_sessions(&pair, sim.port, 6, Duration::from_secs(60));
    // Loss once the sessions exist: a lost SYN-ACK belongs to no session yet.
    pair.drop_random(Side::A, LOSS_PERCENT, Some(sim.port));
    let freetds_answers = freetds.run_queries(Duration::from_millis(50), SECS - 2);
    let reports: Vec<_> = runs
        .into_iter()
        .map(|(mode, run)| (mode, run.finish()))
        .collect();
    pair.clear_drops(Side::A);
    let after = pair.counters(Side::B);
    std::thread::sleep(Duration::from_millis(1200));
    let stderr = tracer.stderr_text();
    let records = tracer.stop();

    let mut clients = Clients {
        sessions: BTreeMap::new(),
        source: BTreeMap::new(),
        client: BTreeMap::new(),
    };
    for (mode, report) in &reports {
        eprintln!(
            "ODBC Encrypt={mode}: {} transactions, {} errors, p50 {} µs, p99 {} µs",
            report.transactions(),
            report.errors(),
            report.p50_us(),
            report.0["p99_us"]
        );
        assert_eq!(report.errors(), 0, "ODBC Encrypt={mode}: {}", report.0);
        let source = if *mode == "optional" {
            "tds_header" // encrypted for the login only: headers on the wire
        } else {
            "tls_plaintext"
        };
        clients.add(&format!("ODBC Encrypt={mode}"), report.sessions(), source);
    }
    assert!(freetds_answers > 0, "FreeTDS ran no query");
    clients.add(
        "FreeTDS encryption=require",
        vec![(freetds.client_port, freetds.spid)],
        "tls_plaintext",
    );
    assert_eq!(clients.sessions.len(), 6, "{:?}", clients.sessions);
    let mut spids: Vec<u16> = clients.sessions.values().copied().collect();
    spids.sort_unstable();
    spids.dedup();
    assert_eq!(
        spids.len(),
        6,
        "SPIDs are per session: {:?}",
        clients.sessions
    );
    assert!(
        !stderr.contains("no SPIDs from TLS"),
        "stalltrace could not watch the worker's TLS: {stderr}"
    );

    // Every session, identified with its client's SPID, from where it must be.
    let client_ip = pair.v4(Side::A).to_string();
    let session_records = of_type(&records, "sql_session");
    for (port, spid) in &clients.sessions {
        let remote = format!("{client_ip}:{port}");
        let source = clients.source[port];
        let named = session_records.iter().any(|r| {
            r["pid"] == sim.worker
                && r["remote"] == remote.as_str()
                && r["spid"] == *spid
                && r["spid_source"] == source
                && r["encrypted"] == (source == "tls_plaintext")
        });
        let seen: Vec<&&Value> = session_records
            .iter()
            .filter(|r| r["remote"] == remote.as_str())
            .collect();
        assert!(
            named,
            "{remote}: no sql_session with SPID {spid} from {source}: {seen:?}"
        );
    }

    // Every retransmission in the server's namespace, against the kernel's count.
    let retransmits = retransmits_in(&records, pair.netns_inode(Side::B));
    let counted = sum_segs(&retransmits, |r| r["counted"] == true);
    let kernel = delta(&before, &after).get("Tcp.RetransSegs");
    let lost: Vec<&Value> = of_type(&records, "lost")
        .into_iter()
        .filter(|r| {
            r["by_source"]
                .as_object()
                .is_some_and(|m| m.keys().any(|k| k.starts_with("sqlserver.")))
        })
        .collect();
    eprintln!(
        "--tls-bio {bio}: {} retransmit records ({:?}), {counted} counted segments, kernel \
         RetransSegs {kernel}; sessions (client port: SPID) {:?}; sqlserver losses {lost:?}",
        retransmits.len(),
        clients.hits(&retransmits),
        clients.sessions
    );
    assert!(kernel >= 20, "too little loss to judge: {kernel} segments");
    let off = (counted as f64 - kernel as f64).abs() / kernel as f64;
    assert!(
        off <= 0.05,
        "counted segments {counted} vs RetransSegs {kernel}"
    );
    let side = SqlSide {
        worker: sim.worker,
        server_port: sim.port,
        client_ip: &client_ip,
        sessions: &clients.sessions,
    };
    let wrong = side.misnamed(&retransmits);
    assert!(
        wrong.is_empty(),
        "{} of {} retransmits do not name their session (SPID, client port): {:?}",
        wrong.len(),
        retransmits.len(),
        &wrong[..wrong.len().min(3)]
    );
}

#[test]
fn memory_bio_sessions_are_named_under_loss() {
    encrypted_retransmits_name_their_session("memory");
}

#[test]
fn socket_bio_sessions_are_named_under_loss() {
    encrypted_retransmits_name_their_session("socket");
}

/// ODBC Driver 18's requests (`Encrypt=yes`, its default: TLS for the whole
/// session), timed from the server's side of each connection, against the
/// driver's own time for each call that sends one: clean, then with 5% of
/// what the server sends dropped.
#[test]
fn odbc_requests_are_timed_as_the_driver_timed_them() {
    require_root();
    let odbc = Odbc::installed();
    // Dropped in reverse: the simulator, the tracer, the files, the pair.
    let (pair, _files, tracer, sim) = traced_sim(&[]);
    let server_start = pair.counters(Side::B);
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let client_side = Placement::in_netns(pair.netns(Side::A));
    let clean = SqlClientRun::odbc(&odbc, client_side, &sim, &server, "yes", 4, 100, 6).finish();
    // The runs' requests in intervals of their own.
    std::thread::sleep(Duration::from_millis(1500));
    let mut run = SqlClientRun::odbc(&odbc, client_side, &sim, &server, "yes", 4, 100, 12);
    run.wait_for_logins(&pair, sim.port, 4, Duration::from_secs(60));
    let (client_before, server_before) = (pair.counters(Side::A), pair.counters(Side::B));
    pair.drop_random(Side::A, 5, Some(sim.port));
    let lossy = run.finish();
    pair.clear_drops(Side::A);
    // What each side's TCP did meanwhile: a client's own timeout, which the
    // server cannot see, would show here when the figures below disagree.
    for (side, name, before) in [
        (Side::A, "client", &client_before),
        (Side::B, "server", &server_before),
    ] {
        let k = delta(before, &pair.counters(side));
        eprintln!(
            "ODBC, lossy: the {name}'s namespace: RetransSegs {}, TCPTimeouts {}, \
             TCPLossProbes {}, TCPSpuriousRTOs {}",
            k.get("Tcp.RetransSegs"),
            k.get("TcpExt.TCPTimeouts"),
            k.get("TcpExt.TCPLossProbes"),
            k.get("TcpExt.TCPSpuriousRTOs"),
        );
    }
    std::thread::sleep(Duration::from_millis(1200));
    let server_retrans = delta(&server_start, &pair.counters(Side::B)).get("Tcp.RetransSegs");
    let records = tracer.stop();
    let unrecorded = retransmits_unrecorded(&records, pair.netns_inode(Side::B), server_retrans);
    for (name, run) in [("ODBC, clean", &clean), ("ODBC, lossy", &lossy)] {
        let timings = client_timings(name, run);
        let ports: Vec<u16> = timings.keys().copied().collect();
        let ours = requests_of(&records, sim.worker, &ports);
        let counted = per_session(&ours);
        let mut client: Vec<u64> = timings.values().flatten().copied().collect();
        client.sort_unstable();
        let total = merged(&ours, |r| &r.total_us);
        eprintln!(
            "{name}: the driver p50 {} µs p99 {} µs max {} µs min {} µs; stalltrace {} \
             requests, total p50 {:?} p99 {:?} max {:?}; per session {counted:?}",
            nearest_rank(&client, 0.5),
            nearest_rank(&client, 0.99),
            nearest_rank(&client, 1.0),
            client[0],
            total.count(),
            total.percentile(0.5),
            total.percentile(0.99),
            total.max(),
        );
        assert_counts_match(name, &records, &counted, run);
        // The driver's clock holds its own work, TLS's and Python's (here
        // about a quarter of a millisecond a call at p50), which the server's
        // side cannot see: stalltrace's figures are at most the driver's,
        // and where the retransmission timeouts make the tail, its p99 is
        // the driver's.
        assert_percentile(name, &total, &client, 0.5, Bound::Below);
        if name.ends_with("lossy") {
            assert_percentile(name, &total, &client, 0.99, Bound::Both);
            let server_slow = server_slow(&ours, client[0]);
            assert_retransmits_held_up(name, &records, sim.port, &timings, server_slow, unrecorded);
        } else {
            assert_percentile(name, &total, &client, 0.99, Bound::Below);
        }
    }
}

/// The simulator linked statically against OpenSSL (`cargo xtask test`
/// builds it): the worker maps no libssl, so stalltrace says so in one line,
/// its sessions stay `encrypted` without a SPID, and nothing else is lost.
#[test]
fn a_worker_without_libssl_is_said_once_and_nothing_else_is_lost() {
    require_root();
    let static_sim = PathBuf::from(std::env::var_os("STALLTRACE_SQLSERVR_STATIC").expect(
        "STALLTRACE_SQLSERVR_STATIC names the statically linked simulator (`cargo xtask test` \
         builds it)",
    ));
    let mut bins = bins();
    bins.sqlservr = static_sim;
    let files = ScratchDir::new("/var/tmp");
    let mut tracer = Tracer::start(&["--interval", "500ms", "--slow-io-ms", "0"]);
    let sim = SqlServerSim::start_small(&bins, Placement::default(), &files.0, &[]);
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_instance" && r["pid"] == sim.worker
    });
    let server = format!("127.0.0.1:{}", sim.port);
    let report =
        SqlClientRun::sqlclient(&bins, Placement::default(), &server, "on", 2, 50, 3).finish();
    std::thread::sleep(Duration::from_millis(1200));
    let stderr = tracer.stderr_text();
    let records = tracer.stop();
    assert_eq!(report.errors(), 0, "{}", report.0);

    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains(&format!("sqlservr {}", sim.worker)))
        .collect();
    assert_eq!(said.len(), 1, "one line about the worker: {stderr}");
    assert!(
        said[0].contains("maps no libssl.so") && said[0].contains("--sql-dmv"),
        "{}",
        said[0]
    );
    let instance = of_type(&records, "sql_instance")
        .into_iter()
        .rfind(|r| r["pid"] == sim.worker)
        .unwrap();
    assert_eq!(instance["tls"]["state"], "unavailable", "{instance}");

    let ports: Vec<u16> = report.sessions().into_iter().map(|(p, _)| p).collect();
    for port in ports {
        let remote = format!("127.0.0.1:{port}");
        let seen: Vec<&Value> = of_type(&records, "sql_session")
            .into_iter()
            .filter(|r| r["remote"] == remote.as_str())
            .collect();
        assert!(
            seen.iter()
                .any(|r| r["event"] == "identified" && r["encrypted"] == true),
            "{remote} encrypted: {seen:?}"
        );
        assert!(
            seen.iter().all(|r| r.get("spid").is_none()),
            "never a guessed SPID: {seen:?}"
        );
    }
    // Nothing but hooks the kernel skipped host-wide (a busy host's I/O).
    let lost: Vec<(&String, &Value)> = of_type(&records, "lost")
        .into_iter()
        .filter_map(|r| r["by_source"].as_object())
        .flatten()
        .filter(|(source, _)| !stalltrace_lab::records::kernel_skipped(source))
        .collect();
    assert!(lost.is_empty(), "nothing lost: {lost:?}");
}

/// `--sql-tls on-demand` with no grace: the uprobes leave at the first
/// refresh after the worker's discovery (no session needs them), and a
/// session opened later rings the kernel's doorbell: they come back, and the
/// session gets its SPID from a later response.
#[test]
fn a_session_after_the_uprobes_left_brings_them_back() {
    require_root();
    let files = ScratchDir::new("/var/tmp");
    let mut tracer = Tracer::start_with_env(
        &["--interval", "300ms", "--slow-io-ms", "0"],
        &[("STALLTRACE_TEST_TLS_GRACE_MS", "0")],
    );
    let sim = SqlServerSim::start_small(&bins(), Placement::default(), &files.0, &[]);
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_instance" && r["pid"] == sim.worker
    });
    // Past a few refreshes: the uprobes have left.
    std::thread::sleep(Duration::from_secs(1));
    let ssl_write = ["on_ssl_write", "on_ssl_write_ex"];
    let links = kernel_objects::perf_event_links_of(tracer.pid(), &ssl_write);
    assert_eq!(links, 0, "no session needs the uprobes: none attached");
    let server = format!("127.0.0.1:{}", sim.port);
    let report =
        SqlClientRun::sqlclient(&bins(), Placement::default(), &server, "on", 2, 20, 3).finish();
    std::thread::sleep(Duration::from_millis(1000));
    let records = tracer.stop();
    assert_eq!(report.errors(), 0, "{}", report.0);
    for (port, spid) in report.sessions() {
        let remote = format!("127.0.0.1:{port}");
        let seen: Vec<&Value> = of_type(&records, "sql_session")
            .into_iter()
            .filter(|r| r["remote"] == remote.as_str())
            .collect();
        assert!(
            seen.iter()
                .any(|r| r["spid"] == spid && r["spid_source"] == "tls_plaintext"),
            "{remote} (SPID {spid}): {seen:?}"
        );
    }
}

/// An encrypted MARS session that sits idle after its login, as a pooled
/// connection opened ahead of use does: named at its login, whether it is
/// MARS is still unread, yet it keeps the uprobes no longer than the grace
/// after it stopped sending (each costs every SSL_write of the worker); its
/// first response brings them back, and they read that it is MARS.
#[test]
fn an_idle_session_keeps_no_uprobe_and_is_still_found_to_be_mars() {
    require_root();
    let files = ScratchDir::new("/var/tmp");
    let mut tracer = Tracer::start_with_env(
        &["--interval", "300ms", "--slow-io-ms", "0"],
        &[("STALLTRACE_TEST_TLS_GRACE_MS", "1500")],
    );
    let sim = SqlServerSim::start_small(&bins(), Placement::default(), &files.0, &[]);
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_instance" && r["pid"] == sim.worker
    });
    let server = format!("127.0.0.1:{}", sim.port);
    let here = Placement::default();
    // A busy session first: the uprobes are on (for the grace after it was
    // named) when the idle one logs in.
    let busy = SqlClientRun::sqlclient(&bins(), here, &server, "on", 1, 20, 3);
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_session" && r["spid_source"] == "tls_plaintext"
    });
    let args = ["--encrypt", "on", "--mars", "--idle-after-login-ms", "8000"];
    let idle = SqlClientRun::sqlclient_with(&bins(), here, &server, &args, [1, 10, 2]);
    let busy = busy.finish();
    // Past the grace, with only the idle session left.
    std::thread::sleep(Duration::from_secs(2));
    let ssl_write = ["on_ssl_write", "on_ssl_write_ex"];
    let links = kernel_objects::perf_event_links_of(tracer.pid(), &ssl_write);
    let idle = idle.finish();
    std::thread::sleep(Duration::from_millis(1000));
    let records = tracer.stop();
    for (name, run, mars) in [("busy", &busy, false), ("idle, MARS", &idle, true)] {
        assert_eq!(run.errors(), 0, "{name}: {}", run.0);
        for (port, spid) in run.sessions() {
            let remote = format!("127.0.0.1:{port}");
            let seen: Vec<&Value> = of_type(&records, "sql_session")
                .into_iter()
                .filter(|r| r["remote"] == remote.as_str())
                .collect();
            for r in &seen {
                let (ts, event) = (&r["ts"], &r["event"]);
                eprintln!("{name}: {ts} {event} spid {} mars {}", r["spid"], r["mars"]);
            }
            let named = |r: &&Value| r["spid"] == spid && r["mars"].is_null();
            assert!(
                seen.iter().any(named),
                "{name}: named before its first request: {seen:?}"
            );
            let last = seen
                .last()
                .unwrap_or_else(|| panic!("{name}: no sql_session"));
            assert_eq!(last["spid"], spid, "{name}: {seen:?}");
            assert_eq!(last["mars"] == true, mars, "{name}: {seen:?}");
        }
    }
    assert_eq!(
        links, 0,
        "the uprobes stayed past the grace for an idle session"
    );
}
