//! sock_diag: a dump of the established TCP sockets of one network namespace,
//! each with the kernel's `struct tcp_info` (INET_DIAG_INFO). Only the dump:
//! no payload is ever read.
//!
//! The request and the reply header (addresses, ports, inode, cookie) are
//! built and parsed by `netlink-packet-sock-diag`. The tcp_info attribute is
//! read here, field by field at the offsets of `include/uapi/linux/tcp.h`,
//! with its length checked, instead of with the crate's `TcpInfo` (feature
//! `rich_nlas`): that one refuses any tcp_info shorter than its full 232-byte
//! layout (kernel 5.4+) and then fails the socket's whole message, while the
//! nine fields used here exist since kernel 4.10 (192 bytes). A layout test
//! holds the offsets to `libc::tcp_info`, and a recorded dump to `ss`.

use std::net::IpAddr;

use netlink_packet_core::{Emitable, Parseable};
use netlink_packet_sock_diag::constants::{AF_INET, AF_INET6, IPPROTO_TCP, SOCK_DIAG_BY_FAMILY};
use netlink_packet_sock_diag::inet::nlas::Nla;
use netlink_packet_sock_diag::inet::{
    ExtensionFlags, InetRequest, InetResponse, SocketId, StateFlags,
};

use crate::host::netlink::{self, Transport};

/// The tcp_info fields a `tcp_flow` record needs, as the kernel counts them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TcpInfo {
    /// Smoothed RTT, µs (`tcpi_rtt`).
    pub rtt_us: u32,
    /// Congestion window, segments (`tcpi_snd_cwnd`).
    pub snd_cwnd: u32,
    /// Segments retransmitted over the connection's life (`tcpi_total_retrans`).
    pub total_retrans: u32,
    /// Bytes sent and acknowledged by the peer (`tcpi_bytes_acked`).
    pub bytes_acked: u64,
    /// Bytes received in order (`tcpi_bytes_received`).
    pub bytes_received: u64,
    /// Data segments sent, retransmissions included (`tcpi_data_segs_out`).
    pub data_segs_out: u32,
    /// The latest delivery-rate sample, bytes/s (`tcpi_delivery_rate`).
    pub delivery_rate: u64,
    /// Time with data in flight or queued to send, µs (`tcpi_busy_time`):
    /// counted in jiffies, so in steps of 1/HZ s.
    pub busy_us: u64,
    /// Of which limited by the receive window (`tcpi_rwnd_limited`), µs.
    pub rwnd_limited_us: u64,
    /// Of which limited by the send buffer (`tcpi_sndbuf_limited`), µs.
    pub sndbuf_limited_us: u64,
}

/// Byte offsets in `struct tcp_info` (include/uapi/linux/tcp.h; no padding
/// before any of these fields on any ABI Linux supports).
mod offset {
    pub const RTT: usize = 68;
    pub const SND_CWND: usize = 80;
    pub const TOTAL_RETRANS: usize = 100;
    pub const BYTES_ACKED: usize = 120;
    pub const BYTES_RECEIVED: usize = 128;
    pub const DATA_SEGS_OUT: usize = 156;
    pub const DELIVERY_RATE: usize = 160;
    pub const BUSY_TIME: usize = 168;
    pub const RWND_LIMITED: usize = 176;
    pub const SNDBUF_LIMITED: usize = 184;
    /// The end of `tcpi_sndbuf_limited`: the shortest tcp_info we can use.
    pub const MIN_LEN: usize = 192;
}

impl TcpInfo {
    /// Reads the INET_DIAG_INFO attribute's value. None when it is shorter than
    /// the fields we need (a kernel before 4.10).
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() < offset::MIN_LEN {
            return None;
        }
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        Some(Self {
            rtt_us: u32_at(offset::RTT),
            snd_cwnd: u32_at(offset::SND_CWND),
            total_retrans: u32_at(offset::TOTAL_RETRANS),
            bytes_acked: u64_at(offset::BYTES_ACKED),
            bytes_received: u64_at(offset::BYTES_RECEIVED),
            data_segs_out: u32_at(offset::DATA_SEGS_OUT),
            delivery_rate: u64_at(offset::DELIVERY_RATE),
            busy_us: u64_at(offset::BUSY_TIME),
            rwnd_limited_us: u64_at(offset::RWND_LIMITED),
            sndbuf_limited_us: u64_at(offset::SNDBUF_LIMITED),
        })
    }
}

/// One established TCP socket from the dump.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TcpSocket {
    /// Local and remote ends; an IPv4-mapped IPv6 address is given as IPv4.
    pub local: IpAddr,
    pub sport: u16,
    pub remote: IpAddr,
    pub dport: u16,
    /// The socket's inode (0 for a connection not yet accepted).
    pub ino: u64,
    /// The kernel's socket cookie: unique for the boot, never reused.
    pub cookie: u64,
    pub info: TcpInfo,
}

impl TcpSocket {
    /// Both ends on this host: a loopback address, or one of its own at both
    /// ends (which the kernel routes over loopback too).
    pub fn is_on_this_host(&self) -> bool {
        self.remote.is_loopback() || self.remote == self.local
    }
}

/// Why one socket of a dump could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Undecodable {
    /// The message did not parse (its text).
    Message(String),
    /// No INET_DIAG_INFO, or one shorter than [`offset::MIN_LEN`] (its length).
    TcpInfo(Option<usize>),
}

/// `inet_diag_req_v2` for every established TCP socket of `family`, with tcp_info.
pub fn request(family: u8) -> Vec<u8> {
    let req = InetRequest {
        family,
        protocol: IPPROTO_TCP,
        extensions: ExtensionFlags::INFO,
        states: StateFlags::ESTABLISHED,
        socket_id: if family == AF_INET6 {
            SocketId::new_v6()
        } else {
            SocketId::new_v4()
        },
    };
    let mut body = vec![0; req.buffer_len()];
    req.emit(&mut body);
    body
}

/// One reply message of the dump.
pub fn parse(payload: &[u8]) -> Result<TcpSocket, Undecodable> {
    let msg = InetResponse::parse(payload).map_err(|e| Undecodable::Message(e.to_string()))?;
    let raw = msg
        .nlas
        .iter()
        .find_map(|nla| match nla {
            Nla::TcpInfo(bytes) => Some(bytes.as_slice()),
            _ => None,
        })
        .ok_or(Undecodable::TcpInfo(None))?;
    let info = TcpInfo::parse(raw).ok_or(Undecodable::TcpInfo(Some(raw.len())))?;
    let id = &msg.header.socket_id;
    Ok(TcpSocket {
        local: unmap(id.source_address),
        sport: id.source_port,
        remote: unmap(id.destination_address),
        dport: id.destination_port,
        ino: u64::from(msg.header.inode),
        cookie: u64::from_ne_bytes(id.cookie),
        info,
    })
}

/// `::ffff:a.b.c.d` (a dual-stack socket's IPv4 peer) reads as a.b.c.d.
fn unmap(addr: IpAddr) -> IpAddr {
    match addr {
        IpAddr::V6(v6) => v6.to_ipv4_mapped().map_or(IpAddr::V6(v6), IpAddr::V4),
        v4 => v4,
    }
}

/// Dumps the established TCP sockets (IPv4, then IPv6) of the namespace the
/// transport's socket lives in, calling `each` with every one, or with why it
/// could not be read.
pub fn dump(
    transport: &mut impl Transport,
    each: &mut dyn FnMut(Result<TcpSocket, Undecodable>),
) -> Result<(), netlink::Error> {
    for family in [AF_INET, AF_INET6] {
        transport.request(SOCK_DIAG_BY_FAMILY, true, &request(family), &mut |m| {
            if m.kind == SOCK_DIAG_BY_FAMILY {
                each(parse(m.payload));
            }
            Ok(())
        })?;
    }
    Ok(())
}

#[cfg(test)]
#[path = "diag_tests.rs"]
mod tests;
