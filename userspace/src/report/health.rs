//! Whether the stream is whole: the report's "stream" lines (text) and the
//! page header's `stream` entry. Everything here is counted while reading, in
//! memory bounded by the lists' caps, and said as one sentence per problem.

use std::collections::BTreeMap;

use super::lines::LineRef;
use super::run::RunInfo;
use super::sequence::{SeqRange, SeqRanges, Sequence};
use super::split::SplitHealth;
use super::time::{clock, thousands};

/// How much of a file the report used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileRead {
    /// Read to its end.
    Whole,
    /// Nothing in it (a file logrotate just created).
    Empty,
    /// Read until another run began in it.
    UntilNextRun,
    /// Not read: it holds only later runs.
    Skipped,
    /// Not read: it holds nothing of the `--since/--until` window.
    OutsideWindow,
    /// Read, and left out: it holds only an earlier run than the last one to
    /// begin in the `--since/--until` window.
    EarlierRun,
}

impl FileRead {
    /// Whether any of the file was read.
    pub fn was_read(self) -> bool {
        matches!(self, FileRead::Whole | FileRead::UntilNextRun)
    }
}

/// One file of the stream, in stream order.
#[derive(Clone, Debug, PartialEq)]
pub struct StreamFile {
    pub name: String,
    pub read: FileRead,
    /// Non-empty lines read from it.
    pub lines: usize,
    /// Its first record is a `start`: the run's first, or the repeat that
    /// begins each new file of a run.
    pub began_with_start: bool,
    /// That start's `file`: the file's ordinal in its run (0: the run's first).
    pub run_file: Option<u64>,
    /// First and last seqno read from it.
    pub seqnos: Option<(u64, u64)>,
    /// NUL bytes it began with, skipped: the hole copytruncate leaves in a
    /// file whose writer did not append.
    pub hole_bytes: u64,
}

impl StreamFile {
    pub fn new(name: String, read: FileRead) -> Self {
        Self {
            name,
            read,
            lines: 0,
            began_with_start: false,
            run_file: None,
            seqnos: None,
            hole_bytes: 0,
        }
    }
}

/// Whether the stream is whole.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct StreamHealth {
    /// Non-empty lines read (`from_reader`) or records given (`from_records`).
    pub lines: usize,
    /// Lines in the middle that were not JSON records, skipped.
    pub bad_lines: usize,
    /// Where the first few of those are.
    pub first_bad_lines: Vec<LineRef>,
    /// The last line stops mid-record (no newline, not JSON): an interrupted write.
    pub truncated_last_line: bool,
    pub has_stop: bool,
    /// `(type, written according to stop.records, found here)` where fewer were found.
    pub missing: Vec<(String, u64, u64)>,
    /// Record types this version does not know, and how many were ignored.
    pub unknown_types: BTreeMap<String, u64>,
    /// Records of a known type that do not fit it (see `typed`), by type: ignored.
    pub unreadable: BTreeMap<String, u64>,
    /// Records before the `start` record, ignored.
    pub before_start: usize,
    /// Where another run begins; everything from it is ignored.
    pub next_run: Option<LineRef>,
    /// The files read (one, unnamed, for a single stream), in stream order,
    /// then those skipped.
    pub files: Vec<StreamFile>,
    /// Runs in the files skipped, besides the one reported (0 when none were skipped).
    pub other_runs: usize,
    /// `--since/--until`: runs that overlap the window but began before the
    /// run reported, the last one to begin in it.
    pub earlier_runs: usize,
    /// Seqnos missing or read twice.
    pub sequence: Sequence,
    /// Records written in parts, and sets of parts that were incomplete.
    pub split: SplitHealth,
}

/// Lists in a sentence stop after this many items.
const LISTED: usize = 5;

impl StreamHealth {
    /// `line 12`, or `FILE line 12` when the stream is several files.
    pub fn at(&self, at: LineRef) -> String {
        match self.files.get(at.file) {
            Some(f) if self.files.len() > 1 => format!("{} line {}", f.name, at.line),
            _ => format!("line {}", at.line),
        }
    }

    fn file_name(&self, index: usize) -> &str {
        self.files.get(index).map_or("?", |f| f.name.as_str())
    }

    /// The files of a set in stream order, in one sentence; `None` for a single file.
    pub fn files_summary(&self) -> Option<String> {
        if self.files.len() < 2 {
            return None;
        }
        const SHOWN: usize = 12;
        let mut parts: Vec<String> = self
            .files
            .iter()
            .take(SHOWN)
            .map(|f| {
                let mut what = Vec::new();
                if let Some(n) = f.run_file {
                    what.push(format!("run file {n}"));
                } else if f.read == FileRead::Whole && !f.began_with_start {
                    what.push("no start record".to_string());
                }
                if let Some((first, last)) = f.seqnos {
                    what.push(format!("seqno {first}–{last}"));
                }
                match f.read {
                    FileRead::Whole => {}
                    FileRead::Empty => what.push("empty".into()),
                    FileRead::UntilNextRun => what.push("up to the next run".into()),
                    FileRead::Skipped => what.push("not read: a later run".into()),
                    FileRead::OutsideWindow => {
                        what.push("not read: outside --since/--until".into())
                    }
                    FileRead::EarlierRun => what.push("an earlier run, not reported".into()),
                }
                if what.is_empty() {
                    f.name.clone()
                } else {
                    format!("{} ({})", f.name, what.join(", "))
                }
            })
            .collect();
        if self.files.len() > SHOWN {
            parts.push(format!("and {} more", self.files.len() - SHOWN));
        }
        Some(format!(
            "{} files, in stream order: {}",
            self.files.len(),
            parts.join("; ")
        ))
    }

    /// `stop.records` (`written`) against the records found, type by type,
    /// into `missing`. A stream that begins after seqno 0 lacks records of
    /// types no one can tell (the run's `start` among them): a shortfall
    /// that those and the seqno gaps account for (each said on its own) is
    /// no alarm; one beyond them is listed.
    pub fn compare_written(
        &mut self,
        written: &BTreeMap<String, u64>,
        found: &BTreeMap<String, u64>,
    ) {
        let short: Vec<(String, u64, u64)> = written
            .iter()
            .filter_map(|(kind, &w)| {
                let f = found.get(kind).copied().unwrap_or(0);
                (f < w).then(|| (kind.clone(), w, f))
            })
            .collect();
        let before_first = self.sequence.first.unwrap_or(0);
        let shortfall: u64 = short.iter().map(|(_, w, f)| w - f).sum();
        if before_first > 0
            && shortfall <= before_first.saturating_add(self.sequence.missing.records)
        {
            return;
        }
        self.missing = short;
    }

    /// What is wrong with the stream, one sentence each; empty when it is whole.
    pub fn warnings(&self, run: &RunInfo) -> Vec<String> {
        let mut w = Vec::new();
        if run.inferred {
            w.push(format!(
                "the run's `start` record is not in {}: this report is built from what the records say (host, run id, schema, times; the interval from their `interval_ms`; the families from the record types found, inferred); the run's kernel, stalltrace version, hooks, filters and thresholds are unknown",
                match self.files.as_slice() {
                    [f] if !f.name.is_empty() && f.name != "stdin" => "the file given",
                    [_, _, ..] => "the files given",
                    _ => "the stream",
                }
            ));
        }
        if !self.has_stop {
            w.push(format!(
                "no `stop` record: the recording was cut short (killed, crashed, or still being written); this report covers it up to {}",
                clock(run.end_us)
            ));
        }
        if self.truncated_last_line {
            w.push("the last line stops mid-record (an interrupted write): it was skipped".into());
        }
        if self.bad_lines > 0 {
            let at: Vec<String> = self.first_bad_lines.iter().map(|&l| self.at(l)).collect();
            w.push(format!(
                "{} line{} in the middle of the stream {} not a JSON record ({}{}): skipped",
                self.bad_lines,
                plural(self.bad_lines),
                if self.bad_lines == 1 { "is" } else { "are" },
                at.join(", "),
                if self.bad_lines > at.len() {
                    ", ..."
                } else {
                    ""
                }
            ));
        }
        if !self.missing.is_empty() {
            let parts: Vec<String> = self
                .missing
                .iter()
                .map(|(t, written, found)| format!("{t} {found} of {written}"))
                .collect();
            w.push(format!(
                "fewer records than the run wrote (found of written, per `stop`): {}",
                parts.join(", ")
            ));
        }
        if self.before_start > 0 {
            w.push(format!(
                "{} record{} before the `start` record ignored",
                self.before_start,
                plural(self.before_start)
            ));
        }
        self.set_warnings(&mut w);
        self.sequence_warnings(&mut w);
        if let Some(s) = self.split.warning(|at| self.at(at)) {
            w.push(s);
        }
        self.next_run_warning(&mut w);
        w
    }

    /// Files of a set that began without their run's `start`, or with a hole.
    fn set_warnings(&self, w: &mut Vec<String>) {
        for f in self.files.iter().filter(|f| f.hole_bytes > 0) {
            w.push(format!(
                "{} begins with {} NUL bytes, skipped: the hole logrotate's copytruncate leaves in a file its writer did not append to",
                if self.files.len() > 1 { f.name.as_str() } else { "the file" },
                thousands(f.hole_bytes)
            ));
        }
        if self.files.len() < 2 {
            return;
        }
        let tails: Vec<&StreamFile> = self
            .files
            .iter()
            .filter(|f| f.read.was_read())
            .filter(|f| !f.began_with_start)
            .collect();
        if !tails.is_empty() {
            let names: Vec<String> = tails
                .iter()
                .take(LISTED)
                .map(|f| match f.seqnos {
                    Some((first, _)) => format!("{} (from seqno {first})", f.name),
                    None => f.name.clone(),
                })
                .collect();
            w.push(format!(
                "{} file{} {} without a `start` record, as the part a copytruncate rotation leaves behind does: {}{}; placed in the stream by their first record",
                tails.len(),
                plural(tails.len()),
                if tails.len() == 1 { "begins" } else { "begin" },
                names.join(", "),
                if tails.len() > LISTED { ", ..." } else { "" }
            ));
        }
    }

    fn sequence_warnings(&self, w: &mut Vec<String>) {
        let seq = &self.sequence;
        // Files left out by --since/--until before the first file read hold
        // the run's first records: they were given, not lost.
        let windowed = self
            .files
            .iter()
            .take_while(|f| !f.read.was_read())
            .any(|f| f.read == FileRead::OutsideWindow);
        if let Some(first) = seq.first.filter(|&s| s > 0 && !windowed) {
            let with = match seq.first_run_file {
                Some(n) if n > 0 => format!("it begins with the run's file {n}"),
                Some(_) => "it begins with the run's first `start`".to_string(),
                None => "it begins without the run's `start`".to_string(),
            };
            w.push(format!(
                "the run's first {} record{} (seqno 0–{}) {} not here: {with}; older rotated files were removed or not given",
                thousands(first),
                plural_u64(first),
                first - 1,
                if first == 1 { "is" } else { "are" }
            ));
        }
        if seq.missing_run_files.records > 0 {
            w.push(format!(
                "{} of the run's files {} not here ({}, by the `file` of their `start` records): give every rotated file, e.g. `stalltrace report FILE*`",
                seq.missing_run_files.records,
                if seq.missing_run_files.records == 1 {
                    "is"
                } else {
                    "are"
                },
                ranges_text(&seq.missing_run_files, |r| if r.first == r.last {
                    format!("file {}", r.first)
                } else {
                    format!("files {}–{}", r.first, r.last)
                })
            ));
        }
        if seq.missing.records > 0 {
            let listed = ranges_text(&seq.missing, |r| {
                format!(
                    "seqno {} missing ({} record{}, {})",
                    span(r),
                    thousands(r.records()),
                    plural_u64(r.records()),
                    self.gap_place(r)
                )
            });
            w.push(format!(
                "{listed}: {} record{} missing in all, {}",
                thousands(seq.missing.records),
                plural_u64(seq.missing.records),
                gap_cause(seq.missing.records, seq.queue_full)
            ));
        }
        if seq.repeated.records > 0 {
            let listed = ranges_text(&seq.repeated, |r| {
                format!(
                    "seqno {} ({} record{}, from {})",
                    span(r),
                    thousands(r.records()),
                    plural_u64(r.records()),
                    self.at(r.at)
                )
            });
            w.push(format!(
                "{} record{} read again and skipped, as a file given twice or the overlap of a copytruncate rotation would be: {listed}",
                thousands(seq.repeated.records),
                plural_u64(seq.repeated.records),
            ));
        }
    }

    /// Where a gap is: between two files, or inside one before a line.
    fn gap_place(&self, r: &SeqRange) -> String {
        // The file read before this one (empty files in between read nothing).
        let before = self.files[..r.at.file.min(self.files.len())]
            .iter()
            .rposition(|f| f.lines > 0);
        if r.between_files
            && let Some(before) = before
        {
            format!(
                "between {} and {}",
                self.file_name(before),
                self.file_name(r.at.file)
            )
        } else {
            format!("before {}", self.at(r.at))
        }
    }

    fn next_run_warning(&self, w: &mut Vec<String>) {
        let skipped: Vec<&StreamFile> = self
            .files
            .iter()
            .filter(|f| f.read == FileRead::Skipped)
            .collect();
        let not_read = if skipped.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = skipped
                .iter()
                .take(LISTED)
                .map(|f| f.name.as_str())
                .collect();
            format!(
                "; {} file{} of {} other run{} not read ({}{})",
                skipped.len(),
                plural(skipped.len()),
                self.other_runs.max(1),
                plural(self.other_runs.max(1)),
                names.join(", "),
                if skipped.len() > LISTED { ", ..." } else { "" }
            )
        };
        if self.earlier_runs > 0 {
            w.push(format!(
                "{} earlier run{} overlap{} the window: only the last run to begin in it is reported (an --until before that run's start reports an earlier one)",
                self.earlier_runs,
                plural(self.earlier_runs),
                if self.earlier_runs == 1 { "s" } else { "" },
            ));
        }
        match self.next_run {
            Some(at) => w.push(format!(
                "another run starts at {}: only the first run is reported{not_read} (give another run's files alone, or split the file, to report it)",
                self.at(at)
            )),
            None if !skipped.is_empty() => w.push(format!(
                "only the first run is reported{not_read} (give another run's files alone to report it)"
            )),
            None => {}
        }
    }
}

/// Why seqnos are missing, given how many the output queue says it dropped.
fn gap_cause(missing: u64, queue_full: u64) -> String {
    const BETWEEN_FILES: &str = "lost between files (a rotated file not given, or records written between logrotate's copy and truncate) or cut out of a file";
    if queue_full == missing {
        "all of them the records the output queue dropped (`lost` output.queue_full)".into()
    } else if queue_full == 0 {
        format!(
            "none of them dropped by the output queue (no output.queue_full in `lost`): {BETWEEN_FILES}"
        )
    } else if queue_full < missing {
        format!(
            "{} of them the output queue's drops (`lost` output.queue_full), {} unexplained: {BETWEEN_FILES}",
            thousands(queue_full),
            thousands(missing - queue_full)
        )
    } else {
        format!(
            "all of them can be the output queue's drops (`lost` output.queue_full counts {}: the other {} fall before the first or after the last record here)",
            thousands(queue_full),
            thousands(queue_full - missing)
        )
    }
}

/// The listed ranges joined, and how many more there are.
fn ranges_text(ranges: &SeqRanges, each: impl Fn(&SeqRange) -> String) -> String {
    let mut parts: Vec<String> = ranges.listed.iter().map(each).collect();
    let more = ranges.ranges - ranges.listed.len() as u64;
    if more > 0 {
        parts.push(format!("and {more} more range{}", plural_u64(more)));
    }
    parts.join("; ")
}

fn span(r: &SeqRange) -> String {
    if r.first == r.last {
        r.first.to_string()
    } else {
        format!("{}–{}", r.first, r.last)
    }
}

pub fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

fn plural_u64(n: u64) -> &'static str {
    if n == 1 { "" } else { "s" }
}
