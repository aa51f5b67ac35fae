//! JSON lines: one record per line, each with `ts`, `host`, `type`, `schema`,
//! `run` and `seqno`, so that every line stands alone in a log pipeline.

use std::collections::BTreeMap;
use std::io::{self, Write};

use serde::Serialize;
use serde_json::Value;

use super::file::NextFile;
use super::queue::OutputQueue;
use super::split::split_body;
use crate::records::run::StartRecord;
use crate::records::{AnyRecord, MAX_LINE_BYTES, Record, SCHEMA_VERSION};

pub struct JsonWriter {
    sink: Sink,
    host: String,
    /// This run's id, on every record: a shipper's lines from many hosts and
    /// runs, and a run's rotated files, fall apart by it.
    run: String,
    /// The run's `start`, repeated at the head of each further file.
    start: Option<StartRecord>,
    files: Option<FileBudget>,
    /// Records longer than a line that could not be split (written whole).
    oversize: u64,
    /// The next record's `seqno`: every record made takes one, written or not,
    /// so a reader sees a gap wherever records were dropped.
    seq: u64,
    emitted: BTreeMap<&'static str, u64>,
    /// Records the output queue had no room for, over the run and since the
    /// last `lost` record that said so.
    dropped: u64,
    dropped_unreported: u64,
    tap: Option<Tap>,
    /// `--prometheus`: every record made is counted there, and those it reads
    /// are handed over (written or dropped by the queue: the metrics do not
    /// depend on the reader).
    metrics: Option<Box<dyn RecordReader>>,
}

/// A reader of every record as it is made, written or dropped by the queue
/// (the Prometheus metrics): the writer knows its readers only through this.
pub trait RecordReader: Send {
    /// Whether it reads records of `kind` whole; else it is only told one was made.
    fn reads(&self, kind: &str) -> bool;
    /// A record made at `ts` (its envelope's), as the writer was given it.
    fn read(&self, ts: &str, record: &AnyRecord);
    /// A record of a kind it does not read was made.
    fn made(&self, kind: &str);
    /// One record the output queue had no room for.
    fn dropped(&self);
}

/// Where the lines go.
enum Sink {
    /// Written in place (tests, in-memory sinks).
    Direct(Box<dyn Write>),
    /// Through the bounded queue and its writer thread (`stalltrace run`).
    Queued(OutputQueue),
}
/// A copy of the records made, typed, for the stall detector: the records
/// the stream carries, in its order (stall/replay_tests.rs keeps a recording
/// read back from its lines making the same episodes).
struct Tap {
    records: Vec<AnyRecord>,
    /// Which records to keep, and which of them are per-event.
    wants: fn(&str) -> Tapped,
    /// Most per-event records kept between two `take_tapped` calls; the rest
    /// are counted (a retransmit storm must not grow the daemon without
    /// bound). Aggregates are bounded by the kernel maps that produce them.
    event_cap: usize,
    events: usize,
    dropped: u64,
}

impl Tap {
    /// Whether it keeps the next record of `kind`: per-event ones up to the
    /// cap, counting those over it.
    fn takes(&mut self, kind: &str) -> bool {
        match (self.wants)(kind) {
            Tapped::No => false,
            Tapped::Event if self.events >= self.event_cap => {
                self.dropped += 1;
                false
            }
            Tapped::Event => {
                self.events += 1;
                true
            }
            Tapped::Aggregate => true,
        }
    }
}

/// What a tap does with a record type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tapped {
    /// Not read: not kept.
    No,
    /// One record per interval per subject: always kept.
    Aggregate,
    /// One record per kernel event: kept up to the cap.
    Event,
}

/// `--out FILE`: when the next file begins.
pub struct FileBudget {
    pub path: std::path::PathBuf,
    /// `--out-max-mb` in bytes; None: only on SIGHUP.
    pub max_bytes: Option<u64>,
    /// `--out-keep`: rotated files kept.
    pub keep: u32,
    /// Bytes in the current file, those queued for it included.
    pub bytes: u64,
    /// Files begun after the first.
    pub begun: u32,
}

#[derive(Serialize)]
struct Envelope<'a, T: Serialize> {
    ts: &'a str,
    host: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
    schema: u32,
    run: &'a str,
    seqno: u64,
    #[serde(flatten)]
    body: &'a T,
}

impl JsonWriter {
    /// Writes each record to `out` as it is emitted.
    pub fn new(out: Box<dyn Write>, host: String) -> Self {
        Self::with_sink(Sink::Direct(out), host)
    }

    /// Hands each record to `queue` (see output/queue.rs).
    pub fn queued(queue: OutputQueue, host: String) -> Self {
        Self::with_sink(Sink::Queued(queue), host)
    }

    fn with_sink(sink: Sink, host: String) -> Self {
        Self {
            sink,
            host,
            run: new_run_id(),
            start: None,
            files: None,
            oversize: 0,
            seq: 0,
            emitted: BTreeMap::new(),
            dropped: 0,
            dropped_unreported: 0,
            tap: None,
            metrics: None,
        }
    }

    /// Hand every record to `reader` too.
    pub fn feed(&mut self, reader: Box<dyn RecordReader>) {
        self.metrics = Some(reader);
    }

    /// Keep a copy of the records `wants` asks for, at most `event_cap`
    /// per-event records between two `take_tapped` calls.
    pub fn tap(&mut self, wants: fn(&str) -> Tapped, event_cap: usize) {
        self.tap = Some(Tap {
            records: Vec::new(),
            wants,
            event_cap,
            events: 0,
            dropped: 0,
        });
    }

    /// The records written since the last call, and how many did not fit.
    pub fn take_tapped(&mut self) -> (Vec<AnyRecord>, u64) {
        match &mut self.tap {
            Some(t) => {
                t.events = 0;
                (
                    std::mem::take(&mut t.records),
                    std::mem::take(&mut t.dropped),
                )
            }
            None => (Vec::new(), 0),
        }
    }

    /// Write one record. `Ok(false)`: the output queue was full and the
    /// record was dropped (and counted). An error is the output's own:
    /// nothing more can be written.
    pub fn emit<R: Record>(&mut self, ts: &str, record: &R) -> io::Result<bool> {
        let kind = R::TYPE;
        let tapped = self.tap.as_mut().is_some_and(|tap| tap.takes(kind));
        let measured = self.metrics.as_ref().map(|m| m.reads(kind));
        // The one copy the readers share; none when no reader wants this type.
        let wanted = tapped || measured == Some(true) || (kind == "start" && self.start.is_none());
        let typed: Option<AnyRecord> = wanted.then(|| record.clone().into());
        if let Some(AnyRecord::Start(start)) = &typed
            && self.start.is_none()
        {
            self.start = Some(start.clone());
        }
        if let Some(metrics) = self.metrics.as_deref() {
            match &typed {
                Some(r) if measured == Some(true) => metrics.read(ts, r),
                _ => metrics.made(kind),
            }
        }
        if let (Some(tap), true, Some(r)) = (self.tap.as_mut(), tapped, typed) {
            tap.records.push(r);
        }
        self.write_record(kind, ts, record)
    }

    /// Write `body`'s fields as a record of type `kind`, for no reader but
    /// the stream's: the tests of readers use it to write what no record
    /// type would.
    #[cfg(test)]
    pub fn emit_as<T: Serialize>(
        &mut self,
        kind: &'static str,
        ts: &str,
        body: &T,
    ) -> io::Result<bool> {
        self.write_record(kind, ts, body)
    }

    /// The record's lines, to the sink, numbered and counted.
    fn write_record<T: Serialize>(
        &mut self,
        kind: &'static str,
        ts: &str,
        body: &T,
    ) -> io::Result<bool> {
        let mut lines = self.encode(kind, ts, body)?;
        // A record goes whole into one file, after the `start` that opens
        // it: seqnos stay in order within and across files. (A `start`
        // itself opens a file: it never begins another.)
        if let Some(f) = &self.files
            && let Some(max) = f.max_bytes
            && kind != "start"
            && f.bytes > 0
            && f.bytes + lines.iter().map(|l| l.len() as u64).sum::<u64>() > max
        {
            let keep = f.keep;
            self.begin_file(NextFile::Rotate { keep }, ts)?;
            lines = self.encode(kind, ts, body)?;
        }
        self.seq += lines.len() as u64;
        let dropped = self.write_lines(lines)?;
        self.count(kind, dropped == 0, dropped);
        Ok(dropped == 0)
    }

    /// The record's lines, numbered from the next seqno: one, or its parts
    /// when it is longer than a line (output/split.rs).
    fn encode<T: Serialize>(
        &mut self,
        kind: &'static str,
        ts: &str,
        body: &T,
    ) -> io::Result<Vec<Vec<u8>>> {
        let (host, run) = (self.host.as_str(), self.run.as_str());
        let whole = encode_line(ts, host, kind, run, self.seq, body)?;
        if whole.len() <= MAX_LINE_BYTES {
            return Ok(vec![whole]);
        }
        let value = serde_json::to_value(body)?;
        let envelope_len = whole.len() - body_len(&value);
        let Some(parts) = value
            .as_object()
            .and_then(|b| split_body(b, MAX_LINE_BYTES.saturating_sub(envelope_len)))
        else {
            self.note_oversize(kind, whole.len());
            return Ok(vec![whole]);
        };
        let lines = (0..)
            .zip(&parts)
            .map(|(i, part)| encode_line(ts, host, kind, run, self.seq + i, part))
            .collect::<io::Result<Vec<_>>>()?;
        if let Some(longest) = lines
            .iter()
            .map(Vec::len)
            .filter(|&l| l > MAX_LINE_BYTES)
            .max()
        {
            self.note_oversize(kind, longest);
        }
        Ok(lines)
    }

    /// A line over MAX_LINE_BYTES is written whole, and said once per run.
    fn note_oversize(&mut self, kind: &str, len: usize) {
        self.oversize += 1;
        if self.oversize == 1 {
            eprintln!(
                "stalltrace: a {kind} record takes a line of {len} bytes, over the {MAX_LINE_BYTES} bytes log shippers take by default (an item of a list longer than a line, or no list to split): written whole"
            );
        }
    }

    /// A record's lines to the sink, all or none; the lines dropped for want
    /// of room in the queue.
    fn write_lines(&mut self, lines: Vec<Vec<u8>>) -> io::Result<u64> {
        let count = lines.len() as u64;
        let len: u64 = lines.iter().map(|l| l.len() as u64).sum();
        let written = match &mut self.sink {
            Sink::Direct(out) => {
                for line in &lines {
                    out.write_all(line)?;
                }
                true
            }
            Sink::Queued(queue) => queue.push_all(lines)?,
        };
        if let (true, Some(f)) = (written, &mut self.files) {
            f.bytes += len;
        }
        Ok(if written { 0 } else { count })
    }

    fn count(&mut self, kind: &'static str, written: bool, dropped_lines: u64) {
        if written {
            *self.emitted.entry(kind).or_default() += 1;
        }
        self.dropped += dropped_lines;
        self.dropped_unreported += dropped_lines;
        if let Some(metrics) = &self.metrics {
            for _ in 0..dropped_lines {
                metrics.dropped();
            }
        }
    }

    /// `--out FILE`: begin new files as `budget` says (and on `reopen`).
    pub fn rotate_files(&mut self, budget: FileBudget) {
        self.files = Some(budget);
    }

    /// SIGHUP: the lines from here go to the file now at the output's path.
    /// Nothing to do when the output is no file.
    pub fn reopen(&mut self, ts: &str) -> io::Result<()> {
        if self.files.is_some() {
            self.begin_file(NextFile::Reopen, ts)?;
        }
        Ok(())
    }

    /// Hand the writer the file change, then open the new file with the
    /// run's `start` (its own `seqno`, and `file`: its number in the run).
    fn begin_file(&mut self, how: NextFile, ts: &str) -> io::Result<()> {
        let (Sink::Queued(_), Some(f)) = (&self.sink, self.files.as_mut()) else {
            return Ok(());
        };
        // A reopened path may be the same file (a HUP with nothing moved):
        // the size counts from what is there, give or take what the queue
        // still holds for it.
        f.bytes = match how {
            NextFile::Rotate { .. } => 0,
            NextFile::Reopen => std::fs::metadata(&f.path).map_or(0, |m| m.len()),
        };
        f.begun += 1;
        let file = f.begun;
        let mut head = Vec::new();
        if let Some(mut start) = self.start.clone() {
            start.file = Some(u64::from(file));
            head = self.encode("start", ts, &start)?;
            if let Some(metrics) = self.metrics.as_deref() {
                match metrics.reads("start") {
                    true => metrics.read(ts, &start.into()),
                    false => metrics.made("start"),
                }
            }
            self.seq += head.len() as u64;
            self.count("start", true, 0);
        }
        let len: u64 = head.iter().map(|l| l.len() as u64).sum();
        if let (Sink::Queued(queue), Some(f)) = (&self.sink, self.files.as_mut()) {
            queue.push_next_file(how, head);
            f.bytes += len;
        }
        Ok(())
    }

    /// Make what was written visible to the reader (direct), or say whether
    /// the output has failed (queued: its writer flushes whenever it has
    /// caught up).
    pub fn flush(&mut self) -> io::Result<()> {
        match &mut self.sink {
            Sink::Direct(out) => out.flush(),
            Sink::Queued(queue) => queue.failed().map_or(Ok(()), Err),
        }
    }

    /// Records dropped for want of room since a `lost` record last said so.
    pub fn dropped_unreported(&self) -> u64 {
        self.dropped_unreported
    }

    /// A `lost` record now carries `n` of the unreported drops.
    pub fn reported_dropped(&mut self, n: u64) {
        self.dropped_unreported -= n.min(self.dropped_unreported);
    }

    /// Records dropped for want of room over the whole run.
    pub fn dropped(&self) -> u64 {
        self.dropped
    }

    /// The output queue, to close at the end of the run (None when direct).
    pub fn into_queue(self) -> Option<OutputQueue> {
        match self.sink {
            Sink::Queued(queue) => Some(queue),
            Sink::Direct(_) => None,
        }
    }

    /// After the queued output failed: write in place to the sink its writer
    /// thread held, for one last try at the `stop` record. False when there
    /// is no such sink (the writer is still blocked, or the output was direct).
    pub fn direct_after_failure(&mut self) -> bool {
        let Sink::Queued(_) = self.sink else {
            return false;
        };
        let Sink::Queued(queue) =
            std::mem::replace(&mut self.sink, Sink::Direct(Box::new(io::sink())))
        else {
            unreachable!()
        };
        match queue.close(std::time::Duration::ZERO, std::time::Instant::now()) {
            Ok(out) => {
                self.sink = Sink::Direct(out);
                true
            }
            Err(_) => false,
        }
    }

    /// The queue, to wait for room in before the last record.
    pub fn queue(&self) -> Option<&OutputQueue> {
        match &self.sink {
            Sink::Queued(queue) => Some(queue),
            Sink::Direct(_) => None,
        }
    }

    /// This run's id.
    pub fn run_id(&self) -> &str {
        &self.run
    }

    /// Records written so far, by type.
    pub fn emitted(&self) -> &BTreeMap<&'static str, u64> {
        &self.emitted
    }
}

/// One record's line, newline included.
fn encode_line<T: Serialize>(
    ts: &str,
    host: &str,
    kind: &str,
    run: &str,
    seqno: u64,
    body: &T,
) -> io::Result<Vec<u8>> {
    let envelope = Envelope {
        ts,
        host,
        kind,
        schema: SCHEMA_VERSION,
        run,
        seqno,
        body,
    };
    let mut line = serde_json::to_vec(&envelope)?;
    line.push(b'\n');
    Ok(line)
}

/// A random UUID (v4), from the kernel's generator.
fn new_run_id() -> String {
    uuid::Uuid::new_v4().to_string()
}

/// Bytes `body` takes inside its line (what a part's budget leaves out).
fn body_len(body: &Value) -> usize {
    serde_json::to_vec(body).map_or(0, |b| b.len().saturating_sub(2))
}

/// An in-memory sink for tests: clones share one buffer, so a test keeps a
/// handle while the writer owns the boxed other.
#[cfg(test)]
#[derive(Clone, Default)]
pub(crate) struct SharedBuffer(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

#[cfg(test)]
impl SharedBuffer {
    pub(crate) fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[cfg(test)]
impl Write for SharedBuffer {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
