//! Slots whose owner the hooks will never see again are freed by the daemon.

use std::time::{Duration, Instant};

// Through faults.rs, whatever the lab's module path is there.
use super::*;

/// The daemon frees stale slots once a minute (userspace/src/block/sweep.rs).
const SWEEP_WAIT: Duration = Duration::from_secs(80);

/// An index no test I/O is likely to use in a 32768-entry table (any would do:
/// a real owner hashing there probes the next slots).
const INDEX: u32 = 12_345;

fn hex(bytes: &[u8]) -> Vec<String> {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `bpftool map update` of entry `index` of array map `id`.
fn write_entry(id: u64, index: u32, value: &[u8]) {
    let id = id.to_string();
    let mut args = vec!["map", "update", "id", id.as_str(), "key", "hex"];
    let key = hex(&index.to_ne_bytes());
    let value = hex(value);
    args.extend(key.iter().map(String::as_str));
    args.push("value");
    args.push("hex");
    args.extend(value.iter().map(String::as_str));
    sh("bpftool", &args);
}

/// The first 8 bytes (the owner, or a note's key) of entry `index` of map `id`.
fn first_word(id: u64, index: u32) -> u64 {
    let id = id.to_string();
    let key = hex(&index.to_ne_bytes());
    let mut args = vec!["--json", "map", "lookup", "id", id.as_str(), "key", "hex"];
    args.extend(key.iter().map(String::as_str));
    let v: Value = serde_json::from_str(&sh("bpftool", &args)).expect("bpftool JSON");
    let bytes: Vec<u8> = v["value"]
        .as_array()
        .expect("value bytes")
        .iter()
        .take(8)
        .map(|b| u8::from_str_radix(b.as_str().unwrap().trim_start_matches("0x"), 16).unwrap())
        .collect();
    u64::from_ne_bytes(bytes.try_into().unwrap())
}

/// A slot value of `size` bytes: owner, claim stamp, claim count 1, the rest 0.
fn slot(size: usize, owner: u64, stamp_ns: u64) -> Vec<u8> {
    let mut v = vec![0u8; size];
    v[0..8].copy_from_slice(&owner.to_ne_bytes());
    v[8..16].copy_from_slice(&stamp_ns.to_ne_bytes());
    v[16..20].copy_from_slice(&1u32.to_ne_bytes());
    v
}

fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes the timespec it is given.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A bio slot, a request slot (not in flight) and a completion note claimed
/// longer ago than the kernel's 10-minute staleness are freed within a sweep;
/// a bio slot claimed just now is left alone. The stale entries are written
/// into the running daemon's maps with bpftool: waiting 10 minutes for real
/// ones is not a test.
#[test]
fn stale_slots_are_freed_and_live_ones_kept() {
    require_root();
    let tracer = Tracer::start(&["--interval", "500ms"]);
    let maps = ko::maps_of(tracer.pid());
    let id_of = |name: &str| {
        maps.iter()
            .find(|m| m.name == name)
            .unwrap_or_else(|| panic!("the daemon holds no map {name}: {maps:?}"))
            .id
    };
    let (bios, rqs, notes, note_times) = (
        id_of("bio_slots"),
        id_of("rq_slots"),
        id_of("rq_unsettled_ke"),
        id_of("rq_unsettled_ns"),
    );
    let bio_size = std::mem::size_of::<stalltrace::abi::bio_slot>();
    let rq_size = std::mem::size_of::<stalltrace::abi::block_rq_slot>();
    let ancient = 1;
    write_entry(bios, INDEX, &slot(bio_size, 0xdead_0001, ancient));
    write_entry(
        bios,
        INDEX + 1,
        &slot(bio_size, 0xdead_0002, monotonic_ns()),
    );
    write_entry(rqs, INDEX, &slot(rq_size, 0xdead_0003, ancient));
    write_entry(notes, INDEX, &0xdead_0004u64.to_ne_bytes());
    write_entry(note_times, INDEX, &ancient.to_ne_bytes());

    let began = Instant::now();
    let freed = || {
        first_word(bios, INDEX) == 0 && first_word(rqs, INDEX) == 0 && first_word(notes, INDEX) == 0
    };
    while !freed() && began.elapsed() < SWEEP_WAIT {
        std::thread::sleep(Duration::from_secs(1));
    }
    let (bio, rq, note) = (
        first_word(bios, INDEX),
        first_word(rqs, INDEX),
        first_word(notes, INDEX),
    );
    let live = first_word(bios, INDEX + 1);
    let stderr = tracer.stderr_text();
    tracer.stop();
    assert!(stderr.trim().is_empty(), "the daemon complained: {stderr}");
    assert_eq!(
        (bio, rq, note),
        (0, 0, 0),
        "stale bio slot, request slot and note still there after {:?}",
        began.elapsed()
    );
    assert_eq!(live, 0xdead_0002, "a live bio slot was freed");
}
