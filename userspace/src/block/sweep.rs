//! Keeping the block family's kernel tables to what is alive: the entries of
//! disks that are gone, and slots whose owner the hooks will never see again.
//!
//! Without this, a host that creates and deletes disks (loop devices of
//! containers and tests, hot-plugged LUNs) fills `block_stats` (320 entries)
//! with disks that no longer exist, and from then on a new disk's first I/Os
//! find no entry (`block.block_stats_entry_unavailable`). And a bio or request
//! whose completion the kernel did not run the hook for (reconcile.rs) holds
//! its slot until a claimer happens to land on it: harmless for memory (the
//! tables are preallocated) but it leaves the tables fuller by the hour.

use std::collections::HashSet;

use aya::maps::HashMap as BpfHashMap;
use aya::maps::{Array, MapData, PerCpuHashMap};

use crate::abi::{self, bio_slot, block_disk, block_key, block_rq_slot, block_stats};

/// How often stale slots are looked for: the tables are 32768 entries each,
/// read one system call per entry (~30 ms a table on the development VM).
pub const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(60);

/// The disk table's id of `(major, first minor)`.
pub fn disk_id((major, minor): (u32, u32)) -> u64 {
    (u64::from(major) << 32) | u64::from(minor)
}

/// The index of disk `id`'s entry in the disk table.
pub fn disk_index(disks: &Array<MapData, block_disk>, id: u64) -> Option<u32> {
    (0..disks.len()).find(|&i| disks.get(&i, 0).is_ok_and(|d| d.id == id))
}

/// Delete the kernel-side entries of `disk` (statistics of every op, the
/// unsettled counts, its disk-table entry at `index`). The caller has made
/// sure it is gone and idle, so no hook writes them any more; if the disk
/// comes back under the same numbers, the hooks and `prepare_disks` create
/// new ones.
pub fn forget_disk(
    stats: &mut PerCpuHashMap<MapData, block_key, block_stats>,
    unsettled: &mut BpfHashMap<MapData, block_key, u64>,
    disks: &mut Array<MapData, block_disk>,
    (major, minor): (u32, u32),
    index: Option<u32>,
) {
    for op in 0..abi::BLOCK_OP_COUNT {
        let key = block_key { major, minor, op };
        let _ = stats.remove(&key);
        let _ = unsettled.remove(&key);
    }
    // Nothing else writes the entry of a gone disk: a claimer takes only a free
    // slot (owner and claim count both zero, slots.bpf.h), never one held.
    if let Some(index) = index {
        let _ = disks.set(index, block_disk::default(), 0);
    }
}

/// The disks in `known` that are not in `present` (gone, or without media).
pub fn gone(
    known: impl IntoIterator<Item = (u32, u32)>,
    present: &HashSet<(u32, u32)>,
) -> HashSet<(u32, u32)> {
    known.into_iter().filter(|d| !present.contains(d)).collect()
}

/// What one sweep freed.
#[derive(Debug, Default, PartialEq)]
pub struct Swept {
    pub bio_slots: u64,
    pub rq_slots: u64,
    pub notes: u64,
}

/// Free the slots claimed more than SLOT_STALE_NS before `now_ns` (the kernel's
/// monotonic clock): bios whose request's completion was skipped, requests
/// settled at idle and never issued again (not in flight), and the completion
/// hook's notes that old. A claimer on a CPU could take a stale slot between
/// our read and our write, and we would then free its fresh claim; a slot's
/// claim rate is a few per second at most, the window a few microseconds,
/// and the cost one I/O's phases (its completion finds no slot).
pub fn sweep(
    bio_slots: &mut Array<MapData, bio_slot>,
    rq_slots: &mut Array<MapData, block_rq_slot>,
    note_keys: &mut Array<MapData, u64>,
    note_times: &mut Array<MapData, u64>,
    now_ns: u64,
) -> Swept {
    let stale = |stamp: u64| now_ns.saturating_sub(stamp) > abi::SLOT_STALE_NS;
    let mut swept = Swept {
        bio_slots: free_where(bio_slots, |s| s.head.owner != 0 && stale(s.head.stamp_ns)),
        rq_slots: free_where(rq_slots, |s| {
            s.head.owner != 0 && s.in_flight == 0 && stale(s.head.stamp_ns)
        }),
        notes: 0,
    };
    let notes: Vec<u32> = (0..note_keys.len())
        .filter(|i| {
            note_keys.get(i, 0).is_ok_and(|k| k != 0) && note_times.get(i, 0).is_ok_and(stale)
        })
        .collect();
    for i in notes {
        if note_keys.set(i, 0, 0).is_ok() {
            let _ = note_times.set(i, 0, 0);
            swept.notes += 1;
        }
    }
    swept
}

/// Zero every entry of `table` that `free` picks; returns how many were zeroed.
fn free_where<T: aya::Pod + Default>(
    table: &mut Array<MapData, T>,
    free: impl Fn(&T) -> bool,
) -> u64 {
    let picked: Vec<u32> = (0..table.len())
        .filter(|i| table.get(i, 0).is_ok_and(|v| free(&v)))
        .collect();
    picked
        .into_iter()
        .filter(|&i| table.set(i, T::default(), 0).is_ok())
        .count() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gone_is_what_is_known_and_not_present() {
        let present: HashSet<_> = [(7, 0), (259, 0)].into();
        let g = gone([(7, 0), (7, 1), (7, 1), (8, 16)], &present);
        assert_eq!(g, [(7, 1), (8, 16)].into());
    }
}
