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

use std::process::Command;

use common::netlab::{NetPair, Side, wait_listening_in};
use common::*;
use stalltrace_lab::fio::HeldFio;
use stalltrace_lab::scenario::ScratchDir;

/// fio on three disks under `--disk` naming two (the kernel side keeps the
/// named disks in places it compares one by one: both places are checked):
/// each named disk's reads are counted as the kernel counts them, and no
/// record names the third, whose reads the kernel counted all the same.
#[test]
fn a_run_limited_to_two_disks_writes_only_those_disks_and_all_of_them() {
    require_root();
    let watched = [
        LoopDevice::new(Backing::Tmpfs, 64, true),
        LoopDevice::new(Backing::Tmpfs, 64, true),
    ];
    let other = LoopDevice::new(Backing::Tmpfs, 64, true);
    // One by its /dev path, one as MAJOR:MINOR: the name in the records is the kernel's.
    let by_number = format!("{}:{}", watched[1].major, watched[1].minor);
    let tracer = Tracer::start(&[
        "--interval",
        "500ms",
        "--slow-io-ms",
        "0.02",
        "--disk",
        &watched[0].dev,
        "--disk",
        &by_number,
    ]);
    let engine = ["--ioengine=libaio", "--iodepth=4"];
    let before = [
        watched[0].diskstats(),
        watched[1].diskstats(),
        other.diskstats(),
    ];
    let fio_ios = [
        randread_4k(&watched[0].dev, &engine, 2).ios,
        randread_4k(&watched[1].dev, &engine, 2).ios,
        randread_4k(&other.dev, &engine, 2).ios,
    ];
    let after = [
        watched[0].diskstats(),
        watched[1].diskstats(),
        other.diskstats(),
    ];
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let records = tracer.stop();

    let mut named: Vec<String> =
        serde_json::from_value(records[0]["filters"]["disks"].clone()).unwrap();
    named.sort();
    let mut expected: Vec<String> = watched
        .iter()
        .map(|d| format!("{}:{}", d.major, d.minor))
        .collect();
    expected.sort();
    assert_eq!(named, expected, "the start record's disks");
    let kernel: Vec<u64> = (0..3)
        .map(|i| after[i].reads_completed - before[i].reads_completed)
        .collect();
    eprintln!("diskstats reads {kernel:?}, fio {fio_ios:?}");
    assert!(kernel.iter().all(|&k| k > 1000), "too little I/O to judge");
    for (i, disk) in watched.iter().enumerate() {
        let counted = sum_field(&block_records(&records, &disk.name, "read"), "count");
        assert_eq!(
            counted, kernel[i],
            "reads of the named disk {} vs /proc/diskstats",
            disk.name
        );
        assert!(
            of_type(&records, "slow_io")
                .iter()
                .any(|r| r["dev"] == disk.name.as_str()),
            "no slow_io of {} at 20 µs",
            disk.name
        );
    }
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

/// Two fio processes on one disk, runs limited by `--pid` and by `--comm`
/// to one of them beside a run with no filter: each limited run's slow_io
/// all name that process, while the other run has the other's too; their
/// block counts are still the whole disk's, as /proc/diskstats counts them.
#[test]
fn a_run_limited_to_one_process_has_only_its_slow_io_and_the_whole_disk() {
    require_root();
    let disk = LoopDevice::new(Backing::Tmpfs, 64, true);
    // The watched fio under a name of its own, for --comm.
    let dir = ScratchDir::new("/tmp");
    let named = dir.0.join("fio-watched");
    let fio = Command::new("sh")
        .args(["-c", "command -v fio"])
        .output()
        .unwrap();
    std::os::unix::fs::symlink(String::from_utf8(fio.stdout).unwrap().trim(), &named).unwrap();
    let (mut watched, mut other) = (
        HeldFio::new(named.to_str().unwrap(), &disk.dev, 2, false),
        HeldFio::new("fio", &disk.dev, 2, false),
    );
    let (watched_pid, other_pid) = (u64::from(watched.pid()), u64::from(other.pid()));
    // Every I/O slower than 5 µs: plenty of each process's, not too many to hold.
    let common = [
        "--interval",
        "500ms",
        "--slow-io-ms",
        "0.005",
        "--disk",
        &disk.dev,
    ];
    let pid = watched_pid.to_string();
    let all = Tracer::start(&common);
    let by_pid = Tracer::start(&[&common[..], &["--pid", &pid]].concat());
    let by_comm = Tracer::start(&[&common[..], &["--comm", "fio-watched"]].concat());
    let before = disk.diskstats();
    watched.release();
    other.release();
    watched.wait().unwrap();
    other.wait().unwrap();
    let after = disk.diskstats();
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let (all, by_pid, by_comm) = (all.stop(), by_pid.stop(), by_comm.stop());

    assert_eq!(
        by_pid[0]["filters"]["pids"],
        serde_json::json!([watched_pid])
    );
    assert_eq!(
        by_comm[0]["filters"]["comms"],
        serde_json::json!(["fio-watched"])
    );
    let slow_pids = |records: &[serde_json::Value]| -> BTreeMap<u64, usize> {
        let mut by_pid = BTreeMap::new();
        for r in of_type(records, "slow_io") {
            *by_pid.entry(r["pid"].as_u64().unwrap()).or_default() += 1;
        }
        by_pid
    };
    let everyone = slow_pids(&all);
    eprintln!(
        "slow_io by submitter, no filter: {everyone:?}; fio pids {watched_pid} (watched) and {other_pid}"
    );
    assert!(
        everyone.get(&other_pid).is_some_and(|&n| n > 0),
        "the other process must have slow I/O to judge: {everyone:?}"
    );
    let kernel = after.reads_completed - before.reads_completed;
    assert!(kernel > 1000, "too little I/O to judge");
    for (records, filter) in [(&by_pid, "--pid"), (&by_comm, "--comm")] {
        let only = slow_pids(records);
        let counted = sum_field(&block_records(records, &disk.name, "read"), "count");
        eprintln!("{filter}: slow_io {only:?}; {counted} reads recorded, diskstats {kernel}");
        assert!(
            only.get(&watched_pid).is_some_and(|&n| n > 0),
            "{filter}: no slow_io of its process"
        );
        assert_eq!(
            only.keys().collect::<Vec<_>>(),
            [&watched_pid],
            "{filter}: slow_io of other processes"
        );
        assert_eq!(
            counted, kernel,
            "{filter}: the disk's reads vs /proc/diskstats"
        );
    }
}

/// A listener older than the run, under `--pid` of its process: no call is
/// made on it once the run has started, yet its SYN-ACKs sent again (the
/// client's side drops them) are all the unlimited run's, and those of
/// another process's listener are absent.
#[test]
fn a_listener_older_than_the_run_is_watched_under_its_pid() {
    require_root();
    let pair = NetPair::new();
    let ports = [23401u16, 23402];
    let listen = |port: u16| {
        let code = format!(
            "import socket, time\ns = socket.socket()\ns.bind(('0.0.0.0', {port}))\ns.listen(8)\ntime.sleep(60)"
        );
        pair.spawn(Side::B, &["python3", "-c", &code])
    };
    let (mut watched, mut other) = (listen(ports[0]), listen(ports[1]));
    wait_listening_in(pair.netns(Side::B), ports[0], &mut watched);
    wait_listening_in(pair.netns(Side::B), ports[1], &mut other);
    let common = [
        "--interval",
        "500ms",
        "--slow-io-ms",
        "0",
        "--netns",
        pair.netns(Side::B),
    ];
    let pid = watched.pid().to_string();
    let all = Tracer::start(&common);
    let limited = Tracer::start(&[&common[..], &["--pid", &pid]].concat());
    for port in ports {
        pair.blackhole(Side::A, port);
    }
    let server = pair.v4(Side::B).to_string();
    let clients: Vec<_> = ports
        .iter()
        .map(|port| {
            let code = format!(
                "import socket\ntry:\n    socket.create_connection(('{server}', {port}), timeout=3.5)\nexcept OSError:\n    pass"
            );
            pair.spawn(Side::A, &["python3", "-c", &code])
        })
        .collect();
    for mut client in clients {
        client.wait_timeout(std::time::Duration::from_secs(10));
    }
    // The listeners closed, their half-open connections go with them: no
    // SYN-ACK is sent again between the two runs' ends.
    drop((watched, other));
    std::thread::sleep(std::time::Duration::from_millis(1200));
    let (all, limited) = (all.stop(), limited.stop());

    let netns = pair.netns_inode(Side::B);
    let synacks = |records: &[serde_json::Value]| -> BTreeMap<u64, usize> {
        let mut by_port = BTreeMap::new();
        for r in retransmits_in(records, netns)
            .into_iter()
            .filter(|r| r["kind"] == "syn")
        {
            *by_port.entry(r["sport"].as_u64().unwrap()).or_default() += 1;
        }
        by_port
    };
    let (everyone, only) = (synacks(&all), synacks(&limited));
    eprintln!("SYN-ACKs sent again by port: all {everyone:?}, --pid {pid} {only:?}");
    let at = |port: u16| everyone.get(&u64::from(port)).copied().unwrap_or(0);
    assert!(
        at(ports[0]) > 0 && at(ports[1]) > 0,
        "no SYN-ACK sent again: {everyone:?}"
    );
    assert_eq!(only, BTreeMap::from([(u64::from(ports[0]), at(ports[0]))]));
}
