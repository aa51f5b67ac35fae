//! A line-length cap between the raw stream and the report's line reader.
//!
//! `Report::from_reader` reads lines with `read_until`, which grows its buffer
//! until it meets a newline: a file with no newline (a gzip bomb of zeros,
//! `/dev/zero`, a binary file) would be held in memory whole. [`LineCap`]
//! hands out at most [`MAX_LINE`] bytes of any line and streams past the
//! rest without keeping it, so memory is bounded by the cap, whatever the
//! input's size.
//!
//! A line over the cap is never a stalltrace record:
//! - when no earlier line looked like a JSON record (started with `{`), the
//!   input is not a record stream, and reading stops at once with
//!   [`LineTooLong`] (so a bomb is refused after the cap, not after
//!   decompressing all of it);
//! - later in a stream it is handed on as its first [`MAX_LINE`] bytes and a
//!   NUL byte (never valid JSON, so the report counts and skips it as a bad
//!   line, as it does any line that is not a record), and the rest of it is
//!   skipped in the inner reader's buffer, never copied.

use std::fmt;
use std::io::{self, BufRead, Read};

/// The longest line the report reads. Records stalltrace writes are far
/// shorter: a `block` record with every bucket of its five histograms filled
/// is ~150 KB, and a `sql_instance` lists ~130 bytes per database file, so 4
/// MiB holds an instance with 30,000 files open. Memory follows from it: the
/// line buffer holds at most this much, and parsing a line of valid JSON this
/// long costs at most ~32 times it in `serde_json::Value`s (a 2-byte `0,`
/// becomes a 32-byte value): see `DESIGN_PEAK_RSS` in the tests.
pub const MAX_LINE: usize = 4 << 20;

/// Where a line is: a file of the set (an index into
/// [`StreamHealth::files`](super::health::StreamHealth::files))
/// and its 1-based line number there.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LineRef {
    pub file: usize,
    pub line: usize,
}

/// What an over-long line becomes: not JSON, not whitespace.
const MARKER: &[u8] = b"\0";

/// Why reading stopped: the first record-like line is longer than the cap.
#[derive(Debug)]
pub struct LineTooLong {
    /// 1-based, as the report counts lines.
    pub line: usize,
    pub cap: usize,
}

impl fmt::Display for LineTooLong {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "line {} is longer than {} MiB, and no stalltrace record is",
            self.line,
            self.cap >> 20
        )
    }
}

impl std::error::Error for LineTooLong {}

/// `inner` with every line cut to `cap` bytes (see the module docs).
pub struct LineCap<R> {
    inner: R,
    cap: usize,
    line: Line,
    /// The cut line's marker is next; after it, the rest of the line is skipped.
    marker_next: bool,
    skipping: bool,
}

/// What the reader knows about the line being read and those before it.
#[derive(Default)]
struct Line {
    /// 1-based number of the current line.
    number: usize,
    /// Bytes of it handed out so far.
    len: usize,
    /// Its first byte that is not ASCII whitespace, once seen.
    first: Option<u8>,
    /// An earlier line started with `{`: this is a record stream (or meant to be).
    records_seen: bool,
}

impl Line {
    /// Account for `bytes` handed out; a newline can only be their last byte.
    fn advance(&mut self, bytes: &[u8]) {
        if self.first.is_none() {
            self.first = bytes.iter().copied().find(|b| !b.is_ascii_whitespace());
        }
        self.len += bytes.len();
        if bytes.last() == Some(&b'\n') {
            self.records_seen |= self.first == Some(b'{');
            self.number += 1;
            self.len = 0;
            self.first = None;
        }
    }
}

impl<R: BufRead> LineCap<R> {
    pub fn new(inner: R, cap: usize) -> Self {
        assert!(cap > 0, "a line cap of 0 would cut every line");
        Self {
            inner,
            cap,
            line: Line {
                number: 1,
                ..Line::default()
            },
            marker_next: false,
            skipping: false,
        }
    }
}

impl<R: BufRead> Read for LineCap<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        read_through_buffer(self, out)
    }
}

impl<R: BufRead> BufRead for LineCap<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.marker_next {
            return Ok(MARKER);
        }
        if self.skipping {
            // Drop the cut line's rest straight from the inner buffer, up to
            // (not including) its newline, which ends the line as usual.
            loop {
                let buf = self.inner.fill_buf()?;
                if buf.is_empty() {
                    return Ok(&[]);
                }
                match buf.iter().position(|&b| b == b'\n') {
                    Some(at) => {
                        self.inner.consume(at);
                        self.skipping = false;
                        break;
                    }
                    None => {
                        let n = buf.len();
                        self.inner.consume(n);
                    }
                }
            }
        }
        // A cut line has had the cap and its marker: only its newline is left.
        let budget = self.cap.saturating_sub(self.line.len);
        let (number, records_seen) = (self.line.number, self.line.records_seen);
        let buf = self.inner.fill_buf()?;
        // One byte past the budget tells a line that ends there from a longer one.
        let window = &buf[..buf.len().min(budget + 1)];
        if let Some(at) = window.iter().position(|&b| b == b'\n') {
            return Ok(&buf[..=at]);
        }
        if window.len() <= budget {
            return Ok(window);
        }
        if budget > 0 {
            // Up to the cap now; the next call finds the budget spent.
            return Ok(&buf[..budget]);
        }
        if !records_seen {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                LineTooLong {
                    line: number,
                    cap: self.cap,
                },
            ));
        }
        self.marker_next = true;
        self.skipping = true;
        Ok(MARKER)
    }

    fn consume(&mut self, amt: usize) {
        if self.marker_next {
            if amt > 0 {
                self.marker_next = false;
                self.line.advance(MARKER);
            }
            return;
        }
        // The bytes fill_buf handed out are still at the front of the inner
        // buffer (consume follows fill_buf without a read between).
        if let Ok(buf) = self.inner.fill_buf() {
            let taken = &buf[..amt.min(buf.len())];
            self.line.advance(taken);
        }
        self.inner.consume(amt);
    }
}

/// The most NUL bytes [`SkipLeadingNuls`] reads past: a hole in a plain
/// file is seeked past instead (`SEEK_DATA`), so this bounds only what a
/// compressed copy of one costs to decompress, and keeps a gzip bomb of
/// zeros refused after a few seconds.
pub const MAX_HOLE_READ: u64 = 64 << 20;

/// `inner` without the NUL bytes it begins with. logrotate's copytruncate
/// truncates a file under a writer that keeps its offset; without O_APPEND
/// (schema 1 runs opened `--out` that way) the next write lands at the old
/// offset and the file begins with a hole that reads as NUL bytes. No JSON
/// text holds a NUL, so up to [`MAX_HOLE_READ`] of them are skipped (in the
/// inner reader's buffer, never held) and counted; past that, they are the
/// file's first line, which [`LineCap`] refuses.
pub struct SkipLeadingNuls<R> {
    inner: R,
    at_start: bool,
    /// NUL bytes skipped, those seeked past before included.
    pub skipped: u64,
    read: u64,
}

impl<R: BufRead> SkipLeadingNuls<R> {
    /// `seeked`: the hole's bytes already skipped by seeking.
    pub fn new(inner: R, seeked: u64) -> Self {
        Self {
            inner,
            at_start: true,
            skipped: seeked,
            read: 0,
        }
    }
}

impl<R: BufRead> Read for SkipLeadingNuls<R> {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        read_through_buffer(self, out)
    }
}

impl<R: BufRead> BufRead for SkipLeadingNuls<R> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        while self.at_start {
            let buf = self.inner.fill_buf()?;
            let nuls = buf.iter().take_while(|&&b| b == 0).count();
            // The hole ends inside this buffer, or the input does, or the
            // most this reads past is reached.
            self.read += nuls as u64;
            self.at_start = nuls == buf.len() && !buf.is_empty() && self.read < MAX_HOLE_READ;
            self.skipped += nuls as u64;
            self.inner.consume(nuls);
        }
        self.inner.fill_buf()
    }

    fn consume(&mut self, amt: usize) {
        self.inner.consume(amt);
    }
}

/// `Read` for a reader whose `BufRead` side does the work.
fn read_through_buffer(r: &mut impl BufRead, out: &mut [u8]) -> io::Result<usize> {
    let available = r.fill_buf()?;
    let n = available.len().min(out.len());
    out[..n].copy_from_slice(&available[..n]);
    r.consume(n);
    Ok(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lines as `read_until` sees them through a cap of `cap` and an inner
    /// buffer of `chunk` bytes (so lines and the cap fall across refills).
    fn lines(input: &[u8], cap: usize, chunk: usize) -> io::Result<Vec<Vec<u8>>> {
        let mut r = LineCap::new(io::BufReader::with_capacity(chunk, input), cap);
        let mut out = Vec::new();
        loop {
            let mut line = Vec::new();
            if r.read_until(b'\n', &mut line)? == 0 {
                return Ok(out);
            }
            out.push(line);
        }
    }

    #[test]
    fn lines_within_the_cap_pass_unchanged_at_any_buffer_size() {
        let input = b"{\"a\":1}\n\n  {\"type\":\"x\"}\nlast without newline";
        for chunk in 1..=input.len() {
            let got = lines(input, 20, chunk).unwrap();
            assert_eq!(got.concat(), input, "chunk {chunk}");
            assert_eq!(got.len(), 4, "chunk {chunk}");
        }
        // Exactly the cap, with or without its newline, is not cut.
        assert_eq!(
            lines(b"{12}\n{123}", 5, 2).unwrap(),
            [&b"{12}\n"[..], b"{123}"]
        );
    }

    #[test]
    fn a_long_line_after_a_record_is_cut_and_marked() {
        let mut input = b"{\"type\":\"start\"}\n".to_vec();
        input.extend([b'x'; 100]);
        input.extend(b"\n{}\n");
        input.extend([b'y'; 30]); // cut at the end of the stream, no newline
        for chunk in 1..=input.len() {
            let got = lines(&input, 20, chunk).unwrap();
            let mut cut = [b'x'; 22];
            cut[20..].copy_from_slice(b"\0\n");
            let mut last = [b'y'; 21];
            last[20] = 0;
            assert_eq!(
                got,
                [&b"{\"type\":\"start\"}\n"[..], &cut, b"{}\n", &last],
                "chunk {chunk}"
            );
        }
    }

    #[test]
    fn a_long_line_before_any_record_stops_reading() {
        for input in [
            &[0u8; 64][..],
            b"not json\n\n   aaaaaaaaaaaaaaaaaaaaaa\n{}\n",
        ] {
            let e = lines(input, 8, 3).unwrap_err();
            let why = e.get_ref().unwrap().downcast_ref::<LineTooLong>().unwrap();
            let expected = if input[0] == 0 { 1 } else { 3 };
            assert_eq!(why.line, expected, "{e}");
        }
    }

    #[test]
    fn a_hole_of_nul_bytes_at_the_start_is_skipped_and_counted() {
        let mut input = vec![0u8; 100];
        input.extend(b"{\"type\":\"block\"}\n\0\n");
        for chunk in [1, 7, 100, 1000] {
            let mut r = SkipLeadingNuls::new(io::BufReader::with_capacity(chunk, &input[..]), 0);
            let mut out = Vec::new();
            r.read_to_end(&mut out).unwrap();
            // Only the leading ones: a NUL later is the stream's own (a bad line).
            assert_eq!(out, b"{\"type\":\"block\"}\n\0\n", "chunk {chunk}");
            assert_eq!(r.skipped, 100);
        }
        let mut r = SkipLeadingNuls::new(&[0u8; 10][..], 4096);
        assert_eq!(r.fill_buf().unwrap(), b"");
        assert_eq!(r.skipped, 4096 + 10);
        // Past the most it reads, the rest is the file's to show.
        let zeros = vec![0u8; MAX_HOLE_READ as usize + 3];
        let mut r = SkipLeadingNuls::new(io::BufReader::with_capacity(1 << 16, &zeros[..]), 0);
        let mut out = Vec::new();
        r.read_to_end(&mut out).unwrap();
        assert_eq!((out.len(), r.skipped), (3, MAX_HOLE_READ));
    }
}
