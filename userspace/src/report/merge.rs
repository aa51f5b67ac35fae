//! Histograms of a whole run, merged from the per-interval histogram objects
//! of the stream: `{count, mean, p50, ..., buckets: [[low, high, count]]}` in
//! schema 1, `{..., scale, first_bucket, counts}` in schema 2 (both read by
//! `hist::buckets_of`).
//!
//! The buckets are put back into `hist::Histogram`, the same log-linear
//! geometry the kernel side records with, so the run's percentiles come from
//! the same code (nearest rank, bucket midpoint) that wrote each interval's:
//! merging one interval gives back exactly that interval's figures.

use serde::Deserialize;
use serde_json::Value;

use crate::hist::{BUCKETS, Histogram, HistogramRecord, bucket_index, bucket_range};

/// What a histogram field's values were recorded in. Every `_us` histogram is
/// timed in nanoseconds and written in µs (`to_record(1e-3)`); `inflight`
/// counts requests as they are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unit {
    Micros,
    Count,
}

impl Unit {
    /// Field unit per recorded unit.
    fn scale(self) -> f64 {
        match self {
            Unit::Micros => 1e-3,
            Unit::Count => 1.0,
        }
    }
}

/// Non-empty buckets of one interval, by bucket index: what the heatmaps need,
/// without a full 976-bucket histogram per interval.
pub type Sparse = Vec<(u16, u64)>;

#[derive(Clone, Debug)]
pub struct MergedHist {
    unit: Unit,
    hist: Histogram,
    /// Σ mean × count over the merged intervals, in the field's unit: the exact
    /// mean survives merging (the buckets alone would only give an estimate).
    weighted_sum: f64,
    weighted_count: u64,
}

impl MergedHist {
    pub fn new(unit: Unit) -> Self {
        Self {
            unit,
            hist: Histogram::default(),
            weighted_sum: 0.0,
            weighted_count: 0,
        }
    }

    /// Bucket index of a value in the field's unit (a bucket's `low` lands in its own bucket).
    pub fn index_of(unit: Unit, value: f64) -> usize {
        let recorded = (value.max(0.0) / unit.scale()).round();
        // `as` saturates: a value past u64::MAX lands in the last bucket.
        bucket_index(recorded as u64)
    }

    /// Bucket index of a `[low, high]` bucket in the field's unit, by its
    /// midpoint: far from either edge, so the rounding of edges written to
    /// 0.001 (schema 1) or scaled in f64 never moves it to a neighbour.
    fn index_of_bucket(unit: Unit, low: f64, high: f64) -> usize {
        Self::index_of(unit, low + (high - low).max(0.0) / 2.0)
    }

    /// Merge one histogram object of either schema (schema 1's `[low, high,
    /// count]` triples, schema 2's run-length bucket counts); returns its
    /// non-empty buckets (for a series), or `None` when it is not a histogram
    /// object (then nothing is merged).
    pub fn add(&mut self, h: &Value) -> Option<Sparse> {
        let h = HistogramRecord::deserialize(h).ok()?;
        Some(self.add_record(&h))
    }

    /// Merge one interval's histogram; returns its non-empty buckets (for a
    /// series).
    pub fn add_record(&mut self, h: &HistogramRecord) -> Sparse {
        // Triples in the field's unit whatever the object's own scale: its
        // buckets are put into this field's geometry by value.
        let mut sparse = Sparse::with_capacity(h.buckets.len());
        for (low, high, count) in h.triples() {
            if count == 0 {
                continue;
            }
            let index = Self::index_of_bucket(self.unit, low, high);
            self.add_index(index, count);
            sparse.push((index as u16, count));
        }
        let count: u64 = sparse.iter().map(|&(_, n)| n).sum();
        if let Some(mean) = h.mean {
            self.weighted_sum += mean * count as f64;
            self.weighted_count += count;
        }
        sparse
    }

    fn add_index(&mut self, index: usize, count: u64) {
        // `record` adds low × count to the histogram's own sum, which is unused
        // here (the exact mean comes from the records' means).
        self.hist.record(bucket_range(index).0, count);
    }

    pub fn count(&self) -> u64 {
        self.hist.count()
    }

    /// Nearest-rank percentile (`q` in 0..=1), bucket midpoint (the exact mean
    /// when every value is in that bucket: `Histogram::percentile_given_mean`),
    /// in the field's unit.
    pub fn percentile(&self, q: f64) -> Option<f64> {
        let recorded_mean = self.mean().map(|m| m / self.unit.scale());
        self.hist
            .percentile_given_mean(q, recorded_mean)
            .map(|v| self.field(v))
    }

    /// Upper edge of the highest non-empty bucket, in the field's unit.
    pub fn max(&self) -> Option<f64> {
        self.hist.max().map(|v| self.field(v as f64))
    }

    /// Exact mean over the intervals whose records had one.
    pub fn mean(&self) -> Option<f64> {
        (self.weighted_count > 0).then(|| self.weighted_sum / self.weighted_count as f64)
    }

    pub fn unit(&self) -> Unit {
        self.unit
    }

    /// Non-empty buckets as `(index, count)`.
    pub fn sparse(&self) -> Sparse {
        self.hist
            .nonzero_buckets()
            .map(|(low, _, n)| (bucket_index(low) as u16, n))
            .collect()
    }

    /// Non-empty buckets as `[low, high, count]` in the field's unit.
    pub fn buckets(&self) -> Vec<(f64, f64, u64)> {
        self.hist
            .nonzero_buckets()
            .map(|(lo, hi, n)| (self.field(lo as f64), self.field(hi as f64), n))
            .collect()
    }

    /// The same rounding as the records (µs to 0.001), so a merge of one
    /// interval reproduces that interval's numbers exactly.
    fn field(&self, recorded: f64) -> f64 {
        (recorded * self.unit.scale() * 1000.0).round() / 1000.0
    }
}

/// `[low, high]` of bucket `index` in a field's unit.
pub fn bucket_bounds(unit: Unit, index: usize) -> (f64, f64) {
    let (lo, hi) = bucket_range(index.min(BUCKETS - 1));
    (lo as f64 * unit.scale(), hi as f64 * unit.scale())
}

/// Midpoint of bucket `index` in a field's unit.
pub fn bucket_mid(unit: Unit, index: usize) -> f64 {
    let (lo, hi) = bucket_bounds(unit, index);
    lo + (hi - lo) / 2.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merging_two_intervals_adds_bucket_counts() {
        // Hand-made: interval 1 has 3 values of ~1 µs (ns bucket [1024, 1087]
        // → [1.024, 1.087] µs) and 1 of ~21 µs (ns [20480, 21503]); interval 2
        // has 5 more of ~1 µs and 1 of ~100 ms (ns [96468992, 100663295]).
        let a =
            json!({"count": 4, "mean": 6.0, "buckets": [[1.024, 1.087, 3], [20.48, 21.503, 1]]});
        let b = json!({"count": 6, "mean": 20000.0, "buckets": [[1.024, 1.087, 5], [96468.992, 100663.295, 1]]});
        let mut m = MergedHist::new(Unit::Micros);
        assert!(m.add(&a).is_some());
        assert!(m.add(&b).is_some());
        // By hand: [1.024, 1.087] 8, [20.48, 21.503] 1, [98304, 102399.999] 1.
        assert_eq!(
            m.buckets(),
            vec![
                (1.024, 1.087, 8),
                (20.48, 21.503, 1),
                (96468.992, 100663.295, 1)
            ]
        );
        assert_eq!(m.count(), 10);
        // Nearest rank of 10 values: p50 is the 5th (bucket 1), p90 the 9th
        // (bucket 2), p99 the 10th (bucket 3); each reported as its midpoint.
        assert_eq!(m.percentile(0.5), Some(1.056)); // (1024 + 1087) / 2 ns = 1055.5 → 1.056 µs
        assert_eq!(m.percentile(0.9), Some(20.992)); // (20480 + 21503) / 2 = 20991.5 ns
        assert_eq!(m.percentile(0.99), Some(98566.144)); // (96468992 + 100663295) / 2 ns
        assert_eq!(m.max(), Some(100663.295));
        // The exact mean: (6 × 4 + 20000 × 6) / 10.
        assert_eq!(m.mean(), Some(12002.4));
    }

    #[test]
    fn merging_one_interval_gives_back_its_own_figures() {
        // Built by the producer's code: whatever it wrote must come back.
        let mut h = Histogram::default();
        for (v, n) in [(900u64, 7u64), (44_000, 300), (51_000, 200), (3_400_000, 9)] {
            h.record(v, n);
        }
        let record = serde_json::to_value(h.to_record(1e-3)).unwrap();
        let mut m = MergedHist::new(Unit::Micros);
        m.add(&record).unwrap();
        assert_eq!(m.count(), record["count"].as_u64().unwrap());
        for (q, field) in [(0.5, "p50"), (0.9, "p90"), (0.99, "p99")] {
            assert_eq!(m.percentile(q), record[field].as_f64(), "{field}");
        }
        assert_eq!(m.max(), record["max"].as_f64());
        assert_eq!(m.mean(), record["mean"].as_f64());
    }

    #[test]
    fn counts_are_exact_integers_below_sixteen() {
        let mut m = MergedHist::new(Unit::Count);
        m.add(&json!({"count": 3, "mean": 3.0, "buckets": [[1.0, 1.0, 1], [4.0, 4.0, 2]]}))
            .unwrap();
        m.add(&json!({"count": 1, "mean": 4.0, "buckets": [[4.0, 4.0, 1]]}))
            .unwrap();
        assert_eq!(m.sparse(), vec![(1, 1), (4, 3)]);
        assert_eq!(m.max(), Some(4.0));
        assert_eq!(m.percentile(0.5), Some(4.0));
    }

    #[test]
    fn an_empty_histogram_or_a_non_histogram_merges_nothing() {
        let mut m = MergedHist::new(Unit::Micros);
        let empty = json!({"count": 0, "mean": null, "p50": null, "buckets": []});
        assert_eq!(m.add(&empty), Some(vec![]));
        assert_eq!(m.add(&json!("not a histogram")), None);
        assert_eq!(m.count(), 0);
        assert_eq!(m.percentile(0.5), None);
        assert_eq!(m.mean(), None);
    }
}
