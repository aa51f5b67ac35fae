//! Record timestamps (`ts`, `start`, `end`: RFC 3339, UTC, µs) as integers, and
//! the few ways the report prints times and durations.

use chrono::{DateTime, SecondsFormat, Utc};

/// Microseconds since the Unix epoch; `None` for anything that is not RFC 3339.
pub fn parse_us(ts: &str) -> Option<i64> {
    DateTime::parse_from_rfc3339(ts)
        .ok()
        .map(|t| t.with_timezone(&Utc).timestamp_micros())
}

fn datetime(us: i64) -> DateTime<Utc> {
    DateTime::<Utc>::from_timestamp_micros(us).unwrap_or_default()
}

/// `2026-11-22 00:55:14.702 UTC`: the header's full form.
pub fn full(us: i64) -> String {
    datetime(us).format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string()
}

/// `00:55:14.702`: times inside one run (the header gives the date).
pub fn clock(us: i64) -> String {
    datetime(us).format("%H:%M:%S%.3f").to_string()
}

/// The record form again (for data attributes in the HTML).
pub fn rfc3339(us: i64) -> String {
    datetime(us).to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// A duration in ms as a human reads it: `850 ms`, `1.84 s`, `2 min 05 s`.
pub fn duration_ms(ms: f64) -> String {
    if !ms.is_finite() || ms < 0.0 {
        return "?".into();
    }
    if ms < 1.0 {
        format!("{:.0} µs", ms * 1000.0)
    } else if ms < 1000.0 {
        format!("{} ms", sig3(ms))
    } else if ms < 120_000.0 {
        format!("{} s", sig3(ms / 1000.0))
    } else {
        let s = (ms / 1000.0).round() as u64;
        if s < 7200 {
            format!("{} min {:02} s", s / 60, s % 60)
        } else {
            format!("{} h {:02} min", s / 3600, (s % 3600) / 60)
        }
    }
}

/// A latency in µs with its unit: `7.5 µs`, `249 µs`, `3.47 ms`, `1.2 s`.
pub fn latency_us(us: f64) -> String {
    if !us.is_finite() || us < 0.0 {
        return "?".into();
    }
    if us < 1000.0 {
        format!("{} µs", sig3(us))
    } else {
        duration_ms(us / 1000.0)
    }
}

/// Three significant digits, without trailing zeros: 0.456, 7.5, 125, 1670.
pub fn sig3(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let decimals = if v.abs() >= 100.0 {
        0
    } else if v.abs() >= 10.0 {
        1
    } else if v.abs() >= 1.0 {
        2
    } else {
        3
    };
    let s = format!("{v:.decimals$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// 1234567 -> `1,234,567`.
pub fn thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes with a binary unit: `4.0 KiB`, `174 MiB`.
pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{} {}", sig3(v), UNITS[unit])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_record_form_and_prints_it_back() {
        let us = parse_us("2026-11-22T00:55:14.702669Z").unwrap();
        assert_eq!(us % 1_000_000, 702_669);
        assert_eq!(rfc3339(us), "2026-11-22T00:55:14.702669Z");
        assert_eq!(clock(us), "00:55:14.702");
        assert_eq!(full(us), "2026-11-22 00:55:14.702 UTC");
        assert_eq!(parse_us("yesterday"), None);
    }

    #[test]
    fn durations_and_latencies_read_naturally() {
        assert_eq!(duration_ms(0.25), "250 µs");
        assert_eq!(duration_ms(850.0), "850 ms");
        assert_eq!(duration_ms(1840.0), "1.84 s");
        assert_eq!(duration_ms(125_000.0), "2 min 05 s");
        assert_eq!(latency_us(7.5), "7.5 µs");
        assert_eq!(latency_us(249.856), "250 µs");
        assert_eq!(latency_us(3473.408), "3.47 ms");
        assert_eq!(thousands(1_234_567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(bytes(4096), "4 KiB");
        assert_eq!(bytes(182_702_080), "174 MiB");
    }
}
