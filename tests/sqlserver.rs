//! End-to-end tests of SQL Server correlation with the workload simulator
//! (`sim/`): a `sqlservr` watchdog and worker speaking TDS, with data and log
//! files on their own loop devices, and `sqlclient` driving sessions. The
//! tracer runs with no SQL Server options at all: discovery must find the
//! instance, its (non-default) port, its sessions and their SPIDs, and the
//! role of each disk by itself.
//!
//! Oracles: sqlclient's own report (each session's SPID and client port, from
//! the server's LOGINACK, and each request's latency on its own clock), the server namespace's /proc/net/snmp, and the files
//! the test put on each device.
//!
//! Run as root (`cargo xtask test`); nextest runs them one at a time with the
//! other privileged tests (.config/nextest.toml).

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::netlab::{NetPair, Side, delta};
use common::requests::*;
use common::sqllab::{
    Cgroup, Mounted, Odbc, Placement, SMALL_FILES, SlowDisk, SqlClientRun, SqlServerSim,
};
use common::*;
use serde_json::Value;
use stalltrace::records::sql_requests::SLOW_REQUEST_MS;
use stalltrace_lab::scenario::ScratchDir;

fn instance_of(records: &[Value], worker: u32) -> &Value {
    of_type(records, "sql_instance")
        .into_iter()
        .rfind(|r| r["pid"] == worker)
        .unwrap_or_else(|| panic!("no sql_instance record for worker {worker}"))
}

/// Random loss on the client link: every retransmission the server's namespace
/// counts is in a `tcp_retransmit` record, and each one names the session it
/// hit: the SPID and client port sqlclient got for that connection.
#[test]
fn retransmits_name_the_session_they_hit() {
    require_root();
    let pair = NetPair::new();
    let files = ScratchDir::new("/var/tmp");
    let mut tracer = Tracer::start(&["--interval", "500ms", "--slow-io-ms", "0"]);
    let server_side = Placement::in_netns(pair.netns(Side::B));
    // Port 0: the worker listens wherever the kernel puts it, never on 1433.
    let sim = SqlServerSim::start_small(&bins(), server_side, &files.0, &[]);
    // Sessions opened once stalltrace knows the worker: the kernel reads the
    // SPID from each one's first response. (A session older than that learns
    // its SPID at its next response; see docs/sqlserver.md.)
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_instance" && r["pid"] == sim.worker
    });
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let client_side = Placement::in_netns(pair.netns(Side::A));
    let before = pair.counters(Side::B);
    let mut client = SqlClientRun::start(&bins(), client_side, &server, 4, 400, 8);
    // Loss once the sessions exist: a lost SYN-ACK belongs to no session yet.
    client.wait_for_sessions(&pair, sim.port, 4, Duration::from_secs(20));
    pair.drop_random(Side::A, 3, Some(sim.port));
    let report = client.finish();
    pair.clear_drops(Side::A);
    let after = pair.counters(Side::B);
    std::thread::sleep(Duration::from_millis(1200));
    let records = tracer.stop();

    assert_eq!(report.errors(), 0, "sqlclient: {}", report.0);
    let sessions: BTreeMap<u16, u16> = report.sessions().into_iter().collect();
    assert_eq!(sessions.len(), 4, "sqlclient sessions: {}", report.0);
    let client_ip = pair.v4(Side::A).to_string();

    // The instance, found with no options, on the port it really listens on.
    let instance = instance_of(&records, sim.worker);
    assert_eq!(instance["watchdog_pid"], sim.watchdog_pid());
    assert_eq!(instance["netns"], pair.netns_inode(Side::B));
    assert_eq!(instance["tds_ports"], serde_json::json!([sim.port]));

    // Every session, with the SPID the server gave it.
    let session_records = of_type(&records, "sql_session");
    for (&port, &spid) in &sessions {
        let remote = format!("{client_ip}:{port}");
        let seen: Vec<&&Value> = session_records
            .iter()
            .filter(|r| r["pid"] == sim.worker && r["remote"] == remote.as_str())
            .collect();
        assert!(
            seen.iter().any(|r| r["event"] == "open"),
            "no sql_session open for {remote}"
        );
        assert!(
            seen.iter().any(|r| r["spid"] == spid),
            "no sql_session for {remote} with SPID {spid}: {seen:?}"
        );
    }

    // Every retransmission in the server's namespace, against the kernel's count.
    let retransmits = retransmits_in(&records, pair.netns_inode(Side::B));
    let counted = sum_segs(&retransmits, |r| r["counted"] == true);
    let kernel = delta(&before, &after).get("Tcp.RetransSegs");
    eprintln!(
        "{} transactions, p50 {} µs, p99 {} µs; {} retransmit records, {counted} counted segments, \
         kernel RetransSegs {kernel}",
        report.transactions(),
        report.p50_us(),
        report.0["p99_us"],
        retransmits.len()
    );
    assert!(kernel >= 20, "too little loss to judge: {kernel} segments");
    let off = (counted as f64 - kernel as f64).abs() / kernel as f64;
    assert!(
        off <= 0.05,
        "counted segments {counted} vs RetransSegs {kernel}"
    );

    // And each one names its session.
    let mut wrong = Vec::new();
    for r in &retransmits {
        let port = r["dport"].as_u64().unwrap() as u16;
        let ok = r["sport"] == sim.port
            && sessions.get(&port).is_some_and(|&spid| {
                let sql = &r["sql"];
                sql["pid"] == sim.worker
                    && sql["kind"] == "client"
                    && sql["spid"] == spid
                    && sql["client"] == format!("{client_ip}:{port}").as_str()
            });
        if !ok {
            wrong.push(*r);
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {} retransmits do not name their session (SPID, client port): {:?}",
        wrong.len(),
        retransmits.len(),
        &wrong[..wrong.len().min(3)]
    );
}

/// The log on its own slow disk, the data on another: `block` records carry
/// each disk's role (down through the loop device to the disk under it), and
/// the worker's slow writes there name the log file.
#[test]
fn slow_log_disk_is_the_log_and_names_the_file() {
    require_root();
    let cgroup = Cgroup::new();
    let data_disk = Mounted::new(LoopDevice::new(Backing::Tmpfs, 64, false));
    let log_disk = SlowDisk::new(32);
    let slow_ms = 5;
    let mut tracer = Tracer::start(&["--interval", "500ms", "--slow-io-ms", &slow_ms.to_string()]);
    let sim = SqlServerSim::start(
        &bins(),
        Placement {
            cgroup: Some(&cgroup),
            ..Default::default()
        },
        "127.0.0.1:0",
        &data_disk.path("sales.mdf"),
        &log_disk.upper.path("sales_log.ldf"),
        SMALL_FILES,
    );
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_instance" && r["pid"] == sim.worker
    });
    // After the files are written: 5 writes a second, fewer than the client
    // commits, so every log write waits its turn.
    log_disk.slow_down(&cgroup, 5);
    // In the clear, then in TLS (the requests' oracle below takes both).
    let commits = |encrypt: &str| {
        let server = format!("127.0.0.1:{}", sim.port);
        let client =
            SqlClientRun::sqlclient(&bins(), Placement::default(), &server, encrypt, 2, 10, 5);
        let report = client.finish();
        assert_eq!(
            report.errors(),
            0,
            "sqlclient --encrypt {encrypt}: {}",
            report.0
        );
        report
    };
    let report = commits("not-supported");
    let encrypted = commits("on");
    std::thread::sleep(Duration::from_millis(1200));
    let records = tracer.stop();

    let key = |d: &LoopDevice| format!("{}:{}", d.major, d.minor);
    let (data, log, under_log) = (&data_disk.disk, &log_disk.upper.disk, &log_disk.lower.disk);
    let instance = instance_of(&records, sim.worker);
    let roles = &instance["disk_roles"];
    assert_eq!(roles[key(data)], "data", "{instance}");
    assert_eq!(roles[key(log)], "log", "{instance}");
    assert_eq!(
        roles[key(under_log)],
        "log",
        "the disk under the log's loop device: {instance}"
    );

    // A disk has its role from the first sql_instance that names it: the
    // simulator writes its files before it listens, and a block record of
    // that interval may be written before the daemon has found the worker
    // (on a busy host it was, once).
    let known_from = |disk: &LoopDevice| {
        of_type(&records, "sql_instance")
            .into_iter()
            .find(|r| r["pid"] == sim.worker && r["disk_roles"][key(disk)].is_string())
            .and_then(|r| r["seqno"].as_u64())
            .unwrap_or_else(|| panic!("no sql_instance gives {} a role", disk.name))
    };
    for (disk, role) in [(data, "data"), (log, "log"), (under_log, "log")] {
        let known = known_from(disk);
        let blocks: Vec<&Value> = of_type(&records, "block")
            .into_iter()
            .filter(|r| r["dev"] == disk.name.as_str() && r["seqno"].as_u64() > Some(known))
            .collect();
        assert!(
            !blocks.is_empty(),
            "no block records for {} once it had its role",
            disk.name
        );
        assert!(
            blocks.iter().all(|r| r["role"] == role),
            "{} is the {role} disk: {:?}",
            disk.name,
            blocks.iter().find(|r| r["role"] != role)
        );
    }

    // The worker's slow writes on the log disk, each naming the log file.
    let log_path = sim.log.to_string_lossy().into_owned();
    let slow: Vec<&Value> = of_type(&records, "slow_io")
        .into_iter()
        .filter(|r| r["dev"] == log.name.as_str() && r["pid"] == sim.worker && r["op"] == "write")
        .collect();
    eprintln!(
        "{} transactions, p50 {} µs; {} slow log writes by the worker, e.g. {:?}",
        report.transactions(),
        report.p50_us(),
        slow.len(),
        slow.first()
    );
    assert!(
        slow.len() >= 5,
        "expected slow log writes (> {slow_ms} ms) from the worker, got {}",
        slow.len()
    );
    for r in &slow {
        assert_eq!(r["file"], log_path.as_str(), "{r}");
        assert_eq!(r["sql"]["pid"], sim.worker, "{r}");
        assert!(r["latency_us"].as_f64().unwrap() >= (slow_ms * 1000) as f64);
    }
    // The commits sqlclient timed waited for those writes.
    assert!(
        report.p50_us() >= slow_ms * 1000,
        "sqlclient p50 {} µs: the log disk was not slow",
        report.p50_us()
    );

    // The requests, timed from the server's side, as the client timed them,
    // and the time the server's: nothing was lost on the way.
    assert_server_time("slow log", &records, sim.worker, &report);
    assert_server_time("slow log, encrypted", &records, sim.worker, &encrypted);
}

/// Each request's latency, timed from the server's side of its connection,
/// against sqlclient's own clock around each request: clean, then with 5% of
/// what the server sends to the client dropped, each in cleartext and in TLS.
#[test]
fn requests_are_timed_as_their_clients_timed_them() {
    require_root();
    // Dropped in reverse: the simulator, the tracer, the files, the pair.
    let (pair, _files, tracer, sim) = traced_sim(&[]);
    let server_start = pair.counters(Side::B);
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let client_side = || Placement::in_netns(pair.netns(Side::A));
    let clean_with = |encrypt: &str| {
        let run = SqlClientRun::sqlclient(&bins(), client_side(), &server, encrypt, 4, 200, 6);
        let report = run.finish();
        // The runs' requests in intervals of their own.
        std::thread::sleep(Duration::from_millis(1500));
        report
    };
    let clean = clean_with("not-supported");
    let clean_encrypted = clean_with("on");
    // The client's input from the server's port: responses lost, requests not
    // (a request lost on its way in is invisible from the server's side).
    let lossy_with = |encrypt: &str| {
        let mut run = SqlClientRun::sqlclient(&bins(), client_side(), &server, encrypt, 4, 100, 15);
        run.wait_for_logins(&pair, sim.port, 4, Duration::from_secs(20));
        pair.drop_random(Side::A, 5, Some(sim.port));
        let report = run.finish();
        pair.clear_drops(Side::A);
        std::thread::sleep(Duration::from_millis(1200));
        report
    };
    let lossy = lossy_with("not-supported");
    // TLS for the whole session, as every current Microsoft driver does: the
    // requests are timed from the socket alone, the SPIDs from the plaintext.
    let encrypted = lossy_with("on");
    let server_retrans = delta(&server_start, &pair.counters(Side::B)).get("Tcp.RetransSegs");
    let records = tracer.stop();
    let unrecorded = retransmits_unrecorded(&records, pair.netns_inode(Side::B), server_retrans);
    for (name, run) in [
        ("clean", &clean),
        ("clean, encrypted", &clean_encrypted),
        ("lossy", &lossy),
        ("lossy, encrypted", &encrypted),
    ] {
        let timings = client_timings(name, run);
        let ports: Vec<u16> = timings.keys().copied().collect();
        let ours = requests_of(&records, sim.worker, &ports);
        let counted = per_session(&ours);
        let mut client_latencies: Vec<u64> = timings.values().flatten().copied().collect();
        client_latencies.sort_unstable();
        let client_at = |q: f64| nearest_rank(&client_latencies, q);
        let total = merged(&ours, |r| &r.total_us);
        let fastest = client_latencies[0];
        eprintln!(
            "{name}: client (to its kernel's receipt) p50 {} µs p99 {} µs max {} µs min {fastest} \
             µs, (to its read) p50 {} µs p99 {} µs; stalltrace {} requests, total p50 {:?} p99 \
             {:?} max {:?}; server p50 {:?}; delivery p50 {:?} p99 {:?}; per session {counted:?}",
            client_at(0.5),
            client_at(0.99),
            client_at(1.0),
            run.p50_us(),
            run.0["p99_us"],
            total.count(),
            total.percentile(0.5),
            total.percentile(0.99),
            total.max(),
            merged(&ours, |r| &r.server_us).percentile(0.5),
            merged(&ours, |r| &r.delivery_us).percentile(0.5),
            merged(&ours, |r| &r.delivery_us).percentile(0.99),
        );
        assert_counts_match(name, &records, &counted, run);
        let untimed = requests_untimed(&records);
        // A retransmission of a response whose hook the kernel skipped (on
        // this VM, while PID 1 was interrupted; declared in `lost`, and
        // missing from the records) leaves its delivery at the transmission
        // before: a slow request may count as fast.
        let unjudged = retransmits_unjudged_or_unrecorded(&records, unrecorded);
        for (port, latencies) in &timings {
            let slow = latencies
                .iter()
                .filter(|&&v| v >= SLOW_REQUEST_MS * 1000)
                .count() as u64;
            let (_, our_slow) = counted.get(port).copied().unwrap_or_default();
            // A request within an RTT of the threshold may fall either side.
            let near = latencies
                .iter()
                .filter(|&&v| v.abs_diff(SLOW_REQUEST_MS * 1000) <= fastest)
                .count() as u64;
            // And a request the kernel could not time may have been a slow one.
            assert!(
                our_slow.abs_diff(slow) <= near + untimed + unjudged,
                "{name}: port {port}: stalltrace has {our_slow} slow requests, the client {slow} \
                 ({near} within {fastest} µs of the threshold, {untimed} untimed, {unjudged} \
                 retransmissions unjudged); the client's latencies from {} ms: {:?}",
                SLOW_REQUEST_MS - 20,
                latencies
                    .iter()
                    .filter(|&&v| v + 20_000 >= SLOW_REQUEST_MS * 1000)
                    .collect::<Vec<_>>()
            );
        }
        // The client's percentiles to its kernel's receipt, as above: its own
        // figures run to its read, which on a busy host adds the client's wait
        // for a CPU (1838 µs there against 1710 µs to the receipt, at p50).
        assert_percentiles_match(name, &total, &client_latencies);
        // Every slow request is explained: a retransmission of its response,
        // or the server's own time (the simulator's log flush on a busy host).
        let slow: u64 = ours.iter().map(|r| r.counts.slow).sum();
        let slow_retransmitted: u64 = ours.iter().map(|r| r.counts.slow_retransmitted).sum();
        let server_slow = server_slow(&ours, fastest);
        assert!(
            slow - slow_retransmitted <= server_slow,
            "{name}: {} slow requests met no retransmission, and only {server_slow} took the \
             server that long",
            slow - slow_retransmitted
        );
        if name.starts_with("lossy") {
            assert!(
                slow >= 5,
                "lossy: too little loss to judge: {slow} slow requests"
            );
            assert_retransmits_held_up(name, &records, sim.port, &timings, server_slow, unrecorded);
            // A retransmission timeout's wait is in `delivery`.
            let delivery = merged(&ours, |r| &r.delivery_us);
            assert!(
                at_least(&delivery, SLOW_REQUEST_MS * 1_000_000) >= slow_retransmitted,
                "lossy: fewer deliveries hold a retransmission timeout than slow requests met one"
            );
        }
    }
}

/// MARS: several requests in flight on one connection, which turn-taking
/// would pair wrongly. Each connection's SPID is still named (its login
/// response comes before SMP begins), its first response after the login,
/// inside SMP, says it is MARS (on the wire, and in the TLS plaintext, where
/// the uprobes stay until it comes), and none of its requests is timed; a
/// plain session beside them is timed as ever. The oracle: the client's own
/// SPIDs and request counts.
#[test]
fn mars_sessions_are_named_and_said_to_be_mars_and_never_timed() {
    require_root();
    let (pair, _files, tracer, sim) = traced_sim(&[]);
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let side = || Placement::in_netns(pair.netns(Side::A));
    let odbc = Odbc::installed();
    // Microsoft's driver turns SMP on after the login, as the simulator's
    // client does; it runs longer, as Python takes a second to start, so
    // that every client's connection is open at once for a while.
    let driver = SqlClientRun::odbc_mars(&odbc, side(), &sim, &server, [2, 20, 6]);
    let plain = SqlClientRun::start(&bins(), side(), &server, 1, 20, 4);
    let clear = SqlClientRun::sqlclient_mars(&bins(), side(), &server, "not-supported", [2, 40, 4]);
    let tls = SqlClientRun::sqlclient_mars(&bins(), side(), &server, "on", [2, 40, 4]);
    let (plain, clear, tls) = (plain.finish(), clear.finish(), tls.finish());
    let driver = driver.finish();
    std::thread::sleep(Duration::from_millis(1200));
    let records = tracer.stop();

    let client_ip = pair.v4(Side::A).to_string();
    let sessions = of_type(&records, "sql_session");
    let of_port = |port: u16| -> Vec<&&Value> {
        let remote = format!("{client_ip}:{port}");
        sessions
            .iter()
            .filter(|r| r["pid"] == sim.worker && r["remote"] == remote.as_str())
            .collect()
    };
    for (name, run, mars) in [
        ("MARS, cleartext", &clear, true),
        ("MARS, TLS", &tls, true),
        ("ODBC Driver 18, MARS, Encrypt=yes", &driver, true),
        ("plain", &plain, false),
    ] {
        assert_eq!(run.errors(), 0, "{name}: {}", run.0);
        let pairs = run.sessions();
        assert_eq!(pairs.len(), if mars { 2 } else { 1 }, "{name}: {}", run.0);
        for (port, spid) in pairs {
            let seen = of_port(port);
            let last = seen
                .last()
                .unwrap_or_else(|| panic!("{name}: no sql_session for {port}"));
            eprintln!("{name}: port {port} SPID {spid}: {last}");
            assert_eq!(last["spid"], spid, "{name}: {seen:?}");
            assert_eq!(last["mars"] == true, mars, "{name}: {seen:?}");
            let timed = per_session(&requests_of(&records, sim.worker, &[port]));
            let counted = timed.get(&port).map_or(0, |&(requests, _)| requests);
            // The plain session: its transactions and its SELECT @@SPID.
            let expected = if mars { 0 } else { run.transactions() + 1 };
            assert_eq!(counted, expected, "{name}: requests timed on port {port}");
        }
    }
    // The instance's records say how many sessions their figures leave out:
    // the six MARS connections while every client ran.
    let said: Vec<u64> = of_type(&records, "sql_requests")
        .iter()
        .filter(|r| r["pid"] == sim.worker)
        .map(|r| r["mars_sessions"].as_u64().unwrap_or(0))
        .collect();
    assert_eq!(
        said.iter().max(),
        Some(&6),
        "mars_sessions per interval: {said:?}"
    );
}
