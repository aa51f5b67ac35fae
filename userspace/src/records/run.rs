//! The run-level records (`start`, `lost`, `stop`), written by `stalltrace
//! run` (run.rs), and what they say about the hooks and programs.

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::stall::Thresholds;
use crate::host::netns::Netns;

/// Hook flavour: `tp_btf` (BTF-enabled tracepoint, direct loads, cheapest) or `raw_tp` (raw
/// tracepoint, reads through bpf_probe_read).
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "hook_mode")]
pub enum HookMode {
    TpBtf,
    RawTp,
}

impl HookMode {
    pub fn name(self) -> &'static str {
        match self {
            HookMode::TpBtf => "tp_btf",
            HookMode::RawTp => "raw_tp",
        }
    }

    pub fn section_prefix(self) -> &'static str {
        match self {
            HookMode::TpBtf => "tp_btf/",
            HookMode::RawTp => "raw_tp/",
        }
    }
}

/// How a program attaches.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "attach_kind")]
pub enum AttachKind {
    /// A BTF-typed tracepoint (direct loads).
    TpBtf,
    /// A raw tracepoint (untyped arguments, probe reads).
    RawTp,
    /// The entry of a kernel function, BTF-typed (a trampoline).
    Fentry,
    /// The entry of a kernel function through a kprobe.
    Kprobe,
    /// Not attached: a program the daemon runs itself (BPF_PROG_RUN) once an interval, so
    /// nothing of it is on any I/O's or packet's path (the block family's
    /// `settle_freed_requests`, docs/records.md).
    ProgRun,
}

impl AttachKind {
    pub fn name(self) -> &'static str {
        match self {
            AttachKind::TpBtf => "tp_btf",
            AttachKind::RawTp => "raw_tp",
            AttachKind::Fentry => "fentry",
            AttachKind::Kprobe => "kprobe",
            AttachKind::ProgRun => "prog_run",
        }
    }

    /// As `check` says it: what it is, then the name `--probe-mode` and the
    /// records use.
    pub fn in_words(self) -> String {
        let what = match self {
            AttachKind::TpBtf => "BTF tracepoint",
            AttachKind::RawTp => "raw tracepoint",
            AttachKind::Fentry => "function entry",
            AttachKind::Kprobe => "kprobe",
            AttachKind::ProgRun => "run by stalltrace once an interval",
        };
        match self {
            AttachKind::Kprobe => what.to_string(),
            _ => format!("{what} ({})", self.name()),
        }
    }
}

/// What happened to one kernel hook at attach; carried in the `start` record's `probes`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields, rename = "hook_status")]
pub struct HookStatus {
    /// Probe family the hook belongs to (`block`).
    pub family: String,
    /// The hook: the kernel tracepoint it is named after, e.g. `block_rq_issue` (`target` says
    /// what served it).
    pub hook: String,
    /// Hook flavour tried.
    pub mode: HookMode,
    /// Whether the hook was attached. False with no `error` means it was not tried because an
    /// earlier hook of the family failed.
    pub attached: bool,
    /// What serves the hook: its tracepoint (`tp_btf`, `raw_tp`) or, on a kernel without it, a
    /// kernel function standing in for it (`fentry` in tp_btf mode, `kprobe` in raw_tp mode).
    /// Present when attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub via: Option<AttachKind>,
    /// The tracepoint or kernel function the hook attached to. Present when attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// Why the hook's tracepoint could not be used, when a kernel function serves it instead
    /// (one line per program tried, separated by `; `): the hook's earlier programs failed and a
    /// later one serves it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    /// What the hook cannot tell on this kernel (e.g. failed retransmission attempts before
    /// 6.17); docs/records.md says it per field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Present (true) for a hook the family works without: a tracepoint only some kernels have.
    /// Such a hook failing leaves the family attached, with this hook's `error` saying why.
    /// Serialized only when true.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub optional: bool,
    /// Kernel id of the attached eBPF program (`bpftool prog show id N`); present only when
    /// attached and the kernel reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub program_id: Option<u32>,
    /// Instructions the kernel's verifier walked to accept the program (its `processed N insns`),
    /// of the million it allows one program: what loading cost, and how near the limit a
    /// kernel whose verifier prunes less would come. Present when attached, on kernels that
    /// report it (5.16+).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub verified_insns: Option<u32>,
    /// Why loading or attaching this hook failed (one line; a verifier rejection keeps only its
    /// last lines). Absent when it attached or was not tried.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl HookStatus {
    /// A required hook of `family` not tried yet in `mode`.
    pub fn untried(family: &str, hook: &str, mode: HookMode) -> Self {
        Self {
            family: family.to_string(),
            hook: hook.to_string(),
            mode,
            attached: false,
            via: None,
            target: None,
            fallback_reason: None,
            note: None,
            optional: false,
            program_id: None,
            verified_insns: None,
            error: None,
        }
    }
}

/// One attached program's counters since load.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct ProgramStats {
    /// eBPF program (C function) name, e.g. `on_block_rq_issue`.
    pub program: String,
    /// Times the program ran; 0 unless BPF statistics were on (`start`.bpf_stats): `--bpf-stats`
    /// or sysctl kernel.bpf_stats_enabled.
    pub run_count: u64,
    /// Total time spent in the program, in nanoseconds; 0 unless BPF statistics were on.
    pub run_time_ns: u64,
    /// Runs the kernel skipped because the program was already running on that CPU: lost
    /// measurements (also counted in `lost` as `<family>.recursion_miss.<program>`). A nested
    /// hook causes them.
    pub recursion_misses: u64,
}

impl ProgramStats {
    pub fn ns_per_run(&self) -> Option<f64> {
        (self.run_count > 0).then(|| self.run_time_ns as f64 / self.run_count as f64)
    }
}

/// Outcome of one probe family at attach.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug)]
#[schemars(deny_unknown_fields, rename = "family_report")]
pub struct FamilyReport {
    /// Probe family name (`block`).
    pub family: String,
    /// Whether the family is running. False only with --degrade; without it a failed family
    /// stops the run before any record.
    pub attached: bool,
    /// Hook flavour the family runs with; present when attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<HookMode>,
    /// Why tp_btf could not be used when --probe-mode auto fell back to raw_tp; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fallback_reason: Option<String>,
    /// Why the family could not attach; present only when `attached` is false.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Written once, first, after every probe family has attached (or failed with --degrade): what
/// this run is and what it can see.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug)]
#[schemars(deny_unknown_fields)]
pub struct StartRecord {
    /// stalltrace version (crate version, e.g. 0.1.0).
    pub version: String,
    /// Kernel release (uname -r, /proc/sys/kernel/osrelease), `unknown` when unreadable.
    pub kernel: String,
    /// Nominal aggregation interval (--interval), in milliseconds (100 to 3600000).
    pub interval_ms: u64,
    /// Planned run length (--duration), in milliseconds; absent when the run lasts until
    /// SIGINT/SIGTERM.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// Threshold for `slow_io` records (--slow-io-ms), in milliseconds; 0 when slow_io records
    /// are off.
    #[schemars(range(min = 0))]
    pub slow_io_ms: f64,
    /// Whether the kernel's per-program run-time accounting is on for this run (--bpf-stats, or
    /// sysctl kernel.bpf_stats_enabled already 1): then `stop`.programs carry run counts and
    /// times.
    pub bpf_stats: bool,
    /// The kernel's CONFIG_HZ, used to turn jiffies (a TCP RTO) into time.
    pub kernel_hz: u32,
    /// Where `kernel_hz` came from: `/proc/config.gz`, `/boot/config`, or `assumed (no kernel
    /// config found)` (250).
    pub kernel_hz_source: String,
    /// What the run was limited to (--port, --netns, --iface, --disk, --pid, --comm,
    /// --container); empty lists mean everything.
    pub filters: Filters,
    /// `--bulk-mbps`: a TCP flow sending this many Mbit/s gets `tcp_flow` records. Absent when
    /// they are off (`--bulk-mbps 0`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bulk_mbps: Option<f64>,
    /// `--prometheus`: the address and port the metrics are served on (at /metrics). Absent when
    /// off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prometheus: Option<std::net::SocketAddr>,
    /// Stall detection's thresholds (`--stall-*` flags); absent with `--no-stalls`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stalls: Option<Thresholds>,
    /// One entry per probe family this build knows, attached or not.
    pub families: Vec<FamilyReport>,
    /// Every kernel hook tried, in each mode tried (an auto fallback lists the failed tp_btf
    /// hooks and then the raw_tp ones), with why any failed.
    pub probes: Vec<HookStatus>,
    /// SPIDs of encrypted SQL Server sessions (the `SSL_write` uprobes); present when the
    /// sqlserver family attached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql_tls: Option<crate::records::sql::SqlTlsStart>,
    /// Present on the `start` record that begins each further file of a run (after
    /// `--out-max-mb` rotation or a SIGHUP reopen): the file's number in the run, 1 for the
    /// second file. Its body repeats the run's first `start`, so that every file reports on its
    /// own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1))]
    pub file: Option<u64>,
}

/// What the run was limited to (--port, --netns, --iface); empty lists mean everything.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug)]
#[schemars(deny_unknown_fields, rename = "filters")]
pub struct Filters {
    /// TCP ports (at either end) the tcp family is limited to.
    pub ports: Vec<u16>,
    /// Network namespaces the tcp family is limited to.
    pub netns: Vec<Netns>,
    /// Interface names the netdev family is limited to (--iface).
    pub ifaces: Vec<String>,
    /// Disks (`major:minor`) the block family is limited to (--disk).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub disks: Vec<String>,
    /// Processes (`--pid`) the slow_io and TCP records are limited to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pids: Vec<u32>,
    /// Process names (`--comm`) the slow_io and TCP records are limited to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub comms: Vec<String>,
    /// Containers (`--container`, full ids) the slow_io and TCP records are limited to.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub containers: Vec<String>,
}

/// Written at the end of an interval that wrote nothing else: the tracer was
/// alive and watching, and saw no I/O, no traffic and nothing lost. A quiet
/// host so looks different from a dead tracer or a cut stream.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug)]
#[schemars(deny_unknown_fields)]
pub struct HeartbeatRecord {
    /// Measured length of the interval, in milliseconds.
    pub interval_ms: u64,
}

/// Written at the end of an interval in which anything was dropped: events or measurements not
/// delivered, by source. No `lost` record means nothing was lost in that interval.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug)]
#[schemars(deny_unknown_fields)]
pub struct LostRecord {
    /// Measured length of the interval, in milliseconds.
    pub interval_ms: u64,
    /// Map from loss source to how many events or measurements were lost there in this interval
    /// (each at least 1).
    ///
    /// Where data was dropped: `<family>.<source>` for a counted drop in the kernel side (block:
    /// `slow_io_ringbuf_full`, `kernel_skipped` (request completions the kernel did not run the
    /// hook for: counted in `count`, without samples), `bio_table_full`, `request_table_full`,
    /// `block_stats_entry_unavailable`, `disk_table_full`, `bio_chain_truncated`,
    /// `stale_slot_displaced`; tcp: `retransmit_ringbuf_full`, `peer_table_evicted`,
    /// `flow_netns_over_limit`, `flow_netns_unsampled`, `flow_socket_undecodable`; netdev:
    /// `netdev_stats_entry_unavailable`), `output.queue_full` for records the output queue
    /// dropped because the reader fell `--out-buffer-kib` behind (the gaps in `seqno`),
    /// `stall.records` for per-event records (`tcp_retransmit`, `slow_io`) of an interval the
    /// stall detector could not hold (past 10,000 in one interval: they are still in the stream,
    /// but episodes of that interval may miss their evidence), or
    /// `<family>.recursion_miss.<program>` for runs of an eBPF program the kernel skipped
    /// because it was already running on that CPU.
    pub by_source: BTreeMap<String, u64>,
}

/// One eBPF program's counters since it was loaded, from the kernel's own accounting
/// (BPF_OBJ_GET_INFO_BY_FD).
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug)]
#[schemars(deny_unknown_fields, rename = "program_cost")]
pub struct ProgramCost {
    /// Probe family the program belongs to.
    pub family: String,
    #[serde(flatten)]
    pub stats: ProgramStats,
    /// Mean cost of one run in nanoseconds (run_time_ns / run_count, rounded to 0.1); present
    /// only when run_count is above 0.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub ns_per_run: Option<f64>,
}

/// Written once, last, when the run ends on --duration or SIGINT/SIGTERM (not when the output is
/// closed): totals for the run.
#[derive(Serialize, Deserialize, JsonSchema, Clone, Debug)]
#[schemars(deny_unknown_fields)]
pub struct StopRecord {
    /// Why the run ended.
    pub reason: StopReason,
    /// Run length from the start of streaming (just after attach) to this record, in
    /// milliseconds.
    pub elapsed_ms: u64,
    /// Map from record type to how many records of it were written before this one (types never
    /// written are absent): lets a consumer tell a truncated file from a complete one.
    pub records: BTreeMap<String, u64>,
    /// Map from loss source to everything lost there over the run (the sum of the `lost`
    /// records); empty when nothing was lost. The sources are those of `lost`.by_source.
    pub lost: BTreeMap<String, u64>,
    /// Per eBPF program cost and skipped runs, for every attached family.
    pub programs: Vec<ProgramCost>,
}

/// Why a run ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "stop_reason")]
pub enum StopReason {
    /// SIGINT or SIGTERM.
    Signal,
    /// `--duration` elapsed.
    Duration,
    /// The output failed (e.g. its disk was full): written only if the output took this record
    /// after all.
    OutputError,
}

impl StopReason {
    /// The name the records use.
    pub fn name(self) -> &'static str {
        match self {
            StopReason::Signal => "signal",
            StopReason::Duration => "duration",
            StopReason::OutputError => "output_error",
        }
    }
}
