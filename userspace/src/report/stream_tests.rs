//! The report on whole streams: what it refuses, counts and says about a
//! stream's health, how the renderers lay real and hostile input out, and its
//! bounds.

use serde_json::{Value, json};

use super::error::ReportError;
use super::fixtures::*;
use super::lines::LineRef;
use super::model::Report;
use super::{render_html, render_text};

// ---- stream handling --------------------------------------------------------------

#[test]
fn unknown_record_types_and_fields_are_ignored() {
    let plain = [
        start(),
        block(
            1.0,
            "sda",
            "read",
            json!([[1.024, 1.087, 5]]),
            json!([[2.0, 2.0, 5]]),
        ),
        stall(1, "closed", 3.0, 1.0, Some(2.0), 40.0, json!([])),
    ];
    let mut extended: Vec<Value> = plain.to_vec();
    extended[1]["zone_append_us"] = json!({"count": 3});
    extended[1]["latency_us"]["p999"] = json!(9.0);
    extended[2]["confidence"] = json!(0.9);
    extended.insert(
        2,
        json!({"ts": ts(1.5), "host": HOST, "type": "gpu_stall", "dev": "gpu0"}),
    );
    let a = report(&plain);
    let b = report(&extended);
    assert_eq!(b.stream.unknown_types.get("gpu_stall"), Some(&1));
    assert_eq!(
        a.disks[0].ops[0].latency.buckets(),
        b.disks[0].ops[0].latency.buckets()
    );
    assert_eq!(a.episodes.len(), b.episodes.len());
    assert_eq!(b.stream.bad_lines, 0);
}

#[test]
fn a_different_schema_major_is_refused_and_a_minor_is_not() {
    for (schema, refused) in [
        (json!(4), true),
        (json!(0), true),
        (json!("4.0"), true),
        (Value::Null, true),
        (json!(1), false),
        (json!("1.4"), false),
        (json!(2), false),
        (json!("2.1"), false),
        (json!(3), false),
    ] {
        let mut s = start();
        s["schema"] = schema.clone();
        s["version"] = json!("9.1.0");
        match Report::from_records(&[s]) {
            Err(ReportError::Schema { writer, .. }) if refused => {
                assert_eq!(writer.as_deref(), Some("9.1.0"));
            }
            Ok(_) if !refused => {}
            other => panic!("schema {schema}: {other:?}"),
        }
    }
    let err = Report::from_records(&[{
        let mut s = start();
        s["schema"] = json!(4);
        s
    }])
    .unwrap_err()
    .to_user_error("x.jsonl")
    .to_string();
    assert!(
        err.contains("schema 4") && err.contains("reads schemas 1 to 3"),
        "{err}"
    );
}

#[test]
fn a_truncated_last_line_and_bad_middle_lines_are_counted_not_fatal() {
    let mut text = lines(&[
        start(),
        block(
            1.0,
            "sda",
            "read",
            json!([[1.024, 1.087, 5]]),
            json!([[2.0, 2.0, 5]]),
        ),
    ]);
    text.push_str("{\"ts\": garbage\n");
    text.push_str(&lines(&[block(
        2.0,
        "sda",
        "read",
        json!([[1.024, 1.087, 5]]),
        json!([[2.0, 2.0, 5]]),
    )]));
    // The crash cut the next record mid-write: no newline.
    let cut = block(
        3.0,
        "sda",
        "read",
        json!([[1.024, 1.087, 5]]),
        json!([[2.0, 2.0, 5]]),
    )
    .to_string();
    text.push_str(&cut[..cut.len() / 2]);
    let r = Report::from_text(&text).unwrap();
    assert!(r.stream.truncated_last_line);
    assert_eq!(r.stream.bad_lines, 1);
    assert_eq!(r.stream.first_bad_lines, [LineRef { file: 0, line: 3 }]);
    assert!(!r.stream.has_stop);
    assert_eq!(r.disks[0].ops[0].requests, 10);
    let warnings = r.stream.warnings(&r.run).join("\n");
    assert!(warnings.contains("stops mid-record"), "{warnings}");
    assert!(warnings.contains("line 3"), "{warnings}");
    assert!(warnings.contains("no `stop` record"), "{warnings}");
    // A complete last line without its newline is a record like any other.
    let whole = lines(&[start()]) + &cut;
    assert!(
        !Report::from_text(&whole)
            .unwrap()
            .stream
            .truncated_last_line
    );
}

#[test]
fn what_is_not_a_stalltrace_stream_is_refused() {
    assert!(matches!(Report::from_text(""), Err(ReportError::Empty)));
    assert!(matches!(Report::from_text("\n\n"), Err(ReportError::Empty)));
    assert!(matches!(
        Report::from_text("hello\nworld\n"),
        Err(ReportError::NotJsonLines { line: 1 })
    ));
    // JSON, but no start: a cut head, or something else entirely.
    assert!(matches!(
        Report::from_text("{\"type\": \"block\"}\n{\"a\": 1}\n"),
        Err(ReportError::NoStart { .. })
    ));
    let e = ReportError::NoStart { records: 2 }
        .to_user_error("cut.jsonl")
        .to_string();
    assert!(
        e.starts_with("cut.jsonl has no `start` record") && !e.contains('\n'),
        "{e}"
    );
}

#[test]
fn records_before_start_and_a_second_run_are_reported_not_mixed_in() {
    let text = lines(&[
        block(
            0.5,
            "sdz",
            "read",
            json!([[1.024, 1.087, 1]]),
            json!([[1.0, 1.0, 1]]),
        ),
        start(),
        block(
            1.0,
            "sda",
            "read",
            json!([[1.024, 1.087, 5]]),
            json!([[2.0, 2.0, 5]]),
        ),
        start(),
        block(
            2.0,
            "sdb",
            "read",
            json!([[1.024, 1.087, 5]]),
            json!([[2.0, 2.0, 5]]),
        ),
    ]);
    let r = Report::from_text(&text).unwrap();
    let devs: Vec<&str> = r.disks.iter().map(|d| d.dev.as_str()).collect();
    assert_eq!(devs, ["sda"]);
    assert_eq!(r.stream.before_start, 1);
    assert_eq!(r.stream.next_run, Some(LineRef { file: 0, line: 4 }));
}

#[test]
fn losses_and_missing_records_are_said_prominently() {
    let r = report(&[
        start(),
        json!({"ts": ts(1.0), "host": HOST, "type": "lost", "interval_ms": 1000,
            "by_source": {"block.slow_io_ringbuf_full": 7}}),
        json!({"ts": ts(2.0), "host": HOST, "type": "lost", "interval_ms": 1000,
            "by_source": {"block.slow_io_ringbuf_full": 3, "tcp.peer_table_evicted": 1}}),
        // stop says more was lost than the lost records in the file show, and
        // that it wrote 3 lost records: one is missing from the file.
        stop(
            3.0,
            json!({"start": 1, "lost": 3}),
            json!({"block.slow_io_ringbuf_full": 12, "tcp.peer_table_evicted": 1}),
        ),
    ]);
    assert_eq!(r.losses.by_source["block.slow_io_ringbuf_full"], 12);
    assert_eq!(r.losses.total(), 13);
    assert_eq!(r.stream.missing, [("lost".to_string(), 3, 2)]);
    let text = render_text(&r, 100);
    // Every slow I/O event was lost, and evicted peers cannot be weighed.
    assert!(
        text.contains(
            "!! LOST in 2 intervals: block.slow_io_ringbuf_full 12 of 12 slow I/Os (100%)"
        ),
        "{text}"
    );
    assert!(text.contains("lost 2 of 3"), "{text}");
    let clean = report(&[start(), stop(1.0, json!({"start": 1}), json!({}))]);
    assert!(!clean.losses.any());
    assert!(render_text(&clean, 100).contains("losses     none"));
}

// ---- renderers on streams ------------------------------------------------------------

#[test]
fn a_connection_reads_local_end_first_with_its_owner() {
    let mut owned = retransmit(1.0, 50000, 51, true, 204.0);
    owned["pid"] = json!(4242);
    owned["comm"] = json!("sqlservr");
    let r = report(&[start(), owned, retransmit(1.5, 50001, 52, true, 204.0)]);
    let labels: Vec<String> = r.peers.iter().map(|p| p.label()).collect();
    assert!(
        labels.contains(&":1433 with 10.0.0.9:50000 (sqlservr 4242)".to_string()),
        "{labels:?}"
    );
    // No owner in the records: none is made up.
    assert!(
        labels.contains(&":1433 with 10.0.0.9:50001".to_string()),
        "{labels:?}"
    );
}

#[test]
fn a_quiet_run_counts_its_heartbeat_intervals() {
    let heartbeat =
        |at: f64| json!({"ts": ts(at), "host": HOST, "type": "heartbeat", "interval_ms": 1000});
    let r = report(&[
        start(),
        heartbeat(1.0),
        heartbeat(2.0),
        heartbeat(3.0),
        stop(3.0, json!({"start": 1, "heartbeat": 3}), json!({})),
    ]);
    assert_eq!(r.run.intervals, 3);
    assert_eq!(r.stream.missing, []);
    assert!(render_text(&r, 100).contains("3 intervals of 1000 ms"));
}

#[test]
fn a_tiny_share_lost_is_weighed_not_shouted() {
    // 3 completions the kernel skipped among 50,000 (still in the counts).
    let lost = |n: u64| {
        report(&[
            start(),
            block(
                1.0,
                "sda",
                "read",
                json!([[1.024, 1.087, 50_000]]),
                json!([[2.0, 2.0, 50_000]]),
            ),
            json!({"ts": ts(1.0), "host": HOST, "type": "lost", "interval_ms": 1000,
                "by_source": {"block.kernel_skipped": n}}),
            stop(2.0, json!({"start": 1}), json!({"block.kernel_skipped": n})),
        ])
    };
    let text = render_text(&lost(3), 200);
    assert!(
        text.contains(
            "losses     lost, a small share in 1 interval: block.kernel_skipped 3 of 50,000 block completions (0.0060%): in the counts, without latency samples"
        ),
        "{text}"
    );
    assert!(!text.contains("!!"), "{text}");
    // 100 of 50,000 (0.2%) is no longer minor.
    let text = render_text(&lost(100), 200);
    assert!(
        text.contains(
            "!! LOST in 1 interval: block.kernel_skipped 100 of 50,000 block completions (0.20%)"
        ),
        "{text}"
    );
}

#[test]
fn the_clean_case_says_no_stalls_and_where_things_stood() {
    let r = report(&[
        start(),
        block(
            1.0,
            "sda",
            "read",
            json!([[1.024, 1.087, 5]]),
            json!([[2.0, 2.0, 5]]),
        ),
        stop(1.5, json!({"start": 1, "block": 1}), json!({})),
    ]);
    let text = render_text(&r, 100);
    assert!(text.contains("No stalls"), "{text}");
    assert!(
        text.contains("slowest storage tail: sda read p99"),
        "{text}"
    );
    assert!(text.contains("stream     complete"), "{text}");
    let html = render_html(&r);
    assert!(html.contains("class=\"no-stalls\""));
    assert_eq!(html.matches("<svg class=\"heatmap\"").count(), 1);
}

#[test]
fn strings_from_the_host_cannot_inject_markup_or_terminal_escapes() {
    let mut s = start();
    s["host"] = json!("<script>alert(1)</script>");
    let mut b = block(
        1.0,
        "sda\"><img src=x onerror=alert(2)>",
        "read",
        json!([[1.024, 1.087, 5]]),
        json!([[2.0, 2.0, 5]]),
    );
    b["host"] = s["host"].clone();
    let mut e = stall(1, "closed", 3.0, 1.0, Some(2.0), 40.0, json!([]));
    e["next_step"] = json!("run `rm -rf /` \u{1b}[2J & <b>now</b>");
    e["files"] = json!(["/data/it's & <here>.mdf"]);
    let r = report(&[s, b, e]);
    let html = render_html(&r);
    assert!(!html.contains("<script>alert"), "host name not escaped");
    assert!(!html.contains("<img"), "device name not escaped");
    assert!(!html.contains("<b>now"), "next step not escaped");
    assert!(html.contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
    assert!(html.contains("it's &amp; &lt;here&gt;.mdf"));
    assert!(!html.contains('\u{1b}'));
    // The only script is the page's own; nothing is fetched.
    assert_eq!(html.matches("<script").count(), 1);
    for fetch in [
        "src=\"",
        "href=\"http",
        "url(",
        "@import",
        "<link",
        "fetch(",
    ] {
        assert!(!html.contains(fetch), "the page fetches something: {fetch}");
    }
    let text = flat(&render_text(&r, 100));
    assert!(
        !text.contains('\u{1b}'),
        "a terminal escape reached the text report"
    );
    assert!(text.contains("rm -rf /` ?[2J & <b>now</b>"), "{text}");
}

#[test]
fn the_recorded_stream_renders_every_section_within_the_width() {
    let text = recorded_with_episodes().join("\n") + "\n";
    let r = Report::from_text(&text).unwrap();
    assert_eq!(r.episodes.len(), 4);
    assert!(r.stream.warnings(&r.run).is_empty(), "{:?}", r.stream);
    assert_eq!(r.flows.len(), 1);
    let flow = &r.flows[0];
    let limiters: Vec<(String, u64)> = flow.limiter_time();
    assert_eq!(
        limiters,
        [
            ("network".to_string(), 2000),
            ("application".to_string(), 500)
        ]
    );
    assert_eq!(flow.limiter_spans().len(), 2);
    // SPID 51: in episodes 2 (its RTO) and 3 (the slow disk), and its own RTO of 212 ms.
    let s51 = r.sessions.iter().find(|s| s.tag.spid == Some(51)).unwrap();
    assert_eq!(s51.episodes, [2, 3]);
    assert_eq!(s51.timeout_wait_ms, 212.0);
    for width in [80, 100, 140] {
        let out = render_text(&r, width);
        for line in out.lines().filter(|l| l.contains('│')) {
            assert!(
                line.chars().count() <= width,
                "chart line over {width}: {line}"
            );
        }
        for section in [
            "STALL EPISODES (4",
            "SQL SERVER SESSIONS HIT",
            "STORAGE (2 disks)",
            "NETWORK INTERFACES (2)",
            "TCP PEERS",
            "BULK FLOWS (1)",
        ] {
            assert!(out.contains(section), "{section} missing at width {width}");
        }
    }
    let html = render_html(&r);
    let heatmaps = r
        .disks
        .iter()
        .flat_map(|d| &d.ops)
        .filter(|o| o.latency.count() > 0)
        .count()
        + r.interfaces.iter().filter(|i| i.qdisc.count() > 0).count();
    assert_eq!(html.matches("<svg class=\"heatmap\"").count(), heatmaps);
    assert_eq!(html.matches("<rect class=\"episode ").count(), 4);
    assert_eq!(html.matches("<tr class=\"episode-row").count(), 4);
    // Each episode is banded on every heatmap, strongly on its own device's.
    assert_eq!(html.matches("class=\"episode-band").count(), 4 * heatmaps);
    assert!(html.contains("class=\"episode-band own\" data-episode=\"3\""));
}

#[test]
fn every_fixture_line_follows_the_schema() {
    let v = schema_1_validator();
    for line in recorded_with_episodes() {
        assert_valid(&v, &serde_json::from_str(&line).unwrap());
    }
}

#[test]
fn a_long_run_keeps_a_bounded_series_and_every_count() {
    let n = 5000;
    let mut records = vec![start()];
    for i in 0..n {
        let burst = if i == 1234 { 40 } else { 1 };
        records.push(block(
            1.0 + i as f64,
            "sda",
            "read",
            json!([[1.024, 1.087, burst]]),
            json!([[1.0, 1.0, burst]]),
        ));
    }
    let r = Report::from_records(&records).unwrap();
    let op = &r.disks[0].ops[0];
    assert!(op.series.len() <= super::series::MAX_POINTS);
    let in_series: u64 = op
        .series
        .iter()
        .flat_map(|p| &p.latency)
        .map(|(_, c)| c)
        .sum();
    assert_eq!(in_series, n + 39);
    assert_eq!(op.requests, n + 39);
    // The burst interval is still the peak, though the series merged it.
    assert_eq!(op.peak_iops(), 40.0);
    assert_eq!(
        op.series.iter().map(|p| p.interval_ms).sum::<u64>(),
        n * 1000
    );
}

// ---- bounds -------------------------------------------------------------------

#[test]
fn connections_past_the_bound_are_summed_in_one_row() {
    use super::network::MAX_PEERS;
    let n = MAX_PEERS + 3;
    let mut records = vec![start()];
    records.extend((0..n).map(|i| retransmit(1.0, 30_000 + i as u16, 51, true, 204.0)));
    let r = report(&records);
    assert_eq!(r.peers.len(), MAX_PEERS + 1);
    let others: Vec<_> = r.peers.iter().filter(|p| p.others).collect();
    assert_eq!(others.len(), 1);
    let o = others[0];
    assert_eq!((o.events, o.timeout_wait_ms), (3, 612.0));
    assert!(o.sql.is_none(), "the summed row is nobody's session");
    assert!(o.label().contains("past the first"), "{}", o.label());
    // Nothing is lost by folding: every event is in some row.
    assert_eq!(r.peers.iter().map(|p| p.events).sum::<u64>(), n as u64);
}
