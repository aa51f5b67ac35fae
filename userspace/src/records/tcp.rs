//! The tcp family's records: `tcp_retransmit`, `tcp_rtt`, `tcp_flow`, each
//! naming its connection with one [`Connection`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use super::sql::SqlTag;
use crate::abi::{self, tcp_retransmit_event};
use crate::hist::HistogramRecord;
use crate::host::container::Container;

const AF_INET6: u16 = 10;

/// An address as the kernel keeps it (v4 in the first 4 bytes).
pub fn addr(family: u16, bytes: &[u8; 16]) -> IpAddr {
    if family == AF_INET6 {
        IpAddr::V6(Ipv6Addr::from(*bytes))
    } else {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    }
}

/// An address family.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "ip_family")]
pub enum IpFamily {
    Ipv4,
    Ipv6,
}

impl IpFamily {
    /// The family of a kernel `sa_family_t`.
    pub fn from_kernel(family: u16) -> Self {
        if family == AF_INET6 {
            Self::Ipv6
        } else {
            Self::Ipv4
        }
    }

    /// The family of an address.
    pub fn of(addr: &IpAddr) -> Self {
        if addr.is_ipv6() {
            Self::Ipv6
        } else {
            Self::Ipv4
        }
    }
}

/// A TCP connection as every TCP record names it, at the record's top level
/// (flattened): its network namespace, its address family, and its local
/// (`saddr`, `sport`) and remote (`daddr`, `dport`) ends. The addresses are
/// typed, so a record costs no allocation for them and a reader compares
/// them without parsing; on the wire they are text.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[schemars(deny_unknown_fields)]
pub struct Connection {
    /// Network namespace inode of the socket (`ls -Li /proc/PID/ns/net`, `stat -L
    /// /run/netns/NAME`).
    pub netns: u32,
    /// Address family.
    pub family: IpFamily,
    /// Local address. IP address, dotted quad or RFC 5952 IPv6 text; IPv4-mapped IPv6
    /// addresses are reported as IPv4.
    #[schemars(with = "String")]
    pub saddr: IpAddr,
    /// Local port.
    pub sport: u16,
    /// Remote address. IP address, dotted quad or RFC 5952 IPv6 text; IPv4-mapped IPv6
    /// addresses are reported as IPv4.
    #[schemars(with = "String")]
    pub daddr: IpAddr,
    /// Remote port.
    pub dport: u16,
}

impl Connection {
    /// A connection as the kernel's tuple gives it (`struct tuple`, sock.bpf.h:
    /// v4-mapped v6 already folded to v4).
    pub fn from_kernel(
        netns: u32,
        family: u16,
        saddr: &[u8; 16],
        sport: u16,
        daddr: &[u8; 16],
        dport: u16,
    ) -> Self {
        Self {
            netns,
            family: IpFamily::from_kernel(family),
            saddr: addr(family, saddr),
            sport,
            daddr: addr(family, daddr),
            dport,
        }
    }

    /// A connection from its two ends (the family is the local address's).
    pub fn new(netns: u32, local: SocketAddr, remote: SocketAddr) -> Self {
        Self {
            netns,
            family: IpFamily::of(&local.ip()),
            saddr: local.ip(),
            sport: local.port(),
            daddr: remote.ip(),
            dport: remote.port(),
        }
    }

    /// The local end.
    pub fn local(&self) -> SocketAddr {
        SocketAddr::new(self.saddr, self.sport)
    }

    /// The remote end.
    pub fn remote(&self) -> SocketAddr {
        SocketAddr::new(self.daddr, self.dport)
    }
}

/// `tcp_rtt`'s connection read from a line of any schema. Schema 1 and 2
/// keyed it without the local address and spelled the rest `peer`,
/// `peer_port`, `local_port`; such a line reads with `daddr`, `dport` and
/// `sport` from those and `saddr` the unspecified address of its family
/// (`0.0.0.0`, `::`): any local address, which is what its figures covered.
/// Here, in the type, so that every reader of the stream (the report, a
/// replayed recording) reads old streams alike, as `hist/record.rs` reads
/// schema 1's histograms.
fn rtt_connection<'de, D: Deserializer<'de>>(d: D) -> Result<Connection, D::Error> {
    #[derive(Deserialize)]
    struct AnySchema {
        netns: u32,
        family: IpFamily,
        saddr: Option<IpAddr>,
        sport: Option<u16>,
        daddr: Option<IpAddr>,
        dport: Option<u16>,
        peer: Option<IpAddr>,
        peer_port: Option<u16>,
        local_port: Option<u16>,
    }
    let a = AnySchema::deserialize(d)?;
    let missing = |field| serde::de::Error::missing_field(field);
    let c = match (a.daddr, a.peer) {
        (Some(daddr), _) => Connection {
            netns: a.netns,
            family: a.family,
            saddr: a.saddr.ok_or_else(|| missing("saddr"))?,
            sport: a.sport.ok_or_else(|| missing("sport"))?,
            daddr,
            dport: a.dport.ok_or_else(|| missing("dport"))?,
        },
        (None, Some(peer)) => Connection {
            netns: a.netns,
            family: a.family,
            saddr: match a.family {
                IpFamily::Ipv4 => Ipv4Addr::UNSPECIFIED.into(),
                IpFamily::Ipv6 => Ipv6Addr::UNSPECIFIED.into(),
            },
            sport: a.local_port.ok_or_else(|| missing("local_port"))?,
            daddr: peer,
            dport: a.peer_port.ok_or_else(|| missing("peer_port"))?,
        },
        (None, None) => return Err(missing("daddr")),
    };
    Ok(c)
}

/// include/net/tcp_states.h
pub fn state_name(state: u8) -> &'static str {
    match state {
        1 => "ESTABLISHED",
        2 => "SYN_SENT",
        3 => "SYN_RECV",
        4 => "FIN_WAIT1",
        5 => "FIN_WAIT2",
        6 => "TIME_WAIT",
        7 => "CLOSE",
        8 => "CLOSE_WAIT",
        9 => "LAST_ACK",
        10 => "LISTEN",
        11 => "CLOSING",
        12 => "NEW_SYN_RECV",
        _ => "UNKNOWN",
    }
}

/// enum tcp_ca_state
pub fn ca_state_name(state: u8) -> &'static str {
    match state {
        0 => "open",
        1 => "disorder",
        2 => "cwr",
        3 => "recovery",
        4 => "loss",
        _ => "unknown",
    }
}

/// What sent a retransmission.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "retransmit_kind")]
pub enum RetransmitKind {
    /// The retransmission timer, or an ACK during the loss recovery it started (TCP_CA_Loss).
    Rto,
    /// Fast retransmit (duplicate ACKs, SACK, RACK).
    Fast,
    /// A tail loss probe.
    Tlp,
    /// A SYN or SYN-ACK sent again.
    Syn,
    /// A kind this build does not know (from the kernel, or a newer stream).
    #[serde(other)]
    Unknown,
}

impl RetransmitKind {
    /// The kind of an `enum tcp_retx_kind` value (abi.h).
    pub fn from_kernel(kind: u8) -> Self {
        match u32::from(kind) {
            abi::TCP_RETX_RTO => Self::Rto,
            abi::TCP_RETX_FAST => Self::Fast,
            abi::TCP_RETX_TLP => Self::Tlp,
            abi::TCP_RETX_SYN => Self::Syn,
            _ => Self::Unknown,
        }
    }

    /// The name the records use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Rto => "rto",
            Self::Fast => "fast",
            Self::Tlp => "tlp",
            Self::Syn => "syn",
            Self::Unknown => "unknown",
        }
    }
}

/// What held a flow's sending back most in an interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "limiter")]
pub enum Limiter {
    /// The congestion window: bandwidth, loss, queueing on the path.
    Network,
    /// The peer's receive window: the receiver does not read fast enough.
    Receiver,
    /// The local send buffer: all written data was sent and the application
    /// waited for buffer space while the window had room.
    SenderBuffer,
    /// Nothing in flight for most of the interval: the application had
    /// nothing to send.
    Application,
    /// Both ends are on this host (loopback, or an address of its own): no
    /// network lies between them, so a window that kept it busy says nothing
    /// of a network; the host's CPU and memory set its pace. Said where the
    /// rule would otherwise say `network`.
    Host,
}

impl Limiter {
    /// The name the records use.
    pub fn name(self) -> &'static str {
        match self {
            Limiter::Network => "network",
            Limiter::Receiver => "receiver",
            Limiter::SenderBuffer => "sender_buffer",
            Limiter::Application => "application",
            Limiter::Host => "host",
        }
    }
}

/// One TCP retransmission, or an attempt that did not go out (`err` != 0), as it happens: sent
/// through the ring buffer, drops counted in `lost` as `tcp.retransmit_ringbuf_full`. `kind` is
/// decided from the kernel's own state at the retransmit, not from timing.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct TcpRetransmitRecord {
    #[serde(flatten)]
    pub connection: Connection,
    /// TCP state of the connection (SYN_RECV for a SYN-ACK retransmit).
    pub state: String,
    /// Why it was sent again: `rto` in loss recovery after the retransmission timer fired
    /// (TCP_CA_Loss); `fast` fast retransmit/recovery (dupacks, SACK, RACK); `tlp` tail loss
    /// probe; `syn` a SYN or SYN-ACK sent again.
    pub kind: RetransmitKind,
    /// Sent by the retransmission timer itself: exactly one per RTO expiry (the kernel's
    /// TCPTimeouts). The rest of an RTO's retransmissions follow from ACKs while in loss recovery
    /// (kind `rto`, timer false: the kernel's TCPSlowStartRetrans).
    pub timer: bool,
    /// A SYN-ACK for a connection not yet accepted (a listener's retransmit).
    pub synack: bool,
    /// Congestion-avoidance state at the retransmit.
    pub ca_state: String,
    /// Segments the retransmission carries (one event can carry many under GSO/TSO).
    pub segs: u32,
    /// Bytes it carries (the skb length).
    pub bytes: u32,
    /// Sequence number of its first byte.
    pub seq: u32,
    /// 0 when it went out. Otherwise the kernel's result: negative errno for an attempt that
    /// stopped early (-16 EBUSY: the previous copy was still queued on the host; not counted) or
    /// whose send failed (-1 EPERM: dropped by a local filter; counted), or a positive NET_XMIT
    /// code (1: the local qdisc dropped it; counted).
    pub err: i32,
    /// Whether the kernel counted its `segs` in RetransSegs (/proc/net/snmp): the sum of `segs`
    /// over counted records is the namespace's RetransSegs increase.
    pub counted: bool,
    /// The retransmission timeout in force, in milliseconds (converted from jiffies with
    /// `start.kernel_hz`). At a timer retransmit: the timeout that just expired.
    #[schemars(range(min = 0))]
    pub rto_ms: f64,
    /// RTO doublings before this retransmit (icsk_backoff).
    pub backoff: u8,
    /// Consecutive timeouts so far (icsk_retransmits); for a SYN-ACK, how many times it was sent
    /// again.
    pub retransmits: u8,
    /// The connection's smoothed RTT, in microseconds (0 before the first sample).
    pub srtt_us: u32,
    /// Milliseconds since this loss episode's first retransmission (or, before the connection is
    /// established, since the first SYN): how long the flow has been stuck. Absent when not in an
    /// episode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalled_ms: Option<u32>,
    /// For a tail-loss probe: how long its flight had gone unacknowledged when the probe went
    /// out, in milliseconds (since the flight was sent from idle, or since the send of the last
    /// segment acknowledged). About two round trips, and 200 ms more when one segment is in
    /// flight: a lost single-segment response waits this long, with no timeout counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub probe_after_ms: Option<f64>,
    /// Process (thread group) that owns the socket: the last to send or receive on it, or the one
    /// that connected or listened. Absent when unknown.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Thread of that process.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    /// Command name of that thread.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// Inode of the socket, as in /proc/PID/fd (`socket:[N]`) and `ss -e`. Absent for a SYN-ACK
    /// (no socket yet) or an orphaned socket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sock_ino: Option<u64>,
    /// The SQL Server session the connection is, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlTag>,
    /// On a SQL Server session whose requests are timed: whether the segment
    /// was data of the response to the request then open, i.e. whether the
    /// client waited for this retransmission. Absent where no request was
    /// open: before the session's first timed request (the login's first
    /// answer, a connection older than the run) and after it left
    /// ESTABLISHED.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_up_response: Option<bool>,
    /// With `held_up_response`: how long that request had waited, since its
    /// first byte arrived, when the segment went out (ms).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_waited_ms: Option<f64>,
}

impl TcpRetransmitRecord {
    pub fn from_event(e: &tcp_retransmit_event, hz: u32) -> Self {
        let flag = |f: u32| e.flags & f != 0;
        let owner = flag(abi::TCP_RETX_F_OWNER);
        let comm_len = e.comm.iter().position(|&c| c == 0).unwrap_or(e.comm.len());
        let comm: Vec<u8> = e.comm[..comm_len].iter().map(|&c| c as u8).collect();
        Self {
            connection: Connection::from_kernel(
                e.netns, e.family, &e.saddr, e.sport, &e.daddr, e.dport,
            ),
            state: state_name(e.state).to_string(),
            kind: RetransmitKind::from_kernel(e.retx_kind),
            timer: flag(abi::TCP_RETX_F_TIMER),
            synack: flag(abi::TCP_RETX_F_SYNACK),
            ca_state: ca_state_name(e.ca_state).to_string(),
            segs: e.segs,
            bytes: e.bytes,
            seq: e.seq,
            err: e.err,
            counted: flag(abi::TCP_RETX_F_COUNTED),
            rto_ms: (f64::from(e.rto_jiffies) * 1000.0 / f64::from(hz) * 1000.0).round() / 1000.0,
            backoff: e.backoff,
            retransmits: e.retransmits,
            srtt_us: e.srtt_us,
            stalled_ms: flag(abi::TCP_RETX_F_EPISODE).then_some(e.stalled_ms),
            probe_after_ms: flag(abi::TCP_RETX_F_PROBE)
                .then(|| f64::from(e.probe_after_us / 10) / 100.0),
            pid: owner.then_some(e.tgid),
            tid: owner.then_some(e.pid),
            comm: owner.then(|| String::from_utf8_lossy(&comm).into_owned()),
            sock_ino: (e.sock_ino != 0).then_some(e.sock_ino),
            sql: None,
            held_up_response: None,
            request_waited_ms: None,
        }
    }
}

/// One TCP connection (a peer: network namespace, local and remote address and port) over one
/// interval, for connections that had RTT samples or retransmits in it. Aggregated in the kernel
/// in a bounded table (1024 peers; the least recently active give way).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct TcpRttRecord {
    #[serde(flatten, deserialize_with = "rtt_connection")]
    pub connection: Connection,
    /// Measured length of the interval, in milliseconds.
    pub interval_ms: u64,
    /// The kernel's smoothed RTT (srtt), in microseconds, sampled at the socket's send and
    /// receive calls: at most one sample per call, and only when an ACK of new data (the only
    /// thing that moves the estimate) came since the socket's previous sample; a socket that
    /// only receives has none. It leaves out the applications' own wakeups: a request/response
    /// round trip seen by the application is longer.
    pub srtt_us: HistogramRecord,
    /// Retransmission events in the interval (attempts that did not go out included).
    pub retransmits: u64,
    /// Segments retransmitted that the kernel counted (RetransSegs).
    pub retrans_segs: u64,
    /// Retransmission timer expiries (each one a stall of at least the RTO).
    pub rtos: u64,
    /// Fast retransmits that went out.
    pub fast_retransmits: u64,
    /// Tail loss probes that went out.
    pub tail_loss_probes: u64,
    /// SYN and SYN-ACK retransmits that went out.
    pub syn_retransmits: u64,
    /// The peer table was full during the interval: peers were evicted and their figures since
    /// the last interval are lost (counted in `lost` as `tcp.peer_table_evicted`).
    pub peer_table_full: bool,
    /// The SQL Server session this peer is, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlTag>,
}

/// A bulk TCP flow and what limited it in one interval, from the kernel's own accounting of the
/// socket (tcp_info via sock_diag: busy, receive-window-limited and send-buffer-limited time).
/// One per established socket that sent at least `--bulk-mbps` (acknowledged by the peer) in the
/// interval, in every watched network namespace. Only the sending end gets one: the busy and
/// limited times describe a socket's sending. A connection's first interval (before a first
/// reading of its counters) gives none.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct TcpFlowRecord {
    #[serde(flatten)]
    pub connection: Connection,
    /// Socket inode (as in /proc/PID/fd and `ss -e`); absent for a connection not accepted yet
    /// (no inode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sock_ino: Option<u64>,
    /// Measured time between the two readings of the socket's counters, ms.
    pub interval_ms: u64,
    /// Bytes sent and acknowledged by the peer in the interval (tcpi_bytes_acked delta).
    pub bytes_acked: u64,
    /// Bytes received in the interval (tcpi_bytes_received delta).
    pub bytes_received: u64,
    /// `bytes_acked` as Mbit/s over the interval (`interval_ms`).
    #[schemars(range(min = 0))]
    pub send_mbps: f64,
    /// The kernel's latest delivery-rate sample at the end of the interval (tcpi_delivery_rate),
    /// Mbit/s: what the path delivered over the last round trip with data to send, the rate the
    /// congestion control sees.
    #[schemars(range(min = 0))]
    pub delivery_mbps: f64,
    /// Time with data in flight or waiting to be sent in the interval (tcpi_busy_time delta).
    /// The kernel counts it in ticks (4 ms at HZ 250), and the limited times below are part of
    /// it.
    #[schemars(range(min = 0))]
    pub busy_ms: f64,
    /// Of which limited by the receiver's window (tcpi_rwnd_limited delta).
    #[schemars(range(min = 0))]
    pub rwnd_limited_ms: f64,
    /// Of which limited by the send buffer (tcpi_sndbuf_limited delta).
    #[schemars(range(min = 0))]
    pub sndbuf_limited_ms: f64,
    /// Segments retransmitted in the interval (tcpi_total_retrans delta).
    pub retrans_segs: u64,
    /// Data segments sent in the interval, retransmissions included (tcpi_data_segs_out
    /// delta): `retrans_segs` over it is the share the path lost. Absent in streams written
    /// before it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_segs_out: Option<u64>,
    /// Smoothed RTT at the end of the interval (tcpi_rtt), µs.
    #[schemars(range(min = 0))]
    pub srtt_us: f64,
    /// Congestion window at the end of the interval, segments.
    pub cwnd: u32,
    /// What held it back most: `receiver` (rwnd-limited ≥ half the busy time: the peer does not
    /// read as fast as this host sends), `sender_buffer` (sndbuf-limited ≥ half: all written data
    /// was sent and the application waited for send-buffer space, a buffer too small for the
    /// path), `application` (busy less than half the interval, or never busy: the sender had
    /// nothing to send, e.g. it reads from a slow disk), else `network` (the congestion window:
    /// bandwidth, loss, queueing), or `host` for a flow whose both ends are on this host
    /// (loopback: no network between them, the CPU sets its pace).
    pub limiter: Limiter,
    /// The processes holding the socket open (from /proc/PID/fd, at most 8), on a flow whose
    /// `limiter` is `application`: what feeds it. Stall detection ties the flow to a disk these
    /// processes did slow I/O on. Absent otherwise, or when none was found.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
    /// The container of the first of `pids`, from its cgroup; absent outside containers or
    /// without `pids`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
    /// The SQL Server session (availability-group replica, backup) it belongs to, when it does.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlTag>,
}

#[cfg(test)]
#[path = "tcp_tests.rs"]
mod tests;
