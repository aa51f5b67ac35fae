//! `netdev/tbf`: a 20 Mbit/s tbf on one veth raises the qdisc wait far above
//! the unlimited run's, with backlog reported. Bounds of tests/net.rs
//! `a_rate_limit_shows_as_qdisc_wait_and_backlog` (the same load: iperf3 paced
//! at 200 Mbit/s for 3 s, tbf 20mbit burst 64kb latency 200ms).

use std::time::Duration;

use serde_json::Value;

use super::net::{stop, tracer_in};
use super::{Judge, Opts};
use crate::net::{Family, NetPair, QdiscStats, Side};
use crate::{Buckets, of_type};

pub fn tbf(opts: &Opts, judge: &mut Judge) {
    let pair = NetPair::new();
    let server = pair.iperf3_server(Side::B);
    let veth = pair.veth(Side::A).to_string();
    let run = |judge: &mut Judge, limited: bool| -> Option<(Vec<Value>, Option<QdiscStats>)> {
        if limited {
            pair.limit_rate(Side::A, "20mbit", "64kb", "200ms");
        }
        let tracer = tracer_in(opts, judge, &pair, "netdev", &["--iface", &veth])?;
        let iperf = pair.iperf3(&server, Family::V4, 3, &["-b", "200M"]);
        let oracle = limited.then(|| pair.qdisc_stats(Side::A));
        std::thread::sleep(Duration::from_millis(1200));
        let records = stop(judge, tracer)?;
        judge.note(format!(
            "{}: iperf3 {:.1} Mbit/s received",
            if limited { "tbf" } else { "free" },
            iperf.received_bps / 1e6
        ));
        let ours = of_type(&records, "netdev").into_iter().cloned().collect();
        Some((ours, oracle))
    };
    let Some((free, _)) = run(judge, false) else {
        return;
    };
    let Some((limited, oracle)) = run(judge, true) else {
        pair.clear_qdisc(Side::A);
        return;
    };
    pair.clear_qdisc(Side::A);
    let wait = |records: &[Value]| Buckets::merge(&records.iter().collect::<Vec<_>>(), "qdisc_us");
    let (free_wait, limited_wait) = (wait(&free), wait(&limited));
    if !judge.expect(free_wait.count() > 0 && limited_wait.count() > 0, || {
        format!(
            "no qdisc wait samples ({} free, {} under tbf; {} and {} netdev records)",
            free_wait.count(),
            limited_wait.count(),
            free.len(),
            limited.len()
        )
    }) {
        return;
    }
    let (free_p50, limited_p50) = (free_wait.percentile(0.5), limited_wait.percentile(0.5));
    let peak_backlog = limited
        .iter()
        .filter_map(|r| r["link"]["qdisc"]["backlog_bytes"].as_u64())
        .max()
        .unwrap_or(0);
    judge.note(format!(
        "qdisc wait p50 {free_p50:.1} us (mean {:.1}, {} samples) unlimited, {limited_p50:.1} us \
         (mean {:.1}, {} samples) under tbf; peak backlog {peak_backlog} B; tc: {oracle:?}",
        free_wait.mean(),
        free_wait.count(),
        limited_wait.mean(),
        limited_wait.count()
    ));
    judge.expect(
        free.iter()
            .chain(&limited)
            .all(|r| r["iface"] == veth.as_str()),
        || "--iface filter did not hold".into(),
    );
    judge.expect(limited_p50 > 100.0 * free_p50, || {
        format!("qdisc wait p50 did not rise 100x: {free_p50:.1} -> {limited_p50:.1} us")
    });
    judge.expect(limited_p50 > 1000.0, || {
        format!("a 20 Mbit/s queue should hold packets for ms: p50 {limited_p50:.1} us")
    });
    judge.expect(peak_backlog > 0, || "no backlog reported under tbf".into());
    let kind = limited
        .iter()
        .find_map(|r| r["link"]["qdisc"]["kind"].as_str());
    let oracle_kind = oracle.map(|o| o.kind);
    judge.expect(kind == oracle_kind.as_deref(), || {
        format!("qdisc kind {kind:?}, tc says {oracle_kind:?}")
    });
    let free_backlog = free
        .iter()
        .filter_map(|r| r["link"]["qdisc"]["backlog_bytes"].as_u64())
        .max()
        .unwrap_or(0);
    judge.expect(free_backlog == 0, || {
        format!("noqueue holds nothing, yet backlog {free_backlog}")
    });
}
