//! Disks over the whole run: per disk and op, the merged histograms of every
//! phase (`block` records), request and byte totals, the queue limits and the
//! SQL Server role, a per-interval series for the heatmap, and the `slow_io`
//! records that fell on the disk.

use std::collections::BTreeMap;

use super::merge::{MergedHist, Sparse, Unit};
use super::series::{self, Point, add_sparse};
use crate::records::block::{BlockRecord, QueueLimits, SlowIoRecord};

/// One interval of one disk and op (or several, merged: see `series`).
#[derive(Clone, Debug)]
pub struct DiskPoint {
    /// End of the interval (the record's `ts`), µs since the epoch.
    pub ts_us: i64,
    pub interval_ms: u64,
    pub requests: u64,
    pub bytes: u64,
    pub latency: Sparse,
    pub latency_p99_us: Option<f64>,
    pub tag_wait_p99_us: Option<f64>,
    pub inflight_max: Option<f64>,
}

impl Point for DiskPoint {
    fn absorb(&mut self, next: Self) {
        self.ts_us = next.ts_us;
        self.interval_ms += next.interval_ms;
        self.requests += next.requests;
        self.bytes += next.bytes;
        add_sparse(&mut self.latency, &next.latency);
        // The worse of the two: a merged point still shows its tail.
        let worse = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(x), Some(y)) => Some(x.max(y)),
            (x, y) => x.or(y),
        };
        self.latency_p99_us = worse(self.latency_p99_us, next.latency_p99_us);
        self.tag_wait_p99_us = worse(self.tag_wait_p99_us, next.tag_wait_p99_us);
        self.inflight_max = worse(self.inflight_max, next.inflight_max);
    }
}

#[derive(Clone, Debug)]
pub struct DiskOp {
    pub op: String,
    pub requests: u64,
    pub bytes: u64,
    pub bios: u64,
    pub requeues: u64,
    pub errors: u64,
    pub completions_unseen: u64,
    /// Summed `interval_ms` of the intervals with a record for this op.
    pub active_ms: u64,
    /// The busiest interval's request rate.
    pub peak_iops: f64,
    pub latency: MergedHist,
    pub tag_wait: MergedHist,
    pub queue: MergedHist,
    pub device: MergedHist,
    pub inflight: MergedHist,
    pub series: Vec<DiskPoint>,
}

impl DiskOp {
    fn new(op: String) -> Self {
        Self {
            op,
            requests: 0,
            bytes: 0,
            bios: 0,
            requeues: 0,
            errors: 0,
            completions_unseen: 0,
            active_ms: 0,
            peak_iops: 0.0,
            latency: MergedHist::new(Unit::Micros),
            tag_wait: MergedHist::new(Unit::Micros),
            queue: MergedHist::new(Unit::Micros),
            device: MergedHist::new(Unit::Micros),
            inflight: MergedHist::new(Unit::Count),
            series: Vec::new(),
        }
    }

    /// Mean request rate over the intervals this op had records.
    pub fn iops(&self) -> f64 {
        per_second(self.requests, self.active_ms)
    }

    /// The busiest interval's request rate (kept as records arrive: the series
    /// may merge intervals).
    pub fn peak_iops(&self) -> f64 {
        self.peak_iops
    }

    pub fn bytes_per_second(&self) -> f64 {
        per_second(self.bytes, self.active_ms)
    }
}

fn per_second(n: u64, ms: u64) -> f64 {
    if ms == 0 {
        0.0
    } else {
        n as f64 * 1000.0 / ms as f64
    }
}

/// A `slow_io` record, as the report lists the worst ones.
#[derive(Clone, Debug)]
pub struct SlowIo {
    pub ts_us: i64,
    pub op: String,
    pub latency_us: f64,
    pub device_us: Option<f64>,
    pub tag_wait_us: Option<f64>,
    pub pid: Option<u64>,
    pub comm: Option<String>,
    pub file: Option<String>,
    pub bytes: Option<u64>,
}

#[derive(Clone, Debug)]
pub struct Disk {
    pub dev: String,
    /// `major:minor`, how `sql_instance` names disks.
    pub devno: Option<String>,
    /// SQL Server role: from the `block` records, else from `sql_instance`.
    pub role: Option<String>,
    /// The last `queue_limit` seen.
    pub queue_limit: QueueLimits,
    pub ops: Vec<DiskOp>,
    pub slow_io_count: u64,
    /// The slowest `slow_io` records on the disk, slowest first (at most 5).
    pub slowest: Vec<SlowIo>,
}

impl Disk {
    pub fn requests(&self) -> u64 {
        self.ops.iter().map(|o| o.requests).sum()
    }
}

/// Read and write first, in the order an SRE looks at them.
fn op_rank(op: &str) -> usize {
    ["read", "write", "flush", "discard", "other"]
        .iter()
        .position(|o| *o == op)
        .unwrap_or(5)
}

const SLOWEST_KEPT: usize = 5;

#[derive(Default)]
pub struct Disks {
    disks: BTreeMap<String, Disk>,
}

impl Disks {
    fn disk(&mut self, dev: &str) -> &mut Disk {
        self.disks.entry(dev.to_string()).or_insert_with(|| Disk {
            dev: dev.to_string(),
            devno: None,
            role: None,
            queue_limit: QueueLimits::default(),
            ops: Vec::new(),
            slow_io_count: 0,
            slowest: Vec::new(),
        })
    }

    pub fn block(&mut self, r: &BlockRecord, ts_us: i64) {
        let disk = self.disk(&r.dev);
        disk.devno = Some(format!("{}:{}", r.major, r.minor));
        if let Some(role) = &r.role {
            disk.role = Some(role.clone());
        }
        disk.queue_limit = r.queue_limit.clone();
        let op = r.op.name();
        let index = match disk.ops.iter().position(|o| o.op == op) {
            Some(i) => i,
            None => {
                disk.ops.push(DiskOp::new(op.to_string()));
                disk.ops.len() - 1
            }
        };
        let o = &mut disk.ops[index];
        o.requests += r.count;
        o.bytes += r.bytes;
        o.bios += r.bios;
        o.requeues += r.requeues;
        o.errors += r.errors;
        o.completions_unseen += r.completions_unseen;
        o.active_ms += r.interval_ms;
        o.peak_iops = o.peak_iops.max(per_second(r.count, r.interval_ms));
        let latency = o.latency.add_record(&r.latency_us);
        o.tag_wait.add_record(&r.tag_wait_us);
        o.queue.add_record(&r.queue_us);
        o.device.add_record(&r.device_us);
        o.inflight.add_record(&r.inflight);
        series::push(
            &mut o.series,
            DiskPoint {
                ts_us,
                interval_ms: r.interval_ms,
                requests: r.count,
                bytes: r.bytes,
                latency,
                latency_p99_us: r.latency_us.p99,
                tag_wait_p99_us: r.tag_wait_us.p99,
                inflight_max: r.inflight.max,
            },
        );
    }

    pub fn slow_io(&mut self, r: &SlowIoRecord, ts_us: i64) {
        let disk = self.disk(&r.dev);
        disk.slow_io_count += 1;
        disk.slowest.push(SlowIo {
            ts_us,
            op: r.op.name().to_string(),
            latency_us: r.latency_us,
            device_us: Some(r.device_us),
            tag_wait_us: r.tag_wait_us,
            pid: Some(u64::from(r.pid)),
            comm: Some(r.comm.clone()),
            file: r.file.clone(),
            bytes: Some(u64::from(r.bytes)),
        });
        // Keep the list short as the stream goes: a long run has many.
        if disk.slowest.len() > 4 * SLOWEST_KEPT {
            trim_slowest(&mut disk.slowest);
        }
    }

    /// Disks by name; a disk's role from `sql_instance` when its records had none.
    pub fn finish(self, roles: &BTreeMap<String, String>) -> Vec<Disk> {
        self.disks
            .into_values()
            .map(|mut d| {
                if d.role.is_none() {
                    d.role = d.devno.as_ref().and_then(|n| roles.get(n)).cloned();
                }
                d.ops.sort_by_key(|o| op_rank(&o.op));
                trim_slowest(&mut d.slowest);
                d
            })
            .collect()
    }
}

fn trim_slowest(list: &mut Vec<SlowIo>) {
    list.sort_by(|a, b| b.latency_us.total_cmp(&a.latency_us));
    list.truncate(SLOWEST_KEPT);
}
