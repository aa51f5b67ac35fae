//! Network rules: retransmission timeouts and loss per peer (with the link
//! evidence of the duplex-mismatch signature), and transmit-side throttling
//! per interface (qdisc wait, PAUSE frames, transmit timeouts).

use std::collections::BTreeMap;

use super::Thresholds;
use super::interval::{Finding, Interval, Tally, held_back_ms};
use crate::records::netdev::{LinkHealth, NetdevRecord};
use crate::records::sql::SqlTag;
use crate::records::stall::{Cause, Evidence, Kind, Subject};
use crate::records::tcp::{RetransmitKind, TcpRetransmitRecord};

/// Retransmissions to one peer in one interval.
#[derive(Default)]
struct PeerLoss<'a> {
    timer_rtos: u64,
    rto_ms_max: f64,
    backoff_max: u64,
    /// Sum of the timer RTOs' `rto_ms`.
    rto_wait_ms: f64,
    stalled_ms_max: f64,
    /// Tail-loss probes sent after the stall threshold without an
    /// acknowledgement, and the longest such wait.
    late_probes: u64,
    probe_after_ms_max: f64,
    /// Sum of the late probes' `probe_after_ms`.
    probe_wait_ms: f64,
    segs: u64,
    fast: u64,
    tlp: u64,
    /// Time lost: each timer RTO waited its `rto_ms`, each tail-loss probe
    /// its `probe_after_ms`; any other retransmission costs about a round trip.
    waited_ms: f64,
    sessions: Vec<&'a SqlTag>,
}

pub fn peers(iv: &Interval, th: &Thresholds) -> Vec<Finding> {
    // By the address's text: the order the episodes have always been found in.
    let mut by_peer: BTreeMap<(u32, String), PeerLoss> = BTreeMap::new();
    for r in iv.retransmits.iter().filter(|r| r.err == 0) {
        let c = &r.connection;
        let p = by_peer.entry((c.netns, c.daddr.to_string())).or_default();
        add(p, r, th);
    }
    let mut out = Vec::new();
    for ((netns, peer), p) in by_peer {
        let segs_per_s = p.segs as f64 * 1000.0 / iv.len_ms.max(1.0);
        // A probe's wait is a timeout too: a lost single-segment response is
        // sent again by a tail-loss probe 200 ms later, with no RTO counted.
        let timeouts = p.timer_rtos > 0 || p.stalled_ms_max >= th.net_ms || p.late_probes > 0;
        if !timeouts && segs_per_s < th.retrans_per_s {
            continue;
        }
        let mut evidence = Vec::new();
        if p.timer_rtos > 0 {
            evidence.push(
                Evidence::new(
                    "rto_ms_max",
                    p.rto_ms_max,
                    format!(
                        "{} retransmission timeout(s) to {peer}, the longest {:.0} ms (backoff {})",
                        p.timer_rtos, p.rto_ms_max, p.backoff_max
                    ),
                )
                .unit("ms"),
            );
        }
        if p.stalled_ms_max >= th.net_ms {
            evidence.push(
                Evidence::new(
                    "stalled_ms_max",
                    p.stalled_ms_max,
                    format!(
                        "a connection to {peer} made no progress for {:.0} ms",
                        p.stalled_ms_max
                    ),
                )
                .unit("ms")
                .threshold(th.net_ms),
            );
        }
        if p.late_probes > 0 {
            evidence.push(
                Evidence::new(
                    "probe_after_ms_max",
                    p.probe_after_ms_max,
                    format!(
                        "{} tail-loss probe(s) to {peer} after {:.0} ms or more without an \
                         acknowledgement, the longest {:.0} ms: a lost last segment (a response) \
                         waits this long",
                        p.late_probes, th.net_ms, p.probe_after_ms_max
                    ),
                )
                .unit("ms")
                .threshold(th.net_ms),
            );
        }
        evidence.push(
            Evidence::new(
                "retransmitted_segs_per_s",
                round1(segs_per_s),
                format!(
                    "{} segments retransmitted ({:.0}/s: {} fast, {} tail-loss probes)",
                    p.segs, segs_per_s, p.fast, p.tlp
                ),
            )
            .unit("count/s")
            .threshold(th.retrans_per_s),
        );
        let mut cause = if timeouts {
            Cause::RetransmissionTimeouts
        } else {
            Cause::PacketLoss
        };
        let link = link_evidence(iv, netns);
        let mut next_step = format!(
            "packets to {peer} are lost on the path: look for errors and drops on each hop \
             (`ip -s link`, `ethtool -S` on this host, the switch ports, the peer's receive drops)"
        );
        if let Some((iface, link_ev, mismatch)) = link {
            evidence.extend(link_ev);
            if mismatch {
                cause = Cause::DuplexMismatch;
                next_step = format!(
                    "{iface} shows the duplex-mismatch signature: set both ends of its link to the \
                     same speed and duplex (autonegotiation on both, or fixed on both), then check \
                     that collisions and CRC errors stop"
                );
            }
        }
        let subject = Subject {
            peer: Some(peer.clone()),
            netns: Some(netns.into()),
            ..Default::default()
        };
        // the waits of all its connections, bounded by the interval: the
        // time some connection to the peer was held back, at most
        let impact_ms = held_back_ms(iv.len_ms, p.waited_ms / iv.len_ms.max(1.0));
        let tally = Tally {
            rtos: p.timer_rtos,
            rto_wait_ms: p.rto_wait_ms,
            late_probes: p.late_probes,
            probe_wait_ms: p.probe_wait_ms,
            retransmitted_segs: p.segs,
        };
        out.push(
            Finding::new(
                Kind::Network,
                subject,
                cause,
                impact_ms,
                evidence,
                next_step,
            )
            .with_sessions(p.sessions.into_iter().cloned().collect())
            .with_tally(tally),
        );
    }
    out
}

fn add<'a>(p: &mut PeerLoss<'a>, r: &'a TcpRetransmitRecord, th: &Thresholds) {
    p.segs += u64::from(r.segs);
    let timer_rto = r.kind == RetransmitKind::Rto && r.timer;
    // What the retransmission cost the flight: its timeout, the probe's
    // wait, or else about a round trip.
    let probe_after_ms = r.probe_after_ms.filter(|_| r.kind == RetransmitKind::Tlp);
    match r.kind {
        RetransmitKind::Rto if r.timer => {
            p.timer_rtos += 1;
            p.rto_ms_max = p.rto_ms_max.max(r.rto_ms);
            p.backoff_max = p.backoff_max.max(r.backoff.into());
            p.rto_wait_ms += r.rto_ms;
            p.waited_ms += r.rto_ms;
        }
        RetransmitKind::Tlp => {
            p.tlp += 1;
            if let Some(ms) = probe_after_ms
                && ms >= th.net_ms
            {
                p.late_probes += 1;
                p.probe_after_ms_max = p.probe_after_ms_max.max(ms);
                p.probe_wait_ms += ms;
            }
        }
        RetransmitKind::Fast => p.fast += 1,
        _ => {}
    }
    if let Some(ms) = probe_after_ms {
        p.waited_ms += ms;
    } else if !timer_rto {
        p.waited_ms += f64::from(r.srtt_us) / 1000.0;
    }
    p.stalled_ms_max = p.stalled_ms_max.max(r.stalled_ms.map_or(0.0, f64::from));
    if let Some(tag) = &r.sql
        && !p.sessions.iter().any(|s| same_session(s, tag))
    {
        p.sessions.push(tag);
    }
}

/// Two `sql` tags name the same session: same worker, same client end.
pub fn same_session(a: &SqlTag, b: &SqlTag) -> bool {
    a.pid == b.pid && a.client == b.client
}

/// Link health of the namespace's interfaces that points at the cause: half
/// duplex, collisions, CRC errors (the duplex-mismatch signature, true in the
/// result when present), PAUSE frames.
fn link_evidence(iv: &Interval, netns: u32) -> Option<(String, Vec<Evidence>, bool)> {
    let mut best: Option<(String, Vec<Evidence>, bool)> = None;
    for n in iv.netdevs.iter().filter(|n| n.netns == netns) {
        let Some(link) = &n.link else { continue };
        let c = link.counters.unwrap_or_default();
        let mut ev = Vec::new();
        if half_duplex(link) {
            ev.push(Evidence::new(
                "duplex",
                "half",
                format!(
                    "{} runs at half duplex{}",
                    n.iface,
                    link.speed_mbps
                        .value()
                        .map(|s| format!(", {s} Mb/s"))
                        .unwrap_or_default()
                ),
            ));
        }
        if c.collisions > 0 {
            ev.push(
                Evidence::new(
                    "collisions",
                    c.collisions,
                    format!(
                        "{} collisions on {} (only possible in half duplex)",
                        c.collisions, n.iface
                    ),
                )
                .unit("count"),
            );
        }
        if c.rx_crc_errors > 0 {
            ev.push(
                Evidence::new(
                    "rx_crc_errors",
                    c.rx_crc_errors,
                    format!(
                        "{} frames with CRC errors received on {}",
                        c.rx_crc_errors, n.iface
                    ),
                )
                .unit("count"),
            );
        }
        if ev.is_empty() {
            continue;
        }
        // Collisions happen only in half duplex; with half duplex or late
        // collisions and CRC errors, the two ends disagree.
        let mismatch = half_duplex(link) && (c.collisions > 0 || c.rx_crc_errors > 0)
            || c.collisions > 0 && c.rx_crc_errors > 0;
        if best
            .as_ref()
            .is_none_or(|b| !b.2 && (mismatch || ev.len() > b.1.len()))
        {
            best = Some((n.iface.clone(), ev, mismatch));
        }
    }
    best
}

/// Transmit side of each interface: a stuck queue, PAUSE frames, a queue that
/// holds packets.
pub fn interfaces(iv: &Interval, th: &Thresholds) -> Vec<Finding> {
    iv.netdevs
        .iter()
        .filter_map(|n| interface(iv, n, th))
        .collect()
}

fn interface(iv: &Interval, n: &NetdevRecord, th: &Thresholds) -> Option<Finding> {
    let iface = &n.iface;
    // Unknown on an interface's first reading: no rate then, rather than 0.
    let rate = n.tx_bytes.zip(n.tx_packets).map(|(bytes, packets)| {
        let tx_mbps = bytes as f64 * 8.0 / 1000.0 / n.interval_ms.max(1) as f64;
        Evidence::new(
            "tx_mbps",
            round1(tx_mbps),
            format!("{iface} sent {tx_mbps:.1} Mbit/s ({packets} packets)"),
        )
        .unit("Mbit/s")
    });
    let pause = n
        .link
        .as_ref()
        .and_then(|l| l.pause.value())
        .and_then(|p| p.rx_pause_frames.value().copied())
        .unwrap_or(0);
    let qdisc = n.link.as_ref().and_then(|l| l.qdisc.clone());
    // the packets that waited in the queue the threshold or longer
    let held_back = held_back_ms(
        n.interval_ms as f64,
        n.qdisc_us.count_at_least(th.qdisc_ms * 1000.0) as f64 / n.qdisc_us.count.max(1) as f64,
    );
    let (cause, mut evidence, next_step, impact_ms) = if n.tx_timeouts + n.tx_stalls > 0 {
        (
            Cause::TxTimeout,
            vec![
                Evidence::new(
                    "tx_timeouts",
                    n.tx_timeouts + n.tx_stalls,
                    format!(
                        "{iface}: {} transmit watchdog timeout(s), {} byte-queue-limit stall(s)",
                        n.tx_timeouts, n.tx_stalls
                    ),
                )
                .unit("count"),
            ],
            format!(
                "the driver of {iface} stopped transmitting: check `dmesg` for the NIC's reset \
                 messages, its firmware and driver version, and the switch port"
            ),
            held_back_ms(n.interval_ms as f64, 1.0),
        )
    } else if pause > 0 {
        (
            Cause::FlowControl,
            vec![Evidence::new(
                "rx_pause_frames",
                pause,
                format!("{iface} received {pause} PAUSE frames: its link partner told it to stop sending"),
            )
            .unit("count")],
            format!(
                "a slow receiver behind the switch is throttling {iface} for every peer: find the \
                 congested port on the switch, or turn flow control off (`ethtool -A {iface} rx off \
                 tx off`) so one slow receiver stops slowing the rest"
            ),
            held_back,
        )
    } else if n.qdisc_us.count >= th.min_samples && n.qdisc_us.p99() >= th.qdisc_ms * 1000.0 {
        let kind = qdisc.as_ref().map(|q| q.kind.as_str()).unwrap_or("qdisc");
        (
            Cause::TxThrottled,
            vec![
                Evidence::new(
                    "qdisc_wait_ms_p99",
                    round1(n.qdisc_us.p99() / 1000.0),
                    format!(
                        "packets waited in {iface}'s {kind} queue {:.1} ms (p99; mean {:.1} ms)",
                        n.qdisc_us.p99() / 1000.0,
                        n.qdisc_us.mean() / 1000.0
                    ),
                )
                .unit("ms")
                .threshold(th.qdisc_ms),
            ],
            format!(
                "the {kind} queue on {iface} holds packets back: compare its configured rate with \
                 the traffic (`tc -s qdisc show dev {iface}`); a shaper set below what the \
                 application sends queues everything behind it"
            ),
            held_back,
        )
    } else {
        return None;
    };
    if let Some(q) = &qdisc
        && (q.backlog_bytes > 0 || q.drops > 0)
    {
        evidence.push(
            Evidence::new(
                "qdisc_backlog_bytes",
                q.backlog_bytes,
                format!(
                    "{} qdisc on {iface}: {} bytes queued, {} dropped, {} times over its limit",
                    q.kind, q.backlog_bytes, q.drops, q.overlimits
                ),
            )
            .unit("bytes"),
        );
    }
    evidence.extend(rate);
    // The sessions sending through this namespace.
    let mut sessions: Vec<SqlTag> = Vec::new();
    for r in iv.rtts.iter().filter(|r| r.connection.netns == n.netns) {
        if let Some(tag) = &r.sql
            && !sessions.iter().any(|s| same_session(s, tag))
        {
            sessions.push(tag.clone());
        }
    }
    let subject = Subject {
        iface: Some(iface.clone()),
        netns: Some(n.netns.into()),
        ..Default::default()
    };
    Some(
        Finding::new(
            Kind::Network,
            subject,
            cause,
            impact_ms,
            evidence,
            next_step,
        )
        .with_sessions(sessions),
    )
}

/// The link runs at half duplex (as the driver says; unknown is not half).
fn half_duplex(link: &LinkHealth) -> bool {
    link.duplex.value().is_some_and(|d| d == "half")
}

pub fn round1(v: f64) -> f64 {
    (v * 10.0).round() / 10.0
}
