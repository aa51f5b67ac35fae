//! Unit tests of `stall::requests`: a slow request's episode names what its
//! time went to.

use serde_json::{Value, json};

use super::super::fixtures::{rto, slow_disk, slow_io, sql_instance, sql_requests, typed};
use super::super::{Detector, Thresholds};
use crate::records::stall::{Cause, Kind, Phase, StallRecord};

/// The requests episodes of one interval's records.
fn episodes(records: Vec<Value>) -> Vec<StallRecord> {
    let mut d = Detector::new(Thresholds::default(), "2026-01-01T00:00:00.000000Z");
    d.interval(typed(&records), "2026-01-01T00:00:01.000000Z", 1000.0)
        .into_iter()
        .filter(|e| e.kind == Kind::Requests && e.phase == Phase::Open)
        .collect()
}

fn evidence<'a>(e: &'a StallRecord, signal: &str) -> Option<&'a Value> {
    e.evidence
        .iter()
        .find(|v| v.signal == signal)
        .map(|v| &v.value)
}

/// A disk that took 400 ms for each of 50 writes, the instance's log on it.
fn slow_log_disk() -> Vec<Value> {
    vec![sql_instance(json!({"7:3": "log"})), slow_disk()]
}

#[test]
fn no_slow_request_no_episode() {
    assert!(episodes(vec![sql_requests(500, &[])]).is_empty());
    // A slow disk alone is a storage episode, not a requests one.
    let mut records = slow_log_disk();
    records.push(sql_requests(500, &[]));
    assert!(episodes(records).is_empty());
}

#[test]
fn delivery_names_the_network_episode_that_hit_the_sessions() {
    let found = episodes(vec![
        rto("10.0.0.7", 408.0, 1, 51, 50001),
        sql_requests(200, &[(51, 800, 408_500, 1)]),
    ]);
    assert_eq!(found.len(), 1, "{found:?}");
    let e = &found[0];
    assert_eq!(e.cause, Cause::NetworkDelivery);
    assert_eq!(e.subject.worker_pid, Some(42));
    assert_eq!(evidence(e, "slow_requests"), Some(&json!(1)));
    assert_eq!(evidence(e, "slowest_request_ms"), Some(&json!(409.3)));
    assert_eq!(evidence(e, "network_episode"), Some(&json!("10.0.0.7")));
    assert_eq!(e.sessions.len(), 1);
    assert_eq!(e.sessions[0].spid, Some(51));
    assert!(e.next_step.contains("network episodes"), "{}", e.next_step);
    // Slow in delivery with no network episode of the instance's: the path, unnamed.
    let alone = episodes(vec![sql_requests(200, &[(51, 800, 408_500, 1)])]);
    assert_eq!(alone[0].cause, Cause::NetworkDelivery);
    assert_eq!(evidence(&alone[0], "network_episode"), None);
}

#[test]
fn server_time_names_the_instance_disk_or_says_the_server_was_busy() {
    let mut records = slow_log_disk();
    records.push(sql_requests(
        200,
        &[(51, 420_000, 300, 0), (52, 380_000, 200, 0)],
    ));
    let found = episodes(records);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].cause, Cause::ServerIo);
    assert_eq!(
        evidence(&found[0], "storage_episode"),
        Some(&json!("loop3"))
    );
    assert!(
        found[0].next_step.contains("log files"),
        "{}",
        found[0].next_step
    );
    assert_eq!(evidence(&found[0], "slow_requests"), Some(&json!(2)));
    // The instance keeps nothing on the slow disk: the server itself.
    let mut elsewhere = vec![sql_instance(json!({"8:0": "log"})), slow_disk()];
    elsewhere.push(sql_requests(200, &[(51, 420_000, 300, 0)]));
    let busy = episodes(elsewhere);
    assert_eq!(busy[0].cause, Cause::ServerBusy);
    assert!(busy[0].next_step.contains("inside SQL Server"));
}

/// A log disk too little used for a storage episode (a few writes a second),
/// each of the worker's writes to the log slow: the requests' server time is
/// those writes, named with their file; another process's slow I/O is not.
#[test]
fn server_time_names_the_workers_own_slow_writes_below_the_storage_floor() {
    let log = "/var/opt/mssql/data/sales_log.ldf";
    let mut tagged = slow_io("loop3", 42, Some(log));
    tagged["sql"] = json!({"pid": 42});
    let records = vec![
        sql_instance(json!({"7:3": "log"})),
        tagged,
        slow_io("loop3", 99, None),
        sql_requests(20, &[(51, 420_000, 300, 0)]),
    ];
    let found = episodes(records);
    assert_eq!(found.len(), 1, "{found:?}");
    assert_eq!(found[0].cause, Cause::ServerIo);
    assert_eq!(evidence(&found[0], "storage_episode"), None);
    assert_eq!(evidence(&found[0], "slow_io_ms_max"), Some(&json!(400.0)));
    let text = &found[0]
        .evidence
        .iter()
        .find(|e| e.signal == "slow_io_ms_max")
        .unwrap()
        .text;
    assert!(
        text.contains(&format!("1 write to {log} on loop3 (of 1 slow)")),
        "{text}"
    );
    assert_eq!(found[0].files, vec![log.to_string()]);
    assert!(
        found[0].next_step.contains("loop3"),
        "{}",
        found[0].next_step
    );
    // Only another process's slow I/O: the server was busy, not waiting on it.
    let others = vec![
        sql_instance(json!({"7:3": "log"})),
        slow_io("loop3", 99, None),
        sql_requests(20, &[(51, 420_000, 300, 0)]),
    ];
    assert_eq!(episodes(others)[0].cause, Cause::ServerBusy);
}
