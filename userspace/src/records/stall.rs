//! The `stall` record (schema v1) and the evidence it carries.

use serde::Serialize;
use serde_json::Value;

/// Which path stalled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Network,
    Storage,
    BulkFlow,
}

/// The likely cause. Declared from weakest to strongest: when an episode's
/// intervals disagree, the strongest cause seen wins (a duplex mismatch
/// explains the retransmission timeouts it produces, not the other way round).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Cause {
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

/// One signal supporting the cause.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Evidence {
    pub signal: &'static str,
    pub value: Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub threshold: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub unit: Option<&'static str>,
    pub text: String,
}

impl Evidence {
    pub fn new(signal: &'static str, value: impl Into<Value>, text: String) -> Self {
        Self {
            signal,
            value: value.into(),
            threshold: None,
            unit: None,
            text,
        }
    }

    pub fn unit(mut self, unit: &'static str) -> Self {
        self.unit = Some(unit);
        self
    }

    pub fn threshold(mut self, threshold: f64) -> Self {
        self.threshold = Some(threshold);
        self
    }
}

/// What an episode is about: a disk, an interface, a peer, a flow.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
pub struct Subject {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dev: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub iface: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub peer: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub flow: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub netns: Option<u64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Phase {
    Open,
    Closed,
}

/// Sessions listed in a record at most; the rest are counted.
pub const MAX_SESSIONS: usize = 50;

#[derive(Clone, Debug, Serialize)]
pub struct StallRecord {
    pub id: u64,
    pub phase: Phase,
    pub start: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    pub duration_ms: f64,
    pub kind: Kind,
    pub cause: Cause,
    #[serde(flatten)]
    pub subject: Subject,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
    pub impact_ms: f64,
    pub evidence: Vec<Evidence>,
    pub next_step: String,
    pub sessions: Vec<Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sessions_omitted: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub files: Vec<String>,
}
