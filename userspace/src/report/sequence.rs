//! A run's `seqno`s: every record the tracer makes takes the next one, written
//! or not, so a seqno that never comes is a record lost (dropped by the output
//! queue, or lost between rotated files), and one that comes again is a
//! record read twice (a file given twice, the overlap of a copytruncate
//! rotation), which must not be counted twice.
//!
//! Files are read in seqno order and each file's seqnos ascend, so the
//! highest seqno so far tells a new record from a repeat without remembering
//! every seqno: memory stays constant however long the run, and only the
//! first few ranges are kept for the report to name.

use super::lines::LineRef;

/// Ranges named in the report; the rest are only counted.
pub const RANGES_LISTED: usize = 10;

/// A run of consecutive seqnos (or file ordinals), and where it was noticed:
/// the line of the record just after a gap, or of a range's first repeat.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SeqRange {
    pub first: u64,
    pub last: u64,
    pub at: LineRef,
    /// Noticed at the first record of a file: the gap lies between that file
    /// and the one before it.
    pub between_files: bool,
}

impl SeqRange {
    /// Numbers in the range (never 0: a range holds its first).
    pub fn records(&self) -> u64 {
        self.last - self.first + 1
    }
}

/// Ranges of missing or repeated numbers: the first [`RANGES_LISTED`], and
/// the totals of all.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SeqRanges {
    pub listed: Vec<SeqRange>,
    /// Ranges in all.
    pub ranges: u64,
    /// Numbers in all the ranges.
    pub records: u64,
}

impl SeqRanges {
    fn add(&mut self, range: SeqRange) {
        self.ranges += 1;
        self.records += range.records();
        if self.listed.len() < RANGES_LISTED {
            self.listed.push(range);
        }
    }

    /// One more number right after the last range's end.
    fn extend_last(&mut self, to: u64) {
        self.records += 1;
        // Listed only while it is among the first few.
        if self.ranges as usize <= self.listed.len()
            && let Some(last) = self.listed.last_mut()
        {
            last.last = to;
        }
    }
}

/// Whether a record is new to the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    New,
    /// Its seqno was read before (or is below one that was): skip it.
    Repeat,
}

/// The seqnos of the run being reported.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Sequence {
    /// The first seqno read; above 0 when the run's first records are not in the stream.
    pub first: Option<u64>,
    /// `file` of the `start` the stream begins with (the file's ordinal in
    /// the run); `None` when it begins without one.
    pub first_run_file: Option<u64>,
    /// The highest seqno read.
    highest: Option<u64>,
    pub missing: SeqRanges,
    pub repeated: SeqRanges,
    /// The last repeated seqno: a repeat right after it extends its range.
    last_repeat: Option<u64>,
    /// Files of the run missing, by the `file` ordinal of the `start` each new file begins with.
    pub missing_run_files: SeqRanges,
    last_run_file: Option<u64>,
    /// What `lost` says the output queue dropped (output.queue_full): the
    /// gaps it explains. Set when the report is finished.
    pub queue_full: u64,
}

impl Sequence {
    /// Take a record's seqno, read at `at`; `first_in_file` when it is the
    /// first record with a seqno in its file.
    pub fn see(&mut self, seqno: u64, at: LineRef, first_in_file: bool) -> Seen {
        let Some(highest) = self.highest else {
            self.first = Some(seqno);
            self.highest = Some(seqno);
            return Seen::New;
        };
        if seqno <= highest {
            if self.last_repeat.and_then(|s| s.checked_add(1)) == Some(seqno) {
                self.repeated.extend_last(seqno);
            } else {
                self.repeated.add(SeqRange {
                    first: seqno,
                    last: seqno,
                    at,
                    between_files: first_in_file,
                });
            }
            self.last_repeat = Some(seqno);
            return Seen::Repeat;
        }
        // Above `highest`, so `highest + 1` cannot overflow.
        if seqno > highest + 1 {
            self.missing.add(SeqRange {
                first: highest + 1,
                last: seqno - 1,
                at,
                between_files: first_in_file,
            });
        }
        self.highest = Some(seqno);
        Seen::New
    }

    /// The `file` ordinal of a run's `start`: the run's first file, or the
    /// repeat that begins each later one.
    pub fn run_file(&mut self, ordinal: u64, at: LineRef) {
        match self.last_run_file {
            None => self.first_run_file = Some(ordinal),
            Some(last) if ordinal > last.saturating_add(1) => {
                self.missing_run_files.add(SeqRange {
                    first: last + 1,
                    last: ordinal - 1,
                    at,
                    between_files: true,
                });
            }
            Some(_) => {}
        }
        self.last_run_file = Some(self.last_run_file.map_or(ordinal, |l| l.max(ordinal)));
    }

    /// The stream began without its run's `start`: a file's records came
    /// before the first `start` read (a copytruncate tail read first).
    pub fn began_without_start(&mut self) {
        if self.last_run_file.is_none() {
            self.last_run_file = Some(0);
            self.first_run_file = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(file: usize, line: usize) -> LineRef {
        LineRef { file, line }
    }

    #[test]
    fn gaps_and_repeats_are_ranges_with_where_they_were_seen() {
        let mut s = Sequence::default();
        for n in 0..5 {
            assert_eq!(s.see(n, at(0, n as usize + 1), n == 0), Seen::New);
        }
        // 5..=9 never came; file 1 begins at 10.
        assert_eq!(s.see(10, at(1, 1), true), Seen::New);
        assert_eq!(s.see(11, at(1, 2), false), Seen::New);
        // A copytruncate overlap: 10 and 11 again.
        for n in [10, 11] {
            assert_eq!(s.see(n, at(1, 3), false), Seen::Repeat);
        }
        assert_eq!(s.see(12, at(1, 5), false), Seen::New);
        assert_eq!(s.see(14, at(1, 6), false), Seen::New);
        assert_eq!(s.first, Some(0));
        assert_eq!(s.missing.records, 6);
        assert_eq!(
            s.missing.listed,
            [
                SeqRange {
                    first: 5,
                    last: 9,
                    at: at(1, 1),
                    between_files: true
                },
                SeqRange {
                    first: 13,
                    last: 13,
                    at: at(1, 6),
                    between_files: false
                }
            ]
        );
        // The repeat of 10 and 11 is one range of two.
        assert_eq!((s.repeated.ranges, s.repeated.records), (1, 2));
        assert_eq!(
            (s.repeated.listed[0].first, s.repeated.listed[0].last),
            (10, 11)
        );
    }

    #[test]
    fn only_the_first_ranges_are_kept_and_all_are_counted() {
        let mut s = Sequence::default();
        // Every other seqno: 1000 gaps of one.
        for n in 0..=1000u64 {
            s.see(n * 2, at(0, n as usize + 1), false);
        }
        // A file read twice after them: one long range of repeats, past the listed ones.
        for _ in 0..RANGES_LISTED {
            s.see(0, at(0, 1), false);
            s.see(1, at(0, 1), false);
        }
        assert_eq!(s.missing.ranges, 1000);
        assert_eq!(s.missing.records, 1000);
        assert_eq!(s.missing.listed.len(), RANGES_LISTED);
        assert_eq!(s.repeated.records, 2 * RANGES_LISTED as u64);
        assert_eq!(s.repeated.listed.len(), RANGES_LISTED);
        // Extending a range that is not listed changes no listed one.
        assert!(s.repeated.listed.iter().all(|r| r.records() <= 2));
    }

    #[test]
    fn a_stream_that_begins_late_says_where_and_missing_files_are_ranges() {
        let mut s = Sequence::default();
        s.run_file(3, at(0, 1));
        s.see(5120, at(0, 1), true);
        s.run_file(4, at(1, 1));
        s.run_file(7, at(2, 1));
        assert_eq!((s.first, s.first_run_file), (Some(5120), Some(3)));
        let missing = &s.missing_run_files;
        assert_eq!(
            (
                missing.records,
                missing.listed[0].first,
                missing.listed[0].last
            ),
            (2, 5, 6)
        );
        // The highest seqno there can be: what follows is a repeat, never an overflow.
        let mut s = Sequence::default();
        s.see(u64::MAX, at(0, 1), true);
        assert_eq!(s.see(u64::MAX, at(0, 2), false), Seen::Repeat);
    }
}
