//! What each stream record adds to the metrics. The metrics are read off the
//! records as they are emitted, so a scrape and the JSON stream can never
//! disagree: the same requests, segments and episodes, summed.
//!
//! Labels are bounded by design: devices, ops, disk roles, interfaces (with
//! their namespace), retransmission kinds, stall kinds and causes, lost
//! sources, record types, programs. Never a peer, port, session or pid.

use std::collections::{BTreeSet, HashMap};

use serde::Deserialize;
use serde_json::Value;

use super::peers::Peers;
use super::registry::{Edges, Kind, Labels, Registry};
use crate::abi;
use crate::hist::{HistogramRecord, bucket_range};
use crate::output::OUTPUT_LOST;
use crate::tcp::record::kind_name;

/// `2^k - 1`: the top of the kernel's bucket octave `k` (0 for k = 0).
fn octave_top(k: u32) -> u64 {
    if k == 0 { 0 } else { u64::MAX >> (64 - k) }
}

/// The histograms' unit: how a recorded value becomes an exported one.
#[derive(Clone, Copy)]
enum Unit {
    /// Timed in ns, written in µs, exported in seconds.
    Seconds,
    /// Counted requests, written and exported as they are.
    Requests,
}

impl Unit {
    /// Recorded units per unit of the record's field (ns per µs).
    fn recorded_per_field(self) -> f64 {
        match self {
            Unit::Seconds => 1e3,
            Unit::Requests => 1.0,
        }
    }

    /// Recorded units per exported unit (ns per second).
    fn recorded_per_exported(self) -> f64 {
        match self {
            Unit::Seconds => 1e9,
            Unit::Requests => 1.0,
        }
    }

    /// Octave `k`'s upper edge in the exported unit. Edges and placements
    /// both come from here, so a bucket lands on its edge exactly.
    fn edge(self, k: u32) -> f64 {
        octave_top(k) as f64 / self.recorded_per_exported()
    }

    /// Octave edges for `k` in `powers`. The kernel's log-linear buckets split
    /// each power of two into 16, so every octave edge is an exact bucket
    /// edge: a Prometheus bucket holds exactly the kernel buckets below its
    /// edge, with no estimate. Octaves rather than the kernel's 16ths: 28
    /// buckets per time histogram instead of ~430, and `histogram_quantile`
    /// within a factor of two is what an alert needs (the stream keeps the
    /// fine percentiles).
    fn edges(self, powers: std::ops::RangeInclusive<u32>) -> Edges {
        Edges(powers.map(|k| self.edge(k)).collect())
    }
}

/// Time histograms: 1.023 µs to 68.7 s.
fn seconds() -> Edges {
    Unit::Seconds.edges(10..=36)
}

/// Request counts: 0, 1, 3, 7 ... 4095.
fn requests() -> Edges {
    Unit::Requests.edges(0..=12)
}

const BLOCK_TIMES: [(&str, &str, &str); 4] = [
    (
        "latency_us",
        "stalltrace_block_latency_seconds",
        "Bio submitted to completed, by disk and op.",
    ),
    (
        "tag_wait_us",
        "stalltrace_block_tag_wait_seconds",
        "Bio submitted to request allocated: waiting for a tag (the queue depth) or a request.",
    ),
    (
        "queue_us",
        "stalltrace_block_queue_seconds",
        "Request allocated to issued to the driver: plugging, scheduler, dispatch.",
    ),
    (
        "device_us",
        "stalltrace_block_device_seconds",
        "Request issued to completed: what the device (or the layer under it) took.",
    ),
];

const BLOCK_COUNTS: [(&str, &str, &str); 5] = [
    (
        "count",
        "stalltrace_block_requests_total",
        "Requests completed (what /proc/diskstats counts).",
    ),
    ("bytes", "stalltrace_block_bytes_total", "Bytes completed."),
    (
        "bios",
        "stalltrace_block_bios_total",
        "Bios completed (more than requests where the block layer merges).",
    ),
    (
        "errors",
        "stalltrace_block_errors_total",
        "Requests completed with an error, and bios that failed before reaching a request.",
    ),
    (
        "requeues",
        "stalltrace_block_requeues_total",
        "Requests the driver handed back (queue full, resource shortage).",
    ),
];

const NETDEV_TIMES: [(&str, &str, &str); 3] = [
    (
        "qdisc_us",
        "stalltrace_netdev_qdisc_seconds",
        "Packet enqueued on the qdisc to handed to the driver (1 in 64 sent packets per CPU: counts are samples).",
    ),
    (
        "xmit_us",
        "stalltrace_netdev_xmit_seconds",
        "The driver's transmit call (the packets qdisc_seconds samples).",
    ),
    (
        "rx_us",
        "stalltrace_netdev_rx_seconds",
        "Received packet handed up the stack (1 in 16 received packets per CPU: counts are samples).",
    ),
];

const NETDEV_COUNTS: [(&str, &str, &str); 3] = [
    (
        "tx_timeouts",
        "stalltrace_netdev_tx_timeouts_total",
        "Transmit queue timeouts (the watchdog fired).",
    ),
    (
        "tx_stalls",
        "stalltrace_netdev_tx_stalls_total",
        "Transmit queues the driver stopped (full rings).",
    ),
    (
        "tx_busy",
        "stalltrace_netdev_tx_busy_total",
        "Packets the driver refused as busy.",
    ),
];

/// The record types that feed the metrics.
pub fn wanted(kind: &str) -> bool {
    matches!(
        kind,
        "start" | "block" | "tcp_retransmit" | "tcp_rtt" | "netdev" | "stall" | "lost"
    )
}

/// Reads records into the registry.
#[derive(Debug)]
pub struct FromRecords {
    /// Open stall episodes by id: the open-episodes gauge is their count.
    open: HashMap<u64, (String, String)>,
    /// Every (kind, cause) an episode had: bounded by the detector's enums.
    seen: BTreeSet<(String, String)>,
    /// `--prometheus-peers`: per-peer retransmissions, capped.
    peers: Option<Peers>,
}

impl FromRecords {
    /// `peers`: how many TCP peers get series of their own (0: none).
    pub fn new(r: &mut Registry, peers: u32) -> Self {
        use Kind::*;
        let seconds = seconds();
        for (_, name, help) in BLOCK_TIMES.iter().chain(&NETDEV_TIMES) {
            r.declare_histogram(name, help, &seconds);
        }
        for (_, name, help) in BLOCK_COUNTS.iter().chain(&NETDEV_COUNTS) {
            r.declare(name, Counter, help);
        }
        r.declare_histogram(
            "stalltrace_block_queue_occupancy_requests",
            "Requests in flight on the whole disk at each issue of this op.",
            &requests(),
        );
        r.declare(
            "stalltrace_block_requests_in_flight",
            Gauge,
            "Requests in flight on the whole disk at the end of the last interval.",
        );
        r.declare(
            "stalltrace_block_requests_in_flight_max",
            Gauge,
            "Most requests in flight on the disk at an issue of this op in the last interval (upper edge of its bucket: never below the true figure).",
        );
        r.declare(
            "stalltrace_block_queue_limit_requests",
            Gauge,
            "The disk's queue limits: nr_requests and hw_queue_depth per hardware queue, device_queue_depth (SCSI LUN depth).",
        );
        r.declare(
            "stalltrace_tcp_retransmitted_segments_total",
            Counter,
            "Segments retransmitted (sent), by kind: rto, fast, tlp, syn.",
        );
        r.declare(
            "stalltrace_tcp_retransmit_failed_segments_total",
            Counter,
            "Retransmissions that did not go out (a local error), by kind.",
        );
        r.declare(
            "stalltrace_tcp_retransmission_timeouts_total",
            Counter,
            "Retransmission timeouts: the timer fired (one per timeout, the first retransmission it sent).",
        );
        r.declare_histogram(
            "stalltrace_tcp_srtt_seconds",
            "Smoothed RTT of every traced connection, sampled at its send and receive calls once an ACK of new data has moved it.",
            &seconds,
        );
        r.declare(
            "stalltrace_stall_episodes_total",
            Counter,
            "Stall episodes opened, by kind and cause.",
        );
        r.declare(
            "stalltrace_stall_episodes_open",
            Gauge,
            "Stall episodes open now, by kind and cause.",
        );
        r.declare(
            "stalltrace_lost_total",
            Counter,
            "Events or measurements not delivered, by source (the stream's lost records).",
        );
        r.declare(
            "stalltrace_records_total",
            Counter,
            "Records emitted, by type.",
        );
        r.declare(
            "stalltrace_build_info",
            Gauge,
            "1, labelled with the version, the stream's schema and the kernel.",
        );
        r.declare(
            "stalltrace_start_time_seconds",
            Gauge,
            "When the run started, in seconds since the epoch.",
        );
        // Shown at 0 from the start: `increase()` misses the first rise of a
        // series that appears only with its first event.
        r.set("stalltrace_tcp_retransmission_timeouts_total", vec![], 0.0);
        for kind in [
            abi::TCP_RETX_RTO,
            abi::TCP_RETX_FAST,
            abi::TCP_RETX_TLP,
            abi::TCP_RETX_SYN,
        ] {
            let kind = label("kind", kind_name(kind as u8));
            r.set(
                "stalltrace_tcp_retransmitted_segments_total",
                kind.clone(),
                0.0,
            );
            r.set("stalltrace_tcp_retransmit_failed_segments_total", kind, 0.0);
        }
        // A disk's or an interface's series go with it.
        for (_, name, _) in BLOCK_TIMES
            .iter()
            .chain(&BLOCK_COUNTS)
            .chain(&NETDEV_TIMES)
            .chain(&NETDEV_COUNTS)
        {
            r.expires(name);
        }
        for name in [
            "stalltrace_block_queue_occupancy_requests",
            "stalltrace_block_requests_in_flight",
            "stalltrace_block_requests_in_flight_max",
            "stalltrace_block_queue_limit_requests",
        ] {
            r.expires(name);
        }
        Self {
            open: HashMap::new(),
            seen: BTreeSet::new(),
            peers: Peers::new(r, peers),
        }
    }

    pub fn record(&mut self, r: &mut Registry, kind: &str, v: &Value) {
        r.add("stalltrace_records_total", label("type", kind), 1.0);
        match kind {
            "start" => start(r, v),
            "block" => block(r, v),
            "tcp_retransmit" => {
                let sent_timeout = retransmit(r, v);
                if let (Some(peers), Some(timeout)) = (&mut self.peers, sent_timeout) {
                    peers.retransmitted(r, v, timeout);
                }
            }
            "tcp_rtt" => histogram(
                r,
                "stalltrace_tcp_srtt_seconds",
                vec![],
                &v["srtt_us"],
                Unit::Seconds,
            ),
            "netdev" => netdev(r, v),
            "stall" => self.stall(r, v),
            "lost" => {
                // Drops of the output queue are counted as they happen
                // (`Metrics::dropped`): a `lost` record saying so can itself
                // be dropped and said again.
                let sources = v["by_source"].as_object().into_iter().flatten();
                for (source, n) in sources.filter(|(s, _)| *s != OUTPUT_LOST) {
                    let n = n.as_f64().unwrap_or(0.0);
                    r.add("stalltrace_lost_total", label("source", source), n);
                }
            }
            _ => {}
        }
    }

    fn stall(&mut self, r: &mut Registry, v: &Value) {
        let (Some(id), Some(kind), Some(cause)) =
            (v["id"].as_u64(), text(v, "kind"), text(v, "cause"))
        else {
            return;
        };
        let labels = |kind: &str, cause: &str| {
            vec![("kind", kind.to_string()), ("cause", cause.to_string())]
        };
        match text(v, "phase") {
            Some("open") => {
                r.add("stalltrace_stall_episodes_total", labels(kind, cause), 1.0);
                self.open.insert(id, (kind.to_string(), cause.to_string()));
            }
            Some("closed") => {
                self.open.remove(&id);
            }
            _ => {}
        }
        // Every kind and cause seen keeps its gauge, at 0 once all are closed
        // (an episode's cause can change between its open and closed records).
        self.seen.insert((kind.to_string(), cause.to_string()));
        for (k, c) in &self.seen {
            let n = self
                .open
                .values()
                .filter(|(ok, oc)| ok == k && oc == c)
                .count();
            r.set("stalltrace_stall_episodes_open", labels(k, c), n as f64);
        }
    }
}

fn label(name: &'static str, value: &str) -> Labels {
    vec![(name, value.to_string())]
}

fn text<'a>(v: &'a Value, field: &str) -> Option<&'a str> {
    v.get(field).and_then(Value::as_str)
}

/// Adds one histogram object of a record (either schema: hist/record.rs).
fn histogram(r: &mut Registry, name: &str, labels: Labels, h: &Value, unit: Unit) {
    let Ok(h) = HistogramRecord::deserialize(h) else {
        return;
    };
    // The kernel bucket's upper edge (exact, unlike the rounded figures in
    // the record), and the octave that holds it.
    let buckets = h.buckets.iter().map(|&(index, count)| {
        let (_, high) = bucket_range(index);
        (unit.edge(u64::BITS - high.leading_zeros()), count)
    });
    let sum = h.mean() * h.count as f64 * unit.recorded_per_field() / unit.recorded_per_exported();
    r.observe(name, labels, buckets.collect::<Vec<_>>(), sum);
}

fn start(r: &mut Registry, v: &Value) {
    // The start that opens a further file repeats the run's: the run began once.
    if v.get("file").is_some() {
        return;
    }
    let info = vec![
        (
            "version",
            text(v, "version").unwrap_or_default().to_string(),
        ),
        ("schema", v["schema"].to_string()),
        ("kernel", text(v, "kernel").unwrap_or_default().to_string()),
    ];
    r.set("stalltrace_build_info", info, 1.0);
    if let Some(ts) = text(v, "ts").and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()) {
        r.set(
            "stalltrace_start_time_seconds",
            vec![],
            ts.timestamp_millis() as f64 / 1e3,
        );
    }
}

fn block(r: &mut Registry, v: &Value) {
    let Some(dev) = text(v, "dev") else { return };
    let mut labels = vec![("device", dev.to_string())];
    labels.push(("op", text(v, "op").unwrap_or("other").to_string()));
    if let Some(role) = text(v, "role") {
        labels.push(("role", role.to_string()));
    }
    for (field, name, _) in BLOCK_COUNTS {
        r.add(name, labels.clone(), v[field].as_f64().unwrap_or(0.0));
    }
    for (field, name, _) in BLOCK_TIMES {
        histogram(r, name, labels.clone(), &v[field], Unit::Seconds);
    }
    let occupancy = &v["inflight"];
    histogram(
        r,
        "stalltrace_block_queue_occupancy_requests",
        labels.clone(),
        occupancy,
        Unit::Requests,
    );
    // No issue in the interval: nothing was in flight at one.
    let max = occupancy["max"].as_f64().unwrap_or(0.0);
    r.set("stalltrace_block_requests_in_flight_max", labels, max);
    let disk = label("device", dev);
    if let Some(now) = v["inflight_now"].as_f64() {
        r.set("stalltrace_block_requests_in_flight", disk.clone(), now);
    }
    for limit in ["nr_requests", "hw_queue_depth", "device_queue_depth"] {
        if let Some(n) = v["queue_limit"][limit].as_f64() {
            let mut labels = disk.clone();
            labels.push(("limit", limit.to_string()));
            r.set("stalltrace_block_queue_limit_requests", labels, n);
        }
    }
}

/// Counts one `tcp_retransmit` record. For one that went out: Some(whether
/// it is a retransmission timeout); None for one that failed locally.
fn retransmit(r: &mut Registry, v: &Value) -> Option<bool> {
    let kind = text(v, "kind").unwrap_or("unknown");
    let segs = v["segs"].as_f64().unwrap_or(0.0);
    let sent = v["err"].as_i64() == Some(0);
    let name = if sent {
        "stalltrace_tcp_retransmitted_segments_total"
    } else {
        "stalltrace_tcp_retransmit_failed_segments_total"
    };
    r.add(name, label("kind", kind), segs);
    // As the kernel side counts a peer's `rtos`: a timer retransmission that
    // went out (one that failed locally is retried, and would count twice).
    let timeout = sent && kind == "rto" && v["timer"].as_bool() == Some(true);
    if timeout {
        r.add("stalltrace_tcp_retransmission_timeouts_total", vec![], 1.0);
    }
    sent.then_some(timeout)
}

fn netdev(r: &mut Registry, v: &Value) {
    let Some(iface) = text(v, "iface") else {
        return;
    };
    let labels = vec![
        ("interface", iface.to_string()),
        ("netns", v["netns"].to_string()),
    ];
    for (field, name, _) in NETDEV_COUNTS {
        r.add(name, labels.clone(), v[field].as_f64().unwrap_or(0.0));
    }
    for (field, name, _) in NETDEV_TIMES {
        histogram(r, name, labels.clone(), &v[field], Unit::Seconds);
    }
}

#[cfg(test)]
mod tests {
    /// The help texts say the sampling rates the kernel side uses (abi.h).
    #[test]
    fn netdev_help_names_the_kernel_sampling_rates() {
        let help = |key: &str| NETDEV_TIMES.iter().find(|t| t.0 == key).unwrap().2;
        let tx = format!("1 in {} sent packets", crate::abi::NETDEV_TX_SAMPLE);
        let rx = format!("1 in {} received packets", crate::abi::NETDEV_RX_SAMPLE);
        assert!(help("qdisc_us").contains(&tx), "{}", help("qdisc_us"));
        assert!(help("rx_us").contains(&rx), "{}", help("rx_us"));
    }

    use super::*;
    use serde_json::json;

    fn registry() -> (Registry, FromRecords) {
        let mut r = Registry::default();
        let f = FromRecords::new(&mut r, 0);
        (r, f)
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
        let record = json!({"ts": "2026-11-23T10:00:00Z", "dev": "sdb", "op": "read", "count": 10,
            "bytes": 40960, "bios": 10, "errors": 0, "requeues": 0, "latency_us": latency,
            "tag_wait_us": empty, "queue_us": empty, "device_us": empty,
            "inflight": hist(json!([[3.0, 3.0, 10]]), 10, 3.0), "inflight_now": 0,
            "queue_limit": {"nr_requests": 64, "device_queue_depth": 32}, "role": "log"});
        f.record(&mut r, "block", &record);
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
        let rtx = |kind: &str, segs: u32, err: i32, timer: bool| json!({"kind": kind, "segs": segs, "err": err, "timer": timer});
        f.record(&mut r, "tcp_retransmit", &rtx("rto", 1, 0, true));
        f.record(&mut r, "tcp_retransmit", &rtx("rto", 2, 0, false));
        f.record(&mut r, "tcp_retransmit", &rtx("fast", 3, -105, false));
        let stall = |id: u64, phase: &str, cause: &str| json!({"id": id, "phase": phase, "kind": "storage", "cause": cause});
        f.record(&mut r, "stall", &stall(1, "open", "slow_device"));
        f.record(&mut r, "stall", &stall(2, "open", "slow_device"));
        // Closed under another cause than it opened with.
        f.record(&mut r, "stall", &stall(1, "closed", "queue_full"));
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
}
