//! Records written in parts: a record whose line would exceed 8 KiB (what log
//! shippers take by default) is written as `parts` consecutive records, each
//! with every field of the record, `part` (1..=parts) and `split`, the name
//! of the top-level array divided among them in order. Put back together,
//! the record is used as if it had been one line; a set missing a part (lost
//! between files, dropped by the output queue) is not used, and counted.
//!
//! One set is held at a time (its parts are consecutive), and at most
//! [`MAX_LINE`](super::lines::MAX_LINE) bytes of it: memory stays bounded
//! whatever the parts claim.

use serde_json::Value;

use super::field;
use super::lines::{LineRef, MAX_LINE};

/// Incomplete sets whose place the report names.
const DAMAGED_LISTED: usize = 5;

/// Records written in parts, and sets that were incomplete.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct SplitHealth {
    /// Records put back together from their parts.
    pub reassembled: u64,
    /// Sets of parts not used: a part missing or out of order, or larger than
    /// the report reads.
    pub damaged: u64,
    /// The first few of those: where their first part read is, and their type.
    pub first_damaged: Vec<(LineRef, String)>,
}

impl SplitHealth {
    /// The sentence for the report, given how to name a line; `None` when
    /// every set was whole.
    pub fn warning(&self, at: impl Fn(LineRef) -> String) -> Option<String> {
        if self.damaged == 0 {
            return None;
        }
        let listed: Vec<String> = self
            .first_damaged
            .iter()
            .map(|(line, kind)| format!("{kind} at {}", at(*line)))
            .collect();
        Some(format!(
            "{} record{} written in parts {} incomplete (a part lost between files or dropped, or out of order) and not used: {}{}",
            self.damaged,
            if self.damaged == 1 { "" } else { "s" },
            if self.damaged == 1 { "is" } else { "are" },
            listed.join(", "),
            if self.damaged > listed.len() as u64 {
                ", ..."
            } else {
                ""
            }
        ))
    }
}

/// What became of a record offered to [`Reassembly::offer`].
#[derive(Debug, PartialEq)]
pub enum Offer {
    /// Not a part: use the record as it is.
    Whole,
    /// A part, held until its set is complete (or given up).
    Held,
    /// The last part of a set: the record put back together.
    Complete(Value),
}

/// The set of parts being put together.
struct Pending {
    kind: String,
    split: String,
    parts: u64,
    next_part: u64,
    /// The seqno the next part must have, when the parts carry seqnos.
    next_seqno: Option<u64>,
    /// The record so far; `None` once the set is known to be damaged (its
    /// remaining parts are still taken, so that it counts once).
    record: Option<Value>,
    bytes: usize,
    at: LineRef,
}

/// The fields a part carries besides the record's own.
#[derive(Clone, Debug, PartialEq)]
struct PartOf {
    part: u64,
    parts: u64,
    split: String,
}

fn part_of(r: &Value) -> Option<PartOf> {
    if !field::is_part(r) {
        return None;
    }
    Some(PartOf {
        // A malformed part (0, missing, not a number) is still a part: it
        // breaks its set rather than being read as a whole record.
        part: field::part(r).unwrap_or(0),
        parts: field::parts(r).unwrap_or(0),
        split: field::split(r).unwrap_or_default().to_string(),
    })
}

#[derive(Default)]
pub struct Reassembly {
    pending: Option<Pending>,
    pub health: SplitHealth,
}

impl Reassembly {
    /// Offer the next record of the stream (`bytes`: its line's length, 0
    /// when not read from a line). A record that is not the next part of the
    /// set being held gives that set up as damaged.
    pub fn offer(&mut self, r: &Value, at: LineRef, bytes: usize) -> Offer {
        let Some(p) = part_of(r) else {
            self.give_up();
            return Offer::Whole;
        };
        let kind = field::kind(r).unwrap_or_default().to_string();
        let seqno = field::seqno(r);
        let same_set = self.pending.as_ref().is_some_and(|s| {
            s.kind == kind && s.split == p.split && s.parts == p.parts && p.part >= s.next_part
        });
        if same_set && let Some(s) = self.pending.as_mut() {
            // A part skipped (lost), or seqnos that do not follow: the set is
            // damaged, and its remaining parts are still its own.
            let next = s.next_part == p.part && (s.next_seqno.is_none() || s.next_seqno == seqno);
            s.bytes = s.bytes.saturating_add(bytes);
            let more = field::split_items(r, &p.split);
            match (s.record.as_mut(), more) {
                (Some(record), Some(more)) if next && s.bytes <= MAX_LINE => {
                    if let Some(Value::Array(items)) = record.get_mut(&p.split) {
                        items.extend(more.iter().cloned());
                    }
                }
                _ => s.record = None,
            }
        } else {
            self.give_up();
            let valid = p.part >= 1 && p.part <= p.parts && !p.split.is_empty();
            let array_ok = field::split_items(r, &p.split).is_some();
            self.pending = Some(Pending {
                kind,
                split: p.split.clone(),
                parts: p.parts,
                next_part: p.part,
                next_seqno: seqno,
                // Only a first part can begin a record; a later one whose
                // first part was lost begins a damaged set.
                record: (valid && array_ok && p.part == 1).then(|| {
                    let mut first = r.clone();
                    if let Some(o) = first.as_object_mut() {
                        for key in ["part", "parts", "split"] {
                            o.remove(key);
                        }
                    }
                    first
                }),
                bytes,
                at,
            });
        }
        let s = self.pending.as_mut().expect("a set is held");
        s.next_part = p.part.saturating_add(1);
        s.next_seqno = seqno.and_then(|n| n.checked_add(1));
        if p.part < s.parts {
            return Offer::Held;
        }
        let s = self.pending.take().expect("a set is held");
        match s.record {
            Some(record) => {
                self.health.reassembled += 1;
                Offer::Complete(record)
            }
            None => {
                self.damaged(s.at, s.kind);
                Offer::Held
            }
        }
    }

    /// The stream ended, or the run did: a set still held is incomplete.
    pub fn finish(&mut self) {
        self.give_up();
    }

    fn give_up(&mut self) {
        if let Some(s) = self.pending.take() {
            self.damaged(s.at, s.kind);
        }
    }

    fn damaged(&mut self, at: LineRef, kind: String) {
        self.health.damaged += 1;
        if self.health.first_damaged.len() < DAMAGED_LISTED {
            self.health.first_damaged.push((at, kind));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn part(seqno: u64, part: u64, parts: u64, files: Value) -> Value {
        json!({"type": "sql_instance", "seqno": seqno, "pid": 7, "files": files,
            "part": part, "parts": parts, "split": "files"})
    }

    fn at(line: usize) -> LineRef {
        LineRef { file: 0, line }
    }

    #[test]
    fn parts_in_order_make_the_record_and_anything_else_passes_through() {
        let mut r = Reassembly::default();
        assert_eq!(r.offer(&json!({"type": "block"}), at(1), 10), Offer::Whole);
        assert_eq!(
            r.offer(&part(5, 1, 3, json!([1, 2])), at(2), 10),
            Offer::Held
        );
        assert_eq!(r.offer(&part(6, 2, 3, json!([3])), at(3), 10), Offer::Held);
        let Offer::Complete(whole) = r.offer(&part(7, 3, 3, json!([4, 5])), at(4), 10) else {
            panic!("the third part completes it");
        };
        assert_eq!(
            whole,
            json!({"type": "sql_instance", "seqno": 5, "pid": 7, "files": [1, 2, 3, 4, 5]})
        );
        assert_eq!(
            r.health,
            SplitHealth {
                reassembled: 1,
                ..SplitHealth::default()
            }
        );
    }

    #[test]
    fn a_set_with_a_part_missing_is_counted_once_and_not_used() {
        let mut r = Reassembly::default();
        // Part 2 of 3 lost (seqno 11 missing): 1 and 3 are one damaged set.
        r.offer(&part(10, 1, 3, json!([1])), at(1), 10);
        assert_eq!(r.offer(&part(12, 3, 3, json!([3])), at(2), 10), Offer::Held);
        // Part 1 lost: 2 and 3 are one damaged set.
        r.offer(&part(21, 2, 3, json!([2])), at(3), 10);
        assert_eq!(r.offer(&part(22, 3, 3, json!([3])), at(4), 10), Offer::Held);
        // Cut by a whole record, and by the end of the stream.
        r.offer(&part(30, 1, 2, json!([1])), at(5), 10);
        assert_eq!(r.offer(&json!({"type": "block"}), at(6), 10), Offer::Whole);
        r.offer(&part(40, 1, 2, json!([1])), at(7), 10);
        r.finish();
        assert_eq!(r.health.reassembled, 0);
        assert_eq!(r.health.damaged, 4);
        let lines: Vec<usize> = r.health.first_damaged.iter().map(|(a, _)| a.line).collect();
        assert_eq!(lines, [1, 3, 5, 7]);
        let text = r.health.warning(|a| format!("line {}", a.line)).unwrap();
        assert!(
            text.starts_with("4 records written in parts are incomplete"),
            "{text}"
        );
    }

    #[test]
    fn malformed_or_oversized_sets_are_damaged_never_a_panic() {
        for bad in [
            json!({"type": "x", "part": 1, "parts": 1}),
            json!({"type": "x", "part": 0, "parts": 0, "split": "a", "a": []}),
            json!({"type": "x", "part": 2, "parts": 1, "split": "a", "a": []}),
            json!({"type": "x", "part": 1, "parts": 1, "split": "a", "a": 5}),
            json!({"type": "x", "part": "1", "split": "a", "a": []}),
            json!({"type": "x", "part": u64::MAX, "parts": u64::MAX, "split": "a", "a": [],
                "seqno": u64::MAX}),
        ] {
            let mut r = Reassembly::default();
            assert_eq!(r.offer(&bad, at(1), 10), Offer::Held, "{bad}");
            r.finish();
            assert_eq!(r.health.damaged, 1, "{bad}");
        }
        // Parts past the report's line cap in all: given up, counted once.
        let mut r = Reassembly::default();
        r.offer(&part(0, 1, 3, json!([1])), at(1), MAX_LINE / 2);
        r.offer(&part(1, 2, 3, json!([2])), at(2), MAX_LINE / 2);
        assert_eq!(
            r.offer(&part(2, 3, 3, json!([3])), at(3), MAX_LINE / 2),
            Offer::Held
        );
        assert_eq!((r.health.damaged, r.health.reassembled), (1, 0));
    }
}
