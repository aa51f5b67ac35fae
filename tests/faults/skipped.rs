//! Completions the kernel does not run the hook for, on a disk that never
//! idles: each is still counted once, and its request stops being counted
//! in flight within an interval (block.bpf.c `run_settle_freed_requests`),
//! not only when the same request happens to be issued again.

use std::time::{Duration, SystemTime};

// Through faults.rs, whatever the lab's module path is there.
use super::*;
use stalltrace_lab::{Backing, Buckets, LoopDevice, block_records, randread_4k, sh, sum_field};

/// The daemon's interval here.
const INTERVAL_MS: u64 = 500;

/// The completion hook skips every write (fault injection, block/mod.rs),
/// as the kernel skips it for a completion landing where it runs no tracing
/// program. A burst of writes 16 deep ends with its last requests' completions
/// skipped, on tags a queue one deep never takes again (blk-mq hands out the
/// first free tag of a bitmap word), so they would stay counted in flight for
/// as long as the disk is busy at depth one. After the burst, fio keeps one
/// read in flight for 4 s: from the settle pass after the burst (an interval,
/// plus the pass's 100 ms), every read's issue must count itself alone in
/// flight.
#[test]
fn skipped_completions_of_a_burst_stop_counting_in_flight_while_the_disk_stays_busy() {
    require_root();
    let disk = LoopDevice::new(Backing::Tmpfs, 256, true);
    disk.set_queue("scheduler", "none");
    let tracer = Tracer::start_with_env(
        &[
            "--interval",
            &format!("{INTERVAL_MS}ms"),
            "--slow-io-ms",
            "0",
        ],
        &[("STALLTRACE_FAULT_SKIP_COMPLETIONS", "writes")],
    );
    let before = disk.diskstats();
    sh(
        "fio",
        &[
            "--name=stalltrace-test",
            &format!("--filename={}", disk.dev),
            "--rw=randwrite",
            "--bs=4k",
            "--direct=1",
            "--time_based",
            "--runtime=1",
            "--ioengine=libaio",
            "--iodepth=16",
        ],
    );
    let burst_end = SystemTime::now();
    let single = randread_4k(&disk.dev, &["--ioengine=psync", "--iodepth=1"], 4);
    let single_end = SystemTime::now();
    let after = disk.diskstats();
    std::thread::sleep(Duration::from_millis(3 * INTERVAL_MS));
    let records = tracer.stop();

    let reads = block_records(&records, &disk.name, "read");
    let writes = block_records(&records, &disk.name, "write");
    let kernel = after.reads_completed - before.reads_completed;
    let kernel_writes = after.writes_completed - before.writes_completed;
    let count = sum_field(&reads, "count");
    let written = sum_field(&writes, "count");
    let skipped: u64 = of_type(&records, "lost")
        .iter()
        .filter_map(|l| l["by_source"]["block.kernel_skipped"].as_u64())
        .sum();
    eprintln!(
        "a burst of writes, then {} reads one at a time; stalltrace {written} writes, {count} \
         reads, diskstats {kernel_writes} and {kernel}, {skipped} declared skipped",
        single.ios
    );
    // Every completion counted once, the skipped ones when settled.
    assert_eq!(count, kernel, "stalltrace's reads vs diskstats");
    assert_eq!(written, kernel_writes, "stalltrace's writes vs diskstats");
    assert!(
        skipped >= kernel_writes,
        "{skipped} skipped completions declared for {kernel_writes} writes skipped"
    );

    // The one-deep part, from two intervals after the burst: every issue's
    // in-flight count is itself alone.
    let settled_by = burst_end + Duration::from_millis(2 * INTERVAL_MS + 100);
    let window: Vec<&Value> = reads
        .iter()
        .copied()
        .filter(|r| ts_of(r) >= settled_by + Duration::from_millis(INTERVAL_MS))
        .filter(|r| ts_of(r) <= single_end)
        .collect();
    assert!(
        window.len() >= 3,
        "only {} records in the one-deep window",
        window.len()
    );
    let inflight = Buckets::merge(&window, "inflight");
    // Skips the kernel made itself in the window are counted when settled: up
    // to a pass later.
    let start = settled_by + Duration::from_millis(INTERVAL_MS);
    let until = single_end + Duration::from_millis(3 * INTERVAL_MS);
    let around: Vec<&Value> = reads
        .iter()
        .copied()
        .filter(|r| ts_of(r) >= start && ts_of(r) <= until)
        .collect();
    let timed = Buckets::merge(&around, "device_us").count();
    let in_window = sum_field(&around, "count");
    eprintln!(
        "one-deep window: {} records, in flight {inflight:?}; with the next records {in_window} reads, {timed} timed",
        window.len()
    );
    // A completion the kernel itself skipped meanwhile (this VM's kernel skips
    // those landing on PID 1) is held until its request is issued again or the
    // next pass; only then is the median all that can be asked.
    if timed == in_window {
        assert_eq!(inflight.max(), 1.0, "in flight {inflight:?}");
    } else {
        assert_eq!(inflight.percentile(0.5), 1.0, "in flight {inflight:?}");
    }
    assert_eq!(reads.last().unwrap()["inflight_now"], 0);
}
