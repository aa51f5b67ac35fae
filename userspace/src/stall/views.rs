//! The parts of emitted records the detector reads, deserialized from the
//! same JSON the stream carries: the detector sees exactly what a reader of
//! the stream sees, so a recorded stream replays to the same episodes.

use serde::Deserialize;
use serde_json::Value;

/// A histogram object of either schema (hist/record.rs).
pub type Hist = crate::hist::HistogramRecord;

#[derive(Clone, Debug, Default, Deserialize)]
pub struct QueueLimit {
    pub nr_requests: Option<u64>,
    pub hw_queue_depth: Option<u64>,
    pub nr_hw_queues: Option<u64>,
    pub scheduler: Option<String>,
}

impl QueueLimit {
    /// Requests the disk can hold in flight: per hardware queue × queues.
    pub fn depth(&self) -> Option<u64> {
        let per_queue = match (self.nr_requests, self.hw_queue_depth) {
            (Some(n), Some(h)) => n.min(h),
            (n, h) => n.or(h)?,
        };
        Some(per_queue * self.nr_hw_queues.unwrap_or(1).max(1))
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct Block {
    pub dev: String,
    pub major: u64,
    pub minor: u64,
    pub op: String,
    pub interval_ms: u64,
    pub count: u64,
    #[serde(default)]
    pub requeues: u64,
    pub latency_us: Hist,
    pub tag_wait_us: Hist,
    pub device_us: Hist,
    pub inflight: Hist,
    #[serde(default)]
    pub queue_limit: QueueLimit,
    pub role: Option<String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct SlowIo {
    pub dev: String,
    pub file: Option<String>,
    /// The submitter's process.
    #[serde(default)]
    pub pid: Option<u64>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Retransmit {
    pub netns: u64,
    pub daddr: String,
    pub kind: String,
    #[serde(default)]
    pub timer: bool,
    #[serde(default)]
    pub err: i64,
    pub segs: u64,
    pub rto_ms: f64,
    pub backoff: u64,
    #[serde(default)]
    pub stalled_ms: f64,
    #[serde(default)]
    pub srtt_us: f64,
    pub sql: Option<Value>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Rtt {
    pub netns: u64,
    pub peer: String,
    pub srtt_us: Hist,
    pub sql: Option<Value>,
}

#[derive(Clone, Debug, Default, Deserialize)]
pub struct LinkCounters {
    #[serde(default)]
    pub collisions: u64,
    #[serde(default)]
    pub rx_crc_errors: u64,
    #[serde(default)]
    pub rx_errors: u64,
    #[serde(default)]
    pub tx_errors: u64,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Qdisc {
    pub kind: String,
    pub backlog_bytes: u64,
    pub drops: u64,
    pub overlimits: u64,
}

/// Link health. Values a driver does not report are the text `not exposed`,
/// so those fields stay JSON values, read through the accessors.
#[derive(Clone, Debug, Deserialize)]
pub struct Link {
    pub duplex: Value,
    pub speed_mbps: Value,
    pub counters: Option<LinkCounters>,
    pub pause: Value,
    pub qdisc: Option<Qdisc>,
}

impl Link {
    pub fn half_duplex(&self) -> bool {
        self.duplex == "half"
    }
    pub fn speed_mbps(&self) -> Option<u64> {
        self.speed_mbps.as_u64()
    }
    /// PAUSE frames received in the interval, when the driver says.
    pub fn rx_pause_frames(&self) -> Option<u64> {
        self.pause.get("rx_pause_frames").and_then(Value::as_u64)
    }
    pub fn counters(&self) -> LinkCounters {
        self.counters.clone().unwrap_or_default()
    }
}

#[derive(Clone, Debug, Deserialize)]
pub struct Netdev {
    pub iface: String,
    pub netns: u64,
    pub interval_ms: u64,
    /// Absent on an interface's first reading, and where its namespace
    /// cannot be entered (docs/records.md).
    pub tx_packets: Option<u64>,
    pub tx_bytes: Option<u64>,
    pub qdisc_us: Hist,
    #[serde(default)]
    pub tx_timeouts: u64,
    #[serde(default)]
    pub tx_stalls: u64,
    pub link: Option<Link>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct Flow {
    pub netns: u64,
    pub saddr: String,
    pub sport: u16,
    pub daddr: String,
    pub dport: u16,
    pub interval_ms: u64,
    pub send_mbps: f64,
    pub busy_ms: f64,
    pub rwnd_limited_ms: f64,
    pub sndbuf_limited_ms: f64,
    pub retrans_segs: u64,
    pub limiter: String,
    /// The processes holding the socket (an application-limited flow's feeders).
    #[serde(default)]
    pub pids: Vec<u64>,
    pub sql: Option<Value>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct SqlInstance {
    pub pid: u64,
    #[serde(default)]
    pub disk_roles: std::collections::BTreeMap<String, String>,
}

#[derive(Clone, Debug, Deserialize)]
pub struct SqlSession {
    pub event: String,
    pub pid: u64,
    pub sock_ino: u64,
    pub kind: String,
    pub remote: String,
    pub spid: Option<u64>,
    #[serde(default)]
    pub encrypted: bool,
}
