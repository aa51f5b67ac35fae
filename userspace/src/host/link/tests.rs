//! Readings replayed from captured netlink answers (testdata/link/), and one
//! through real sockets.

use std::collections::VecDeque;

use netlink_packet_core::{NLA_F_NESTED, NLM_F_MULTIPART, NLMSG_DONE, parse_u32};

use super::ethtool::*;
use super::*;
use crate::host::netlink::{Each, feed, frame, put_attr, put_nested};

use crate::host::netlink::hex_datagrams as captured;

macro_rules! testdata {
    ($name:literal) => {
        captured(include_str!(concat!("../testdata/link/", $name)))
    };
}

/// NLMSG_DONE ending a dump, with the dump's error (0: none).
fn done(errno: i32) -> Vec<u8> {
    frame(NLMSG_DONE, NLM_F_MULTIPART, 1, &(-errno).to_ne_bytes())
}

/// Answers each request with recorded datagrams, in order, and keeps the
/// requests for inspection.
#[derive(Default)]
struct Replay {
    script: VecDeque<(u16, bool, Vec<Vec<u8>>)>,
    sent: Vec<(u16, bool, Vec<u8>)>,
}

impl Replay {
    fn then(mut self, kind: u16, dump: bool, datagrams: Vec<Vec<u8>>) -> Self {
        self.script.push_back((kind, dump, datagrams));
        self
    }
}

impl Transport for Replay {
    fn request(
        &mut self,
        kind: u16,
        dump: bool,
        body: &[u8],
        each: Each<'_>,
    ) -> Result<(), netlink::Error> {
        self.sent.push((kind, dump, body.to_vec()));
        let (k, d, datagrams) = self
            .script
            .pop_front()
            .expect("an unexpected extra request");
        assert_eq!(
            (kind, dump),
            (k, d),
            "request {:?} out of order",
            self.sent.last()
        );
        for dg in &datagrams {
            if feed(dg, None, each)? {
                return Ok(());
            }
        }
        panic!("recorded answer to request {kind} never completes");
    }
}

const ETHTOOL_FAMILY: u16 = 21; // what testdata/link/family.hex says

pub(super) fn by_name<'a>(links: &'a [LinkHealth], name: &str) -> &'a LinkHealth {
    links
        .iter()
        .find(|l| l.name == name)
        .unwrap_or_else(|| panic!("no {name} in {links:#?}"))
}

/// The scratch netns: lo and a veth whose root qdisc was a tbf with
/// packets queued; the ethtool dumps succeed.
fn replay_netns() -> (Replay, Replay) {
    let route = Replay::default()
        .then(libc::RTM_GETLINK, true, testdata!("netns_link_dump.hex"))
        .then(libc::RTM_GETQDISC, true, testdata!("netns_qdisc_dump.hex"));
    let generic = Replay::default()
        .then(GENL_ID_CTRL, false, testdata!("family.hex"))
        .then(ETHTOOL_FAMILY, true, testdata!("netns_linkmodes_dump.hex"))
        .then(ETHTOOL_FAMILY, true, testdata!("netns_pause_dump.hex"));
    (route, generic)
}

#[test]
fn veth_speed_duplex_autoneg_counters_and_tbf_qdisc() {
    let (mut route, mut generic) = replay_netns();
    let links = read_with(&mut route, &mut generic).unwrap();
    assert_eq!(links.len(), 2);
    let veth = by_name(&links, "stcapva");
    assert_eq!(
        (veth.ifindex, veth.oper_state.as_str(), veth.carrier),
        (2, "up", Some(true))
    );
    assert_eq!(veth.speed_mbps, Exposed::Value(10_000));
    assert_eq!(veth.duplex, Exposed::Value("full".into()));
    assert_eq!(veth.autoneg, Exposed::Value(false));
    // veth has no get_pauseparam: the dump skipped it.
    assert_eq!(veth.pause, Exposed::NotExposed);
    // Cross-checked against `ip -s link` right after the capture.
    let c = veth.counters.unwrap();
    assert_eq!(
        (c.rx_packets, c.rx_bytes, c.tx_packets, c.tx_bytes),
        (13, 4098, 26, 26_584)
    );
    assert_eq!(
        (c.rx_errors, c.tx_errors, c.rx_crc_errors, c.collisions),
        (0, 0, 0, 0)
    );
    // Cross-checked against `tc -s qdisc` right after the capture.
    let q = veth.qdisc.as_ref().unwrap();
    assert_eq!(q.kind, "tbf");
    assert_eq!((q.backlog_bytes, q.qlen_packets), (20_188, 14));
    assert_eq!((q.drops, q.requeues, q.overlimits), (282, 0, 302));

    let lo = by_name(&links, "lo");
    assert_eq!(
        (
            lo.oper_state.as_str(),
            lo.qdisc.as_ref().unwrap().kind.as_str()
        ),
        ("unknown", "noqueue")
    );
    // lo has no link modes at all: nothing is made up for it.
    assert_eq!(lo.speed_mbps, Exposed::NotExposed);
    assert_eq!(lo.duplex, Exposed::NotExposed);
    assert_eq!(lo.autoneg, Exposed::NotExposed);
}

#[test]
fn ethtool_requests_ask_for_compact_bitsets_and_pause_stats() {
    let (mut route, mut generic) = replay_netns();
    read_with(&mut route, &mut generic).unwrap();
    let header_flags = |body: &[u8]| {
        let (_, h) = attrs(&body[GENL_HDRLEN..])
            .find(|(t, _)| *t == ETHTOOL_A_HEADER)
            .unwrap();
        let (_, f) = attrs(h)
            .find(|(t, _)| *t == ETHTOOL_A_HEADER_FLAGS)
            .unwrap();
        parse_u32(f).unwrap()
    };
    let [_, (_, _, modes), (_, _, pause)] = &generic.sent[..] else {
        panic!("{:?}", generic.sent)
    };
    assert_eq!(
        (modes[0], header_flags(modes)),
        (ETHTOOL_MSG_LINKMODES_GET, ETHTOOL_FLAG_COMPACT_BITSETS)
    );
    assert_eq!(
        (pause[0], header_flags(pause)),
        (ETHTOOL_MSG_PAUSE_GET, ETHTOOL_FLAG_STATS)
    );
    // The nest carries NLA_F_NESTED, which the ethtool family requires.
    let nla_type = u16::from_ne_bytes([pause[GENL_HDRLEN + 2], pause[GENL_HDRLEN + 3]]);
    assert_eq!(nla_type, ETHTOOL_A_HEADER | NLA_F_NESTED);
}

#[test]
fn eopnotsupp_and_unknown_speed_read_as_not_exposed() {
    // The linkmodes dump fails as a whole, so each interface is asked in
    // turn: lo answers EOPNOTSUPP, eth0 (virtio_net) SPEED_UNKNOWN and
    // DUPLEX_UNKNOWN.
    let mut route = Replay::default()
        .then(
            libc::RTM_GETLINK,
            true,
            vec![
                testdata!("root_lo.hex").remove(0),
                testdata!("root_eth0.hex").remove(0),
                done(0),
            ],
        )
        .then(libc::RTM_GETQDISC, true, testdata!("root_qdisc_dump.hex"));
    let mut generic = Replay::default()
        .then(GENL_ID_CTRL, false, testdata!("family.hex"))
        .then(ETHTOOL_FAMILY, true, vec![done(libc::EIO)])
        .then(ETHTOOL_FAMILY, false, testdata!("root_lo_linkmodes.hex"))
        .then(ETHTOOL_FAMILY, false, testdata!("root_eth0_linkmodes.hex"))
        .then(ETHTOOL_FAMILY, true, testdata!("root_pause_dump.hex"));
    let links = read_with(&mut route, &mut generic).unwrap();
    assert!(generic.script.is_empty());
    let per_device: Vec<_> = generic.sent[2..4]
        .iter()
        .map(|(_, _, b)| ethtool_ifindex(&b[GENL_HDRLEN..]))
        .collect();
    assert_eq!(per_device, [Some(1), Some(4)]);

    let eth0 = by_name(&links, "eth0");
    assert_eq!(
        (eth0.ifindex, eth0.oper_state.as_str(), eth0.carrier_changes),
        (4, "up", Some(2))
    );
    assert_eq!(eth0.speed_mbps, Exposed::NotExposed);
    assert_eq!(eth0.duplex, Exposed::NotExposed);
    assert_eq!(eth0.autoneg, Exposed::Value(false));
    assert_eq!(eth0.pause, Exposed::NotExposed);
    assert_eq!(eth0.qdisc.as_ref().unwrap().kind, "pfifo_fast");
    let lo = by_name(&links, "lo");
    assert_eq!((lo.speed_mbps.value(), lo.pause.value()), (None, None));

    let json = serde_json::to_value(eth0).unwrap();
    assert_eq!(json["speed_mbps"], NOT_EXPOSED);
    assert_eq!(json["duplex"], NOT_EXPOSED);
    assert_eq!(json["autoneg"], false);
    assert_eq!(json["pause"], NOT_EXPOSED);
    assert_eq!(json["counters"]["rx_packets"], 13_577);
}

#[test]
fn the_eopnotsupp_reply_is_the_kernel_error() {
    let lo = testdata!("root_lo_linkmodes.hex");
    let r = feed(&lo[0], None, &mut |_| Ok(()));
    assert!(
        matches!(r, Err(netlink::Error::Kernel(libc::EOPNOTSUPP))),
        "{r:?}"
    );
}

#[test]
fn speed_zero_and_odd_duplex_are_not_exposed() {
    let mut a = Vec::new();
    put_attr(&mut a, ETHTOOL_A_LINKMODES_SPEED, &0u32.to_ne_bytes());
    put_attr(&mut a, ETHTOOL_A_LINKMODES_DUPLEX, &[0xff]);
    let m = parse_linkmodes(&a);
    assert_eq!(
        (m.speed_mbps, m.duplex, m.autoneg),
        (
            Exposed::NotExposed,
            Exposed::NotExposed,
            Exposed::NotExposed
        )
    );
    let mut a = Vec::new();
    put_attr(&mut a, ETHTOOL_A_LINKMODES_SPEED, &100u32.to_ne_bytes());
    put_attr(&mut a, ETHTOOL_A_LINKMODES_DUPLEX, &[DUPLEX_HALF]);
    put_attr(&mut a, ETHTOOL_A_LINKMODES_AUTONEG, &[1]);
    let m = parse_linkmodes(&a);
    assert_eq!(
        (m.speed_mbps, m.duplex, m.autoneg),
        (
            Exposed::Value(100),
            Exposed::Value("half".into()),
            Exposed::Value(true)
        )
    );
}

/// A PAUSE_GET reply from a driver with pause statistics. Synthetic: no
/// device on the development VM (veth, virtio_net, lo) implements
/// get_pauseparam, so the layout follows pause_fill_reply() in
/// net/ethtool/pause.c: settings as u8, then a nest of u64 counters
/// preceded by a PAD attribute for 64-bit alignment.
fn pause_reply(ifindex: u32, tx_frames: Option<u64>, rx_frames: Option<u64>) -> Vec<u8> {
    let mut header = Vec::new();
    put_attr(
        &mut header,
        ETHTOOL_A_HEADER_DEV_INDEX,
        &ifindex.to_ne_bytes(),
    );
    put_attr(&mut header, 2, b"eth9\0");
    let mut stats = Vec::new();
    put_attr(&mut stats, 1, &[]); // ETHTOOL_A_PAUSE_STAT_PAD
    if let Some(n) = tx_frames {
        put_attr(&mut stats, ETHTOOL_A_PAUSE_STAT_TX_FRAMES, &n.to_ne_bytes());
    }
    if let Some(n) = rx_frames {
        put_attr(&mut stats, ETHTOOL_A_PAUSE_STAT_RX_FRAMES, &n.to_ne_bytes());
    }
    let mut body = vec![22, ETHTOOL_GENL_VERSION, 0, 0]; // ETHTOOL_MSG_PAUSE_GET_REPLY
    put_nested(&mut body, ETHTOOL_A_HEADER, &header);
    put_attr(&mut body, ETHTOOL_A_PAUSE_AUTONEG, &[1]);
    put_attr(&mut body, ETHTOOL_A_PAUSE_RX, &[1]);
    put_attr(&mut body, ETHTOOL_A_PAUSE_TX, &[0]);
    put_nested(&mut body, ETHTOOL_A_PAUSE_STATS, &stats);
    frame(ETHTOOL_FAMILY, NLM_F_MULTIPART, 1, &body)
}

#[test]
fn pause_statistics_when_the_driver_exposes_them() {
    let route = testdata!("netns_link_dump.hex");
    let mut route = Replay::default().then(libc::RTM_GETLINK, true, route).then(
        libc::RTM_GETQDISC,
        true,
        vec![done(0)],
    );
    let mut generic = Replay::default()
        .then(GENL_ID_CTRL, false, testdata!("family.hex"))
        .then(ETHTOOL_FAMILY, true, vec![done(0)])
        .then(
            ETHTOOL_FAMILY,
            true,
            vec![pause_reply(2, Some(12), Some(345_678)), done(0)],
        );
    let links = read_with(&mut route, &mut generic).unwrap();
    let veth = by_name(&links, "stcapva");
    let want = PauseCounters {
        autoneg: Some(true),
        rx_enabled: Some(true),
        tx_enabled: Some(false),
        tx_pause_frames: Exposed::Value(12),
        rx_pause_frames: Exposed::Value(345_678),
    };
    assert_eq!(veth.pause, Exposed::Value(want));
    let json = serde_json::to_value(&veth.pause).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"autoneg": true, "rx_enabled": true, "tx_enabled": false,
                           "tx_pause_frames": 12, "rx_pause_frames": 345_678})
    );
    // No root qdisc reported, so none is made up.
    assert_eq!(veth.qdisc, None);
    assert!(serde_json::to_value(veth).unwrap().get("qdisc").is_none());

    // A driver that fills in only one counter: the other is not exposed.
    let body = &pause_reply(2, None, Some(5))[size_of::<libc::nlmsghdr>()..];
    let p = parse_pause(&body[GENL_HDRLEN..]);
    assert_eq!(
        (p.tx_pause_frames, p.rx_pause_frames),
        (Exposed::NotExposed, Exposed::Value(5))
    );
}

#[test]
fn reads_this_namespace_through_real_sockets() {
    // Unprivileged: RTM_GETLINK, RTM_GETQDISC and ethtool GETs need no
    // capability. Every namespace has lo.
    let links = read_all().unwrap();
    let lo = by_name(&links, "lo");
    assert_eq!(lo.ifindex, 1);
    assert!(lo.counters.is_some());
    assert_eq!(lo.duplex, Exposed::NotExposed);
}
