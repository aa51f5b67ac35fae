//! `rtt`: round trips that grow for no fault of the path's own. Request /
//! response traffic (sockperf ping-pong, small messages like a transaction's)
//! shares a rate-limited transmit queue with a bulk stream (a backup, a
//! replica): every response waits behind the bulk data queued in front of it
//! (bufferbloat). Clean: the same requests and the same shaper, without the
//! bulk stream.

use std::time::Duration;

use serde_json::Value;

use super::{Expected, Fault, Outcome, tracer_args};
use crate::net::{Family, NetPair, Side};
use crate::records::{Buckets, of_type};
use crate::tracer::Tracer;
use crate::{Bins, parse_lines};

pub const ABOUT: &str =
    "sockperf ping-pong through a 20 Mbit/s tbf; fault: a bulk stream fills the same queue";

const SECS: u32 = 5;
const MPS: u32 = 200;
const RATE: &str = "20mbit";

pub fn run(bins: &Bins, fault: Fault) -> Outcome {
    crate::require_root();
    bins.check();
    // B answers the requests (and sends the bulk stream) through its shaper.
    let pair = NetPair::new();
    pair.limit_rate(Side::B, RATE, "64kb", "200ms");
    let sockperf_server = pair.sockperf_server(Side::B);
    let iperf_server = pair.iperf3_server(Side::A);
    let args = tracer_args(&[pair.netns(Side::A), pair.netns(Side::B)]);
    let tracer = Tracer::start(&bins.stalltrace, &args);
    let (sockperf, bulk) = std::thread::scope(|s| {
        let bulk = (fault == Fault::Injected).then(|| {
            s.spawn(|| {
                // From B to A, cubic (see throttle.rs: the congestion control of
                // a typical SQL Server host, which keeps the queue full).
                pair.iperf3(
                    &iperf_server,
                    Family::V4,
                    SECS + 4,
                    &["-C", super::throttle::CC],
                )
            })
        });
        if bulk.is_some() {
            std::thread::sleep(Duration::from_secs(1));
        }
        let sockperf = pair.sockperf(&sockperf_server, SECS, Some(MPS));
        (sockperf, bulk.map(|b| b.join().unwrap()))
    });
    std::thread::sleep(Duration::from_millis(800));
    let stream = tracer.stop_text();

    // The kernel's srtt of sockperf's own connection, on the client's side.
    let records = parse_lines(&stream);
    let rtts: Vec<&Value> = of_type(&records, "tcp_rtt")
        .into_iter()
        .filter(|r| {
            r["netns"].as_u64() == Some(pair.netns_inode(Side::A))
                && r["daddr"] == pair.v4(Side::B).to_string()
                && r["dport"] == sockperf_server.port
        })
        .collect();
    let srtt = Buckets::merge(&rtts, "srtt_us");

    let mut o = Outcome::new("rtt", fault, stream);
    o.args = args.iter().map(|s| s.to_string()).collect();
    o.peers = vec![pair.v4(Side::A).to_string(), pair.v4(Side::B).to_string()];
    o.ifaces = vec![pair.veth(Side::A).into(), pair.veth(Side::B).into()];
    o.netns = vec![pair.netns_inode(Side::A), pair.netns_inode(Side::B)];
    let ms = |us: f64| format!("{:.2} ms", us / 1000.0);
    o.figures.push(format!(
        "sockperf round trip ({} observations, {MPS}/s): p50 {}, p90 {}, p99 {}, max {}",
        sockperf.observations,
        ms(sockperf.percentile(50.0)),
        ms(sockperf.percentile(90.0)),
        ms(sockperf.percentile(99.0)),
        ms(sockperf.max_us)
    ));
    o.values
        .insert("sockperf_p50_us", sockperf.percentile(50.0));
    o.values
        .insert("sockperf_p99_us", sockperf.percentile(99.0));
    o.values.insert("srtt_samples", srtt.count() as f64);
    if srtt.count() > 0 {
        o.values.insert("srtt_p50_us", srtt.percentile(0.5));
        o.values.insert("srtt_p99_us", srtt.percentile(0.99));
        o.figures.push(format!(
            "stalltrace tcp_rtt of that connection (kernel srtt, {} samples): p50 {}, p90 {}, p99 {}, max {}",
            srtt.count(),
            ms(srtt.percentile(0.5)),
            ms(srtt.percentile(0.9)),
            ms(srtt.percentile(0.99)),
            ms(srtt.max())
        ));
    }
    if let Some(b) = bulk {
        o.figures.push(format!(
            "iperf3 bulk stream B -> A: received {:.1} Mbit/s, {} retransmits",
            b.received_bps / 1e6,
            b.retransmits.unwrap_or(0)
        ));
    }
    if fault == Fault::Injected {
        o.expected = vec![Expected {
            kind: "network",
            cause: "tx_throttled",
            field: "iface",
            value: pair.veth(Side::B).into(),
            netns: Some(pair.netns_inode(Side::B)),
            sessions: Vec::new(),
        }];
    }
    o
}
