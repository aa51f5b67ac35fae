//! Run-level records: `start`, `lost` and `stop`.

use std::collections::BTreeMap;

use crate::abi;
use crate::host::clock::Clock;
use crate::output::JsonWriter;
use crate::probes::lost::source_name;
use crate::records::run::{
    AttachKind, FamilyReport, Filters, HeartbeatRecord, HookMode, HookStatus, LostRecord,
    ProgramCost, ProgramStats, StartRecord, StopReason, StopRecord,
};

/// A fallback to raw_tp with a failed tp_btf hook, and a family that failed
/// (--degrade); the plainest run; and the start of a further file.
pub(super) fn start(w: &mut JsonWriter) {
    let now = Clock::now_rfc3339;
    let families = vec![
        FamilyReport {
            family: "block".into(),
            attached: true,
            mode: Some(HookMode::RawTp),
            fallback_reason: Some(
                "cannot attach the block probe at block_rq_requeue (TpBtf): Invalid argument"
                    .into(),
            ),
            error: None,
        },
        FamilyReport {
            family: "tcp".into(),
            attached: false,
            mode: None,
            fallback_reason: None,
            error: Some("cannot attach the tcp probe at its maps: Operation not permitted".into()),
        },
    ];
    let probes = vec![
        HookStatus {
            error: Some("unknown BTF type `btf_trace_dql_stall_detected`".into()),
            optional: true,
            ..HookStatus::untried("netdev", "dql_stall_detected", HookMode::TpBtf)
        },
        HookStatus {
            attached: true,
            via: Some(AttachKind::TpBtf),
            target: Some("block_bio_complete".into()),
            program_id: Some(4711),
            ..HookStatus::untried("block", "block_bio_complete", HookMode::TpBtf)
        },
        HookStatus {
            error: Some("Invalid argument (os error 22)".into()),
            ..HookStatus::untried("block", "block_rq_requeue", HookMode::TpBtf)
        },
        HookStatus::untried("block", "block_rq_issue", HookMode::TpBtf),
        HookStatus {
            attached: true, // id not reported
            via: Some(AttachKind::RawTp),
            target: Some("block_rq_requeue".into()),
            ..HookStatus::untried("block", "block_rq_requeue", HookMode::RawTp)
        },
        HookStatus {
            attached: true,
            via: Some(AttachKind::Fentry),
            target: Some("tcp_sendmsg_locked".into()),
            fallback_reason: Some("tp_btf tcp_sendmsg_locked: unknown BTF type".into()),
            program_id: Some(4712),
            ..HookStatus::untried("sqlserver", "tcp_sendmsg_locked", HookMode::TpBtf)
        },
        HookStatus {
            attached: true,
            via: Some(AttachKind::TpBtf),
            target: Some("tcp_retransmit_skb".into()),
            note: Some(
                "this kernel's tracepoint fires only for retransmissions that went out".into(),
            ),
            program_id: Some(4713),
            ..HookStatus::untried("tcp", "tcp_retransmit_skb", HookMode::TpBtf)
        },
    ];
    let netns = vec![crate::host::netns::Netns {
        spec: "sqlns".into(),
        inode: 4026532317,
        path: None,
    }];
    let ifaces = vec!["eth0".to_string()];
    let thresholds = crate::stall::Thresholds::default();
    let start = StartRecord {
        version: env!("CARGO_PKG_VERSION").into(),
        kernel: "6.18.0-stalltrace".into(),
        interval_ms: 1000,
        duration_ms: Some(30_000),
        slow_io_ms: 0.5,
        bpf_stats: true,
        kernel_hz: 250,
        kernel_hz_source: "/proc/config.gz".into(),
        filters: Filters {
            ports: vec![1433, 5022],
            netns,
            ifaces,
            disks: vec!["259:0".into(), "8:16".into()],
            pids: vec![4242],
            comms: vec!["sqlservr".into()],
            containers: vec!["0123456789abcdef".repeat(4)],
        },
        bulk_mbps: Some(8.0),
        prometheus: Some("127.0.0.1:9466".parse().unwrap()),
        stalls: Some(thresholds),
        families,
        probes: probes.clone(),
        sql_tls: Some(crate::records::sql::SqlTlsStart {
            policy: crate::records::sql::TlsPolicy::OnDemand,
            available: true,
            reason: None,
        }),
        file: None,
    };
    w.emit(&now(), &start).unwrap();
    // The plainest run (no --duration, slow_io off, every hook attached).
    let families = vec![FamilyReport {
        family: "block".into(),
        attached: true,
        mode: Some(HookMode::TpBtf),
        fallback_reason: None,
        error: None,
    }];
    let start = StartRecord {
        duration_ms: None,
        slow_io_ms: 0.0,
        bpf_stats: false,
        filters: Filters {
            ports: Vec::new(),
            netns: Vec::new(),
            ifaces: Vec::new(),
            disks: Vec::new(),
            pids: Vec::new(),
            comms: Vec::new(),
            containers: Vec::new(),
        },
        bulk_mbps: None,
        prometheus: None,
        stalls: None,
        families,
        probes: probes[..1].to_vec(),
        sql_tls: Some(crate::records::sql::SqlTlsStart {
            policy: crate::records::sql::TlsPolicy::Always,
            available: false,
            reason: Some("this kernel has no uprobes".into()),
        }),
        ..start
    };
    w.emit(&now(), &start).unwrap();
    // The start that opens a run's further file; its sqlserver family did not attach.
    let continued = StartRecord {
        file: Some(1),
        sql_tls: None,
        ..start
    };
    w.emit(&now(), &continued).unwrap();
}

/// Every kernel loss source the block family names, and a recursion miss.
/// Returns the losses, which `stop` reports as the run's totals.
pub(super) fn lost(w: &mut JsonWriter) -> BTreeMap<String, u64> {
    let now = Clock::now_rfc3339;
    let mut by_source: BTreeMap<String, u64> = (0..abi::LOST_SOURCE_COUNT)
        .map(|s| (format!("block.{}", source_name(s)), u64::from(s) + 1))
        .collect();
    by_source.insert("block.recursion_miss.on_block_rq_issue".into(), 2);
    let lost = LostRecord {
        interval_ms: 1000,
        by_source,
    };
    w.emit(&now(), &lost).unwrap();
    lost.by_source
}

/// An interval with nothing else to say.
pub(super) fn heartbeat(w: &mut JsonWriter) {
    w.emit(
        &Clock::now_rfc3339(),
        &HeartbeatRecord { interval_ms: 1000 },
    )
    .unwrap();
}

/// `stop` counts every record `w` has written so far, so it comes last.
pub(super) fn stop(w: &mut JsonWriter, by_source: &BTreeMap<String, u64>) {
    let now = Clock::now_rfc3339;
    // With program costs (bpf stats on and off) and losses ...
    let cost = |program: &str, run_count, run_time_ns| {
        let stats = ProgramStats {
            program: program.into(),
            run_count,
            run_time_ns,
            recursion_misses: 2,
        };
        // as the daemon's run.rs computes it
        ProgramCost {
            family: "block".into(),
            ns_per_run: stats.ns_per_run().map(|v| (v * 10.0).round() / 10.0),
            stats,
        }
    };
    let stop = StopRecord {
        reason: StopReason::Duration,
        elapsed_ms: 30_004,
        records: emitted(w),
        lost: by_source.clone(),
        programs: vec![
            cost("on_block_rq_issue", 123_456, 9_876_543),
            cost("on_block_rq_requeue", 0, 0),
        ],
    };
    w.emit(&now(), &stop).unwrap();
    // ... and without either.
    let stop = StopRecord {
        reason: StopReason::Signal,
        elapsed_ms: 12,
        records: emitted(w),
        lost: BTreeMap::new(),
        programs: Vec::new(),
    };
    w.emit(&now(), &stop).unwrap();
}

/// The records `w` has written so far, by type, as `stop` reports them.
fn emitted(w: &JsonWriter) -> BTreeMap<String, u64> {
    w.emitted()
        .iter()
        .map(|(kind, n)| ((*kind).to_string(), *n))
        .collect()
}
