//! `report --since/--until` over a rotated set: the files whose span misses
//! the window are not read, and the report says so without calling the
//! run's earlier records missing.

use super::set_tests::{Dir, flat, names, rotated_run, warnings};
use serde_json::Value;

use super::*;
use crate::report::fixtures::*;
use crate::report::render_text;
use crate::report::time::parse_us;

fn at(s: f64) -> i64 {
    parse_us(&ts(s)).unwrap()
}

/// Reads 1 s apart: file 0 holds 1–3 s, file 1 4–7 s, file 2 8–9 s (each
/// file after the first begins with its `start` at the last read before it).
fn three_files(dir: &Dir) -> Vec<PathBuf> {
    let files = rotated_run(RUN, &[3, 4, 2]);
    vec![
        dir.plain("stalltrace.jsonl", &files[2]),
        dir.plain("stalltrace.jsonl.1", &files[1]),
        dir.gzip("stalltrace.jsonl.2.gz", &files[0]),
    ]
}

#[test]
fn files_before_the_window_are_not_read_and_not_called_missing() {
    let dir = Dir::new("window-before");
    let window = Window {
        since_us: at(4.5),
        until_us: i64::MAX,
    };
    let r = read_reports_within(&three_files(&dir), Some(window)).unwrap();
    assert_eq!(
        names(&r),
        [
            "stalltrace.jsonl.2.gz:OutsideWindow",
            "stalltrace.jsonl.1:Whole",
            "stalltrace.jsonl:Whole"
        ]
    );
    // The reads at 5, 6, 7, 8 and 9 s, 5 requests each.
    assert_eq!(r.disks[0].ops[0].requests, 25);
    assert!(!warnings(&r).contains("not here"), "{}", warnings(&r));
    let text = dir.unnamed(&flat(&render_text(&r, 100)));
    assert!(
        text.contains("stalltrace.jsonl.2.gz (not read: outside --since/--until)"),
        "{text}"
    );
}

/// A run of four files beginning at 0, 2, 4 and 6 s, written from file
/// `first` on (named as logrotate numbers them, the newest `.0`), reported up
/// to 3 s.
fn four_files_until_3s(dir: &Dir, first: usize) -> Report {
    let files = rotated_run(RUN, &[2, 2, 2, 2]);
    let paths: Vec<PathBuf> = files[first..]
        .iter()
        .enumerate()
        .map(|(i, f)| dir.plain(&format!("stalltrace.jsonl.{}", 3 - first - i), f))
        .collect();
    let window = Window {
        since_us: i64::MIN,
        until_us: at(3.0),
    };
    read_reports_within(&paths, Some(window)).unwrap()
}

#[test]
fn of_the_files_after_the_window_only_the_first_is_read() {
    let dir = Dir::new("window-after");
    let r = four_files_until_3s(&dir, 0);
    // The file after the window's end is read for the `closed` records of
    // episodes still open at its end; the one after that is not.
    assert_eq!(
        names(&r),
        [
            "stalltrace.jsonl.3:Whole",
            "stalltrace.jsonl.2:Whole",
            "stalltrace.jsonl.1:Whole",
            "stalltrace.jsonl.0:OutsideWindow"
        ]
    );
    assert_eq!(r.disks[0].ops[0].requests, 3 * 5);
}

/// `records` moved `secs` later.
fn later(records: &[Value], secs: f64) -> Vec<Value> {
    use crate::report::time::rfc3339;
    records
        .iter()
        .map(|r| {
            let mut r = r.clone();
            for key in ["ts", "start"] {
                if let Some(t) = r[key].as_str().and_then(parse_us) {
                    r[key] = rfc3339(t + (secs * 1e6) as i64).into();
                }
            }
            r
        })
        .collect()
}

#[test]
fn the_last_run_to_begin_in_the_window_is_the_one_reported() {
    const RESTARTED: &str = "9a1b2c3d-0000-4000-8000-000000000002";
    let first = rotated_run(RUN, &[3, 4]);
    // The service restarted 20 s after the first run began, appending to its
    // file: one file holds the first run's end and the second run.
    let second = later(&rotated_run(RESTARTED, &[2])[0], 20.0);
    let dir = Dir::new("window-restart");
    let paths = vec![
        dir.gzip("stalltrace.jsonl.1.gz", &first[0]),
        dir.plain("stalltrace.jsonl", &[first[1].clone(), second].concat()),
    ];
    let window = Window {
        since_us: at(2.0),
        until_us: at(30.0),
    };
    let r = read_reports_within(&paths, Some(window)).unwrap();
    assert_eq!(r.run.run_id.as_deref(), Some(RESTARTED));
    // The second run's reads at 21 and 22 s, not the first run's.
    assert_eq!(r.disks[0].ops[0].requests, 2 * 5);
    assert_eq!(
        names(&r),
        ["stalltrace.jsonl.1.gz:EarlierRun", "stalltrace.jsonl:Whole"]
    );
    let said = warnings(&r);
    assert!(
        said.contains(
            "1 earlier run overlaps the window: only the last run to begin in it is reported"
        ),
        "{said}"
    );
    assert!(!said.contains("without a `start`"), "{said}");
    // Without a window, the first run is the one reported, as before.
    let whole = read_reports(&paths).unwrap();
    assert_eq!(whole.run.run_id.as_deref(), Some(RUN));
}

#[test]
fn files_left_out_after_the_window_do_not_hide_that_the_first_file_is_missing() {
    let dir = Dir::new("window-missing-first");
    // The first file (seqno 0–2) is not given.
    let r = four_files_until_3s(&dir, 1);
    assert_eq!(
        names(&r),
        [
            "stalltrace.jsonl.2:Whole",
            "stalltrace.jsonl.1:Whole",
            "stalltrace.jsonl.0:OutsideWindow"
        ]
    );
    let said = warnings(&r);
    assert!(said.contains("(seqno 0–2) are not here"), "{said}");
}
