//! Rotated sets read as one stream: files written to a temporary directory
//! as `stalltrace run --out-max-mb` and logrotate leave them (plain and
//! gzip, given in the shell's name order or shuffled), with the damage a
//! pipeline does (records lost between files or dropped by the output queue,
//! a file given twice, a copytruncate tail, a record written in parts with a
//! part missing), schema 1 and schema 2 together. Each case checks the
//! report's model, and what it says, against what was done to the files.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

use serde_json::{Value, json};

use super::*;
use crate::report::fixtures::*;
use crate::report::health::FileRead;
use crate::report::lines::LineRef;
use crate::report::{render_html, render_text};

/// A scratch directory, removed on drop.
pub(super) struct Dir(pub(super) PathBuf);

impl Dir {
    pub(super) fn new(test: &str) -> Self {
        static N: AtomicUsize = AtomicUsize::new(0);
        let dir = std::env::temp_dir().join(format!(
            "stalltrace-set-{}-{test}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }

    pub(super) fn plain(&self, name: &str, records: &[Value]) -> PathBuf {
        let path = self.0.join(name);
        std::fs::write(&path, lines(records)).unwrap();
        path
    }

    pub(super) fn gzip(&self, name: &str, records: &[Value]) -> PathBuf {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        e.write_all(lines(records).as_bytes()).unwrap();
        let path = self.0.join(name);
        std::fs::write(&path, e.finish().unwrap()).unwrap();
        path
    }
}

impl Dir {
    /// `text` with this directory left out of the paths it names.
    pub(super) fn unnamed(&self, text: &str) -> String {
        text.replace(&format!("{}/", self.0.display()), "")
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A read of 5 requests at ~1 µs ending at `at` seconds.
pub(super) fn read_at(at: f64) -> Value {
    block(
        at,
        "nvme0n1",
        "read",
        json!([[1.024, 1.087, 5]]),
        json!([[2.0, 2.0, 5]]),
    )
}

/// The repeat of the run's `start` that begins its file number `n`.
fn start_of_file(n: u64, at: f64) -> Value {
    let mut s = start();
    s["file"] = json!(n);
    s["ts"] = json!(ts(at));
    s
}

/// A schema 2 run as `--out-max-mb` rotation writes it: `reads[i]` reads in
/// file `i`, each file after the first opened by a repeat of the `start`,
/// seqnos consecutive across files, and `stop` (counting every record) last.
pub(super) fn rotated_run(run: &str, reads: &[usize]) -> Vec<Vec<Value>> {
    let mut files = Vec::new();
    let mut at = 0.0;
    for (i, &n) in reads.iter().enumerate() {
        let mut file = vec![if i == 0 {
            start()
        } else {
            start_of_file(i as u64, at)
        }];
        for _ in 0..n {
            at += 1.0;
            file.push(read_at(at));
        }
        files.push(file);
    }
    let total: usize = reads.iter().sum();
    files.last_mut().unwrap().push(stop(
        at + 0.5,
        json!({"start": reads.len(), "block": total}),
        json!({}),
    ));
    let mut seqno = 0;
    files
        .into_iter()
        .map(|f| {
            let v2 = as_v2(&f, run, seqno);
            seqno += f.len() as u64;
            v2
        })
        .collect()
}

pub(super) fn names(r: &Report) -> Vec<String> {
    r.stream
        .files
        .iter()
        .map(|f| {
            let name = f.name.rsplit('/').next().unwrap();
            format!("{name}:{:?}", f.read)
        })
        .collect()
}

pub(super) fn warnings(r: &Report) -> String {
    r.stream.warnings(&r.run).join("\n")
}

#[test]
fn a_rotated_set_in_any_order_is_read_as_the_one_stream_it_was() {
    let files = rotated_run(RUN, &[3, 4, 2]);
    let v = schema_2_validator();
    for r in files.concat() {
        assert_valid(&v, &r);
    }
    let dir = Dir::new("order");
    let oldest = dir.gzip("stalltrace.jsonl.2.gz", &files[0]);
    let middle = dir.plain("stalltrace.jsonl.1", &files[1]);
    let newest = dir.plain("stalltrace.jsonl", &files[2]);
    let whole = Report::from_text(&lines(&files.concat())).unwrap();
    for given in [
        // As the shell expands `stalltrace.jsonl*`, and shuffled.
        [newest.clone(), middle.clone(), oldest.clone()],
        [middle.clone(), oldest.clone(), newest.clone()],
    ] {
        let r = read_reports(&given).unwrap();
        assert_eq!(
            names(&r),
            [
                "stalltrace.jsonl.2.gz:Whole",
                "stalltrace.jsonl.1:Whole",
                "stalltrace.jsonl:Whole"
            ]
        );
        let ordinals: Vec<_> = r.stream.files.iter().map(|f| f.run_file).collect();
        assert_eq!(ordinals, [Some(0), Some(1), Some(2)]);
        assert_eq!(r.stream.files[1].seqnos, Some((4, 8)));
        assert_eq!(r.disks[0].ops[0].requests, 9 * 5);
        assert_eq!(
            r.disks[0].ops[0].latency.buckets(),
            whole.disks[0].ops[0].latency.buckets()
        );
        assert_eq!(
            (r.run.start_us, r.run.end_us),
            (whole.run.start_us, whole.run.end_us)
        );
        assert!(r.stream.warnings(&r.run).is_empty(), "{}", warnings(&r));
        assert!(r.stream.missing.is_empty(), "{:?}", r.stream.missing);
        let text = dir.unnamed(&flat(&render_text(&r, 100)));
        assert!(
            text.contains(
                "files 3 files, in stream order: stalltrace.jsonl.2.gz (run file 0, seqno 0–3)"
            ),
            "{text}"
        );
        assert!(text.contains("stream complete"), "{text}");
    }
}

/// The text with its line wrapping undone, to look for phrases.
pub(super) fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// A sql_instance record written in `parts.len()` parts, each with those files.
fn instance_parts(at: f64, parts: &[&[&str]]) -> Vec<Value> {
    (1..)
        .zip(parts)
        .map(|(i, paths)| {
            let files: Vec<Value> = paths
                .iter()
                .map(|p| json!({"path": p, "role": "data", "disks": ["259:0"]}))
                .collect();
            json!({"ts": ts(at), "host": HOST, "type": "sql_instance", "pid": 4242,
                "netns": 4026531840u64, "tds_ports": [1433], "ag_ports": [5022],
                "files": files, "disk_roles": {"259:0": "data"},
                "part": i, "parts": parts.len(), "split": "files"})
        })
        .collect()
}

#[test]
fn gaps_repeats_and_records_in_parts_are_found_and_said() {
    // seqno: 0 start, 1-3 reads | 4 start, 5-8 reads, 9 lost | 10 start,
    // 11-13 an instance in 3 parts, 14 read | 15 start, 16-17 an instance in
    // 2 parts, 18 read, 19 stop.
    let lost = json!({"ts": ts(7.5), "host": HOST, "type": "lost", "interval_ms": 1000,
        "by_source": {"output.queue_full": 2}});
    let flat_run: Vec<Value> = [
        vec![start(), read_at(1.0), read_at(2.0), read_at(3.0)],
        vec![
            start_of_file(1, 3.5),
            read_at(4.0),
            read_at(5.0),
            read_at(6.0),
            read_at(7.0),
            lost,
        ],
        [start_of_file(2, 7.8)].into_iter().collect(),
        instance_parts(
            8.0,
            &[&["/d/a.mdf", "/d/b.mdf"], &["/d/c.mdf"], &["/d/d.ldf"]],
        ),
        vec![read_at(9.0), start_of_file(3, 9.5)],
        instance_parts(10.0, &[&["/d/a.mdf"], &["/d/x.mdf"]]),
        vec![
            read_at(11.0),
            stop(
                11.5,
                json!({"start": 4, "block": 9, "lost": 1, "sql_instance": 2}),
                json!({"output.queue_full": 2}),
            ),
        ],
    ]
    .concat();
    let v2 = as_v2(&flat_run, RUN, 0);
    let v = schema_2_validator();
    for r in &v2 {
        assert_valid(&v, r);
    }
    // The output queue dropped 6 and 7; 14 was lost between files (the last
    // record before a rotation); 17, the second part of an instance, too.
    let kept = |from: u64, to: u64| -> Vec<Value> {
        v2.iter()
            .filter(|r| (from..=to).contains(&r["seqno"].as_u64().unwrap()))
            .filter(|r| ![6, 7, 14, 17].contains(&r["seqno"].as_u64().unwrap()))
            .cloned()
            .collect()
    };
    let dir = Dir::new("gaps");
    let paths = [
        dir.plain("s.jsonl", &kept(15, 19)),
        dir.plain("s.jsonl.1", &kept(10, 14)),
        dir.gzip("s.jsonl.2.gz", &kept(4, 9)),
        dir.gzip("s.jsonl.3.gz", &kept(0, 3)),
        // The oldest file again, under another name (a copy kept by hand).
        dir.plain("s.jsonl.3.copy", &kept(0, 3)),
    ];
    let r = read_reports(&paths).unwrap();
    assert_eq!(
        names(&r),
        [
            "s.jsonl.3.gz:Whole",
            "s.jsonl.3.copy:Whole",
            "s.jsonl.2.gz:Whole",
            "s.jsonl.1:Whole",
            "s.jsonl:Whole"
        ]
    );
    let seq = &r.stream.sequence;
    let gaps: Vec<(u64, u64, usize, bool)> = seq
        .missing
        .listed
        .iter()
        .map(|g| (g.first, g.last, g.at.file, g.between_files))
        .collect();
    assert_eq!(
        gaps,
        [(6, 7, 2, false), (14, 14, 4, true), (17, 17, 4, false)]
    );
    assert_eq!((seq.missing.records, seq.queue_full), (4, 2));
    assert_eq!((seq.repeated.records, seq.repeated.ranges), (4, 1));
    assert_eq!(seq.repeated.listed[0].at, LineRef { file: 1, line: 1 });
    // One instance put back together; the one missing a part not used.
    assert_eq!((r.stream.split.reassembled, r.stream.split.damaged), (1, 1));
    let files: Vec<&str> = r.instances[0]
        .files
        .iter()
        .map(|(p, _)| p.as_str())
        .collect();
    assert_eq!(files, ["/d/a.mdf", "/d/b.mdf", "/d/c.mdf", "/d/d.ldf"]);
    // The repeats are not counted twice: 9 reads written, 2 dropped, 1 lost.
    assert_eq!(r.disks[0].ops[0].requests, 6 * 5);
    assert_eq!(
        r.stream.missing,
        [
            ("block".to_string(), 9, 6),
            ("sql_instance".to_string(), 2, 1)
        ]
    );
    let text = dir.unnamed(&flat(&render_text(&r, 120)));
    for said in [
        "seqno 6–7 missing (2 records, before s.jsonl.2.gz line 3)",
        "seqno 14 missing (1 record, between s.jsonl.1 and s.jsonl)",
        "seqno 17 missing (1 record, before s.jsonl line 3)",
        "4 records missing in all, 2 of them the output queue's drops (`lost` output.queue_full), 2 unexplained: lost between files",
        "4 records read again and skipped",
        "seqno 0–3 (4 records, from s.jsonl.3.copy line 1)",
        "1 record written in parts is incomplete",
        "sql_instance at s.jsonl line 2",
    ] {
        assert!(text.contains(said), "{said:?} not in:\n{text}");
    }
    let page = render_html(&r);
    assert!(
        page.contains("seqno 6–7 missing (2 records"),
        "the page says it too"
    );
}

#[test]
fn many_gaps_are_counted_and_only_the_first_are_named() {
    // Every third record dropped, over 300 reads.
    let mut run = vec![start()];
    run.extend((1..=300).map(|i| read_at(i as f64)));
    let v2: Vec<Value> = as_v2(&run, RUN, 0)
        .into_iter()
        .filter(|r| r["seqno"].as_u64().unwrap() % 3 != 2)
        .collect();
    let r = Report::from_text(&lines(&v2)).unwrap();
    let seq = &r.stream.sequence;
    assert_eq!((seq.missing.ranges, seq.missing.records), (100, 100));
    assert_eq!(
        seq.missing.listed.len(),
        crate::report::sequence::RANGES_LISTED
    );
    let w = warnings(&r);
    assert!(w.contains("and 90 more ranges: 100 records missing in all, none of them dropped by the output queue"), "{w}");
}

#[test]
fn a_copytruncate_tail_is_placed_by_its_seqno() {
    // logrotate copied seqnos 0-3 to .1, the run wrote 4 and 5 before the
    // truncate, and went on in the truncated file, which has no `start`.
    let run = as_v2(
        &[
            start(),
            read_at(1.0),
            read_at(2.0),
            read_at(3.0),
            read_at(4.0),
            read_at(5.0),
            read_at(6.0),
            read_at(7.0),
            stop(7.5, json!({"start": 1, "block": 7}), json!({})),
        ],
        RUN,
        0,
    );
    let dir = Dir::new("copytruncate");
    let tail = dir.plain("db.jsonl", &run[6..]);
    let copy = dir.plain("db.jsonl.1", &run[..4]);
    let r = read_reports(&[tail, copy]).unwrap();
    assert_eq!(names(&r), ["db.jsonl.1:Whole", "db.jsonl:Whole"]);
    assert!(!r.stream.files[1].began_with_start);
    assert_eq!(r.disks[0].ops[0].requests, 5 * 5);
    let w = dir.unnamed(&warnings(&r));
    assert!(w.contains("1 file begins without a `start` record, as the part a copytruncate rotation leaves behind does: db.jsonl (from seqno 6)"), "{w}");
    assert!(
        w.contains("seqno 4–5 missing (2 records, between db.jsonl.1 and db.jsonl)"),
        "{w}"
    );
}

#[test]
fn the_hole_a_copytruncate_leaves_in_a_schema_1_file_is_skipped() {
    // Schema 1 wrote --out without O_APPEND: after logrotate's copy and
    // truncate, the run's next write landed at its old offset, past a hole
    // longer than any line the report reads.
    let dir = Dir::new("hole");
    let copy = dir.plain("v1.jsonl.1", &[start(), read_at(1.0), read_at(2.0)]);
    let tail_path = dir.0.join("v1.jsonl");
    {
        use std::io::{Seek, SeekFrom};
        let mut f = std::fs::File::create(&tail_path).unwrap();
        f.seek(SeekFrom::Start(8 << 20)).unwrap();
        let tail = [
            read_at(3.0),
            stop(3.5, json!({"start": 1, "block": 3}), json!({})),
        ];
        f.write_all(lines(&tail).as_bytes()).unwrap();
    }
    let r = read_reports(&[tail_path, copy]).unwrap();
    assert_eq!(names(&r), ["v1.jsonl.1:Whole", "v1.jsonl:Whole"]);
    assert_eq!(r.disks[0].ops[0].requests, 3 * 5);
    assert_eq!(r.stream.files[1].hole_bytes, 8 << 20);
    assert_eq!((r.stream.bad_lines, r.stream.missing.len()), (0, 0));
    let w = dir.unnamed(&warnings(&r));
    assert!(
        w.contains("v1.jsonl begins with 8,388,608 NUL bytes, skipped"),
        "{w}"
    );
}

#[test]
fn a_set_whose_first_file_lacks_the_start_takes_it_from_a_later_file() {
    // The run's first files are gone; the oldest left is a copytruncate tail
    // (seqno 100-102), then a file opened by the run's `start` repeated.
    let dir = Dir::new("primed");
    let mut tail = vec![read_at(101.0), read_at(102.0), read_at(103.0)];
    tail = as_v2(&tail, RUN, 100);
    let mut next = vec![start_of_file(4, 103.5), read_at(104.0), read_at(105.0)];
    next.push(stop(105.5, json!({"start": 5, "block": 105}), json!({})));
    let next = as_v2(&next, RUN, 103);
    let r = read_reports(&[dir.plain("x.jsonl", &next), dir.plain("x.jsonl.1", &tail)]).unwrap();
    assert_eq!(names(&r), ["x.jsonl.1:Whole", "x.jsonl:Whole"]);
    assert_eq!(r.disks[0].ops[0].requests, 5 * 5);
    assert_eq!(r.stream.before_start, 0);
    // The window begins with the first record read, not with the later `start`.
    assert_eq!(
        r.run.start_us,
        crate::report::time::parse_us(&ts(101.0)).unwrap()
    );
    let w = warnings(&r);
    assert!(w.contains("the run's first 100 records (seqno 0–99) are not here: it begins without the run's `start`"), "{w}");
}

#[test]
fn files_of_other_runs_and_of_schema_1_are_named_not_mixed_in() {
    let later = |records: Vec<Value>, by: f64| -> Vec<Value> {
        records
            .into_iter()
            .map(|mut r| {
                let t = crate::report::time::parse_us(r["ts"].as_str().unwrap()).unwrap();
                r["ts"] = json!(crate::report::time::rfc3339(t + (by * 1e6) as i64));
                r
            })
            .collect()
    };
    // A schema 1 run (no run id, no seqno: no false gaps), then two schema 2
    // runs, the second appended to the first's last file (O_APPEND).
    let v1 = vec![
        start(),
        read_at(1.0),
        stop(1.5, json!({"start": 1, "block": 1}), json!({})),
    ];
    let run_a = rotated_run("11111111-1111-4111-8111-111111111111", &[2, 2]);
    let run_b = rotated_run("22222222-2222-4222-8222-222222222222", &[1, 1]);
    let dir = Dir::new("runs");
    let paths = [
        dir.plain("s.jsonl", &later(run_b[1].clone(), 200.0)),
        dir.plain(
            "s.jsonl.1",
            &[
                later(run_a[1].clone(), 100.0),
                later(run_b[0].clone(), 200.0),
            ]
            .concat(),
        ),
        dir.gzip("s.jsonl.2.gz", &later(run_a[0].clone(), 100.0)),
        dir.gzip("s.jsonl.3.gz", &v1),
    ];
    let r = read_reports(&paths).unwrap();
    assert_eq!(r.run.schema, 1);
    assert_eq!(r.disks[0].ops[0].requests, 5);
    assert_eq!(r.stream.sequence.missing.records, 0);
    assert_eq!(r.stream.next_run, None);
    assert_eq!(
        names(&r),
        [
            "s.jsonl.3.gz:Whole",
            "s.jsonl.2.gz:Skipped",
            "s.jsonl.1:Skipped",
            "s.jsonl:Skipped"
        ]
    );
    assert_eq!(r.stream.other_runs, 2);
    let w = dir.unnamed(&warnings(&r));
    assert!(
        w.contains(
            "only the first run is reported; 3 files of 2 other runs not read (s.jsonl.2.gz"
        ),
        "{w}"
    );

    // Without the schema 1 file: run A, to where run B begins inside s.jsonl.1.
    let r = read_reports(&paths[..3]).unwrap();
    assert_eq!(r.run.schema, 2);
    assert_eq!(r.disks[0].ops[0].requests, 4 * 5);
    assert_eq!(
        names(&r),
        [
            "s.jsonl.2.gz:Whole",
            "s.jsonl.1:UntilNextRun",
            "s.jsonl:Skipped"
        ]
    );
    assert_eq!(r.stream.next_run, Some(LineRef { file: 1, line: 5 }));
    assert_eq!(r.stream.other_runs, 1);
    let w = dir.unnamed(&warnings(&r));
    assert!(w.contains("another run starts at s.jsonl.1 line 5: only the first run is reported; 1 file of 1 other run not read (s.jsonl)"), "{w}");
}

#[test]
fn schema_2_histograms_merge_exactly_as_schema_1_triples() {
    let v1 = vec![
        start(),
        block(
            1.0,
            "sdb",
            "read",
            json!([[1.024, 1.087, 6], [20.48, 21.503, 2]]),
            json!([[1.0, 1.0, 6], [4.0, 4.0, 2]]),
        ),
        block(
            2.0,
            "sdb",
            "read",
            json!([[1.024, 1.087, 2], [96468.992, 100663.295, 10]]),
            json!([[4.0, 4.0, 12]]),
        ),
    ];
    let a = Report::from_text(&lines(&v1)).unwrap();
    let b = Report::from_text(&lines(&as_v2(&v1, RUN, 0))).unwrap();
    let (a, b) = (&a.disks[0].ops[0], &b.disks[0].ops[0]);
    assert_eq!(a.latency.buckets(), b.latency.buckets());
    assert_eq!(a.inflight.buckets(), b.inflight.buckets());
    for q in [0.5, 0.9, 0.99] {
        assert_eq!(a.latency.percentile(q), b.latency.percentile(q));
    }
    assert_eq!(
        (a.latency.mean(), a.requests),
        (b.latency.mean(), b.requests)
    );
    // The writer's own encoding reads back the same.
    let mut h = crate::hist::Histogram::default();
    for (v, n) in [(900u64, 7u64), (44_000, 300), (3_400_000, 9)] {
        h.record(v, n);
    }
    let written = serde_json::to_value(h.to_record(1e-3)).unwrap();
    let mut m = crate::report::MergedHist::new(crate::report::Unit::Micros);
    m.add(&written).unwrap();
    assert_eq!(m.count(), 316);
    assert_eq!(m.percentile(0.99), written["p99"].as_f64());
}

#[test]
fn what_a_set_cannot_be_is_one_line_naming_the_file_and_the_fix() {
    let dir = Dir::new("errors");
    let ok = dir.plain("ok.jsonl", &as_v2(&[start(), read_at(1.0)], RUN, 0));
    let mut other = as_v2(&[read_at(2.0)], RUN, 2);
    other[0]["host"] = json!("db-02");
    let other_host = dir.plain("other.jsonl", &other);
    let empty = dir.plain("empty.jsonl", &[]);
    let notes = dir.0.join("notes.txt");
    std::fs::write(&notes, "not a stream\n").unwrap();
    let absent = dir.0.join("absent.jsonl");
    let dash = PathBuf::from("-");
    for (given, said) in [
        (
            vec![],
            "no stream given to report: give the file `stalltrace run --out FILE` wrote",
        ),
        (vec![ok.clone(), absent.clone()], "cannot read "),
        (
            vec![ok.clone(), other_host.clone()],
            "from 2 hosts (db-01 in ",
        ),
        (
            vec![ok.clone(), dash],
            "(stdin) cannot be read together with files",
        ),
        (
            vec![ok.clone(), notes.clone()],
            "notes.txt is not JSON lines (line 1",
        ),
        (vec![empty.clone(), empty.clone()], "are all empty"),
    ] {
        let e = read_reports(&given).unwrap_err().to_string();
        assert!(e.contains(said), "{given:?}: {said:?} not in {e}");
        assert!(!e.contains('\n'), "{e}");
    }
    // An empty file (logrotate `create`) is listed, last, and skipped.
    let r = read_reports(&[empty, ok]).unwrap();
    assert_eq!(names(&r), ["ok.jsonl:Whole", "empty.jsonl:Empty"]);
    assert_eq!(r.stream.files[1].read, FileRead::Empty);
}
