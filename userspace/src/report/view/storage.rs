//! Disks: their queues, each op's traffic and latency, the slowest I/Os.

use super::{Stats, clean, count};
use crate::report::model::Report;
use crate::report::storage::{Disk, DiskOp};
use crate::report::time::{bytes, clock, latency_us, thousands};

#[derive(Clone, Debug)]
pub struct DiskView<'a> {
    pub dev: String,
    /// `7:1`, how `sql_instance` names disks.
    pub devno: Option<String>,
    /// `SQL Server log disk`
    pub role: Option<String>,
    /// `scheduler none`, `nr_requests 32`, …
    pub limits: Vec<String>,
    /// The depth that caps requests in flight.
    pub limit: Option<u64>,
    pub ops: Vec<OpView<'a>>,
    pub slow: Option<SlowIos>,
}

#[derive(Clone, Debug)]
pub struct OpView<'a> {
    /// `read`
    pub op: String,
    /// `20 requests, 10 IOPS (peak 12), 160 KiB at 80 KiB/s`
    pub traffic: String,
    /// `requeues 0, errors 0`, and completions unseen when there were any.
    pub faults: String,
    /// Bio submitted to completed.
    pub latency: Stats,
    /// `tag wait`, `queue`, `device`: each phase, with or without data.
    pub phases: [(&'static str, Stats, bool); 3],
    /// Requests in flight at each issue.
    pub inflight: Stats,
    /// `at the queue limit (32) for 12% of issues`, when the limit and issues are known.
    pub at_limit: Option<String>,
    /// The histograms and series, for charts.
    pub data: &'a DiskOp,
}

#[derive(Clone, Debug, PartialEq)]
pub struct SlowIos {
    /// `slow I/Os (over 50 ms): 12; the slowest:`
    pub heading: String,
    /// `120 ms write 10:00:01.500, device 118 ms, sqlservr (pid 4242), /data/db.mdf`
    pub slowest: Vec<String>,
}

pub fn of(report: &Report) -> Vec<DiskView<'_>> {
    report
        .disks
        .iter()
        .map(|d| disk(d, &report.run.slow_io_words()))
        .collect()
}

fn disk<'a>(d: &'a Disk, slow_io: &str) -> DiskView<'a> {
    let q = &d.queue_limit;
    let mut limits = Vec::new();
    if let Some(s) = &q.scheduler {
        limits.push(format!("scheduler {}", clean(s)));
    }
    for (name, v) in [
        ("nr_requests", q.nr_requests),
        ("hw queue depth", q.hw_queue_depth),
        ("device queue depth", q.device_queue_depth),
        ("hw queues", q.nr_hw_queues),
    ] {
        if let Some(v) = v {
            limits.push(format!("{name} {v}"));
        }
    }
    let limit = q.effective_depth();
    DiskView {
        dev: clean(&d.dev),
        devno: d.devno.as_deref().map(clean),
        role: d
            .role
            .as_deref()
            .map(|r| format!("SQL Server {} disk", clean(r))),
        limits,
        limit,
        ops: d.ops.iter().map(|op| op_view(op, limit)).collect(),
        slow: (d.slow_io_count > 0).then(|| SlowIos {
            heading: format!(
                "slow I/Os ({}): {}; the slowest:",
                clean(slow_io),
                thousands(d.slow_io_count)
            ),
            slowest: d
                .slowest
                .iter()
                .map(|s| {
                    let mut line = format!(
                        "{} {} {}",
                        latency_us(s.latency_us),
                        clean(&s.op),
                        clock(s.ts_us)
                    );
                    if let Some(dev) = s.device_us {
                        line.push_str(&format!(", device {}", latency_us(dev)));
                    }
                    if let Some(t) = s.tag_wait_us {
                        line.push_str(&format!(", tag wait {}", latency_us(t)));
                    }
                    match (&s.comm, s.pid) {
                        (Some(c), Some(p)) => line.push_str(&format!(", {} (pid {p})", clean(c))),
                        (None, Some(p)) => line.push_str(&format!(", pid {p}")),
                        _ => {}
                    }
                    if let Some(f) = &s.file {
                        line.push_str(&format!(", {}", clean(f)));
                    }
                    line
                })
                .collect(),
        }),
    }
}

fn op_view(op: &DiskOp, limit: Option<u64>) -> OpView<'_> {
    let traffic = format!(
        "{}, {} IOPS (peak {}), {} at {}/s",
        count(op.requests, "request", "requests"),
        thousands(op.iops().round() as u64),
        thousands(op.peak_iops().round() as u64),
        bytes(op.bytes),
        bytes(op.bytes_per_second().round() as u64),
    );
    let mut faults = format!("requeues {}, errors {}", op.requeues, op.errors);
    if op.completions_unseen > 0 {
        faults.push_str(&format!(", completions unseen {}", op.completions_unseen));
    }
    let phase = |name, h: &crate::report::MergedHist| (name, Stats::latency(h), h.count() > 0);
    let at_limit = limit.filter(|_| op.inflight.count() > 0).map(|l| {
        let at: u64 = op
            .inflight
            .buckets()
            .iter()
            .filter(|(lo, _, _)| *lo >= l as f64)
            .map(|(_, _, n)| n)
            .sum();
        format!(
            "at the queue limit ({l}) for {:.0}% of issues",
            at as f64 * 100.0 / op.inflight.count() as f64
        )
    });
    OpView {
        op: clean(&op.op),
        traffic,
        faults,
        latency: Stats::latency(&op.latency),
        phases: [
            phase("tag wait", &op.tag_wait),
            phase("queue", &op.queue),
            phase("device", &op.device),
        ],
        inflight: Stats::requests(&op.inflight),
        at_limit,
        data: op,
    }
}
