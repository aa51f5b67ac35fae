//! The report's header: what the run was, whether anything was lost, and
//! whether the stream is whole.

use std::collections::BTreeMap;

use super::losses::LossView;
use super::{clean, count};
use crate::report::model::Report;
use crate::report::time::{clock, duration_ms, full};

/// Said when nothing was lost.
pub const LOSSES_NONE: &str = "none: every event and measurement was delivered";
/// Said when the stream has every record the run wrote.
pub const STREAM_COMPLETE: &str = "complete: start to stop, every record the run wrote";

/// One probe family as the header lists it.
#[derive(Clone, Debug, PartialEq)]
pub struct FamilyView {
    /// `tcp (raw_tp)`, `block NOT ATTACHED`.
    pub label: String,
    /// `tcp fell back to raw_tp: why`, `block not attached: why`.
    pub note: Option<String>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub host: String,
    /// `kernel 6.18.0, stalltrace 0.1.0, schema 1`, or what is unknown without `start`.
    pub identity: String,
    /// The start's clock time, for a page title.
    pub started: String,
    /// `2026-11-22 10:00:00.000 UTC to 10:00:03.000 (3 s; 2 intervals of 1000 ms; ended by duration)`
    pub window: String,
    pub families: Vec<FamilyView>,
    /// Why the family list is not `start`'s own.
    pub families_note: Option<&'static str>,
    /// `optional hook missing: block block_rq_insert: why`
    pub missing_hooks: Vec<String>,
    /// What the run was limited to; `None`: everything.
    pub limited_to: Option<String>,
    /// What was lost, in proportion; `None`: nothing.
    pub losses: Option<LossView>,
    /// The files of a set, in stream order; `None` for one file.
    pub files: Option<String>,
    /// What is wrong with the stream, one sentence each; empty: it is whole.
    pub stream: Vec<String>,
    /// Record types this version does not read.
    pub unknown_types: Option<String>,
    /// One sentence per SQL Server instance.
    pub instances: Vec<String>,
}

impl Header {
    pub fn of(report: &Report) -> Self {
        let run = &report.run;
        let ended = match &run.stop_reason {
            Some(r) => format!("ended by {}", clean(r)),
            None => "no stop record".into(),
        };
        let families = run
            .families
            .iter()
            .map(|f| FamilyView {
                label: match (f.attached, &f.mode) {
                    (true, Some(m)) => format!("{} ({})", clean(&f.family), clean(m)),
                    (true, None) => clean(&f.family),
                    (false, _) => format!("{} NOT ATTACHED", clean(&f.family)),
                },
                note: f.note.as_ref().map(|n| {
                    let what = if f.attached {
                        "fell back to raw_tp"
                    } else {
                        "not attached"
                    };
                    format!("{} {what}: {}", clean(&f.family), clean(n))
                }),
            })
            .collect();
        let limited_to = if run.inferred {
            Some("unknown (no `start` record)".to_string())
        } else if !run.filters.is_empty() {
            Some(clean(&run.filters.join("; ")))
        } else {
            None
        };
        let listed = |types: &BTreeMap<String, u64>| -> String {
            types
                .iter()
                .map(|(k, n)| format!("{} ({n})", clean(k)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let mut ignored = Vec::new();
        if !report.stream.unknown_types.is_empty() {
            ignored.push(format!(
                "record types this version does not know, ignored: {}",
                listed(&report.stream.unknown_types)
            ));
        }
        if !report.stream.unreadable.is_empty() {
            ignored.push(format!(
                "records this version cannot read (fields missing or of another type), ignored: {}",
                listed(&report.stream.unreadable)
            ));
        }
        let unknown_types = (!ignored.is_empty()).then(|| ignored.join("; "));
        Self {
            host: clean(&run.host),
            identity: clean(&run.identity()),
            started: clock(run.start_us),
            window: format!(
                "{} to {} ({}; {}; {})",
                full(run.start_us),
                clock(run.end_us),
                duration_ms(run.window_ms()),
                run.intervals_words(),
                match run.whole_run {
                    Some((start, end)) => format!(
                        "the part --since/--until asked for of a run from {} to {}, {ended}",
                        full(start),
                        full(end)
                    ),
                    None => ended,
                }
            ),
            families,
            families_note: run.families_note(),
            missing_hooks: run
                .missing_hooks
                .iter()
                .map(|h| format!("optional hook missing: {}", clean(h)))
                .collect(),
            limited_to,
            losses: super::losses::of(report),
            files: report.stream.files_summary().map(|f| clean(&f)),
            stream: report
                .stream
                .warnings(run)
                .iter()
                .map(|w| clean(w))
                .collect(),
            unknown_types,
            instances: report.instances.iter().map(instance).collect(),
        }
    }

    /// The families, and why the list is not `start`'s own: `block (tp_btf), tcp (raw_tp)`.
    pub fn attached(&self) -> String {
        let labels: Vec<&str> = self.families.iter().map(|f| f.label.as_str()).collect();
        match self.families_note {
            None => labels.join(", "),
            Some(note) if labels.is_empty() => note.to_string(),
            Some(note) => format!("{} ({note})", labels.join(", ")),
        }
    }
}

/// `sqlservr pid 4242 (watchdog 4240) in podman container 2e2222c3a812, TDS port 1433, …,
/// 3 client sessions seen; disks 8:0 log`
fn instance(inst: &crate::report::Instance) -> String {
    let mut s = format!("sqlservr pid {}", inst.pid);
    if let Some(w) = inst.watchdog_pid {
        s.push_str(&format!(" (watchdog {w})"));
    }
    if let Some(c) = &inst.container {
        // The 12 digits `docker ps`, `podman ps` and crictl show.
        let runtime = c
            .runtime
            .map(|r| format!("{} ", r.name()))
            .unwrap_or_default();
        match &c.name {
            Some(name) => s.push_str(&format!(
                " in {runtime}container {} ({})",
                clean(name),
                clean(c.short_id())
            )),
            None => s.push_str(&format!(" in {runtime}container {}", clean(c.short_id()))),
        }
        if let Some(pod) = &c.pod_uid {
            s.push_str(&format!(" of pod {}", clean(pod)));
        }
    }
    let ports = |p: &[u64]| p.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
    if !inst.tds_ports.is_empty() {
        s.push_str(&format!(", TDS port {}", ports(&inst.tds_ports)));
    }
    if !inst.ag_ports.is_empty() {
        s.push_str(&format!(", endpoint port {}", ports(&inst.ag_ports)));
    }
    s.push_str(&format!(
        ", {} seen",
        count(
            inst.sessions_seen as u64,
            "client session",
            "client sessions"
        )
    ));
    if !inst.disk_roles.is_empty() {
        let roles: Vec<String> = inst
            .disk_roles
            .iter()
            .map(|(d, r)| format!("{} {}", clean(d), clean(r)))
            .collect();
        s.push_str(&format!("; disks {}", roles.join(", ")));
    }
    let slow: u64 = inst.slow_ios_by_file.values().sum();
    if slow > 0 {
        s.push_str(&format!(
            "; {} of its own",
            count(slow, "slow I/O", "slow I/Os")
        ));
    }
    s
}
