//! What the block family's maps hold before any hook runs: the disks `--disk`
//! names, the fast disks in the disk table (fast.rs), and the statistics
//! entries of the other disks present, so that no first I/O finds none.

use std::collections::HashSet;
use std::time::Duration;

use aya::maps::{Array, MapData, MapError, PerCpuHashMap, PerCpuValues, ProgramArray};
use aya::programs::Program;
use aya::{Btf, Ebpf};

use super::fast::FastDisks;
use super::sweep;
use super::sysfs::Sysfs;
use crate::abi::{self, block_disk, block_key, block_selected_disks, block_stats};
use crate::host::process_filter::ProcessFilter;
use crate::probes;

/// Before attach: tries at creating the statistics entries of the disks present, and the wait between.
const PREPARE_ATTEMPTS: usize = 20;
const PREPARE_RETRY: Duration = Duration::from_millis(25);

/// The completion program for disks outside block_stats_fast, and the
/// program array its hook tail-calls it through (block.bpf.c).
const TAIL_PROGRAM: &str = "tail_block_rq_complete";
const TAIL_ARRAY: &str = "block_complete_hashed";

/// Fill the maps of a freshly loaded block object (probes::Setup::before_attach).
pub fn before_attach(
    ebpf: &mut Ebpf,
    btf: &Btf,
    processes: &ProcessFilter,
    selected: Option<&HashSet<(u32, u32)>>,
    fast: &mut FastDisks,
) -> Result<(), String> {
    fill_tail(ebpf, btf)?;
    probes::process_filter::fill(ebpf, processes)?;
    if let Some(selected) = selected {
        let map = ebpf
            .map_mut("block_selected_disks")
            .ok_or("the object has no map block_selected_disks")?;
        let mut table: Array<&mut MapData, block_selected_disks> =
            Array::try_from(map).map_err(|e| e.to_string())?;
        // The first `disk_filter` places (load_globals): as many as there are disks.
        let mut ids = block_selected_disks::default();
        for (place, &disk) in ids.ids.iter_mut().zip(selected) {
            *place = sweep::disk_id(disk);
        }
        table.set(0, ids, 0).map_err(|e| e.to_string())?;
    }
    let map = ebpf
        .map_mut("block_disks")
        .ok_or("the object has no map block_disks")?;
    let mut disks: Array<&mut MapData, block_disk> =
        Array::try_from(map).map_err(|e| e.to_string())?;
    fast.enter(&mut disks, crate::host::clock::monotonic_ns());

    let map = ebpf
        .map_mut("block_stats")
        .ok_or("the object has no map block_stats")?;
    let mut stats: PerCpuHashMap<&mut MapData, block_key, block_stats> =
        PerCpuHashMap::try_from(map).map_err(|e| e.to_string())?;
    let mut missing: Vec<(u32, u32)> = Sysfs::default()
        .disks_with_media()
        .into_iter()
        .map(|(_, major, minor)| (major, minor))
        .filter(|disk| selected.is_none_or(|s| s.contains(disk)))
        .filter(|&disk| !fast.has(disk))
        .collect();
    // An entry comes from the kernel's atomic per-CPU pool, which is
    // refilled in the background: just after boot it can run dry (seen
    // on 5.10), and the disk's first I/Os would then find no entry either.
    // A few short waits for the refill; what still fails is retried at
    // every interval after attach.
    for _ in 0..PREPARE_ATTEMPTS {
        missing.retain(|&(major, minor)| !prepare_disk(&mut stats, major, minor));
        if missing.is_empty() {
            break;
        }
        std::thread::sleep(PREPARE_RETRY);
    }
    Ok(())
}

/// Load the completion program of the disks outside block_stats_fast and
/// put it in the array the completion hook tail-calls it through. The array
/// empties when the last descriptor of it closes (the kernel's rule for
/// program arrays): it stays with the object, which lives as long as the run.
pub fn fill_tail(ebpf: &mut Ebpf, btf: &Btf) -> Result<(), String> {
    let program = ebpf
        .program_mut(TAIL_PROGRAM)
        .ok_or_else(|| format!("the object has no program {TAIL_PROGRAM}"))?;
    let loaded = match program {
        Program::BtfTracePoint(p) => p.load("block_rq_complete", btf),
        Program::RawTracePoint(p) => p.load(),
        _ => return Err(format!("{TAIL_PROGRAM}: not a tracepoint program")),
    };
    loaded.map_err(|e| format!("{TAIL_PROGRAM}: {}", probes::describe(&e)))?;
    let fd = program
        .fd()
        .and_then(|fd| fd.try_clone().map_err(Into::into))
        .map_err(|e| format!("{TAIL_PROGRAM}: {}", probes::describe(&e)))?;
    let map = ebpf
        .map_mut(TAIL_ARRAY)
        .ok_or_else(|| format!("the object has no map {TAIL_ARRAY}"))?;
    let mut array: ProgramArray<&mut MapData> =
        ProgramArray::try_from(map).map_err(|e| e.to_string())?;
    array
        .set(0, &fd, 0)
        .map_err(|e| format!("{TAIL_ARRAY}: {}", probes::describe(&e)))
}

/// Create `(major, minor)`'s common (disk, op) entries in `block_stats` if
/// missing (never resetting one the kernel side created). False when one could
/// not be created.
pub fn prepare_disk<T: std::borrow::BorrowMut<MapData>>(
    stats: &mut PerCpuHashMap<T, block_key, block_stats>,
    major: u32,
    minor: u32,
) -> bool {
    let Ok(ncpus) = aya::util::nr_cpus() else {
        return false;
    };
    let mut ok = true;
    for op in [abi::BLOCK_OP_READ, abi::BLOCK_OP_WRITE, abi::BLOCK_OP_FLUSH] {
        let key = block_key { major, minor, op };
        let Ok(zeroed) = PerCpuValues::try_from(vec![block_stats::default(); ncpus]) else {
            return false;
        };
        match stats.insert(key, zeroed, u64::from(aya_obj::generated::BPF_NOEXIST)) {
            Ok(()) => {}
            Err(MapError::SyscallError(e)) if e.io_error.raw_os_error() == Some(libc::EEXIST) => {}
            Err(_) => ok = false,
        }
    }
    ok
}
