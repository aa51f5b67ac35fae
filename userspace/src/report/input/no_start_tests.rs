//! Streams that hold no `start` record: logrotate `copytruncate` with a low
//! `rotate` count deletes the only file with the run's `start`, and what is
//! left must still be reported. Schema 2 records each say their run
//! (`schema`, `run`, `seqno`, `host`, `ts`), so the report is built from
//! them, and says so; schema 1 records do not, and are refused as before.

use serde_json::{Value, json};

use super::set_tests::{Dir, flat, names, read_at, warnings};
use super::*;
use crate::report::fixtures::*;
use crate::report::time::parse_us;
use crate::report::{render_html, render_text};

/// One run's records, seqno 0 (`start`) to 13 (`stop`, counting
/// `block_written` reads): reads at 1–11 s, a retransmission at 8.5 s.
fn run(block_written: u64) -> Vec<Value> {
    let mut records = vec![start()];
    records.extend((1..=8).map(|s| read_at(s as f64)));
    records.push(retransmit(8.5, 50123, 51, true, 408.0));
    records.extend((9..=11).map(|s| read_at(s as f64)));
    records.push(stop(
        11.5,
        json!({"start": 1, "block": block_written, "tcp_retransmit": 1}),
        json!({}),
    ));
    as_v2(&records, RUN, 0)
}

#[test]
fn a_schema_2_set_without_its_start_is_reported_from_its_records() {
    // copytruncate, `rotate 1`: seqno 0–4 (with the `start`) were in the
    // file deleted; .1 holds 5–9, the live file 10–13.
    let records = run(11);
    let v = schema_2_validator();
    for r in &records {
        assert_valid(&v, r);
    }
    let dir = Dir::new("no-start");
    let live = dir.plain("db.jsonl", &records[10..]);
    let older = dir.gzip("db.jsonl.1.gz", &records[5..10]);
    let r = read_reports(&[live, older]).unwrap();
    assert_eq!(names(&r), ["db.jsonl.1.gz:Whole", "db.jsonl:Whole"]);

    // The header, from the records.
    let run = &r.run;
    assert!(run.inferred);
    assert_eq!(
        (run.host.as_str(), run.run_id.as_deref(), run.schema),
        (HOST, Some(RUN), 2)
    );
    assert_eq!(
        (run.kernel.as_str(), run.version.as_str()),
        ("unknown", "unknown")
    );
    assert_eq!(
        (run.start_us, run.end_us),
        (parse_us(&ts(5.0)).unwrap(), parse_us(&ts(11.5)).unwrap())
    );
    assert_eq!((run.interval_ms, run.intervals), (1000, 7));
    assert_eq!(run.stop_reason.as_deref(), Some("duration"));
    let families: Vec<(&str, bool)> = run
        .families
        .iter()
        .map(|f| (f.family.as_str(), f.attached))
        .collect();
    assert_eq!(families, [("block", true), ("tcp", true)]);
    assert!(run.filters.is_empty() && run.missing_hooks.is_empty());

    // Every record here is used; the 5 before seqno 5 are said missing,
    // and `stop.records` (1 start and 11 reads written, 7 reads here) is
    // no false alarm: the records before the first seqno account for it.
    assert_eq!(r.disks[0].ops[0].requests, 7 * 5);
    assert_eq!(r.retransmits.events, 1);
    assert_eq!(r.stream.before_start, 0);
    assert_eq!(r.stream.sequence.first, Some(5));
    assert!(r.stream.missing.is_empty(), "{:?}", r.stream.missing);
    let w = dir.unnamed(&warnings(&r));
    for said in [
        "the run's `start` record is not in the files given: this report is built from what the records say",
        "the run's kernel, stalltrace version, hooks, filters and thresholds are unknown",
        "the run's first 5 records (seqno 0–4) are not here: it begins without the run's `start`",
    ] {
        assert!(w.contains(said), "{said:?} not in:\n{w}");
    }
    assert!(!w.contains("fewer records than the run wrote"), "{w}");

    let text = dir.unnamed(&flat(&render_text(&r, 100)));
    for said in [
        &format!(
            "stalltrace report — host {HOST} — run {RUN}, schema 2; kernel and stalltrace version unknown (no `start` record)"
        ),
        "(6.5 s; 7 intervals of about 1000 ms; ended by duration)",
        "attached block, tcp (inferred from the records here: a family with nothing to report writes none",
        "limited to unknown (no `start` record)",
        "stream !! the run's `start` record is not in the files given",
    ] {
        assert!(text.contains(said), "{said:?} not in:\n{text}");
    }
    let page = render_html(&r);
    for said in [
        "the run's `start` record is not in the files given",
        "kernel and stalltrace version unknown (no `start` record)",
        "7 intervals of about 1000 ms",
        "block, tcp (inferred from the records here",
        "<dt>limited to</dt><dd>unknown (no `start` record)</dd>",
    ] {
        assert!(page.contains(said), "{said:?} not in the page");
    }
}

#[test]
fn records_missing_beyond_what_seqnos_explain_are_still_said() {
    // `stop` says 20 reads were written: 13 more than are here, and only 5
    // records lie before the first seqno.
    let records = run(20);
    let r = Report::from_text(&lines(&records[5..])).unwrap();
    assert!(r.run.inferred);
    assert_eq!(
        r.stream.missing,
        [("block".to_string(), 20, 7), ("start".to_string(), 1, 0)]
    );
    // One stream, not a set: said as such.
    let w = warnings(&r);
    assert!(
        w.contains("the run's `start` record is not in the stream:"),
        "{w}"
    );
    assert!(w.contains("fewer records than the run wrote"), "{w}");
}

#[test]
fn a_start_read_after_records_of_its_run_completes_the_header() {
    // `zcat -f TAIL FILE | stalltrace report -`: a copytruncate tail, then
    // the run's next file, which begins with its `start` repeated.
    let mut records = run(11);
    let mut repeat = records[0].clone();
    repeat["file"] = json!(1);
    repeat["seqno"] = json!(10);
    repeat["ts"] = json!(ts(8.7));
    for (i, r) in records[10..].iter_mut().enumerate() {
        r["seqno"] = json!(11 + i as u64);
    }
    records.insert(10, repeat);
    let r = Report::from_text(&lines(&records[5..])).unwrap();
    assert!(!r.run.inferred);
    assert_eq!(
        (r.run.kernel.as_str(), r.run.interval_ms, r.run.slow_io_ms),
        ("6.18.0", 1000, 50.0)
    );
    assert_eq!(r.run.families[1].mode.as_deref(), Some("raw_tp"));
    // The records before the `start` count, and the window begins with them.
    assert_eq!(r.disks[0].ops[0].requests, 7 * 5);
    assert_eq!(r.stream.before_start, 0);
    assert_eq!(r.run.start_us, parse_us(&ts(5.0)).unwrap());
    let w = warnings(&r);
    assert!(!w.contains("is not in the stream"), "{w}");
    assert!(
        w.contains("the run's first 5 records (seqno 0–4) are not here"),
        "{w}"
    );
}

#[test]
fn schema_1_records_without_a_start_are_refused_as_before() {
    // Schema 1 writes `schema` on `start` only, and no run id or seqno.
    let tail = [
        read_at(1.0),
        read_at(2.0),
        stop(2.5, json!({"start": 1, "block": 2}), json!({})),
    ];
    assert!(matches!(
        Report::from_text(&lines(&tail)),
        Err(ReportError::NoStart { records: 3 })
    ));
    let dir = Dir::new("v1-no-start");
    let e = read_reports(&[
        dir.plain("v1.jsonl", &tail[1..]),
        dir.plain("v1.jsonl.1", &tail[..1]),
    ])
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("has no `start` record") && e.contains("from its first line"),
        "{e}"
    );
    // A schema 1 `schema` on a record, without a run id, says no more.
    let mut said = read_at(1.0);
    said["schema"] = json!(1);
    said["seqno"] = json!(4);
    assert!(matches!(
        Report::from_text(&lines(&[said])),
        Err(ReportError::NoStart { .. })
    ));
}

#[test]
fn records_of_a_schema_this_version_does_not_read_are_refused_without_a_start() {
    let mut records = run(11);
    for r in &mut records {
        r["schema"] = json!(4);
    }
    match Report::from_text(&lines(&records[5..])) {
        Err(ReportError::Schema { found, writer }) => {
            assert_eq!((found.as_str(), writer), ("4", None));
        }
        other => panic!("{other:?}"),
    }
}
