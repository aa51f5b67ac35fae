//! `block/settle`: completions the kernel did not run the hook for, on a disk
//! that never idles, are each counted once and stop counting in flight
//! within an interval (block.bpf.c `run_settle_freed_requests`, run by the
//! daemon). The hook is made to skip every write (fault injection,
//! `STALLTRACE_FAULT_SKIP_COMPLETIONS=writes`); a burst of writes 16 deep
//! then leaves its last requests skipped, on tags reads one at a time never
//! take again, and the reads that follow must each count only themselves in
//! flight once the pass has run. tests/faults/skipped.rs on the host, with
//! the guest's slower pace: intervals of 1 s, a longer read phase.

use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::{Judge, Opts, Run};
use crate::{Buckets, DiskStats, block_records, sum_field};

pub fn skipped_completions(opts: &Opts, judge: &mut Judge) {
    let name = opts.disk.trim_start_matches("/dev/").to_string();
    let run = match Run::start_with_env(
        opts,
        &["--interval", "1s", "--slow-io-ms", "0"],
        &[],
        &[("STALLTRACE_FAULT_SKIP_COMPLETIONS", "writes")],
    ) {
        Ok(run) => run,
        Err(e) => return judge.fail(e),
    };
    if !judge.families_attached(&run.start, &["block"]) {
        return;
    }
    let pass_loaded = judge
        .hooks
        .get("settle_freed_requests")
        .is_some_and(|h| h["attached"] == true);
    if !judge.expect(pass_loaded, || {
        format!(
            "the settle pass did not load: {}",
            judge_hook_error(&run.start)
        )
    }) {
        return;
    }
    let before = DiskStats::read(&name);
    let deep = [
        &["--ioengine=libaio", "--iodepth=16"][..],
        &["--ioengine=psync", "--numjobs=16", "--group_reporting"][..],
    ];
    if let Err(e) = fio(&opts.disk, "randwrite", 2, &deep) {
        return judge.fail(e);
    }
    if let Err(e) = fio(&opts.disk, "randread", 6, &[&["--ioengine=psync"][..]]) {
        return judge.fail(e);
    }
    let after = DiskStats::read(&name);
    std::thread::sleep(Duration::from_millis(2500));
    let records = match run.stop() {
        Ok(r) => r,
        Err(e) => return judge.fail(e),
    };

    let reads = block_records(&records, &name, "read");
    let writes = block_records(&records, &name, "write");
    let (count, written) = (sum_field(&reads, "count"), sum_field(&writes, "count"));
    let kernel_reads = after.reads_completed - before.reads_completed;
    let kernel_writes = after.writes_completed - before.writes_completed;
    let skipped: u64 = records
        .iter()
        .filter(|r| r["type"] == "lost")
        .filter_map(|l| l["by_source"]["block.kernel_skipped"].as_u64())
        .sum();
    judge.note(format!(
        "stalltrace {written} writes and {count} reads, diskstats {kernel_writes} and \
         {kernel_reads}; {skipped} declared skipped"
    ));
    judge.expect(count == kernel_reads, || {
        format!("reads: count {count} != diskstats {kernel_reads}")
    });
    judge.expect(written == kernel_writes, || {
        format!("writes: count {written} != diskstats {kernel_writes}")
    });
    judge.expect(kernel_writes > 0 && skipped >= kernel_writes, || {
        format!("{skipped} skipped declared for {kernel_writes} writes skipped")
    });

    // The reads after the last interval that settled writes (the pass's,
    // counting the burst's last requests), and one more for margin.
    let last_write = writes
        .iter()
        .filter(|w| w["count"].as_u64() > Some(0))
        .filter_map(|w| w["ts"].as_str())
        .max()
        .unwrap_or("");
    let after_writes: Vec<&Value> = reads
        .iter()
        .copied()
        .filter(|r| r["ts"].as_str().unwrap_or("") > last_write)
        .filter(|r| r["count"].as_u64() > Some(0))
        .collect();
    let window = after_writes.get(1..).unwrap_or(&[]);
    if !judge.expect(window.len() >= 2, || {
        format!(
            "only {} read intervals after the writes were settled",
            window.len()
        )
    }) {
        return;
    }
    let inflight = Buckets::merge(window, "inflight");
    let timed = Buckets::merge(window, "device_us").count();
    let in_window = sum_field(window, "count");
    judge.note(format!(
        "{} read intervals after the writes settled: {in_window} reads, {timed} timed, in \
         flight {inflight:?}",
        window.len()
    ));
    // A completion the kernel itself skipped in the window leaves its request
    // counted until the next pass: then only the median is asked.
    if timed == in_window {
        judge.expect(inflight.max() == 1.0, || {
            format!("in flight above 1 at depth one: {inflight:?}")
        });
    } else {
        judge.expect(inflight.percentile(0.5) == 1.0, || {
            format!("in flight median above 1 at depth one: {inflight:?}")
        });
    }
    let last_now = reads.last().map(|r| r["inflight_now"].clone());
    judge.expect(last_now == Some(Value::from(0)), || {
        format!("inflight_now {last_now:?} at the end")
    });
}

/// Why the settle pass did not load, from the `start` record.
fn judge_hook_error(start: &Value) -> String {
    start["probes"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["hook"] == "settle_freed_requests")
        .map_or("not listed in start".into(), |p| p["error"].to_string())
}

/// fio `rw` of 4k direct I/O on `dev` for `secs`, with the first of `engines`
/// this fio has (the guest's may lack libaio).
fn fio(dev: &str, rw: &str, secs: u32, engines: &[&[&str]]) -> Result<(), String> {
    let mut errors = Vec::new();
    for engine in engines {
        let out = Command::new("fio")
            .args([
                "--name=kernel-checks",
                &format!("--filename={dev}"),
                "--thread",
                &format!("--rw={rw}"),
                "--bs=4k",
                "--direct=1",
                "--time_based",
                &format!("--runtime={secs}"),
            ])
            .args(*engine)
            .output()
            .map_err(|e| format!("cannot run fio: {e}"))?;
        if out.status.success() {
            return Ok(());
        }
        errors.push(format!(
            "fio {rw} {engine:?} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Err(errors.join("; "))
}
