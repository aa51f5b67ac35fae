//! Settling requests whose completion the hooks never settled, when their
//! disk goes idle: the fallback for a kernel that refuses the settle pass
//! (settle.rs), which settles them request by request whether the disk idles
//! or not, and for disks that are gone.
//!
//! The kernel does not always run the completion hook: it skips a program
//! already running on the CPU (a recursion miss), and the 6.18 Firecracker
//! kernel of the development VM runs no tracing program while the current
//! task belongs to PID 1, so a completion softirq that lands on that process
//! is invisible (block.bpf.c, above `same_life`). The kernel side settles such a
//! request when the same request is issued again (its slot still says in
//! flight). A request that is never issued again would hold the disk's
//! in-flight gauge up for good; this settles those when the kernel's own count
//! proves they are done: the disk did no I/O for a whole interval, and with
//! I/O accounting on, the kernel says nothing is in flight. A stuck I/O is
//! never settled: the kernel still counts it.
//!
//! Each one settled is told apart as the kernel side does: the completion
//! hook ran for it and could not settle it (noted in `rq_unsettled_key` and
//! `rq_unsettled_ns`), or the kernel never ran the hook.

use std::collections::HashMap;

use aya::maps::{Array, MapData};

use super::sysfs::Sysfs;
use crate::abi::{block_disk, block_rq_slot};

/// What was settled for one op of one disk.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Settled {
    /// The kernel never ran the completion hook for them (`block.kernel_skipped`).
    pub skipped: u64,
    /// The hook ran and could not settle them (`completions_unseen`).
    pub unsettled: u64,
}

/// Completions the hook left unsettled: request address -> when it completed.
pub type Unsettled = HashMap<u64, u64>;

/// Whether the kernel proves `disk` has nothing in flight.
pub fn kernel_says_idle(sysfs: &Sysfs, disk: &str) -> bool {
    sysfs.io_accounting(disk) == Some(true) && sysfs.kernel_inflight(disk) == Some((0, 0))
}

/// The completion hook's notes of requests it left unsettled (block_state.bpf.h's
/// `rq_unsettled_key` and `rq_unsettled_ns`, two arrays indexed alike).
pub fn unsettled(keys: &Array<MapData, u64>, times: &Array<MapData, u64>) -> Unsettled {
    keys.iter()
        .zip(times.iter())
        .filter_map(|(k, t)| Some((k.ok()?, t.ok()?)))
        .filter(|&(key, _)| key != 0)
        .collect()
}

/// End the life of `disk_id`'s in-flight request slots and zero its gauge (entry
/// `index` of the disk table). Returns what was settled, by op.
pub fn settle(
    rq_slots: &mut Array<MapData, block_rq_slot>,
    disks: &mut Array<MapData, block_disk>,
    unsettled: &Unsettled,
    index: u32,
    disk_id: u64,
) -> HashMap<u32, Settled> {
    let mut settled: HashMap<u32, Settled> = HashMap::new();
    let stale: Vec<(u32, block_rq_slot)> = rq_slots
        .iter()
        .enumerate()
        .filter_map(|(i, s)| s.ok().map(|s| (i as u32, s)))
        .filter(|(_, s)| s.head.owner != 0 && s.in_flight != 0 && s.disk_id == disk_id)
        .collect();
    for (i, slot) in stale {
        // The slot stays its request's (the kernel side counts claims on it, see
        // slots.bpf.h): only its life ends, as after a requeue. The request's next
        // issue, or a claim after SLOT_STALE_NS, takes it up again.
        let settled_slot = block_rq_slot {
            in_flight: 0,
            ..slot
        };
        if rq_slots.set(i, settled_slot, 0).is_ok() {
            let entry = settled.entry(slot.op).or_default();
            if hook_left_unsettled(unsettled, &slot) {
                entry.unsettled += 1;
            } else {
                entry.skipped += 1;
            }
        }
    }
    if let Ok(mut entry) = disks.get(&index, 0)
        && entry.id == disk_id
    {
        entry.inflight = 0;
        let _ = disks.set(index, entry, 0);
    }
    settled
}

/// As block.bpf.c's `hook_left_unsettled`: a note for this request since its last issue.
fn hook_left_unsettled(unsettled: &Unsettled, slot: &block_rq_slot) -> bool {
    unsettled
        .get(&slot.head.owner)
        .is_some_and(|&completed| completed >= slot.issue_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_counts_only_after_the_last_issue() {
        let mut slot = block_rq_slot {
            issue_ns: 1_000,
            in_flight: 1,
            ..Default::default()
        };
        slot.head.owner = 0xffff_8880_0000_1000;
        let mut unsettled = Unsettled::new();
        assert!(!hook_left_unsettled(&unsettled, &slot));
        // A note from an earlier life (before this issue) says nothing about this one.
        unsettled.insert(slot.head.owner, 999);
        assert!(!hook_left_unsettled(&unsettled, &slot));
        unsettled.insert(slot.head.owner, 1_500);
        assert!(hook_left_unsettled(&unsettled, &slot));
    }
}
