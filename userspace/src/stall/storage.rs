//! Storage rules, per disk: the queue in front of the device is full (the
//! queue-depth case), or the device itself is slow.

use std::collections::BTreeMap;

use super::Thresholds;
use super::interval::{Finding, Interval, SqlState, held_back_ms};
use super::network::round1;
use crate::records::HistogramRecord;
use crate::records::block::{BlockOp, BlockRecord};
use crate::records::stall::{Cause, Evidence, Kind, Subject};

/// One disk's interval, all ops together.
struct Disk<'a> {
    name: &'a str,
    key: String,
    ops: Vec<&'a BlockRecord>,
}

impl Disk<'_> {
    fn count(&self) -> u64 {
        self.ops.iter().map(|b| b.count).sum()
    }
    fn requeues(&self) -> u64 {
        self.ops.iter().map(|b| b.requeues).sum()
    }
    /// Mean of a phase over every request of every op.
    fn mean(&self, phase: impl Fn(&BlockRecord) -> &HistogramRecord) -> f64 {
        let (total, n) = self.ops.iter().fold((0.0, 0), |(t, n), b| {
            let h = phase(b);
            (t + h.total(), n + h.count)
        });
        if n == 0 { 0.0 } else { total / n as f64 }
    }
    /// The slow op with the worst device p99, and that p99. An op is slow
    /// with enough requests for a percentile and its p99 at the threshold,
    /// or with few requests, most of them slow (`few_but_slow`). One slow
    /// request of an op (a discard among thousands of fast reads) is neither:
    /// a p99 of one sample is that sample. Only what applications wait on
    /// counts: reads, writes and flushes. A discard's device time grows with
    /// the range it trims (a deleted file's blocks: tens of ms for a large
    /// one on a healthy disk), so it says nothing of the device's speed.
    fn slowest_op(&self, th: &Thresholds) -> Option<(&BlockRecord, f64)> {
        self.ops
            .iter()
            .filter(|b| matches!(b.op, BlockOp::Read | BlockOp::Write | BlockOp::Flush))
            .filter(|b| op_is_slow(b, th))
            .map(|b| (*b, b.device_us.p99()))
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }
    /// Requests in flight at each issue, over all ops (each op's histogram
    /// counts the whole disk at its own issues).
    fn inflight(&self) -> (f64, f64, u64, u64) {
        let mut at = BTreeMap::<u64, u64>::new();
        for b in &self.ops {
            for (low, _, n) in b.inflight.triples() {
                *at.entry(low as u64).or_default() += n;
            }
        }
        let total: u64 = at.values().sum();
        let pct = |q: f64| {
            let mut seen = 0;
            for (v, n) in &at {
                seen += n;
                if seen as f64 >= q * total as f64 {
                    return *v as f64;
                }
            }
            0.0
        };
        let max = at.keys().next_back().copied().unwrap_or(0);
        (pct(0.5), pct(0.9), max, total)
    }
    fn depth(&self) -> Option<u64> {
        self.ops.iter().find_map(|b| b.queue_limit.depth())
    }
    fn role(&self) -> Option<String> {
        self.ops.iter().find_map(|b| b.role.clone())
    }
    /// Requests whose device time was at least `us`.
    fn slow_count(&self, us: f64) -> u64 {
        self.ops
            .iter()
            .map(|b| b.device_us.count_at_least(us))
            .sum()
    }
    /// Too few requests for a percentile, but most of them slow: at least
    /// half the sample floor, and at least half of the requests, took the
    /// threshold or more. A disk slow enough serves few requests (a log disk
    /// taking 200 ms per write does 5 a second, the worst stall a SQL Server
    /// can have), so the floor that keeps percentiles honest must not hide it.
    fn few_but_slow(&self, th: &Thresholds) -> bool {
        let slow = self.slow_count(th.io_ms * 1000.0);
        slow >= th.min_samples.div_ceil(2) && 2 * slow >= self.count()
    }
}

/// Whether one op of a disk was slow in the interval: its device p99 at the
/// threshold, or, below the sample floor, most of its few requests slow.
fn op_is_slow(b: &BlockRecord, th: &Thresholds) -> bool {
    let threshold_us = th.io_ms * 1000.0;
    let slow = b.device_us.count_at_least(threshold_us);
    if b.device_us.count >= th.min_samples {
        b.device_us.p99() >= threshold_us
    } else {
        slow >= th.min_samples.div_ceil(2) && 2 * slow >= b.count
    }
}

/// Whether `dev`'s reads were slow in the interval: what a sender that reads
/// the disk would have waited for. Slow writes or flushes (a build writing
/// back, a log) hold up no reader.
pub fn reads_slow(iv: &Interval, dev: &str, th: &Thresholds) -> bool {
    iv.blocks
        .iter()
        .any(|b| b.dev == dev && b.op == BlockOp::Read && op_is_slow(b, th))
}

pub fn disks(iv: &Interval, sql: &SqlState, th: &Thresholds) -> Vec<Finding> {
    let mut by_disk: BTreeMap<&str, Disk> = BTreeMap::new();
    for b in &iv.blocks {
        by_disk
            .entry(b.dev.as_str())
            .or_insert_with(|| Disk {
                name: &b.dev,
                key: format!("{}:{}", b.major, b.minor),
                ops: Vec::new(),
            })
            .ops
            .push(b);
    }
    by_disk
        .values()
        .filter(|d| d.count() >= th.min_samples || d.few_but_slow(th))
        .filter_map(|d| disk(iv, d, sql, th))
        .collect()
}

fn disk(iv: &Interval, d: &Disk, sql: &SqlState, th: &Thresholds) -> Option<Finding> {
    let name = d.name;
    let tag_wait_mean = d.mean(|b| &b.tag_wait_us);
    let device_mean = d.mean(|b| &b.device_us);
    let (inflight_p50, inflight_p90, inflight_max, issues) = d.inflight();
    let slowest = d.slowest_op(th);
    let depth = d.depth();
    let iops = d.count() as f64 * 1000.0 / iv.len_ms.max(1.0);

    // Below the sample floor only the few-but-slow rule applies.
    let enough = d.count() >= th.min_samples;
    let pinned = depth.is_some_and(|depth| inflight_max >= depth && inflight_p90 >= depth as f64);
    let queue_full = enough && pinned && tag_wait_mean >= device_mean.max(th.tag_wait_us);
    let mut evidence = Vec::new();
    let (cause, next_step, impact_ms) = if queue_full {
        let depth = depth.unwrap_or(0);
        let at_limit = d
            .ops
            .iter()
            .map(|b| b.inflight.count_at_least(depth as f64))
            .sum::<u64>() as f64
            / issues.max(1) as f64;
        evidence.push(
            Evidence::new(
                "inflight_at_limit_fraction",
                round1(at_limit * 100.0) / 100.0,
                format!(
                    "{name} held its limit of {depth} requests at {:.0}% of issues \
                     (in flight p50 {inflight_p50:.0}, p90 {inflight_p90:.0}, max {inflight_max})",
                    at_limit * 100.0
                ),
            )
            .unit("fraction"),
        );
        evidence.push(
            Evidence::new(
                "tag_wait_us_mean",
                round1(tag_wait_mean),
                format!(
                    "requests waited {tag_wait_mean:.0} µs on average for a tag, the device took \
                     {device_mean:.0} µs: the queue in front of it, not the device, is the wait"
                ),
            )
            .unit("us")
            .threshold(th.tag_wait_us),
        );
        (
            Cause::QueueFull,
            format!(
                "{name} allows {depth} requests in flight and the rest queue: raise \
                 /sys/block/{name}/queue/nr_requests and the HBA or driver queue depth, then \
                 re-measure; past the device's own parallelism, more depth only adds latency"
            ),
            // the requests that waited for a tag at least the threshold
            held_back_ms(
                iv.len_ms,
                d.ops
                    .iter()
                    .map(|b| b.tag_wait_us.count_at_least(th.tag_wait_us))
                    .sum::<u64>() as f64
                    / d.ops
                        .iter()
                        .map(|b| b.tag_wait_us.count)
                        .sum::<u64>()
                        .max(1) as f64,
            ),
        )
    } else if let Some((slow_op, device_p99)) = slowest {
        let threshold_us = th.io_ms * 1000.0;
        evidence.push(
            Evidence::new(
                "device_ms_p99",
                round1(device_p99 / 1000.0),
                format!(
                    "{name} took {:.1} ms per {} request (p99; p50 {:.1} ms), issue to completion",
                    device_p99 / 1000.0,
                    slow_op.op.name(),
                    slow_op.device_us.p50() / 1000.0
                ),
            )
            .unit("ms")
            .threshold(th.io_ms),
        );
        let busy = depth.is_some_and(|depth| inflight_p50 >= (depth as f64 / 2.0).max(4.0));
        evidence.push(
            Evidence::new(
                "inflight_p50",
                inflight_p50,
                format!(
                    "{inflight_p50:.0} requests in flight at a typical issue (max {inflight_max}{})",
                    depth.map(|d| format!(", limit {d}")).unwrap_or_default()
                ),
            )
            .unit("requests"),
        );
        let next = if busy {
            format!(
                "{name} is slow with many requests in flight: it is saturated; spread the load \
                 or lower the queue depth (latency grows with depth past the device's \
                 parallelism), and check what is under it"
            )
        } else {
            format!(
                "{name} is slow with few requests in flight: the device, or what is under it \
                 (SAN, virtual disk, backing file, throttling), is slow; check it there"
            )
        };
        (
            Cause::SlowDevice,
            next,
            // the requests the device took the threshold or longer for
            held_back_ms(
                iv.len_ms,
                d.slow_count(threshold_us) as f64 / d.count().max(1) as f64,
            ),
        )
    } else {
        return None;
    };
    if d.requeues() > 0 {
        evidence.push(
            Evidence::new(
                "requeues",
                d.requeues(),
                format!(
                    "the driver handed {} requests back (queue full below it)",
                    d.requeues()
                ),
            )
            .unit("count"),
        );
    }
    evidence.push(
        Evidence::new(
            "iops",
            round1(iops),
            format!("{iops:.0} requests/s completed"),
        )
        .unit("count/s"),
    );
    let mut files: Vec<String> = iv
        .slow_ios
        .iter()
        .filter(|s| s.dev == name)
        .filter_map(|s| s.file.clone())
        .collect();
    files.sort();
    files.dedup();
    let subject = Subject {
        dev: Some(name.to_string()),
        ..Default::default()
    };
    Some(
        Finding::new(
            Kind::Storage,
            subject,
            cause,
            impact_ms,
            evidence,
            next_step,
        )
        .with_role(d.role())
        .with_sessions(sql.sessions_on_disk(&d.key))
        .with_files(files),
    )
}
