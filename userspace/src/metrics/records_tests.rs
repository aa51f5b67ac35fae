//! Unit tests of `metrics::records`: what each record adds to the metrics.

/// The help texts say the sampling rates the kernel side uses (abi.h).
#[test]
fn netdev_help_names_the_kernel_sampling_rates() {
    let help = |name: &str| NETDEV_TIMES.iter().find(|t| t.1 == name).unwrap().2;
    let (qdisc, rx) = (
        "stalltrace_netdev_qdisc_seconds",
        "stalltrace_netdev_rx_seconds",
    );
    let tx_rate = format!("1 in {} sent packets", crate::abi::NETDEV_TX_SAMPLE);
    let rx_rate = format!("1 in {} received packets", crate::abi::NETDEV_RX_SAMPLE);
    assert!(help(qdisc).contains(&tx_rate), "{}", help(qdisc));
    assert!(help(rx).contains(&rx_rate), "{}", help(rx));
}

use super::*;
use crate::records::Record;
use serde_json::{Value, json};

fn registry() -> (Registry, FromRecords) {
    let mut r = Registry::default();
    let f = FromRecords::new(&mut r, 0, 0);
    (r, f)
}

/// A record's line as output/json.rs hands it over: the envelope's
/// fields and the record's.
fn line(kind: &str, body: Value) -> Value {
    let mut line = json!({"ts": "2026-11-23T10:00:00Z", "host": "db1", "type": kind,
        "schema": crate::records::SCHEMA_VERSION, "run": "r1", "seqno": 7});
    let body = body.as_object().cloned().unwrap_or_default();
    line.as_object_mut().unwrap().extend(body);
    line
}

/// A typed record's line.
fn typed<R: Record>(record: &R) -> Value {
    line(R::TYPE, serde_json::to_value(record).unwrap())
}

/// Hands `line` over as the writer does: typed, with its `ts` (a line that
/// does not read as its type is a broken test).
fn feed(r: &mut Registry, f: &mut FromRecords, kind: &str, line: &Value) {
    let record = crate::records::AnyRecord::read(kind, line)
        .unwrap_or_else(|| panic!("{kind}: no such record type"))
        .unwrap_or_else(|e| panic!("a {kind} line that does not read: {e}"));
    f.record(r, line["ts"].as_str().unwrap_or_default(), &record);
}

fn assert_lines(text: &str, lines: &[&str]) {
    for line in lines {
        assert!(text.contains(&format!("{line}\n")), "no {line} in\n{text}");
    }
}

fn hist(buckets: Value, count: u64, mean: f64) -> Value {
    json!({"count": count, "mean": mean, "buckets": buckets})
}

#[test]
fn kernel_buckets_land_in_their_octave() {
    let (mut r, mut f) = registry();
    // 496-511 ns and 1024-1087 ns (the kernel's buckets, in µs), and 3 s.
    let mut kernel = crate::hist::Histogram::default();
    kernel.record(500, 4);
    kernel.record(1_050, 5);
    kernel.record(3_000_000_000, 1);
    let mut latency = serde_json::to_value(kernel.to_record(1e-3)).unwrap();
    latency["mean"] = json!(300000.0);
    let empty = hist(json!([]), 0, 0.0);
    let record = json!({"dev": "sdb", "major": 8, "minor": 16, "op": "read",
        "interval_ms": 1000, "count": 10, "bytes": 40960, "bios": 10, "errors": 0,
        "requeues": 0, "completions_unseen": 0, "latency_us": latency,
        "tag_wait_us": empty, "queue_us": empty, "device_us": empty,
        "inflight": hist(json!([[3.0, 3.0, 10]]), 10, 3.0), "inflight_now": 0,
        "queue_limit": {"nr_requests": 64, "device_queue_depth": 32}, "role": "log"});
    feed(&mut r, &mut f, "block", &line("block", record));
    let text = r.render();
    let series = r#"device="sdb",op="read",role="log""#;
    for line in [
        format!("stalltrace_block_latency_seconds_bucket{{{series},le=\"0.000001023\"}} 4"),
        format!("stalltrace_block_latency_seconds_bucket{{{series},le=\"0.000002047\"}} 9"),
        format!("stalltrace_block_latency_seconds_bucket{{{series},le=\"2.147483647\"}} 9"),
        format!("stalltrace_block_latency_seconds_bucket{{{series},le=\"4.294967295\"}} 10"),
        format!("stalltrace_block_latency_seconds_sum{{{series}}} 3"),
        format!("stalltrace_block_requests_total{{{series}}} 10"),
        format!("stalltrace_block_queue_occupancy_requests_bucket{{{series},le=\"1\"}} 0"),
        format!("stalltrace_block_queue_occupancy_requests_bucket{{{series},le=\"3\"}} 10"),
        "stalltrace_block_queue_limit_requests{device=\"sdb\",limit=\"device_queue_depth\"} 32"
            .into(),
        "stalltrace_records_total{type=\"block\"} 1".into(),
    ] {
        assert!(text.contains(&format!("{line}\n")), "no {line} in\n{text}");
    }
}

#[test]
fn retransmits_and_episodes_are_counted_as_the_stream_says() {
    let (mut r, mut f) = registry();
    let rtx = |kind: RetransmitKind, segs: u32, err: i32, timer: bool| {
        let mut t = TcpRetransmitRecord::from_event(&Default::default(), 250);
        (t.kind, t.segs, t.err, t.timer) = (kind, segs, err, timer);
        typed(&t)
    };
    for (kind, segs, err, timer) in [
        (RetransmitKind::Rto, 1, 0, true),
        (RetransmitKind::Rto, 2, 0, false),
        (RetransmitKind::Fast, 3, -105, false),
    ] {
        feed(
            &mut r,
            &mut f,
            "tcp_retransmit",
            &rtx(kind, segs, err, timer),
        );
    }
    let stall = |id: u64, phase: Phase, cause: Cause| {
        typed(&StallRecord {
            id,
            phase,
            start: "2026-11-23T10:00:00Z".into(),
            end: None,
            duration_ms: 0.0,
            kind: stall::Kind::Storage,
            cause,
            subject: Default::default(),
            role: None,
            impact_ms: 0.0,
            evidence: vec![],
            next_step: String::new(),
            sessions: vec![],
            sessions_omitted: None,
            files: vec![],
        })
    };
    feed(
        &mut r,
        &mut f,
        "stall",
        &stall(1, Phase::Open, Cause::SlowDevice),
    );
    feed(
        &mut r,
        &mut f,
        "stall",
        &stall(2, Phase::Open, Cause::SlowDevice),
    );
    // Closed under another cause than it opened with.
    feed(
        &mut r,
        &mut f,
        "stall",
        &stall(1, Phase::Closed, Cause::QueueFull),
    );
    let text = r.render();
    for line in [
        "stalltrace_tcp_retransmitted_segments_total{kind=\"rto\"} 3",
        "stalltrace_tcp_retransmit_failed_segments_total{kind=\"fast\"} 3",
        "stalltrace_tcp_retransmission_timeouts_total 1",
        "stalltrace_stall_episodes_total{kind=\"storage\",cause=\"slow_device\"} 2",
        "stalltrace_stall_episodes_open{kind=\"storage\",cause=\"slow_device\"} 1",
        "stalltrace_stall_episodes_open{kind=\"storage\",cause=\"queue_full\"} 0",
    ] {
        assert!(text.contains(&format!("{line}\n")), "no {line} in\n{text}");
    }
}

#[test]
fn start_netdev_rtt_and_lost_read_from_their_lines() {
    let (mut r, mut f) = registry();
    let start = json!({"version": "1.2.3", "kernel": "6.8.0-45-generic", "interval_ms": 1000,
        "slow_io_ms": 0.0, "bpf_stats": false, "kernel_hz": 250, "kernel_hz_source": "config",
        "filters": {"ports": [], "netns": [], "ifaces": []}, "families": [], "probes": []});
    feed(&mut r, &mut f, "start", &line("start", start.clone()));
    // A further file's start repeats the run's: not a second start.
    let mut further = line("start", start);
    further["file"] = json!(1);
    further["version"] = json!("9.9.9");
    further["ts"] = json!("2026-11-23T11:00:00Z");
    feed(&mut r, &mut f, "start", &further);
    let empty = hist(json!([]), 0, 0.0);
    let netdev = json!({"iface": "eth0", "ifindex": 2, "netns": 4026531840u64,
        "interval_ms": 1000, "qdisc_us": empty, "xmit_us": empty, "rx_us": empty,
        "qdisc_untimed": 0, "tx_timeouts": 1, "tx_stalls": 2, "tx_busy": 3});
    feed(&mut r, &mut f, "netdev", &line("netdev", netdev));
    let mut kernel = crate::hist::Histogram::default();
    kernel.record(500, 2);
    let srtt = serde_json::to_value(kernel.to_record(1e-3)).unwrap();
    let rtt = json!({"netns": 1, "family": "ipv4", "saddr": "10.0.0.1", "sport": 50000,
        "daddr": "10.0.0.2", "dport": 1433, "interval_ms": 1000, "srtt_us": srtt,
        "retransmits": 0, "retrans_segs": 0, "rtos": 0, "fast_retransmits": 0,
        "tail_loss_probes": 0, "syn_retransmits": 0, "peer_table_full": false});
    feed(&mut r, &mut f, "tcp_rtt", &line("tcp_rtt", rtt));
    let lost = json!({"interval_ms": 1000,
        "by_source": {"block.kernel_skipped": 3, (OUTPUT_LOST): 2}});
    feed(&mut r, &mut f, "lost", &line("lost", lost));
    let text = r.render();
    let schema = crate::records::SCHEMA_VERSION;
    assert_lines(
        &text,
        &[
            &format!(
                r#"stalltrace_build_info{{version="1.2.3",schema="{schema}",kernel="6.8.0-45-generic"}} 1"#
            ),
            "stalltrace_start_time_seconds 1795428000",
            r#"stalltrace_netdev_tx_busy_total{interface="eth0",netns="4026531840"} 3"#,
            r#"stalltrace_netdev_qdisc_seconds_count{interface="eth0",netns="4026531840"} 0"#,
            "stalltrace_tcp_srtt_seconds_count 2",
            r#"stalltrace_tcp_srtt_seconds_bucket{le="0.000001023"} 2"#,
            r#"stalltrace_lost_total{source="block.kernel_skipped"} 3"#,
            r#"stalltrace_records_total{type="start"} 2"#,
        ],
    );
    assert!(!text.contains("9.9.9"), "{text}");
    assert!(!text.contains(OUTPUT_LOST), "{text}");
}

#[test]
fn stall_kinds_are_named_as_the_records_name_them() {
    for kind in [
        stall::Kind::Network,
        stall::Kind::Storage,
        stall::Kind::BulkFlow,
        stall::Kind::Requests,
    ] {
        assert_eq!(serde_json::to_value(kind).unwrap(), kind.name());
    }
}

#[test]
fn the_metrics_read_the_types_that_carry_their_figures() {
    use crate::metrics::wanted;
    assert!(wanted("tcp_rtt") && wanted("start") && wanted("slow_io") && !wanted("tcp_flow"));
}

/// Request latency per instance and part, and the slow requests split by
/// whether they met a retransmission: summed over records, never per session.
#[test]
fn sql_requests_are_histograms_per_instance_and_part() {
    use crate::records::sql_requests::{RequestCounts, SqlRequestsRecord};
    let (mut r, mut f) = registry();
    let hist_of = |samples_ns: &[u64]| {
        let mut h = crate::hist::Histogram::default();
        for &ns in samples_ns {
            h.record(ns, 1);
        }
        h.to_record(1e-3)
    };
    let record = SqlRequestsRecord {
        interval_ms: 1000,
        pid: 4242,
        counts: RequestCounts {
            requests: 3,
            retransmitted: 1,
            slow: 2,
            slow_retransmitted: 1,
            slow_ms: 200,
            without_spid: 0,
        },
        // 1.05 µs, 1.05 µs and 3 s in total; the last one's 3 s was delivery.
        total_us: hist_of(&[1_050, 1_050, 3_000_000_000]),
        server_us: hist_of(&[1_050, 1_050, 500]),
        delivery_us: hist_of(&[0, 0, 3_000_000_000]),
        sessions: 2,
        mars_sessions: 0,
        by_session: Vec::new(),
    };
    let line = typed(&record);
    feed(&mut r, &mut f, "sql_requests", &line);
    feed(&mut r, &mut f, "sql_requests", &line);
    let text = r.render();
    let total = r#"worker_pid="4242",part="total""#;
    let delivery = r#"worker_pid="4242",part="delivery""#;
    assert_lines(
        &text,
        &[
            &format!(
                "stalltrace_sql_request_duration_seconds_bucket{{{total},le=\"0.000002047\"}} 4"
            ),
            &format!(
                "stalltrace_sql_request_duration_seconds_bucket{{{total},le=\"4.294967295\"}} 6"
            ),
            &format!("stalltrace_sql_request_duration_seconds_count{{{total}}} 6"),
            &format!(
                "stalltrace_sql_request_duration_seconds_bucket{{{delivery},le=\"2.147483647\"}} 4"
            ),
            "stalltrace_sql_requests_slow_total{worker_pid=\"4242\",retransmitted=\"true\"} 2",
            "stalltrace_sql_requests_slow_total{worker_pid=\"4242\",retransmitted=\"false\"} 2",
        ],
    );
    assert!(!text.contains("spid"), "no session labels:\n{text}");
}
