use std::collections::BTreeMap;
use std::mem::offset_of;
use std::net::Ipv4Addr;

use super::*;
use crate::host::netlink::{Each, feed};

/// A real dump (testdata/sock_diag_dump.hex): hex datagrams, one per line, and
/// `ss -tinHe` of the same sockets in `#` comments.
const DUMP: &str = include_str!("testdata/sock_diag_dump.hex");

fn datagrams() -> Vec<Vec<u8>> {
    crate::host::netlink::hex_datagrams(DUMP)
}

/// Answers the IPv4 request with the recorded IPv4 datagrams, the IPv6 one
/// with the rest (each family's answer ends with its DONE).
struct Recorded {
    datagrams: std::vec::IntoIter<Vec<u8>>,
    requests: Vec<Vec<u8>>,
}

impl Transport for Recorded {
    fn request(
        &mut self,
        kind: u16,
        dump: bool,
        body: &[u8],
        each: Each<'_>,
    ) -> Result<(), netlink::Error> {
        assert_eq!((kind, dump), (SOCK_DIAG_BY_FAMILY, true));
        self.requests.push(body.to_vec());
        for dg in self.datagrams.by_ref() {
            if feed(&dg, None, each)? {
                return Ok(());
            }
        }
        panic!("the recorded answer never completes");
    }
}

fn dumped() -> (Vec<TcpSocket>, Vec<Vec<u8>>) {
    let mut t = Recorded {
        datagrams: datagrams().into_iter(),
        requests: Vec::new(),
    };
    let mut sockets = Vec::new();
    dump(&mut t, &mut |s| {
        sockets.push(s.expect("every recorded socket decodes"))
    })
    .unwrap();
    (sockets, t.requests)
}

/// What `ss` printed for one socket: the fields it shows (absent means 0).
#[derive(Debug)]
struct Ss {
    local: String,
    remote: String,
    cookie: u64,
    fields: BTreeMap<String, String>,
}

impl Ss {
    fn num(&self, key: &str) -> u64 {
        self.fields.get(key).map_or(0, |v| v.parse().unwrap())
    }

    /// `busy:296ms`, `rwnd_limited:140ms(47.3%)`: whole milliseconds.
    fn ms(&self, key: &str) -> u64 {
        self.fields
            .get(key)
            .map_or(0, |v| v.split("ms").next().unwrap().parse().unwrap())
    }
}

/// ss's two lines per socket, from the comments of the testdata file.
fn ss_view() -> BTreeMap<u64, Ss> {
    let lines: Vec<&str> = DUMP
        .lines()
        .filter_map(|l| l.strip_prefix("#   "))
        .collect();
    let mut out = BTreeMap::new();
    for pair in lines.chunks(2) {
        let head: Vec<&str> = pair[0].split_whitespace().collect();
        let mut fields = BTreeMap::new();
        let words: Vec<&str> = pair[1].split_whitespace().collect();
        for (i, w) in words.iter().enumerate() {
            if let Some((k, v)) = w.split_once(':') {
                fields.insert(k.to_string(), v.to_string());
            } else if *w == "delivery_rate" {
                fields.insert(
                    w.to_string(),
                    words[i + 1].trim_end_matches("bps").to_string(),
                );
            }
        }
        let tag = |p: &str| head.iter().find_map(|w| w.strip_prefix(p)).unwrap();
        let ino: u64 = tag("ino:").parse().unwrap();
        let ss = Ss {
            local: head[2].to_string(),
            remote: head[3].to_string(),
            cookie: u64::from_str_radix(tag("sk:"), 16).unwrap(),
            fields,
        };
        out.insert(ino, ss);
    }
    out
}

/// `ss` brackets IPv6 and shows dual-stack peers as `[::ffff:a.b.c.d]`.
fn ss_addr(ip: IpAddr, port: u16, mapped: bool) -> String {
    match ip {
        IpAddr::V4(v4) if mapped => format!("[::ffff:{v4}]:{port}"),
        IpAddr::V4(v4) => format!("{v4}:{port}"),
        IpAddr::V6(v6) => format!("[{v6}]:{port}"),
    }
}

#[test]
fn the_recorded_dump_matches_what_ss_showed() {
    let (sockets, _) = dumped();
    let ss = ss_view();
    assert_eq!(sockets.len(), ss.len(), "one socket per ss entry");
    assert_eq!(sockets.len(), 12, "6 connections, both ends");
    for s in &sockets {
        let view = &ss[&s.ino];
        let mapped = view.local.starts_with("[::ffff:");
        assert_eq!(ss_addr(s.local, s.sport, mapped), view.local, "{s:?}");
        assert_eq!(ss_addr(s.remote, s.dport, mapped), view.remote, "{s:?}");
        assert_eq!(s.cookie, view.cookie, "{s:?}");
        let i = &s.info;
        assert_eq!(i.bytes_acked, view.num("bytes_acked"), "{view:?}");
        assert_eq!(i.bytes_received, view.num("bytes_received"), "{view:?}");
        assert_eq!(u64::from(i.snd_cwnd), view.num("cwnd"), "{view:?}");
        // `retrans:CURRENT/TOTAL`, shown when not zero.
        let total_retrans = view
            .fields
            .get("retrans")
            .map_or(0, |v| v.split('/').nth(1).unwrap().parse::<u64>().unwrap());
        assert_eq!(u64::from(i.total_retrans), total_retrans, "{view:?}");
        assert_eq!(i.busy_us / 1000, view.ms("busy"), "{view:?}");
        assert_eq!(
            i.rwnd_limited_us / 1000,
            view.ms("rwnd_limited"),
            "{view:?}"
        );
        assert_eq!(
            i.sndbuf_limited_us / 1000,
            view.ms("sndbuf_limited"),
            "{view:?}"
        );
        assert_eq!(i.delivery_rate * 8, view.num("delivery_rate"), "{view:?}");
        // ss shows the smoothed RTT in ms with 3 decimals: µs exactly.
        let rtt = view.fields["rtt"].split('/').next().unwrap();
        let rtt_us = (rtt.parse::<f64>().unwrap() * 1000.0).round() as u32;
        assert_eq!(i.rtt_us, rtt_us, "{view:?}");
    }
}

#[test]
fn the_recorded_dump_has_what_it_was_made_of() {
    let (sockets, _) = dumped();
    let client = |sent: u64, got: u64| {
        let found: Vec<&TcpSocket> = sockets
            .iter()
            .filter(|s| s.info.bytes_acked == sent + 1 && s.info.bytes_received == got)
            .collect();
        assert_eq!(found.len(), 1, "the client that sent {sent} and got {got}");
        found[0]
    };
    // Byte counts the capture program sent (a client's bytes_acked also
    // counts its SYN).
    let v4 = client(1_000_000, 12_345);
    assert_eq!(v4.local, IpAddr::V4(Ipv4Addr::LOCALHOST));
    let limited = client(2_000_000, 0);
    assert!(
        limited.info.rwnd_limited_us * 2 > limited.info.busy_us,
        "{limited:?}"
    );
    assert_eq!(client(65_536, 1).local, "::1".parse::<IpAddr>().unwrap());
    let small_sndbuf = client(1_000_000, 0);
    assert!(small_sndbuf.info.busy_us > 0, "{small_sndbuf:?}");
    // The dual-stack listener's side of the v4 client: reported as IPv4.
    let server = sockets
        .iter()
        .find(|s| s.info.bytes_received == 300_000)
        .unwrap();
    assert_eq!(server.remote, IpAddr::V4(Ipv4Addr::LOCALHOST));
    // Not accepted yet: no inode, but a cookie.
    let pending: Vec<&TcpSocket> = sockets.iter().filter(|s| s.ino == 0).collect();
    assert_eq!(pending.len(), 1);
    assert_ne!(pending[0].cookie, 0);
}

#[test]
fn requests_every_established_tcp_socket_with_tcp_info() {
    let (_, requests) = dumped();
    // struct inet_diag_req_v2 (linux/inet_diag.h), built by hand: family,
    // IPPROTO_TCP, 1 << (INET_DIAG_INFO - 1), pad, 1 << TCP_ESTABLISHED, and
    // an all-zero inet_diag_sockid (48 bytes).
    let expected = |family: u8| {
        let mut b = vec![family, 6, 1 << 1, 0];
        b.extend_from_slice(&(1u32 << 1).to_ne_bytes());
        b.extend_from_slice(&[0; 48]);
        b
    };
    assert_eq!(requests, [expected(2), expected(10)]);
}

#[test]
fn offsets_are_those_of_the_kernel_struct() {
    type T = libc::tcp_info;
    assert_eq!(offset_of!(T, tcpi_rtt), offset::RTT);
    assert_eq!(offset_of!(T, tcpi_snd_cwnd), offset::SND_CWND);
    assert_eq!(offset_of!(T, tcpi_total_retrans), offset::TOTAL_RETRANS);
    assert_eq!(offset_of!(T, tcpi_bytes_acked), offset::BYTES_ACKED);
    assert_eq!(offset_of!(T, tcpi_bytes_received), offset::BYTES_RECEIVED);
    assert_eq!(offset_of!(T, tcpi_delivery_rate), offset::DELIVERY_RATE);
    assert_eq!(offset_of!(T, tcpi_busy_time), offset::BUSY_TIME);
    assert_eq!(offset_of!(T, tcpi_rwnd_limited), offset::RWND_LIMITED);
    assert_eq!(offset_of!(T, tcpi_sndbuf_limited), offset::SNDBUF_LIMITED);
    assert_eq!(offset_of!(T, tcpi_delivered), offset::MIN_LEN);
}

#[test]
fn a_short_tcp_info_is_refused_not_misread() {
    let mut b = vec![0u8; offset::MIN_LEN];
    b[offset::SNDBUF_LIMITED..].copy_from_slice(&7u64.to_ne_bytes());
    b[offset::RTT..offset::RTT + 4].copy_from_slice(&250u32.to_ne_bytes());
    let info = TcpInfo::parse(&b).unwrap();
    assert_eq!((info.sndbuf_limited_us, info.rtt_us), (7, 250));
    assert_eq!(TcpInfo::parse(&b[..offset::MIN_LEN - 1]), None);
    assert_eq!(TcpInfo::parse(&[]), None);
}

#[test]
fn a_reply_without_usable_tcp_info_says_why() {
    // The first recorded socket, its INET_DIAG_INFO cut to 100 bytes.
    let dg = &datagrams()[0];
    let len = u32::from_ne_bytes(dg[..4].try_into().unwrap()) as usize;
    let payload = &dg[16..len];
    // inet_diag_msg is 72 bytes; then attributes (len u16, type u16, value).
    let mut cut = payload[..72].to_vec();
    let mut rest = &payload[72..];
    let mut info_len = None;
    while rest.len() >= 4 {
        let alen = u16::from_ne_bytes([rest[0], rest[1]]) as usize;
        let kind = u16::from_ne_bytes([rest[2], rest[3]]);
        if kind == 2 {
            info_len = Some(alen - 4);
            cut.extend_from_slice(&104u16.to_ne_bytes());
            cut.extend_from_slice(&2u16.to_ne_bytes());
            cut.extend_from_slice(&rest[4..104]);
        }
        rest = &rest[((alen + 3) & !3).min(rest.len())..];
    }
    assert!(info_len.unwrap() >= offset::MIN_LEN, "{info_len:?}");
    assert_eq!(parse(&cut).unwrap_err(), Undecodable::TcpInfo(Some(100)));
    assert_eq!(
        parse(&payload[..72]).unwrap_err(),
        Undecodable::TcpInfo(None)
    );
    assert!(matches!(
        parse(&payload[..40]),
        Err(Undecodable::Message(_))
    ));
}
