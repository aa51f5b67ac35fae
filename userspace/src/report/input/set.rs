//! A rotated set: `stalltrace report /var/log/stalltrace.jsonl*`, whose files
//! the shell gives in name order (`FILE`, `FILE.1`, `FILE.10.gz`, `FILE.2.gz`),
//! not stream order. Each file is placed by its first record: by the run it
//! belongs to (`run`, schema 2), the runs in time order, then by its first
//! seqno within the run. Schema 1 files carry no run id and are placed by
//! their first timestamp. The files are then read one after another into one
//! report, as if they were one stream. A schema 2 set that holds no `start`
//! at all (copytruncate rotated it away) is reported from what its records
//! say (see `ReportBuilder::adopt_run`).
//!
//! Placing a file reads only its first lines, so a set of any size is read in
//! the memory of one stream. With `--since/--until`, a file is read only when
//! its span (its first record to the next file's) meets the window: a week of
//! daily files is not decompressed to report ten minutes of today.

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::{self, BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::{MAX_LINE, READ_BUFFER, decoded, feed, gzip_note, user_error};
use crate::error::UserError;
use crate::report::error::ReportError;
use crate::report::field;
use crate::report::health::FileRead;
use crate::report::lines::{LineCap, SkipLeadingNuls};
use crate::report::model::{Report, ReportBuilder};
use crate::report::split::{Offer, Reassembly};
use crate::report::window::Window;

/// Lines read from the head of a file to find its first record, as many as
/// the report reads before it calls a file "not JSON lines".
const HEAD_LINES: usize = 100;

/// The error for `stalltrace report` with no path.
pub fn no_path() -> UserError {
    UserError::new(
        "no stream given to report",
        "give the file `stalltrace run --out FILE` wrote, with its rotated files if any (e.g. `stalltrace report /var/log/stalltrace.jsonl*`), or `-` to read stdin",
    )
}

/// A file of the set, opened, as a buffered reader past the hole of NUL
/// bytes it may begin with (see `SkipLeadingNuls`), and that hole's size; a
/// path that cannot be opened is one line naming it.
pub fn open(path: &Path, name: &str) -> Result<(BufReader<File>, u64), UserError> {
    let mut file = File::open(path).map_err(|e| {
        let fix = if e.kind() == io::ErrorKind::NotFound {
            "check the path and its permissions (`-` reads stdin); a rotated set is given as all its files, e.g. `FILE*`"
        } else {
            "check the path and its permissions (`-` reads stdin)"
        };
        UserError::new(format!("cannot read {name}: {e}"), fix)
    })?;
    let hole = seek_past_hole(&mut file);
    Ok((BufReader::with_capacity(READ_BUFFER, file), hole))
}

/// Move `file`'s offset to its first data when it begins with a hole (a
/// sparse region, as copytruncate leaves): the hole's bytes, without reading
/// them. 0 when it begins with data, or the file system cannot tell.
fn seek_past_hole(file: &mut File) -> u64 {
    use std::io::Seek;
    use std::os::fd::AsRawFd;
    // SAFETY: lseek on a descriptor this function's caller owns; it moves
    // only the offset, which is then read from there.
    let data = unsafe { libc::lseek(file.as_raw_fd(), 0, libc::SEEK_DATA) };
    if data >= 0 {
        return data as u64;
    }
    // ENXIO: no data at all, a file that is one hole: read from its end.
    // Anything else (a file system without SEEK_DATA): the offset did not
    // move, and the reader skips NULs itself.
    if io::Error::last_os_error().raw_os_error() == Some(libc::ENXIO) {
        return file.seek(io::SeekFrom::End(0)).unwrap_or(0);
    }
    0
}

/// What a file's first record says about where the file goes.
#[derive(Debug, Default)]
struct Head {
    /// Nothing but blank lines.
    empty: bool,
    /// A record was found (the fields below are its own).
    found: bool,
    kind: String,
    host: Option<String>,
    run: Option<String>,
    first_seqno: Option<u64>,
    first_ts: Option<i64>,
    /// The file's first record when it is a `start` (put together when it
    /// was written in parts): a file of the same run read before it may need it.
    start: Option<Value>,
}

struct SetFile {
    path: PathBuf,
    name: String,
    head: Head,
}

/// Read the first record of a file (and the rest of it when it is a `start`
/// written in parts).
fn head_of(path: &Path, name: &str) -> Result<Head, UserError> {
    let (reader, hole) = open(path, name)?;
    let not_read = |e: io::Error| ReportError::Read(e).to_user_error(name);
    let source = decoded(reader).map_err(not_read)?;
    let mut lines = LineCap::new(SkipLeadingNuls::new(source, hole), MAX_LINE);
    let mut head = Head::default();
    let mut reassembly = Reassembly::default();
    let mut buf = Vec::new();
    let (mut line_no, mut non_blank) = (0, 0);
    let mut first_bad = None;
    loop {
        buf.clear();
        let n = lines
            .read_until(b'\n', &mut buf)
            .map_err(|e| user_error(ReportError::Read(e), None, name))?;
        if n == 0 {
            break;
        }
        line_no += 1;
        let text = String::from_utf8_lossy(&buf);
        if text.trim().is_empty() {
            continue;
        }
        non_blank += 1;
        let record = serde_json::from_str::<Value>(text.trim())
            .ok()
            .filter(|v| field::kind(v).is_some());
        let Some(r) = record else {
            first_bad.get_or_insert(line_no);
            if head.found || non_blank >= HEAD_LINES {
                break;
            }
            continue;
        };
        if !head.found {
            head.found = true;
            head.kind = field::kind(&r).unwrap_or_default().to_string();
            head.host = field::host(&r).map(String::from);
            head.run = field::run(&r).map(String::from);
            head.first_seqno = field::seqno(&r);
            head.first_ts = field::ts_us(&r);
            if head.kind != "start" {
                break;
            }
        }
        match reassembly.offer(&r, Default::default(), text.len()) {
            Offer::Whole => head.start = Some(r),
            Offer::Complete(whole) => head.start = Some(whole),
            Offer::Held => continue,
        }
        break;
    }
    match (non_blank, head.found, first_bad) {
        (0, _, _) => head.empty = true,
        (_, false, Some(line)) => {
            return Err(ReportError::NotJsonLines { line }.to_user_error(name));
        }
        _ => {}
    }
    Ok(head)
}

/// The report of a set of files, read in stream order; with a note for each
/// file whose gzip data stopped early.
pub fn read_set(
    paths: &[PathBuf],
    window: Option<Window>,
) -> Result<(Report, Vec<String>), UserError> {
    if let Some(stdin) = paths.iter().find(|p| p.as_os_str() == "-") {
        return Err(UserError::new(
            format!(
                "`{}` (stdin) cannot be read together with files",
                stdin.display()
            ),
            "give the files alone, or pipe them in stream order into `stalltrace report -` (e.g. `zcat -f FILE.2.gz FILE.1 FILE | stalltrace report -`)",
        ));
    }
    let mut files = Vec::with_capacity(paths.len());
    for path in paths {
        let name = path.display().to_string();
        let head = head_of(path, &name)?;
        files.push(SetFile {
            path: path.clone(),
            name,
            head,
        });
    }
    if files.iter().all(|f| f.head.empty) {
        return Err(UserError::new(
            format!("{} are all empty", set_name(&files)),
            "give the files `stalltrace run --out FILE` wrote (a file logrotate has just created is empty until the run writes to it)",
        ));
    }
    one_host(&files)?;
    in_stream_order(&mut files);
    let mut builder = ReportBuilder::within(window);
    let mut notes = Vec::new();
    // Runs of the files not read; `None` stands for a schema 1 run, which has no id.
    let mut other_runs: BTreeSet<Option<String>> = BTreeSet::new();
    // Set once a file of another run comes: the files after it are later runs'.
    let mut later_runs = false;
    let mut outside = window.map(|w| OutsideWindow::of(&files, w));
    for (i, f) in files.iter().enumerate() {
        if f.head.empty {
            builder.skip_file(&f.name, FileRead::Empty);
            continue;
        }
        if outside.as_mut().is_some_and(|o| o.skips(i)) {
            builder.skip_file(&f.name, FileRead::OutsideWindow);
            continue;
        }
        // With a window, a later run that begins before its end is read:
        // it replaces the one read so far (`ReportBuilder` says why).
        let replaces = window.is_some_and(|w| {
            f.head.kind == "start" && f.head.first_ts.is_some_and(|t| t <= w.until_us)
        });
        later_runs = later_runs
            || builder.is_done()
            || (builder.has_run()
                && !replaces
                && builder.is_another_run(&f.head.kind, f.head.run.as_deref()));
        if later_runs {
            builder.skip_file(&f.name, FileRead::Skipped);
            if f.head.run.is_some() {
                other_runs.insert(f.head.run.clone());
            } else if f.head.kind == "start" {
                // A schema 1 `start`: a run of its own each.
                other_runs.insert(Some(format!("schema 1 run in {}", f.name)));
            }
            continue;
        }
        if !builder.has_run() && f.head.start.is_none() {
            // The part of a copytruncate rotation placed first: its run's
            // `start` is at the head of a later file of the same run.
            let start = files[i + 1..]
                .iter()
                .filter(|later| later.head.run.is_some() && later.head.run == f.head.run)
                .find_map(|later| later.head.start.as_ref());
            if let Some(start) = start {
                builder
                    .prime_start(start)
                    .map_err(|e| user_error(e, None, &f.name))?;
            }
        }
        let (reader, hole) = open(&f.path, &f.name)?;
        let stopped = match feed(&mut builder, reader, &f.name, hole) {
            Ok(stopped) => stopped.map(|(e, at)| (e.to_string(), at)),
            Err((e, stopped)) => {
                let stopped = stopped.map(|(e, at)| (e.to_string(), at));
                return Err(user_error(e, stopped.as_ref(), &f.name));
            }
        };
        if let Some((e, at)) = stopped {
            notes.push(gzip_note(&f.name, &e, at));
        }
    }
    if builder.is_done() {
        // The run that began mid-file is another, whether or not files of it were skipped.
        let next = builder.next_run_id().map(str::to_string);
        other_runs.insert(next.or_else(|| Some("the run that begins mid-file".into())));
    }
    builder.set_other_runs(other_runs.len());
    let report = builder
        .build()
        .map_err(|e| user_error(e, None, &set_name(&files)))?;
    Ok((report, notes))
}

/// Which files of a set, in stream order, hold nothing of a window.
struct OutsideWindow {
    window: Window,
    /// Each file's first timestamp, and the next file's: its span.
    spans: Vec<(Option<i64>, Option<i64>)>,
    /// A file that begins after the window has been read.
    read_one_after: bool,
}

impl OutsideWindow {
    fn of(files: &[SetFile], window: Window) -> Self {
        let firsts: Vec<Option<i64>> = files.iter().map(|f| f.head.first_ts).collect();
        let spans = (0..files.len())
            .map(|i| (firsts[i], firsts[i + 1..].iter().find_map(|t| *t)))
            .collect();
        Self {
            window,
            spans,
            read_one_after: false,
        }
    }

    /// Whether file `i` (read in order) can be left unread. A file whose
    /// next one begins before the window holds only earlier records (the
    /// `closed` record of an episode that ran into the window is in a later
    /// file). Of the files that begin after the window, the first is read:
    /// it holds the `closed` records of the episodes still open when the
    /// window ended.
    fn skips(&mut self, i: usize) -> bool {
        let (first, next) = self.spans[i];
        if next.is_some_and(|n| n < self.window.since_us) {
            return true;
        }
        if first.is_some_and(|t| t > self.window.until_us) {
            return std::mem::replace(&mut self.read_one_after, true);
        }
        false
    }
}

/// The set as an error names it.
fn set_name(files: &[SetFile]) -> String {
    let names: Vec<&str> = files.iter().take(3).map(|f| f.name.as_str()).collect();
    format!(
        "the {} files given ({}{})",
        files.len(),
        names.join(", "),
        if files.len() > 3 { ", ..." } else { "" }
    )
}

/// A report is of one host's stream: files of two hosts are a mistake (two
/// hosts' logs copied into one directory), said before anything is read.
fn one_host(files: &[SetFile]) -> Result<(), UserError> {
    let mut by_host: BTreeMap<&str, &str> = BTreeMap::new();
    for f in files {
        if let Some(host) = f.head.host.as_deref() {
            by_host.entry(host).or_insert(&f.name);
        }
    }
    if by_host.len() < 2 {
        return Ok(());
    }
    let hosts: Vec<String> = by_host
        .iter()
        .take(4)
        .map(|(host, file)| format!("{} in {file}", super::quoted(host)))
        .collect();
    Err(UserError::new(
        format!(
            "the files given are from {} hosts ({}{}): a report covers one host's stream",
            by_host.len(),
            hosts.join(", "),
            if by_host.len() > 4 { ", ..." } else { "" }
        ),
        "report each host's files on their own, e.g. `stalltrace report /var/log/stalltrace.jsonl*` with one host's copies",
    ))
}

/// Stream order: runs by their first timestamp, then each run's files by
/// first seqno (by first timestamp without one). A file without a run id
/// (schema 1) is a run of its own here, so such files go by their time.
fn in_stream_order(files: &mut [SetFile]) {
    let mut run_began: BTreeMap<String, i64> = BTreeMap::new();
    for f in files.iter() {
        if let Some(run) = &f.head.run {
            let ts = f.head.first_ts.unwrap_or(i64::MAX);
            let began = run_began.entry(run.clone()).or_insert(ts);
            *began = (*began).min(ts);
        }
    }
    // Stable: identical files (one given twice) keep the order given, and
    // the second is read as repeats.
    files.sort_by_cached_key(|f| {
        let ts = f.head.first_ts.unwrap_or(i64::MAX);
        let run_ts = f
            .head
            .run
            .as_ref()
            .and_then(|r| run_began.get(r).copied())
            .unwrap_or(ts);
        (
            run_ts,
            f.head.run.clone(),
            f.head.first_seqno.unwrap_or(u64::MAX),
            ts,
        )
    });
}
