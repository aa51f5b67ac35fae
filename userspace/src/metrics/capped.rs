//! A label whose values are unbounded on a busy host (peers, containers),
//! each one a series in every Prometheus that scrapes: the first N values
//! get series of their own and the rest share one, `other`, so the sums stay
//! whole. A value quiet for SERIES_TTL gives its place up (its series expire
//! with it).

use std::collections::HashMap;
use std::hash::Hash;
use std::time::Instant;

use super::registry::SERIES_TTL;

/// The label value of everything past the cap.
pub const OTHER: &str = "other";

#[derive(Debug)]
pub struct Capped<K> {
    cap: usize,
    /// Values with series of their own → last seen.
    placed: HashMap<K, Instant>,
}

impl<K: Eq + Hash + Clone> Capped<K> {
    pub fn new(cap: usize) -> Self {
        Self {
            cap,
            placed: HashMap::new(),
        }
    }

    /// Whether `key` has a series of its own, seen at `now`: it had one, or
    /// takes a free place, or the place of the value quiet longest if that one
    /// has been quiet for SERIES_TTL.
    pub fn place(&mut self, key: &K, now: Instant) -> bool {
        if let Some(seen) = self.placed.get_mut(key) {
            *seen = now;
            return true;
        }
        if self.placed.len() >= self.cap && !self.free_a_place(now) {
            return false;
        }
        self.placed.insert(key.clone(), now);
        true
    }

    fn free_a_place(&mut self, now: Instant) -> bool {
        let quietest = self
            .placed
            .iter()
            .min_by_key(|(_, seen)| **seen)
            .map(|(k, seen)| (k.clone(), *seen));
        match quietest {
            Some((key, seen)) if now.duration_since(seen) >= SERIES_TTL => {
                self.placed.remove(&key);
                true
            }
            _ => false,
        }
    }
}
