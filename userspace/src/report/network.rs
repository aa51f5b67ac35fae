//! The network over the whole run: interfaces (`netdev`: transmit queue wait,
//! driver and receive timing, link health), TCP peers (`tcp_rtt` and the
//! `tcp_retransmit` events of the same connections), and bulk flows
//! (`tcp_flow`) with what limited them over time.

use std::collections::BTreeMap;

use super::merge::{MergedHist, Sparse, Unit};
use super::series::{self, Point, add_sparse};
use super::typed::named_counts;
use crate::host::link::NOT_EXPOSED;
use crate::records::netdev::{self, Exposed, NetdevRecord};
use crate::records::sql::SqlTag;
use crate::records::tcp::{
    Connection, RetransmitKind, TcpFlowRecord, TcpRetransmitRecord, TcpRttRecord,
};

// ---- interfaces -----------------------------------------------------------

/// Link health over the run (the readings are `host::link::LinkHealth`):
/// the last state, and event counters summed.
#[derive(Clone, Debug, Default)]
pub struct LinkOverRun {
    pub oper_state: Option<String>,
    pub carrier: Option<bool>,
    /// Mb/s, or `not exposed`.
    pub speed: Option<String>,
    /// `full`, `half`, or `not exposed`.
    pub duplex: Option<String>,
    pub autoneg: Option<String>,
    /// Speeds and duplexes seen, when they changed during the run.
    pub changes: Vec<String>,
    pub carrier_changes: u64,
    /// IFLA_STATS64 counters summed over the run (only the non-zero ones).
    pub counters: BTreeMap<String, u64>,
    /// `None`: PAUSE statistics not exposed by the driver.
    pub pause: Option<Pause>,
    pub qdisc_kind: Option<String>,
    pub qdisc_drops: u64,
    pub qdisc_overlimits: u64,
    pub qdisc_requeues: u64,
    pub qdisc_backlog_max_bytes: u64,
}

#[derive(Clone, Debug, Default)]
pub struct Pause {
    pub rx_enabled: Option<bool>,
    pub tx_enabled: Option<bool>,
    pub rx_frames: Option<u64>,
    pub tx_frames: Option<u64>,
}

impl LinkOverRun {
    fn update(&mut self, link: &netdev::LinkHealth) {
        self.oper_state = Some(link.oper_state.clone());
        self.carrier = link.carrier.or(self.carrier);
        let speed = Some(exposed_text(&link.speed_mbps));
        let duplex = Some(exposed_text(&link.duplex));
        for (old, new, what) in [
            (&self.speed, &speed, "speed"),
            (&self.duplex, &duplex, "duplex"),
        ] {
            if let (Some(o), Some(n)) = (old, new)
                && o != n
            {
                self.changes.push(format!("{what} {o} -> {n}"));
            }
        }
        self.speed = speed.or(self.speed.take());
        self.duplex = duplex.or(self.duplex.take());
        self.autoneg = Some(exposed_text(&link.autoneg));
        self.carrier_changes += link.carrier_changes.unwrap_or(0);
        if let Some(c) = &link.counters {
            for (name, n) in named_counts(c) {
                if n > 0 {
                    *self.counters.entry(name).or_default() += n;
                }
            }
        }
        if let Exposed::Value(p) = &link.pause {
            let pause = self.pause.get_or_insert_with(Pause::default);
            pause.rx_enabled = p.rx_enabled.or(pause.rx_enabled);
            pause.tx_enabled = p.tx_enabled.or(pause.tx_enabled);
            let add = |acc: &mut Option<u64>, n: &Exposed<u64>| {
                if let Exposed::Value(n) = n {
                    *acc = Some(acc.unwrap_or(0) + n);
                }
            };
            add(&mut pause.rx_frames, &p.rx_pause_frames);
            add(&mut pause.tx_frames, &p.tx_pause_frames);
        }
        if let Some(q) = &link.qdisc {
            self.qdisc_kind = Some(q.kind.clone());
            self.qdisc_drops += q.drops;
            self.qdisc_overlimits += q.overlimits;
            self.qdisc_requeues += q.requeues;
            self.qdisc_backlog_max_bytes = self.qdisc_backlog_max_bytes.max(q.backlog_bytes);
        }
    }

    /// What is wrong with the link, in words; empty when nothing is.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.duplex.as_deref() == Some("half") {
            out.push("half duplex (duplex mismatch on a switched link?)".into());
        }
        if self.carrier == Some(false) {
            out.push("no carrier".into());
        }
        if self.carrier_changes > 0 {
            out.push(format!(
                "{} carrier changes (flapping link)",
                self.carrier_changes
            ));
        }
        for (name, what) in [
            ("collisions", "collisions"),
            ("rx_crc_errors", "CRC errors"),
            ("rx_frame_errors", "frame errors"),
            ("rx_missed_errors", "missed frames (no host buffers)"),
            ("rx_fifo_errors", "receive FIFO overruns"),
            ("tx_carrier_errors", "carrier errors"),
            ("rx_errors", "receive errors"),
            ("tx_errors", "transmit errors"),
        ] {
            if let Some(n) = self.counters.get(name) {
                out.push(format!("{n} {what}"));
            }
        }
        if let Some(n) = self
            .pause
            .as_ref()
            .and_then(|p| p.rx_frames)
            .filter(|n| *n > 0)
        {
            out.push(format!(
                "{n} PAUSE frames received (the peer throttled transmit)"
            ));
        }
        if self.qdisc_drops > 0 {
            out.push(format!("{} qdisc drops", self.qdisc_drops));
        }
        out.extend(self.changes.iter().cloned());
        out
    }
}

#[derive(Clone, Debug)]
pub struct NetPoint {
    pub ts_us: i64,
    pub interval_ms: u64,
    pub qdisc: Sparse,
    pub tx_bytes: u64,
}

impl Point for NetPoint {
    fn absorb(&mut self, next: Self) {
        self.ts_us = next.ts_us;
        self.interval_ms += next.interval_ms;
        add_sparse(&mut self.qdisc, &next.qdisc);
        self.tx_bytes += next.tx_bytes;
    }
}

#[derive(Clone, Debug)]
pub struct Interface {
    pub iface: String,
    pub netns: Option<u64>,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub qdisc: MergedHist,
    pub xmit: MergedHist,
    pub rx: MergedHist,
    pub qdisc_untimed: u64,
    pub tx_timeouts: u64,
    pub tx_stalls: u64,
    pub tx_busy: u64,
    pub link: Option<LinkOverRun>,
    pub series: Vec<NetPoint>,
}

// ---- TCP peers --------------------------------------------------------------

/// One connection, by its namespace, remote end and local port (a client
/// connection is one peer). Not by its local address: a `tcp_rtt` of schema
/// 1 or 2 has none (it reads as `0.0.0.0`), and would not meet the
/// `tcp_retransmit` records of its connection.
#[derive(Clone, Debug)]
pub struct TcpPeer {
    pub netns: Option<u64>,
    pub daddr: String,
    pub dport: Option<u64>,
    pub sport: Option<u64>,
    pub srtt: MergedHist,
    /// From `tcp_rtt`'s per-interval counters (complete even when events were lost).
    pub retransmits: u64,
    pub retrans_segs: u64,
    pub rtos: u64,
    /// From the `tcp_retransmit` events of the connection.
    pub events: u64,
    /// Retransmission timeouts and tail-loss probes the connection sat out.
    pub timeout_wait_ms: f64,
    /// The longest retransmission timeout waited out.
    pub max_rto_ms: f64,
    pub max_backoff: u64,
    pub sql: Option<SqlTag>,
    /// The process that owned the local socket, from its `tcp_retransmit`
    /// records (`tcp_rtt` does not name one): `(pid, comm)`, the last seen.
    pub owner: Option<(u32, String)>,
    /// The connections past the first `MAX_PEERS`, summed in one row.
    pub others: bool,
}

/// Connections the report keeps apart; the rest are summed in one row, so a
/// long recording of a host with churning clients stays bounded in memory.
pub const MAX_PEERS: usize = 20_000;

impl TcpPeer {
    /// `:1433 with 10.0.0.9:50000 (sqlservr 4242)`: the local end first, as
    /// `ss` lists it, then the peer, then who owned the socket when known.
    pub fn label(&self) -> String {
        if self.others {
            return format!("(connections past the first {MAX_PEERS})");
        }
        let port = |p: Option<u64>| p.map(|p| p.to_string()).unwrap_or_else(|| "?".into());
        let addr = if self.daddr.contains(':') {
            format!("[{}]", self.daddr)
        } else {
            self.daddr.clone()
        };
        let owner = match &self.owner {
            Some((pid, comm)) => format!(" ({comm} {pid})"),
            None => String::new(),
        };
        format!(
            ":{} with {addr}:{}{owner}",
            port(self.sport),
            port(self.dport)
        )
    }
}

/// What a connection waited for one retransmission.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Waited {
    /// The retransmission timer's timeout, ms.
    Timeout(f64),
    /// A tail-loss probe's wait (`probe_after_ms`).
    Probe(f64),
}

impl Waited {
    pub fn ms(self) -> f64 {
        match self {
            Waited::Timeout(ms) | Waited::Probe(ms) => ms,
        }
    }
}

/// All `tcp_retransmit` events of the run, by kind.
#[derive(Clone, Debug, Default)]
pub struct Retransmits {
    pub events: u64,
    pub segs: u64,
    pub by_kind: BTreeMap<String, u64>,
    /// Timer-fired retransmissions: each one a wait of `rto_ms`.
    pub timeouts: u64,
    pub rto_wait_ms: f64,
    /// The longest of those waits.
    pub max_rto_ms: f64,
    /// Attempts that did not go out (`err` not 0).
    pub not_sent: u64,
}

// ---- bulk flows -------------------------------------------------------------

#[derive(Clone, Debug)]
pub struct FlowPoint {
    pub ts_us: i64,
    pub interval_ms: u64,
    pub send_mbps: f64,
    pub limiter: String,
}

#[derive(Clone, Debug)]
pub struct BulkFlow {
    pub netns: Option<u64>,
    /// `saddr:sport -> daddr:dport`, as stall episodes name flows.
    pub flow: String,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    pub retrans_segs: u64,
    pub active_ms: u64,
    pub busy_ms: f64,
    pub rwnd_limited_ms: f64,
    pub sndbuf_limited_ms: f64,
    pub peak_send_mbps: f64,
    /// The kernel's delivery-rate sample at the end of the last interval: what
    /// the path delivered, whether or not the sender kept it busy.
    pub delivery_mbps: Option<f64>,
    pub srtt_us_max: f64,
    pub sql: Option<SqlTag>,
    pub series: Vec<FlowPoint>,
}

impl BulkFlow {
    pub fn mean_send_mbps(&self) -> f64 {
        if self.active_ms == 0 {
            0.0
        } else {
            self.bytes_acked as f64 * 8.0 / 1e6 / (self.active_ms as f64 / 1000.0)
        }
    }

    /// Time (interval ms) each limiter held the flow back, most first.
    pub fn limiter_time(&self) -> Vec<(String, u64)> {
        let mut by: BTreeMap<&str, u64> = BTreeMap::new();
        for p in &self.series {
            *by.entry(&p.limiter).or_default() += p.interval_ms;
        }
        let mut v: Vec<(String, u64)> = by.into_iter().map(|(k, ms)| (k.to_string(), ms)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v
    }

    /// Consecutive intervals with the same limiter: `(first start µs, last end µs, limiter)`.
    pub fn limiter_spans(&self) -> Vec<(i64, i64, String)> {
        let mut spans: Vec<(i64, i64, String)> = Vec::new();
        for p in &self.series {
            let start = p.ts_us - p.interval_ms as i64 * 1000;
            match spans.last_mut() {
                Some(last) if last.2 == p.limiter => last.1 = p.ts_us,
                _ => spans.push((start, p.ts_us, p.limiter.clone())),
            }
        }
        spans
    }
}

/// `addr:port`, with brackets for IPv6.
pub fn endpoint(addr: &str, port: Option<u64>) -> String {
    let port = port.map(|p| p.to_string()).unwrap_or_else(|| "?".into());
    if addr.contains(':') {
        format!("[{addr}]:{port}")
    } else {
        format!("{addr}:{port}")
    }
}

// ---- builder ----------------------------------------------------------------

/// `TcpPeer`'s: (netns, daddr, dport, sport).
type PeerKey = (Option<u64>, String, Option<u64>, Option<u64>);
type FlowKey = (Option<u64>, String);

fn peer_key(c: &Connection) -> PeerKey {
    (
        Some(u64::from(c.netns)),
        c.daddr.to_string(),
        Some(u64::from(c.dport)),
        Some(u64::from(c.sport)),
    )
}

#[derive(Default)]
pub struct Network {
    ifaces: BTreeMap<(Option<u64>, String), Interface>,
    peers: BTreeMap<PeerKey, TcpPeer>,
    flows: BTreeMap<FlowKey, BulkFlow>,
    retransmits: Retransmits,
}

impl Network {
    pub fn netdev(&mut self, r: &NetdevRecord, ts_us: i64) {
        let netns = Some(u64::from(r.netns));
        let i = self
            .ifaces
            .entry((netns, r.iface.clone()))
            .or_insert_with(|| Interface {
                iface: r.iface.clone(),
                netns,
                rx_packets: 0,
                rx_bytes: 0,
                tx_packets: 0,
                tx_bytes: 0,
                qdisc: MergedHist::new(Unit::Micros),
                xmit: MergedHist::new(Unit::Micros),
                rx: MergedHist::new(Unit::Micros),
                qdisc_untimed: 0,
                tx_timeouts: 0,
                tx_stalls: 0,
                tx_busy: 0,
                link: None,
                series: Vec::new(),
            });
        let tx_bytes = r.tx_bytes.unwrap_or(0);
        i.rx_packets += r.rx_packets.unwrap_or(0);
        i.rx_bytes += r.rx_bytes.unwrap_or(0);
        i.tx_packets += r.tx_packets.unwrap_or(0);
        i.tx_bytes += tx_bytes;
        i.qdisc_untimed += r.qdisc_untimed;
        i.tx_timeouts += r.tx_timeouts;
        i.tx_stalls += r.tx_stalls;
        i.tx_busy += r.tx_busy;
        let qdisc = i.qdisc.add_record(&r.qdisc_us);
        i.xmit.add_record(&r.xmit_us);
        i.rx.add_record(&r.rx_us);
        if let Some(link) = &r.link {
            i.link.get_or_insert_with(LinkOverRun::default).update(link);
        }
        series::push(
            &mut i.series,
            NetPoint {
                ts_us,
                interval_ms: r.interval_ms,
                qdisc,
                tx_bytes,
            },
        );
    }

    fn peer(&mut self, key: PeerKey) -> &mut TcpPeer {
        let others = self.peers.len() >= MAX_PEERS && !self.peers.contains_key(&key);
        let key = if others {
            (None, String::new(), None, None)
        } else {
            key
        };
        self.peers.entry(key.clone()).or_insert_with(|| TcpPeer {
            netns: key.0,
            daddr: key.1,
            dport: key.2,
            sport: key.3,
            srtt: MergedHist::new(Unit::Micros),
            retransmits: 0,
            retrans_segs: 0,
            rtos: 0,
            events: 0,
            timeout_wait_ms: 0.0,
            max_rto_ms: 0.0,
            max_backoff: 0,
            sql: None,
            owner: None,
            others,
        })
    }

    pub fn tcp_rtt(&mut self, r: &TcpRttRecord) {
        let p = self.peer(peer_key(&r.connection));
        p.srtt.add_record(&r.srtt_us);
        p.retransmits += r.retransmits;
        p.retrans_segs += r.retrans_segs;
        p.rtos += r.rtos;
        if let Some(tag) = &r.sql
            && !p.others
        {
            p.sql = Some(tag.clone());
        }
    }

    /// A `tcp_retransmit` event; returns what the connection waited for it
    /// (for the session's time lost): the RTO when the retransmission timer
    /// sent it, the probe's wait for a tail-loss probe.
    pub fn tcp_retransmit(&mut self, r: &TcpRetransmitRecord) -> Option<Waited> {
        let rt = &mut self.retransmits;
        rt.events += 1;
        rt.segs += u64::from(r.segs);
        *rt.by_kind.entry(r.kind.name().to_string()).or_default() += 1;
        if r.err != 0 {
            rt.not_sent += 1;
        }
        let rto_ms = r.rto_ms;
        // The timer expired whether or not the copy then went out: the wait happened.
        let waited = (r.timer && rto_ms > 0.0).then_some(rto_ms);
        if let Some(ms) = waited {
            rt.timeouts += 1;
            rt.rto_wait_ms += ms;
            rt.max_rto_ms = rt.max_rto_ms.max(ms);
        }
        let p = self.peer(peer_key(&r.connection));
        p.events += 1;
        let probe = r
            .probe_after_ms
            .filter(|_| r.kind == RetransmitKind::Tlp && r.err == 0);
        let waited = match (waited, probe) {
            (Some(ms), _) => Some(Waited::Timeout(ms)),
            (None, Some(ms)) => Some(Waited::Probe(ms)),
            (None, None) => None,
        };
        p.timeout_wait_ms += waited.map_or(0.0, Waited::ms);
        if let Some(Waited::Timeout(ms)) = waited {
            p.max_rto_ms = p.max_rto_ms.max(ms);
        }
        p.max_backoff = p.max_backoff.max(u64::from(r.backoff));
        if p.sql.is_none() && !p.others {
            p.sql.clone_from(&r.sql);
        }
        if !p.others
            && let (Some(pid), Some(comm)) = (r.pid, &r.comm)
        {
            p.owner = Some((pid, comm.clone()));
        }
        waited
    }

    pub fn tcp_flow(&mut self, r: &TcpFlowRecord, ts_us: i64) {
        let c = &r.connection;
        let flow = format!(
            "{} -> {}",
            endpoint(&c.saddr.to_string(), Some(u64::from(c.sport))),
            endpoint(&c.daddr.to_string(), Some(u64::from(c.dport)))
        );
        let netns = Some(u64::from(c.netns));
        let f = self
            .flows
            .entry((netns, flow.clone()))
            .or_insert_with(|| BulkFlow {
                netns,
                flow,
                bytes_acked: 0,
                bytes_received: 0,
                retrans_segs: 0,
                active_ms: 0,
                busy_ms: 0.0,
                rwnd_limited_ms: 0.0,
                sndbuf_limited_ms: 0.0,
                peak_send_mbps: 0.0,
                delivery_mbps: None,
                srtt_us_max: 0.0,
                sql: None,
                series: Vec::new(),
            });
        f.bytes_acked += r.bytes_acked;
        f.bytes_received += r.bytes_received;
        f.retrans_segs += r.retrans_segs;
        f.active_ms += r.interval_ms;
        f.busy_ms += r.busy_ms;
        f.rwnd_limited_ms += r.rwnd_limited_ms;
        f.sndbuf_limited_ms += r.sndbuf_limited_ms;
        f.peak_send_mbps = f.peak_send_mbps.max(r.send_mbps);
        f.delivery_mbps = Some(r.delivery_mbps);
        f.srtt_us_max = f.srtt_us_max.max(r.srtt_us);
        if let Some(tag) = &r.sql {
            f.sql = Some(tag.clone());
        }
        f.series.push(FlowPoint {
            ts_us,
            interval_ms: r.interval_ms,
            send_mbps: r.send_mbps,
            limiter: r.limiter.name().to_string(),
        });
    }

    /// Interfaces by name; peers worst first (RTOs, retransmits, then the RTT
    /// tail); flows by bytes moved.
    pub fn finish(self) -> (Vec<Interface>, Vec<TcpPeer>, Vec<BulkFlow>, Retransmits) {
        let mut ifaces: Vec<Interface> = self.ifaces.into_values().collect();
        ifaces.sort_by(|a, b| a.iface.cmp(&b.iface).then(a.netns.cmp(&b.netns)));
        let mut peers: Vec<TcpPeer> = self.peers.into_values().collect();
        peers.sort_by(|a, b| {
            b.timeout_wait_ms
                .total_cmp(&a.timeout_wait_ms)
                .then(b.rtos.cmp(&a.rtos))
                .then(
                    b.retransmits
                        .max(b.events)
                        .cmp(&a.retransmits.max(a.events)),
                )
                .then(
                    b.srtt
                        .percentile(0.99)
                        .unwrap_or(0.0)
                        .total_cmp(&a.srtt.percentile(0.99).unwrap_or(0.0)),
                )
        });
        let mut flows: Vec<BulkFlow> = self.flows.into_values().collect();
        flows.sort_by(|a, b| {
            (b.bytes_acked + b.bytes_received).cmp(&(a.bytes_acked + a.bytes_received))
        });
        (ifaces, peers, flows, self.retransmits)
    }
}

/// An `Exposed` value as the report words it: the value, or `not exposed`.
fn exposed_text<T: ToString>(e: &Exposed<T>) -> String {
    match e {
        Exposed::Value(v) => v.to_string(),
        Exposed::NotExposed => NOT_EXPOSED.to_string(),
    }
}
