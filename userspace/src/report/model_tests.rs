//! The model against synthetic streams whose answers are worked out by hand,
//! and against the real recording with an independent re-merge as the oracle.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::episodes::EpisodeState;
use super::fixtures::*;
use super::model::Report;
use super::render_text;

#[test]
fn synthetic_records_follow_the_schema() {
    let v = schema_1_validator();
    for r in [
        start(),
        block(
            1.0,
            "nvme0n1",
            "read",
            json!([[1.024, 1.087, 3]]),
            json!([[1.0, 1.0, 3]]),
        ),
        stall(
            1,
            "open",
            2.0,
            1.0,
            None,
            0.0,
            json!([session_tag(51, 50000)]),
        ),
        stall(1, "closed", 5.0, 1.0, Some(4.0), 612.0, json!([])),
        retransmit(2.5, 50000, 51, true, 204.0),
        stop(6.0, json!({"start": 1}), json!({})),
    ] {
        assert_valid(&v, &r);
    }
}

// ---- histograms -----------------------------------------------------------------

#[test]
fn a_disk_merges_its_intervals_bucket_by_bucket() {
    // Interval 1: 6 reads at ~1 µs ([1.024, 1.087]) and 2 at ~21 µs; interval 2:
    // 2 more at ~1 µs and 10 at ~100 ms ([96468.992, 100663.295]).
    let r = report(&[
        start(),
        block(
            1.0,
            "sdb",
            "read",
            json!([[1.024, 1.087, 6], [20.48, 21.503, 2]]),
            json!([[1.0, 1.0, 8]]),
        ),
        block(
            2.0,
            "sdb",
            "read",
            json!([[1.024, 1.087, 2], [96468.992, 100663.295, 10]]),
            json!([[4.0, 4.0, 12]]),
        ),
        stop(2.5, json!({"start": 1, "block": 2}), json!({})),
    ]);
    let op = &r.disks[0].ops[0];
    // By hand: 8 at ~1 µs, 2 at ~21 µs, 10 at ~100 ms; 20 in all.
    assert_eq!(
        op.latency.buckets(),
        vec![
            (1.024, 1.087, 8),
            (20.48, 21.503, 2),
            (96468.992, 100663.295, 10)
        ]
    );
    assert_eq!(op.requests, 20);
    assert_eq!(op.bytes, 20 * 8192);
    // Nearest rank of 20: p50 = 10th value (~21 µs bucket), p90 = 18th (100 ms bucket).
    assert_eq!(op.latency.percentile(0.5), Some(20.992));
    assert_eq!(op.latency.percentile(0.9), Some(98566.144));
    assert_eq!(op.latency.max(), Some(100663.295));
    // Means merge weighted by count: both records say 100 µs.
    assert_eq!(op.latency.mean(), Some(100.0));
    // In flight: 8 issues at depth 1, 12 at depth 4; p50 is the 10th.
    assert_eq!(op.inflight.percentile(0.5), Some(4.0));
    assert_eq!(op.inflight.max(), Some(4.0));
    // Two 1 s intervals: 10 IOPS on average, 12 at the peak.
    assert_eq!(op.iops(), 10.0);
    assert_eq!(op.peak_iops(), 12.0);
    assert_eq!(op.series.len(), 2);
    assert_eq!(op.series[1].latency.iter().map(|(_, n)| n).sum::<u64>(), 12);
    assert_eq!(r.disks[0].queue_limit.effective_depth(), Some(32));
    assert_eq!(r.run.intervals, 2);
}

#[test]
fn a_disks_role_comes_from_the_instance_when_its_records_have_none() {
    let r = report(&[
        start(),
        json!({"ts": ts(0.5), "host": HOST, "type": "sql_instance", "pid": 4242, "netns": 1,
            "tds_ports": [1433], "ag_ports": [5022],
            "files": [{"path": "/var/opt/mssql/data/s_log.ldf", "role": "log", "disks": ["259:0"]}],
            "disk_roles": {"259:0": "log"}}),
        block(
            1.0,
            "nvme0n1",
            "write",
            json!([[1.024, 1.087, 1]]),
            json!([[1.0, 1.0, 1]]),
        ),
    ]);
    assert_eq!(r.disks[0].role.as_deref(), Some("log"));
    assert_eq!(r.instances[0].tds_ports, [1433]);
}

/// Nearest-rank percentile of `[low, high, count]` buckets merged by their
/// edges, written without the crate's histogram code: the oracle.
fn oracle(hists: &[&Value], q: f64) -> Option<(u64, f64, f64)> {
    let mut merged: BTreeMap<(u64, u64), u64> = BTreeMap::new();
    for h in hists {
        for b in h["buckets"].as_array().unwrap() {
            let lo = (b[0].as_f64().unwrap() * 1000.0).round() as u64;
            let hi = (b[1].as_f64().unwrap() * 1000.0).round() as u64;
            *merged.entry((lo, hi)).or_default() += b[2].as_u64().unwrap();
        }
    }
    let total: u64 = merged.values().sum();
    if total == 0 {
        return None;
    }
    let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
    let mut seen = 0;
    let mut at = None;
    for (&(lo, hi), &n) in &merged {
        seen += n;
        if seen >= rank && at.is_none() {
            // f64: the recording holds buckets near u64::MAX (a wrapped phase).
            at = Some((lo as f64 + hi as f64) / 2.0 / 1000.0);
        }
    }
    let max = merged.keys().last().unwrap().1 as f64 / 1000.0;
    // Every value in one bucket: the exact mean, weighted by count.
    if let [(&(lo, hi), _)] = merged.iter().collect::<Vec<_>>()[..] {
        let (sum, n) = hists.iter().fold((0.0, 0u64), |(sum, n), h| {
            match (h["mean"].as_f64(), h["count"].as_u64()) {
                (Some(m), Some(c)) => (sum + m * c as f64, n + c),
                _ => (sum, n),
            }
        });
        if n > 0 {
            let mean = (sum / n as f64).clamp(lo as f64 / 1000.0, hi as f64 / 1000.0);
            return Some((total, mean, max));
        }
    }
    Some((total, at.unwrap(), max))
}

fn close(a: f64, b: f64) -> bool {
    // Both sides round to 0.001 µs; they may differ in the last digit.
    (a - b).abs() <= 0.0011 + b.abs() * 1e-12
}

#[test]
fn the_recordings_merged_percentiles_match_an_independent_merge() {
    let records: Vec<Value> = recorded()
        .iter()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let r = Report::from_records(&records).unwrap();
    let mut checked = 0;
    for d in &r.disks {
        for op in &d.ops {
            let mine = |r: &&Value| {
                r["type"] == "block" && r["dev"] == d.dev.as_str() && r["op"] == op.op.as_str()
            };
            let of: Vec<&Value> = records.iter().filter(mine).collect();
            let requests: u64 = of.iter().map(|r| r["count"].as_u64().unwrap()).sum();
            assert_eq!(op.requests, requests, "{} {}", d.dev, op.op);
            for (field, merged) in [
                ("latency_us", &op.latency),
                ("tag_wait_us", &op.tag_wait),
                ("queue_us", &op.queue),
                ("device_us", &op.device),
            ] {
                let hists: Vec<&Value> = of.iter().map(|r| &r[field]).collect();
                for q in [0.5, 0.9, 0.99] {
                    match oracle(&hists, q) {
                        None => assert_eq!(merged.count(), 0),
                        Some((count, p, max)) => {
                            assert_eq!(merged.count(), count, "{} {} {field}", d.dev, op.op);
                            let got = merged.percentile(q).unwrap();
                            assert!(
                                close(got, p),
                                "{} {} {field} p{q}: {got} vs {p}",
                                d.dev,
                                op.op
                            );
                            assert!(close(merged.max().unwrap(), max));
                            checked += 1;
                        }
                    }
                }
            }
        }
    }
    for i in &r.interfaces {
        let hists: Vec<&Value> = records
            .iter()
            .filter(|r| r["type"] == "netdev" && r["iface"] == i.iface.as_str())
            .map(|r| &r["qdisc_us"])
            .collect();
        let (count, p99, _) = oracle(&hists, 0.99).unwrap();
        assert_eq!(i.qdisc.count(), count);
        assert!(close(i.qdisc.percentile(0.99).unwrap(), p99));
        checked += 1;
    }
    assert!(checked >= 20, "only {checked} histograms compared");
}

#[test]
fn one_interval_merged_gives_back_that_intervals_own_figures() {
    // The producer computed each record's percentiles from the true counts:
    // a run of one interval must report exactly those. This recording's
    // producer took every percentile as its bucket's midpoint; today's takes
    // the exact mean where all of an interval's values share one bucket.
    let written = |h: &Value, p: &str| {
        let one_bucket = h["buckets"].as_array().is_some_and(|b| b.len() == 1);
        if one_bucket {
            h["mean"].as_f64()
        } else {
            h[p].as_f64()
        }
    };
    for line in recorded() {
        let v: Value = serde_json::from_str(&line).unwrap();
        if v["type"] != "block" || v["latency_us"]["count"] == 0 {
            continue;
        }
        let r = Report::from_records(&[start(), v.clone()]).unwrap();
        let op = &r.disks[0].ops[0];
        let latency = &v["latency_us"];
        assert_eq!(
            op.latency.percentile(0.5),
            written(latency, "p50"),
            "{line}"
        );
        assert_eq!(op.latency.percentile(0.99), written(latency, "p99"));
        assert_eq!(op.latency.max(), latency["max"].as_f64());
        assert_eq!(op.inflight.percentile(0.9), written(&v["inflight"], "p90"));
    }
}

// ---- episodes -----------------------------------------------------------------

#[test]
fn episodes_pair_by_id_and_an_unclosed_one_is_still_open_at_the_end() {
    let r = report(&[
        start(),
        stall(1, "open", 2.0, 1.0, None, 0.0, json!([])),
        stall(2, "open", 3.0, 2.0, None, 10.0, json!([])),
        stall(1, "closed", 5.0, 1.0, Some(4.0), 612.0, json!([])),
        // id 3: its opening is not in the file.
        stall(3, "closed", 6.0, 0.5, Some(1.5), 100.0, json!([])),
        block(
            9.0,
            "sda",
            "read",
            json!([[1.024, 1.087, 1]]),
            json!([[1.0, 1.0, 1]]),
        ),
    ]);
    let by_id = |id| r.episodes.iter().find(|e| e.id == id).unwrap();
    let one = by_id(1);
    assert_eq!(one.state, EpisodeState::Closed);
    assert_eq!(one.impact_ms, 612.0); // the closed record's totals
    assert_eq!(one.duration_ms, 3000.0);
    assert_eq!(one.end_us - one.start_us, 3_000_000);
    let two = by_id(2);
    assert_eq!(two.state, EpisodeState::StillOpen);
    // Still open: it lasted at least until the last record (9 s), from 2 s.
    assert_eq!(two.end_us, r.run.end_us);
    assert_eq!(two.duration_ms, 7000.0);
    assert_eq!(by_id(3).state, EpisodeState::ClosedOnly);
    assert_eq!(r.episodes.len(), 3);
    let text = flat(&render_text(&r, 100));
    assert!(
        text.contains("STILL OPEN when the recording ended"),
        "{text}"
    );
    assert!(text.contains("its opening is not in this file"), "{text}");
}

#[test]
fn episodes_rank_by_impact_then_length_then_id() {
    let r = report(&[
        start(),
        stall(1, "closed", 9.0, 1.0, Some(2.0), 50.0, json!([])),
        stall(2, "closed", 9.0, 1.0, Some(5.0), 900.0, json!([])),
        stall(3, "closed", 9.0, 1.0, Some(3.0), 50.0, json!([])),
        stall(4, "closed", 9.0, 1.0, Some(2.0), 50.0, json!([])),
    ]);
    let ids: Vec<u64> = r.episodes.iter().map(|e| e.id).collect();
    assert_eq!(ids, [2, 3, 1, 4]);
    assert_eq!(r.rank_of(3), Some(2));
    let text = render_text(&r, 100);
    let at = |needle: &str| {
        text.find(needle)
            .unwrap_or_else(|| panic!("{needle}: {text}"))
    };
    assert!(at("(episode 2)") < at("(episode 3)"));
    assert!(at("(episode 3)") < at("(episode 1)"));
    assert!(at("(episode 1)") < at("(episode 4)"));
}

// ---- sessions -------------------------------------------------------------------

#[test]
fn a_session_collects_its_episodes_rto_waits_and_who_it_is() {
    let r = report(&[
        start(),
        json!({"ts": ts(0.5), "host": HOST, "type": "sql_session", "event": "identified", "pid": 4242,
            "netns": 1, "kind": "client", "local": "10.0.0.1:1433", "remote": "10.0.0.9:50000",
            "sock_ino": 77, "first_seen": ts(0.1), "spid": 51, "encrypted": false,
            "dmv": [{"session_id": 51, "connect_time_ms": 1_795_341_600_000_u64, "login": "orders",
                "program": "OrderSvc", "status": "running"}]}),
        retransmit(1.5, 50000, 51, true, 204.0),
        retransmit(1.9, 50000, 51, true, 408.0),
        retransmit(2.0, 50000, 51, false, 816.0), // not timer-fired: no wait of its own
        retransmit(2.1, 50001, 52, false, 200.0),
        stall(
            1,
            "closed",
            5.0,
            1.0,
            Some(3.0),
            612.0,
            json!([session_tag(51, 50000), session_tag(53, 50002)]),
        ),
        stall(
            2,
            "closed",
            8.0,
            6.0,
            Some(6.5),
            90.0,
            json!([session_tag(51, 50000)]),
        ),
    ]);
    let spids: Vec<Option<u16>> = r.sessions.iter().map(|s| s.tag.spid).collect();
    // 51: 2.5 s in stalls + 612 ms RTO; 53: 2 s; 52: only a retransmit.
    assert_eq!(spids, [Some(51), Some(53), Some(52)]);
    let s51 = &r.sessions[0];
    assert_eq!(s51.episodes, [1, 2]);
    assert_eq!(s51.stall_ms, 2500.0);
    assert_eq!(s51.timeout_wait_ms, 612.0);
    assert_eq!(s51.rtos, 2);
    assert_eq!(s51.retransmits, 3);
    assert_eq!(s51.tag.login.as_deref(), Some("orders"));
    let text = flat(&render_text(&r, 120));
    assert!(
        text.contains("SPID 51 from 10.0.0.9:50000 (login orders, program OrderSvc)"),
        "{text}"
    );
    assert_eq!(r.retransmits.timeouts, 2);
    assert_eq!(r.retransmits.rto_wait_ms, 612.0);
}
