//! The SQL Server simulator's worker killed and restarted by its watchdog
//! mid-run; a worker the kernel side's table has no room for.

use common::netlab::{NetPair, Side};
use common::requests::sim_found_by;
use common::sqllab::{Placement, SqlClientRun, SqlServerSim};
use stalltrace_lab::scenario::ScratchDir;

// Through faults.rs, whatever the lab's module path is there.
use super::*;

const SQL_INTERVAL_MS: u64 = 500;
/// Found "within one interval": the refresh at the end of the interval, plus
/// the run loop's wake-up (100 ms) and a loaded machine's scheduling.
const SQL_FOUND_WITHIN_MS: f64 = SQL_INTERVAL_MS as f64 + 250.0;
const RESTARTS: usize = 3;

/// The daemon's sql_workers map.
fn workers_map_of(tracer: &Tracer) -> ko::Map {
    ko::maps_of(tracer.pid())
        .into_iter()
        .find(|m| m.name == "sql_workers")
        .expect("the daemon's sql_workers map")
}

/// The pids in a sql_workers map now (its keys).
fn worker_pids_in(map_id: u64) -> Vec<u32> {
    ko::map_keys(map_id)
        .iter()
        .map(|k| u32::from_le_bytes(k[..4].try_into().unwrap()))
        .collect()
}

/// Local ports of A's established connections to `port` (ss, in A's namespace).
fn client_ports(pair: &NetPair, port: u16) -> Vec<u16> {
    let out = pair.exec(
        Side::A,
        &[
            "ss",
            "-Htn",
            "state",
            "established",
            &format!("( dport = :{port} )"),
        ],
    );
    out.lines()
        .filter_map(|l| l.split_whitespace().find(|f| f.contains(':')))
        .filter_map(|local| local.rsplit(':').next()?.parse().ok())
        .collect()
}

/// The worker killed (SIGKILL) and started again by its watchdog, three
/// times, with sessions open at each kill: each new worker's pid and port,
/// and its new sessions, are in the stream within one interval; each
/// session's SPID is the one the client got; the killed worker's sessions
/// are closed; the kernel side's worker table holds only the live worker.
#[test]
fn a_restarted_sql_server_worker_is_found_within_an_interval() {
    require_root();
    let pair = NetPair::new();
    let files = ScratchDir::new("/var/tmp");
    let mut tracer = Tracer::start(&["--interval", "500ms", "--slow-io-ms", "0"]);
    let mut sim = SqlServerSim::start_small(
        &bins(),
        Placement::in_netns(pair.netns(Side::B)),
        &files.0,
        &["--restart-worker"],
    );
    let watchdog = sim.watchdog_pid();
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_instance" && r["pid"] == sim.worker
    });
    let client_ip = pair.v4(Side::A).to_string();
    let client_side = Placement::in_netns(pair.netns(Side::A));
    let remote = |port: u16| format!("{client_ip}:{port}");
    let mut holders: Vec<SqlClientRun> = Vec::new();
    let mut held_open: Vec<(u32, Vec<u16>)> = Vec::new();
    let mut figures = Vec::new();
    let mut killed: Vec<u32> = Vec::new();
    for generation in 0..=RESTARTS {
        let mut instance_ms = 0.0;
        if generation > 0 {
            let (old, old_port) = (sim.worker, sim.port);
            killed.push(old);
            let killed = SystemTime::now();
            let listening = sim.kill_worker_and_await_restart(Duration::from_secs(30));
            assert_ne!(
                sim.port, old_port,
                "port 0: the new worker listens elsewhere"
            );
            let worker = sim.worker;
            let found = tracer.wait_for(Duration::from_secs(5), |r| {
                r["type"] == "sql_instance" && r["pid"] == worker
            });
            instance_ms = ms_between(listening, ts_of(&found));
            assert_eq!(found["tds_ports"], serde_json::json!([sim.port]), "{found}");
            assert_eq!(found["watchdog_pid"], watchdog, "{found}");
            assert_eq!(found["netns"], pair.netns_inode(Side::B), "{found}");
            assert!(
                instance_ms <= SQL_FOUND_WITHIN_MS,
                "worker {worker} (restart {generation}) found {instance_ms:.0} ms after it listened"
            );
            // The sessions the kill cut: closed, in the stream.
            let (_, ports) = held_open.last().unwrap();
            for &port in ports {
                let closed = tracer.wait_for(Duration::from_secs(5), |r| {
                    r["type"] == "sql_session"
                        && r["event"] == "closed"
                        && r["pid"] == old
                        && r["remote"] == remote(port).as_str()
                });
                let ms = ms_between(killed, ts_of(&closed));
                assert!(
                    ms <= SQL_FOUND_WITHIN_MS + 100.0,
                    "session {port} of killed worker {old} closed {ms:.0} ms after the kill"
                );
            }
            holders.clear(); // their server is gone; they would only reconnect
        }
        // New sessions, found within an interval, with the SPIDs the client got.
        let started = SystemTime::now();
        let server = format!("{}:{}", pair.v4(Side::B), sim.port);
        let mut client = SqlClientRun::start(&bins(), client_side, &server, 3, 60, 3);
        client.wait_for_sessions(&pair, sim.port, 3, Duration::from_secs(20));
        let worker = sim.worker;
        let mut session_ms: Vec<f64> = Vec::new();
        for port in client_ports(&pair, sim.port) {
            let open = tracer.wait_for(Duration::from_secs(5), |r| {
                r["type"] == "sql_session"
                    && r["event"] == "open"
                    && r["pid"] == worker
                    && r["remote"] == remote(port).as_str()
            });
            session_ms.push(ms_between(started, ts_of(&open)));
        }
        let report = client.finish();
        assert_eq!(report.errors(), 0, "sqlclient: {}", report.0);
        for (port, spid) in report.sessions() {
            tracer.wait_for(Duration::from_secs(5), |r| {
                r["type"] == "sql_session"
                    && r["pid"] == worker
                    && r["remote"] == remote(port).as_str()
                    && r["spid"] == spid
            });
        }
        assert_eq!(session_ms.len(), 3, "sessions on worker {worker}");
        let slowest = session_ms.iter().cloned().fold(0.0, f64::max);
        assert!(
            slowest <= SQL_FOUND_WITHIN_MS,
            "sessions of worker {worker} found {session_ms:?} ms after they connected"
        );
        figures.push(format!(
            "worker {worker} port {}: instance +{instance_ms:.0} ms, sessions +{slowest:.0} ms",
            sim.port
        ));
        // Two sessions left open for the next kill to cut, once the tracer has them.
        let mut holder = SqlClientRun::start(&bins(), client_side, &server, 2, 4, 120);
        holder.wait_for_sessions(&pair, sim.port, 2, Duration::from_secs(20));
        let ports = client_ports(&pair, sim.port);
        for &port in &ports {
            tracer.wait_for(Duration::from_secs(5), |r| {
                r["type"] == "sql_session"
                    && r["event"] == "open"
                    && r["pid"] == worker
                    && r["remote"] == remote(port).as_str()
            });
        }
        held_open.push((worker, ports));
        holders.push(holder);
    }
    let workers_map = workers_map_of(&tracer);
    let in_kernel = worker_pids_in(workers_map.id);
    let (worker, killed) = (sim.worker, killed);
    drop(holders);
    let records = tracer.stop();
    drop(sim);
    eprintln!("{}", figures.join("\n"));
    eprintln!("sql_workers at the end: {in_kernel:?} (worker {worker}, killed {killed:?})");
    // The live worker, and no dead one (another test's simulator may be there too).
    assert!(
        in_kernel.contains(&worker),
        "the live worker is not in sql_workers"
    );
    let dead: Vec<&u32> = in_kernel.iter().filter(|p| killed.contains(p)).collect();
    assert!(
        dead.is_empty(),
        "the kernel side still looks for the TDS of killed workers {dead:?}"
    );
    let instances = of_type(&records, "sql_instance");
    assert!(instances.len() > RESTARTS, "{instances:?}");
}

/// More SQL Server processes than the kernel side's worker table holds:
/// the table filled (with bpftool, as the daemon's own map) with pids no
/// process can have, a simulator's worker is refused. That is said once on
/// stderr and counted once in `lost` (`sqlserver.worker_unwatched`), however
/// many refreshes try again; once a place is free, the next refresh watches
/// the worker, and its session gets the SPID its client got.
#[test]
fn a_worker_the_kernel_table_has_no_room_for_is_said_counted_and_watched_later() {
    require_root();
    let pair = NetPair::new();
    let files = ScratchDir::new("/var/tmp");
    let mut tracer = Tracer::start(&["--interval", "500ms", "--slow-io-ms", "0"]);
    let workers_map = workers_map_of(&tracer);
    // Above the kernel's PID_MAX_LIMIT (4,194,304): no process has these.
    let mut fillers: Vec<u32> = Vec::new();
    while ko::map_update(
        workers_map.id,
        &(0x0100_0000 + fillers.len() as u32).to_le_bytes(),
        &[1],
    ) {
        fillers.push(0x0100_0000 + fillers.len() as u32);
        assert!(fillers.len() <= 4096, "sql_workers never filled");
    }
    let sim = sim_found_by(&mut tracer, &pair, &files, &[]);
    let worker = sim.worker;
    // Several refreshes (500 ms apart) try again while the table is full.
    let lost_full = |records: &[Value]| -> u64 {
        records
            .iter()
            .filter(|r| r["type"] == "lost")
            .filter_map(|r| r["by_source"]["sqlserver.worker_unwatched"].as_u64())
            .sum()
    };
    std::thread::sleep(Duration::from_secs(2));
    let refused = lost_full(&tracer.records_so_far());
    assert!(
        !worker_pids_in(workers_map.id).contains(&worker),
        "the worker got in a full table"
    );
    // A place frees: the worker is watched at the next refresh.
    ko::map_delete(workers_map.id, &fillers.pop().unwrap().to_le_bytes());
    let deadline = Instant::now() + Duration::from_secs(5);
    while !worker_pids_in(workers_map.id).contains(&worker) {
        assert!(
            Instant::now() < deadline,
            "worker {worker} not watched 5 s after a place freed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let client = SqlClientRun::start(
        &bins(),
        Placement::in_netns(pair.netns(Side::A)),
        &server,
        1,
        10,
        1,
    );
    let report = client.finish();
    assert_eq!(report.errors(), 0, "sqlclient: {}", report.0);
    for (port, spid) in report.sessions() {
        let remote = format!("{}:{port}", pair.v4(Side::A));
        tracer.wait_for(Duration::from_secs(5), |r| {
            r["type"] == "sql_session"
                && r["pid"] == worker
                && r["remote"] == remote.as_str()
                && r["spid"] == spid
        });
    }
    let said = tracer.stderr_text();
    let records = tracer.stop();
    drop(sim);
    // Every worker refused is said once and counted once: ours, and any
    // other simulator on the host that came while the table was full.
    let refused_pids: Vec<&str> = said
        .lines()
        .filter_map(|l| l.strip_prefix("stalltrace: sqlservr "))
        .filter_map(|l| Some(l.split_once(" is not watched")?.0))
        .collect();
    let ours = worker.to_string();
    eprintln!(
        "{} fillers; refused {refused_pids:?} (ours {ours}); lost {refused} while full, {} in all",
        fillers.len() + 1,
        lost_full(&records)
    );
    assert_eq!(
        refused_pids.iter().filter(|p| **p == ours).count(),
        1,
        "said once: {said}"
    );
    let mut distinct = refused_pids.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        refused_pids.len(),
        "a worker said twice: {said}"
    );
    assert!(
        said.contains("`lost`: sqlserver.worker_unwatched)"),
        "{said}"
    );
    assert!(refused >= 1, "not counted while the table was full");
    assert_eq!(
        lost_full(&records),
        refused_pids.len() as u64,
        "counted once each"
    );
}
