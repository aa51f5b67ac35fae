//! The netdev family's record: `netdev`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::hist::HistogramRecord;
pub use crate::host::link::{Exposed, LinkCounters, LinkHealth, PauseCounters, QdiscStats};

/// One network interface over one interval, for interfaces that had traffic or events in it (or
/// in the interval before). Interfaces are keyed by (network namespace, ifindex).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct NetdevRecord {
    /// Interface name; `ifN` when its namespace cannot be entered (only kernel figures then).
    pub iface: String,
    /// Interface index in its namespace.
    pub ifindex: u32,
    /// Network namespace inode.
    pub netns: u32,
    /// Measured length of the interval, in milliseconds.
    pub interval_ms: u64,
    /// Packets received in the interval (from the kernel's interface counters).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_packets: Option<u64>,
    /// Bytes received in the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    /// Packets sent in the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_packets: Option<u64>,
    /// Bytes sent in the interval.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Wait in the transmit queue (qdisc), in microseconds: from the departure time TCP stamps on
    /// a packet to its hand-off to the driver. Sampled to bound the cost: 1 in 64 packets a CPU
    /// transmits, chosen at random, and each CPU's first after 10 ms without a sample; its count
    /// is sampled packets, not packets (`tx_packets` is that). Sampled packets without such a
    /// stamp are counted in `qdisc_untimed`.
    pub qdisc_us: HistogramRecord,
    /// The driver's transmit call, in microseconds (the CPU time to hand a packet to the device;
    /// not wire time), for the packets `qdisc_us` samples.
    pub xmit_us: HistogramRecord,
    /// Receive path, in microseconds: from a packet's arrival from the driver to TCP processing
    /// it, for 1 in 16 received packets (sampled to bound the cost).
    pub rx_us: HistogramRecord,
    /// Sampled packets (as `qdisc_us`) handed to the driver without a departure time (forwarded,
    /// most UDP): not in `qdisc_us`.
    pub qdisc_untimed: u64,
    /// Transmit watchdog timeouts in the interval: a stuck transmit queue
    /// (net_dev_xmit_timeout).
    pub tx_timeouts: u64,
    /// Byte-queue-limit stalls detected in the interval (dql_stall_detected; kernel 6.9+, and only
    /// when the queue's stall_thrs is set).
    pub tx_stalls: u64,
    /// Packets the driver refused in the interval (NETDEV_TX_BUSY: its ring was full).
    pub tx_busy: u64,
    /// The interface's link state and the kernel's own counters over the interval, read over
    /// netlink (rtnetlink, ethtool). Values a driver does not report are the string `not
    /// exposed`, never invented zeros. Absent for an interface in a namespace stalltrace cannot
    /// enter.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkHealth>,
}
