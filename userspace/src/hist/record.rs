//! A histogram as the stream carries it (`histogram` in docs/schema.json).
//!
//! Schema 2 names buckets by their kernel index and run-length codes the
//! counts: `{"scale": 0.001, "first_bucket": 62, "counts": [1, -3, 5, 20]}`
//! is one value in bucket 62, three empty buckets, then 5 in bucket 66 and 20
//! in 67. Bucket `i` holds kernel values `bucket_range(i)` (docs/records.md
//! gives the formula); a value in the field's unit is that times `scale`.
//! Schema 1 wrote `[low, high, count]` triples in the field's unit: about four
//! times the bytes, which put block records over the 8 KiB line that log
//! shippers take by default. Both forms are read.

use std::borrow::Cow;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

use super::{bucket_index, bucket_range};

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(try_from = "HistogramJson", into = "HistogramJson")]
pub struct HistogramRecord {
    pub count: u64,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
    pub max: Option<f64>,
    /// Field unit per kernel unit (1e-3 for µs fields timed in ns).
    pub scale: f64,
    /// Non-empty buckets as `(kernel bucket index, count)`, ascending.
    pub buckets: Vec<(usize, u64)>,
}

impl Default for HistogramRecord {
    fn default() -> Self {
        Self {
            count: 0,
            mean: None,
            p50: None,
            p90: None,
            p99: None,
            max: None,
            scale: 1.0,
            buckets: Vec::new(),
        }
    }
}

/// The wire form's schema, written out: its rules (statistics null exactly
/// when the count is 0, no zero in `counts`) are more than a derive can say.
impl JsonSchema for HistogramRecord {
    fn schema_name() -> Cow<'static, str> {
        "histogram".into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "One interval's log-linear histogram (values below 16 exact; above, 16 linear sub-buckets per power of two, so a bucket spans at most 6.25% of its lower bound). Statistics are in the unit of the field that holds the histogram (`_us` fields: microseconds, rounded to 0.001; `inflight`: requests). Buckets are named by the kernel's bucket index: bucket i holds kernel values [low(i), high(i)] (i < 16: low = high = i; else shift = i/16 - 1, low = (16 + i%16) << shift, high = low + 2^shift - 1), which are `scale` times the field's unit. All statistics are null and `counts` is empty when `count` is 0.",
            "type": "object",
            "additionalProperties": false,
            "required": [
                "count",
                "mean",
                "p50",
                "p90",
                "p99",
                "max",
                "scale",
                "first_bucket",
                "counts"
            ],
            "properties": {
                "count": {
                    "type": "integer",
                    "minimum": 0,
                    "description": "Values recorded in the interval (the sum of the bucket counts)."
                },
                "mean": {
                    "type": [
                        "number",
                        "null"
                    ],
                    "minimum": 0,
                    "description": "Exact mean of the recorded values (sum / count), in the histogram's unit; null when count is 0."
                },
                "p50": {
                    "type": [
                        "number",
                        "null"
                    ],
                    "minimum": 0,
                    "description": "Median (nearest rank), reported as the midpoint of the bucket that holds it (within 3.2% of the true value; when every value is in that bucket, their exact mean), in the histogram's unit; null when count is 0."
                },
                "p90": {
                    "type": [
                        "number",
                        "null"
                    ],
                    "minimum": 0,
                    "description": "90th percentile (nearest rank, bucket midpoint or, when every value is in that bucket, their mean), in the histogram's unit; null when count is 0."
                },
                "p99": {
                    "type": [
                        "number",
                        "null"
                    ],
                    "minimum": 0,
                    "description": "99th percentile (nearest rank, bucket midpoint or, when every value is in that bucket, their mean), in the histogram's unit; null when count is 0."
                },
                "max": {
                    "type": [
                        "number",
                        "null"
                    ],
                    "minimum": 0,
                    "description": "Upper edge of the highest non-empty bucket, in the histogram's unit: never below the true maximum, at most 6.25% above it; null when count is 0."
                },
                "scale": {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "description": "Field unit per kernel unit: 0.001 for `_us` fields (timed in ns), 1 for counts."
                },
                "first_bucket": {
                    "type": "integer",
                    "minimum": 0,
                    "maximum": super::BUCKETS - 1,
                    "description": "Kernel index of the first bucket `counts` describes (0 when empty)."
                },
                "counts": {
                    "type": "array",
                    "items": {
                        "type": "integer",
                        "not": {
                            "const": 0
                        }
                    },
                    "description": "Run-length bucket counts from `first_bucket` up: a positive n is the next bucket's count, a negative -z skips z empty buckets. 0 never appears."
                }
            },
            "if": {
                "properties": {
                    "count": {
                        "const": 0
                    }
                }
            },
            "then": {
                "properties": {
                    "mean": {
                        "type": "null"
                    },
                    "p50": {
                        "type": "null"
                    },
                    "p90": {
                        "type": "null"
                    },
                    "p99": {
                        "type": "null"
                    },
                    "max": {
                        "type": "null"
                    },
                    "counts": {
                        "maxItems": 0
                    }
                }
            },
            "else": {
                "properties": {
                    "mean": {
                        "type": "number"
                    },
                    "p50": {
                        "type": "number"
                    },
                    "p90": {
                        "type": "number"
                    },
                    "p99": {
                        "type": "number"
                    },
                    "max": {
                        "type": "number"
                    },
                    "counts": {
                        "minItems": 1
                    }
                }
            }
        })
    }
}

/// The wire form, either schema.
#[derive(Serialize, Deserialize)]
struct HistogramJson {
    count: u64,
    mean: Option<f64>,
    #[serde(default)]
    p50: Option<f64>,
    #[serde(default)]
    p90: Option<f64>,
    #[serde(default)]
    p99: Option<f64>,
    #[serde(default)]
    max: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    scale: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    first_bucket: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    counts: Option<Vec<i64>>,
    /// Schema 1: `[low, high, count]` in the field's unit.
    #[serde(default, skip_serializing)]
    buckets: Option<Vec<(f64, f64, u64)>>,
}

impl From<HistogramRecord> for HistogramJson {
    fn from(h: HistogramRecord) -> Self {
        let mut counts = Vec::with_capacity(h.buckets.len());
        let mut next = h.buckets.first().map_or(0, |&(i, _)| i);
        for &(index, n) in &h.buckets {
            if index > next {
                counts.push(-((index - next) as i64));
            }
            counts.push(i64::try_from(n).unwrap_or(i64::MAX));
            next = index + 1;
        }
        Self {
            count: h.count,
            mean: h.mean,
            p50: h.p50,
            p90: h.p90,
            p99: h.p99,
            max: h.max,
            scale: Some(h.scale),
            first_bucket: Some(h.buckets.first().map_or(0, |&(i, _)| i)),
            counts: Some(counts),
            buckets: None,
        }
    }
}

impl TryFrom<HistogramJson> for HistogramRecord {
    type Error = String;

    fn try_from(j: HistogramJson) -> Result<Self, String> {
        let (scale, buckets) = match (j.counts, j.buckets) {
            (Some(counts), _) => (
                j.scale.ok_or("a histogram with counts has no scale")?,
                decode_runs(j.first_bucket.unwrap_or(0), &counts)?,
            ),
            (None, Some(triples)) => from_triples(&triples)?,
            (None, None) => (j.scale.unwrap_or(1.0), Vec::new()),
        };
        if !(scale.is_finite() && scale > 0.0) {
            return Err(format!("histogram scale {scale} is not a positive number"));
        }
        Ok(Self {
            count: j.count,
            mean: j.mean,
            p50: j.p50,
            p90: j.p90,
            p99: j.p99,
            max: j.max,
            scale,
            buckets,
        })
    }
}

fn decode_runs(first: usize, counts: &[i64]) -> Result<Vec<(usize, u64)>, String> {
    let mut out = Vec::with_capacity(counts.len());
    let mut index = first;
    for &c in counts {
        match c {
            0 => return Err("a histogram's counts hold a 0 (empty runs are negative)".into()),
            skip if skip < 0 => index = index.saturating_add(skip.unsigned_abs() as usize),
            n => {
                if index >= super::BUCKETS {
                    return Err(format!("histogram bucket {index} is past the last one"));
                }
                out.push((index, n as u64));
                index += 1;
            }
        }
    }
    Ok(out)
}

/// Schema 1's triples back to kernel indexes. The unit was not written: µs
/// fields (scale 1e-3) were rounded to whole ns, so their edges land exactly
/// on the kernel's; anything else is a plain count (scale 1).
fn from_triples(triples: &[(f64, f64, u64)]) -> Result<(f64, Vec<(usize, u64)>), String> {
    let fits = |scale: f64| {
        triples.iter().all(|&(low, high, _)| {
            let (lo, hi) = ((low / scale).round(), (high / scale).round());
            let index = bucket_index(lo as u64);
            lo >= 0.0 && bucket_range(index) == (lo as u64, hi as u64)
        })
    };
    let scale = if fits(1e-3) {
        1e-3
    } else if fits(1.0) {
        1.0
    } else {
        return Err("histogram buckets are not the kernel's log-linear ones".into());
    };
    let buckets = triples
        .iter()
        .map(|&(low, _, n)| (bucket_index((low / scale).round() as u64), n))
        .collect();
    Ok((scale, buckets))
}

impl HistogramRecord {
    /// `[low, high, count]` per non-empty bucket, in the field's unit.
    pub fn triples(&self) -> impl Iterator<Item = (f64, f64, u64)> + '_ {
        // ns / 1000 rounds to the nearest µs figure (2175 → 2.175); ns ×
        // 0.001 would not (2.1750000000000003).
        let per_unit = 1.0 / self.scale;
        let field = move |v: u64| {
            if per_unit.fract() == 0.0 {
                v as f64 / per_unit
            } else {
                v as f64 * self.scale
            }
        };
        self.buckets.iter().map(move |&(index, n)| {
            let (lo, hi) = bucket_range(index);
            (field(lo), field(hi), n)
        })
    }

    // The detector's readings: an empty interval reads as zeros.
    pub fn mean(&self) -> f64 {
        self.mean.unwrap_or(0.0)
    }
    pub fn p50(&self) -> f64 {
        self.p50.unwrap_or(0.0)
    }
    pub fn p90(&self) -> f64 {
        self.p90.unwrap_or(0.0)
    }
    pub fn p99(&self) -> f64 {
        self.p99.unwrap_or(0.0)
    }
    pub fn max(&self) -> f64 {
        self.max.unwrap_or(0.0)
    }

    /// Values at or above `v` (buckets whose low end is).
    pub fn count_at_least(&self, v: f64) -> u64 {
        self.triples()
            .filter(|(low, _, _)| *low >= v)
            .map(|(_, _, n)| n)
            .sum()
    }

    /// Sum of the values at or above `v`, from bucket midpoints.
    pub fn sum_at_least(&self, v: f64) -> f64 {
        self.triples()
            .filter(|(low, _, _)| *low >= v)
            .map(|(low, high, n)| (low + high) / 2.0 * n as f64)
            .sum()
    }

    /// Total of all values (count × mean).
    pub fn total(&self) -> f64 {
        self.count as f64 * self.mean()
    }
}

/// `[low, high, count]` triples in the field's unit of a histogram object of
/// either schema; None when it is not one.
pub fn buckets_of(h: &serde_json::Value) -> Option<Vec<(f64, f64, u64)>> {
    let h = HistogramRecord::deserialize(h).ok()?;
    Some(h.triples().collect())
}

/// `(kernel bucket index, count)` of a histogram object of either schema.
pub fn bucket_counts_of(h: &serde_json::Value) -> Option<Vec<(usize, u64)>> {
    HistogramRecord::deserialize(h).ok().map(|h| h.buckets)
}

#[cfg(test)]
mod tests {
    use super::super::Histogram;
    use super::*;
    use serde_json::json;

    fn sample() -> Histogram {
        let mut h = Histogram::default();
        for (v, n) in [
            (3_900, 1),
            (4_200, 5),
            (9_000, 2),
            (9_100, 3),
            (4_000_000, 1),
        ] {
            h.record(v, n);
        }
        h
    }

    #[test]
    fn runs_of_empty_buckets_are_negative_and_round_trip() {
        let record = sample().to_record(1e-3);
        let v = serde_json::to_value(&record).unwrap();
        let counts = v["counts"].as_array().unwrap();
        assert!(counts.iter().all(|c| c.as_i64() != Some(0)));
        assert!(counts.iter().any(|c| c.as_i64().unwrap() < 0));
        assert_eq!(v["first_bucket"], json!(bucket_index(3_900)));
        let back: HistogramRecord = serde_json::from_value(v).unwrap();
        assert_eq!(back, record);
        assert_eq!(back.triples().map(|t| t.2).sum::<u64>(), 12);
    }

    #[test]
    fn schema_1_triples_read_as_the_same_buckets() {
        for scale in [1e-3, 1.0] {
            let record = sample().to_record(scale);
            let triples: Vec<_> = record.triples().collect();
            let v1 = json!({"count": 12, "mean": record.mean, "buckets": triples
                .iter()
                .map(|&(lo, hi, n)| json!([(lo * 1000.0).round() / 1000.0, (hi * 1000.0).round() / 1000.0, n]))
                .collect::<Vec<_>>()});
            let back: HistogramRecord = serde_json::from_value(v1).unwrap();
            assert_eq!((back.scale, &back.buckets), (scale, &record.buckets));
        }
        // Small exact counts (in-flight depths) are scale 1.
        let depths = json!({"count": 3, "mean": 2.0, "buckets": [[1.0, 1.0, 1], [3.0, 3.0, 2]]});
        assert_eq!(bucket_counts_of(&depths), Some(vec![(1, 1), (3, 2)]));
    }

    #[test]
    fn the_example_in_records_md_reads_as_it_says() {
        let h = json!({"count": 4, "mean": 2.2, "scale": 0.001, "first_bucket": 128, "counts": [3, -2, 1]});
        assert_eq!(
            buckets_of(&h),
            Some(vec![(2.048, 2.175, 3), (2.432, 2.559, 1)])
        );
    }

    #[test]
    fn malformed_histograms_are_refused() {
        for bad in [
            json!({"count": 1, "mean": 1.0, "scale": 1.0, "first_bucket": 0, "counts": [0]}),
            json!({"count": 1, "mean": 1.0, "first_bucket": 0, "counts": [1]}),
            json!({"count": 1, "mean": 1.0, "scale": 1.0, "first_bucket": 976, "counts": [1]}),
            json!({"count": 1, "mean": 1.0, "buckets": [[1.5, 2.5, 1]]}),
        ] {
            assert_eq!(buckets_of(&bad), None, "{bad}");
        }
        let empty =
            json!({"count": 0, "mean": null, "scale": 0.001, "first_bucket": 0, "counts": []});
        assert_eq!(buckets_of(&empty), Some(vec![]));
    }
}
