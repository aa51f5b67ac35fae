//! What the tracer does when its output cannot keep up or fails: a reader
//! that stops reading never keeps it running or attached, a slow one costs
//! records that the stream counts (and `seqno` shows), and a failed output
//! ends the run with one line. Each test runs the real binary with its stdout
//! a small pipe the test controls.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

/// A pipe whose buffer is one page (the kernel's minimum), so a test fills it
/// with a few records instead of 64 KiB of them.
fn small_pipe() -> (File, OwnedFd) {
    let mut fds = [0; 2];
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    let (read, write) = unsafe { (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as libc::c_int;
    assert!(unsafe { libc::fcntl(fds[1], libc::F_SETPIPE_SZ, page) } >= page);
    (read, write)
}

/// `stalltrace run <args>` writing to `stdout`; killed on drop.
struct Run {
    child: Child,
    stderr: std::path::PathBuf,
}

impl Run {
    fn start(args: &[&str], stdout: Stdio) -> Self {
        let stderr = std::env::temp_dir().join(format!("{}.stderr", unique("stalltrace-output")));
        let child = stalltrace_lab::die_with_parent(&mut Command::new(stalltrace_bin()))
            .arg("run")
            .args(args)
            .stdout(stdout)
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        Self { child, stderr }
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Wait for the exit (at most `limit`): its status and how long it took.
    fn wait(&mut self, limit: Duration) -> (std::process::ExitStatus, Duration) {
        let started = Instant::now();
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, started.elapsed());
            }
            assert!(
                started.elapsed() < limit,
                "still running {limit:?} later: {}",
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.stderr);
    }
}

/// The `start` record: the first line the run writes.
fn read_start(reader: &mut BufReader<File>) -> Value {
    let mut line = String::new();
    reader.read_line(&mut line).unwrap();
    let start: Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
    assert_eq!(start["type"], "start", "{start}");
    start
}

fn program_ids(start: &Value) -> Vec<u64> {
    start["probes"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|p| p["program_id"].as_u64())
        .collect()
}

/// The run's programs must be gone (the kernel frees them an RCU grace
/// period after their last fd closes).
fn assert_unloaded(ids: &[u64]) {
    assert!(!ids.is_empty());
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let loaded: Vec<u64> = stalltrace_lab::kernel_objects::programs()
            .into_iter()
            .map(|p| p.id)
            .filter(|id| ids.contains(id))
            .collect();
        if loaded.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still loaded 5 s after exit: {loaded:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// What a run whose output took nothing at the end says (once, on stderr),
/// and that it left no program loaded.
fn said_unwritten_and_unloaded(run: &Run, start: &Value) {
    let stderr = run.stderr();
    assert!(
        stderr.contains("the output took nothing") && stderr.contains("not written"),
        "{stderr}"
    );
    assert_unloaded(&program_ids(start));
}

/// A run whose stdout is a one-page pipe and every read a `slow_io` record,
/// after 2 s of fio on its own disk while nobody read: the pipe and the
/// 64 KiB queue are full, its writer thread blocked in write(2). Returns the
/// disk, the run, the pipe's reader (past `start`) and `start`.
fn flooded(args: &[&str]) -> (LoopDevice, Run, BufReader<File>, Value) {
    require_root();
    let disk = LoopDevice::new(Backing::Tmpfs, 64, false);
    let (read, write) = small_pipe();
    let mut all = vec!["--slow-io-ms", "0.001", "--out-buffer-kib", "64"];
    all.extend_from_slice(args);
    let run = Run::start(&all, Stdio::from(write));
    let mut reader = BufReader::new(read);
    let start = read_start(&mut reader);
    let fio = randread_4k(&disk.dev, &["--ioengine=psync"], 2);
    assert!(fio.ios > 1000, "{fio:?}");
    (disk, run, reader, start)
}

#[test]
fn sigterm_ends_the_run_within_2s_while_nobody_reads_stdout() {
    let (_disk, mut run, reader, start) = flooded(&["--interval", "100ms"]);
    let signalled = Instant::now();
    unsafe { libc::kill(run.child.id() as i32, libc::SIGTERM) };
    let (status, took) = run.wait(Duration::from_secs(30));
    eprintln!(
        "SIGTERM to exit with a stuck stdout: {} ms",
        took.as_millis()
    );
    assert!(status.success(), "{status}: {}", run.stderr());
    assert!(
        signalled.elapsed() < Duration::from_secs(2),
        "SIGTERM to exit took {took:?}"
    );
    said_unwritten_and_unloaded(&run, &start);
    drop(reader);
}

#[test]
fn a_run_that_ends_while_nobody_reads_does_not_wait_for_the_reader() {
    // --duration ends it while the queue is full and the reader stuck: the
    // stop record must not wait for room that never comes.
    let (_disk, mut run, reader, start) = flooded(&["--interval", "100ms", "--duration", "3s"]);
    let (status, took) = run.wait(Duration::from_secs(30));
    eprintln!(
        "exit {} ms after fio, with the reader stuck",
        took.as_millis()
    );
    assert!(status.success(), "{status}: {}", run.stderr());
    said_unwritten_and_unloaded(&run, &start);
    drop(reader);
}

#[test]
fn a_slow_reader_costs_records_that_the_stream_counts() {
    // Nobody reads while fio runs; then the reader catches up to the end.
    let (_disk, _run, mut reader, _) = flooded(&["--interval", "200ms", "--duration", "6s"]);
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    // Whole lines only, each valid: dropping never cuts a record.
    let records = parse_records(&rest);

    // The oracle: gaps in seqno, counted by this test, against what the
    // stream says it dropped.
    let seqnos: Vec<u64> = records
        .iter()
        .map(|r| r["seqno"].as_u64().unwrap())
        .collect();
    assert!(seqnos.windows(2).all(|w| w[0] < w[1]), "seqno out of order");
    let made = seqnos.last().unwrap() + 1;
    let gaps = made - 1 - seqnos.len() as u64; // the start record was read apart
    let reported: u64 = of_type(&records, "lost")
        .iter()
        .filter_map(|l| l["by_source"]["output.queue_full"].as_u64())
        .sum();
    let stop = of_type(&records, "stop");
    assert_eq!(stop.len(), 1, "the reader caught up: stop is written");
    let total = stop[0]["lost"]["output.queue_full"].as_u64().unwrap_or(0);
    eprintln!(
        "{made} records made, {gaps} dropped (seqno gaps); lost says {reported}, stop says {total}"
    );
    assert!(
        gaps > 0,
        "the stuck reader cost nothing: the test did not test"
    );
    assert_eq!(reported, gaps, "lost records vs seqno gaps");
    assert_eq!(total, gaps, "stop vs seqno gaps");
    // It is said after the drops, once the reader took records again.
    let first_gap = seqnos.windows(2).find(|w| w[1] > w[0] + 1).unwrap()[0];
    assert!(
        of_type(&records, "lost")
            .iter()
            .any(|l| l["seqno"].as_u64() > Some(first_gap)
                && l["by_source"]["output.queue_full"].is_u64()),
        "no lost record after the first gap"
    );
}

#[test]
fn a_full_disk_ends_the_run_with_one_line_and_nothing_attached() {
    require_root();
    use stalltrace_lab::kernel_objects::{await_no_leftovers, baseline, stalltrace_map_names};
    let since = baseline();
    // /dev/full: every write fails with ENOSPC, as on a full filesystem.
    let mut run = Run::start(
        &["--out", "/dev/full", "--interval", "100ms"],
        Stdio::null(),
    );
    let (status, _) = run.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "{}", run.stderr());
    let stderr = run.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr
            .starts_with("stalltrace: cannot write records to /dev/full: No space left on device")
            && stderr.contains("free space"),
        "{stderr}"
    );
    if let Err(left) = await_no_leftovers(since, &stalltrace_map_names(), Duration::from_secs(5)) {
        panic!("left attached or loaded: {left:?}");
    }
}

#[test]
fn a_reader_that_goes_away_ends_the_run_with_one_line() {
    require_root();
    let (read, write) = small_pipe();
    let mut run = Run::start(&["--interval", "100ms"], Stdio::from(write));
    let mut reader = BufReader::new(read);
    let start = read_start(&mut reader);
    drop(reader);
    let (status, _) = run.wait(Duration::from_secs(30));
    assert_eq!(status.code(), Some(1), "{}", run.stderr());
    let stderr = run.stderr();
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(
        stderr.starts_with("stalltrace: cannot write records to stdout: Broken pipe")
            && stderr.contains("--out"),
        "{stderr}"
    );
    assert_unloaded(&program_ids(&start));
}
