//! Checks of the tracer's own life on a kernel rather than of a measurement:
//!
//! - `cli/attach-loop`: attach and detach every family again and again while
//!   the disk is busy. A 6.1 guest twice soft-locked right after attaching
//!   under I/O (at `block_bio_queue`'s patched jump) under multi-threaded TCG;
//!   a real lockup in the kernel would show here as a guest that stops
//!   answering (the host's wall-clock limit and console scan catch it) or as a
//!   run that does not end.
//! - `cli/lockdown`: with `lockdown=confidentiality` on the kernel command
//!   line (the host boots one guest so), `stalltrace run` refuses with one
//!   line naming the lockdown and the fix, exits 1, and leaves nothing loaded.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::{Judge, Opts, Run};

/// Attach/detach cycles under I/O. Two: each is a full load, verify and
/// attach of every family, about 10 s under TCG (6.12, 2026-12-03; 25 to
/// 50 s before the block walk's global function, docs/BENCHMARKS.md
/// "Loading"), and the matrix's time is most of CI's.
const CYCLES: u32 = 2;

pub fn attach_loop(opts: &Opts, judge: &mut Judge) {
    let fio = match Command::new("fio")
        .args([
            "--name=attach-loop",
            &format!("--filename={}", opts.disk),
            "--rw=randread",
            "--bs=4k",
            "--direct=1",
            "--ioengine=psync",
            "--numjobs=2",
            "--thread", // jobs as threads: killing fio ends them all
            "--time_based",
            "--runtime=600",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
    {
        Ok(child) => KillOnDrop(child),
        Err(e) => return judge.fail(format!("cannot run fio: {e}")),
    };
    let mut cycle_secs = Vec::new();
    for cycle in 0..CYCLES {
        let t0 = Instant::now();
        let run = match Run::start(opts, &[]) {
            Ok(run) => run,
            Err(e) => {
                judge.fail(format!("cycle {cycle}: {e}"));
                break;
            }
        };
        // Every family the run lists (`cli/check` holds the list to `check`'s).
        let families = listed_families(&run.start);
        if families.is_empty() {
            judge.fail(format!("cycle {cycle}: `start` lists no family"));
            break;
        }
        if !judge.families_attached(&run.start, &families) {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
        if let Err(e) = run.stop() {
            judge.fail(format!("cycle {cycle}: {e}"));
            break;
        }
        cycle_secs.push(format!("{:.1}", t0.elapsed().as_secs_f64()));
    }
    drop(fio);
    judge.note(format!(
        "{} of {CYCLES} attach/detach cycles under fio (s each: {})",
        cycle_secs.len(),
        cycle_secs.join(" ")
    ));
    // The kernel frees a program after a grace period once its last fd (and
    // the private bpffs mount holding its maps) is gone, later under TCG; a
    // program still loaded after UNLOAD_WITHIN is a leak.
    let exited = Instant::now();
    while programs_loaded() != Some(0) && exited.elapsed() < UNLOAD_WITHIN {
        std::thread::sleep(Duration::from_millis(100));
    }
    judge.note(format!(
        "programs gone {} ms after the last exit",
        exited.elapsed().as_millis()
    ));
    judge.expect(programs_loaded() == Some(0), || {
        format!(
            "{:?} stalltrace programs still loaded {} s after the last detach",
            programs_loaded(),
            UNLOAD_WITHIN.as_secs()
        )
    });
}

/// How long the kernel may take to free a detached run's programs.
const UNLOAD_WITHIN: Duration = Duration::from_secs(10);

pub fn lockdown(opts: &Opts, judge: &mut Judge) {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if !judge.expect(cmdline.contains("lockdown=confidentiality"), || {
        format!(
            "the guest was not booted with lockdown=confidentiality: `{}`",
            cmdline.trim()
        )
    }) {
        return;
    }
    let out = Command::new(&opts.bins.stalltrace)
        .args(["run", "--duration", "1s"])
        .args(opts.mode.flags())
        .stdin(Stdio::null())
        .output();
    let out = match out {
        Ok(out) => out,
        Err(e) => return judge.fail(format!("cannot run stalltrace: {e}")),
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    judge.note(format!(
        "exit {:?}; stderr: {}",
        out.status.code(),
        lines.join(" / ")
    ));
    judge.expect(out.status.code() == Some(1), || "exit code is not 1".into());
    judge.expect(lines.len() == 1, || {
        format!("{} stderr lines, not one", lines.len())
    });
    judge.expect(
        stderr.contains("lockdown") && stderr.contains("confidentiality"),
        || "the line does not name the lockdown".into(),
    );
    judge.expect(out.stdout.is_empty(), || "records were written".into());
    judge.expect(programs_loaded() == Some(0), || {
        format!(
            "{:?} stalltrace programs loaded after the refusal",
            programs_loaded()
        )
    });
}

/// Programs of stalltrace's (names `on_*`/`maybe_*`, cut to 15 characters by
/// the kernel) that the kernel holds, from bpftool; None without bpftool.
/// The families a `start` record lists.
fn listed_families(start: &serde_json::Value) -> Vec<&str> {
    start["families"]
        .as_array()
        .map(|fs| fs.iter().filter_map(|f| f["family"].as_str()).collect())
        .unwrap_or_default()
}

fn programs_loaded() -> Option<usize> {
    let out = Command::new("bpftool")
        .args(["prog", "show"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    Some(
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains(" name on_") || l.contains(" name maybe_"))
            .count(),
    )
}

/// A background load that ends with its check, also when the check panics.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
