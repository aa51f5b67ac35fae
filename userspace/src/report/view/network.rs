//! Network interfaces and their links, TCP peers, bulk flows.

use super::{Stats, clean, count, ms_or_dash, or_dash};
use crate::records::sql::SessionKind;
use crate::report::model::Report;
use crate::report::network::{BulkFlow, Interface, LinkOverRun, TcpPeer};
use crate::report::sessions::SessionTag;
use crate::report::time::{bytes, clock, duration_ms, latency_us, sig3, thousands};

/// Said of a link with nothing wrong.
pub const LINK_OK: &str = "link problems: none seen";

/// What holds a bulk flow back, as the stream names it and in words.
pub const LIMITERS: [(&str, &str); 5] = [
    ("network", "network (congestion window)"),
    (
        "host",
        "this host (loopback: no network, the CPU sets the pace)",
    ),
    ("receiver", "receiver window"),
    ("sender_buffer", "send buffer"),
    ("application", "application (nothing to send)"),
];

pub fn limiter_words(l: &str) -> String {
    LIMITERS
        .iter()
        .find(|(key, _)| *key == l)
        .map(|(_, words)| words.to_string())
        .unwrap_or_else(|| clean(l))
}

#[derive(Clone, Debug)]
pub struct IfaceView<'a> {
    /// `eth0`, with its netns when it has one: `eth0 (netns 4026531840)`.
    pub title: String,
    pub iface: String,
    pub netns: Option<String>,
    /// `sent 1.2 MiB in 900 packets, received …`
    pub traffic: String,
    pub link: Option<LinkView>,
    /// `transmit timeouts 1, BQL stalls 0, driver busy 0` when any is not zero.
    pub driver_trouble: Option<String>,
    /// `transmit queue (qdisc) wait: p50 …, max … (1,024 sampled packets)`,
    /// when timed: the kernel side times a sample of the packets (netdev.bpf.c).
    pub qdisc_line: Option<String>,
    /// Driver transmit and receive path timing, when there is any.
    pub timing: Vec<String>,
    pub qdisc: Stats,
    pub xmit: Stats,
    pub rx: Stats,
    /// The histograms and series, for charts.
    pub data: &'a Interface,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LinkView {
    /// `up, 10000 Mb/s, full duplex, autoneg off, PAUSE not exposed, qdisc …`
    pub state: String,
    /// What is wrong with the link; empty: nothing seen.
    pub problems: Vec<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PeerRow {
    /// `:1433 with 10.0.0.9:50000 (sqlservr 4242)`
    pub label: String,
    pub session: String,
    pub srtt_p50: String,
    pub srtt_p99: String,
    pub srtt_max: String,
    pub retransmits: String,
    pub rtos: String,
    pub timeout_wait: String,
    pub max_rto: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct PeersView {
    /// Worst first, every peer.
    pub rows: Vec<PeerRow>,
    /// Every retransmission of the run in one sentence; `None`: there was none.
    pub retransmissions: Option<String>,
}

#[derive(Clone, Debug)]
pub struct FlowView<'a> {
    /// `10.0.0.1:5000 -> 10.0.0.2:5201`
    pub flow: String,
    /// `SQL Server client`
    pub sql: Option<String>,
    /// Bytes, rates, retransmissions and round trip in one sentence.
    pub summary: String,
    /// `network (congestion window) 80%`, most first; empty without intervals.
    pub shares: Vec<String>,
    /// The limiter over time.
    pub spans: Vec<SpanView>,
    /// The series, for charts.
    pub data: &'a BulkFlow,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SpanView {
    pub start_us: i64,
    pub end_us: i64,
    /// The limiter as the stream names it (a key for styles).
    pub limiter: String,
    /// `10:00:01.000–10:00:03.000 network (congestion window)`
    pub words: String,
}

/// Over what part of its life a flow was measured. Its figures come from
/// the kernel's counters read once an interval (sock_diag): the interval in
/// which it was first seen only sets their baseline, and what it sent after
/// the last reading before it closed is not read, so a 5 s transfer can be
/// measured over 3 s. The page draws it over the same part.
fn measured_over(f: &BulkFlow) -> String {
    match (f.series.first(), f.series.last()) {
        (Some(first), Some(last)) => format!(
            "measured {}–{} ({} interval{} as bulk; not its first interval, a baseline, nor its \
             end after the last reading)",
            clock(first.ts_us - first.interval_ms as i64 * 1000),
            clock(last.ts_us),
            f.series.len(),
            if f.series.len() == 1 { "" } else { "s" }
        ),
        _ => "not measured in any interval".to_string(),
    }
}

pub fn interfaces(report: &Report) -> Vec<IfaceView<'_>> {
    report.interfaces.iter().map(interface).collect()
}

fn interface(i: &Interface) -> IfaceView<'_> {
    let iface = clean(&i.iface);
    let netns = i.netns.map(|n| format!("netns {n}"));
    let mut timing = Vec::new();
    let p = |h: &crate::report::MergedHist, q| or_dash(h.percentile(q), latency_us);
    if i.xmit.count() > 0 {
        timing.push(format!(
            "driver transmit p50 {} p99 {}",
            p(&i.xmit, 0.5),
            p(&i.xmit, 0.99)
        ));
    }
    if i.rx.count() > 0 {
        timing.push(format!(
            "receive path (1 in {} packets) p50 {} p99 {}",
            crate::abi::NETDEV_RX_SAMPLE,
            p(&i.rx, 0.5),
            p(&i.rx, 0.99)
        ));
    }
    let qdisc = Stats::latency(&i.qdisc);
    IfaceView {
        title: match &netns {
            Some(n) => format!("{iface} ({n})"),
            None => iface.clone(),
        },
        traffic: format!(
            "sent {} in {}, received {} in {}",
            bytes(i.tx_bytes),
            count(i.tx_packets, "packet", "packets"),
            bytes(i.rx_bytes),
            count(i.rx_packets, "packet", "packets")
        ),
        link: i.link.as_ref().map(link),
        driver_trouble: (i.tx_timeouts + i.tx_stalls + i.tx_busy > 0).then(|| {
            format!(
                "transmit timeouts {}, BQL stalls {}, driver busy {}",
                i.tx_timeouts, i.tx_stalls, i.tx_busy
            )
        }),
        qdisc_line: (i.qdisc.count() > 0).then(|| {
            format!(
                "transmit queue (qdisc) wait: {} ({}{})",
                qdisc.percentiles(),
                count(i.qdisc.count(), "sampled packet", "sampled packets"),
                if i.qdisc_untimed > 0 {
                    format!("; {} not timed", thousands(i.qdisc_untimed))
                } else {
                    String::new()
                }
            )
        }),
        timing,
        qdisc,
        xmit: Stats::latency(&i.xmit),
        rx: Stats::latency(&i.rx),
        iface,
        netns,
        data: i,
    }
}

fn link(l: &LinkOverRun) -> LinkView {
    let mut parts = vec![format!(
        "{}{}",
        l.oper_state
            .as_deref()
            .map(clean)
            .unwrap_or_else(|| "?".into()),
        match l.carrier {
            Some(false) => ", no carrier",
            _ => "",
        }
    )];
    if let Some(s) = &l.speed {
        parts.push(if s == "not exposed" {
            "speed not exposed".into()
        } else {
            format!("{} Mb/s", clean(s))
        });
    }
    if let Some(d) = &l.duplex {
        parts.push(if d == "not exposed" {
            "duplex not exposed".into()
        } else {
            format!("{} duplex", clean(d))
        });
    }
    match l.autoneg.as_deref() {
        Some("true") => parts.push("autoneg on".into()),
        Some("false") => parts.push("autoneg off".into()),
        Some(other) => parts.push(format!("autoneg {}", clean(other))),
        None => {}
    }
    parts.push(match &l.pause {
        None => "PAUSE not exposed".into(),
        Some(p) => format!(
            "PAUSE frames rx {} tx {}",
            p.rx_frames.map(thousands).unwrap_or_else(|| "?".into()),
            p.tx_frames.map(thousands).unwrap_or_else(|| "?".into())
        ),
    });
    if let Some(k) = &l.qdisc_kind {
        parts.push(format!(
            "qdisc {}: drops {}, backlog up to {}",
            clean(k),
            thousands(l.qdisc_drops),
            bytes(l.qdisc_backlog_max_bytes)
        ));
    }
    LinkView {
        state: parts.join(", "),
        problems: l.problems().iter().map(|p| clean(p)).collect(),
    }
}

pub fn peers(report: &Report) -> PeersView {
    let rt = &report.retransmits;
    let retransmissions = (rt.events > 0).then(|| {
        let kinds: Vec<String> = rt
            .by_kind
            .iter()
            .map(|(k, n)| format!("{} {}", clean(k), thousands(*n)))
            .collect();
        format!(
            "retransmissions: {} ({}), {}; {} waited {} in all, the longest {}; {} not sent (the attempt failed locally)",
            thousands(rt.events),
            kinds.join(", "),
            count(rt.segs, "segment", "segments"),
            count(
                rt.timeouts,
                "retransmission timeout",
                "retransmission timeouts"
            ),
            duration_ms(rt.rto_wait_ms),
            duration_ms(rt.max_rto_ms),
            thousands(rt.not_sent)
        )
    });
    PeersView {
        rows: report.peers.iter().map(peer_row).collect(),
        retransmissions,
    }
}

fn peer_row(p: &TcpPeer) -> PeerRow {
    let lat = |v| or_dash(v, latency_us);
    PeerRow {
        label: clean(&p.label()),
        session: p
            .sql
            .as_ref()
            .map(SessionTag::spid_label)
            .unwrap_or_default(),
        srtt_p50: lat(p.srtt.percentile(0.5)),
        srtt_p99: lat(p.srtt.percentile(0.99)),
        srtt_max: lat(p.srtt.max()),
        retransmits: thousands(p.retransmits.max(p.events)),
        rtos: thousands(p.rtos),
        timeout_wait: ms_or_dash(p.timeout_wait_ms),
        max_rto: ms_or_dash(p.max_rto_ms),
    }
}

pub fn flows(report: &Report) -> Vec<FlowView<'_>> {
    report.flows.iter().map(flow).collect()
}

fn flow(f: &BulkFlow) -> FlowView<'_> {
    let total: u64 = f.limiter_time().iter().map(|(_, ms)| ms).sum();
    let shares = if total == 0 {
        Vec::new()
    } else {
        f.limiter_time()
            .iter()
            .map(|(l, ms)| {
                format!(
                    "{} {:.0}%",
                    limiter_words(l),
                    *ms as f64 * 100.0 / total as f64
                )
            })
            .collect()
    };
    FlowView {
        flow: clean(&f.flow),
        sql: f.sql.as_ref().map(|t| {
            let kind = t.kind.map_or("sql", SessionKind::name);
            format!("SQL Server {}", clean(kind).replace('_', " "))
        }),
        summary: format!(
            "sent {}, received {}; {} Mbit/s mean, {} peak{}; {} retransmitted; srtt up to {}; {}",
            bytes(f.bytes_acked),
            bytes(f.bytes_received),
            sig3(f.mean_send_mbps()),
            sig3(f.peak_send_mbps),
            f.delivery_mbps
                .map(|d| format!(", path delivery rate {} Mbit/s at the end", sig3(d)))
                .unwrap_or_default(),
            count(f.retrans_segs, "segment", "segments"),
            latency_us(f.srtt_us_max),
            measured_over(f)
        ),
        shares,
        spans: f
            .limiter_spans()
            .into_iter()
            .map(|(start_us, end_us, l)| SpanView {
                start_us,
                end_us,
                words: format!(
                    "{}–{} {}",
                    clock(start_us),
                    clock(end_us),
                    limiter_words(&l)
                ),
                limiter: clean(&l),
            })
            .collect(),
        data: f,
    }
}
