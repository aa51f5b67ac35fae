//! What a run is limited to: `--disk` (kernel-side: the block programs of a
//! run that names disks return at once for any other disk).
//!
//! Oracle: /proc/diskstats of each loop device the test makes.

mod common;

use common::*;

/// fio on two disks under `--disk` naming one: the named disk's reads are
/// counted as the kernel counts them, and no record names the other, whose
/// reads the kernel counted all the same.
#[test]
fn a_run_limited_to_one_disk_writes_only_that_disk_and_all_of_it() {
    require_root();
    let watched = LoopDevice::new(Backing::Tmpfs, 64, true);
    let other = LoopDevice::new(Backing::Tmpfs, 64, true);
    // By its /dev path: the name in the records is the kernel's.
    let tracer = Tracer::start(&[
        "--interval",
        "500ms",
        "--slow-io-ms",
        "0.02",
        "--disk",
        &watched.dev,
    ]);
    let engine = ["--ioengine=libaio", "--iodepth=4"];
    let (watched_before, other_before) = (watched.diskstats(), other.diskstats());
    let fio_watched = randread_4k(&watched.dev, &engine, 2);
    let fio_other = randread_4k(&other.dev, &engine, 2);
    let (watched_after, other_after) = (watched.diskstats(), other.diskstats());
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let records = tracer.stop();

    assert_eq!(
        records[0]["filters"]["disks"],
        serde_json::json!([format!("{}:{}", watched.major, watched.minor)])
    );
    let kernel = watched_after.reads_completed - watched_before.reads_completed;
    let counted = sum_field(&block_records(&records, &watched.name, "read"), "count");
    let other_kernel = other_after.reads_completed - other_before.reads_completed;
    eprintln!(
        "{}: {counted} reads recorded, diskstats {kernel}, fio {}; {}: diskstats {other_kernel}, fio {}",
        watched.name, fio_watched.ios, other.name, fio_other.ios
    );
    assert!(
        kernel > 1000 && other_kernel > 1000,
        "too little I/O to judge"
    );
    assert_eq!(
        counted, kernel,
        "reads of the named disk vs /proc/diskstats"
    );
    let named_other: Vec<_> = records
        .iter()
        .filter(|r| r["dev"] == other.name.as_str())
        .collect();
    assert!(
        named_other.is_empty(),
        "records of {}: {:?}",
        other.name,
        &named_other[..named_other.len().min(2)]
    );
    assert!(
        of_type(&records, "slow_io")
            .iter()
            .any(|r| r["dev"] == watched.name.as_str()),
        "no slow_io of {} at 20 µs",
        watched.name
    );
}

/// A `--disk` that names no disk is one line naming it and the fix, before
/// anything attaches.
#[test]
fn a_disk_that_does_not_exist_is_said_in_one_line() {
    require_root();
    let out = std::process::Command::new(&bins().stalltrace)
        .args(["run", "--duration", "1s", "--disk", "sdzz9"])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(said.trim_end().lines().count(), 1, "{said}");
    assert!(
        said.contains("--disk sdzz9: no such disk") && said.contains("lsblk"),
        "{said}"
    );
    assert!(out.stdout.is_empty());
}
