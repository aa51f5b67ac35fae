//! Records as the daemon writes them, built in code, for the detector's tests
//! and the schema tests (which check that what the detector writes about them
//! is valid).

use serde_json::{Value, json};

use crate::records::AnyRecord;
use crate::records::netdev::LinkCounters;

/// The records as the detector gets them: each read as its type, as a line
/// of the stream is. A fixture that does not read is a broken test.
pub fn typed(records: &[Value]) -> Vec<AnyRecord> {
    records
        .iter()
        .map(|r| {
            let kind = r["type"].as_str().expect("a fixture names its type");
            match AnyRecord::read(kind, r) {
                Some(Ok(record)) => record,
                Some(Err(e)) => panic!("a {kind} fixture does not read as one: {e}"),
                None => panic!("{kind}: no such record type"),
            }
        })
        .collect()
}

/// A histogram object of times in µs from (value, count) pairs, as the
/// daemon writes one: kernel buckets (timed in ns), with the percentiles and
/// mean exact so that a test states its figures plainly.
pub fn hist(values: &[(f64, u64)]) -> Value {
    histogram(values, 1e-3)
}

/// The same for in-flight depths (counted, scale 1).
pub fn depths(values: &[(f64, u64)]) -> Value {
    histogram(values, 1.0)
}

fn histogram(values: &[(f64, u64)], scale: f64) -> Value {
    let mut kernel = crate::hist::Histogram::default();
    for &(v, n) in values {
        kernel.record((v / scale).round() as u64, n);
    }
    let mut h = serde_json::to_value(kernel.to_record(scale)).unwrap();
    let count: u64 = values.iter().map(|v| v.1).sum();
    if count == 0 {
        return h;
    }
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let pct = |q: f64| {
        let mut seen = 0;
        for (v, n) in &sorted {
            seen += n;
            if seen as f64 >= q * count as f64 {
                return *v;
            }
        }
        sorted.last().unwrap().0
    };
    let sum: f64 = values.iter().map(|(v, n)| v * *n as f64).sum();
    for (field, value) in [
        ("mean", sum / count as f64),
        ("p50", pct(0.5)),
        ("p90", pct(0.9)),
        ("p99", pct(0.99)),
        ("max", sorted.last().unwrap().0),
    ] {
        h[field] = json!(value);
    }
    h
}

pub fn block(
    dev: &str,
    count: u64,
    tag_wait: &[(f64, u64)],
    device: &[(f64, u64)],
    inflight: &[(f64, u64)],
    nr_requests: u64,
) -> Value {
    json!({
        "type": "block", "ts": "t", "host": "h", "dev": dev, "major": 7, "minor": 3, "op": "write",
        "interval_ms": 1000, "count": count, "bytes": count * 4096, "bios": count, "requeues": 0,
        "completions_unseen": 0, "errors": 0,
        "latency_us": hist(device), "tag_wait_us": hist(tag_wait), "queue_us": hist(&[(1.0, count)]),
        "device_us": hist(device), "inflight": depths(inflight), "inflight_now": 0,
        "queue_limit": {"scheduler": "none", "nr_requests": nr_requests, "hw_queue_depth": 128, "nr_hw_queues": 1},
        "role": "log",
    })
}

pub fn rto(peer: &str, rto_ms: f64, backoff: u64, spid: u64, client_port: u16) -> Value {
    json!({
        "type": "tcp_retransmit", "ts": "t", "host": "h", "netns": 1, "family": "ipv4",
        "saddr": "10.0.0.1", "sport": 1433, "daddr": peer, "dport": client_port, "state": "ESTABLISHED",
        "kind": "rto", "timer": true, "synack": false, "ca_state": "loss", "segs": 1, "bytes": 100,
        "seq": 1, "err": 0, "counted": true, "rto_ms": rto_ms, "backoff": backoff, "retransmits": backoff + 1,
        "srtt_us": 500, "stalled_ms": rto_ms.round() as u32,
        "sql": {"pid": 42, "kind": "client", "spid": spid, "client": format!("{peer}:{client_port}")},
    })
}

/// A tail-loss probe of a lone response, `after_ms` after it was sent.
pub fn probe(peer: &str, after_ms: f64, spid: u64, client_port: u16) -> Value {
    json!({
        "type": "tcp_retransmit", "ts": "t", "host": "h", "netns": 1, "family": "ipv4",
        "saddr": "10.0.0.1", "sport": 1433, "daddr": peer, "dport": client_port, "state": "ESTABLISHED",
        "kind": "tlp", "timer": false, "synack": false, "ca_state": "open", "segs": 1, "bytes": 100,
        "seq": 1, "err": 0, "counted": true, "rto_ms": 204.0, "backoff": 0, "retransmits": 0,
        "srtt_us": 500, "probe_after_ms": after_ms,
        "sql": {"pid": 42, "kind": "client", "spid": spid, "client": format!("{peer}:{client_port}")},
    })
}

pub fn fast(peer: &str, segs: u64) -> Value {
    json!({
        "type": "tcp_retransmit", "ts": "t", "host": "h", "netns": 1, "family": "ipv4",
        "saddr": "10.0.0.1", "sport": 1433, "daddr": peer, "dport": 50000, "state": "ESTABLISHED",
        "kind": "fast", "timer": false, "synack": false, "ca_state": "recovery", "segs": segs,
        "bytes": 1448 * segs, "seq": 1, "err": 0, "counted": true, "rto_ms": 204.0, "backoff": 0,
        "retransmits": 0, "srtt_us": 800, "stalled_ms": 3,
    })
}

pub fn netdev(iface: &str, qdisc: &[(f64, u64)], link: Value) -> Value {
    json!({
        "type": "netdev", "ts": "t", "host": "h", "iface": iface, "ifindex": 2, "netns": 1,
        "interval_ms": 1000, "rx_packets": 10, "rx_bytes": 1000, "tx_packets": 1000, "tx_bytes": 1_250_000,
        "qdisc_us": hist(qdisc), "xmit_us": hist(&[]), "rx_us": hist(&[]), "qdisc_untimed": 0,
        "tx_timeouts": 0, "tx_stalls": 0, "tx_busy": 0, "link": link,
    })
}

pub fn link(duplex: &str, collisions: u64, crc: u64, rx_pause: u64) -> Value {
    json!({
        "oper_state": "up", "speed_mbps": 1000, "duplex": duplex, "autoneg": true,
        "counters": LinkCounters { collisions, rx_crc_errors: crc, rx_errors: crc, ..Default::default() },
        "pause": {"rx_pause_frames": rx_pause, "tx_pause_frames": 0},
        "qdisc": {"kind": "tbf", "backlog_bytes": 30000, "qlen_packets": 20, "drops": 0, "requeues": 0, "overlimits": 500},
    })
}

pub fn flow(limiter: &str, busy_ms: f64, rwnd_ms: f64, retrans: u64) -> Value {
    json!({
        "type": "tcp_flow", "ts": "t", "host": "h", "netns": 1, "family": "ipv4", "saddr": "10.0.0.1",
        "sport": 40000, "daddr": "10.0.0.9", "dport": 445, "interval_ms": 1000, "bytes_acked": 50_000_000,
        "bytes_received": 0, "send_mbps": 400.0, "delivery_mbps": 400.0, "busy_ms": busy_ms, "rwnd_limited_ms": rwnd_ms,
        "sndbuf_limited_ms": 0.0, "retrans_segs": retrans, "data_segs_out": 34_600, "srtt_us": 300.0,
        "cwnd": 40, "limiter": limiter,
    })
}

/// One slow I/O on `dev`, submitted by `pid`, to `file` when known.
pub fn slow_io(dev: &str, pid: u32, file: Option<&str>) -> Value {
    json!({
        "type": "slow_io", "ts": "t", "host": "h", "dev": dev, "major": 7, "minor": 3, "op": "write",
        "latency_us": 400_000.0, "device_us": 399_000.0, "sector": 2048, "bytes": 4096, "pid": pid,
        "tid": pid, "comm": "writer", "error": 0, "file": file,
    })
}

/// The sql_instance record of worker 42, with its disks' roles.
pub fn sql_instance(disk_roles: Value) -> Value {
    json!({"type": "sql_instance", "ts": "t", "host": "h", "pid": 42, "netns": 1,
        "tds_ports": [1433], "ag_ports": [5022], "files": [], "disk_roles": disk_roles})
}

/// loop3 (7:3): 50 writes in the interval, each 400 ms on the device.
pub fn slow_disk() -> Value {
    block(
        "loop3",
        50,
        &[(2.0, 50)],
        &[(400_000.0, 50)],
        &[(1.0, 50)],
        128,
    )
}

/// The sql_requests record of worker 42: `requests` of 1 ms, and one slow
/// request in each listed session, given as (SPID, server µs, delivery µs,
/// retransmissions of its response).
pub fn sql_requests(requests: u64, slow: &[(u16, u64, u64, u32)]) -> Value {
    let fast = requests - slow.len() as u64;
    let part = |f: fn(&(u16, u64, u64, u32)) -> u64, fast_us: f64| {
        let mut values = vec![(fast_us, fast)];
        values.extend(slow.iter().map(|r| (f(r) as f64, 1)));
        hist(&values)
    };
    let retransmitted = slow.iter().filter(|r| r.3 > 0).count();
    let by_session: Vec<Value> = slow
        .iter()
        .enumerate()
        .map(|(i, &(spid, server, delivery, retransmits))| {
            json!({"spid": spid, "client": format!("10.0.0.7:{}", 50001 + i), "requests": 1,
                "retransmitted": u64::from(retransmits > 0), "slow": 1,
                "slowest": {"arrived": "t", "total_us": server + delivery, "server_us": server,
                    "delivery_us": delivery, "retransmits": retransmits, "response_bytes": 100}})
        })
        .collect();
    json!({"type": "sql_requests", "ts": "t", "host": "h", "interval_ms": 1000, "pid": 42,
        "requests": requests, "retransmitted": retransmitted, "slow": slow.len(),
        "slow_retransmitted": retransmitted, "slow_ms": 200, "without_spid": 0,
        "total_us": part(|r| r.1 + r.2, 1000.0), "server_us": part(|r| r.1, 900.0),
        "delivery_us": part(|r| r.2, 100.0), "sessions": slow.len(), "by_session": by_session})
}

/// One interval with something of every kind: timeouts on a half-duplex
/// link (hitting 60 sessions), a slow disk holding a SQL Server log, a shaped interface, a
/// receiver-limited flow, requests slow in their delivery.
pub fn eventful_interval() -> Vec<Value> {
    // More sessions hit than a record lists.
    let timeouts = (0..60).map(|i| rto("10.0.0.2", 408.0, 1, 51 + i, 50001 + i as u16));
    timeouts
        .chain([
            sql_instance(json!({"7:3": "log"})),
            json!({"type": "sql_session", "ts": "t", "host": "h", "event": "identified", "pid": 42,
            "netns": 1, "kind": "client", "local": "10.0.0.1:1433", "remote": "10.0.0.7:50001",
            "sock_ino": 7, "first_seen": "t", "spid": 51, "encrypted": false}),
            netdev("eth0", &[(30_000.0, 500)], link("half", 37, 12, 0)),
            slow_disk(),
            slow_io("loop3", 42, Some("/var/opt/mssql/data/sales_log.ldf")),
            flow("receiver", 900.0, 700.0, 0),
            sql_requests(200, &[(51, 800, 408_500, 1)]),
        ])
        .collect()
}
