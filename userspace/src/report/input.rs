//! Read a recorded stream into a [`Report`]: a file, `-` for stdin, or a
//! rotated set of files in any order; each gzip-compressed or not (rotated
//! logs usually are).

use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use flate2::bufread::MultiGzDecoder;

use super::error::ReportError;
use super::lines::{LineCap, LineTooLong, MAX_LINE, SkipLeadingNuls};
use super::model::{Report, ReportBuilder};
use super::window::Window;
use crate::error::UserError;

#[cfg(test)]
mod no_start_tests;
mod set;
#[cfg(test)]
mod set_tests;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod window_tests;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
const READ_BUFFER: usize = 1 << 16;

/// Read and build the report of `path` (`-`: stdin). A gzip file cut short
/// or corrupt part-way is reported up to the damage, as a cut plain file is,
/// with a line on stderr saying so.
pub fn read_report(path: &Path) -> Result<Report, UserError> {
    read_reports(&[path.to_path_buf()])
}

/// Read and build the report of one stream or of a rotated set of files, in
/// any order (see `set`); notes on damaged gzip data go to stderr.
pub fn read_reports(paths: &[PathBuf]) -> Result<Report, UserError> {
    read_reports_within(paths, None)
}

/// [`read_reports`] of what falls in `window` (`report --since/--until`).
pub fn read_reports_within(paths: &[PathBuf], window: Option<Window>) -> Result<Report, UserError> {
    let (report, notes) = match paths {
        [] => return Err(set::no_path()),
        [path] => {
            let (report, note) = read_path(path, window)?;
            (report, note.into_iter().collect())
        }
        paths => set::read_set(paths, window)?,
    };
    for note in notes {
        eprintln!("stalltrace: {note}");
    }
    Ok(report)
}

/// One path (`-`: stdin) as a stream of its own.
fn read_path(path: &Path, window: Option<Window>) -> Result<(Report, Option<String>), UserError> {
    if path.as_os_str() == "-" {
        let stdin = BufReader::with_capacity(READ_BUFFER, std::io::stdin());
        return read_one(stdin, "stdin", 0, window);
    }
    let name = path.display().to_string();
    let (file, hole) = set::open(path, &name)?;
    read_one(file, &name, hole, window)
}

/// The report of a stream, plain or gzip, named `name` in messages; with a
/// note when its gzip data stopped early. Memory is bounded by
/// [`MAX_LINE`] whatever the input, and every failure is one [`UserError`].
#[cfg(test)]
pub fn read_stream(
    reader: impl BufRead,
    name: &str,
) -> Result<(Report, Option<String>), UserError> {
    read_one(reader, name, 0, None)
}

/// The report of a stream whose first `hole` bytes, NULs, were seeked past,
/// of what falls in `window`.
fn read_one(
    reader: impl BufRead,
    name: &str,
    hole: u64,
    window: Option<Window>,
) -> Result<(Report, Option<String>), UserError> {
    let mut builder = ReportBuilder::within(window);
    let fed = feed(&mut builder, reader, name, hole);
    let stopped = match &fed {
        Ok(stopped) | Err((_, stopped)) => stopped.as_ref().map(|(e, at)| (e.to_string(), *at)),
    };
    let result = fed.map_err(|(e, _)| e).and_then(|_| builder.build());
    match result {
        Ok(report) => Ok((report, stopped.map(|(e, at)| gzip_note(name, &e, at)))),
        Err(e) => Err(user_error(e, stopped.as_ref(), name)),
    }
}

/// Where a gzip stream stopped: the error, and the decompressed bytes before it.
type GzFailure = (io::Error, u64);

/// Read one file (or stdin), plain or gzip, into `builder` as the next file
/// of the stream (`hole`: the NUL bytes at its head already seeked past);
/// the gzip failure that ended it early, if any, either way.
fn feed(
    builder: &mut ReportBuilder,
    mut reader: impl BufRead,
    name: &str,
    hole: u64,
) -> Result<Option<GzFailure>, (ReportError, Option<GzFailure>)> {
    let mut source = decoded(&mut reader).map_err(|e| (ReportError::Read(e), None))?;
    let mut unholed = SkipLeadingNuls::new(&mut source, hole);
    let result = builder.read_file(name, LineCap::new(&mut unholed, MAX_LINE));
    builder.file_hole(unholed.skipped);
    let stopped = match source {
        Source::Gzip(r) => r.into_inner().failure,
        Source::Plain(_) => None,
    };
    match result {
        Ok(()) => Ok(stopped),
        Err(e) => Err((e, stopped)),
    }
}

/// `reader` decompressed when it begins with gzip's magic bytes.
fn decoded<R: BufRead>(mut reader: R) -> io::Result<Source<io::Chain<io::Cursor<Vec<u8>>, R>>> {
    // Two bytes, even from a pipe that hands them over one at a time.
    let mut head = Vec::with_capacity(2);
    (&mut reader).take(2).read_to_end(&mut head)?;
    let gzip = head == GZIP_MAGIC;
    let reader = io::Cursor::new(head).chain(reader);
    Ok(if gzip {
        Source::Gzip(Box::new(BufReader::with_capacity(
            READ_BUFFER,
            GzStop::new(MultiGzDecoder::new(reader)),
        )))
    } else {
        Source::Plain(reader)
    })
}

fn gzip_note(name: &str, e: &str, at: u64) -> String {
    format!(
        "{name}: its gzip data stops after {at} decompressed bytes ({e}): the report covers those; `gzip -t {name}` checks the file"
    )
}

/// The one line for a stream that cannot be reported, named `name`, whose
/// gzip data may have stopped early.
fn user_error(e: ReportError, stopped: Option<&(String, u64)>, name: &str) -> UserError {
    match (e, stopped) {
        (ReportError::Read(e), _) if too_long(&e).is_some() => UserError::new(
            format!(
                "{name} is not a stalltrace record stream: {}",
                too_long(&e).unwrap()
            ),
            "give a file written by `stalltrace run --out FILE` (or its stdout saved to a file)",
        ),
        // A newer schema is the problem to name even when the rest is damaged.
        (ReportError::Schema { found, writer }, _) => ReportError::Schema {
            found: quoted(&found),
            writer: writer.as_deref().map(quoted),
        }
        .to_user_error(name),
        (e, None) => e.to_user_error(name),
        (_, Some((e, at))) => UserError::new(
            format!(
                "{name} is gzip-compressed, but its gzip data is cut or corrupt after {at} decompressed bytes ({e}), and those are no stalltrace stream"
            ),
            format!(
                "check the copy with `gzip -t {name}`; if part of it is good, `zcat {name} > part.jsonl` keeps that part for `stalltrace report part.jsonl`"
            ),
        ),
    }
}

/// A value from the file, as an error quotes it: short, and without control
/// characters that the user's terminal would act on.
fn quoted(value: &str) -> String {
    const SHOWN: usize = 24;
    let mut s = String::new();
    for c in value.chars().take(SHOWN) {
        if c.is_control() {
            s.extend(c.escape_default());
        } else {
            s.push(c);
        }
    }
    if value.chars().nth(SHOWN).is_some() {
        s.push('…');
    }
    s
}

fn too_long(e: &io::Error) -> Option<&LineTooLong> {
    e.get_ref()?.downcast_ref::<LineTooLong>()
}

/// The stream as read: plain, or decompressed (boxed: the decoder's state is
/// large, and the plain variant needs none of it).
enum Source<R: BufRead> {
    Plain(R),
    Gzip(Box<BufReader<GzStop<MultiGzDecoder<R>>>>),
}

impl<R: BufRead> Read for Source<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Source::Plain(r) => r.read(buf),
            Source::Gzip(r) => r.read(buf),
        }
    }
}

impl<R: BufRead> BufRead for Source<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        match self {
            Source::Plain(r) => r.fill_buf(),
            Source::Gzip(r) => r.fill_buf(),
        }
    }

    fn consume(&mut self, amt: usize) {
        match self {
            Source::Plain(r) => r.consume(amt),
            Source::Gzip(r) => r.consume(amt),
        }
    }
}

/// Decompressed data up to the first gzip error, which ends the stream there
/// (as the end of a cut plain file does) and is kept for the message.
struct GzStop<R> {
    decoder: R,
    /// Decompressed bytes handed out.
    out: u64,
    /// The error, and how many bytes had been handed out before it.
    failure: Option<(io::Error, u64)>,
}

impl<R> GzStop<R> {
    fn new(decoder: R) -> Self {
        Self {
            decoder,
            out: 0,
            failure: None,
        }
    }
}

impl<R: Read> Read for GzStop<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.failure.is_some() {
            return Ok(0);
        }
        match self.decoder.read(buf) {
            Ok(n) => {
                self.out += n as u64;
                Ok(n)
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => Err(e),
            Err(e) => {
                self.failure = Some((e, self.out));
                Ok(0)
            }
        }
    }
}
