//! What a shipping test reads back: the files stalltrace wrote (a rotated
//! set, oldest first) and what the receiver got, and the checks between
//! them: whole lines, byte for byte, and seqnos without gap or repeat.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;
use stalltrace::records::MAX_LINE_BYTES;

use crate::common::{parse_records, stalltrace_bin};

/// `--out` and its rotated siblings (FILE.1, FILE.2, ...), oldest first.
pub fn rotated_set(out: &Path) -> Vec<PathBuf> {
    let name = out.file_name().unwrap().to_str().unwrap();
    let mut numbered: Vec<(u32, PathBuf)> = std::fs::read_dir(out.parent().unwrap())
        .unwrap()
        .filter_map(|e| {
            let path = e.unwrap().path();
            let suffix = path.file_name()?.to_str()?.strip_prefix(name)?.to_string();
            let n = match suffix.as_str() {
                "" => 0,
                s => s.strip_prefix('.')?.parse().ok()?,
            };
            Some((n, path))
        })
        .collect();
    numbered.sort_by_key(|(n, _)| std::cmp::Reverse(*n));
    numbered.into_iter().map(|(_, p)| p).collect()
}

pub fn seqno(record: &Value) -> u64 {
    record["seqno"]
        .as_u64()
        .unwrap_or_else(|| panic!("no seqno: {record}"))
}

/// One file of the set: its lines as written, and their seqnos.
pub struct Written {
    pub path: PathBuf,
    pub lines: Vec<String>,
    pub seqnos: Vec<u64>,
}

pub fn read_set(out: &Path) -> Vec<Written> {
    rotated_set(out)
        .into_iter()
        .map(|path| {
            let text = std::fs::read_to_string(&path).unwrap();
            let records = parse_records(&text);
            Written {
                lines: text.lines().map(str::to_string).collect(),
                seqnos: records.iter().map(seqno).collect(),
                path,
            }
        })
        .collect()
}

/// What the receiver got, checked line by line: valid JSON under the
/// schema, shorter than the line limit, with the envelope a shipper needs
/// (`host`, `schema`, this `run`, `seqno`), and byte for byte a line
/// stalltrace wrote, unless `written_elsewhere` says the line was lost from
/// the files after rsyslog read it. Returns the seqnos in arrival order.
pub fn check_received(
    received: &str,
    written: &[Written],
    run: &str,
    written_elsewhere: impl Fn(u64) -> bool,
) -> Vec<u64> {
    let on_disk: HashSet<&str> = written
        .iter()
        .flat_map(|w| w.lines.iter().map(String::as_str))
        .collect();
    let records = parse_records(received);
    let mut seqnos = Vec::new();
    for (line, record) in received.lines().zip(&records) {
        assert!(
            line.len() < MAX_LINE_BYTES,
            "a received line of {} bytes, over the {MAX_LINE_BYTES}-byte limit: {}",
            line.len(),
            &line[..200]
        );
        assert!(
            record["host"].is_string() && record["schema"] == 3 && record["run"] == run,
            "the envelope a shipper needs is missing: {line}"
        );
        let n = seqno(record);
        assert!(
            on_disk.contains(line) || written_elsewhere(n),
            "received seqno {n} is not a line stalltrace wrote (cut or changed on the way?):\n{line}"
        );
        seqnos.push(n);
    }
    seqnos
}

/// Seqnos from 0 to `last` that never came, and those that came twice.
pub fn missing_and_repeated(seqnos: &[u64], last: u64) -> (Vec<u64>, Vec<u64>) {
    let mut seen = BTreeMap::<u64, u32>::new();
    for &n in seqnos {
        *seen.entry(n).or_default() += 1;
    }
    let missing = (0..=last).filter(|n| !seen.contains_key(n)).collect();
    let repeated = seen
        .into_iter()
        .filter(|&(_, c)| c > 1)
        .map(|(n, _)| n)
        .collect();
    (missing, repeated)
}

/// Every seqno from the set's first to `last` once, in order, file after
/// file: the files hold a contiguous piece of the run, and a reader that
/// takes them oldest first sees each record after the one made before it.
pub fn assert_contiguous(written: &[Written], last: u64) {
    let mut expected = written[0].seqnos[0];
    for w in written {
        for (i, &n) in w.seqnos.iter().enumerate() {
            // The likely slip at a rotation: the file's repeated `start`
            // took its seqno after the record whose write began the file.
            let start_took_a_later_seqno = i == 1 && w.seqnos[0] == n + 1;
            assert!(
                n == expected,
                "{} line {}: seqno {n} where {expected} was due{}",
                w.path.display(),
                i + 1,
                if start_took_a_later_seqno {
                    format!(
                        " (the file begins with `start` {}, made after the record it precedes)",
                        w.seqnos[0]
                    )
                } else {
                    String::new()
                }
            );
            expected += 1;
        }
    }
    assert_eq!(expected, last + 1, "the files end before the stop record");
}

/// Where each of `seqnos` is in the written files, for a failure message.
pub fn whereabouts(seqnos: &[u64], written: &[Written]) -> String {
    seqnos
        .iter()
        .take(20)
        .map(|n| {
            let place = written.iter().find_map(|w| {
                let i = w.seqnos.iter().position(|s| s == n)?;
                Some(format!(
                    "{}:{} of {}",
                    w.path.display(),
                    i + 1,
                    w.lines.len()
                ))
            });
            format!("{n} ({})", place.as_deref().unwrap_or("in no file"))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `stalltrace report` over a rotated set, oldest file first: its text.
pub fn report_over(files: &[PathBuf]) -> String {
    let out = Command::new(stalltrace_bin())
        .arg("report")
        .args(files)
        // Wide enough that no sentence wraps: the checks read whole lines.
        .arg("--width")
        .arg("400")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "stalltrace report {files:?}: {text}");
    text
}

/// The report's lines about seqnos missing or read twice within the set
/// (its words: "seqno N missing", "read again and skipped").
pub fn report_gaps(report: &str) -> Vec<&str> {
    report
        .lines()
        // Only the stream's seqno lines: "missing" alone also matches an
        // optional hook the kernel lacks.
        .filter(|l| l.contains("seqno") && (l.contains("missing") || l.contains("read again")))
        .collect()
}

/// The run's stop record, once the receiver has it.
pub fn received_stop(received: &str) -> Option<Value> {
    received
        .lines()
        .rev()
        .filter(|l| l.contains(r#""type":"stop""#))
        .find_map(|l| serde_json::from_str(l).ok())
}

/// Lines and bytes in all the files.
pub fn totals(written: &[Written]) -> (usize, u64) {
    let lines = written.iter().map(|w| w.lines.len()).sum();
    let bytes = written
        .iter()
        .map(|w| std::fs::metadata(&w.path).unwrap().len())
        .sum();
    (lines, bytes)
}

pub fn longest_line(text: &str) -> usize {
    text.lines().map(str::len).max().unwrap_or(0)
}
