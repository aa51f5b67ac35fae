//! The block family's records: `block` and `slow_io`.

use super::latency_us;
use crate::abi::{self, slow_io_event};
use crate::hist::{Histogram, HistogramRecord};
use crate::host::clock::monotonic_ns;
use crate::host::container;
use crate::records::Examples;
use crate::records::block::{BlockOp, BlockRecord, QueueLimits, SlowIoRecord};
use crate::records::sql::SqlTag;

fn inflight(depths: &[(u64, u64)]) -> HistogramRecord {
    let mut h = Histogram::default();
    for &(v, n) in depths {
        h.record(v, n);
    }
    h.to_record(1.0)
}

/// A slow I/O as decoded from a kernel event.
fn decoded_slow_io(flags: u32, op: u32) -> SlowIoRecord {
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
        container: container::of_cgroup(
            "/machine.slice/libpod-2e2222c3a81289eb9bef02d9d669e8d0e12c6b9fa0470ae84110ead8628cfd5d.scope",
        )
        .map(|c| container::Container {
            name: Some("mssql-prod".into()),
            ..c
        }),
        ..decoded_slow_io(
            abi::SLOW_IO_HAS_TAG_WAIT | abi::SLOW_IO_HAS_QUEUE,
            abi::BLOCK_OP_WRITE,
        )
    }
}

/// A busy disk with every queue limit known and a role, and idle disks.
impl Examples for BlockRecord {
    fn examples() -> Vec<Self> {
        let mut all = Vec::new();
        let busy = BlockRecord {
            dev: "nvme0n1".into(),
            major: 259,
            minor: 0,
            op: BlockOp::Write,
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
        all.push(busy);
        // Every op name, idle (empty histograms), nothing known about the queue.
        for op in 0..abi::BLOCK_OP_COUNT {
            let idle = BlockRecord {
                dev: "7:3".into(),
                major: 7,
                minor: 3,
                op: BlockOp::from_kernel(op),
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
            all.push(idle);
        }
        all
    }
}

/// Decoded from kernel events, with and without the optional phases.
impl Examples for SlowIoRecord {
    fn examples() -> Vec<Self> {
        let mut all = Vec::new();
        for flags in [
            abi::SLOW_IO_HAS_TAG_WAIT | abi::SLOW_IO_HAS_QUEUE,
            abi::SLOW_IO_HAS_TAG_WAIT,
            0,
        ] {
            let r = decoded_slow_io(flags, abi::BLOCK_OP_WRITE);
            all.push(sql_slow_io());
            all.push(r);
        }
        all
    }
}
