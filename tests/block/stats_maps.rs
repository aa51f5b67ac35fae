//! Where a disk's statistics are kept: a disk present when the daemon starts
//! in the per-CPU array its completions index directly (block_stats_fast),
//! one that appears later in the hash (block_stats, completed by the
//! tail-called program). Both must be measured in full.

use super::*;
use stalltrace_lab::kernel_objects as ko;

/// The (major, minor) of every key in the daemon's `block_stats` hash.
fn hashed_disks(pid: u32) -> Vec<(u32, u32)> {
    let maps = ko::maps_of(pid);
    let map = maps
        .iter()
        .find(|m| m.name == "block_stats")
        .unwrap_or_else(|| panic!("the daemon holds no map block_stats: {maps:?}"));
    ko::map_keys(map.id)
        .iter()
        .map(|k| {
            let word = |i: usize| u32::from_ne_bytes(k[i..i + 4].try_into().unwrap());
            (word(0), word(4))
        })
        .collect()
}

fn major_minor(disk: &LoopDevice) -> (u32, u32) {
    let dev = std::fs::read_to_string(format!("/sys/block/{}/dev", disk.name)).unwrap();
    let (major, minor) = dev.trim().split_once(':').unwrap();
    (major.parse().unwrap(), minor.parse().unwrap())
}

#[test]
fn disks_present_at_the_start_and_later_are_both_counted_in_full() {
    require_root();
    let early = LoopDevice::new(Backing::Tmpfs, 128, true);
    let tracer = Tracer::start(&["--interval", INTERVAL, "--slow-io-ms", "0"]);
    let late = LoopDevice::new(Backing::Tmpfs, 128, true);
    let mut kernel = Vec::new();
    for disk in [&early, &late] {
        let before = disk.diskstats();
        randread_4k(&disk.dev, &["--ioengine=libaio", "--iodepth=16"], 2);
        kernel.push(disk.diskstats().reads_completed - before.reads_completed);
    }
    settle();
    let hashed = hashed_disks(tracer.pid());
    let records = tracer.stop();

    for (disk, kernel) in [&early, &late].into_iter().zip(kernel) {
        let reads = block_records(&records, &disk.name, "read");
        let count = sum_field(&reads, "count");
        eprintln!(
            "{}: stalltrace {count} reads, diskstats {kernel}",
            disk.name
        );
        assert!(kernel > 1000, "fio did too little on {}", disk.name);
        assert_eq!(count, kernel, "{}: count vs diskstats", disk.name);
        assert_eq!(reads.last().unwrap()["inflight_now"], 0);
    }
    let (early_id, late_id) = (major_minor(&early), major_minor(&late));
    assert!(
        !hashed.contains(&early_id),
        "{} was present at the start but its statistics are in the hash: {hashed:?}",
        early.name
    );
    assert!(
        hashed.contains(&late_id),
        "{} appeared later, yet its statistics are not in the hash: {hashed:?}",
        late.name
    );
}
