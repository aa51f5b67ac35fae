//! Keeps docs/schema.json honest: every record type the binary emits is built
//! here from the real record structs, written through the real `JsonWriter`
//! envelope, and validated against the schema; and the schema is shown to
//! reject what it must (unknown fields, missing fields, a malformed `ts`).

use std::collections::BTreeMap;

use serde_json::{Value, json};

use super::records::{FamilyReport, Filters, LostRecord, ProgramCost, StartRecord, StopRecord};
use super::{JsonWriter, SharedBuffer};
use crate::abi::{self, slow_io_event};
use crate::block::record::{BlockRecord, SlowIoRecord, op_name};
use crate::block::sysfs::QueueLimits;
use crate::hist::{Histogram, HistogramRecord};
use crate::host::clock::{Clock, monotonic_ns};
use crate::host::link::{Exposed, LinkCounters, LinkHealth, PauseCounters, QdiscStats};
use crate::netdev::record::NetdevRecord;
use crate::probes::lost::source_name;
use crate::probes::stats::ProgramStats;
use crate::probes::{AttachKind, HookMode, HookStatus};
use crate::sqlserver::dmv::DmvSession;
use crate::sqlserver::inventory::{FileSummary, Instance, Session, SessionKind};
use crate::sqlserver::record::{SqlInstanceRecord, SqlSessionRecord, SqlTag};
use crate::tcp::record::{TcpFlowRecord, TcpRetransmitRecord, TcpRttRecord};

const SCHEMA: &str = include_str!("../../../docs/schema.json");

/// Every record type `stalltrace run` emits today.
const RECORD_TYPES: [&str; 12] = [
    "start",
    "block",
    "slow_io",
    "tcp_retransmit",
    "tcp_rtt",
    "netdev",
    "sql_instance",
    "sql_session",
    "lost",
    "stop",
    "stall",
    "tcp_flow",
];

/// Top-level fields serialized only when set (`skip_serializing_if`), by record type.
const OPTIONAL: &[(&str, &str)] = &[
    ("start", "duration_ms"),
    ("start", "stalls"),
    ("start", "bulk_mbps"),
    ("start", "prometheus"),
    ("stall", "end"),
    ("stall", "dev"),
    ("stall", "role"),
    ("stall", "iface"),
    ("stall", "peer"),
    ("stall", "flow"),
    ("stall", "netns"),
    ("stall", "sessions_omitted"),
    ("stall", "files"),
    ("block", "role"),
    ("slow_io", "tag_wait_us"),
    ("slow_io", "queue_us"),
    ("tcp_retransmit", "stalled_ms"),
    ("tcp_retransmit", "pid"),
    ("tcp_retransmit", "tid"),
    ("tcp_retransmit", "comm"),
    ("tcp_retransmit", "sock_ino"),
    ("netdev", "link"),
    ("tcp_retransmit", "sql"),
    ("tcp_rtt", "sql"),
    ("tcp_flow", "sock_ino"),
    ("tcp_flow", "pids"),
    ("tcp_flow", "sql"),
    ("slow_io", "sql"),
    ("slow_io", "file"),
    ("sql_instance", "watchdog_pid"),
    ("sql_instance", "part"),
    ("sql_instance", "parts"),
    ("sql_instance", "split"),
    ("start", "file"),
    ("sql_session", "spid"),
    ("sql_session", "dmv"),
    ("netdev", "rx_packets"),
    ("netdev", "rx_bytes"),
    ("netdev", "tx_packets"),
    ("netdev", "tx_bytes"),
];

fn schema() -> Value {
    serde_json::from_str(SCHEMA).expect("docs/schema.json is not valid JSON")
}

fn validator() -> jsonschema::Validator {
    jsonschema::draft202012::options()
        .should_validate_formats(true)
        .build(&schema())
        .expect("docs/schema.json does not compile")
}

fn errors(v: &jsonschema::Validator, record: &Value) -> Vec<String> {
    v.iter_errors(record)
        .map(|e| format!("{}: {e}", e.instance_path()))
        .collect()
}

/// A latency histogram as the block family builds it: nanoseconds in, microseconds out.
fn latency_us(values_ns: &[(u64, u64)]) -> HistogramRecord {
    let mut h = Histogram::default();
    for &(v, n) in values_ns {
        h.record(v, n);
    }
    h.to_record(1e-3)
}

fn inflight(depths: &[(u64, u64)]) -> HistogramRecord {
    let mut h = Histogram::default();
    for &(v, n) in depths {
        h.record(v, n);
    }
    h.to_record(1.0)
}

fn slow_io(flags: u32, op: u32) -> SlowIoRecord {
    let mut e = slow_io_event {
        kind: abi::EVENT_SLOW_IO,
        flags,
        ts_ns: monotonic_ns(),
        total_ns: 212_345_678,
        tag_wait_ns: 180_000_123,
        queue_ns: 4_321,
        device_ns: 32_000_000,
        sector: 1_953_525_160,
        bytes: 65_536,
        major: 259,
        minor: 0,
        op,
        tgid: 4242,
        pid: 4251,
        error: 0,
        ..Default::default()
    };
    for (i, b) in b"sqlservr".iter().enumerate() {
        e.comm[i] = *b as _;
    }
    SlowIoRecord::from_event(&e, "nvme0n1".into())
}

/// A slow I/O of the SQL Server worker on a log file.
fn sql_slow_io() -> SlowIoRecord {
    SlowIoRecord {
        file: Some("/var/opt/mssql/data/sales_log.ldf".into()),
        sql: Some(SqlTag::for_instance(4242)),
        ..slow_io(
            abi::SLOW_IO_HAS_TAG_WAIT | abi::SLOW_IO_HAS_QUEUE,
            abi::BLOCK_OP_WRITE,
        )
    }
}

/// One realistic instance of every record type, with optional fields both
/// present and absent, exactly as `JsonWriter` writes them.
fn emitted_lines() -> Vec<String> {
    let buf = SharedBuffer::default();
    let mut w = JsonWriter::new(Box::new(buf.clone()), "sqlhost-01".into());
    let clock = Clock::new();
    let now = Clock::now_rfc3339;

    // start: a fallback to raw_tp with a failed tp_btf hook, and a family that failed (--degrade).
    let families = [
        FamilyReport {
            family: "block",
            attached: true,
            mode: Some(HookMode::RawTp),
            fallback_reason: Some(
                "cannot attach the block probe at block_getrq (TpBtf): Invalid argument".into(),
            ),
            error: None,
        },
        FamilyReport {
            family: "tcp",
            attached: false,
            mode: None,
            fallback_reason: None,
            error: Some("cannot attach the tcp probe at its maps: Operation not permitted".into()),
        },
    ];
    let probes = [
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
            ..HookStatus::untried("block", "block_getrq", HookMode::TpBtf)
        },
        HookStatus::untried("block", "block_rq_issue", HookMode::TpBtf),
        HookStatus {
            attached: true, // id not reported
            via: Some(AttachKind::RawTp),
            target: Some("block_getrq".into()),
            ..HookStatus::untried("block", "block_getrq", HookMode::RawTp)
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
    let netns = [crate::host::netns::Netns {
        spec: "sqlns".into(),
        inode: 4026532317,
        path: None,
    }];
    let ifaces = ["eth0".to_string()];
    let thresholds = crate::stall::Thresholds::default();
    let start = StartRecord {
        version: env!("CARGO_PKG_VERSION"),
        kernel: "6.18.0-stalltrace".into(),
        interval_ms: 1000,
        duration_ms: Some(30_000),
        slow_io_ms: 0.5,
        bpf_stats: true,
        kernel_hz: 250,
        kernel_hz_source: "/proc/config.gz",
        filters: Filters {
            ports: &[1433, 5022],
            netns: &netns,
            ifaces: &ifaces,
        },
        bulk_mbps: Some(8.0),
        prometheus: Some("127.0.0.1:9466".parse().unwrap()),
        stalls: Some(&thresholds),
        families: &families,
        probes: &probes,
    };
    w.emit("start", &now(), &start).unwrap();
    // start: the plainest run (no --duration, slow_io off, every hook attached).
    let families = [FamilyReport {
        family: "block",
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
            ports: &[],
            netns: &[],
            ifaces: &[],
        },
        bulk_mbps: None,
        prometheus: None,
        stalls: None,
        families: &families,
        probes: &probes[..1],
        ..start
    };
    w.emit("start", &now(), &start).unwrap();
    // The start that opens a run's further file after rotation or SIGHUP.
    let mut continued = serde_json::to_value(&start).unwrap();
    continued["file"] = json!(1);
    w.emit("start", &now(), &continued).unwrap();

    // block: a busy disk with every queue limit known and a role.
    let ts = now();
    let busy = BlockRecord {
        dev: "nvme0n1".into(),
        major: 259,
        minor: 0,
        op: "write",
        interval_ms: 1001,
        count: 5210,
        bytes: 21_340_160,
        bios: 5400,
        requeues: 3,
        errors: 1,
        completions_unseen: 2,
        latency_us: latency_us(&[(85_000, 5000), (1_200_000, 390), (250_000_000, 10)]),
        tag_wait_us: latency_us(&[(300, 5000), (900_000, 400)]),
        queue_us: latency_us(&[(2_000, 5210)]),
        device_us: latency_us(&[(70_000, 5200), (30_000_000, 10)]),
        inflight: inflight(&[(1, 10), (8, 4000), (32, 1200)]),
        inflight_now: 7,
        queue_limit: QueueLimits {
            scheduler: Some("mq-deadline".into()),
            nr_requests: Some(64),
            hw_queue_depth: Some(1023),
            nr_hw_queues: Some(2),
            device_queue_depth: Some(32),
        },
        role: Some("log".into()),
    };
    w.emit("block", &ts, &busy).unwrap();
    // block: every op name, idle (empty histograms), nothing known about the queue.
    for op in 0..abi::BLOCK_OP_COUNT {
        let idle = BlockRecord {
            dev: "7:3".into(),
            major: 7,
            minor: 3,
            op: op_name(op),
            interval_ms: 999,
            count: 0,
            bytes: 0,
            bios: 0,
            requeues: 0,
            errors: 0,
            completions_unseen: 0,
            latency_us: latency_us(&[]),
            tag_wait_us: latency_us(&[]),
            queue_us: latency_us(&[]),
            device_us: latency_us(&[]),
            inflight: inflight(&[]),
            inflight_now: 0,
            queue_limit: QueueLimits::default(),
            role: None,
        };
        w.emit("block", &ts, &idle).unwrap();
    }

    // slow_io: decoded from kernel events, with and without the optional phases.
    for flags in [
        abi::SLOW_IO_HAS_TAG_WAIT | abi::SLOW_IO_HAS_QUEUE,
        abi::SLOW_IO_HAS_TAG_WAIT,
        0,
    ] {
        let r = slow_io(flags, abi::BLOCK_OP_WRITE);
        w.emit(
            "slow_io",
            &clock.monotonic_to_rfc3339(monotonic_ns()),
            &sql_slow_io(),
        )
        .unwrap();
        w.emit("slow_io", &clock.monotonic_to_rfc3339(monotonic_ns()), &r)
            .unwrap();
    }

    // tcp_retransmit: an owned RTO timer retransmit in an episode, and a bare v6 fast one.
    let mut rto = abi::tcp_retransmit_event {
        kind: abi::EVENT_TCP_RETRANSMIT,
        flags: abi::TCP_RETX_F_TIMER
            | abi::TCP_RETX_F_COUNTED
            | abi::TCP_RETX_F_OWNER
            | abi::TCP_RETX_F_EPISODE,
        sock_ino: 912_345,
        netns: 4026531840,
        family: 2,
        sport: 1433,
        dport: 50_123,
        state: 1,
        ca_state: 4,
        retx_kind: abi::TCP_RETX_RTO as u8,
        backoff: 1,
        retransmits: 2,
        segs: 1,
        bytes: 1448,
        rto_jiffies: 100,
        srtt_us: 350,
        stalled_ms: 612,
        tgid: 4242,
        pid: 4250,
        ..Default::default()
    };
    rto.saddr[..4].copy_from_slice(&[10, 1, 2, 3]);
    rto.daddr[..4].copy_from_slice(&[10, 1, 2, 4]);
    for (i, b) in b"sqlservr".iter().enumerate() {
        rto.comm[i] = *b as _;
    }
    let ts = clock.monotonic_to_rfc3339(monotonic_ns());
    let session_tag = SqlTag {
        pid: 4242,
        kind: Some(SessionKind::Client),
        spid: Some(57),
        client: Some("10.1.2.4:50123".into()),
        login: Some("app_user".into()),
        program: Some("OrderService".into()),
        database: Some("sales".into()),
        wait_type: Some("ASYNC_NETWORK_IO".into()),
        mars_spids: vec![61],
        ..Default::default()
    };
    w.emit(
        "tcp_retransmit",
        &ts,
        &TcpRetransmitRecord {
            sql: Some(session_tag.clone()),
            ..TcpRetransmitRecord::from_event(&rto, 250)
        },
    )
    .unwrap();
    let mut fast = abi::tcp_retransmit_event {
        family: 10,
        retx_kind: abi::TCP_RETX_FAST as u8,
        ca_state: 3,
        state: 1,
        err: -16,
        segs: 12,
        ..Default::default()
    };
    fast.daddr = [0xfd, 0, 0x57, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2];
    w.emit(
        "tcp_retransmit",
        &ts,
        &TcpRetransmitRecord::from_event(&fast, 1000),
    )
    .unwrap();

    // tcp_rtt: one peer with samples and retransmits.
    let rtt = TcpRttRecord {
        netns: 4026531840,
        family: "ipv4",
        peer: "10.1.2.4".into(),
        peer_port: 50_123,
        local_port: 1433,
        interval_ms: 1000,
        srtt_us: latency_us(&[(120_000, 300), (900_000, 2)]),
        retransmits: 4,
        retrans_segs: 9,
        rtos: 1,
        fast_retransmits: 2,
        tail_loss_probes: 1,
        syn_retransmits: 0,
        peer_table_full: false,
        sql: None,
    };
    w.emit("tcp_rtt", &ts, &rtt).unwrap();
    w.emit(
        "tcp_rtt",
        &ts,
        &TcpRttRecord {
            sql: Some(session_tag.clone()),
            ..rtt
        },
    )
    .unwrap();

    // tcp_flow: a receiver-limited replica stream, tagged; and an untagged
    // flow not accepted yet (no inode).
    let flow = TcpFlowRecord {
        netns: 4026531840,
        family: "ipv4",
        saddr: "10.1.2.3".into(),
        sport: 5022,
        daddr: "10.1.2.4".into(),
        dport: 50_200,
        sock_ino: Some(88_123),
        interval_ms: 1001,
        bytes_acked: 31_250_000,
        bytes_received: 41_000,
        send_mbps: 249.75,
        delivery_mbps: 251.2,
        busy_ms: 1000.0,
        rwnd_limited_ms: 812.0,
        sndbuf_limited_ms: 0.0,
        retrans_segs: 0,
        srtt_us: 410.0,
        cwnd: 64,
        limiter: "receiver",
        pids: Vec::new(),
        sql: Some(session_tag.clone()),
    };
    w.emit("tcp_flow", &ts, &flow).unwrap();
    w.emit(
        "tcp_flow",
        &ts,
        &TcpFlowRecord {
            sock_ino: None,
            limiter: "application",
            busy_ms: 120.0,
            rwnd_limited_ms: 0.0,
            pids: vec![3131, 3132],
            sql: None,
            ..flow
        },
    )
    .unwrap();

    // sql_instance and sql_session, as discovery writes them.
    let instance = Instance {
        pid: 4242,
        watchdog_pid: Some(4240),
        netns: 4026531840,
        tds_ports: vec![1433],
        ag_ports: vec![5022],
        files: vec![FileSummary {
            path: "/var/opt/mssql/data/sales.mdf".into(),
            role: "data",
            disks: vec!["259:0".into()],
        }],
        disk_roles: [
            ("259:0".to_string(), "data"),
            ("259:1".to_string(), "mixed"),
        ]
        .into_iter()
        .collect(),
    };
    w.emit(
        "sql_instance",
        &ts,
        &SqlInstanceRecord {
            instance: &instance,
        },
    )
    .unwrap();
    let orphan = Instance {
        watchdog_pid: None,
        ..instance.clone()
    };
    w.emit(
        "sql_instance",
        &ts,
        &SqlInstanceRecord { instance: &orphan },
    )
    .unwrap();
    // An instance of 150 databases: longer than a line, written in parts.
    let many_files = Instance {
        files: (0..300)
            .map(|i| FileSummary {
                path: format!("/var/opt/mssql/data/tenant_{i:04}.mdf").into(),
                role: "data",
                disks: vec!["259:0".into()],
            })
            .collect(),
        ..instance.clone()
    };
    w.emit(
        "sql_instance",
        &ts,
        &SqlInstanceRecord {
            instance: &many_files,
        },
    )
    .unwrap();
    let mut session = Session {
        pid: 4242,
        netns: 4026531840,
        kind: SessionKind::Client,
        local: "10.1.2.3:1433".parse().unwrap(),
        remote: "10.1.2.4:50123".parse().unwrap(),
        sock_ino: 912_345,
        first_seen: ts.clone(),
        spid: None,
        encrypted: false,
        dmv: Vec::new(),
        absent_at_ms: None,
    };
    let open = SqlSessionRecord {
        event: "open",
        session: &session,
    };
    w.emit("sql_session", &ts, &open).unwrap();
    session.spid = Some(57);
    // With DMV enrichment: the connection's session and a MARS one.
    session.dmv = vec![
        DmvSession {
            session_id: 57,
            connect_time_ms: 1_760_000_000_000,
            login: "app_user".into(),
            program: Some("OrderService".into()),
            host: Some("app01".into()),
            database: Some("sales".into()),
            status: "running".into(),
            request_status: Some("suspended".into()),
            command: Some("SELECT".into()),
            wait_type: Some("ASYNC_NETWORK_IO".into()),
            wait_time_ms: Some(12),
            blocking_session_id: Some(0),
            ..Default::default()
        },
        DmvSession {
            session_id: 61,
            connect_time_ms: 1_760_000_000_500,
            mars: true,
            login: "app_user".into(),
            status: "sleeping".into(),
            ..Default::default()
        },
    ];
    let identified = SqlSessionRecord {
        event: "identified",
        session: &session,
    };
    w.emit("sql_session", &ts, &identified).unwrap();

    // netdev: a physical interface with everything exposed, and one in a
    // namespace that cannot be entered (kernel figures only).
    let health = LinkHealth {
        ifindex: 2,
        name: "eth0".into(),
        oper_state: "up".into(),
        carrier: Some(true),
        carrier_changes: Some(0),
        speed_mbps: Exposed::Value(1000),
        duplex: Exposed::Value("half".into()),
        autoneg: Exposed::Value(false),
        counters: Some(LinkCounters {
            rx_packets: 1200,
            tx_packets: 900,
            collisions: 31,
            rx_crc_errors: 4,
            ..Default::default()
        }),
        pause: Exposed::Value(PauseCounters {
            autoneg: Some(true),
            rx_enabled: Some(true),
            tx_enabled: None,
            tx_pause_frames: Exposed::Value(0),
            rx_pause_frames: Exposed::NotExposed,
        }),
        qdisc: Some(QdiscStats {
            kind: "fq_codel".into(),
            backlog_bytes: 30_000,
            qlen_packets: 20,
            drops: 3,
            requeues: 1,
            overlimits: 0,
        }),
    };
    let netdev = NetdevRecord {
        iface: "eth0".into(),
        ifindex: 2,
        netns: 4026531840,
        interval_ms: 1000,
        rx_packets: Some(1200),
        rx_bytes: Some(80_000),
        tx_packets: Some(900),
        tx_bytes: Some(1_300_000),
        qdisc_us: latency_us(&[(3_000, 800), (4_000_000, 20)]),
        xmit_us: latency_us(&[(700, 900)]),
        rx_us: latency_us(&[(20_000, 70)]),
        qdisc_untimed: 3,
        tx_timeouts: 0,
        tx_stalls: 0,
        tx_busy: 0,
        link: Some(health.clone()),
    };
    w.emit("netdev", &ts, &netdev).unwrap();
    let unnamed = NetdevRecord {
        iface: "if7".into(),
        ifindex: 7,
        rx_packets: None,
        rx_bytes: None,
        tx_packets: None,
        tx_bytes: None,
        link: None,
        ..netdev
    };
    w.emit("netdev", &ts, &unnamed).unwrap();
    let bare = NetdevRecord {
        link: Some(LinkHealth {
            carrier: None,
            carrier_changes: None,
            speed_mbps: Exposed::NotExposed,
            duplex: Exposed::NotExposed,
            autoneg: Exposed::NotExposed,
            counters: None,
            pause: Exposed::NotExposed,
            qdisc: None,
            ..health
        }),
        ..unnamed.clone()
    };
    w.emit("netdev", &ts, &bare).unwrap();

    // stall: what the detector writes about an eventful interval (every kind
    // opens), and the same episodes closed at the end of the run.
    let mut detector = crate::stall::Detector::new(thresholds.clone(), &now());
    let interval = crate::stall::fixtures::eventful_interval();
    let opened = detector.interval(&interval, &now(), 1000.0);
    assert_eq!(opened.len(), 4, "{opened:?}");
    for stall in opened.iter().chain(&detector.finish()) {
        w.emit("stall", &now(), stall).unwrap();
    }

    // lost: every kernel loss source the block family names, and a recursion miss.
    let mut by_source: BTreeMap<String, u64> = (0..abi::LOST_SOURCE_COUNT)
        .map(|s| (format!("block.{}", source_name(s)), u64::from(s) + 1))
        .collect();
    by_source.insert("block.recursion_miss.on_block_rq_issue".into(), 2);
    let lost = LostRecord {
        interval_ms: 1000,
        by_source: &by_source,
    };
    w.emit("lost", &now(), &lost).unwrap();

    // stop: with program costs (bpf stats on and off) and losses ...
    let cost = |program: &str, run_count, run_time_ns| {
        let stats = ProgramStats {
            program: program.into(),
            run_count,
            run_time_ns,
            recursion_misses: 2,
        };
        // as run.rs computes it
        ProgramCost {
            family: "block",
            ns_per_run: stats.ns_per_run().map(|v| (v * 10.0).round() / 10.0),
            stats,
        }
    };
    let records = w.emitted().clone();
    let stop = StopRecord {
        reason: "duration",
        elapsed_ms: 30_004,
        records: &records,
        lost: &by_source,
        programs: vec![
            cost("on_block_rq_issue", 123_456, 9_876_543),
            cost("on_block_getrq", 0, 0),
        ],
    };
    w.emit("stop", &now(), &stop).unwrap();
    // ... and without either.
    let records = w.emitted().clone();
    let nothing = BTreeMap::new();
    let stop = StopRecord {
        reason: "signal",
        elapsed_ms: 12,
        records: &records,
        lost: &nothing,
        programs: Vec::new(),
    };
    w.emit("stop", &now(), &stop).unwrap();

    let text = buf.text();
    text.lines().map(str::to_string).collect()
}

fn emitted() -> Vec<Value> {
    emitted_lines()
        .iter()
        .map(|l| serde_json::from_str(l).expect("a record line is JSON"))
        .collect()
}

fn first_of(records: &[Value], kind: &str) -> Value {
    records
        .iter()
        .find(|r| r["type"] == kind)
        .unwrap_or_else(|| panic!("no {kind} record built"))
        .clone()
}

#[test]
fn schema_is_a_valid_draft_2020_12_schema() {
    let s = schema();
    assert_eq!(s["$schema"], "https://json-schema.org/draft/2020-12/schema");
    if let Err(e) = jsonschema::meta::validate(&s) {
        panic!("docs/schema.json is not a valid JSON Schema: {e}");
    }
    let types: Vec<&str> = s["$defs"]["record_type"]["enum"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(types, RECORD_TYPES, "record types in the schema");
    for t in RECORD_TYPES {
        let def = &s["$defs"][t];
        assert_eq!(def["properties"]["type"]["const"], t, "$defs/{t}");
        assert_eq!(def["additionalProperties"], false, "$defs/{t}");
    }
    assert_eq!(s["$defs"]["schema_version"]["const"], super::SCHEMA_VERSION);
}

#[test]
fn every_field_and_shape_is_described() {
    fn walk(node: &Value, path: &str, missing: &mut Vec<String>) {
        let Value::Object(map) = node else {
            if let Value::Array(items) = node {
                for (i, item) in items.iter().enumerate() {
                    walk(item, &format!("{path}/{i}"), missing);
                }
            }
            return;
        };
        for (key, value) in map {
            // Conditions restate properties already described; they need no descriptions.
            if matches!(key.as_str(), "if" | "then" | "else" | "not") {
                continue;
            }
            if key == "properties" || key == "$defs" {
                for (name, sub) in value.as_object().unwrap() {
                    let described = sub
                        .get("description")
                        .and_then(Value::as_str)
                        .is_some_and(|d| !d.trim().is_empty());
                    if !described {
                        missing.push(format!("{path}/{key}/{name}"));
                    }
                }
            }
            walk(value, &format!("{path}/{key}"), missing);
        }
    }
    let mut missing = Vec::new();
    walk(&schema(), "#", &mut missing);
    assert!(missing.is_empty(), "without a description: {missing:#?}");
}

#[test]
fn every_record_the_code_builds_validates() {
    let v = validator();
    let records = emitted();
    for (line, record) in emitted_lines().iter().zip(&records) {
        let errs = errors(&v, record);
        assert!(errs.is_empty(), "{line}\n{errs:#?}");
    }
    for t in RECORD_TYPES {
        assert!(
            records.iter().any(|r| r["type"] == t),
            "no {t} record checked"
        );
    }
    // Optional fields were checked both present and absent.
    for &(t, field) in OPTIONAL {
        let of_type: Vec<_> = records.iter().filter(|r| r["type"] == t).collect();
        assert!(
            of_type.iter().any(|r| r.get(field).is_some()),
            "{t}.{field} present"
        );
        assert!(
            of_type.iter().any(|r| r.get(field).is_none()),
            "{t}.{field} absent"
        );
    }
}

#[test]
fn the_real_timestamp_formats_match() {
    let v = validator();
    let mut record = first_of(&emitted(), "lost");
    for ts in [
        Clock::now_rfc3339(),
        Clock::new().monotonic_to_rfc3339(monotonic_ns()),
        Clock::new().monotonic_to_rfc3339(0),
    ] {
        record["ts"] = json!(ts);
        assert!(v.is_valid(&record), "{ts}");
    }
}

#[test]
fn a_malformed_ts_fails() {
    let v = validator();
    let good = first_of(&emitted(), "block");
    for ts in [
        "2026-11-21T22:43:51.014898+00:00", // offset instead of Z
        "2026-11-21T22:43:51.014898z",
        "2026-11-21T22:43:51Z",           // no fraction
        "2026-11-21T22:43:51.014Z",       // milliseconds
        "2026-11-21T22:43:51.014898123Z", // nanoseconds
        "2026-11-21 22:43:51.014898Z",    // space separator
        "2026-13-21T22:43:51.014898Z",    // month 13
        "1795473831",
        "",
    ] {
        let mut bad = good.clone();
        bad["ts"] = json!(ts);
        assert!(!v.is_valid(&bad), "ts {ts:?} was accepted");
    }
    let mut bad = good;
    bad["ts"] = json!(1_795_473_831_014_898u64);
    assert!(!v.is_valid(&bad), "numeric ts was accepted");
}

/// Every object in every record is closed: a field added in Rust without
/// updating the schema fails, at any depth (records, histograms, queue
/// limits, hook statuses, program costs; and keys of the by-name maps).
#[test]
fn an_unknown_field_fails_anywhere() {
    fn object_paths(node: &Value, path: Vec<String>, out: &mut Vec<Vec<String>>) {
        match node {
            Value::Object(map) => {
                out.push(path.clone());
                for (k, v) in map {
                    let mut p = path.clone();
                    p.push(k.clone());
                    object_paths(v, p, out);
                }
            }
            Value::Array(items) => {
                for (i, v) in items.iter().enumerate() {
                    let mut p = path.clone();
                    p.push(i.to_string());
                    object_paths(v, p, out);
                }
            }
            _ => {}
        }
    }
    fn at<'a>(node: &'a mut Value, path: &[String]) -> &'a mut Value {
        path.iter().fold(node, |n, key| match n {
            Value::Array(items) => &mut items[key.parse::<usize>().unwrap()],
            _ => &mut n[key.as_str()],
        })
    }
    let v = validator();
    let mut checked = 0;
    for record in emitted() {
        let mut paths = Vec::new();
        object_paths(&record, Vec::new(), &mut paths);
        for path in paths {
            let mut bad = record.clone();
            at(&mut bad, &path)
                .as_object_mut()
                .unwrap()
                .insert("unexpected_field".into(), json!(1));
            assert!(
                !v.is_valid(&bad),
                "{} record: an unknown field at /{} was accepted",
                record["type"],
                path.join("/")
            );
            checked += 1;
        }
    }
    assert!(checked > 50, "{checked}");
}

#[test]
fn a_missing_field_fails() {
    let v = validator();
    let records = emitted();

    let mut block = first_of(&records, "block");
    block.as_object_mut().unwrap().remove("latency_us");
    assert!(
        !v.is_valid(&block),
        "a block record without latency_us was accepted"
    );

    // Every record is numbered, in order, and every top-level field that is
    // always serialized is required.
    for (n, record) in records.iter().enumerate() {
        assert_eq!(record["seqno"], n, "{record}");
    }
    for record in &records {
        let t = record["type"].as_str().unwrap();
        for field in record.as_object().unwrap().keys() {
            let mut without = record.clone();
            without.as_object_mut().unwrap().remove(field);
            let optional = OPTIONAL.contains(&(t, field.as_str()));
            assert_eq!(
                v.is_valid(&without),
                optional,
                "{t} record without {field}: optional is {optional}"
            );
        }
    }
    // ... and every histogram field.
    for field in [
        "count",
        "mean",
        "p50",
        "p90",
        "p99",
        "max",
        "scale",
        "first_bucket",
        "counts",
    ] {
        let mut bad = first_of(&records, "block");
        bad["device_us"].as_object_mut().unwrap().remove(field);
        assert!(
            !v.is_valid(&bad),
            "a histogram without {field} was accepted"
        );
    }
}

#[test]
fn wrong_values_fail() {
    let v = validator();
    let records = emitted();
    let bad = |kind: &str, edit: &dyn Fn(&mut Value)| {
        let mut r = first_of(&records, kind);
        edit(&mut r);
        assert!(!v.is_valid(&r), "accepted: {r}");
    };
    // A type the schema does not know (not emitted yet) fails.
    bad("lost", &|r| r["type"] = json!("netdev_stall"));
    bad("start", &|r| r["schema"] = json!(1));
    bad("block", &|r| r["run"] = json!("run-1"));
    bad("block", &|r| r["op"] = json!("readwrite"));
    bad("block", &|r| r["count"] = json!(-1));
    bad("block", &|r| r["latency_us"]["p99"] = json!("12"));
    bad("block", &|r| r["latency_us"]["counts"][0] = json!(0));
    bad("block", &|r| r["latency_us"]["first_bucket"] = json!(976));
    // An empty histogram has no statistics.
    bad("block", &|r| r["latency_us"]["count"] = json!(0));
    bad("slow_io", &|r| r["pid"] = json!(-1));
    bad("start", &|r| r["probes"][0]["mode"] = json!("kprobe"));
    bad("start", &|r| {
        r["families"][0]["error"] = json!("attached and failed")
    });
    bad("lost", &|r| r["by_source"] = json!({}));
    bad("lost", &|r| r["by_source"] = json!({"no family prefix": 1}));
    bad("stop", &|r| r["reason"] = json!("crash"));
    bad("stop", &|r| r["records"]["netdev_stall"] = json!(1));
    bad("tcp_retransmit", &|r| r["kind"] = json!("dupack"));
    bad("tcp_retransmit", &|r| r["sport"] = json!(70000));
    bad("tcp_rtt", &|r| r["srtt_us"] = json!(120));
    bad("tcp_flow", &|r| r["limiter"] = json!("cwnd"));
    bad("tcp_flow", &|r| r["send_mbps"] = json!(-1.0));
    bad("stop", &|r| {
        r["programs"][0]
            .as_object_mut()
            .unwrap()
            .remove("ns_per_run");
    });
    bad("stop", &|r| r["programs"][1]["ns_per_run"] = json!(0.0));
}
