//! One (disk, op)'s figures for one interval, from the kernel's running totals.

use crate::abi::block_stats;
use crate::hist::{Histogram, KernelHistDelta};

/// What one (disk, op) did in one interval.
pub struct Interval {
    pub requests: u64,
    pub bytes: u64,
    pub bios: u64,
    pub requeues: u64,
    pub errors: u64,
    /// Completions the kernel did not run the hook for, settled when their
    /// request was issued again (block_stats.unseen, block.bpf.c `settle_missed`).
    pub skipped: u64,
    pub total: Histogram,
    pub tag_wait: Histogram,
    pub queue: Histogram,
    pub device: Histogram,
    pub inflight: Histogram,
}

impl Interval {
    /// Whether anything at all happened: the series then stays in the stream.
    pub fn is_active(&self) -> bool {
        [
            self.requests,
            self.bytes,
            self.bios,
            self.requeues,
            self.errors,
            self.skipped,
        ]
        .iter()
        .any(|&n| n > 0)
            || [
                &self.total,
                &self.tag_wait,
                &self.queue,
                &self.device,
                &self.inflight,
            ]
            .iter()
            .any(|h| h.count() > 0)
    }

    /// Whether a request was issued or completed (the disk was not idle).
    pub fn did_io(&self) -> bool {
        self.requests > 0 || self.inflight.count() > 0 || self.bios > 0
    }
}

/// Interval-to-interval state of one (disk, op): the previous running totals.
#[derive(Default)]
pub struct Series {
    counters: [u64; 6],
    total: KernelHistDelta,
    tag_wait: KernelHistDelta,
    queue: KernelHistDelta,
    device: KernelHistDelta,
    inflight: KernelHistDelta,
    pub active_last_interval: bool,
}

impl Series {
    /// The interval since the last call, from the per-CPU values read now.
    pub fn advance(&mut self, per_cpu: &[block_stats]) -> Interval {
        let sum = |f: fn(&block_stats) -> u64| per_cpu.iter().map(f).sum::<u64>();
        let now = [
            sum(|s| s.requests),
            sum(|s| s.bytes),
            sum(|s| s.bios),
            sum(|s| s.requeues),
            sum(|s| s.errors),
            sum(|s| s.unseen),
        ];
        let mut delta = [0u64; 6];
        for (d, (n, prev)) in delta.iter_mut().zip(now.iter().zip(self.counters.iter())) {
            *d = n.wrapping_sub(*prev);
        }
        self.counters = now;
        Interval {
            requests: delta[0],
            bytes: delta[1],
            bios: delta[2],
            requeues: delta[3],
            errors: delta[4],
            skipped: delta[5],
            total: self.total.advance(per_cpu.iter().map(|s| &s.total)),
            tag_wait: self.tag_wait.advance(per_cpu.iter().map(|s| &s.tag_wait)),
            queue: self.queue.advance(per_cpu.iter().map(|s| &s.queue)),
            device: self.device.advance(per_cpu.iter().map(|s| &s.device)),
            inflight: self.inflight.advance(per_cpu.iter().map(|s| &s.inflight)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_are_per_interval_and_sum_cpus() {
        let mut a = block_stats::default();
        let mut b = block_stats::default();
        a.requests = 10;
        b.requests = 5;
        a.device.buckets[3] = 4;
        let mut series = Series::default();
        let first = series.advance(&[a, b]);
        assert_eq!(first.requests, 15);
        assert_eq!(first.device.count(), 4);
        assert!(first.is_active() && first.did_io());
        let idle = series.advance(&[a, b]);
        assert_eq!(idle.requests, 0);
        assert!(!idle.is_active());
        b.unseen = 2;
        let settled = series.advance(&[a, b]);
        assert_eq!(settled.skipped, 2);
        assert!(settled.is_active() && !settled.did_io());
    }
}
