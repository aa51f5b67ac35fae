//! The tcp family's JSON records (schema v1: `tcp_retransmit`, `tcp_rtt`, `tcp_flow`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use serde::Serialize;

use crate::abi::{self, tcp_retransmit_event};
use crate::hist::HistogramRecord;
use crate::sqlserver::record::SqlTag;

const AF_INET6: u16 = 10;

/// An address as the kernel keeps it (v4 in the first 4 bytes).
pub fn addr(family: u16, bytes: &[u8; 16]) -> IpAddr {
    if family == AF_INET6 {
        IpAddr::V6(Ipv6Addr::from(*bytes))
    } else {
        IpAddr::V4(Ipv4Addr::new(bytes[0], bytes[1], bytes[2], bytes[3]))
    }
}

pub fn family_name(family: u16) -> &'static str {
    if family == AF_INET6 { "ipv6" } else { "ipv4" }
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

pub fn kind_name(kind: u8) -> &'static str {
    match u32::from(kind) {
        abi::TCP_RETX_RTO => "rto",
        abi::TCP_RETX_FAST => "fast",
        abi::TCP_RETX_TLP => "tlp",
        abi::TCP_RETX_SYN => "syn",
        _ => "unknown",
    }
}

/// One retransmission (or an attempt that did not go out: `err` != 0).
#[derive(Clone, Debug, Serialize)]
pub struct TcpRetransmitRecord {
    pub netns: u32,
    pub family: &'static str,
    pub saddr: String,
    pub sport: u16,
    pub daddr: String,
    pub dport: u16,
    pub state: &'static str,
    /// `rto`, `fast`, `tlp` or `syn`.
    pub kind: &'static str,
    /// Sent by the retransmission timer itself (one per timeout); the rest of an RTO's
    /// retransmissions follow from ACKs while in loss recovery.
    pub timer: bool,
    /// A SYN-ACK of a connection not yet accepted.
    pub synack: bool,
    pub ca_state: &'static str,
    pub segs: u32,
    pub bytes: u32,
    pub seq: u32,
    /// 0 when it went out; negative errno or positive NET_XMIT code otherwise.
    pub err: i32,
    /// Whether the kernel counted its segments in RetransSegs.
    pub counted: bool,
    pub rto_ms: f64,
    pub backoff: u8,
    pub retransmits: u8,
    pub srtt_us: u32,
    /// Since this loss episode's first retransmission (or since the first SYN).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalled_ms: Option<u32>,
    /// The socket owner: the process that last sent or received on it (or connected/listened).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tid: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub comm: Option<String>,
    /// Inode of the socket (as in /proc/PID/fd and `ss -e`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sock_ino: Option<u64>,
    /// The SQL Server session the connection is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlTag>,
}

impl TcpRetransmitRecord {
    pub fn from_event(e: &tcp_retransmit_event, hz: u32) -> Self {
        let flag = |f: u32| e.flags & f != 0;
        let owner = flag(abi::TCP_RETX_F_OWNER);
        let comm_len = e.comm.iter().position(|&c| c == 0).unwrap_or(e.comm.len());
        let comm: Vec<u8> = e.comm[..comm_len].iter().map(|&c| c as u8).collect();
        Self {
            netns: e.netns,
            family: family_name(e.family),
            saddr: addr(e.family, &e.saddr).to_string(),
            sport: e.sport,
            daddr: addr(e.family, &e.daddr).to_string(),
            dport: e.dport,
            state: state_name(e.state),
            kind: kind_name(e.retx_kind),
            timer: flag(abi::TCP_RETX_F_TIMER),
            synack: flag(abi::TCP_RETX_F_SYNACK),
            ca_state: ca_state_name(e.ca_state),
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
            pid: owner.then_some(e.tgid),
            tid: owner.then_some(e.pid),
            comm: owner.then(|| String::from_utf8_lossy(&comm).into_owned()),
            sock_ino: (e.sock_ino != 0).then_some(e.sock_ino),
            sql: None,
        }
    }
}

/// One peer (remote address and port, local port, network namespace), one interval.
#[derive(Clone, Debug, Serialize)]
pub struct TcpRttRecord {
    pub netns: u32,
    pub family: &'static str,
    pub peer: String,
    pub peer_port: u16,
    pub local_port: u16,
    pub interval_ms: u64,
    /// The kernel's smoothed RTT, sampled at the socket's send and receive
    /// calls: at most one sample per call, and only after an ACK of new data
    /// (the only time the estimate moves) since the socket's last sample.
    pub srtt_us: HistogramRecord,
    /// Retransmission events (attempts included) and the segments the kernel counted.
    pub retransmits: u64,
    pub retrans_segs: u64,
    /// Retransmission timer expiries (each one an RTO stall).
    pub rtos: u64,
    pub fast_retransmits: u64,
    pub tail_loss_probes: u64,
    pub syn_retransmits: u64,
    /// The peer table was full in this interval: some peers' figures were dropped (see `lost`).
    pub peer_table_full: bool,
    /// The SQL Server session this peer is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlTag>,
}

/// One bulk TCP flow (it sent at least `--bulk-mbps`), one interval: what
/// limited it, from the kernel's tcp_info (the socket's own accounting).
#[derive(Clone, Debug, Serialize)]
pub struct TcpFlowRecord {
    pub netns: u32,
    pub family: &'static str,
    pub saddr: String,
    pub sport: u16,
    pub daddr: String,
    pub dport: u16,
    /// Absent for a connection not accepted yet (no inode).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sock_ino: Option<u64>,
    /// Between the two readings of the socket's counters.
    pub interval_ms: u64,
    pub bytes_acked: u64,
    pub bytes_received: u64,
    /// `bytes_acked` as Mbit/s over `interval_ms`.
    pub send_mbps: f64,
    /// The kernel's latest delivery-rate sample at the end, Mbit/s.
    pub delivery_mbps: f64,
    /// Time with data in flight (kernel ticks: steps of 1/HZ).
    pub busy_ms: f64,
    pub rwnd_limited_ms: f64,
    pub sndbuf_limited_ms: f64,
    pub retrans_segs: u64,
    pub srtt_us: f64,
    pub cwnd: u32,
    /// `network`, `receiver`, `sender_buffer` or `application`.
    pub limiter: &'static str,
    /// The processes holding the socket open (from /proc/PID/fd), for a flow
    /// whose sender had nothing to send (`limiter` `application`): what feeds it.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
    /// The SQL Server session the connection is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlTag>,
}

#[cfg(test)]
mod tests {
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
            (r.saddr.as_str(), r.daddr.as_str()),
            ("10.200.0.1", "10.200.0.2")
        );
        assert_eq!(
            (r.kind, r.state, r.ca_state),
            ("rto", "ESTABLISHED", "loss")
        );
        assert!(r.timer && r.counted && !r.synack);
        assert_eq!(r.rto_ms, 800.0);
        assert_eq!(r.stalled_ms, Some(1400));
        assert_eq!((r.pid, r.comm.as_deref()), (Some(7), Some("sqlservr")));
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
        assert_eq!(r.daddr, "fd00:5700::2");
        assert_eq!(r.family, "ipv6");
        assert_eq!((r.pid, r.comm.clone(), r.stalled_ms), (None, None, None));
    }
}
