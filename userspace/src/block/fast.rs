//! The disks whose statistics live in `block_stats_fast`, a per-CPU array the
//! completion hook indexes through the disk table (abi.h, `block_disk.fast`)
//! instead of looking `block_stats` up by key: the hash lookup was about an
//! eighth of the completion hook's time (docs/BENCHMARKS.md).
//!
//! Which disks: the request-based disks with media present when the daemon
//! starts (bio-based ones, device-mapper and md, complete bios only), up to
//! BLOCK_FAST_DISKS_MAX, each with BLOCK_FAST_OPS entries (read, write,
//! flush). The daemon enters them in the disk table itself before any hook
//! runs, so no hook ever writes their entries concurrently with it; a disk
//! that appears later is entered by the kernel side and keeps its statistics
//! in `block_stats`, as do every disk's other ops. The array is sized at load
//! to what it holds, so it costs the memory the hash would for those disks.

use std::collections::HashMap;

use aya::maps::{Array, MapData, PerCpuArray, PerCpuValues};

use crate::abi::{self, block_disk, block_key, block_stats};

use super::sweep::disk_id;
use super::sysfs::Sysfs;

/// The map the daemon sizes at load.
pub const MAP: &str = "block_stats_fast";

/// slots.bpf.h's `slot_home`: the disk table entry a disk's probes start at.
fn slot_home(key: u64, bits: u32) -> u32 {
    // bindgen types the 64-bit constant as i64; the cast keeps its bits
    let multiplier = abi::SLOT_HASH_MULTIPLIER as u64;
    (key.wrapping_mul(multiplier) >> (64 - bits)) as u32
}

/// Each fast disk's first entry in the array, by disk.
#[derive(Debug, Default)]
pub struct FastDisks {
    first: HashMap<(u32, u32), u32>,
    /// Disks chosen, in the order of their entries.
    chosen: Vec<(u32, u32)>,
}

impl FastDisks {
    /// The request-based disks with media in `sysfs`, those `wanted` allows,
    /// at most BLOCK_FAST_DISKS_MAX.
    pub fn choose(sysfs: &Sysfs, wanted: impl Fn(&(u32, u32)) -> bool) -> Self {
        let chosen: Vec<(u32, u32)> = sysfs
            .disks_with_media()
            .into_iter()
            .filter(|(name, ..)| sysfs.request_based(name))
            .map(|(_, major, minor)| (major, minor))
            .filter(|d| wanted(d))
            .take(abi::BLOCK_FAST_DISKS_MAX as usize)
            .collect();
        Self {
            first: HashMap::new(),
            chosen,
        }
    }

    /// The array's size: BLOCK_FAST_OPS entries per chosen disk (a map holds at least one).
    pub fn entries(&self) -> u32 {
        (self.chosen.len() as u32 * abi::BLOCK_FAST_OPS).max(1)
    }

    /// Enter the chosen disks in the disk table, each with its entries, before
    /// any hook runs. A disk whose probes are all taken by the others is left
    /// to the kernel side (and to `block_stats`).
    pub fn enter(&mut self, disks: &mut Array<&mut MapData, block_disk>, now_ns: u64) {
        let bits = abi::BLOCK_DISK_TABLE_BITS;
        for (k, &disk) in self.chosen.iter().enumerate() {
            let id = disk_id(disk);
            let home = slot_home(id, bits);
            let first = k as u32 * abi::BLOCK_FAST_OPS;
            let free = (0..abi::SLOT_PROBES)
                .map(|i| (home + i) & ((1 << bits) - 1))
                .find(|i| disks.get(i, 0).is_ok_and(|e| e.id == 0));
            let Some(index) = free else { continue };
            let entry = block_disk {
                id,
                claimed_ns: now_ns,
                claims: 1,
                fast: first + 1,
                ..block_disk::default()
            };
            if disks.set(index, entry, 0).is_ok() {
                self.first.insert(disk, first);
            }
        }
    }

    /// Whether `disk` keeps its read, write and flush statistics in the array.
    pub fn has(&self, disk: (u32, u32)) -> bool {
        self.first.contains_key(&disk)
    }

    /// Every entered disk's statistics, by (disk, op).
    pub fn read(
        &self,
        map: &PerCpuArray<MapData, block_stats>,
    ) -> Vec<(block_key, Vec<block_stats>)> {
        let mut out = Vec::new();
        for (&(major, minor), &first) in &self.first {
            for op in 0..abi::BLOCK_FAST_OPS {
                if let Ok(values) = map.get(&(first + op), 0) {
                    out.push((
                        block_key { major, minor, op },
                        values.iter().copied().collect(),
                    ));
                }
            }
        }
        out
    }

    /// Forget `disk` (gone): its entries are zeroed and never read again. Not
    /// given to another disk: the kernel side enters later disks itself, and
    /// writing an entry it may be updating would lose its updates.
    pub fn forget(&mut self, map: &mut PerCpuArray<MapData, block_stats>, disk: (u32, u32)) {
        let Some(first) = self.first.remove(&disk) else {
            return;
        };
        let Ok(ncpus) = aya::util::nr_cpus() else {
            return;
        };
        for op in 0..abi::BLOCK_FAST_OPS {
            if let Ok(zeroed) = PerCpuValues::try_from(vec![block_stats::default(); ncpus]) {
                let _ = map.set(first + op, zeroed, 0);
            }
        }
    }
}

/// Per CPU, `a` + `b`: a (disk, op) whose statistics are in both maps (an op
/// a hook without the disk table entry at hand counted in `block_stats`).
pub fn merge(a: &mut [block_stats], b: &[block_stats]) {
    for (x, y) in a.iter_mut().zip(b) {
        x.requests = x.requests.wrapping_add(y.requests);
        x.bytes = x.bytes.wrapping_add(y.bytes);
        x.bios = x.bios.wrapping_add(y.bios);
        x.requeues = x.requeues.wrapping_add(y.requeues);
        x.errors = x.errors.wrapping_add(y.errors);
        x.unseen = x.unseen.wrapping_add(y.unseen);
        for (h, g) in [
            (&mut x.total, &y.total),
            (&mut x.tag_wait, &y.tag_wait),
            (&mut x.queue, &y.queue),
            (&mut x.device, &y.device),
            (&mut x.inflight, &y.inflight),
        ] {
            h.sum = h.sum.wrapping_add(g.sum);
            for (c, d) in h.buckets.iter_mut().zip(g.buckets.iter()) {
                *c = c.wrapping_add(*d);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn homes_spread_over_the_table() {
        // Consecutive disk ids (sda, sdb, ...) must not share a home.
        let homes: std::collections::HashSet<u32> = (0..16)
            .map(|i| slot_home(disk_id((8, i * 16)), abi::BLOCK_DISK_TABLE_BITS))
            .collect();
        assert!(homes.len() >= 14, "{homes:?}");
        assert!(homes.iter().all(|&h| h < 1 << abi::BLOCK_DISK_TABLE_BITS));
    }

    #[test]
    fn merging_adds_every_counter_and_bucket() {
        let mut a = vec![block_stats::default(); 2];
        let mut b = vec![block_stats::default(); 2];
        a[0].requests = 3;
        b[0].requests = 4;
        b[1].device.buckets[7] = 2;
        b[1].device.sum = 99;
        a[1].unseen = u64::MAX;
        b[1].unseen = 2;
        merge(&mut a, &b);
        assert_eq!(a[0].requests, 7);
        assert_eq!(a[1].device.buckets[7], 2);
        assert_eq!(a[1].device.sum, 99);
        assert_eq!(a[1].unseen, 1, "wrapping, as the kernel's counters do");
    }
}
