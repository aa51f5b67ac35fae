//! `slow-log`: the transaction log on a disk that cannot keep up. The SQL
//! Server simulator's OLTP load (encrypted sessions) with its data file on a
//! fast disk and its log file on a slow one: a loop device stacked on another
//! that a blkio cgroup throttles to a few writes a second for the server (see
//! `sql::SlowDisk`). Every commit waits for its log write, so the clients'
//! requests are slow with the time on the server's side, and stalltrace should
//! say so: a `requests` episode `server_io` naming the log file's writes, not
//! the network. Clean: the same load with the log disk unthrottled.

use std::time::Duration;

use super::{Expected, Fault, INTERVAL, Outcome, Session};
use crate::Bins;
use crate::disk::{Backing, LoopDevice};
use crate::net::{NetPair, Side};
use crate::sql::{Cgroup, Mounted, Placement, SMALL_FILES, SlowDisk, SqlClientRun, SqlServerSim};
use crate::tracer::Tracer;

pub const ABOUT: &str = "SQL Server simulator OLTP load (sqlclient, TLS), 2 sessions, data and log on separate disks; fault: the log disk throttled to 5 writes/s";

const SESSIONS: u32 = 2;
const RATE: u32 = 10;
const SECS: u32 = 6;
/// Fewer log writes a second than the clients commit: each commit waits its
/// turn, a few hundred ms (the clients wait for each answer before the next).
const LOG_WRITE_IOPS: u32 = 5;
/// Slow I/O events from this latency: the log writes that wait their turn are
/// well above it, the fast data disk's well below.
const SLOW_IO_MS: &str = "20";

pub fn run(bins: &Bins, fault: Fault) -> Outcome {
    crate::require_root();
    bins.check();
    // Declared before what runs in it: dropped after the simulator is gone.
    let cgroup = Cgroup::new();
    let data_disk = Mounted::new(LoopDevice::new(Backing::Tmpfs, 64, false));
    let log_disk = SlowDisk::new(32);
    let pair = NetPair::new();
    let mut args = vec!["--interval", INTERVAL, "--slow-io-ms", SLOW_IO_MS];
    for side in [Side::A, Side::B] {
        args.extend(["--netns", pair.netns(side)]);
    }
    let mut tracer = Tracer::start(&bins.stalltrace, &args);
    let sim = SqlServerSim::start(
        bins,
        Placement {
            netns: Some(pair.netns(Side::B)),
            cgroup: Some(&cgroup),
            ..Default::default()
        },
        "0.0.0.0:0",
        &data_disk.path("sales.mdf"),
        &log_disk.upper.path("sales_log.ldf"),
        SMALL_FILES,
    );
    tracer.wait_for(Duration::from_secs(10), |r| {
        r["type"] == "sql_instance" && r["pid"] == sim.worker
    });
    // After the simulator has written its files.
    if fault == Fault::Injected {
        log_disk.slow_down(&cgroup, LOG_WRITE_IOPS);
    }
    let server = format!("{}:{}", pair.v4(Side::B), sim.port);
    let report = SqlClientRun::sqlclient(
        bins,
        Placement::in_netns(pair.netns(Side::A)),
        &server,
        "on",
        SESSIONS,
        RATE,
        SECS,
    )
    .finish();
    std::thread::sleep(Duration::from_millis(1200));
    let stream = tracer.stop_text();

    let client_ip = pair.v4(Side::A).to_string();
    let sessions = Session::of_client(&report, sim.worker, &client_ip);
    let mut o = Outcome::new("slow-log", fault, stream);
    o.args = args.iter().map(|s| s.to_string()).collect();
    o.devs = [&data_disk.disk, &log_disk.upper.disk, &log_disk.lower.disk]
        .map(|d| d.name.clone())
        .to_vec();
    o.on_pair(&pair);
    o.figures = vec![
        format!(
            "sqlclient (TLS): {} transactions in {SECS} s over {SESSIONS} sessions, {} errors; latency p50 {} µs, p99 {} µs, max {} µs",
            report.transactions(),
            report.errors(),
            report.p50_us(),
            report.0["p99_us"],
            report.0["max_us"]
        ),
        format!(
            "log {} on {} (over {}){}; data on {}",
            sim.log.display(),
            log_disk.upper.disk.name,
            log_disk.lower.disk.name,
            if fault == Fault::Injected {
                format!(", throttled to {LOG_WRITE_IOPS} writes/s")
            } else {
                String::new()
            },
            data_disk.disk.name
        ),
    ];
    if fault == Fault::Injected {
        o.expected = vec![Expected::requests(
            "server_io",
            sim.worker,
            sessions.clone(),
        )];
    }
    o.sessions = sessions;
    if fault == Fault::Clean {
        let client_max_us = report.0["max_us"].as_f64().unwrap_or(0.0);
        o.confirmed = super::slow_requests_seen_by_client(&o, client_max_us, "sqlclient");
    }
    o
}
