//! Shipping the stream with stock tools: a real rsyslog pair (Debian's
//! package: imfile tails `--out` and forwards over TCP to an imtcp receiver,
//! both of the test's own) while logrotate rotates the file under fio load,
//! and stalltrace's own rotation (`--out-max-mb`). What arrives must be the
//! very lines stalltrace wrote, each a whole record under the line limit,
//! with no seqno missing or repeated; docs/shipping.md shows the same
//! configuration.

mod common;
#[path = "shipping/written.rs"]
mod written;

use std::collections::HashSet;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;
use stalltrace::records::MAX_LINE_BYTES;
use stalltrace_lab::rsyslog::{
    DEFAULT_MAX_MESSAGE_SIZE, Follow, Shipping, find_program, forwarder_config, receiver_config,
};
use written::*;

/// rsyslogd and logrotate, or false (locally: the test says it skipped)
/// when either is missing. Under CI it fails instead: never a silent pass.
fn shipping_tools() -> bool {
    let missing: Vec<&str> = ["rsyslogd", "logrotate"]
        .into_iter()
        .filter(|p| find_program(p).is_none())
        .collect();
    if missing.is_empty() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "{missing:?} not installed: `cargo xtask setup` installs rsyslog and logrotate \
         (CI never skips this test)"
    );
    eprintln!("SKIPPED: {missing:?} not installed (`cargo xtask setup`); CI fails here instead");
    false
}

/// A directory of the test's own (0755, so logrotate accepts it), removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(unique(&format!("stalltrace-shipping-{name}")));
        std::fs::create_dir_all(&dir).unwrap();
        // logrotate refuses a directory others may write to, whatever the umask.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// `stalltrace run --out OUT <args>`, killed on drop. Not the lab's Tracer:
/// the test names the file (rsyslog and logrotate are configured with it
/// before the run starts) and keeps what the run leaves there.
struct Run {
    child: Child,
    out: PathBuf,
    stderr: PathBuf,
}

impl Run {
    fn start(out: &Path, args: &[&str]) -> Self {
        let stderr = out.with_extension("stderr");
        let child = stalltrace_lab::die_with_parent(&mut Command::new(stalltrace_bin()))
            .arg("run")
            .arg("--out")
            .arg(out)
            .args(args)
            .stdout(Stdio::null())
            .stderr(File::create(&stderr).unwrap())
            .spawn()
            .unwrap();
        let mut run = Self {
            child,
            out: out.to_path_buf(),
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !std::fs::read_to_string(&run.out)
            .unwrap_or_default()
            .contains(r#""type":"start""#)
        {
            if let Some(status) = run.child.try_wait().unwrap() {
                panic!("stalltrace exited ({status}): {}", run.stderr_text());
            }
            assert!(Instant::now() < deadline, "no start record after 30 s");
            std::thread::sleep(Duration::from_millis(50));
        }
        run
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// SIGTERM, as a service manager stops it; the exit must be clean.
    fn stop(mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(self.pid() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                break status;
            }
            assert!(Instant::now() < deadline, "no exit 30 s after SIGTERM");
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(status.success(), "{status}: {}", self.stderr_text());
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs logrotate with a configuration and state file of the test's own
/// (`-f`: rotate now, whatever the schedule says); returns its `-v` account.
fn logrotate(dir: &Path, config: &str) -> String {
    let conf = dir.join("logrotate.conf");
    std::fs::write(&conf, config).unwrap();
    let out = Command::new(find_program("logrotate").unwrap())
        .arg("-v")
        .arg("-s")
        .arg(dir.join("logrotate.state"))
        .arg("-f")
        .arg(&conf)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "logrotate failed: {text}");
    text
}

/// 4k random reads at `iops` on a loop device for `secs`, in a thread: with
/// `--slow-io-ms 0.001` each read is a `slow_io` record, a steady stream of
/// lines while logrotate works.
fn block_load(dev: &str, iops: u32, secs: u32) -> JoinHandle<Fio> {
    let dev = dev.to_string();
    std::thread::spawn(move || {
        let rate = format!("--rate_iops={iops}");
        randread_4k(&dev, &["--ioengine=psync", &rate], secs)
    })
}

/// What a logrotate test leaves to check: the files and what arrived.
struct Shipped {
    _dir: Scratch,
    written: Vec<Written>,
    received: String,
    run: String,
    stop: Value,
    fio: Fio,
}

/// A run under block load with the rsyslog pair tailing its file, and
/// logrotate (`rotation`, a stanza for FILE with `{pid}` for the tracer's
/// pid) run twice in the middle.
fn ship_through_logrotate(name: &str, rotation: &str, follow: Follow) -> Option<Shipped> {
    require_root();
    if !shipping_tools() {
        return None;
    }
    let dir = Scratch::new(name);
    let out = dir.0.join("stalltrace.jsonl");
    let mut shipping = Shipping::start(&dir.0.join("rsyslog"), &out, follow);
    let disk = LoopDevice::new(Backing::Tmpfs, 64, false);
    let run = Run::start(&out, &["--interval", "200ms", "--slow-io-ms", "0.001"]);
    // imfile must have the file open before the first rotation.
    shipping.wait_drained(Duration::from_secs(30), Duration::ZERO, |t| {
        t.contains(r#""type":"start""#)
    });
    let load = block_load(&disk.dev, 400, 10);
    for _ in 0..2 {
        // Apart by more than a polling interval: imfile must see each file.
        std::thread::sleep(Duration::from_secs(3));
        let config = rotation
            .replace("{file}", out.to_str().unwrap())
            .replace("{pid}", &run.pid().to_string());
        let account = logrotate(&dir.0, &config);
        eprintln!("logrotate: {}", account.lines().last().unwrap_or_default());
    }
    let fio = load.join().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    run.stop();
    let received = shipping.wait_drained(Duration::from_secs(30), Duration::from_secs(2), |t| {
        received_stop(t).is_some()
    });
    let written = read_set(&out);
    let first: Value = serde_json::from_str(&written[0].lines[0]).unwrap();
    let stop = received_stop(&received).unwrap();
    Some(Shipped {
        _dir: dir,
        run: first["run"].as_str().unwrap().to_string(),
        written,
        received,
        stop,
        fio,
    })
}

/// The stream's own account: nothing dropped by the output queue, so every
/// record made was handed to the file.
fn assert_no_output_loss(stop: &Value) {
    assert!(
        stop["lost"]["output.queue_full"].as_u64().unwrap_or(0) == 0,
        "the output queue dropped records: {}",
        stop["lost"]
    );
}

#[test]
fn logrotate_copytruncate_loses_only_what_its_own_window_loses() {
    let Some(s) = ship_through_logrotate(
        "copytruncate",
        "{file} {\n    copytruncate\n    rotate 5\n    nocompress\n}\n",
        Follow::Inotify,
    ) else {
        return;
    };
    // The copy→truncate window: seqnos after the last line of each copy and
    // before the first line of the file that follows, in no file on disk.
    let windows: Vec<(u64, u64)> = s
        .written
        .windows(2)
        .map(|w| (*w[0].seqnos.last().unwrap(), w[1].seqnos[0]))
        .collect();
    let in_window = |n: u64| windows.iter().any(|&(a, b)| a < n && n < b);
    let seqnos = check_received(&s.received, &s.written, &s.run, in_window);
    let last = seqno(&s.stop);
    let (missing, repeated) = missing_and_repeated(&seqnos, last);
    let truncated_away: Vec<u64> = (0..=last).filter(|&n| in_window(n)).collect();
    let (lines, bytes) = totals(&s.written);
    eprintln!(
        "copytruncate: fio {} reads; {} files, {lines} lines, {bytes} bytes on disk; \
         {} lines received (longest {} bytes); seqnos 0..={last}: {} never arrived, {} twice; \
         {} written in logrotate's copy→truncate windows {windows:?}",
        s.fio.ios,
        s.written.len(),
        s.received.lines().count(),
        longest_line(&s.received),
        missing.len(),
        repeated.len(),
        truncated_away.len()
    );
    assert!(s.written.len() >= 3, "two rotations, three files");
    assert_no_output_loss(&s.stop);
    assert!(repeated.is_empty(), "received twice: {repeated:?}");
    // A line may be missing only where copytruncate itself loses it:
    // written between logrotate's copy and its truncation (in no file), or
    // in the copy but truncated away before imfile read it (the copy's tail).
    let arrived: HashSet<u64> = seqnos.iter().copied().collect();
    let unexplained: Vec<u64> = missing
        .iter()
        .copied()
        .filter(|&n| {
            let in_copy_tail = s.written[..s.written.len() - 1].iter().any(|w| {
                let last_read = w.seqnos.iter().rev().find(|x| arrived.contains(x));
                w.seqnos.contains(&n) && last_read.is_none_or(|&r| r < n)
            });
            !in_window(n) && !in_copy_tail
        })
        .collect();
    assert!(
        unexplained.is_empty(),
        "lost, and not by copytruncate: {}",
        whereabouts(&unexplained, &s.written)
    );
    if !missing.is_empty() {
        eprintln!(
            "copytruncate lost {} lines, each in logrotate's window (its man page warns of it), \
             none by stalltrace or rsyslog: {}",
            missing.len(),
            whereabouts(&missing, &s.written)
        );
    }
    // The report reads the set as one run and names the window's gap, if any.
    let files: Vec<PathBuf> = s.written.iter().map(|w| w.path.clone()).collect();
    let report = report_over(&files);
    let gaps = report_gaps(&report);
    assert_eq!(
        gaps.is_empty(),
        truncated_away.is_empty(),
        "the report's seqno lines {gaps:?} against {} seqnos in no file",
        truncated_away.len()
    );
}

#[test]
fn logrotate_create_and_sighup_ship_every_record_once() {
    // Polling: rsyslog 8.2302's inotify mode drops a renamed file at once,
    // and with it the lines written between the rename and the SIGHUP.
    let Some(s) = ship_through_logrotate(
        "create-hup",
        "{file} {\n    create 0640 root root\n    rotate 5\n    nocompress\n    \
         postrotate\n        kill -HUP {pid}\n    endscript\n}\n",
        Follow::Polling { secs: 1 },
    ) else {
        return;
    };
    let seqnos = check_received(&s.received, &s.written, &s.run, |_| false);
    let last = seqno(&s.stop);
    let (missing, repeated) = missing_and_repeated(&seqnos, last);
    let (lines, bytes) = totals(&s.written);
    eprintln!(
        "create + SIGHUP: fio {} reads; {} files, {lines} lines, {bytes} bytes on disk; \
         {} lines received (longest {} bytes); seqnos 0..={last}: {} never arrived, {} twice",
        s.fio.ios,
        s.written.len(),
        s.received.lines().count(),
        longest_line(&s.received),
        missing.len(),
        repeated.len()
    );
    assert!(s.written.len() >= 3, "two rotations, three files");
    assert_no_output_loss(&s.stop);
    assert!(
        missing.is_empty() && repeated.is_empty(),
        "missing {}; repeated {repeated:?}",
        whereabouts(&missing, &s.written)
    );
    // On disk: every file after the first begins with the run's start
    // again, numbered, and the set holds every seqno once.
    for (i, w) in s.written.iter().enumerate() {
        let head: Value = serde_json::from_str(&w.lines[0]).unwrap();
        assert_eq!(
            head["type"],
            "start",
            "{} begins with {head}",
            w.path.display()
        );
        if i > 0 {
            assert_eq!(head["file"], i, "{}", w.path.display());
        }
    }
    assert_eq!(s.written[0].seqnos[0], 0);
    assert_contiguous(&s.written, last);
    let files: Vec<PathBuf> = s.written.iter().map(|w| w.path.clone()).collect();
    let report = report_over(&files);
    assert!(report_gaps(&report).is_empty(), "{report}");
}

#[test]
fn out_max_mb_rotates_by_itself_within_size_and_keep() {
    require_root();
    if !shipping_tools() {
        return;
    }
    const MAX_MB: u64 = 1;
    const KEEP: usize = 3;
    let dir = Scratch::new("out-max-mb");
    let out = dir.0.join("stalltrace.jsonl");
    let mut shipping = Shipping::start(&dir.0.join("rsyslog"), &out, Follow::Inotify);
    let disk = LoopDevice::new(Backing::Tmpfs, 64, false);
    let run = Run::start(
        &out,
        &[
            "--interval",
            "200ms",
            "--slow-io-ms",
            "0.001",
            "--out-max-mb",
            &MAX_MB.to_string(),
            "--out-keep",
            &KEEP.to_string(),
        ],
    );
    let fio = block_load(&disk.dev, 1500, 8).join().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    run.stop();
    let received = shipping.wait_drained(Duration::from_secs(60), Duration::from_secs(2), |t| {
        received_stop(t).is_some()
    });

    let written = read_set(&out);
    let max = MAX_MB * 1024 * 1024;
    let starts: Vec<Value> = written
        .iter()
        .map(|w| serde_json::from_str(&w.lines[0]).unwrap())
        .collect();
    let newest_file = starts.last().unwrap()["file"].as_u64().unwrap_or(0);
    let sizes: Vec<u64> = written
        .iter()
        .map(|w| std::fs::metadata(&w.path).unwrap().len())
        .collect();
    let stop = received_stop(&received).unwrap();
    let last = seqno(&stop);
    eprintln!(
        "--out-max-mb {MAX_MB} --out-keep {KEEP}: fio {} reads; {} records made, {} files \
         begun, {} kept, sizes {sizes:?}; {} lines received (longest {} bytes)",
        fio.ios,
        last + 1,
        newest_file + 1,
        written.len(),
        received.lines().count(),
        longest_line(&received)
    );
    assert!(
        newest_file >= 2,
        "rotated {newest_file} times, want 2 at least"
    );
    assert!(written.len() <= KEEP + 1, "{} files kept", written.len());
    for (w, size) in written.iter().zip(&sizes) {
        // A line may pass the size only as the file's last.
        let last_line = w.lines.last().map_or(0, |l| l.len() as u64 + 1);
        assert!(
            size - last_line <= max,
            "{} is {size} bytes",
            w.path.display()
        );
    }
    for (start, w) in starts.iter().zip(&written) {
        assert_eq!(
            start["type"],
            "start",
            "{} begins with {start}",
            w.path.display()
        );
    }
    let files: Vec<u64> = starts
        .iter()
        .map(|s| s["file"].as_u64().unwrap_or(0))
        .collect();
    assert!(
        files.windows(2).all(|f| f[1] == f[0] + 1),
        "the kept files' ordinals: {files:?}"
    );
    // rsyslog (inotify) followed every rename: it has every record,
    // those of files already deleted too, each once.
    let first_kept = written
        .iter()
        .flat_map(|w| &w.seqnos)
        .min()
        .copied()
        .unwrap();
    let run_id = starts[0]["run"].as_str().unwrap();
    let seqnos = check_received(&received, &written, run_id, |n| n < first_kept);
    let (missing, repeated) = missing_and_repeated(&seqnos, last);
    assert!(
        missing.is_empty() && repeated.is_empty(),
        "missing {}; repeated {repeated:?}",
        whereabouts(&missing, &written)
    );
    assert_no_output_loss(&stop);
    assert_contiguous(&written, last);
    let paths: Vec<PathBuf> = written.iter().map(|w| w.path.clone()).collect();
    // The set lacks the deleted files' records, which the report says
    // (older files removed), and nothing else.
    let report = report_over(&paths);
    let not_here: Vec<&str> = report.lines().filter(|l| l.contains("not here")).collect();
    eprintln!("report on the kept files: {not_here:?}");
    assert!(report_gaps(&report).is_empty(), "{report}");
    assert!(first_kept == 0 || !not_here.is_empty(), "{report}");
}

/// rsyslog's default `maxMessageSize` (8096 bytes) bounds the forwarded
/// message, header included: the longest line stalltrace may write must
/// arrive whole through the tested configuration without raising it.
#[test]
fn a_stock_rsyslog_carries_the_longest_line_stalltrace_writes_whole() {
    if !shipping_tools() {
        return;
    }
    let dir = Scratch::new("line-limit");
    let out = dir.0.join("lines.jsonl");
    let mut shipping = Shipping::start(&dir.0.join("rsyslog"), &out, Follow::Inotify);
    // JSON lines of chosen lengths (newline excluded), as stalltrace writes
    // them: the longest is MAX_LINE_BYTES with its newline.
    let line = |n: usize, len: usize| {
        let head = format!(r#"{{"seqno":{n},"pad":""#);
        format!("{head}{}\"}}", "x".repeat(len - head.len() - 2))
    };
    let lengths = [100, 4096, 8000, MAX_LINE_BYTES - 1];
    let text: String = lengths
        .iter()
        .enumerate()
        .map(|(n, &len)| line(n, len) + "\n")
        .collect();
    std::fs::write(&out, &text).unwrap();
    let received = shipping.wait_drained(Duration::from_secs(30), Duration::from_secs(1), |t| {
        t.lines().count() >= lengths.len()
    });
    let got: Vec<usize> = received.lines().map(str::len).collect();
    eprintln!("lines of {lengths:?} bytes written, {got:?} received");
    for (sent, arrived) in text.lines().zip(received.lines()) {
        assert!(
            sent == arrived,
            "a {}-byte line arrived as {} bytes: rsyslog's default maxMessageSize is \
             {DEFAULT_MAX_MESSAGE_SIZE} bytes for the RFC 5424 header ({} bytes here, with \
             this host's name) and the line together, so MAX_LINE_BYTES ({MAX_LINE_BYTES}) \
             is more than a stock rsyslog forwards whole",
            sent.len(),
            arrived.len(),
            DEFAULT_MAX_MESSAGE_SIZE.saturating_sub(arrived.len())
        );
    }
}

/// docs/shipping.md shows the tested configuration, not a look-alike.
#[test]
fn the_documented_rsyslog_configuration_is_the_tested_one() {
    let doc =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/shipping.md"))
            .unwrap();
    let tailed = Path::new("/var/log/stalltrace.jsonl");
    let forwarder = forwarder_config(tailed, "logs.example.net", 10514, Follow::Inotify);
    let receiver = receiver_config(None, 10514, Path::new("/var/log/stalltrace/hosts.jsonl"));
    let polling = forwarder_config(
        tailed,
        "logs.example.net",
        10514,
        Follow::Polling { secs: 1 },
    );
    let polling_module = polling.lines().nth(1).unwrap();
    for (what, text) in [
        ("forwarder", forwarder.as_str()),
        ("receiver", receiver.as_str()),
        ("polling module line", polling_module),
    ] {
        assert!(
            doc.contains(text),
            "docs/shipping.md does not show the tested {what} configuration:\n{text}"
        );
    }
}
