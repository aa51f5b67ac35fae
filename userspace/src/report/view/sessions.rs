//! SQL Server sessions and the time each lost.

use super::{clean, ms_or_dash};
use crate::report::model::Report;
use crate::report::sessions::SessionTag;
use crate::report::time::thousands;

/// What the `in stalls` column means.
pub const IN_STALLS_MEANS: &str = "summed length of the episodes that hit it";
/// What the `timeout wait` column means.
pub const TIMEOUT_WAIT_MEANS: &str =
    "retransmission timeouts and tail-loss probes its connection sat out";

#[derive(Clone, Debug, PartialEq)]
pub struct SessionRow {
    /// `SPID 51`
    pub spid: String,
    /// `10.0.0.9:50000`, or `-`.
    pub client: String,
    /// `login app, program OrderSvc`; empty when DMV enrichment gave nothing.
    pub who: String,
    /// `(rank, id)` of the episodes that hit it, numbered by rank as the
    /// episode list numbers them.
    pub episodes: Vec<(usize, u64)>,
    pub in_stalls: String,
    pub timeout_wait: String,
    pub retransmits: String,
    pub segments: String,
}

pub fn of(report: &Report) -> Vec<SessionRow> {
    report
        .sessions
        .iter()
        .map(|s| {
            let mut episodes: Vec<(usize, u64)> = s
                .episodes
                .iter()
                .filter_map(|id| Some((report.rank_of(*id)?, *id)))
                .collect();
            episodes.sort_unstable();
            SessionRow {
                spid: s.tag.spid_label(),
                client: s
                    .tag
                    .client
                    .as_deref()
                    .map(clean)
                    .unwrap_or_else(|| "-".into()),
                who: s.tag.who().map(|w| clean(&w)).unwrap_or_default(),
                episodes,
                in_stalls: ms_or_dash(s.stall_ms),
                timeout_wait: ms_or_dash(s.timeout_wait_ms),
                retransmits: thousands(s.retransmits),
                segments: thousands(s.retrans_segs),
            }
        })
        .collect()
}
