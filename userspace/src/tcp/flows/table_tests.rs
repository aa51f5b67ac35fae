use std::net::{IpAddr, Ipv4Addr};

use super::*;

const MS: u64 = 1000;

#[test]
fn receiver_wins_at_exactly_half_the_busy_time() {
    // 1 s interval, busy all of it.
    assert_eq!(
        limiter(1_000 * MS, 1_000 * MS, 500 * MS, 0),
        Limiter::Receiver
    );
    assert_eq!(
        limiter(1_000 * MS, 1_000 * MS, 500 * MS - 1, 0),
        Limiter::Network
    );
    // Odd busy time: half of 999 µs is 499.5 µs.
    assert_eq!(limiter(1_000, 999, 500, 0), Limiter::Receiver);
    assert_eq!(limiter(1_000, 999, 499, 0), Limiter::Network);
}

#[test]
fn sender_buffer_at_exactly_half_and_receiver_before_it() {
    assert_eq!(
        limiter(1_000 * MS, 800 * MS, 0, 400 * MS),
        Limiter::SenderBuffer
    );
    assert_eq!(
        limiter(1_000 * MS, 800 * MS, 0, 400 * MS - 1),
        Limiter::Network
    );
    // Both at half (the kernel counts them apart, so they can only tie at
    // exactly half each): the receiver is named.
    assert_eq!(
        limiter(1_000 * MS, 800 * MS, 400 * MS, 400 * MS),
        Limiter::Receiver
    );
}

#[test]
fn application_below_half_the_interval() {
    assert_eq!(
        limiter(1_000 * MS, 500 * MS - 1, 0, 0),
        Limiter::Application
    );
    assert_eq!(limiter(1_000 * MS, 500 * MS, 0, 0), Limiter::Network);
    assert_eq!(limiter(1_001, 500, 0, 0), Limiter::Application);
    assert_eq!(limiter(1_001, 501, 0, 0), Limiter::Network);
    // A short busy time that was all receive-window-limited is still the receiver's.
    assert_eq!(limiter(1_000 * MS, 100 * MS, 60 * MS, 0), Limiter::Receiver);
}

#[test]
fn never_busy_is_the_application_not_the_receiver() {
    assert_eq!(limiter(1_000 * MS, 0, 0, 0), Limiter::Application);
}

#[test]
fn extreme_values_do_not_overflow() {
    assert_eq!(limiter(u64::MAX, u64::MAX, u64::MAX, 0), Limiter::Receiver);
    assert_eq!(
        limiter(u64::MAX, u64::MAX, u64::MAX / 2, 0),
        Limiter::Network
    );
    assert_eq!(limiter(u64::MAX, u64::MAX / 2, 0, 0), Limiter::Application);
}

#[test]
fn names_are_the_serialized_ones() {
    // The names the code uses (metrics labels) are the records' (schema) values.
    for l in [
        Limiter::Network,
        Limiter::Receiver,
        Limiter::SenderBuffer,
        Limiter::Application,
        Limiter::Host,
    ] {
        assert_eq!(serde_json::to_value(l).unwrap(), l.name(), "{l:?}");
        assert_eq!(
            serde_json::from_value::<Limiter>(l.name().into()).unwrap(),
            l
        );
    }
}

fn sock(cookie: u64, ino: u64, acked: u64, busy_us: u64) -> TcpSocket {
    TcpSocket {
        local: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
        sport: 5022,
        remote: IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
        dport: 40_000 + cookie as u16,
        ino,
        cookie,
        info: TcpInfo {
            bytes_acked: acked,
            bytes_received: acked / 100,
            busy_us,
            rwnd_limited_us: busy_us / 4,
            total_retrans: (acked / 1_000_000) as u32,
            ..Default::default()
        },
    }
}

#[test]
fn a_flow_between_two_ends_on_this_host_is_limited_by_the_host_not_a_network() {
    // Busy the whole second, windows never limiting: `network` between hosts.
    let flow = |local: [u8; 4], remote: [u8; 4], rwnd_limited_us| {
        let mut t = FlowTable::default();
        let mut s = sock(1, 100, 0, 0);
        (s.local, s.remote) = (IpAddr::from(local), IpAddr::from(remote));
        t.update(7, secs(10.0), vec![s.clone()]);
        s.info.bytes_acked = 1_000_000_000;
        s.info.busy_us = 1_000_000;
        s.info.rwnd_limited_us = rwnd_limited_us;
        t.update(7, secs(11.0), vec![s]).remove(0).limiter()
    };
    assert_eq!(flow([10, 0, 0, 1], [10, 0, 0, 2], 0), Limiter::Network);
    assert_eq!(flow([127, 0, 0, 1], [127, 0, 0, 1], 0), Limiter::Host);
    assert_eq!(flow([10, 0, 0, 1], [10, 0, 0, 1], 0), Limiter::Host);
    // A window still says what it says on loopback: the reader is slow.
    assert_eq!(
        flow([127, 0, 0, 1], [127, 0, 0, 1], 900_000),
        Limiter::Receiver
    );
}

fn secs(s: f64) -> Duration {
    Duration::from_secs_f64(s)
}

#[test]
fn first_dump_is_a_baseline_then_deltas_over_the_measured_interval() {
    let mut t = FlowTable::default();
    assert!(
        t.update(7, secs(10.0), vec![sock(1, 100, 5_000_000, 900_000)])
            .is_empty()
    );
    let out = t.update(7, secs(11.25), vec![sock(1, 100, 15_000_000, 2_000_000)]);
    assert_eq!(out.len(), 1);
    let d = &out[0];
    assert_eq!(d.interval, secs(1.25));
    assert_eq!(
        d.delta,
        Counters {
            bytes_acked: 10_000_000,
            bytes_received: 100_000,
            busy_us: 1_100_000,
            rwnd_limited_us: 275_000,
            sndbuf_limited_us: 0,
            retrans_segs: 10,
            data_segs_out: 0,
        }
    );
    // The end-of-interval state is the new dump's.
    assert_eq!(d.socket.info.bytes_acked, 15_000_000);
    assert_eq!(d.limiter(), Limiter::Network);
    // 10 MB in 1.25 s is 64 Mbit/s: bulk at 64, not above.
    assert!(d.is_bulk(64e6 / 8.0));
    assert!(!d.is_bulk(64.1e6 / 8.0));
}

#[test]
fn a_new_socket_in_a_known_namespace_only_sets_its_baseline() {
    let mut t = FlowTable::default();
    t.update(7, secs(0.0), vec![sock(1, 100, 0, 0)]);
    let out = t.update(
        7,
        secs(1.0),
        vec![sock(1, 100, 10, 0), sock(2, 101, 50_000_000, 1)],
    );
    assert_eq!(out.iter().map(|d| d.socket.cookie).collect::<Vec<_>>(), [1]);
    let out = t.update(7, secs(2.0), vec![sock(2, 101, 60_000_000, 2)]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].delta.bytes_acked, 10_000_000);
}

#[test]
fn a_socket_that_disappears_is_pruned() {
    let mut t = FlowTable::default();
    t.update(7, secs(0.0), vec![sock(1, 100, 0, 0), sock(2, 101, 0, 0)]);
    assert_eq!(t.len(), 2);
    t.update(7, secs(1.0), vec![sock(2, 101, 10, 0)]);
    assert_eq!(t.len(), 1);
    // Back again (the same cookie cannot come back in a real kernel): a baseline, not a delta.
    let out = t.update(7, secs(2.0), vec![sock(1, 100, 99, 0), sock(2, 101, 20, 0)]);
    assert_eq!(out.iter().map(|d| d.socket.cookie).collect::<Vec<_>>(), [2]);
}

#[test]
fn a_reused_inode_is_a_new_socket_not_a_negative_delta() {
    let mut t = FlowTable::default();
    t.update(7, secs(0.0), vec![sock(1, 100, 90_000_000, 5_000_000)]);
    // Socket 1 closed; a new connection got inode 100 with small counters.
    let out = t.update(7, secs(1.0), vec![sock(2, 100, 1_000, 10)]);
    assert!(out.is_empty(), "{out:?}");
    let out = t.update(7, secs(2.0), vec![sock(2, 100, 2_000_000, 500_000)]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].delta.bytes_acked, 1_999_000);
}

#[test]
fn a_counter_going_backwards_gives_no_record_and_a_new_baseline() {
    let mut t = FlowTable::default();
    t.update(7, secs(0.0), vec![sock(1, 100, 90_000_000, 5_000_000)]);
    // Same cookie, smaller counters: impossible for one socket, so not trusted.
    let mut odd = sock(1, 100, 1_000, 10);
    odd.info.busy_us = 6_000_000;
    assert!(t.update(7, secs(1.0), vec![odd]).is_empty());
    let out = t.update(7, secs(2.0), vec![sock(1, 100, 3_000, 6_000_000)]);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0].delta.bytes_acked, 2_000);
    assert_eq!(out[0].delta.busy_us, 0);
}

#[test]
fn an_accepted_socket_keeps_its_baseline_when_it_gets_an_inode() {
    let mut t = FlowTable::default();
    t.update(
        7,
        secs(0.0),
        vec![sock(1, 0, 1_000, 0), sock(2, 0, 2_000, 0)],
    );
    let out = t.update(
        7,
        secs(1.0),
        vec![sock(1, 555, 11_000, 0), sock(2, 0, 2_500, 0)],
    );
    assert_eq!(out.len(), 2);
    assert_eq!((out[0].socket.ino, out[0].delta.bytes_acked), (555, 10_000));
    assert_eq!((out[1].socket.ino, out[1].delta.bytes_acked), (0, 500));
}

#[test]
fn namespaces_are_apart_and_forgotten_when_gone() {
    let mut t = FlowTable::default();
    t.update(7, secs(0.0), vec![sock(1, 100, 0, 0)]);
    t.update(8, secs(0.5), vec![sock(1, 100, 0, 0)]);
    let out = t.update(8, secs(1.0), vec![sock(1, 100, 10, 0)]);
    assert_eq!(out[0].interval, secs(0.5));
    t.retain_namespaces(&HashSet::from([8]));
    assert_eq!(t.len(), 1);
    // Namespace 7 comes back: a baseline again.
    assert!(t.update(7, secs(2.0), vec![sock(1, 100, 20, 0)]).is_empty());
}

#[test]
fn receive_only_and_zero_length_intervals_are_not_bulk() {
    let mut t = FlowTable::default();
    let mut rx = sock(1, 100, 0, 0);
    t.update(7, secs(0.0), vec![rx.clone()]);
    rx.info.bytes_received = 500_000_000;
    let out = t.update(7, secs(1.0), vec![rx]);
    assert!(!out[0].is_bulk(1.0));
    assert_eq!(out[0].limiter(), Limiter::Application);
    let same_instant = FlowDelta {
        interval: Duration::ZERO,
        ..out[0].clone()
    };
    assert!(!same_instant.is_bulk(0.0));
}

#[test]
fn a_socket_listed_twice_in_one_dump_gives_one_delta() {
    let mut t = FlowTable::default();
    t.update(7, secs(0.0), vec![sock(1, 100, 0, 0)]);
    let twice = vec![sock(1, 100, 5_000_000, 0), sock(1, 100, 5_000_000, 0)];
    assert_eq!(t.update(7, secs(1.0), twice).len(), 1);
}
