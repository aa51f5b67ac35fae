//! `--prometheus-peers N`: retransmissions and retransmission timeouts per TCP
//! peer, so that an alert can name the peer a database's sessions stall on.
//!
//! Peers are unbounded on a busy host (every client address), so they are
//! off by default and capped (capped.rs): the first N peers, by network
//! namespace and address, get series of their own; the others are counted
//! under `peer="other"`.

use std::time::Instant;

use super::capped::{Capped, OTHER};
use super::registry::{Kind, Labels, Registry};
use crate::records::tcp::TcpRetransmitRecord;

/// The most `--prometheus-peers` takes: a few thousand series in all.
pub const MAX_PEERS: u32 = 1000;

const SEGMENTS: &str = "stalltrace_tcp_peer_retransmitted_segments_total";
const TIMEOUTS: &str = "stalltrace_tcp_peer_retransmission_timeouts_total";

#[derive(Debug)]
pub struct Peers {
    /// By (netns, address).
    places: Capped<(String, String)>,
}

impl Peers {
    /// Declares the families; None when `cap` is 0 (off).
    pub fn new(r: &mut Registry, cap: u32) -> Option<Self> {
        if cap == 0 {
            return None;
        }
        r.declare(
            SEGMENTS,
            Kind::Counter,
            "Segments retransmitted (sent) to each TCP peer (--prometheus-peers; peer=\"other\": the peers past the cap).",
        );
        r.declare(
            TIMEOUTS,
            Kind::Counter,
            "Retransmission timeouts on connections to each TCP peer (--prometheus-peers; peer=\"other\": the peers past the cap).",
        );
        r.expires(SEGMENTS);
        r.expires(TIMEOUTS);
        Some(Self {
            places: Capped::new(cap.min(MAX_PEERS) as usize),
        })
    }

    /// One `tcp_retransmit` record that went out (err 0); `timeout`: the
    /// timer's first retransmission.
    pub fn retransmitted(&mut self, r: &mut Registry, t: &TcpRetransmitRecord, timeout: bool) {
        // `peer` is the remote address (`daddr`): the label's name is the
        // metrics' own contract (docs/metrics.md), older than the field's.
        let c = &t.connection;
        let labels = self.labels(c.netns.to_string(), &c.daddr.to_string(), Instant::now());
        r.add(SEGMENTS, labels.clone(), f64::from(t.segs));
        if timeout {
            r.add(TIMEOUTS, labels, 1.0);
        } else {
            // Shown at 0 from a peer's first retransmission: `increase()`
            // misses the first rise of a series that appears with it.
            r.add(TIMEOUTS, labels, 0.0);
        }
    }

    fn labels(&mut self, netns: String, addr: &str, now: Instant) -> Labels {
        let key = (netns, addr.to_string());
        if !self.places.place(&key, now) {
            return vec![("peer", OTHER.to_string()), ("netns", String::new())];
        }
        vec![("peer", key.1), ("netns", key.0)]
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::registry::SERIES_TTL;

    fn rtx(addr: &str, segs: u32) -> TcpRetransmitRecord {
        let mut t = TcpRetransmitRecord::from_event(&Default::default(), 250);
        (t.connection.netns, t.connection.daddr) = (4026531840, addr.parse().unwrap());
        t.segs = segs;
        t
    }

    #[test]
    fn peers_past_the_cap_are_summed_as_other_and_a_quiet_peer_gives_its_place_up() {
        let mut r = Registry::default();
        let mut p = Peers::new(&mut r, 2).unwrap();
        p.retransmitted(&mut r, &rtx("10.0.0.1", 1), true);
        p.retransmitted(&mut r, &rtx("10.0.0.2", 2), false);
        p.retransmitted(&mut r, &rtx("10.0.0.3", 3), true);
        p.retransmitted(&mut r, &rtx("10.0.0.4", 4), false);
        let text = r.render();
        for line in [
            r#"stalltrace_tcp_peer_retransmitted_segments_total{peer="10.0.0.1",netns="4026531840"} 1"#,
            r#"stalltrace_tcp_peer_retransmitted_segments_total{peer="10.0.0.2",netns="4026531840"} 2"#,
            r#"stalltrace_tcp_peer_retransmitted_segments_total{peer="other",netns=""} 7"#,
            r#"stalltrace_tcp_peer_retransmission_timeouts_total{peer="10.0.0.1",netns="4026531840"} 1"#,
            r#"stalltrace_tcp_peer_retransmission_timeouts_total{peer="10.0.0.2",netns="4026531840"} 0"#,
            r#"stalltrace_tcp_peer_retransmission_timeouts_total{peer="other",netns=""} 1"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert!(!text.contains("10.0.0.3"), "past the cap");
        // Ten minutes on, 10.0.0.1 is quiet and the next new peer takes its place.
        let later = Instant::now() + SERIES_TTL;
        p.labels("4026531840".into(), "10.0.0.2", later);
        assert_eq!(p.labels("1".into(), "10.0.0.5", later)[0].1, "10.0.0.5");
        assert_eq!(p.labels("1".into(), "10.0.0.6", later)[0].1, OTHER);
    }

    #[test]
    fn off_unless_asked_for() {
        let mut r = Registry::default();
        assert!(Peers::new(&mut r, 0).is_none());
        assert!(!r.render().contains("peer"));
    }
}
