//! End-to-end tests of the block family: each builds its own loop device, runs
//! the real `stalltrace` binary and fio, and compares what stalltrace reports
//! with fio's own figures and the kernel's /proc/diskstats for the same run.
//!
//! Run as root (`cargo xtask test`). nextest runs this binary's tests one at a
//! time (.config/nextest.toml): they measure latency, and two fio jobs on two
//! vCPUs would measure each other.

mod common;

use std::time::Duration;

use common::*;

/// stalltrace's interval in these tests; the last interval after the load ends shows it drained.
const INTERVAL: &str = "500ms";

fn settle() {
    // One full interval after the load, so the final records carry the drained state.
    std::thread::sleep(Duration::from_millis(1200));
}

#[test]
fn completed_requests_match_fio_and_diskstats() {
    require_root();
    let disk = LoopDevice::new(Backing::Disk, 256, true);
    disk.set_queue("scheduler", "none");
    let tracer = Tracer::start(&["--interval", INTERVAL, "--slow-io-ms", "0"]);
    let before = disk.diskstats();
    let fio = randread_4k(&disk.dev, &["--ioengine=libaio", "--iodepth=16"], 4);
    let after = disk.diskstats();
    settle();
    let records = tracer.stop();

    let reads = block_records(&records, &disk.name, "read");
    let count = sum_field(&reads, "count");
    let unseen = sum_field(&reads, "completions_unseen");
    let kernel = after.reads_completed - before.reads_completed;
    eprintln!(
        "stalltrace {count} reads + {unseen} completions unseen, fio {} I/Os, diskstats {kernel}",
        fio.ios
    );
    assert!(fio.ios > 1000, "fio did too little to compare: {fio:?}");
    let vs_fio = (count as f64 - fio.ios as f64).abs() / fio.ios as f64;
    let vs_kernel = (count as f64 - kernel as f64).abs() / kernel as f64;
    assert!(
        vs_fio <= 0.02,
        "count {count} vs fio {}: {:.2}% apart",
        fio.ios,
        vs_fio * 100.0
    );
    assert!(
        vs_kernel <= 0.01,
        "count {count} vs diskstats {kernel}: {:.2}% apart",
        vs_kernel * 100.0
    );
    // Every completion is accounted for: seen, or found out afterwards (see
    // `completions_unseen` in docs/records.md: some completions never reach
    // the BPF programs on this kernel).
    assert_eq!(
        count + unseen,
        kernel,
        "seen + unseen completions vs diskstats"
    );
    assert!(
        unseen as f64 <= 0.001 * kernel as f64,
        "{unseen} unseen completions is more than 0.1%"
    );
    // 4k random reads do not merge: every bio is its own request.
    assert_eq!(sum_field(&reads, "bios"), count);
    // Every interval's histograms hold exactly that interval's requests.
    assert_eq!(Buckets::merge(&reads, "device_us").count(), count);

    // In flight returns to exactly zero, as the kernel's own counter does.
    let last = reads.last().unwrap();
    assert_eq!(last["inflight_now"], 0, "{last}");
    assert_eq!(
        last["count"], 0,
        "the last record should be the drained interval: {last}"
    );
    assert_eq!(disk.kernel_inflight(), (0, 0));
    assert!(
        of_type(&records, "lost").is_empty(),
        "lost events: {:?}",
        of_type(&records, "lost")
    );
}

#[test]
fn latency_agrees_with_fio_where_the_device_dominates() {
    require_root();
    // Disk-backed, direct I/O, one at a time: the device time is most of what fio sees.
    let disk = LoopDevice::new(Backing::Disk, 512, true);
    disk.set_queue("scheduler", "none");
    let tracer = Tracer::start(&["--interval", INTERVAL, "--slow-io-ms", "0"]);
    let fio = randread_4k(&disk.dev, &["--ioengine=psync", "--iodepth=1"], 4);
    settle();
    let records = tracer.stop();
    let reads = block_records(&records, &disk.name, "read");

    let latency = Buckets::merge(&reads, "latency_us");
    let device = Buckets::merge(&reads, "device_us");
    let inflight = Buckets::merge(&reads, "inflight");
    let (p50, p99) = (latency.percentile(0.50), latency.percentile(0.99));
    eprintln!(
        "stalltrace p50 {p50:.1} p99 {p99:.1} us (device p50 {:.1}); fio clat p50 {:.1} p99 {:.1} us",
        device.percentile(0.5),
        fio.clat_p50_us,
        fio.clat_p99_us
    );
    // Precondition: the device dominates the block layer's time.
    assert!(
        device.percentile(0.5) >= 0.7 * p50,
        "device is not dominant; the comparison would be meaningless"
    );

    // Never above fio beyond the histogram's error: the kernel's bio submit->complete
    // lies strictly inside fio's submit->reap.
    let limit = 1.0 + HIST_BUCKET_ERROR;
    assert!(
        p50 <= fio.clat_p50_us * limit,
        "p50 {p50} above fio {}",
        fio.clat_p50_us
    );
    assert!(
        p99 <= fio.clat_p99_us * limit,
        "p99 {p99} above fio {}",
        fio.clat_p99_us
    );
    // And close to it. At the median, what fio adds is a syscall, a context
    // switch and a wakeup (10-20 us in this VM) on top of a ~60 us device time:
    // beyond 40% below fio, stalltrace would be missing time. fio's tail also
    // carries the scheduling delays of its own thread on a shared 2-vCPU VM
    // (measured: up to ~2x the I/O time at p99 when other work runs), so the
    // p99 bound is looser; the device-dominance check above and the p50 bound
    // are what catch a tracer that misses part of each I/O.
    assert!(
        p50 >= fio.clat_p50_us * 0.60,
        "p50 {p50} too far below fio {}",
        fio.clat_p50_us
    );
    assert!(
        p99 >= fio.clat_p99_us * 0.30,
        "p99 {p99} too far below fio {}",
        fio.clat_p99_us
    );

    // One I/O at a time: one in flight at every issue. Exception: a completion
    // the hooks never saw (`completions_unseen`, see docs/records.md) leaves its
    // request counted until that request is issued again, and the issues in
    // between see one more; the test then only asks for the median.
    let count = sum_field(&reads, "count");
    let unseen = sum_field(&reads, "completions_unseen");
    eprintln!(
        "{count} reads traced + {unseen} unseen, fio did {}; in flight {inflight:?}",
        fio.ios
    );
    assert_eq!(inflight.percentile(0.5), 1.0);
    if unseen == 0 {
        assert_eq!(inflight.max(), 1.0, "in flight {inflight:?}");
    }
    assert_eq!(reads.last().unwrap()["inflight_now"], 0);
}

/// Phase histograms of one run of 16 threads doing synchronous 4k direct reads.
struct QueueRun {
    inflight: Buckets,
    tag_wait: Buckets,
    device: Buckets,
    latency: Buckets,
    queue: Buckets,
    fio: Fio,
    limit_reported: Vec<u64>,
}

fn sixteen_deep(disk: &LoopDevice) -> QueueRun {
    let tracer = Tracer::start(&["--interval", INTERVAL, "--slow-io-ms", "0"]);
    // 16 threads with one synchronous I/O each keep 16 I/Os in the block layer at
    // once. (One libaio job at iodepth 32 does not on this 2-vCPU VM: fio's own
    // submit/reap loop holds most of its 32 I/Os in user space or in the
    // completion ring, and its clat counts that time as well.)
    let fio = randread_4k(
        &disk.dev,
        &["--ioengine=psync", "--numjobs=16", "--group_reporting"],
        3,
    );
    settle();
    let records = tracer.stop();
    let reads = block_records(&records, &disk.name, "read");
    assert_eq!(reads.last().unwrap()["inflight_now"], 0);
    assert_eq!(disk.kernel_inflight(), (0, 0));
    QueueRun {
        inflight: Buckets::merge(&reads, "inflight"),
        tag_wait: Buckets::merge(&reads, "tag_wait_us"),
        device: Buckets::merge(&reads, "device_us"),
        latency: Buckets::merge(&reads, "latency_us"),
        queue: Buckets::merge(&reads, "queue_us"),
        fio,
        limit_reported: reads
            .iter()
            .map(|r| r["queue_limit"]["nr_requests"].as_u64().unwrap())
            .collect(),
    }
}

#[test]
fn a_shallow_queue_shows_as_tag_wait_not_device_time() {
    require_root();
    let disk = LoopDevice::new(Backing::Disk, 256, true);
    disk.set_queue("scheduler", "none");
    disk.set_queue("nr_requests", "128");
    let deep = sixteen_deep(&disk);
    disk.set_queue("nr_requests", "4");
    let shallow = sixteen_deep(&disk);

    for (name, run) in [("nr_requests 128", &deep), ("nr_requests 4", &shallow)] {
        eprintln!(
            "{name}: in flight p50 {} max {}; tag wait mean {:.1} us; queue mean {:.1}; device mean {:.1}; \
             total mean {:.1} us; fio clat mean {:.1} us",
            run.inflight.percentile(0.5),
            run.inflight.max(),
            run.tag_wait.mean(),
            run.queue.mean(),
            run.device.mean(),
            run.latency.mean(),
            run.fio.clat_mean_us
        );
        // The phases tile the total (means add exactly when every bio allocated its request).
        let parts = run.tag_wait.mean() + run.queue.mean() + run.device.mean();
        assert!(
            (parts - run.latency.mean()).abs() <= 0.05 * run.latency.mean(),
            "{name}: phases do not add up"
        );
        // The kernel's view sits inside fio's.
        assert!(run.latency.mean() <= run.fio.clat_mean_us, "{name}");
    }
    assert!(deep.limit_reported.iter().all(|&n| n == 128));
    assert!(
        shallow.limit_reported.iter().all(|&n| n == 4),
        "queue limit not reported: {:?}",
        shallow.limit_reported
    );

    // The limit, and nothing else, bounds the device's depth (small counts have exact buckets).
    assert!(
        deep.inflight.max() > 4.0,
        "without the limit more than 4 should be in flight"
    );
    assert!(
        shallow.inflight.max() <= 4.0,
        "in flight {} exceeds nr_requests 4",
        shallow.inflight.max()
    );
    // With 4 tags for 16 I/Os the waiting moves in front of the device: tag wait
    // becomes the largest phase, several device times long...
    assert!(
        shallow.tag_wait.mean() >= 2.0 * shallow.device.mean(),
        "tag wait should carry the waiting"
    );
    // ...while with room for all 16 there is next to none.
    assert!(
        deep.tag_wait.mean() < 0.2 * deep.device.mean(),
        "unexpected tag wait with a deep queue"
    );
}

#[test]
fn slow_io_records_name_the_submitter_and_agree_with_the_histogram() {
    require_root();
    let disk = LoopDevice::new(Backing::Disk, 256, true);
    disk.set_queue("scheduler", "none");
    disk.set_queue("nr_requests", "4");
    // With 4 tags for 32 I/Os most I/Os wait several device times; 0.2 ms splits them.
    let threshold_ms = 0.2;
    let tracer = Tracer::start(&[
        "--interval",
        INTERVAL,
        "--slow-io-ms",
        &threshold_ms.to_string(),
    ]);
    let child = std::process::Command::new("fio")
        .args([
            "--name=slow",
            &format!("--filename={}", disk.dev),
            "--thread",
            "--rw=randread",
            "--bs=4k",
            "--direct=1",
            "--ioengine=libaio",
            "--iodepth=32",
            "--runtime=3",
            "--time_based",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let fio_pid = child.id();
    let status = child.wait_with_output().unwrap().status;
    assert!(status.success());
    settle();
    let records = tracer.stop();

    let slow: Vec<_> = of_type(&records, "slow_io")
        .into_iter()
        .filter(|r| r["dev"] == disk.name)
        .collect();
    assert!(!slow.is_empty(), "no slow_io records");
    for r in &slow {
        assert_eq!(r["pid"], fio_pid, "{r}");
        assert_eq!(r["comm"], "fio", "{r}");
        assert_eq!(r["op"], "read");
        assert_eq!(r["major"], disk.major);
        assert_eq!(r["minor"], disk.minor);
        assert!(
            r["latency_us"].as_f64().unwrap() >= threshold_ms * 1000.0,
            "{r}"
        );
        let parts = r["tag_wait_us"].as_f64().unwrap()
            + r["queue_us"].as_f64().unwrap_or(0.0)
            + r["device_us"].as_f64().unwrap();
        // The phases tile the latency (up to the few ns between hooks).
        assert!(
            (parts - r["latency_us"].as_f64().unwrap()).abs() <= 5.0,
            "phases do not add up: {r}"
        );
    }
    // The same I/Os counted twice: as events, and in the latency histogram.
    let reads = block_records(&records, &disk.name, "read");
    let (surely, maybe) =
        Buckets::merge(&reads, "latency_us").count_at_least(threshold_ms * 1000.0);
    eprintln!(
        "{} slow_io records; histogram: {surely}..{maybe} at or above {threshold_ms} ms",
        slow.len()
    );
    assert!(
        (surely..=maybe).contains(&(slow.len() as u64)),
        "{} slow_io records, histogram says {surely}..{maybe}",
        slow.len()
    );
}

#[test]
fn raw_tp_fallback_measures_the_same() {
    require_root();
    let disk = LoopDevice::new(Backing::Disk, 256, true);
    disk.set_queue("scheduler", "none");
    let tracer = Tracer::start(&[
        "--interval",
        INTERVAL,
        "--slow-io-ms",
        "0",
        "--probe-mode",
        "raw-tp",
    ]);
    let fio = randread_4k(&disk.dev, &["--ioengine=libaio", "--iodepth=8"], 2);
    settle();
    let records = tracer.stop();
    let start = &of_type(&records, "start")[0];
    assert_eq!(start["families"][0]["mode"], "raw_tp", "{start}");
    let count = sum_field(&block_records(&records, &disk.name, "read"), "count");
    let off = (count as f64 - fio.ios as f64).abs() / fio.ios as f64;
    assert!(off <= 0.02, "raw_tp count {count} vs fio {}", fio.ios);
}
