//! Kernel timestamps are CLOCK_MONOTONIC (bpf_ktime_get_ns); records carry
//! wall-clock time. One offset, taken at start, converts between them.

use chrono::{DateTime, SecondsFormat, Utc};

fn clock_ns(clock: libc::clockid_t) -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(clock, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

pub fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC) as u64
}

#[derive(Clone, Copy, Debug)]
pub struct Clock {
    realtime_minus_monotonic_ns: i128,
}

impl Clock {
    pub fn new() -> Self {
        let mono = clock_ns(libc::CLOCK_MONOTONIC);
        let real = clock_ns(libc::CLOCK_REALTIME);
        Self {
            realtime_minus_monotonic_ns: real - mono,
        }
    }

    /// RFC 3339, UTC, microseconds: the `ts` format of every record.
    pub fn now_rfc3339() -> String {
        Utc::now().to_rfc3339_opts(SecondsFormat::Micros, true)
    }

    pub fn monotonic_to_rfc3339(&self, mono_ns: u64) -> String {
        let real = i128::from(mono_ns) + self.realtime_minus_monotonic_ns;
        let secs = real.div_euclid(1_000_000_000) as i64;
        let nanos = real.rem_euclid(1_000_000_000) as u32;
        DateTime::<Utc>::from_timestamp(secs, nanos)
            .unwrap_or_default()
            .to_rfc3339_opts(SecondsFormat::Micros, true)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monotonic_now_maps_to_wall_now() {
        let clock = Clock::new();
        let converted = clock.monotonic_to_rfc3339(monotonic_ns());
        let parsed = DateTime::parse_from_rfc3339(&converted).unwrap();
        let skew = (Utc::now() - parsed.with_timezone(&Utc))
            .num_milliseconds()
            .abs();
        assert!(skew < 1000, "{converted}");
        assert!(converted.ends_with('Z'));
        assert_eq!(converted.len(), "2026-01-01T00:00:00.000000Z".len());
    }
}
