//! The `stall` record and the evidence it carries.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::sql::SqlTag;

/// Which path stalled.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "stall_kind")]
pub enum Kind {
    Network,
    Storage,
    BulkFlow,
    /// A SQL Server instance's requests: the clients' symptom, with what the time went to.
    Requests,
}

impl Kind {
    /// The name the records use.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Network => "network",
            Kind::Storage => "storage",
            Kind::BulkFlow => "bulk_flow",
            Kind::Requests => "requests",
        }
    }
}

/// Why an episode happened, as far as the evidence goes: the likely cause. Declared from weakest
/// to strongest: when an episode's intervals disagree, the strongest cause seen wins (a duplex
/// mismatch explains the retransmission timeouts it produces, not the other way round).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "stall_cause")]
pub enum Cause {
    ServerBusy,
    ServerIo,
    NetworkDelivery,
    PacketLoss,
    RetransmissionTimeouts,
    DuplexMismatch,
    TxThrottled,
    FlowControl,
    TxTimeout,
    SlowDevice,
    QueueFull,
    NetworkLimited,
    ApplicationLimited,
    ReceiverLimited,
}

impl Cause {
    /// The name the records use.
    pub fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// One signal that supports the cause.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, rename = "evidence")]
pub struct Evidence {
    /// What was measured, as a stable name (e.g. `rto_ms_max`, `inflight_at_limit_fraction`,
    /// `duplex`).
    pub signal: String,
    /// Its value over the episode (number, or text such as `half`): a text where the signal is
    /// one (a duplex).
    pub value: Value,
    /// The threshold it crossed, when it is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    /// Unit of value and threshold (`ms`, `us`, `fraction`, `count`, `Mbit/s`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unit: Option<String>,
    /// The same in a sentence, for a human.
    pub text: String,
}

impl Evidence {
    pub fn new(signal: &str, value: impl Into<Value>, text: String) -> Self {
        Self {
            signal: signal.to_string(),
            value: value.into(),
            threshold: None,
            unit: None,
            text,
        }
    }

    pub fn unit(mut self, unit: &str) -> Self {
        self.unit = Some(unit.to_string());
        self
    }

    pub fn threshold(mut self, threshold: f64) -> Self {
        self.threshold = Some(threshold);
        self
    }
}

/// What an episode is about: a disk, an interface, a peer, a flow, a SQL Server instance.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub struct Subject {
    /// Storage: the disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    /// Network: the interface (transmit-side causes, link evidence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub iface: Option<String>,
    /// Network: the remote address whose connections stalled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    /// Bulk flow: `saddr:sport -> daddr:dport`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flow: Option<String>,
    /// Network: the network namespace inode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub netns: Option<u64>,
    /// Requests: the SQL Server instance's worker pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub worker_pid: Option<u32>,
}

/// Where an episode is: `open` or `closed`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "stall_phase")]
pub enum Phase {
    Open,
    Closed,
}

/// Sessions listed in a record at most; the rest are counted.
pub const MAX_SESSIONS: usize = 50;

/// A stall episode: opened when a signal crosses its threshold in an interval, closed when it
/// has stayed below for the recovery time. Written twice: at `open` (no `end`) and when `closed`
/// (or when the run ends).
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct StallRecord {
    /// Episode number in this run, from 1; the open and closed records of an episode share it.
    pub id: u64,
    /// `open`: the episode started (written in the interval it did); `closed`: it ended, with its
    /// totals.
    pub phase: Phase,
    /// Start of the first interval in which the signal crossed its threshold.
    pub start: String,
    /// End of the last interval in which it did (closed only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// `end` - `start` (closed), or so far (open).
    pub duration_ms: f64,
    /// Which path stalled.
    pub kind: Kind,
    /// The likely cause.
    pub cause: Cause,
    #[serde(flatten)]
    pub subject: Subject,
    /// Storage: its SQL Server role, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    /// Time lost to the stall, summed over what it hit (retransmission timeouts waited, I/O time
    /// above the device's usual, ...): what episodes are ranked by.
    pub impact_ms: f64,
    /// The signals that support the cause, strongest first.
    pub evidence: Vec<Evidence>,
    /// What to check next.
    pub next_step: String,
    /// SQL Server sessions it hit (network: those whose connections retransmitted; storage: those
    /// open on the instance whose files are on the disk; requests: those with a slow request).
    /// Empty when none is known.
    pub sessions: Vec<SqlTag>,
    /// Sessions hit but left out of `sessions` (it holds at most 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sessions_omitted: Option<u32>,
    /// Storage: database files that slow I/Os of the episode touched; requests (`server_io`): the
    /// files of the instance's own slow I/Os the requests waited on.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
}

/// Quiet time after which an episode closes, by default.
pub const DEFAULT_RECOVER: std::time::Duration = std::time::Duration::from_secs(2);

/// When a signal is a stall (`--stall-*` flags). Defaults are what an SRE of a SQL Server host
/// would call one; each has a `stalltrace run` flag.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, rename = "thresholds")]
pub struct Thresholds {
    /// A connection that made no progress this long, or a retransmission timeout, is a network
    /// stall (ms). The first timeout is 200 ms on Linux: a stall a transaction felt.
    pub net_ms: f64,
    /// Retransmitted segments per second to one peer that count as loss without a timeout
    /// (loss worth an episode).
    pub retrans_per_s: f64,
    /// Transmit queue wait at p99 that is a transmit stall (ms): the wait in the qdisc.
    pub qdisc_ms: f64,
    /// Device time per request at p99 that is a slow device (ms): issue → complete. SQL Server's
    /// own guidance calls log writes slower than a few ms and data reads slower than 20 ms a
    /// problem; 20 ms flags both without tripping on busy but healthy disks.
    pub io_ms: f64,
    /// Least mean tag wait for a full queue to be a stall (µs): below it the queue is full but
    /// nobody waits long.
    pub tag_wait_us: f64,
    /// Least requests or packets in an interval for its percentiles to count.
    pub min_samples: u64,
    /// Quiet time after which an episode ends (ms).
    pub recover_ms: f64,
}

impl Default for Thresholds {
    fn default() -> Self {
        Self {
            net_ms: 200.0,
            retrans_per_s: 100.0,
            qdisc_ms: 20.0,
            io_ms: 20.0,
            tag_wait_us: 100.0,
            min_samples: 10,
            recover_ms: DEFAULT_RECOVER.as_secs_f64() * 1000.0,
        }
    }
}
