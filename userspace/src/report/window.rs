//! `report --since/--until`: the part of a recording the SRE was paged for.
//! Times are UTC, as the records' `ts` are, unless they carry an offset.

use chrono::{DateTime, NaiveDate, NaiveDateTime, NaiveTime, Utc};

/// A span of time, µs since the Unix epoch, both ends included.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    pub since_us: i64,
    pub until_us: i64,
}

impl Window {
    /// From the flags as given; `now_us` anchors `10m ago` and a bare clock time.
    pub fn of(
        since: Option<&str>,
        until: Option<&str>,
        now_us: i64,
    ) -> Result<Option<Self>, String> {
        if since.is_none() && until.is_none() {
            return Ok(None);
        }
        let since_us = since
            .map(|t| parse(t, now_us))
            .transpose()?
            .unwrap_or(i64::MIN);
        let until_us = until
            .map(|t| parse(t, now_us))
            .transpose()?
            .unwrap_or(i64::MAX);
        if since_us > until_us {
            return Err(format!(
                "--since {} is after --until {}: nothing to report",
                since.unwrap_or(""),
                until.unwrap_or("")
            ));
        }
        Ok(Some(Self { since_us, until_us }))
    }

    pub fn contains(&self, ts_us: i64) -> bool {
        (self.since_us..=self.until_us).contains(&ts_us)
    }

    /// Whether `[start, end]` has any instant in the window.
    pub fn overlaps(&self, start_us: i64, end_us: i64) -> bool {
        start_us <= self.until_us && end_us >= self.since_us
    }
}

const FORMS: &str =
    "expected 2026-11-28T03:12:00Z, \"2026-11-28 03:12\", 03:12 (today, UTC) or \"10m ago\"";

/// A time as an SRE types it: RFC 3339; `YYYY-MM-DD HH:MM[:SS]` (UTC);
/// `HH:MM[:SS]` (UTC, the last such time at or before now); `10m ago`.
pub fn parse(text: &str, now_us: i64) -> Result<i64, String> {
    let t = text.trim();
    if let Some(span) = t.strip_suffix("ago") {
        let d = humantime::parse_duration(span.trim())
            .map_err(|e| format!("{text:?}: {e}; {FORMS}"))?;
        return Ok(now_us - i64::try_from(d.as_micros()).unwrap_or(i64::MAX));
    }
    if let Ok(at) = DateTime::parse_from_rfc3339(t) {
        return Ok(at.with_timezone(&Utc).timestamp_micros());
    }
    for form in [
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
    ] {
        if let Ok(at) = NaiveDateTime::parse_from_str(t, form) {
            return Ok(at.and_utc().timestamp_micros());
        }
    }
    for form in ["%H:%M:%S", "%H:%M"] {
        if let Ok(clock) = NaiveTime::parse_from_str(t, form) {
            let now = DateTime::<Utc>::from_timestamp_micros(now_us).unwrap_or_default();
            let today: NaiveDate = now.date_naive();
            let at = today.and_time(clock).and_utc().timestamp_micros();
            // 23:55 typed at 00:10 means last night.
            return Ok(if at > now_us { at - 86_400_000_000 } else { at });
        }
    }
    Err(format!("{text:?} is not a time: {FORMS}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: &str = "2026-11-28T00:10:00Z";

    fn now() -> i64 {
        parse(NOW, 0).unwrap()
    }

    fn at(rfc3339: &str) -> i64 {
        parse(rfc3339, 0).unwrap()
    }

    #[test]
    fn every_form_an_sre_types() {
        assert_eq!(parse("10m ago", now()), Ok(at("2026-11-28T00:00:00Z")));
        assert_eq!(parse("1h 30m ago", now()), Ok(at("2026-11-27T22:40:00Z")));
        assert_eq!(
            parse("2026-11-27 23:50", now()),
            Ok(at("2026-11-27T23:50:00Z"))
        );
        assert_eq!(
            parse("2026-11-27T23:50:30", now()),
            Ok(at("2026-11-27T23:50:30Z"))
        );
        assert_eq!(parse("2026-11-28T01:10:00+01:00", now()), Ok(now()));
        // A clock time is today's, or last night's when today's is still ahead.
        assert_eq!(parse("00:05", now()), Ok(at("2026-11-28T00:05:00Z")));
        assert_eq!(parse("23:55:10", now()), Ok(at("2026-11-27T23:55:10Z")));
    }

    #[test]
    fn what_is_no_time_says_the_forms() {
        for bad in ["yesterday", "10 parsecs ago", "25:00", ""] {
            let e = parse(bad, now()).unwrap_err();
            assert!(e.contains("expected 2026-11-28T03:12:00Z"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_window_has_its_ends_in_order() {
        let w = Window::of(Some("00:00"), Some("00:05"), now())
            .unwrap()
            .unwrap();
        assert!(w.contains(at("2026-11-28T00:05:00Z")));
        assert!(!w.contains(at("2026-11-28T00:05:00.000001Z")));
        assert!(w.overlaps(at("2026-11-27T23:00:00Z"), at("2026-11-28T00:00:00Z")));
        assert_eq!(Window::of(None, None, now()), Ok(None));
        let open = Window::of(Some("5m ago"), None, now()).unwrap().unwrap();
        assert_eq!(open.until_us, i64::MAX);
        let e = Window::of(Some("00:05"), Some("00:01"), now()).unwrap_err();
        assert!(e.contains("is after --until"), "{e}");
    }

    #[test]
    fn a_window_reports_its_part_of_the_run_only() {
        use crate::report::fixtures::*;
        use crate::report::model::ReportBuilder;
        use serde_json::json;
        let lost = |at: f64, n: u64| {
            json!({"ts": ts(at), "host": HOST, "type": "lost", "interval_ms": 1000,
                "by_source": {"block.slow_io_ringbuf_full": n}})
        };
        let mut records = vec![start()];
        for at in [1.0, 2.0, 3.0, 4.0] {
            records.push(block(
                at,
                "sda",
                "read",
                json!([[1.024, 1.087, 5]]),
                json!([[2.0, 2.0, 5]]),
            ));
        }
        records.extend([
            lost(1.0, 7),
            lost(4.0, 2),
            stall(1, "open", 1.0, 1.0, None, 30.0, json!([])),
            stall(1, "closed", 1.5, 1.0, Some(1.5), 30.0, json!([])),
            stall(2, "open", 2.0, 2.0, None, 40.0, json!([])),
            stall(2, "closed", 3.2, 2.0, Some(3.2), 40.0, json!([])),
            stop(
                5.0,
                json!({"start": 1, "block": 4, "lost": 2, "stall": 4}),
                json!({"block.slow_io_ringbuf_full": 9}),
            ),
        ]);
        let window = Window {
            since_us: parse(&ts(2.5), 0).unwrap(),
            until_us: parse(&ts(4.5), 0).unwrap(),
        };
        let mut b = ReportBuilder::within(Some(window));
        for r in &records {
            b.push_line(&r.to_string()).unwrap();
        }
        let r = b.build().unwrap();
        // The intervals ending at 3 s and 4 s; the loss of the 4 s interval;
        // the episode that overlaps the window, not the one before it.
        assert_eq!(r.run.intervals, 2);
        assert_eq!(r.disks[0].requests(), 10);
        assert_eq!(r.losses.by_source["block.slow_io_ringbuf_full"], 2);
        let ids: Vec<u64> = r.episodes.iter().map(|e| e.id).collect();
        assert_eq!(ids, [2]);
        assert_eq!(
            (r.run.start_us, r.run.end_us),
            (window.since_us, window.until_us)
        );
        // Nothing is called missing for being outside the window.
        assert!(r.stream.missing.is_empty(), "{:?}", r.stream.missing);
        let text = crate::report::render_text(&r, 400);
        assert!(
            text.contains("the part --since/--until asked for of a run from"),
            "{text}"
        );
    }
}
