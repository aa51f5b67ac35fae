//! What one reading of one interface holds, and how it serializes.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

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

/// Either form. Through a JSON value: `"not exposed"` is also a valid `Exposed<String>` value.
impl<'de, T: serde::de::DeserializeOwned> Deserialize<'de> for Exposed<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = serde_json::Value::deserialize(d)?;
        if v == NOT_EXPOSED {
            return Ok(Exposed::NotExposed);
        }
        T::deserialize(v)
            .map(Exposed::Value)
            .map_err(serde::de::Error::custom)
    }
}

impl<T: JsonSchema> JsonSchema for Exposed<T> {
    fn schema_name() -> Cow<'static, str> {
        format!("exposed_{}", T::schema_name()).into()
    }

    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        let value = generator.subschema_for::<T>();
        json_schema!({
            "description": "The value, or the text `not exposed` where the driver does not report it.",
            "anyOf": [value, { "const": NOT_EXPOSED }]
        })
    }
}

/// One interface, one reading. Counters are the kernel's running totals;
/// [`delta`](super::delta()) turns two readings into the change over the interval, which is what
/// a `netdev` record carries: the interface's link state and the kernel's own counters over the
/// interval, read over netlink (rtnetlink, ethtool). Values a driver does not report are the
/// string `not exposed`, never invented zeros.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, rename = "link_health")]
pub struct LinkHealth {
    /// Interface index in its network namespace (changes when re-created).
    /// Not serialized: the `netdev` record that carries a reading has it.
    #[serde(skip)]
    #[schemars(skip)]
    pub ifindex: u32,
    /// Interface name (IFLA_IFNAME); not serialized, as `ifindex`.
    #[serde(skip)]
    #[schemars(skip)]
    pub name: String,
    /// RFC 2863 operational state (IFLA_OPERSTATE): up, down, lowerlayerdown, dormant, testing,
    /// notpresent or unknown (`unknown` is what virtual devices without carrier handling report,
    /// e.g. `lo`).
    pub oper_state: String,
    /// Whether the device sees a carrier (meaningful only while administratively up). From
    /// IFLA_CARRIER; a down device keeps whatever it had.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carrier: Option<bool>,
    /// Carrier transitions in the interval: a flapping link (IFLA_CARRIER_CHANGES, up + down; in
    /// a reading, since the device was created).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub carrier_changes: Option<u64>,
    /// Link speed in Mb/s (ethtool link modes: ETHTOOL_A_LINKMODES_SPEED).
    pub speed_mbps: Exposed<u32>,
    /// Duplex, `full` or `half` (ETHTOOL_A_LINKMODES_DUPLEX): half on a switched link is the
    /// classic duplex mismatch.
    pub duplex: Exposed<String>,
    /// Whether speed and duplex are negotiated (ETHTOOL_A_LINKMODES_AUTONEG).
    pub autoneg: Exposed<bool>,
    /// Interface counters over the interval (IFLA_STATS64; in a reading, running totals).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub counters: Option<LinkCounters>,
    /// Ethernet flow control settings and PAUSE frame counts (ethtool PAUSE_GET, its pause
    /// statistics); `not exposed` when the driver does not report them.
    pub pause: Exposed<PauseCounters>,
    /// The root qdisc: the queue in front of the driver. Absent when the
    /// device has none the kernel reports (a down device keeps the built-in
    /// `noop`, which is never dumped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
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
        /// in a [`delta`](super::delta()): in a `netdev` record, each counts what happened in
        /// this interval (IFLA_STATS64 delta).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, JsonSchema)]
        #[schemars(deny_unknown_fields, rename = "link_counters")]
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
    /// Packets received.
    rx_packets = 0,
    /// Packets sent.
    tx_packets = 1,
    /// Bytes received.
    rx_bytes = 2,
    /// Bytes sent.
    tx_bytes = 3,
    /// Bad packets received (what the rx_*_errors below add up to, per driver).
    rx_errors = 4,
    /// Packets that failed to send.
    tx_errors = 5,
    /// Received packets dropped (no buffer, filter), by the kernel or driver.
    rx_dropped = 6,
    /// Packets dropped on send.
    tx_dropped = 7,
    /// Multicast packets received.
    multicast = 8,
    /// Collisions: only possible in half duplex; non-zero on a link that claims full duplex
    /// points at a duplex mismatch (at the other end).
    collisions = 9,
    /// Frames of a bad length.
    rx_length_errors = 10,
    /// Receive ring overruns.
    rx_over_errors = 11,
    /// Frames with a bad FCS: cabling, optics, or the late collisions of a
    /// duplex mismatch.
    rx_crc_errors = 12,
    /// Misaligned frames.
    rx_frame_errors = 13,
    /// Receive FIFO overruns.
    rx_fifo_errors = 14,
    /// Frames the NIC dropped for lack of host buffers.
    rx_missed_errors = 15,
    /// Transmits aborted.
    tx_aborted_errors = 16,
    /// Transmits that lost carrier.
    tx_carrier_errors = 17,
    /// Transmit FIFO underruns.
    tx_fifo_errors = 18,
    /// Heartbeat errors.
    tx_heartbeat_errors = 19,
    /// Late collisions (window errors).
    tx_window_errors = 20,
    // 21, 22: rx_compressed, tx_compressed (CSLIP/PPP only).
    /// Packets received for a protocol nothing listens to.
    rx_nohandler = 23,
}

/// Ethernet flow control (ethtool PAUSE_GET with ETHTOOL_FLAG_STATS).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, rename = "pause_counters")]
pub struct PauseCounters {
    /// Flow control is negotiated (ETHTOOL_A_PAUSE_AUTONEG).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoneg: Option<bool>,
    /// This end honours received PAUSE frames (ETHTOOL_A_PAUSE_RX).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_enabled: Option<bool>,
    /// This end sends PAUSE frames (ETHTOOL_A_PAUSE_TX).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_enabled: Option<bool>,
    /// PAUSE frames sent in the interval: this host asked its peer to stop
    /// (ETHTOOL_A_PAUSE_STAT_TX_FRAMES; in a reading, the running total).
    pub tx_pause_frames: Exposed<u64>,
    /// PAUSE frames received in the interval: the peer throttled this host's transmit
    /// (ETHTOOL_A_PAUSE_STAT_RX_FRAMES; in a reading, the running total).
    pub rx_pause_frames: Exposed<u64>,
}

/// The root qdisc of an interface (RTM_GETQDISC: TCA_KIND, TCA_STATS2 /
/// TCA_STATS_QUEUE): the queue in front of the driver. For a multiqueue root (`mq`) the kernel
/// reports the sum over its per-queue children.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, rename = "qdisc_stats")]
pub struct QdiscStats {
    /// Qdisc type (noqueue, pfifo_fast, fq_codel, mq, tbf, ...).
    pub kind: String,
    /// Bytes queued at the end of the interval (gauge): at the reading.
    pub backlog_bytes: u64,
    /// Packets queued at the end of the interval (gauge): at the reading.
    pub qlen_packets: u64,
    /// Packets the qdisc dropped in the interval (queue full, AQM); in a reading (not a
    /// delta), the running total.
    pub drops: u64,
    /// Packets the driver handed back in the interval (its ring was full); in a reading, the
    /// running total.
    pub requeues: u64,
    /// Times in the interval the qdisc held packets back (rate limit, or the driver stopped its
    /// queue); in a reading, the running total.
    pub overlimits: u64,
}

/// Increase of a running total from `prev` to `cur`; a decrease is a reset.
pub(super) fn since(prev: u64, cur: u64) -> u64 {
    if cur >= prev { cur - prev } else { cur }
}
