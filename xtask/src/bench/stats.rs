//! Order statistics of a handful of rounds: median and range, nothing fancier
//! (five samples do not support a standard deviation worth printing).

use serde::Serialize;

#[derive(Serialize, Clone, Copy, Debug, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
}

impl Summary {
    /// None for no samples.
    pub fn of(samples: &[f64]) -> Option<Self> {
        if samples.is_empty() {
            return None;
        }
        let mut v = samples.to_vec();
        v.sort_by(f64::total_cmp);
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Self {
            median,
            min: v[0],
            max: v[n - 1],
        })
    }
}

/// The summary of one figure over the rounds, which are never none.
pub fn summary(v: impl IntoIterator<Item = f64>) -> Summary {
    Summary::of(&v.into_iter().collect::<Vec<_>>()).expect("at least one round")
}

/// "min–max" of `s`, with `digits` decimals.
pub fn range(s: &Summary, digits: usize) -> String {
    format!("{:.digits$}–{:.digits$}", s.min, s.max)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        let s = Summary::of(&[5.0, 1.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (3.0, 1.0, 5.0));
        assert_eq!(Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap().median, 2.5);
        assert_eq!(Summary::of(&[]), None);
    }

    #[test]
    fn summary_and_range_of_rounds() {
        let s = summary([2.0, 0.5, 1.25]);
        assert_eq!((s.median, s.min, s.max), (1.25, 0.5, 2.0));
        assert_eq!(range(&s, 1), "0.5–2.0");
        assert_eq!(range(&s, 0), "0–2");
    }
}
