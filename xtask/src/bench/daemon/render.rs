//! The daemon suite's section of docs/BENCHMARKS.md, from its results.

use std::fmt::Write;

use super::{DaemonResults, FILE_MIB, Summary, table};

pub fn markdown(r: &DaemonResults) -> String {
    let mut s = String::new();
    let h = &r.host;
    let med = |x: &Summary, d: usize| format!("{:.d$} ({:.d$}–{:.d$})", x.median, x.min, x.max);
    let _ = writeln!(
        s,
        "## daemon: the stalltrace process (CPU, memory, start-up, lost events)\n\n\
         {}\n\
         - Command: `{}` (this suite took {:.0} s)\n\
         - Workload: `{}` on a loop device over {FILE_MIB} MiB of random data on a private tmpfs\n\
         - Deployed: `{}`; every I/O slow: `{}` (`--slow-io-ms 0` would turn slow_io off, \
         not on for every I/O)\n\
         - Order: each of {} rounds starts the deployed daemon, runs fio, stops it; then the same \
         with every I/O slow; figures are medians over rounds (min–max)\n",
        h.line(),
        r.command,
        r.wall_time_s,
        r.fio,
        r.deployed_command,
        r.every_io_slow_command,
        r.rounds,
    );
    s += "### Targets\n\n";
    s += &table::markdown(
        &["target", "measured", "verdict", "detail"],
        &r.targets
            .iter()
            .map(|v| {
                vec![
                    v.target.clone(),
                    v.measured.clone(),
                    if v.met {
                        "**met**".into()
                    } else {
                        "**missed**".into()
                    },
                    v.detail.clone(),
                ]
            })
            .collect::<Vec<_>>(),
    );
    s += "\n### Start-up, CPU and memory (deployed)\n\n";
    s += &table::markdown(
        &["figure", "median (min–max)"],
        &[
            vec![
                "launch → `start` record (loaded, verified, attached), ms".into(),
                med(&r.start_record_ms, 0),
            ],
            vec![
                "launch → first `block` record (first data; --interval 1s), ms".into(),
                r.first_block_record_ms
                    .as_ref()
                    .map_or("none came".into(), |x| med(x, 0)),
            ],
            vec![
                "CPU (user+sys) while fio ran, % of one CPU".into(),
                med(&r.cpu_pct_of_one_cpu, 2),
            ],
            vec![
                "CPU s over its life (load, attach, run, detach)".into(),
                med(&r.lifetime_cpu_s, 2),
            ],
            vec!["peak RSS (VmHWM), MiB".into(), med(&r.peak_rss_mib, 1)],
            vec!["fio IOPS meanwhile".into(), med(&r.fio_iops, 0)],
            vec![
                "every I/O slow: CPU while fio ran, % of one CPU".into(),
                med(&r.burst_cpu_pct_of_one_cpu, 2),
            ],
            vec![
                "every I/O slow: peak RSS, MiB".into(),
                med(&r.burst_peak_rss_mib, 1),
            ],
            vec!["every I/O slow: fio IOPS".into(), med(&r.burst_fio_iops, 0)],
        ],
    );
    s += "\n### Ring-buffer overflow: every event delivered or counted\n\n";
    let rows: Vec<Vec<String>> = r
        .burst
        .iter()
        .enumerate()
        .map(|(i, b)| {
            vec![
                (i + 1).to_string(),
                format!("{:.0}", b.fio.iops),
                b.completed_all_disks.to_string(),
                b.completed_loop.to_string(),
                b.slow_io_records.to_string(),
                b.slow_io_records_loop.to_string(),
                b.lost_ringbuf_full.to_string(),
                b.completions_unseen.to_string(),
                b.kernel_skipped.to_string(),
                format!("{:+}", b.difference),
                if b.lost_other.is_empty() {
                    "–".into()
                } else {
                    b.lost_other
                        .iter()
                        .map(|(k, v)| format!("{k} {v}"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
            ]
        })
        .collect();
    s += &table::markdown(
        &[
            "round",
            "fio IOPS",
            "completed, all disks",
            "completed, loop",
            "slow_io records",
            "of which loop",
            "lost (slow_io_ringbuf_full)",
            "completions unseen",
            "kernel skipped",
            "records + lost + unseen + skipped − completed",
            "other lost",
        ],
        &rows,
    );
    s += "\n### Notes\n\n";
    s += "- The oracle: the kernel's own completion counters (/proc/diskstats: reads, writes \
          and discards completed, every whole disk, since `lost` is not per device; not \
          flushes, which the block layer sends without a bio, so never as a slow_io event), \
          read just after the `start` record and just before SIGINT. The daemon drains the \
          ring buffer and writes the `stop` record (whose `lost` is the run's total) after \
          SIGINT. A request already in flight when the programs attached is not tracked (no \
          event, no loss) but may complete inside the window; I/O on the VM's own disk in \
          the moments between attach and the first read, or between the last read and \
          detach, is seen by one side only. Both are a handful of requests at most; a \
          difference in the thousands would be events neither delivered nor counted. \
          \"Completions unseen\" are requests whose completion never reached the hooks (about \
          1 in 10,000 on this kernel; the daemon finds them afterwards and says so in the \
          `block` records' `completions_unseen`), and completions the kernel ran no hook \
          for (`block.kernel_skipped` in the `stop` record's `lost`: process 1's context on \
          this VM's kernel, docs/records.md): no slow_io event can exist for either, so \
          they are on the books' delivered side.\n";
    s += "- Start-up: from spawning the process to its `start` record in the output file \
          (polled every 20 ms), and to its first `block` record (written at the end of the \
          first 1 s interval with I/O), while fio starts right after the `start` record.\n";
    s += "- CPU is user + system time of every thread of the daemon (/proc/PID/stat) over fio's \
          run, in % of one CPU; peak RSS is VmHWM.\n";
    for w in &r.warnings {
        let _ = writeln!(s, "- Warning: {w}.");
    }
    s
}
