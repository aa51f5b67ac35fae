//! Per-interval series kept for the heatmaps, bounded: a day at 1 s intervals
//! would otherwise hold every interval's buckets of every disk op. When a
//! series reaches [`MAX_POINTS`], neighbouring points are merged in pairs (the
//! page bins its columns far coarser than that anyway), so memory stays flat
//! and no count is lost.

use super::merge::Sparse;

pub const MAX_POINTS: usize = 2048;

/// A point that can absorb the one after it.
pub trait Point {
    /// `next` follows `self` in time: the merged point ends where `next` ends.
    fn absorb(&mut self, next: Self);
}

/// Push `p`, halving the series first when it is full.
pub fn push<P: Point>(series: &mut Vec<P>, p: P) {
    if series.len() >= MAX_POINTS {
        let old = std::mem::take(series);
        let mut it = old.into_iter();
        while let Some(mut a) = it.next() {
            if let Some(b) = it.next() {
                a.absorb(b);
            }
            series.push(a);
        }
    }
    series.push(p);
}

/// Bucket counts of two intervals added, by bucket index.
pub fn add_sparse(a: &mut Sparse, b: &Sparse) {
    for &(index, n) in b {
        match a.binary_search_by_key(&index, |&(i, _)| i) {
            Ok(at) => a[at].1 += n,
            Err(at) => a.insert(at, (index, n)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq)]
    struct P {
        end: i64,
        n: u64,
    }

    impl Point for P {
        fn absorb(&mut self, next: Self) {
            self.end = next.end;
            self.n += next.n;
        }
    }

    #[test]
    fn a_full_series_halves_and_keeps_every_count() {
        let mut s = Vec::new();
        for i in 0..(MAX_POINTS as i64 * 3) {
            push(&mut s, P { end: i, n: 1 });
        }
        assert!(s.len() <= MAX_POINTS);
        assert_eq!(s.iter().map(|p| p.n).sum::<u64>(), MAX_POINTS as u64 * 3);
        assert_eq!(s.last().unwrap().end, MAX_POINTS as i64 * 3 - 1);
        assert!(s.windows(2).all(|w| w[0].end < w[1].end));
    }

    #[test]
    fn sparse_buckets_add_by_index() {
        let mut a: Sparse = vec![(3, 1), (9, 2)];
        add_sparse(&mut a, &vec![(1, 5), (9, 1), (12, 4)]);
        assert_eq!(a, vec![(1, 5), (3, 1), (9, 3), (12, 4)]);
    }
}
