//! The JSON writer's unit tests.
use super::*;

#[test]
fn the_tap_keeps_aggregates_and_caps_events_per_take() {
    use crate::records::run::{HeartbeatRecord, LostRecord, StopReason, StopRecord};
    // Stand-ins with small bodies: `heartbeat` as an aggregate, `lost` as a
    // per-event type, `stop` as one the tap does not read.
    fn wants(kind: &str) -> Tapped {
        match kind {
            "heartbeat" => Tapped::Aggregate,
            "lost" => Tapped::Event,
            _ => Tapped::No,
        }
    }
    let event = |n: u64| LostRecord {
        interval_ms: n,
        by_source: BTreeMap::new(),
    };
    let aggregate = |n: u64| HeartbeatRecord { interval_ms: n };
    let mut w = JsonWriter::new(Box::new(io::sink()), "db1".into());
    w.tap(wants, 2);
    w.emit("t", &event(1)).unwrap();
    w.emit("t", &aggregate(2)).unwrap();
    let untapped = StopRecord {
        reason: StopReason::Signal,
        elapsed_ms: 0,
        records: BTreeMap::new(),
        lost: BTreeMap::new(),
        programs: Vec::new(),
    };
    w.emit("t", &untapped).unwrap();
    w.emit("t", &event(3)).unwrap();
    w.emit("t", &event(4)).unwrap();
    w.emit("t", &aggregate(5)).unwrap();
    let (records, dropped) = w.take_tapped();
    let kept: Vec<(&str, u64)> = records
        .iter()
        .map(|r| match r {
            AnyRecord::Lost(l) => (r.kind(), l.interval_ms),
            AnyRecord::Heartbeat(h) => (r.kind(), h.interval_ms),
            other => panic!("{} tapped", other.kind()),
        })
        .collect();
    assert_eq!(
        kept,
        [("lost", 1), ("heartbeat", 2), ("lost", 3), ("heartbeat", 5)],
        "typed, in the order made"
    );
    assert_eq!(dropped, 1, "the third event is over the cap");
    // The cap is per take: the next interval starts afresh.
    w.emit("t", &event(6)).unwrap();
    let (again, dropped) = w.take_tapped();
    assert_eq!((again.len(), again[0].kind(), dropped), (1, "lost", 0));
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
            r#"{{"ts":"2026-11-21T00:00:00.000000Z","host":"db1","type":"block","schema":{SCHEMA_VERSION},"run":"{run}","seqno":0,"dev":"loop3","count":7}}"#
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
