//! The netdev family's JSON record (schema v1: `netdev`).

use serde::Serialize;

use crate::hist::HistogramRecord;
use crate::host::link::LinkHealth;

/// One interface, one interval.
#[derive(Clone, Debug, Serialize)]
pub struct NetdevRecord {
    pub iface: String,
    pub ifindex: u32,
    /// Network namespace inode.
    pub netns: u32,
    pub interval_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_packets: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rx_bytes: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_packets: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tx_bytes: Option<u64>,
    /// Departure time set by TCP -> handed to the driver: the wait in the
    /// qdisc, for 1 in 64 transmitted packets per CPU and each CPU's first
    /// after 10 ms without one (counts are samples, not packets).
    pub qdisc_us: HistogramRecord,
    /// The driver's transmit call, for the same sampled packets.
    pub xmit_us: HistogramRecord,
    /// Driver receive -> TCP processing, for 1 in 16 received packets.
    pub rx_us: HistogramRecord,
    /// Sampled transmits without a departure time (not in qdisc_us).
    pub qdisc_untimed: u64,
    pub tx_timeouts: u64,
    pub tx_stalls: u64,
    pub tx_busy: u64,
    /// Link state and the kernel's counters over the interval; absent for an
    /// interface in a namespace stalltrace cannot enter.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub link: Option<LinkHealth>,
}
