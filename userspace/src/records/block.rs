//! The block family's records: `block` and `slow_io`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::sql::SqlTag;
use crate::abi::{self, slow_io_event};
use crate::hist::HistogramRecord;
use crate::host::container::Container;

/// Block operation class: `read`; `write` (a write carrying data); `flush` (a cache flush:
/// REQ_OP_FLUSH, or the empty write with REQ_PREFLUSH that fsync sends); `discard` (discard or
/// secure erase); `other` (anything else: write zeroes, zone management, driver commands). What
/// a request does, as the kernel's `enum block_op` (abi.h) sorts it.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, JsonSchema,
)]
#[serde(rename_all = "snake_case")]
#[schemars(rename = "op")]
pub enum BlockOp {
    Read,
    /// A write carrying data.
    Write,
    /// A cache flush (REQ_OP_FLUSH), and fsync's empty write with REQ_PREFLUSH.
    Flush,
    /// Discard and secure erase.
    Discard,
    /// Anything else: write zeroes, zone management, driver commands; and an op a newer stream
    /// names that this build does not know.
    #[serde(other)]
    Other,
}

impl BlockOp {
    /// The op of an `enum block_op` value.
    pub fn from_kernel(op: u32) -> Self {
        match op {
            abi::BLOCK_OP_READ => Self::Read,
            abi::BLOCK_OP_WRITE => Self::Write,
            abi::BLOCK_OP_FLUSH => Self::Flush,
            abi::BLOCK_OP_DISCARD => Self::Discard,
            _ => Self::Other,
        }
    }

    /// The name the records use.
    pub fn name(self) -> &'static str {
        match self {
            Self::Read => "read",
            Self::Write => "write",
            Self::Flush => "flush",
            Self::Discard => "discard",
            Self::Other => "other",
        }
    }
}

/// The queue in front of a disk as sysfs shows it at the end of the interval. Each field is left
/// out when sysfs does not expose it for this device. Where a too-small or too-large depth shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "queue_limit")]
pub struct QueueLimits {
    /// Active I/O scheduler (queue/scheduler): `none`, `mq-deadline`, `kyber`, `bfq`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheduler: Option<String>,
    /// Requests the block layer allows per hardware queue (queue/nr_requests), in requests.
    /// Below the application's I/O depth, the excess waits for a tag (`tag_wait_us`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nr_requests: Option<u64>,
    /// Driver tags of hardware queue 0 (mq/0/nr_tags), in requests: the depth the driver offers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hw_queue_depth: Option<u64>,
    /// Number of hardware (blk-mq) queues (entries of mq/).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nr_hw_queues: Option<u64>,
    /// SCSI device queue depth (device/queue_depth), in requests: the LUN depth the HBA allows;
    /// only where the driver exposes it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_queue_depth: Option<u64>,
}

impl QueueLimits {
    /// Requests the disk can hold in flight: per hardware queue × queues.
    pub fn depth(&self) -> Option<u64> {
        let per_queue = match (self.nr_requests, self.hw_queue_depth) {
            (Some(n), Some(h)) => n.min(h),
            (n, h) => n.or(h)?,
        };
        Some(per_queue * self.nr_hw_queues.unwrap_or(1).max(1))
    }

    /// The smallest depth that caps requests in flight on one queue: what
    /// an interval's `inflight` is read against.
    pub fn effective_depth(&self) -> Option<u64> {
        [
            self.nr_requests,
            self.hw_queue_depth,
            self.device_queue_depth,
        ]
        .into_iter()
        .flatten()
        .min()
    }
}

/// One disk and one op for one interval: counts, and where requests spent their time. Written
/// for every (disk, op) that saw I/O in this interval or the one before, or whose disk has
/// requests in flight.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct BlockRecord {
    /// Kernel name of the whole disk (`loop3`, `nvme0n1`, `sda`; I/O to partitions is counted on
    /// the disk), or `MAJOR:MINOR` when sysfs has no name for it.
    #[schemars(length(min = 1))]
    pub dev: String,
    /// Device major number of the disk.
    pub major: u32,
    /// First minor number of the disk.
    pub minor: u32,
    /// Operation class these figures are for.
    pub op: BlockOp,
    /// Measured length of the interval these figures cover, in milliseconds (close to
    /// `start`.interval_ms; the last interval of a run is shorter).
    pub interval_ms: u64,
    /// Requests completed in the interval (the unit /proc/diskstats counts), counting only
    /// requests whose issue was seen.
    pub count: u64,
    /// Bytes completed in the interval, in bytes (partial completions included).
    pub bytes: u64,
    /// Bios completed in the interval: what submitters issued; more than `count` when the block
    /// layer merged bios into requests.
    pub bios: u64,
    /// Requests the driver handed back to the block layer in the interval (queue full, resource
    /// shortage).
    pub requeues: u64,
    /// Requests completed with an error in the interval, plus bios that failed before reaching a
    /// request (e.g. a REQ_NOWAIT bio that found no free tag). Failed bios are not in latency_us.
    pub errors: u64,
    /// Requests of `count` whose completion the hook ran for but could not settle, found out in
    /// this interval (when the request was issued again, or its disk idled, with the request
    /// still tracked as in flight): no statistics entry to count it in, no record of the
    /// request's issue (a failure of stalltrace's own bookkeeping), or, on 5.10 and 5.15, a
    /// completion that ran inside another completion on the same CPU, which the hook leaves as the
    /// kernel since 6.1 skips it. Expected to be 0. They are in
    /// `count` and have no histogram samples. Completions the kernel skipped the hook for are
    /// `block.kernel_skipped` in `lost` (and in `count` too).
    pub completions_unseen: u64,
    /// Bio submitted -> bio completed, in microseconds: what the submitter waited, all phases
    /// together.
    pub latency_us: HistogramRecord,
    /// Bio submitted -> request allocated, in microseconds: waiting for a driver tag or request
    /// (a queue depth, nr_requests, that is too small shows here).
    pub tag_wait_us: HistogramRecord,
    /// Request allocated -> issued to the driver, in microseconds: plugging, I/O scheduler,
    /// dispatch.
    pub queue_us: HistogramRecord,
    /// Request issued -> completed, in microseconds: what the device (or the layer under it)
    /// took.
    pub device_us: HistogramRecord,
    /// Requests in flight on the whole disk (all ops, this one included) at each issue of this
    /// op, in requests: the queue depth the device actually saw.
    pub inflight: HistogramRecord,
    /// Requests in flight on the whole disk at the end of the interval (issued, not yet
    /// completed or requeued), in requests.
    pub inflight_now: i64,
    /// The disk's queue limits from sysfs, read at the end of the interval.
    pub queue_limit: QueueLimits,
    /// What the disk holds for SQL Server (`data`, `log`, `tempdb`, `backup`, or `mixed`), from
    /// the worker's open files; absent for disks without SQL Server files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<String>,
}

/// One I/O that took longer than --slow-io-ms from its first bio's submission to its request's
/// completion. Sent through the ring buffer as it happens (not per interval); drops are counted
/// in `lost` as `block.slow_io_ringbuf_full`.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[schemars(deny_unknown_fields)]
pub struct SlowIoRecord {
    /// Kernel name of the whole disk, or `MAJOR:MINOR` when sysfs has no name for it.
    #[schemars(length(min = 1))]
    pub dev: String,
    /// Device major number of the disk.
    pub major: u32,
    /// First minor number of the disk.
    pub minor: u32,
    /// Operation class of the request.
    pub op: BlockOp,
    /// First bio submitted -> request completed, in microseconds (ns precision).
    #[schemars(range(min = 0))]
    pub latency_us: f64,
    /// First bio submitted -> request allocated, in microseconds; absent when the request was not
    /// allocated for its first bio (that bio was merged into an existing request) or the
    /// allocation was not seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub tag_wait_us: Option<f64>,
    /// Request allocated -> issued, in microseconds; absent when it was zero or the request
    /// carries no allocation time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub queue_us: Option<f64>,
    /// Request issued -> completed, in microseconds: the device's share.
    #[schemars(range(min = 0))]
    pub device_us: f64,
    /// Start of the request on the disk, in 512-byte sectors.
    pub sector: u64,
    /// Size of the request at completion, in bytes (0 for a flush).
    pub bytes: u32,
    /// Process (thread group) id that submitted the first bio; may be a kernel worker (flush,
    /// writeback) rather than the application.
    pub pid: u32,
    /// Thread id that submitted the first bio.
    pub tid: u32,
    /// Command name of that thread (task comm, at most 15 bytes).
    #[schemars(length(max = 15))]
    pub comm: String,
    /// Kernel blk_status_t of the completion: 0 is success; any other value is a BLK_STS_* error
    /// (include/linux/blk_types.h).
    pub error: i32,
    /// The SQL Server database file the I/O touched, from the file's extents on the disk
    /// (FIEMAP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The SQL Server instance, when its worker submitted the I/O.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sql: Option<SqlTag>,
    /// The container of the submitting process, from its cgroup; absent outside containers
    /// (and for kernel workers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<Container>,
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
            op: BlockOp::from_kernel(e.op),
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
            container: None,
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
        assert_eq!(r.op, BlockOp::Write);
        assert_eq!(r.comm, "sqlservr");
        assert_eq!((r.pid, r.tid), (42, 43));
    }

    #[test]
    fn every_op_has_a_name() {
        let names: Vec<_> = (0..abi::BLOCK_OP_COUNT)
            .map(|op| BlockOp::from_kernel(op).name())
            .collect();
        assert_eq!(names, ["read", "write", "flush", "discard", "other"]);
    }
}
