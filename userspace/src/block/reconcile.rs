//! Settling requests whose completion never reached the hooks.
//!
//! On the 6.18 kernel this was built on, about 1 in 10^4 request completions
//! fires the tracepoint (perf counts it) without running the BPF programs, and
//! with no recursion miss recorded. The kernel side settles such a request when
//! the same request is issued again (its slot still says in flight). A request
//! that is never issued again would hold the disk's in-flight gauge up for
//! good; this settles those when the kernel's own count proves they are done:
//! the disk did no I/O for a whole interval, and with I/O accounting on, the
//! kernel says nothing is in flight. A stuck I/O is never settled: the kernel
//! still counts it.

use std::collections::HashMap;

use aya::maps::{Array, MapData};

use super::sysfs::Sysfs;
use crate::abi::{block_disk, block_rq_slot};

/// Requests settled, by op, for one disk.
pub type Settled = HashMap<u32, u64>;

/// Whether the kernel proves `disk` has nothing in flight.
pub fn kernel_says_idle(sysfs: &Sysfs, disk: &str) -> bool {
    sysfs.io_accounting(disk) == Some(true) && sysfs.kernel_inflight(disk) == Some((0, 0))
}

/// End the life of `disk_id`'s in-flight request slots and zero its gauge (entry `index`
/// of the disk table). Returns what was settled, by op.
pub fn settle(
    rq_slots: &mut Array<MapData, block_rq_slot>,
    disks: &mut Array<MapData, block_disk>,
    index: u32,
    disk_id: u64,
) -> Settled {
    let mut settled = Settled::new();
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
            *settled.entry(slot.op).or_default() += 1;
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
