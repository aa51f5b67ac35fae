//! What each stream record adds to the metrics. The metrics are read off the
//! records as they are emitted, so a scrape and the JSON stream can never
//! disagree: the same requests, segments and episodes, summed.
//!
//! An emitted record comes typed, as the writer was given it (output/json.rs
//! hands it over with its envelope's `ts`): every record made is counted in
//! `stalltrace_records_total`, and those of the types [`wanted`] names add
//! their figures.
//!
//! Labels are bounded by design: devices, ops, disk roles, interfaces (with
//! their namespace), retransmission kinds, stall kinds and causes, lost
//! sources, record types, programs. Never a port, session or pid; peers and
//! containers only when asked for, capped (peers.rs, containers.rs).

use std::collections::{BTreeSet, HashMap};

use super::containers::Containers;
use super::peers::Peers;
use super::registry::{Edges, Kind, Labels, Registry};
use crate::abi;
use crate::hist::{HistogramRecord, bucket_range};
use crate::records::block::BlockRecord;
use crate::records::block::SlowIoRecord;
use crate::records::netdev::NetdevRecord;
use crate::records::run::LostRecord;
use crate::records::run::StartRecord;
use crate::records::sql_requests::SqlRequestsRecord;
use crate::records::stall::{self, Cause, Phase, StallRecord};
use crate::records::tcp::{RetransmitKind, TcpRetransmitRecord, TcpRttRecord};
use crate::records::{AnyRecord, OUTPUT_LOST, Record, SCHEMA_VERSION};

/// The record types that feed the metrics: those [`FromRecords::record`]
/// adds figures from (the others are only counted).
pub fn wanted(kind: &str) -> bool {
    matches!(
        kind,
        StartRecord::TYPE
            | BlockRecord::TYPE
            | SlowIoRecord::TYPE
            | TcpRetransmitRecord::TYPE
            | TcpRttRecord::TYPE
            | NetdevRecord::TYPE
            | SqlRequestsRecord::TYPE
            | StallRecord::TYPE
            | LostRecord::TYPE
    )
}

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

/// A histogram family read off one field of a record `R`: the field, the
/// family's name and its help.
type Times<R> = (fn(&R) -> &HistogramRecord, &'static str, &'static str);

/// A counter family read off one field of a record `R`.
type Counts<R> = (fn(&R) -> u64, &'static str, &'static str);

/// The names and help texts of `families`.
fn declared<'a, F: Copy>(
    families: &'a [(F, &'static str, &'static str)],
) -> impl Iterator<Item = (&'static str, &'static str)> + 'a {
    families.iter().map(|&(_, name, help)| (name, help))
}

const BLOCK_TIMES: [Times<BlockRecord>; 4] = [
    (
        |b| &b.latency_us,
        "stalltrace_block_latency_seconds",
        "Bio submitted to completed, by disk and op.",
    ),
    (
        |b| &b.tag_wait_us,
        "stalltrace_block_tag_wait_seconds",
        "Bio submitted to request allocated: waiting for a tag (the queue depth) or a request.",
    ),
    (
        |b| &b.queue_us,
        "stalltrace_block_queue_seconds",
        "Request allocated to issued to the driver: plugging, scheduler, dispatch.",
    ),
    (
        |b| &b.device_us,
        "stalltrace_block_device_seconds",
        "Request issued to completed: what the device (or the layer under it) took.",
    ),
];

const BLOCK_COUNTS: [Counts<BlockRecord>; 5] = [
    (
        |b| b.count,
        "stalltrace_block_requests_total",
        "Requests completed (what /proc/diskstats counts).",
    ),
    (
        |b| b.bytes,
        "stalltrace_block_bytes_total",
        "Bytes completed.",
    ),
    (
        |b| b.bios,
        "stalltrace_block_bios_total",
        "Bios completed (more than requests where the block layer merges).",
    ),
    (
        |b| b.errors,
        "stalltrace_block_errors_total",
        "Requests completed with an error, and bios that failed before reaching a request.",
    ),
    (
        |b| b.requeues,
        "stalltrace_block_requeues_total",
        "Requests the driver handed back (queue full, resource shortage).",
    ),
];

const NETDEV_TIMES: [Times<NetdevRecord>; 3] = [
    (
        |n| &n.qdisc_us,
        "stalltrace_netdev_qdisc_seconds",
        "Packet enqueued on the qdisc to handed to the driver (1 in 64 sent packets per CPU: counts are samples).",
    ),
    (
        |n| &n.xmit_us,
        "stalltrace_netdev_xmit_seconds",
        "The driver's transmit call (the packets qdisc_seconds samples).",
    ),
    (
        |n| &n.rx_us,
        "stalltrace_netdev_rx_seconds",
        "Received packet handed up the stack (1 in 16 received packets per CPU: counts are samples).",
    ),
];

const NETDEV_COUNTS: [Counts<NetdevRecord>; 3] = [
    (
        |n| n.tx_timeouts,
        "stalltrace_netdev_tx_timeouts_total",
        "Transmit queue timeouts (the watchdog fired).",
    ),
    (
        |n| n.tx_stalls,
        "stalltrace_netdev_tx_stalls_total",
        "Transmit queues the driver stopped (full rings).",
    ),
    (
        |n| n.tx_busy,
        "stalltrace_netdev_tx_busy_total",
        "Packets the driver refused as busy.",
    ),
];

/// Reads records into the registry.
#[derive(Debug)]
pub struct FromRecords {
    /// Open stall episodes by id: the open-episodes gauge is their count.
    open: HashMap<u64, (stall::Kind, Cause)>,
    /// Every (kind, cause) an episode had: bounded by the detector's enums.
    seen: BTreeSet<(stall::Kind, Cause)>,
    /// `--prometheus-peers`: per-peer retransmissions, capped.
    peers: Option<Peers>,
    /// `--prometheus-containers`: per-container slow I/Os and retransmissions, capped.
    containers: Option<Containers>,
}

impl FromRecords {
    /// `peers`, `containers`: how many TCP peers and containers get series
    /// of their own (0: none).
    pub fn new(r: &mut Registry, peers: u32, containers: u32) -> Self {
        use Kind::*;
        let seconds = seconds();
        for (name, help) in declared(&BLOCK_TIMES).chain(declared(&NETDEV_TIMES)) {
            r.declare_histogram(name, help, &seconds);
        }
        for (name, help) in declared(&BLOCK_COUNTS).chain(declared(&NETDEV_COUNTS)) {
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
        r.declare_histogram(
            "stalltrace_sql_request_duration_seconds",
            "SQL Server requests by instance (worker_pid: its worker process) and part: total (what the client waited for), server (arrival to the response handed to TCP), delivery (to the response's delivery).",
            &seconds,
        );
        r.declare(
            "stalltrace_sql_requests_slow_total",
            Counter,
            "SQL Server requests of 200 ms or more, by instance, and whether their response met a retransmission.",
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
            let kind = label("kind", RetransmitKind::from_kernel(kind as u8).name());
            r.set(
                "stalltrace_tcp_retransmitted_segments_total",
                kind.clone(),
                0.0,
            );
            r.set("stalltrace_tcp_retransmit_failed_segments_total", kind, 0.0);
        }
        // A disk's or an interface's series go with it.
        for (name, _) in declared(&BLOCK_TIMES)
            .chain(declared(&BLOCK_COUNTS))
            .chain(declared(&NETDEV_TIMES))
            .chain(declared(&NETDEV_COUNTS))
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
            containers: Containers::new(r, containers),
        }
    }

    /// A record of type `kind` was made: counted, nothing more.
    pub fn made(r: &mut Registry, kind: &str) {
        r.add("stalltrace_records_total", label("type", kind), 1.0);
    }

    /// One emitted record, made at `ts` (its envelope's).
    pub fn record(&mut self, r: &mut Registry, ts: &str, record: &AnyRecord) {
        Self::made(r, record.kind());
        match record {
            AnyRecord::Start(s) => start(r, ts, s),
            AnyRecord::Block(b) => block(r, b),
            AnyRecord::SlowIo(s) => {
                if let Some(containers) = &mut self.containers {
                    containers.slow_io(r, s);
                }
            }
            AnyRecord::TcpRetransmit(t) => {
                let sent_timeout = retransmit(r, t);
                if let (Some(peers), Some(timeout)) = (&mut self.peers, sent_timeout) {
                    peers.retransmitted(r, t, timeout);
                }
                if let (Some(containers), Some(_)) = (&mut self.containers, sent_timeout) {
                    containers.retransmitted(r, t);
                }
            }
            AnyRecord::TcpRtt(t) => histogram(
                r,
                "stalltrace_tcp_srtt_seconds",
                vec![],
                &t.srtt_us,
                Unit::Seconds,
            ),
            AnyRecord::Netdev(n) => netdev(r, n),
            AnyRecord::SqlRequests(q) => sql_requests(r, q),
            AnyRecord::Stall(s) => self.stall(r, s),
            AnyRecord::Lost(l) => {
                // Drops of the output queue are counted as they happen
                // (`Metrics::dropped`): a `lost` record saying so can itself
                // be dropped and said again.
                let sources = l.by_source.iter().filter(|(s, _)| *s != OUTPUT_LOST);
                for (source, &n) in sources {
                    r.add("stalltrace_lost_total", label("source", source), n as f64);
                }
            }
            // Counted by type above, and no series of their own: `tcp_flow`,
            // SQL Server's discovery, `heartbeat`, `stop`, and a family's
            // records no series here names.
            _ => {}
        }
    }

    fn stall(&mut self, r: &mut Registry, s: &StallRecord) {
        let labels = |kind: stall::Kind, cause: Cause| {
            vec![("kind", kind.name().to_string()), ("cause", cause.name())]
        };
        match s.phase {
            Phase::Open => {
                r.add(
                    "stalltrace_stall_episodes_total",
                    labels(s.kind, s.cause),
                    1.0,
                );
                self.open.insert(s.id, (s.kind, s.cause));
            }
            Phase::Closed => {
                self.open.remove(&s.id);
            }
        }
        // Every kind and cause seen keeps its gauge, at 0 once all are closed
        // (an episode's cause can change between its open and closed records).
        self.seen.insert((s.kind, s.cause));
        for &(k, c) in &self.seen {
            let n = self.open.values().filter(|&&open| open == (k, c)).count();
            r.set("stalltrace_stall_episodes_open", labels(k, c), n as f64);
        }
    }
}

fn label(name: &'static str, value: &str) -> Labels {
    vec![(name, value.to_string())]
}

/// Adds one histogram of a record.
fn histogram(r: &mut Registry, name: &str, labels: Labels, h: &HistogramRecord, unit: Unit) {
    // The kernel bucket's upper edge (exact, unlike the rounded figures in
    // the record), and the octave that holds it.
    let buckets = h.buckets.iter().map(|&(index, count)| {
        let (_, high) = bucket_range(index);
        (unit.edge(u64::BITS - high.leading_zeros()), count)
    });
    let sum = h.mean() * h.count as f64 * unit.recorded_per_field() / unit.recorded_per_exported();
    r.observe(name, labels, buckets.collect::<Vec<_>>(), sum);
}

fn start(r: &mut Registry, ts: &str, s: &StartRecord) {
    // The start that opens a further file repeats the run's: the run began once.
    if s.file.is_some() {
        return;
    }
    let info = vec![
        ("version", s.version.clone()),
        ("schema", SCHEMA_VERSION.to_string()),
        ("kernel", s.kernel.clone()),
    ];
    r.set("stalltrace_build_info", info, 1.0);
    if let Ok(ts) = chrono::DateTime::parse_from_rfc3339(ts) {
        r.set(
            "stalltrace_start_time_seconds",
            vec![],
            ts.timestamp_millis() as f64 / 1e3,
        );
    }
}

fn block(r: &mut Registry, b: &BlockRecord) {
    let mut labels = vec![("device", b.dev.clone()), ("op", b.op.name().to_string())];
    if let Some(role) = &b.role {
        labels.push(("role", role.clone()));
    }
    for (field, name, _) in BLOCK_COUNTS {
        r.add(name, labels.clone(), field(b) as f64);
    }
    for (field, name, _) in BLOCK_TIMES {
        histogram(r, name, labels.clone(), field(b), Unit::Seconds);
    }
    histogram(
        r,
        "stalltrace_block_queue_occupancy_requests",
        labels.clone(),
        &b.inflight,
        Unit::Requests,
    );
    // No issue in the interval: nothing was in flight at one.
    let max = b.inflight.max.unwrap_or(0.0);
    r.set("stalltrace_block_requests_in_flight_max", labels, max);
    let disk = label("device", &b.dev);
    r.set(
        "stalltrace_block_requests_in_flight",
        disk.clone(),
        b.inflight_now as f64,
    );
    let q = &b.queue_limit;
    for (limit, n) in [
        ("nr_requests", q.nr_requests),
        ("hw_queue_depth", q.hw_queue_depth),
        ("device_queue_depth", q.device_queue_depth),
    ] {
        if let Some(n) = n {
            let mut labels = disk.clone();
            labels.push(("limit", limit.to_string()));
            r.set("stalltrace_block_queue_limit_requests", labels, n as f64);
        }
    }
}

/// Counts one `tcp_retransmit` record. For one that went out: Some(whether
/// it is a retransmission timeout); None for one that failed locally.
fn retransmit(r: &mut Registry, t: &TcpRetransmitRecord) -> Option<bool> {
    let sent = t.err == 0;
    let name = if sent {
        "stalltrace_tcp_retransmitted_segments_total"
    } else {
        "stalltrace_tcp_retransmit_failed_segments_total"
    };
    r.add(name, label("kind", t.kind.name()), f64::from(t.segs));
    // As the kernel side counts a peer's `rtos`: a timer retransmission that
    // went out (one that failed locally is retried, and would count twice).
    let timeout = sent && t.kind == RetransmitKind::Rto && t.timer;
    if timeout {
        r.add("stalltrace_tcp_retransmission_timeouts_total", vec![], 1.0);
    }
    sent.then_some(timeout)
}

fn netdev(r: &mut Registry, n: &NetdevRecord) {
    let labels = vec![
        ("interface", n.iface.clone()),
        ("netns", n.netns.to_string()),
    ];
    for (field, name, _) in NETDEV_COUNTS {
        r.add(name, labels.clone(), field(n) as f64);
    }
    for (field, name, _) in NETDEV_TIMES {
        histogram(r, name, labels.clone(), field(n), Unit::Seconds);
    }
}

#[cfg(test)]
#[path = "records_tests.rs"]
mod tests;

/// Per instance, never per session: a session's series would be unbounded.
fn sql_requests(r: &mut Registry, q: &SqlRequestsRecord) {
    let instance = label("worker_pid", &q.pid.to_string());
    for (part, h) in [
        ("total", &q.total_us),
        ("server", &q.server_us),
        ("delivery", &q.delivery_us),
    ] {
        let mut labels = instance.clone();
        labels.push(("part", part.to_string()));
        histogram(
            r,
            "stalltrace_sql_request_duration_seconds",
            labels,
            h,
            Unit::Seconds,
        );
    }
    for (retransmitted, n) in [
        ("true", q.counts.slow_retransmitted),
        ("false", q.counts.slow - q.counts.slow_retransmitted),
    ] {
        let mut labels = instance.clone();
        labels.push(("retransmitted", retransmitted.to_string()));
        r.add("stalltrace_sql_requests_slow_total", labels, n as f64);
    }
}
