//! The netdev family's record, `netdev`.

use super::latency_us;
use crate::host::link::{Exposed, LinkCounters, LinkHealth, PauseCounters, QdiscStats};
use crate::records::Examples;
use crate::records::netdev::NetdevRecord;

/// A physical interface with everything exposed, and one in a namespace that
/// cannot be entered (kernel figures only).
impl Examples for NetdevRecord {
    fn examples() -> Vec<Self> {
        let mut all = Vec::new();
        let health = LinkHealth {
            ifindex: 2,
            name: "eth0".into(),
            oper_state: "up".into(),
            carrier: Some(true),
            carrier_changes: Some(0),
            speed_mbps: Exposed::Value(1000),
            duplex: Exposed::Value("half".into()),
            autoneg: Exposed::Value(false),
            counters: Some(LinkCounters {
                rx_packets: 1200,
                tx_packets: 900,
                collisions: 31,
                rx_crc_errors: 4,
                ..Default::default()
            }),
            pause: Exposed::Value(PauseCounters {
                autoneg: Some(true),
                rx_enabled: Some(true),
                tx_enabled: None,
                tx_pause_frames: Exposed::Value(0),
                rx_pause_frames: Exposed::NotExposed,
            }),
            qdisc: Some(QdiscStats {
                kind: "fq_codel".into(),
                backlog_bytes: 30_000,
                qlen_packets: 20,
                drops: 3,
                requeues: 1,
                overlimits: 0,
            }),
        };
        let netdev = NetdevRecord {
            iface: "eth0".into(),
            ifindex: 2,
            netns: 4026531840,
            interval_ms: 1000,
            rx_packets: Some(1200),
            rx_bytes: Some(80_000),
            tx_packets: Some(900),
            tx_bytes: Some(1_300_000),
            qdisc_us: latency_us(&[(3_000, 800), (4_000_000, 20)]),
            xmit_us: latency_us(&[(700, 900)]),
            rx_us: latency_us(&[(20_000, 70)]),
            qdisc_untimed: 3,
            tx_timeouts: 0,
            tx_stalls: 0,
            tx_busy: 0,
            link: Some(health.clone()),
        };
        all.push(netdev.clone());
        let unnamed = NetdevRecord {
            iface: "if7".into(),
            ifindex: 7,
            rx_packets: None,
            rx_bytes: None,
            tx_packets: None,
            tx_bytes: None,
            link: None,
            ..netdev
        };
        all.push(unnamed.clone());
        let bare = NetdevRecord {
            link: Some(LinkHealth {
                carrier: None,
                carrier_changes: None,
                speed_mbps: Exposed::NotExposed,
                duplex: Exposed::NotExposed,
                autoneg: Exposed::NotExposed,
                counters: None,
                pause: Exposed::NotExposed,
                qdisc: None,
                ..health
            }),
            ..unnamed.clone()
        };
        all.push(bare);
        all
    }
}
