//! The change between two readings of one interface.

use super::model::{Exposed, LinkHealth, PauseCounters, QdiscStats, since};

/// The change between two readings of one interface, as an interval record
/// carries it: running totals (counters, carrier changes, PAUSE frames, qdisc
/// drops/requeues/overlimits) become the increase since `prev`; states,
/// settings and gauges (qdisc backlog and queue length) are `cur`'s.
///
/// A total that went down was reset (the interface or qdisc was re-created):
/// its delta is the new value, counted from that reset. A different ifindex
/// means the interface was re-created, so every delta is the new total. A
/// total without a value in `prev` has no baseline and is left out ("not
/// exposed"), except for a qdisc that appeared, whose totals all are new.
/// Note that qdisc counters and carrier changes are 32-bit in the kernel: a
/// wrap reads as a reset and undercounts that one interval.
pub fn delta(prev: &LinkHealth, cur: &LinkHealth) -> LinkHealth {
    let recreated = prev.ifindex != cur.ifindex;
    let base = |p: Option<u64>| if recreated { Some(0) } else { p };
    let d = |p: Option<u64>, c: Option<u64>| Some(since(base(p)?, c?));

    let counters = match (&prev.counters, &cur.counters) {
        (_, Some(c)) if recreated => Some(*c),
        (Some(p), Some(c)) => Some(c.since(p)),
        _ => None,
    };
    let pause = match &cur.pause {
        Exposed::Value(c) => {
            let p = prev.pause.value();
            let frames = |f: fn(&PauseCounters) -> &Exposed<u64>| {
                d(p.and_then(|p| f(p).value().copied()), f(c).value().copied()).into()
            };
            Exposed::Value(PauseCounters {
                tx_pause_frames: frames(|p| &p.tx_pause_frames),
                rx_pause_frames: frames(|p| &p.rx_pause_frames),
                ..c.clone()
            })
        }
        Exposed::NotExposed => Exposed::NotExposed,
    };
    let qdisc = cur.qdisc.as_ref().map(|c| {
        // A root qdisc of another kind was replaced: its counters start at 0.
        let p = prev
            .qdisc
            .as_ref()
            .filter(|p| p.kind == c.kind && !recreated);
        let d = |f: fn(&QdiscStats) -> u64| since(p.map_or(0, f), f(c));
        QdiscStats {
            drops: d(|q| q.drops),
            requeues: d(|q| q.requeues),
            overlimits: d(|q| q.overlimits),
            ..c.clone()
        }
    });
    LinkHealth {
        carrier_changes: d(prev.carrier_changes, cur.carrier_changes),
        counters,
        pause,
        qdisc,
        ..cur.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::link::{LinkCounters, NOT_EXPOSED};

    /// A reading of one interface with the given running totals.
    fn reading(ifindex: u32, total: u64, qdisc_kind: &str, pause: Option<u64>) -> LinkHealth {
        LinkHealth {
            ifindex,
            name: "eth9".into(),
            oper_state: "up".into(),
            carrier: Some(true),
            carrier_changes: Some(total),
            speed_mbps: Exposed::Value(25_000),
            duplex: Exposed::Value("full".into()),
            autoneg: Exposed::Value(true),
            counters: Some(LinkCounters {
                rx_packets: total * 10,
                tx_bytes: total * 1000,
                rx_crc_errors: total,
                ..Default::default()
            }),
            pause: match pause {
                Some(n) => Exposed::Value(PauseCounters {
                    autoneg: Some(false),
                    rx_enabled: Some(true),
                    tx_enabled: Some(true),
                    tx_pause_frames: Exposed::Value(n),
                    rx_pause_frames: Exposed::Value(2 * n),
                }),
                None => Exposed::NotExposed,
            },
            qdisc: Some(QdiscStats {
                kind: qdisc_kind.into(),
                backlog_bytes: total * 100,
                qlen_packets: total,
                drops: total * 3,
                requeues: total * 2,
                overlimits: total * 5,
            }),
        }
    }

    #[test]
    fn delta_takes_running_totals_apart_and_keeps_gauges() {
        let d = delta(
            &reading(3, 10, "mq", Some(7)),
            &reading(3, 15, "mq", Some(9)),
        );
        let c = d.counters.unwrap();
        assert_eq!(
            (c.rx_packets, c.tx_bytes, c.rx_crc_errors, c.tx_packets),
            (50, 5000, 5, 0)
        );
        assert_eq!(d.carrier_changes, Some(5));
        let p = d.pause.value().unwrap();
        assert_eq!(
            (p.tx_pause_frames.value(), p.rx_pause_frames.value()),
            (Some(&2), Some(&4))
        );
        assert_eq!(p.rx_enabled, Some(true));
        let q = d.qdisc.unwrap();
        assert_eq!((q.drops, q.requeues, q.overlimits), (15, 10, 25));
        // Gauges and settings are the latest reading's.
        assert_eq!(
            (q.backlog_bytes, q.qlen_packets, q.kind.as_str()),
            (1500, 15, "mq")
        );
        assert_eq!(
            (d.speed_mbps, d.carrier),
            (Exposed::Value(25_000), Some(true))
        );
    }

    #[test]
    fn delta_after_a_counter_reset_is_the_new_value() {
        // Same ifindex, totals went down (driver reset its counters).
        let d = delta(
            &reading(3, 15, "mq", Some(9)),
            &reading(3, 4, "mq", Some(1)),
        );
        let c = d.counters.unwrap();
        assert_eq!((c.rx_packets, c.rx_crc_errors), (40, 4));
        assert_eq!(d.carrier_changes, Some(4));
        assert_eq!(d.pause.value().unwrap().tx_pause_frames, Exposed::Value(1));
        assert_eq!(d.qdisc.unwrap().drops, 12);
    }

    #[test]
    fn delta_of_a_recreated_interface_or_replaced_qdisc_counts_from_zero() {
        // Re-created: new ifindex, totals higher than before but all new.
        let d = delta(
            &reading(3, 10, "mq", Some(7)),
            &reading(9, 12, "mq", Some(8)),
        );
        assert_eq!(d.counters.unwrap().rx_packets, 120);
        assert_eq!(d.carrier_changes, Some(12));
        assert_eq!(d.pause.value().unwrap().tx_pause_frames, Exposed::Value(8));
        assert_eq!(d.qdisc.unwrap().drops, 36);
        // Root qdisc replaced by another kind: its counters start over.
        let d = delta(
            &reading(3, 10, "pfifo_fast", None),
            &reading(3, 12, "fq_codel", None),
        );
        assert_eq!(d.qdisc.unwrap().drops, 36);
        assert_eq!(d.counters.unwrap().rx_packets, 20);
    }

    #[test]
    fn delta_without_a_baseline_is_not_exposed() {
        // PAUSE counters appear (e.g. the ethtool query failed last time):
        // the interval's change is unknown, not "everything since boot".
        let d = delta(&reading(3, 10, "mq", None), &reading(3, 12, "mq", Some(8)));
        let p = d.pause.value().unwrap();
        assert_eq!(
            (&p.tx_pause_frames, p.tx_enabled),
            (&Exposed::NotExposed, Some(true))
        );
        assert_eq!(
            serde_json::to_value(p).unwrap()["rx_pause_frames"],
            NOT_EXPOSED
        );
        let d = delta(&reading(3, 12, "mq", Some(8)), &reading(3, 12, "mq", None));
        assert_eq!(d.pause, Exposed::NotExposed);
        // A qdisc that appeared counts from zero.
        let mut prev = reading(3, 10, "mq", None);
        prev.qdisc = None;
        assert_eq!(
            delta(&prev, &reading(3, 12, "mq", None))
                .qdisc
                .unwrap()
                .drops,
            36
        );
    }
}
