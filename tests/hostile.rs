//! `stalltrace report` (the binary) on input too big to hold: a gzip bomb
//! and a multi-gigabyte line, generated on the fly (never written to the
//! repository, never held in this test's memory), with the child's peak
//! resident memory from the kernel (wait4's rusage). The many small hostile
//! inputs run in process: userspace/src/report/input/tests.rs.
//!
//! The memory bound is the reader's design figure, not a measured guess: a
//! line is read up to MAX_LINE bytes (userspace/src/report/lines.rs),
//! held once as bytes and at most once more as text (3 bytes per byte that is
//! not UTF-8), so reading adds at most 4 x MAX_LINE to what reporting the
//! same stream without the line takes.

mod common;

use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use flate2::Compression;
use flate2::write::GzEncoder;

/// userspace/src/report/lines.rs's MAX_LINE; the error message below
/// names it, so a change there fails here.
const MAX_LINE: u64 = 4 << 20;
/// Reading's share of peak memory: the line as bytes and as text (see above),
/// and the read and decompression buffers (64 KiB each, a 32 KiB window).
const READER_PEAK: u64 = 4 * MAX_LINE + (1 << 20);
const GIB: u64 = 1 << 30;

fn recorded() -> Vec<String> {
    let path =
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/report/fixtures/recorded.jsonl.gz");
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(path).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text.lines().map(String::from).collect()
}

/// What a `report` run left: exit code, output, peak RSS, time.
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    peak_rss: u64,
    took: Duration,
}

/// `stalltrace report <args>` with `feed` writing its stdin (then closed).
fn run(args: &[&str], feed: impl FnOnce(&mut dyn Write) + Send + 'static) -> Run {
    run_command("report", args, feed)
}

/// `stalltrace <command> <args>`, as `run`; the peak RSS is the kernel's, from wait4.
#[expect(
    clippy::zombie_processes,
    reason = "the child is reaped by wait4, which also gives its rusage"
)]
fn run_command(
    command: &str,
    args: &[&str],
    feed: impl FnOnce(&mut dyn Write) + Send + 'static,
) -> Run {
    let started = Instant::now();
    let mut child = Command::new(stalltrace_bin())
        .arg(command)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // The child may stop reading early (a refused stream): a broken pipe then is expected.
    let writer = std::thread::spawn(move || feed(&mut stdin));
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut s = String::new();
            r.read_to_string(&mut s).unwrap();
            s
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let mut status = 0;
    // SAFETY: rusage is plain data the kernel fills in; the pid is our child's.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    let pid = child.id() as libc::pid_t;
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut usage) };
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    let took = started.elapsed();
    writer.join().unwrap();
    Run {
        code: libc::WIFEXITED(status).then(|| libc::WEXITSTATUS(status)),
        stdout: out.join().unwrap(),
        stderr: err.join().unwrap(),
        // Linux reports ru_maxrss in KiB.
        peak_rss: usage.ru_maxrss as u64 * 1024,
        took,
    }
}

/// Writes into a pipe whose reader may have gone: only a broken pipe is fine.
fn write_or_gone(w: &mut dyn Write, bytes: &[u8]) -> bool {
    match w.write_all(bytes) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => false,
        Err(e) => panic!("feeding stalltrace: {e}"),
    }
}

/// `lines` with `bytes` of `fill` as one more line before line `at` (0-based):
/// written a MiB at a time, so the test never holds the long line.
fn feed_with_long_line(
    lines: Vec<String>,
    at: usize,
    fill: u8,
    bytes: u64,
) -> impl FnOnce(&mut dyn Write) + Send + 'static {
    move |w| {
        for l in &lines[..at] {
            if !write_or_gone(w, format!("{l}\n").as_bytes()) {
                return;
            }
        }
        let chunk = vec![fill; 1 << 20];
        let mut left = bytes;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if !write_or_gone(w, &chunk[..n]) {
                return;
            }
            left -= n as u64;
        }
        let rest: String = lines[at..].iter().map(|l| format!("\n{l}")).collect();
        write_or_gone(w, rest.as_bytes());
        write_or_gone(w, b"\n");
    }
}

/// Peak RSS of reporting the recording alone: what the long line is added to.
fn baseline() -> Run {
    let text = recorded().join("\n") + "\n";
    let r = run(&["-", "--width", "100"], move |w| {
        write_or_gone(w, text.as_bytes());
    });
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    r
}

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / (1 << 20) as f64)
}

fn one_line_error(r: &Run) -> &str {
    assert_eq!(r.code, Some(1), "stderr: {}", r.stderr);
    assert_eq!(r.stderr.lines().count(), 1, "one line: {:?}", r.stderr);
    assert!(r.stdout.is_empty(), "nothing on stdout: {}", r.stdout);
    r.stderr.trim_end()
}

/// A line of 3 GiB of 0xff (not UTF-8: the text copy is 3 times the bytes
/// read, the worst case) in the middle of the real recording, through a
/// pipe: skipped and counted, the rest reported, memory within the bound.
#[test]
fn a_multi_gigabyte_line_is_skipped_in_bounded_memory() {
    let base = baseline();
    let size = 3 * GIB;
    let r = run(
        &["-", "--width", "100"],
        feed_with_long_line(recorded(), 10, 0xff, size),
    );
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let flat = r.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains("1 line in the middle of the stream is not a JSON record (line 11): skipped"),
        "{}",
        r.stdout
    );
    // The lines after it were read: the recording's stop is there.
    assert!(!flat.contains("no `stop` record"), "{}", r.stdout);
    println!(
        "3 GiB line: peak RSS {} (the recording alone: {}), {:.1} s ({:.0} MiB/s)",
        mib(r.peak_rss),
        mib(base.peak_rss),
        r.took.as_secs_f64(),
        size as f64 / (1 << 20) as f64 / r.took.as_secs_f64()
    );
    assert!(
        r.peak_rss <= base.peak_rss + READER_PEAK,
        "peak RSS {} > {} + {}",
        mib(r.peak_rss),
        mib(base.peak_rss),
        mib(READER_PEAK)
    );
}

/// The same line first: nothing before it looks like a record, so the input
/// is refused at the cap, without reading the rest.
#[test]
fn a_multi_gigabyte_first_line_is_refused_at_the_cap() {
    let base = baseline();
    let r = run(&["-"], feed_with_long_line(recorded(), 0, b'x', 3 * GIB));
    let line = one_line_error(&r);
    assert!(
        line.contains("stdin is not a stalltrace record stream: line 1 is longer than 4 MiB")
            && line.contains("stalltrace run --out FILE"),
        "{line}"
    );
    println!(
        "refused in {:.2} s, peak RSS {}",
        r.took.as_secs_f64(),
        mib(r.peak_rss)
    );
    assert!(
        r.peak_rss <= base.peak_rss + READER_PEAK,
        "{}",
        mib(r.peak_rss)
    );
}

/// A gzip member of 1 MiB of `fill` (~1 KiB); members concatenate into one
/// stream, so a bomb is built without compressing gigabytes.
fn gzip_mib(fill: u8) -> Vec<u8> {
    let mut e = GzEncoder::new(Vec::new(), Compression::best());
    e.write_all(&vec![fill; 1 << 20]).unwrap();
    e.finish().unwrap()
}

/// 16 GiB of zeros in ~16 MiB of gzip (concatenated members, which gzip
/// allows), on stdin: refused once the first line passes the cap, after
/// decompressing a few MiB of it, not 16 GiB. The oracle is how much of the
/// bomb stalltrace took from the pipe before it stopped reading (what it had
/// not taken when it exited breaks the pipe), not how long it took: a busy
/// host makes any time limit a flake.
#[test]
fn a_gzip_bomb_is_refused_after_the_cap() {
    let base = baseline();
    let member = gzip_mib(0);
    let members = ((16 * GIB) >> 20) as usize;
    let compressed = member.len() * members;
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = taken.clone();
    let r = run(&["-"], move |w| {
        for _ in 0..members {
            if !write_or_gone(w, &member) {
                return;
            }
            counter.fetch_add(member.len() as u64, std::sync::atomic::Ordering::Relaxed);
        }
    });
    let line = one_line_error(&r);
    assert!(line.contains("line 1 is longer than 4 MiB"), "{line}");
    let taken = taken.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "bomb: {} of gzip for 16 GiB: refused after {} of it went into the pipe, in {:.2} s, \
         peak RSS {} (the recording: {})",
        mib(compressed as u64),
        mib(taken),
        r.took.as_secs_f64(),
        mib(r.peak_rss),
        mib(base.peak_rss)
    );
    assert!(
        r.peak_rss <= base.peak_rss + READER_PEAK,
        "{}",
        mib(r.peak_rss)
    );
    // Refusing must not have meant decompressing it all: at most 1 MiB of the
    // gzip (1 GiB of zeros, and the pipe's and the reader's buffers) was taken.
    assert!(
        taken <= 1 << 20,
        "{} of the bomb's gzip was read",
        mib(taken)
    );
}

/// A bomb of one never-ending line after a real recording's records: the
/// line is streamed past in bounded memory, and the records are reported.
#[test]
fn a_gzip_bomb_after_records_is_skipped_in_bounded_memory() {
    let base = baseline();
    let lines = recorded();
    let (head, tail) = lines.split_at(lines.len() - 1);
    let mut gz = Vec::new();
    let text = |ls: &[String]| ls.iter().map(|l| format!("{l}\n")).collect::<String>();
    let mut e = GzEncoder::new(&mut gz, Compression::fast());
    e.write_all(text(head).as_bytes()).unwrap();
    e.finish().unwrap();
    let size_gib = 1;
    let member = gzip_mib(b'a');
    for _ in 0..((size_gib * GIB) >> 20) {
        gz.extend_from_slice(&member);
    }
    let mut e = GzEncoder::new(&mut gz, Compression::fast());
    e.write_all(format!("\n{}\n", tail[0]).as_bytes()).unwrap();
    e.finish().unwrap();
    let r = run(&["-", "--width", "100"], move |w| {
        write_or_gone(w, &gz);
    });
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let flat = r.stdout.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        flat.contains(&format!(
            "1 line in the middle of the stream is not a JSON record (line {}): skipped",
            head.len() + 1
        )),
        "{}",
        r.stdout
    );
    assert!(!flat.contains("no `stop` record"), "{}", r.stdout);
    println!(
        "{size_gib} GiB line in gzip after the records: skipped in {:.1} s, peak RSS {} (the recording: {})",
        r.took.as_secs_f64(),
        mib(r.peak_rss),
        mib(base.peak_rss)
    );
    assert!(
        r.peak_rss <= base.peak_rss + READER_PEAK,
        "{}",
        mib(r.peak_rss)
    );
}

/// `stalltrace run --sql-dmv FILE` reads its settings before attaching
/// anything, at most 64 KiB of them (MAX_FILE_BYTES in
/// userspace/src/sqlserver/dmv/config.rs, whose unit tests pin the exact
/// limit): an 8 GiB file (sparse: no disk used) is refused in one line, in
/// the memory a 9-byte file is refused in. That 64 KiB read is below what a
/// process's peak RSS resolves: identical refusals here spread over 0.7 MiB,
/// so the bound is the highest of three such refusals plus 1 MiB. Reading
/// the file whole would take 8 GiB.
#[test]
fn a_huge_dmv_settings_file_is_refused_in_the_memory_of_a_small_one() {
    use std::os::unix::fs::PermissionsExt;
    const RSS_SPREAD: u64 = 1 << 20;
    let dir = std::env::temp_dir().join(unique("stalltrace-dmv"));
    std::fs::create_dir(&dir).unwrap();
    let small = dir.join("small.conf");
    std::fs::write(&small, "user = a\n").unwrap();
    let huge = dir.join("huge.conf");
    std::fs::File::create(&huge)
        .unwrap()
        .set_len(8 << 30)
        .unwrap();
    for p in [&small, &huge] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let refuse = |path: &std::path::Path| {
        let r = run_command("run", &["--sql-dmv", path.to_str().unwrap()], |_| {});
        one_line_error(&r);
        r
    };
    let base = (0..3)
        .map(|_| {
            let r = refuse(&small);
            assert!(
                r.stderr.contains("no SQL Server user and password"),
                "{}",
                r.stderr
            );
            r.peak_rss
        })
        .max()
        .unwrap();
    let r = refuse(&huge);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        r.stderr
            .contains("larger than 64 KiB: it is not a settings file"),
        "{}",
        r.stderr
    );
    println!(
        "8 GiB settings file: refused in {:.3} s, peak RSS {} (a 9-byte file: {})",
        r.took.as_secs_f64(),
        mib(r.peak_rss),
        mib(base)
    );
    assert!(r.peak_rss <= base + RSS_SPREAD, "{}", mib(r.peak_rss));
}
