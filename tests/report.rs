//! `stalltrace report` end to end: the real binary on a real recording (with
//! handcrafted `stall` and `tcp_flow` records set in its window), its one-line
//! errors, and the HTML page loaded in headless Chromium: no console error,
//! no blocked fetch, and the charts and episodes in the DOM.
//!
//! Chromium is the only thing these tests need besides the binary (no root).
//! Without it they fail under CI=true and skip with a message elsewhere.

mod common;

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("src/report/fixtures")
        .join(name)
}

/// The recording, as text.
fn recorded() -> String {
    let mut text = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(fixture("recorded.jsonl.gz")).unwrap())
        .read_to_string(&mut text)
        .unwrap();
    text
}

/// The recording with the handcrafted episodes and flow before its `stop`
/// (whose totals then count them): every line checked against the schema.
fn stream_with_episodes() -> Vec<String> {
    let mut lines: Vec<String> = recorded().lines().map(String::from).collect();
    let mut stop: Value = serde_json::from_str(&lines.pop().unwrap()).unwrap();
    let extra = std::fs::read_to_string(fixture("episodes.jsonl")).unwrap();
    for line in extra.lines() {
        let v: Value = serde_json::from_str(line).unwrap();
        let kind = v["type"].as_str().unwrap().to_string();
        stop["records"][&kind] = json!(stop["records"][&kind].as_u64().unwrap_or(0) + 1);
        lines.push(line.to_string());
    }
    lines.push(stop.to_string());
    // The recording is schema 1 (the report reads it still): it follows that
    // schema's contract, as docs/schema.json was then.
    let schema_1: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture("schema-1.json")).unwrap()).unwrap();
    let schema_1 = jsonschema::validator_for(&schema_1).unwrap();
    for line in &lines {
        let record: Value = serde_json::from_str(line).unwrap();
        let errors: Vec<String> = schema_1
            .iter_errors(&record)
            .map(|e| e.to_string())
            .collect();
        assert!(errors.is_empty(), "{errors:?}\n{line}");
    }
    lines
}

/// A scratch directory removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new() -> Self {
        let dir = std::env::temp_dir().join(unique("stalltrace-report"));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.0.join(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn report(args: &[&str], stdin: Option<&[u8]>) -> Output {
    let mut child = Command::new(stalltrace_bin())
        .arg("report")
        .args(args)
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    if let Some(bytes) = stdin {
        child.stdin.take().unwrap().write_all(bytes).unwrap();
    }
    child.wait_with_output().unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The text with its line wrapping undone, to look for phrases.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

// ---- the binary ---------------------------------------------------------------

#[test]
fn a_recording_is_reported_as_text_and_written_as_a_page() {
    let dir = Scratch::new();
    let input = dir.write("run.jsonl", &(stream_with_episodes().join("\n") + "\n"));
    let html = dir.path("run.html");
    let out = report(
        &[
            input.to_str().unwrap(),
            "--html",
            html.to_str().unwrap(),
            "--width",
            "100",
        ],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    let f = flat(&text);
    assert!(f.contains("stream complete: start to stop"), "{text}");
    assert!(f.contains("losses none"), "{text}");
    // Ranked by impact: tx throttled 1.48 s, bulk flow 950 ms, RTOs 212 ms, slow disk 45.8 ms.
    let at = |needle: &str| {
        f.find(needle)
            .unwrap_or_else(|| panic!("no {needle:?} in:\n{text}"))
    };
    assert!(at("#1 network: tx throttled — impact 1.48 s") < at("#2 bulk flow: network limited"));
    assert!(at("#2 bulk flow") < at("#3 network: retransmission timeouts — impact 212 ms"));
    assert!(at("#3 network") < at("#4 storage: slow device"));
    assert!(
        f.contains("sessions 1 hit: SPID 51 from 10.213.7.1:49946"),
        "{text}"
    );
    assert!(f.contains("SPID 51 10.213.7.1:49946 #3 #4"), "{text}");
    for section in [
        "STORAGE (2 disks)",
        "NETWORK INTERFACES (2)",
        "TCP PEERS",
        "BULK FLOWS (1)",
    ] {
        assert!(text.contains(section), "{section}");
    }
    for line in text.lines().filter(|l| l.contains('│')) {
        assert!(
            line.chars().count() <= 100,
            "chart wider than --width: {line}"
        );
    }
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        format!("stalltrace: wrote {}", html.display())
    );
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(page.starts_with("<!DOCTYPE html>"));
    assert_eq!(page.matches("<rect class=\"episode ").count(), 4);
}

#[test]
fn a_cut_recording_keeps_its_episode_open_and_says_it_was_cut() {
    let mut lines = stream_with_episodes();
    lines.pop(); // stop
    let last = lines.pop().unwrap(); // episode 4's closing record, written at the end
    assert!(last.contains("\"phase\":\"closed\"") && last.contains("\"id\":4"));
    let half = &lines.last().unwrap()[..40].to_string();
    let dir = Scratch::new();
    // A crash mid-write leaves half a line and no newline.
    let input = dir.write("cut.jsonl", &(lines.join("\n") + "\n" + half));
    let out = report(&[input.to_str().unwrap(), "--width", "100"], None);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = flat(&stdout(&out));
    assert!(
        text.contains("no `stop` record: the recording was cut short"),
        "{text}"
    );
    assert!(text.contains("the last line stops mid-record"), "{text}");
    assert!(
        text.contains("STILL OPEN when the recording ended"),
        "{text}"
    );
}

#[test]
fn stdin_and_gzip_are_read() {
    let gz = std::fs::read(fixture("recorded.jsonl.gz")).unwrap();
    let out = report(&["-", "--width", "80"], Some(&gz));
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = stdout(&out);
    assert!(
        text.contains("No stalls: no stall episode in this recording."),
        "{text}"
    );
    assert!(text.contains("loop1 (7:1)"), "{text}");
}

/// What follows the report's header (the run, the stream's health).
fn sections(text: &str) -> &str {
    &text[text
        .find("── STALL EPISODES")
        .expect("the episodes section")..]
}

#[test]
fn a_rotated_set_given_in_any_order_is_reported_as_one_stream() {
    // The recording as a copytruncate rotation leaves a schema 1 stream:
    // the oldest file (gzip) with the `start`, the later ones without.
    let lines = stream_with_episodes();
    let third = lines.len() / 3;
    let dir = Scratch::new();
    let whole = dir.write("whole.jsonl", &(lines.join("\n") + "\n"));
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all((lines[..third].join("\n") + "\n").as_bytes())
        .unwrap();
    std::fs::write(dir.path("s.jsonl.2.gz"), gz.finish().unwrap()).unwrap();
    dir.write("s.jsonl.1", &(lines[third..2 * third].join("\n") + "\n"));
    dir.write("s.jsonl", &(lines[2 * third..].join("\n") + "\n"));
    let one = report(&[whole.to_str().unwrap(), "--width", "100"], None);
    let set = report(
        &[
            // As the shell expands `s.jsonl*`: newest first.
            dir.path("s.jsonl").to_str().unwrap(),
            dir.path("s.jsonl.1").to_str().unwrap(),
            dir.path("s.jsonl.2.gz").to_str().unwrap(),
            "--width",
            "100",
        ],
        None,
    );
    assert!(
        set.status.success(),
        "{}",
        String::from_utf8_lossy(&set.stderr)
    );
    let (one, set) = (stdout(&one), stdout(&set));
    assert_eq!(sections(&set), sections(&one));
    let header = flat(&set[..set.find("── STALL EPISODES").unwrap()]);
    assert!(
        header.contains("files 3 files, in stream order:")
            && header.contains("s.jsonl.2.gz (run file 0); "),
        "{header}"
    );
    assert!(
        header.contains("2 files begin without a `start` record"),
        "{header}"
    );
}

#[test]
fn what_a_set_cannot_be_is_one_line() {
    let dir = Scratch::new();
    let text = recorded();
    let a = dir.write("a.jsonl", &text);
    let b = dir.write(
        "b.jsonl",
        &text.replace("\"host\":\"vm\"", "\"host\":\"db-02\""),
    );
    let line = one_line_error(&report(&[], None));
    assert!(line.contains("no stream given to report"), "{line}");
    let line = one_line_error(&report(&[a.to_str().unwrap(), b.to_str().unwrap()], None));
    assert!(
        line.contains("from 2 hosts") && line.contains("report each host's files"),
        "{line}"
    );
    let absent = dir.path("a.jsonl.1");
    let line = one_line_error(&report(
        &[a.to_str().unwrap(), absent.to_str().unwrap()],
        None,
    ));
    assert!(
        line.contains("cannot read") && line.contains("a.jsonl.1"),
        "{line}"
    );
}

fn one_line_error(out: &Output) -> String {
    assert_eq!(out.status.code(), Some(1), "exit status: {out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert_eq!(stderr.lines().count(), 1, "one line expected: {stderr:?}");
    assert!(stderr.starts_with("stalltrace: "), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing printed on error");
    stderr
}

#[test]
fn what_cannot_be_reported_is_one_line_naming_the_problem_and_the_fix() {
    let dir = Scratch::new();
    let mut start: Value = serde_json::from_str(recorded().lines().next().unwrap()).unwrap();
    start["schema"] = json!(4);
    start["version"] = json!("4.0.0");
    let cases: Vec<(PathBuf, &[&str])> = vec![
        (
            dir.path("absent.jsonl"),
            &["cannot read", "No such file", "`-` reads stdin"],
        ),
        (
            dir.write("empty.jsonl", ""),
            &["is empty", "stalltrace run --out"],
        ),
        (
            dir.write("notes.txt", "some notes\nnot a stream\n"),
            &["is not JSON lines (line 1", "stalltrace run --out"],
        ),
        (
            dir.write(
                "other.jsonl",
                "{\"type\": \"block\"}\n{\"level\": \"info\"}\n",
            ),
            &["no `start` record", "from its first line"],
        ),
        (
            dir.write("newer.jsonl", &format!("{start}\n")),
            &[
                "record schema 4 (by stalltrace 4.0.0)",
                "reads schemas 1 to 3",
                "report it with stalltrace 4.0.0",
            ],
        ),
        (dir.0.clone(), &["cannot read", "Is a directory"]),
    ];
    for (path, needles) in cases {
        let line = one_line_error(&report(&[path.to_str().unwrap()], None));
        for n in needles {
            assert!(line.contains(n), "{}: {n:?} not in {line}", path.display());
        }
    }
    // An unwritable page fails before the report is printed.
    let input = dir.write("ok.jsonl", &recorded());
    let line = one_line_error(&report(
        &[input.to_str().unwrap(), "--html", "/nonexistent-dir/x.html"],
        None,
    ));
    assert!(
        line.contains("cannot write /nonexistent-dir/x.html") && line.contains("--html"),
        "{line}"
    );
    // A bad flag is a usage error: exit 2.
    let out = report(&[input.to_str().unwrap(), "--width", "5"], None);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--width"));
}

// ---- the page in a browser ---------------------------------------------------------

/// Chromium, or `None` (locally) when it is not installed. Under CI it must be.
fn chromium() -> Option<PathBuf> {
    let found = ["chromium", "chromium-browser"].iter().find_map(|name| {
        std::env::var_os("PATH").and_then(|paths| {
            std::env::split_paths(&paths)
                .map(|d| d.join(name))
                .find(|p| p.is_file())
        })
    });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "chromium is not installed: `cargo xtask setup` installs it (CI never skips this test)"
        );
        eprintln!(
            "SKIPPED: chromium is not installed (`cargo xtask setup` installs it); CI fails here instead"
        );
    }
    found
}

/// What Chromium made of a page: the DOM after scripts ran, and every console
/// line (the page logs nothing itself, so any is a script error or a
/// Content-Security-Policy violation, e.g. a blocked fetch).
struct Loaded {
    dom: String,
    console: Vec<String>,
}

fn load(chromium: &Path, page: &Path) -> Loaded {
    let profile = Scratch::new();
    let mut child = Command::new(chromium)
        .args([
            "--headless",
            "--no-sandbox", // as root
            "--disable-gpu",
            "--enable-logging=stderr",
            "--v=0",
            "--virtual-time-budget=3000",
            // Chromium's own background requests (updates, sync) must not leave
            // the machine: nothing resolves, and they are turned off.
            "--host-resolver-rules=MAP * ~NOTFOUND",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-extensions",
        ])
        .arg(format!("--user-data-dir={}", profile.0.display()))
        .arg("--dump-dom")
        .arg(format!("file://{}", page.display()))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run chromium");
    let (mut so, mut se) = (child.stdout.take().unwrap(), child.stderr.take().unwrap());
    let out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = Instant::now() + Duration::from_secs(90);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("chromium did not finish within 90 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let stderr = err.join().unwrap();
    Loaded {
        dom: out.join().unwrap(),
        console: stderr
            .lines()
            .filter(|l| l.contains(":CONSOLE") || l.contains("Uncaught"))
            .map(String::from)
            .collect(),
    }
}

fn write_page(dir: &Scratch, lines: &[String]) -> PathBuf {
    let input = dir.write("run.jsonl", &(lines.join("\n") + "\n"));
    let html = dir.path("run.html");
    let out = report(
        &[input.to_str().unwrap(), "--html", html.to_str().unwrap()],
        None,
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    html
}

#[test]
fn the_page_loads_in_chromium_without_errors_and_shows_every_chart() {
    let Some(chromium) = chromium() else { return };
    let dir = Scratch::new();
    let page = write_page(&dir, &stream_with_episodes());
    let loaded = load(&chromium, &page);
    assert!(loaded.console.is_empty(), "console: {:#?}", loaded.console);
    let dom = &loaded.dom;
    // The page's script ran to its end.
    assert!(
        dom.contains("<body data-ready=\"1\">"),
        "script did not run"
    );
    // A heatmap per disk op with I/O (loop0 read/write/flush/other, loop1 read)
    // and per interface with qdisc timing (lab-a, lab-b).
    assert_eq!(dom.matches("<svg class=\"heatmap\"").count(), 7);
    for attrs in [
        "data-dev=\"loop1\" data-op=\"read\"",
        "data-iface=\"lab-a\"",
    ] {
        assert!(dom.contains(attrs), "no heatmap with {attrs}");
    }
    assert!(
        dom.matches("class=\"cell\"").count() > 100,
        "heatmaps are empty"
    );
    assert_eq!(dom.matches("<rect class=\"episode ").count(), 4);
    assert_eq!(dom.matches("<tr class=\"episode-row").count(), 4);
    assert!(dom.contains("id=\"episode-row-2\""));
    assert!(dom.contains("<table id=\"sessions\""));
    assert_eq!(dom.matches("<tr class=\"session\"").count(), 8);
    assert_eq!(dom.matches("<svg class=\"flow\"").count(), 1);
}

#[test]
fn the_chromium_check_catches_a_script_error_and_a_fetch() {
    let Some(chromium) = chromium() else { return };
    let dir = Scratch::new();
    let page = write_page(&dir, &stream_with_episodes());
    let html = std::fs::read_to_string(&page).unwrap();
    let nonce = html
        .split("<script nonce=\"")
        .nth(1)
        .and_then(|s| s.split('"').next())
        .unwrap()
        .to_string();
    // A script error in a script the page allows, and a fetch it forbids: the
    // same check as above must see both.
    let broken = html.replace(
        "</body>",
        &format!("<script nonce=\"{nonce}\">null.f();</script><img src=\"http://stalltrace.invalid/x.png\"></body>"),
    );
    let injected = dir.write("injected.html", &broken);
    let loaded = load(&chromium, &injected);
    assert!(
        loaded
            .console
            .iter()
            .any(|l| l.contains("Uncaught TypeError")),
        "a script error went unnoticed: {:#?}",
        loaded.console
    );
    assert!(
        loaded
            .console
            .iter()
            .any(|l| l.contains("stalltrace.invalid") && l.contains("Content Security Policy")),
        "a fetch went unnoticed: {:#?}",
        loaded.console
    );
}
