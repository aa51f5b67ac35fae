//! Hostile input for `stalltrace report`'s reader, in process so that
//! thousands of cases run in seconds: random bytes, byte mutations of the real
//! recording, records with hostile values, and gzip (cut, corrupt, or the same
//! stream compressed). tests/hostile.rs runs the binary on the big inputs (a
//! gzip bomb, a multi-GB line) and measures its memory.
//!
//! Every case is read and rendered as `stalltrace report` does (text and
//! page): nothing may panic, and a stream that cannot be reported is one
//! short line. The seed is fixed so a failure reproduces; set
//! PROPTEST_RNG_SEED to explore others.

use std::io::Write;

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed};
use serde_json::{Value, json};

use super::*;
use crate::report::fixtures;
use crate::report::lines;
use crate::report::{render_html, render_text};

/// Cases per property; each reads and renders a stream.
fn config(cases: u32) -> Config {
    let mut c = Config::with_cases(cases);
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(0x5747_1ace);
    }
    c.failure_persistence = None;
    c
}

/// The longest error line a user should see: the path and a sentence or two.
const MAX_ERROR_LEN: usize = 600;

/// Read `bytes` as `stalltrace report` does and render what comes out; an
/// error must be one short line.
fn report_of(bytes: &[u8]) -> Result<Report, UserError> {
    let result = read_stream(bytes, "input.jsonl");
    match &result {
        Ok((report, note)) => {
            let text = render_text(report, 100);
            assert!(text.contains("stalltrace report"), "{text}");
            render_html(report);
            if let Some(note) = note {
                assert_one_line(note);
            }
        }
        Err(e) => assert_one_line(&e.to_string()),
    }
    result.map(|(r, _)| r)
}

fn assert_one_line(s: &str) {
    assert!(
        !s.chars().any(char::is_control),
        "control character in {s:?}"
    );
    assert!(s.len() <= MAX_ERROR_LEN, "{} bytes: {s}", s.len());
}

fn gzip(bytes: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

fn recording() -> Vec<String> {
    fixtures::recorded_with_episodes()
}

/// `start`, `n` consecutive lines from `at` (wrapping), and `stop`: a short
/// stream (fast in a debug build) that still has every record type nearby.
fn window(lines: &[String], at: usize, n: usize) -> Vec<String> {
    let body = &lines[1..lines.len() - 1];
    let mut out = vec![lines[0].clone()];
    out.extend((0..n).map(|i| body[(at + i) % body.len()].clone()));
    out.push(lines.last().unwrap().clone());
    out
}

/// The line numbers of the first bad lines (of the one file read).
fn bad_line_numbers(r: &Report) -> Vec<usize> {
    r.stream.first_bad_lines.iter().map(|at| at.line).collect()
}

fn text(lines: &[String]) -> String {
    lines.join("\n") + "\n"
}

// ---- random bytes --------------------------------------------------------------

/// Bytes that are mostly not a stream, but sometimes look like one: raw,
/// JSON-ish tokens, with newlines, and gzip-compressed or gzip-headed.
fn hostile_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        Just(b"{".to_vec()),
        Just(b"}".to_vec()),
        Just(b"\n".to_vec()),
        Just(b"\"type\":".to_vec()),
        Just(b"\"start\"".to_vec()),
        Just(b"\"schema\":1,".to_vec()),
        Just(b"[[[[".to_vec()),
        Just(b"1e400".to_vec()),
        Just(vec![0xff, 0xfe, 0]),
        prop::collection::vec(any::<u8>(), 0..16),
    ];
    let raw = prop::collection::vec(any::<u8>(), 0..4096);
    let tokens = prop::collection::vec(token, 0..200).prop_map(|t| t.concat());
    let plain = prop_oneof![raw, tokens];
    prop_oneof![
        3 => plain.clone(),
        1 => plain.clone().prop_map(|b| gzip(&b)),
        1 => plain.prop_map(|b| [&GZIP_MAGIC[..], &b].concat()),
    ]
}

proptest! {
    #![proptest_config(config(1000))]
    #[test]
    fn random_bytes_are_refused_in_one_line_or_reported(bytes in hostile_bytes()) {
        let _ = report_of(&bytes);
    }
}

// ---- byte mutations of the real recording ----------------------------------------

#[derive(Clone, Debug)]
enum Mutation {
    Flip {
        at: usize,
        bit: u8,
    },
    Insert {
        at: usize,
        bytes: Vec<u8>,
    },
    Delete {
        at: usize,
        len: usize,
    },
    /// A line repeated, or moved elsewhere.
    CopyLine {
        from: usize,
        to: usize,
    },
    Truncate {
        at: usize,
    },
}

fn mutation() -> impl Strategy<Value = Mutation> {
    let at = any::<usize>();
    prop_oneof![
        (at, 0..8u8).prop_map(|(at, bit)| Mutation::Flip { at, bit }),
        (
            at,
            prop_oneof![
                prop::collection::vec(any::<u8>(), 1..8),
                Just(b"\n".to_vec()),
                Just(b"\0".to_vec()),
                Just(b"\"".to_vec()),
                Just(b"}".to_vec()),
            ]
        )
            .prop_map(|(at, bytes)| Mutation::Insert { at, bytes }),
        (at, 1..200usize).prop_map(|(at, len)| Mutation::Delete { at, len }),
        (at, at).prop_map(|(from, to)| Mutation::CopyLine { from, to }),
        at.prop_map(|at| Mutation::Truncate { at }),
    ]
}

/// Applies `m` to `bytes` at or after `keep` (the first line stays whole).
fn apply(bytes: &mut Vec<u8>, m: &Mutation, keep: usize) {
    let span = bytes.len() - keep;
    if span == 0 {
        return;
    }
    let pos = |at: usize| keep + at % span;
    match m {
        Mutation::Flip { at, bit } => bytes[pos(*at)] ^= 1 << bit,
        Mutation::Insert { at, bytes: b } => {
            let p = pos(*at);
            bytes.splice(p..p, b.iter().copied());
        }
        Mutation::Delete { at, len } => {
            let p = pos(*at);
            bytes.drain(p..(p + len).min(bytes.len()));
        }
        Mutation::CopyLine { from, to } => {
            let start = |p: usize| {
                bytes[..p]
                    .iter()
                    .rposition(|&b| b == b'\n')
                    .map_or(0, |i| i + 1)
            };
            let from = start(pos(*from));
            let end = bytes[from..]
                .iter()
                .position(|&b| b == b'\n')
                .map_or(bytes.len(), |i| from + i + 1);
            let line = bytes[from..end].to_vec();
            let to = start(pos(*to)).max(keep);
            bytes.splice(to..to, line);
        }
        Mutation::Truncate { at } => bytes.truncate(pos(*at)),
    }
}

/// What the report must say about lines, from the bytes alone: non-blank
/// lines up to a second `start`, those that are not JSON records and end in
/// a newline (bad), and whether the last one is a record cut short.
struct LineOracle {
    lines: usize,
    bad: usize,
    stalls: usize,
    truncated: bool,
}

fn line_oracle(bytes: &[u8]) -> LineOracle {
    let mut o = LineOracle {
        lines: 0,
        bad: 0,
        stalls: 0,
        truncated: false,
    };
    let mut rest = bytes;
    let mut starts = 0;
    while !rest.is_empty() {
        let (line, terminated) = match rest.iter().position(|&b| b == b'\n') {
            Some(i) => (&rest[..i], true),
            None => (rest, false),
        };
        rest = &rest[(line.len() + 1).min(rest.len())..];
        let s = String::from_utf8_lossy(line);
        if s.trim().is_empty() {
            continue;
        }
        o.lines += 1;
        let kind = serde_json::from_str::<Value>(s.trim())
            .ok()
            .and_then(|v| v.get("type").and_then(Value::as_str).map(String::from));
        match kind.as_deref() {
            None if terminated => o.bad += 1,
            None => o.truncated = true,
            Some("stall") => o.stalls += 1,
            Some("start") => {
                starts += 1;
                if starts == 2 {
                    break;
                }
            }
            Some(_) => {}
        }
    }
    o
}

proptest! {
    #![proptest_config(config(300))]
    /// Mutations after the `start` line: always a report, which counts every
    /// line that is not a record (a stall record can also be refused by the
    /// episode pairing, so those may add to the count), and the same report
    /// from the gzip-compressed stream.
    #[test]
    fn a_mutated_recording_is_reported_with_its_bad_lines_counted(
        at in any::<usize>(),
        whole in prop::bool::weighted(0.05),
        mutations in prop::collection::vec(mutation(), 1..8),
    ) {
        let lines = recording();
        let lines = if whole { lines } else { window(&lines, at, 30) };
        let mut bytes = text(&lines).into_bytes();
        let keep = lines[0].len() + 1;
        for m in &mutations {
            apply(&mut bytes, m, keep);
        }
        let r = report_of(&bytes).expect("the start line is whole: a report");
        let o = line_oracle(&bytes);
        prop_assert_eq!(r.stream.lines, o.lines);
        prop_assert!(r.stream.bad_lines >= o.bad && r.stream.bad_lines <= o.bad + o.stalls,
            "bad lines {} for {} not records and {} stalls", r.stream.bad_lines, o.bad, o.stalls);
        prop_assert_eq!(r.stream.truncated_last_line, o.truncated);

        let z = report_of(&gzip(&bytes)).expect("the same stream, compressed");
        prop_assert_eq!(&z.stream, &r.stream);
        prop_assert_eq!(z.episodes.len(), r.episodes.len());
        prop_assert_eq!(z.disks.len(), r.disks.len());
    }

}

proptest! {
    #![proptest_config(config(500))]
    /// Mutations anywhere, the start line too: a report or one line, never a panic.
    #[test]
    fn a_recording_mutated_anywhere_never_panics(
        at in any::<usize>(),
        mutations in prop::collection::vec(mutation(), 1..8),
    ) {
        let mut bytes = text(&window(&recording(), at, 20)).into_bytes();
        for m in &mutations {
            apply(&mut bytes, m, 0);
        }
        let _ = report_of(&bytes);
    }

}

proptest! {
    #![proptest_config(config(300))]
    /// A gzip stream cut, or with a byte changed, anywhere: a report of what
    /// decompressed (never more lines than the whole) with a note, or one line.
    #[test]
    fn a_cut_or_corrupt_gzip_is_reported_up_to_the_damage(
        at in any::<usize>(),
        cut in any::<prop::sample::Index>(),
        flip in prop::option::of((any::<prop::sample::Index>(), 1..=255u8)),
    ) {
        let bytes = text(&window(&recording(), at, 30)).into_bytes();
        let whole = report_of(&bytes).unwrap();
        let mut z = gzip(&bytes);
        match flip {
            Some((i, x)) => { let i = i.index(z.len()); z[i] ^= x; }
            None => z.truncate(cut.index(z.len())),
        }
        match read_stream(&z[..], "x.gz") {
            Ok((r, None)) => {
                // Undamaged as far as gzip can tell (a changed mtime or OS
                // byte): then nothing may differ. A changed byte of data
                // is caught by the CRC and never reported as data.
                prop_assert_eq!(&r.stream, &whole.stream);
                prop_assert_eq!(r.disks.len(), whole.disks.len());
            }
            // Cut: what decompressed is a prefix of the stream. (A changed
            // byte can decompress to other lines before gzip notices.)
            Ok((r, Some(_))) => if flip.is_none() {
                prop_assert!(r.stream.lines <= whole.stream.lines);
            },
            Err(e) => assert_one_line(&e.to_string()),
        }
    }
}

// ---- records with hostile values ---------------------------------------------------

/// Values a field should never hold: wrong types, extreme numbers, deep
/// nesting (below serde_json's parse limit of 128, so the report sees them),
/// long and odd strings.
fn hostile_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        prop_oneof![
            Just(json!(u64::MAX)),
            Just(json!(i64::MIN)),
            Just(json!(-1)),
            Just(json!(0)),
            Just(json!(f64::MAX)),
            Just(json!(-f64::MAX)),
            Just(json!(f64::MIN_POSITIVE)),
            Just(json!(-0.0)),
            Just(json!(1.5)),
            Just(json!(18_446_744_073_709_551_616.0)),
            any::<i64>().prop_map(|n| json!(n)),
            any::<f64>()
                .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
                .prop_map(|f| json!(f)),
        ],
        prop_oneof![
            Just(json!("")),
            Just(json!("2026-11-22T10:00:00Z")),
            Just(json!("9999-99-99T99:99:99.999999Z")),
            Just(json!("\u{1b}[31m\u{0}\u{202e}")),
            Just(json!("x".repeat(10_000))),
            Just(json!("stop")),
            Just(json!("start")),
            ".{0,12}".prop_map(Value::String),
        ],
    ];
    let nested = (1..120usize, any::<bool>()).prop_map(|(depth, array)| {
        (0..depth).fold(
            json!(1),
            |v, _| if array { json!([v]) } else { json!({"a": v}) },
        )
    });
    let tree = leaf.prop_recursive(3, 24, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::btree_map("[a-z_]{1,8}", inner, 0..6)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    });
    prop_oneof![4 => tree, 1 => nested]
}

/// Replaces the value at a path chosen by `steps` (each picks a child) in `v`.
fn replace_at(v: &mut Value, steps: &[usize], with: Value) {
    let (Some(&step), rest) = (steps.first(), &steps[steps.len().min(1)..]) else {
        *v = with;
        return;
    };
    let child = match v {
        Value::Object(m) if !m.is_empty() => {
            let key = m.keys().nth(step % m.len()).unwrap().clone();
            m.get_mut(&key)
        }
        Value::Array(a) if !a.is_empty() => {
            let n = a.len();
            a.get_mut(step % n)
        }
        _ => None,
    };
    match child {
        // Stop early sometimes, so that whole objects and arrays are replaced too.
        Some(c) if step % 4 != 0 => replace_at(c, rest, with),
        _ => *v = with,
    }
}

proptest! {
    #![proptest_config(config(500))]
    /// Fields of real records (the start record too) replaced by hostile
    /// values: never a panic; a report whenever `start` kept its type and schema.
    #[test]
    fn records_with_hostile_values_never_panic(
        at in any::<usize>(),
        edits in prop::collection::vec(
            (any::<prop::sample::Index>(), prop::collection::vec(any::<usize>(), 0..5), hostile_value()),
            1..10,
        ),
    ) {
        let mut lines = window(&recording(), at, 25);
        for (line, steps, value) in edits {
            let i = line.index(lines.len());
            let mut v: Value = serde_json::from_str(&lines[i]).unwrap();
            replace_at(&mut v, &steps, value);
            lines[i] = v.to_string();
        }
        let start: Value = serde_json::from_str(&lines[0]).unwrap();
        let result = report_of(text(&lines).as_bytes());
        if start["type"] == "start" && start["schema"] == 1 {
            prop_assert!(result.is_ok(), "{:?}", result.err());
        }
    }
}

// ---- fixed cases -------------------------------------------------------------------

#[test]
fn nesting_past_the_json_parsers_limit_is_a_bad_line() {
    let mut lines = recording();
    let deep = "[".repeat(100_000) + &"]".repeat(100_000);
    lines.insert(2, deep.clone());
    lines.insert(3, format!("{{\"type\":\"block\",\"x\":{deep}}}"));
    let r = report_of(text(&lines).as_bytes()).unwrap();
    assert_eq!(bad_line_numbers(&r), [3, 4]);
}

#[test]
fn numbers_json_cannot_hold_are_bad_lines() {
    let mut lines = recording();
    lines.insert(2, r#"{"type":"block","count":1e400}"#.into());
    lines.insert(3, r#"{"type":"tcp_rtt","count":-1e99999}"#.into());
    let r = report_of(text(&lines).as_bytes()).unwrap();
    assert_eq!(bad_line_numbers(&r), [3, 4]);
}

/// The schema a newer stalltrace wrote is quoted in the refusal: it must not
/// carry the file's control characters or length onto the user's terminal.
#[test]
fn values_quoted_in_an_error_are_short_and_printable() {
    let mut start: Value = serde_json::from_str(&recording()[0]).unwrap();
    start["schema"] = json!(format!("2\u{1b}]0;pwned\u{7}{}", "9".repeat(100_000)));
    start["version"] = json!("x\n".repeat(10_000));
    let e = report_of(format!("{start}\n").as_bytes())
        .unwrap_err()
        .to_string();
    assert!(e.contains("record schema 2"), "{e}");
}

#[test]
fn a_line_at_the_cap_is_read_and_one_past_it_is_skipped() {
    let lines = recording();
    for (pad, bad) in [(0, 0), (1, 1)] {
        let mut l = lines.clone();
        let block = l
            .iter()
            .position(|x| x.contains("\"type\":\"block\""))
            .unwrap();
        let width = MAX_LINE + pad;
        let spaces = width - l[block].len();
        l[block].push_str(&" ".repeat(spaces));
        let r = report_of(text(&l).as_bytes()).unwrap();
        assert_eq!(r.stream.bad_lines, bad, "a line of {width} bytes");
        // The cut line is the block record: one fewer of them found than written.
        assert_eq!(r.stream.missing.len(), bad, "{:?}", r.stream.missing);
    }
}

#[test]
fn a_gzip_of_nothing_but_a_long_line_is_refused_after_the_cap() {
    let long = gzip(&vec![b'x'; MAX_LINE * 2]);
    let e = report_of(&long).unwrap_err().to_string();
    assert!(e.contains("line 1 is longer than 4 MiB"), "{e}");
    // Zeros: read past as a copytruncate hole up to MAX_HOLE_READ, then
    // refused as a long line like any other.
    let zeros = gzip(&vec![0u8; lines::MAX_HOLE_READ as usize + MAX_LINE * 2]);
    let e = report_of(&zeros).unwrap_err().to_string();
    assert!(e.contains("line 1 is longer than 4 MiB"), "{e}");
    let e = report_of(&[b"# notes\n\n".to_vec(), vec![b'a'; MAX_LINE + 1]].concat())
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 3 is longer than 4 MiB"), "{e}");
}
