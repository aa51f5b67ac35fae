//! Log-linear histograms: the Rust twin of `ebpf/include/hist.h`, plus what the
//! daemon does with the kernel's per-CPU copies: wrapping per-CPU deltas merged
//! into one interval histogram, percentiles, and the JSON form.
//!
//! Geometry (from abi.h): values below 16 have exact buckets; each power of two
//! above is split into 16 linear sub-buckets, so a bucket spans at most 6.25% of
//! its lower bound. A reported percentile is the midpoint of its bucket, within
//! 3.2% of any value the bucket holds (or, when every value is in that one
//! bucket, their exact mean).

use crate::abi::{HIST_BUCKETS, HIST_GROUPING_POWER, HIST_SUBBUCKETS, hist};

mod record;

pub const BUCKETS: usize = HIST_BUCKETS as usize;
const GROUPING: u32 = HIST_GROUPING_POWER;
const SUB: u64 = HIST_SUBBUCKETS as u64;

/// Bucket index of `value`; the same function as `hist_bucket_index` in hist.h.
pub const fn bucket_index(value: u64) -> usize {
    if value < SUB {
        return value as usize;
    }
    let power = 63 - value.leading_zeros();
    let shift = power - GROUPING;
    (((shift + 1) << GROUPING) as u64 + ((value >> shift) - SUB)) as usize
}

/// Inclusive value range `[low, high]` held by bucket `index`.
pub const fn bucket_range(index: usize) -> (u64, u64) {
    let index = index as u64;
    if index < SUB {
        return (index, index);
    }
    let shift = (index >> GROUPING) - 1;
    let low = (SUB + (index & (SUB - 1))) << shift;
    (low, low + ((1u64 << shift) - 1))
}

/// Counts for one interval, merged across CPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct Histogram {
    counts: Vec<u64>,
    sum: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self {
            counts: vec![0; BUCKETS],
            sum: 0,
        }
    }
}

impl Histogram {
    pub fn record(&mut self, value: u64, times: u64) {
        self.counts[bucket_index(value)] += times;
        self.sum = self.sum.wrapping_add(value.wrapping_mul(times));
    }

    pub fn count(&self) -> u64 {
        self.counts.iter().sum()
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.counts.iter_mut().zip(&other.counts) {
            *a += b;
        }
        self.sum = self.sum.wrapping_add(other.sum);
    }

    /// Nearest-rank percentile (`q` in 0..=1) as the midpoint of the bucket that holds it.
    pub fn percentile(&self, q: f64) -> Option<f64> {
        self.percentile_given_mean(q, self.mean())
    }

    /// [`Self::percentile`], where `mean` is the exact mean of the values (in
    /// the histogram's unit). When every value is in the percentile's bucket,
    /// that mean is reported instead of the midpoint: it is the better
    /// estimate there, and a midpoint below the mean of values that all share
    /// one bucket would print as a mean above its p99 ("12.1 µs / 12 µs").
    pub fn percentile_given_mean(&self, q: f64, mean: Option<f64>) -> Option<f64> {
        let total = self.count();
        if total == 0 {
            return None;
        }
        let rank = ((q * total as f64).ceil() as u64).clamp(1, total);
        let mut seen = 0;
        for (index, &n) in self.counts.iter().enumerate() {
            seen += n;
            if seen >= rank {
                let (low, high) = bucket_range(index);
                return Some(match mean {
                    Some(m) if n == total => m.clamp(low as f64, high as f64),
                    _ => midpoint(index),
                });
            }
        }
        None
    }

    /// Upper edge of the highest non-empty bucket: never below the true maximum.
    pub fn max(&self) -> Option<u64> {
        self.counts
            .iter()
            .rposition(|&n| n > 0)
            .map(|i| bucket_range(i).1)
    }

    pub fn mean(&self) -> Option<f64> {
        let n = self.count();
        (n > 0).then(|| self.sum as f64 / n as f64)
    }

    /// Non-empty buckets as `(low, high, count)`.
    pub fn nonzero_buckets(&self) -> impl Iterator<Item = (u64, u64, u64)> + '_ {
        self.counts
            .iter()
            .enumerate()
            .filter(|(_, n)| **n > 0)
            .map(|(i, &n)| {
                let (lo, hi) = bucket_range(i);
                (lo, hi, n)
            })
    }

    /// JSON form; `scale` converts the recorded unit to the field's unit (ns -> us: 1e-3).
    pub fn to_record(&self, scale: f64) -> HistogramRecord {
        let s = |v: f64| round3(v * scale);
        HistogramRecord {
            count: self.count(),
            mean: self.mean().map(s),
            p50: self.percentile(0.50).map(s),
            p90: self.percentile(0.90).map(s),
            p99: self.percentile(0.99).map(s),
            max: self.max().map(|v| s(v as f64)),
            scale,
            buckets: self
                .counts
                .iter()
                .enumerate()
                .filter(|(_, n)| **n > 0)
                .map(|(i, &n)| (i, n))
                .collect(),
        }
    }
}

fn midpoint(index: usize) -> f64 {
    let (lo, hi) = bucket_range(index);
    lo as f64 + (hi - lo) as f64 / 2.0
}

fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}

pub use record::{HistogramRecord, bucket_counts_of, buckets_of};

/// Turns successive per-CPU snapshots of one kernel `struct hist` into
/// interval histograms. Kernel counts are u32 and wrap; deltas are taken per
/// CPU with wrapping arithmetic before they are summed.
#[derive(Default)]
pub struct KernelHistDelta {
    previous: Vec<(Vec<u32>, u64)>,
}

impl KernelHistDelta {
    pub fn advance<'a>(&mut self, per_cpu: impl Iterator<Item = &'a hist>) -> Histogram {
        let mut out = Histogram::default();
        for (cpu, h) in per_cpu.enumerate() {
            if self.previous.len() <= cpu {
                self.previous.push((vec![0; BUCKETS], 0));
            }
            let (prev_counts, prev_sum) = &mut self.previous[cpu];
            for (i, (&now, prev)) in h.buckets.iter().zip(prev_counts.iter_mut()).enumerate() {
                out.counts[i] += u64::from(now.wrapping_sub(*prev));
                *prev = now;
            }
            out.sum = out.sum.wrapping_add(h.sum.wrapping_sub(*prev_sum));
            *prev_sum = h.sum;
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" {
        /// hist.h's `hist_bucket_index`, compiled for the host by build.rs.
        fn stalltrace_c_hist_bucket_index(value: u64) -> u32;
    }

    fn c_index(v: u64) -> usize {
        // SAFETY: a pure function of its argument.
        unsafe { stalltrace_c_hist_bucket_index(v) as usize }
    }

    fn edge_values() -> Vec<u64> {
        let mut v = vec![0, 1, 2, 15, 16, 17, 31, 32, 33, u64::MAX, u64::MAX - 1];
        for k in 1..64 {
            let p = 1u64 << k;
            v.extend([p - 1, p, p + 1]);
        }
        v
    }

    #[test]
    fn values_that_share_one_bucket_report_their_mean_never_a_p99_below_it() {
        // Tag waits of 12.0–12.2 µs (in ns): one bucket, [11776, 12287].
        let mut h = Histogram::default();
        for v in [12_000, 12_100, 12_150, 12_200] {
            h.record(v, 25);
        }
        let mean = h.mean().unwrap();
        assert_eq!(mean, 12_112.5);
        for q in [0.5, 0.9, 0.99] {
            assert_eq!(h.percentile(q), Some(mean), "q {q}");
        }
        // The midpoint (12031.5) was below that mean.
        assert!(midpoint(bucket_index(12_000)) < mean);
        // A second bucket: midpoints again, the p99 at the slow values.
        h.record(40_000, 5);
        assert_eq!(h.percentile(0.99), Some(midpoint(bucket_index(40_000))));
        assert_eq!(h.percentile(0.5), Some(midpoint(bucket_index(12_000))));
    }

    #[test]
    fn rust_and_c_bucket_math_agree_at_edges() {
        for v in edge_values() {
            assert_eq!(bucket_index(v), c_index(v), "value {v}");
        }
    }

    #[test]
    fn rust_and_c_agree_on_a_pseudorandom_sweep() {
        let mut x = 0x9E37_79B9_7F4A_7C15u64;
        for _ in 0..200_000 {
            // xorshift64*, spread over every magnitude
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let v = x.wrapping_mul(0x2545_F491_4F6C_DD1D) >> (x % 64);
            assert_eq!(bucket_index(v), c_index(v), "value {v}");
        }
    }

    #[test]
    fn edges_land_where_expected() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(1), 1);
        assert_eq!(bucket_index(15), 15);
        assert_eq!(bucket_index(16), 16);
        assert_eq!(bucket_index(31), 31);
        assert_eq!(bucket_index(32), 32);
        assert_eq!(bucket_index(u64::MAX), BUCKETS - 1);
        assert_eq!(BUCKETS, 976);
    }

    #[test]
    fn ranges_tile_u64_without_gaps() {
        let mut expected_low = 0u64;
        for i in 0..BUCKETS {
            let (lo, hi) = bucket_range(i);
            assert_eq!(lo, expected_low, "bucket {i}");
            assert!(hi >= lo);
            assert_eq!(bucket_index(lo), i);
            assert_eq!(bucket_index(hi), i);
            expected_low = hi.wrapping_add(1);
        }
        assert_eq!(bucket_range(BUCKETS - 1).1, u64::MAX);
    }

    #[test]
    fn relative_error_is_within_seven_percent() {
        for i in 16..BUCKETS {
            let (lo, hi) = bucket_range(i);
            let width = (hi - lo) as f64 + 1.0;
            assert!(width / lo as f64 <= 1.0 / 16.0 + 1e-12, "bucket {i}");
            // the midpoint reported for a percentile is within half of that
            let mid = midpoint(i);
            assert!((mid - lo as f64) / lo as f64 <= 0.0313);
        }
    }

    #[test]
    fn percentiles_follow_nearest_rank() {
        let mut h = Histogram::default();
        for v in 1..=10u64 {
            h.record(v, 1);
        }
        assert_eq!(h.percentile(0.5), Some(5.0));
        assert_eq!(h.percentile(0.9), Some(9.0));
        assert_eq!(h.percentile(0.99), Some(10.0));
        assert_eq!(h.percentile(1.0), Some(10.0));
        assert_eq!(h.max(), Some(10));
        assert_eq!(h.mean(), Some(5.5));
        assert_eq!(Histogram::default().percentile(0.5), None);
    }

    #[test]
    fn percentile_of_a_wide_value_is_within_bucket_error() {
        let mut h = Histogram::default();
        h.record(1_000_000, 100);
        let p = h.percentile(0.5).unwrap();
        assert!((p - 1e6).abs() / 1e6 < 0.032, "{p}");
        assert!(h.max().unwrap() >= 1_000_000);
    }

    #[test]
    fn per_cpu_deltas_wrap_and_merge() {
        let mut a = hist::default();
        let mut b = hist::default();
        a.buckets[3] = u32::MAX - 1;
        b.buckets[3] = 5;
        let mut delta = KernelHistDelta::default();
        let first = delta.advance([&a, &b].into_iter());
        assert_eq!(first.count(), u64::from(u32::MAX - 1) + 5);
        a.buckets[3] = 2; // wrapped: +4
        b.buckets[3] = 6; // +1
        a.sum = 10;
        let second = delta.advance([&a, &b].into_iter());
        assert_eq!(second.count(), 5);
        assert_eq!(second.sum, 10);
    }

    #[test]
    fn record_form_scales_to_microseconds() {
        let mut h = Histogram::default();
        h.record(2_000, 3);
        let r = h.to_record(1e-3);
        assert_eq!(r.count, 3);
        assert_eq!(r.mean, Some(2.0));
        let p50 = r.p50.unwrap();
        assert!((p50 - 2.0).abs() < 2.0 * 0.032);
        assert_eq!(r.buckets.len(), 1);
        assert_eq!(r.buckets[0], (bucket_index(2_000), 3));
        let (low, high, _) = r.triples().next().unwrap();
        assert!(low <= 2.0 && 2.0 <= high, "{low}..{high}");
    }
}
