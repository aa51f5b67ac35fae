//! The tcp records: decoding the kernel's events, and reading the
//! connection of a line of any schema.

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

/// A `tcp_rtt` line with these fields besides its connection's.
fn rtt_line(connection: serde_json::Value) -> serde_json::Value {
    let mut line = serde_json::json!({"ts": "2026-12-07T10:00:00.000000Z", "type": "tcp_rtt",
        "interval_ms": 1000,
        "srtt_us": {"count": 0, "mean": null, "p50": null, "p90": null, "p99": null, "max": null,
                    "scale": 0.001, "first_bucket": 0, "counts": []},
        "retransmits": 1, "retrans_segs": 1, "rtos": 1, "fast_retransmits": 0,
        "tail_loss_probes": 0, "syn_retransmits": 0, "peer_table_full": false});
    for (k, v) in connection.as_object().unwrap() {
        line[k] = v.clone();
    }
    line
}

#[test]
fn every_tcp_record_writes_its_connection_as_the_same_top_level_fields() {
    let connection = Connection::new(
        4026531840,
        "10.1.2.3:1433".parse().unwrap(),
        "10.1.2.4:50123".parse().unwrap(),
    );
    let wire = serde_json::json!({"netns": 4026531840u64, "family": "ipv4",
        "saddr": "10.1.2.3", "sport": 1433, "daddr": "10.1.2.4", "dport": 50123});
    let rtt: TcpRttRecord = serde_json::from_value(rtt_line(wire.clone())).unwrap();
    assert_eq!(rtt.connection, connection);
    let written = serde_json::to_value(&rtt).unwrap();
    let retransmit = serde_json::to_value(TcpRetransmitRecord {
        connection,
        ..TcpRetransmitRecord::from_event(&Default::default(), 250)
    })
    .unwrap();
    for record in [written, retransmit] {
        for (field, value) in wire.as_object().unwrap() {
            assert_eq!(&record[field], value, "{field} in {record}");
        }
    }
}

/// Schema 1 and 2 keyed `tcp_rtt` without the local address and spelled the
/// rest `peer`, `peer_port`, `local_port`: such a line reads as schema 3,
/// from any local address.
#[test]
fn a_schema_2_tcp_rtt_reads_with_any_local_address() {
    let v4 = rtt_line(serde_json::json!({"netns": 7, "family": "ipv4",
        "peer": "10.213.7.2", "peer_port": 37599, "local_port": 49958}));
    let r: TcpRttRecord = serde_json::from_value(v4).unwrap();
    assert_eq!(
        (
            r.connection.local(),
            r.connection.remote(),
            r.connection.netns
        ),
        (
            "0.0.0.0:49958".parse().unwrap(),
            "10.213.7.2:37599".parse().unwrap(),
            7
        )
    );
    let v6 = rtt_line(serde_json::json!({"netns": 7, "family": "ipv6",
        "peer": "fd00:5700::2", "peer_port": 1433, "local_port": 50000}));
    let r: TcpRttRecord = serde_json::from_value(v6).unwrap();
    assert_eq!(r.connection.local(), "[::]:50000".parse().unwrap());
    assert_eq!(r.connection.family, IpFamily::Ipv6);
    // Written back, it is schema 3's.
    let written = serde_json::to_value(&r).unwrap();
    assert!(written.get("peer").is_none() && written["daddr"] == "fd00:5700::2");
}

/// The old spelling is `tcp_rtt`'s alone, and a connection must be whole.
#[test]
fn a_connection_missing_an_end_or_spelled_the_old_way_elsewhere_is_refused() {
    let half = rtt_line(serde_json::json!({"netns": 7, "family": "ipv4",
        "daddr": "10.0.0.2", "dport": 1433, "sport": 50000}));
    let e = serde_json::from_value::<TcpRttRecord>(half).unwrap_err();
    assert!(e.to_string().contains("saddr"), "{e}");
    let none = rtt_line(serde_json::json!({"netns": 7, "family": "ipv4"}));
    assert!(serde_json::from_value::<TcpRttRecord>(none).is_err());
    let mut old =
        serde_json::to_value(TcpRetransmitRecord::from_event(&Default::default(), 250)).unwrap();
    let o = old.as_object_mut().unwrap();
    for (new, was) in [
        ("daddr", "peer"),
        ("dport", "peer_port"),
        ("sport", "local_port"),
    ] {
        let v = o.remove(new).unwrap();
        o.insert(was.into(), v);
    }
    assert!(serde_json::from_value::<TcpRetransmitRecord>(old).is_err());
}
