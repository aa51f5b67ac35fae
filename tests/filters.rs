//! What a run is limited to: `--disk` (kernel-side: the block programs of a
//! run that names disks return at once for any other disk) and `--pid` on
//! the block family (kernel-side: only the process's I/O sends slow_io; the
//! disk's histograms stay whole). `--pid` and `--container` on TCP and SQL
//! Server: tests/containers.rs.
//!
//! Oracles: /proc/diskstats of each loop device the test makes, and fio's
//! pid.

mod common;

use std::collections::BTreeMap;

use common::*;
use stalltrace_lab::fio::HeldFio;

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

/// Two fio processes on one disk, a run with `--pid` of one beside a run
/// with no filter: the limited run's slow_io all name that process, while
/// the other run has the other's too; its block counts are still the whole
/// disk's, as /proc/diskstats counts them.
#[test]
fn a_run_limited_to_one_process_has_only_its_slow_io_and_the_whole_disk() {
    require_root();
    let disk = LoopDevice::new(Backing::Tmpfs, 64, true);
    let (mut watched, mut other) = (
        HeldFio::new(&disk.dev, 2, false),
        HeldFio::new(&disk.dev, 2, false),
    );
    let (watched_pid, other_pid) = (u64::from(watched.pid()), u64::from(other.pid()));
    let common = [
        "--interval",
        "500ms",
        "--slow-io-ms",
        "0.02",
        "--disk",
        &disk.dev,
    ];
    let pid = watched_pid.to_string();
    let all = Tracer::start(&common);
    let limited = Tracer::start(&[&common[..], &["--pid", &pid]].concat());
    let before = disk.diskstats();
    watched.release();
    other.release();
    watched.wait().unwrap();
    other.wait().unwrap();
    let after = disk.diskstats();
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let (all, limited) = (all.stop(), limited.stop());

    assert_eq!(
        limited[0]["filters"]["pids"],
        serde_json::json!([watched_pid])
    );
    let slow_pids = |records: &[serde_json::Value]| -> BTreeMap<u64, usize> {
        let mut by_pid = BTreeMap::new();
        for r in of_type(records, "slow_io") {
            *by_pid.entry(r["pid"].as_u64().unwrap()).or_default() += 1;
        }
        by_pid
    };
    let (everyone, only) = (slow_pids(&all), slow_pids(&limited));
    eprintln!(
        "slow_io by submitter: all {everyone:?}, --pid {pid} {only:?}; fio pids {watched_pid} and {other_pid}"
    );
    assert!(
        everyone.get(&other_pid).is_some_and(|&n| n > 0)
            && only.get(&watched_pid).is_some_and(|&n| n > 0),
        "both processes must have slow I/O to judge: {everyone:?}, {only:?}"
    );
    assert_eq!(
        only.keys().collect::<Vec<_>>(),
        [&watched_pid],
        "slow_io of other processes"
    );
    let kernel = after.reads_completed - before.reads_completed;
    let counted = sum_field(&block_records(&limited, &disk.name, "read"), "count");
    eprintln!(
        "{}: {counted} reads recorded under --pid, diskstats {kernel}",
        disk.name
    );
    assert!(kernel > 1000, "too little I/O to judge");
    assert_eq!(
        counted, kernel,
        "the disk's reads under --pid vs /proc/diskstats"
    );
}
