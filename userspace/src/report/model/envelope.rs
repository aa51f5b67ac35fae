//! The builder's reading of the stream as a whole, before any record's own
//! fields: which file and line a record is at, whether it belongs to the run
//! being reported (`run` in schema 2; a new `start` in schema 1), whether its
//! seqno was read before, and putting records written in parts back together.
//! Only then does `ReportBuilder::whole` see the record.

use std::io::BufRead;

use serde_json::Value;

use super::{GIVE_UP_AFTER_BAD_LINES, ReportBuilder};
use crate::report::error::ReportError;
use crate::report::field;
use crate::report::health::{FileRead, StreamFile};
use crate::report::lines::LineRef;
use crate::report::sequence::Seen;
use crate::report::split::Offer;

impl ReportBuilder {
    /// Read the next file of the stream, named `name` in the report (files
    /// are given in stream order). Lines are numbered from 1 in each file.
    pub fn read_file(&mut self, name: &str, reader: impl BufRead) -> Result<(), ReportError> {
        self.begin_file(name);
        self.read_lines(reader)
    }

    /// A file of the set that is not read: empty, or of a later run. Listed
    /// in stream order with those read.
    pub fn skip_file(&mut self, name: &str, read: FileRead) {
        self.health.files.push(StreamFile::new(name.into(), read));
    }

    /// NUL bytes skipped at the head of the file just read (a copytruncate hole).
    pub fn file_hole(&mut self, bytes: u64) {
        if bytes > 0 {
            self.current_file().hole_bytes = bytes;
        }
    }

    /// Runs in the files skipped besides the one reported, for the report to say.
    pub fn set_other_runs(&mut self, runs: usize) {
        self.health.other_runs = runs;
    }

    /// The run's `start` has been read (or primed).
    pub fn has_run(&self) -> bool {
        self.run.is_some()
    }

    /// Another run began (the rest of the stream is not read).
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// `run` of the record where another run began, when it had one.
    pub fn next_run_id(&self) -> Option<&str> {
        self.next_run_id.as_deref()
    }

    /// Take the run's `start` from a later file before reading a file of the
    /// same run that has none (the part a copytruncate rotation leaves behind,
    /// when it comes first): its records then count for the run.
    pub fn prime_start(&mut self, start: &Value) -> Result<(), ReportError> {
        if self.run.is_some() {
            return Ok(());
        }
        self.run = Some(crate::report::run::run_info(start)?);
        self.run_id = field::run(start).map(String::from);
        self.primed = true;
        self.health.sequence.began_without_start();
        Ok(())
    }

    /// A record read before any `start`: when it says which run it is of
    /// (schema 2), that run is reported from what its records say, its
    /// `start` being in none of the files (rotated away); true then. A
    /// schema 1 record cannot say, and is counted before the start.
    fn adopt_run(&mut self, r: &Value) -> Result<bool, ReportError> {
        let Some(run) = crate::report::run::inferred_run_info(r)? else {
            return Ok(false);
        };
        self.run_id = run.run_id.clone();
        self.run = Some(run);
        self.primed = true;
        self.health.sequence.began_without_start();
        Ok(true)
    }

    fn begin_file(&mut self, name: &str) {
        self.health
            .files
            .push(StreamFile::new(name.into(), FileRead::Whole));
        self.file = self.health.files.len() - 1;
        self.first_record_in_file = true;
        self.first_seqno_in_file = true;
        // A record cut at the end of an earlier file is a bad line in the
        // middle of the stream, not the stream's end.
        if let Some(at) = self.cut_line.take() {
            self.health.truncated_last_line = false;
            self.note_bad(at);
        }
    }

    /// The file being read (created for a stream of one unnamed file).
    pub(super) fn current_file(&mut self) -> &mut StreamFile {
        if self.health.files.is_empty() {
            self.health
                .files
                .push(StreamFile::new(String::new(), FileRead::Whole));
            self.first_record_in_file = true;
            self.first_seqno_in_file = true;
        }
        let i = self.file.min(self.health.files.len() - 1);
        &mut self.health.files[i]
    }

    /// Every line of the current file, until its end or another run's start.
    pub(super) fn read_lines(&mut self, mut reader: impl BufRead) -> Result<(), ReportError> {
        let mut buf = Vec::new();
        let mut n = 0;
        while !self.done {
            buf.clear();
            if reader
                .read_until(b'\n', &mut buf)
                .map_err(ReportError::Read)?
                == 0
            {
                break;
            }
            n += 1;
            let terminated = buf.last() == Some(&b'\n');
            // Invalid UTF-8 is a bad line like any other.
            let line = String::from_utf8_lossy(&buf);
            self.line(n, &line, terminated)?;
        }
        Ok(())
    }

    pub(super) fn line(
        &mut self,
        n: usize,
        line: &str,
        terminated: bool,
    ) -> Result<(), ReportError> {
        let line = line.trim();
        if line.is_empty() {
            return Ok(());
        }
        self.health.lines += 1;
        self.current_file().lines += 1;
        let at = LineRef {
            file: self.file,
            line: n,
        };
        match serde_json::from_str::<Value>(line) {
            Ok(v) if field::kind(&v).is_some() => {
                self.parsed += 1;
                self.record(&v, at, line.len())
            }
            _ => {
                self.first_bad_line.get_or_insert(n);
                // Only a file's last line can lack its newline: a record
                // cut mid-write, which a crash leaves behind.
                if terminated {
                    self.note_bad(at);
                } else {
                    self.health.truncated_last_line = true;
                    self.cut_line = Some(at);
                }
                if self.parsed == 0 && self.health.lines >= GIVE_UP_AFTER_BAD_LINES {
                    return Err(ReportError::NotJsonLines {
                        line: self.first_bad_line.unwrap_or(n),
                    });
                }
                Ok(())
            }
        }
    }

    /// One record as read (`bytes`: its line's length, 0 when it was not read
    /// from a line).
    pub(super) fn record(
        &mut self,
        r: &Value,
        at: LineRef,
        bytes: usize,
    ) -> Result<(), ReportError> {
        let Some(kind) = field::kind(r) else {
            self.note_bad(at);
            return Ok(());
        };
        if self.run.is_some() && self.is_another_run(kind, field::run(r)) {
            if self.replaced_by_next_run(kind, r) {
                self.begin_next_run();
                return self.record(r, at, bytes);
            }
            self.next_run_id = field::run(r).map(String::from);
            self.health.next_run = Some(at);
            self.current_file().read = FileRead::UntilNextRun;
            self.done = true;
            return Ok(());
        }
        if std::mem::take(&mut self.first_record_in_file) && kind == "start" {
            let file = self.current_file();
            file.began_with_start = true;
            file.run_file = Some(field::file(r).unwrap_or(0));
        }
        if self.run.is_none() && kind != "start" && !self.adopt_run(r)? {
            self.health.before_start += 1;
            return Ok(());
        }
        if let Some(seqno) = field::seqno(r) {
            let first_in_file = std::mem::take(&mut self.first_seqno_in_file);
            if self.health.sequence.see(seqno, at, first_in_file) == Seen::Repeat {
                return Ok(());
            }
            let file = self.current_file();
            file.seqnos = Some(file.seqnos.map_or((seqno, seqno), |(a, _)| (a, seqno)));
        }
        match self.split.offer(r, at, bytes) {
            Offer::Whole => self.whole(r, at),
            Offer::Held => Ok(()),
            Offer::Complete(whole) => self.whole(&whole, at),
        }
    }

    /// With `--since/--until`, a run that begins in the window (or before
    /// its end) replaces the one being read: looking back at the minutes
    /// before a page, the SRE wants the run that was recording then, not one
    /// the service restarted from. Without a window the first run is reported.
    fn replaced_by_next_run(&self, kind: &str, r: &Value) -> bool {
        let begins = field::ts_us(r).unwrap_or(i64::MAX);
        kind == "start" && self.window.is_some_and(|w| begins <= w.until_us)
    }

    /// Start over at the next run's `start`, keeping the list of files: those
    /// read so far are the earlier run's, and the current one goes on as the
    /// new run's.
    fn begin_next_run(&mut self) {
        let mut files = std::mem::take(&mut self.health.files);
        let earlier_runs = self.health.earlier_runs + 1;
        let (file, pushed) = (self.file, self.pushed);
        for f in &mut files[..file] {
            if f.read.was_read() {
                f.read = FileRead::EarlierRun;
            }
        }
        if let Some(current) = files.get_mut(file) {
            *current = StreamFile::new(std::mem::take(&mut current.name), FileRead::Whole);
        }
        *self = ReportBuilder::within(self.window);
        self.health.files = files;
        self.health.earlier_runs = earlier_runs;
        self.file = file;
        self.pushed = pushed;
        self.first_record_in_file = true;
        self.first_seqno_in_file = true;
    }

    /// Whether a record of type `kind` with run id `run` begins or belongs
    /// to another run than the one being reported. Schema 2 says by `run`;
    /// schema 1 has no run id, and a new `start` is a new run there.
    pub fn is_another_run(&self, kind: &str, run: Option<&str>) -> bool {
        match (self.run_id.as_deref(), run) {
            (Some(ours), Some(theirs)) => ours != theirs,
            // Without ids on both sides only a `start` can tell.
            _ => kind == "start",
        }
    }
}

#[cfg(test)]
mod tests {
    //! Hostile envelopes: the fields this module reads (`run`, `seqno`,
    //! `part`, `parts`, `split`, `file`, `type`) given any value, and records
    //! repeated, dropped or moved. Never a panic; never a record counted twice
    //! while seqnos say it was read before.

    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngSeed};
    use serde_json::{Value, json};

    use crate::report::fixtures::*;
    use crate::report::model::Report;
    use crate::report::{render_html, render_text};

    fn config(cases: u32) -> Config {
        let mut c = Config::with_cases(cases);
        if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
            c.rng_seed = RngSeed::Fixed(0x5e90_0002);
        }
        c.failure_persistence = None;
        c
    }

    /// A schema 2 run of two files with a record in three parts.
    fn stream() -> Vec<Value> {
        let read = |at: f64| {
            block(
                at,
                "sda",
                "read",
                json!([[1.024, 1.087, 5]]),
                json!([[2.0, 2.0, 5]]),
            )
        };
        let mut records = vec![start(), read(1.0), read(2.0)];
        for (i, files) in [["/a", "/b"], ["/c", "/d"], ["/e", "/f"]]
            .iter()
            .enumerate()
        {
            records.push(json!({"ts": ts(2.5), "host": HOST, "type": "sql_instance", "pid": 7,
                "files": files.iter().map(|p| json!({"path": p, "role": "data"})).collect::<Vec<_>>(),
                "part": i + 1, "parts": 3, "split": "files"}));
        }
        let mut next = start();
        next["file"] = json!(1);
        records.extend([
            next,
            read(3.0),
            stop(4.0, json!({"start": 2, "block": 3}), json!({})),
        ]);
        as_v2(&records, RUN, 0)
    }

    #[derive(Clone, Debug)]
    enum Edit {
        Field(usize, &'static str, Value),
        Repeat(usize, usize),
        Drop(usize),
        Swap(usize, usize),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        let field = prop::sample::select(vec![
            "run", "seqno", "part", "parts", "split", "file", "type",
        ]);
        let value = prop_oneof![
            Just(Value::Null),
            Just(json!(0)),
            Just(json!(1)),
            Just(json!(3)),
            Just(json!(-1)),
            Just(json!(u64::MAX)),
            Just(json!(1e300)),
            Just(json!("start")),
            Just(json!("files")),
            Just(json!(RUN)),
            Just(json!("another-run")),
            Just(json!([])),
            any::<u64>().prop_map(|n| json!(n)),
        ];
        prop_oneof![
            (any::<usize>(), field, value).prop_map(|(i, f, v)| Edit::Field(i, f, v)),
            (any::<usize>(), 1..5usize).prop_map(|(i, n)| Edit::Repeat(i, n)),
            any::<usize>().prop_map(Edit::Drop),
            (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Edit::Swap(i, j)),
        ]
    }

    proptest! {
        #![proptest_config(config(400))]
        #[test]
        fn hostile_envelopes_never_panic_nor_count_a_repeat_twice(
            edits in prop::collection::vec(edit(), 1..8),
        ) {
            let mut records = stream();
            let mut fields_edited = false;
            for e in edits {
                let n = records.len();
                match e {
                    Edit::Field(i, f, v) => {
                        fields_edited = true;
                        records[i % n][f] = v;
                    }
                    Edit::Repeat(i, k) => {
                        let from = i % n;
                        let copy: Vec<Value> = records[from..(from + k).min(n)].to_vec();
                        records.extend(copy);
                    }
                    Edit::Drop(i) if n > 1 => { records.remove(i % n); }
                    Edit::Drop(_) => {}
                    Edit::Swap(i, j) => records.swap(i % n, j % n),
                }
            }
            if let Ok(r) = Report::from_text(&lines(&records)) {
                render_text(&r, 100);
                render_html(&r);
                // With every seqno as written, a repeat is skipped: never
                // more reads counted than the stream has.
                if !fields_edited {
                    let requests: u64 = r.disks.iter().flat_map(|d| &d.ops).map(|o| o.requests).sum();
                    prop_assert!(requests <= 3 * 5, "{} requests", requests);
                }
            }
        }
    }
}
