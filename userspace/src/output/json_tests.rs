//! The JSON writer's unit tests.
use super::*;

#[test]
fn the_tap_keeps_aggregates_and_caps_events_per_take() {
    fn wants(kind: &str) -> Tapped {
        match kind {
            "block" => Tapped::Aggregate,
            "tcp_retransmit" => Tapped::Event,
            _ => Tapped::No,
        }
    }
    let mut w = JsonWriter::new(Box::new(io::sink()), "db1".into());
    w.tap(wants, 2);
    for kind in [
        "tcp_retransmit",
        "block",
        "start",
        "tcp_retransmit",
        "tcp_retransmit",
    ] {
        w.emit_as(kind, "t", &serde_json::json!({})).unwrap();
    }
    w.emit_as("block", "t", &serde_json::json!({})).unwrap();
    let (records, dropped) = w.take_tapped();
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| r["type"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["tcp_retransmit", "block", "tcp_retransmit", "block"]
    );
    assert_eq!(dropped, 1, "the third event is over the cap");
    // The cap is per take: the next interval starts afresh.
    w.emit_as("tcp_retransmit", "t", &serde_json::json!({}))
        .unwrap();
    let (again, dropped) = w.take_tapped();
    assert_eq!(
        (again.len(), again[0]["type"].as_str(), dropped),
        (1, Some("tcp_retransmit"), 0)
    );
}

#[test]
fn records_are_single_lines_with_the_envelope_first() {
    #[derive(Serialize)]
    struct Body {
        dev: &'static str,
        count: u64,
    }
    let buf = SharedBuffer::default();
    let mut w = JsonWriter::new(Box::new(buf.clone()), "db1".into());
    w.emit_as(
        "block",
        "2026-11-21T00:00:00.000000Z",
        &Body {
            dev: "loop3",
            count: 7,
        },
    )
    .unwrap();
    w.emit_as(
        "block",
        "2026-11-21T00:00:01.000000Z",
        &Body {
            dev: "loop3",
            count: 8,
        },
    )
    .unwrap();
    let text = buf.text();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2);
    let run = w.run_id().to_string();
    assert_eq!(run.len(), 36, "a UUID: {run}");
    assert_eq!(
        lines[0],
        format!(
            r#"{{"ts":"2026-11-21T00:00:00.000000Z","host":"db1","type":"block","schema":2,"run":"{run}","seqno":0,"dev":"loop3","count":7}}"#
        )
    );
    assert!(
        lines[1].contains(&format!(r#""run":"{run}","seqno":1,"#)),
        "{}",
        lines[1]
    );
    assert_ne!(
        JsonWriter::new(Box::new(io::sink()), "db1".into()).run_id(),
        run,
        "each run its own id"
    );
    assert_eq!(w.emitted().get("block"), Some(&2));
}
