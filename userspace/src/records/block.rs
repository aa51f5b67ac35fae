//! The block family's JSON records (schema v1: `block`, `slow_io`).
//! Wire structs (abi.rs) are decoded into these; these are what the schema describes.

use serde::Serialize;

use super::sysfs::QueueLimits;
use crate::abi::{self, slow_io_event};
use crate::hist::HistogramRecord;
use crate::sqlserver::record::SqlTag;

/// Name of an `enum block_op` value in records.
pub fn op_name(op: u32) -> &'static str {
    match op {
        abi::BLOCK_OP_READ => "read",
        abi::BLOCK_OP_WRITE => "write",
        abi::BLOCK_OP_FLUSH => "flush",
        abi::BLOCK_OP_DISCARD => "discard",
        _ => "other",
    }
}

/// Per disk, per op, per interval.
#[derive(Clone, Debug, Serialize)]
pub struct BlockRecord {
    pub dev: String,
    pub major: u32,
    pub minor: u32,
    pub op: &'static str,
    pub interval_ms: u64,
    /// Requests completed (the unit /proc/diskstats counts).
    pub count: u64,
    pub bytes: u64,
    /// Bios completed: what submitters issued; more than `count` when the block layer merges.
    pub bios: u64,
    /// Requests the driver handed back (queue full, resource shortage).
    pub requeues: u64,
    /// Requests completed with an error, and bios that failed before reaching a request.
    pub errors: u64,
    /// Requests of `count` whose completion the hook ran for but could not settle
    /// (no record of its issue found, or no statistics entry), found out in this
    /// interval (no histogram samples).
    /// Completions the kernel did not run the hook for are in `count` too, and
    /// reported in `lost` as `block.kernel_skipped`.
    pub completions_unseen: u64,
    /// Bio submitted -> bio completed.
    pub latency_us: HistogramRecord,
    /// Bio submitted -> request allocated: waiting for a tag (queue depth) or request.
    pub tag_wait_us: HistogramRecord,
    /// Request allocated -> issued to the driver: plugging, scheduler, dispatch.
    pub queue_us: HistogramRecord,
    /// Issued -> completed: what the device (or the layer under it) took.
    pub device_us: HistogramRecord,
    /// Requests in flight on the whole disk at each issue of this op.
    pub inflight: HistogramRecord,
    /// Requests in flight on the whole disk at the end of the interval.
    pub inflight_now: i64,
    pub queue_limit: QueueLimits,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

/// One I/O slower than `--slow-io-ms`.
#[derive(Clone, Debug, Serialize)]
pub struct SlowIoRecord {
    pub dev: String,
    pub major: u32,
    pub minor: u32,
    pub op: &'static str,
    /// First bio submitted -> request completed.
    pub latency_us: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tag_wait_us: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_us: Option<f64>,
    pub device_us: f64,
    pub sector: u64,
    pub bytes: u32,
    /// Process (thread group) that submitted the I/O, and the thread.
    pub pid: u32,
    pub tid: u32,
    pub comm: String,
    /// Kernel blk_status_t of the completion; 0 is success.
    pub error: i32,
    /// The SQL Server database file the I/O touched (from the file's extents on the disk).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The SQL Server instance, when its worker submitted the I/O.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlTag>,
}

impl SlowIoRecord {
    pub fn from_event(e: &slow_io_event, dev: String) -> Self {
        let us = |ns: u64| (ns as f64 / 1000.0 * 1000.0).round() / 1000.0;
        let comm_len = e.comm.iter().position(|&c| c == 0).unwrap_or(e.comm.len());
        let comm: Vec<u8> = e.comm[..comm_len].iter().map(|&c| c as u8).collect();
        Self {
            dev,
            major: e.major,
            minor: e.minor,
            op: op_name(e.op),
            latency_us: us(e.total_ns),
            tag_wait_us: (e.flags & abi::SLOW_IO_HAS_TAG_WAIT != 0).then(|| us(e.tag_wait_ns)),
            queue_us: (e.flags & abi::SLOW_IO_HAS_QUEUE != 0).then(|| us(e.queue_ns)),
            device_us: us(e.device_ns),
            sector: e.sector,
            bytes: e.bytes,
            pid: e.tgid,
            tid: e.pid,
            comm: String::from_utf8_lossy(&comm).into_owned(),
            error: e.error,
            file: None,
            sql: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slow_io_event_decodes() {
        let mut e = slow_io_event {
            kind: abi::EVENT_SLOW_IO,
            flags: abi::SLOW_IO_HAS_TAG_WAIT,
            total_ns: 250_000_000,
            tag_wait_ns: 1_500,
            queue_ns: 0,
            device_ns: 249_000_000,
            major: 7,
            minor: 3,
            op: abi::BLOCK_OP_WRITE,
            tgid: 42,
            pid: 43,
            bytes: 4096,
            ..Default::default()
        };
        for (i, b) in b"sqlservr".iter().enumerate() {
            e.comm[i] = *b as _;
        }
        let r = SlowIoRecord::from_event(&e, "loop3".into());
        assert_eq!(r.latency_us, 250_000.0);
        assert_eq!(r.tag_wait_us, Some(1.5));
        assert_eq!(r.queue_us, None);
        assert_eq!(r.op, "write");
        assert_eq!(r.comm, "sqlservr");
        assert_eq!((r.pid, r.tid), (42, 43));
    }

    #[test]
    fn every_op_has_a_name() {
        let names: Vec<_> = (0..abi::BLOCK_OP_COUNT).map(op_name).collect();
        assert_eq!(names, ["read", "write", "flush", "discard", "other"]);
    }
}
