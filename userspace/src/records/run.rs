//! The run-level JSON records ( `start`, `lost`, `stop`), written by
//! `stalltrace run` (run.rs). Each probe family keeps its own records next to
//! its code (`block::record`); docs/schema.json describes them all.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::probes::stats::ProgramStats;
use crate::probes::{HookMode, HookStatus};

#[derive(Serialize, Clone, Debug)]
pub struct FamilyReport {
    pub family: &'static str,
    pub attached: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mode: Option<HookMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

#[derive(Serialize)]
pub struct StartRecord<'a> {
    pub version: &'static str,
    pub kernel: String,
    pub interval_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// 0 when slow_io records are off.
    pub slow_io_ms: f64,
    pub bpf_stats: bool,
    /// The kernel's CONFIG_HZ (turns jiffies into time) and where it was read.
    pub kernel_hz: u32,
    pub kernel_hz_source: &'static str,
    pub filters: Filters<'a>,
    /// `--bulk-mbps`: a TCP flow this fast gets `tcp_flow` records; absent when off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bulk_mbps: Option<f64>,
    /// `--prometheus`: where the metrics are served; absent when off.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<std::net::SocketAddr>,
    /// Stall detection's thresholds; absent with --no-stalls.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stalls: Option<&'a crate::stall::Thresholds>,
    pub families: &'a [FamilyReport],
    pub probes: &'a [HookStatus],
}

/// What the run was limited to; empty lists mean everything.
#[derive(Serialize)]
pub struct Filters<'a> {
    pub ports: &'a [u16],
    pub netns: &'a [crate::host::netns::Netns],
    pub ifaces: &'a [String],
}

#[derive(Serialize)]
pub struct LostRecord<'a> {
    pub interval_ms: u64,
    /// Events or measurements not delivered in this interval, by source.
    pub by_source: &'a BTreeMap<String, u64>,
}

#[derive(Serialize)]
pub struct ProgramCost {
    pub family: &'static str,
    #[serde(flatten)]
    pub stats: ProgramStats,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ns_per_run: Option<f64>,
}

#[derive(Serialize)]
pub struct StopRecord<'a> {
    pub reason: &'static str,
    pub elapsed_ms: u64,
    /// Records written before this one, by type.
    pub records: &'a BTreeMap<&'static str, u64>,
    /// Everything lost over the run, by source.
    pub lost: &'a BTreeMap<String, u64>,
    pub programs: Vec<ProgramCost>,
}
