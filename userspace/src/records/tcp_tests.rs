//! The tcp records: decoding the kernel's events.

use super::*;

#[test]
fn decodes_an_rto_event() {
    let mut e = tcp_retransmit_event {
        kind: abi::EVENT_TCP_RETRANSMIT,
        flags: abi::TCP_RETX_F_TIMER
            | abi::TCP_RETX_F_COUNTED
            | abi::TCP_RETX_F_OWNER
            | abi::TCP_RETX_F_EPISODE,
        family: 2,
        sport: 1433,
        dport: 50123,
        state: 1,
        ca_state: 4,
        retx_kind: abi::TCP_RETX_RTO as u8,
        backoff: 2,
        retransmits: 3,
        segs: 1,
        rto_jiffies: 200, // 800 ms at HZ 250
        srtt_us: 120,
        stalled_ms: 1400,
        tgid: 7,
        pid: 8,
        ..Default::default()
    };
    e.saddr[..4].copy_from_slice(&[10, 200, 0, 1]);
    e.daddr[..4].copy_from_slice(&[10, 200, 0, 2]);
    for (i, b) in b"sqlservr".iter().enumerate() {
        e.comm[i] = *b as _;
    }
    let r = TcpRetransmitRecord::from_event(&e, 250);
    assert_eq!(
        (r.connection.local(), r.connection.remote()),
        (
            "10.200.0.1:1433".parse().unwrap(),
            "10.200.0.2:50123".parse().unwrap()
        )
    );
    assert_eq!(
        (r.kind, r.state.as_str(), r.ca_state.as_str()),
        (RetransmitKind::Rto, "ESTABLISHED", "loss")
    );
    assert!(r.timer && r.counted && !r.synack);
    assert_eq!(r.rto_ms, 800.0);
    assert_eq!(r.stalled_ms, Some(1400));
    assert_eq!((r.pid, r.comm.as_deref()), (Some(7), Some("sqlservr")));
}

#[test]
fn a_probe_carries_how_long_its_flight_waited() {
    let probe = tcp_retransmit_event {
        flags: abi::TCP_RETX_F_PROBE,
        retx_kind: abi::TCP_RETX_TLP as u8,
        probe_after_us: 204_567,
        ..Default::default()
    };
    let r = TcpRetransmitRecord::from_event(&probe, 250);
    assert_eq!(
        (r.kind, r.probe_after_ms),
        (RetransmitKind::Tlp, Some(204.56))
    );
    let fast = tcp_retransmit_event {
        retx_kind: abi::TCP_RETX_FAST as u8,
        ..Default::default()
    };
    assert_eq!(
        TcpRetransmitRecord::from_event(&fast, 250).probe_after_ms,
        None
    );
}

#[test]
fn v6_addresses_and_unowned_sockets() {
    let mut e = tcp_retransmit_event {
        family: 10,
        retx_kind: abi::TCP_RETX_FAST as u8,
        ..Default::default()
    };
    e.daddr = "fd00:5700::2".parse::<Ipv6Addr>().unwrap().octets();
    let r = TcpRetransmitRecord::from_event(&e, 1000);
    assert_eq!(r.connection.daddr.to_string(), "fd00:5700::2");
    assert_eq!(r.connection.family, IpFamily::Ipv6);
    assert_eq!((r.pid, r.comm.clone(), r.stalled_ms), (None, None, None));
}
