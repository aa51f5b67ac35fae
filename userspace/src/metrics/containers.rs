//! `--prometheus-containers N`: slow I/Os and retransmitted segments per
//! container, so that an alert can name the container a database stalls in.
//! Containers come and go, so they are off by default and capped
//! (capped.rs): the first N containers get series of their own, labelled
//! with the short id `docker ps` and `podman ps` show; the others are counted
//! under `container="other"`.

use std::time::Instant;

use super::capped::{Capped, OTHER};
use super::registry::{Kind, Labels, Registry};
use crate::records::block::SlowIoRecord;
use crate::records::tcp::TcpRetransmitRecord;

/// The most `--prometheus-containers` takes.
pub const MAX_CONTAINERS: u32 = 1000;

const SLOW_IOS: &str = "stalltrace_container_slow_ios_total";
const SEGMENTS: &str = "stalltrace_container_retransmitted_segments_total";

#[derive(Debug)]
pub struct Containers {
    /// By short id.
    places: Capped<String>,
}

impl Containers {
    /// Declares the families; None when `cap` is 0 (off).
    pub fn new(r: &mut Registry, cap: u32) -> Option<Self> {
        if cap == 0 {
            return None;
        }
        r.declare(
            SLOW_IOS,
            Kind::Counter,
            "I/Os slower than --slow-io-ms submitted by each container's processes (--prometheus-containers; container=\"other\": the containers past the cap).",
        );
        r.declare(
            SEGMENTS,
            Kind::Counter,
            "Segments retransmitted (sent) on each containerised SQL Server's sessions (--prometheus-containers; container=\"other\": the containers past the cap).",
        );
        r.expires(SLOW_IOS);
        r.expires(SEGMENTS);
        Some(Self {
            places: Capped::new(cap.min(MAX_CONTAINERS) as usize),
        })
    }

    /// One `slow_io` record.
    pub fn slow_io(&mut self, r: &mut Registry, s: &SlowIoRecord) {
        if let Some(c) = &s.container {
            let labels = self.labels(c.short_id(), Instant::now());
            r.add(SLOW_IOS, labels, 1.0);
        }
    }

    /// One `tcp_retransmit` record that went out (err 0).
    pub fn retransmitted(&mut self, r: &mut Registry, t: &TcpRetransmitRecord) {
        let Some(id) = t.sql.as_ref().and_then(|sql| sql.container.as_deref()) else {
            return;
        };
        let labels = self.labels(id.get(..12).unwrap_or(id), Instant::now());
        r.add(SEGMENTS, labels, f64::from(t.segs));
    }

    fn labels(&mut self, short_id: &str, now: Instant) -> Labels {
        let key = short_id.to_string();
        if self.places.place(&key, now) {
            vec![("container", key)]
        } else {
            vec![("container", OTHER.to_string())]
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containers_past_the_cap_are_summed_as_other() {
        let mut r = Registry::default();
        let mut c = Containers::new(&mut r, 1).unwrap();
        let mut t = TcpRetransmitRecord::from_event(&Default::default(), 250);
        t.segs = 2;
        for id in ["a".repeat(64), "b".repeat(64), "c".repeat(64)] {
            t.sql = Some(crate::records::sql::SqlTag {
                container: Some(id),
                ..Default::default()
            });
            c.retransmitted(&mut r, &t);
        }
        let text = r.render();
        for line in [
            r#"stalltrace_container_retransmitted_segments_total{container="aaaaaaaaaaaa"} 2"#,
            r#"stalltrace_container_retransmitted_segments_total{container="other"} 4"#,
        ] {
            assert!(text.contains(line), "{line} not in\n{text}");
        }
        assert!(Containers::new(&mut Registry::default(), 0).is_none());
    }
}
