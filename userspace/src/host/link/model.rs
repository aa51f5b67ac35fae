//! What one reading of one interface holds, and how it serializes.

use serde::{Serialize, Serializer};

use super::delta::since;

/// What a driver may or may not report. Serializes as the value, or as the
/// string `"not exposed"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Exposed<T> {
    Value(T),
    NotExposed,
}

/// How [`Exposed::NotExposed`] reads in JSON.
pub const NOT_EXPOSED: &str = "not exposed";

impl<T> Exposed<T> {
    pub fn value(&self) -> Option<&T> {
        match self {
            Exposed::Value(v) => Some(v),
            Exposed::NotExposed => None,
        }
    }
}

impl<T> From<Option<T>> for Exposed<T> {
    fn from(v: Option<T>) -> Self {
        v.map_or(Exposed::NotExposed, Exposed::Value)
    }
}

impl<T: Serialize> Serialize for Exposed<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Exposed::Value(v) => v.serialize(s),
            Exposed::NotExposed => s.serialize_str(NOT_EXPOSED),
        }
    }
}

/// One interface, one reading. Counters are the kernel's running totals;
/// [`delta`](super::delta()) turns two readings into the change over the interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct LinkHealth {
    /// Interface index in its network namespace (changes when re-created).
    /// Not serialized: the `netdev` record that carries a reading has it.
    #[serde(skip)]
    pub ifindex: u32,
    /// Interface name (IFLA_IFNAME); not serialized, as `ifindex`.
    #[serde(skip)]
    pub name: String,
    /// RFC 2863 operational state (IFLA_OPERSTATE): `up`, `down`,
    /// `lowerlayerdown`, `dormant`, `testing`, `notpresent` or `unknown`
    /// (what virtual devices without carrier handling report, e.g. `lo`).
    pub oper_state: String,
    /// Whether the device sees a carrier (IFLA_CARRIER). Meaningful only
    /// while the interface is administratively up: a down device keeps
    /// whatever it had.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier: Option<bool>,
    /// Carrier up + down transitions since the device was created
    /// (IFLA_CARRIER_CHANGES). A flapping link shows here.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub carrier_changes: Option<u64>,
    /// Link speed (ethtool LINKMODES: ETHTOOL_A_LINKMODES_SPEED), Mb/s.
    pub speed_mbps: Exposed<u32>,
    /// `full` or `half` (ETHTOOL_A_LINKMODES_DUPLEX). Half duplex on a
    /// switched link is the classic duplex mismatch.
    pub duplex: Exposed<String>,
    /// Whether speed and duplex are auto-negotiated (ETHTOOL_A_LINKMODES_AUTONEG).
    pub autoneg: Exposed<bool>,
    /// Interface counters (IFLA_STATS64).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub counters: Option<LinkCounters>,
    /// Flow-control settings and PAUSE frame counts (ethtool PAUSE_GET).
    pub pause: Exposed<PauseCounters>,
    /// The root qdisc: the queue in front of the driver. Absent when the
    /// device has none the kernel reports (a down device keeps the built-in
    /// `noop`, which is never dumped).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub qdisc: Option<QdiscStats>,
}

/// Declares [`LinkCounters`] from the `struct rtnl_link_stats64` fields it
/// keeps, each with its index in that struct (u64s, <linux/if_link.h>;
/// kernels append fields, never move them), so the layout, the parser and
/// the delta cannot disagree.
macro_rules! link_counters {
    ($($(#[$doc:meta])* $name:ident = $index:literal,)*) => {
        /// `struct rtnl_link_stats64` (IFLA_STATS64): the counters `ip -s
        /// link` shows. Running totals since the device was created, except
        /// in a [`delta`](super::delta()).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
        pub struct LinkCounters {
            $($(#[$doc])* pub $name: u64,)*
        }

        impl LinkCounters {
            /// Every field kept exists since Linux 4.6, so a payload too short
            /// for one is malformed: nothing is zero-filled.
            pub(super) fn parse(v: &[u8]) -> Option<Self> {
                let f = |i: usize| v.get(i * 8..i * 8 + 8).map(|b| u64::from_ne_bytes(b.try_into().unwrap()));
                Some(Self { $($name: f($index)?,)* })
            }

            pub(super) fn since(&self, prev: &Self) -> Self {
                Self { $($name: since(prev.$name, self.$name),)* }
            }
        }
    };
}

link_counters! {
    rx_packets = 0,
    tx_packets = 1,
    rx_bytes = 2,
    tx_bytes = 3,
    /// Bad packets received (what the rx_*_errors below add up to, per driver).
    rx_errors = 4,
    tx_errors = 5,
    /// Received packets dropped by the kernel or driver (no buffer, filter).
    rx_dropped = 6,
    tx_dropped = 7,
    multicast = 8,
    /// Collisions: only possible in half duplex, so non-zero on a link that
    /// claims full duplex points at a duplex mismatch at the other end.
    collisions = 9,
    rx_length_errors = 10,
    /// Receiver ring overruns.
    rx_over_errors = 11,
    /// Frames with a bad FCS: cabling, optics, or the late collisions of a
    /// duplex mismatch.
    rx_crc_errors = 12,
    rx_frame_errors = 13,
    rx_fifo_errors = 14,
    /// Frames the NIC had to drop for lack of host buffers.
    rx_missed_errors = 15,
    tx_aborted_errors = 16,
    tx_carrier_errors = 17,
    tx_fifo_errors = 18,
    tx_heartbeat_errors = 19,
    tx_window_errors = 20,
    // 21, 22: rx_compressed, tx_compressed (CSLIP/PPP only).
    /// Packets received for a protocol nothing listens to.
    rx_nohandler = 23,
}

/// Ethernet flow control (ethtool PAUSE_GET with ETHTOOL_FLAG_STATS).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PauseCounters {
    /// Flow control is negotiated (ETHTOOL_A_PAUSE_AUTONEG).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub autoneg: Option<bool>,
    /// This end honours received PAUSE frames (ETHTOOL_A_PAUSE_RX).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_enabled: Option<bool>,
    /// This end sends PAUSE frames (ETHTOOL_A_PAUSE_TX).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_enabled: Option<bool>,
    /// PAUSE frames sent: this host asked its peer to stop
    /// (ETHTOOL_A_PAUSE_STAT_TX_FRAMES).
    pub tx_pause_frames: Exposed<u64>,
    /// PAUSE frames received: the peer throttled this host's transmit
    /// (ETHTOOL_A_PAUSE_STAT_RX_FRAMES).
    pub rx_pause_frames: Exposed<u64>,
}

/// The root qdisc of an interface (RTM_GETQDISC: TCA_KIND, TCA_STATS2 /
/// TCA_STATS_QUEUE). For a multiqueue root (`mq`) the kernel reports the sum
/// over its per-queue children.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct QdiscStats {
    /// Qdisc type: `noqueue`, `pfifo_fast`, `fq_codel`, `mq`, `tbf`, ...
    pub kind: String,
    /// Bytes queued now (gauge).
    pub backlog_bytes: u64,
    /// Packets queued now (gauge).
    pub qlen_packets: u64,
    /// Packets dropped by the qdisc (queue full, AQM).
    pub drops: u64,
    /// Packets the driver handed back (its transmit ring was full).
    pub requeues: u64,
    /// Times the qdisc held packets back (rate limit, or the driver stopped
    /// its queue).
    pub overlimits: u64,
}
