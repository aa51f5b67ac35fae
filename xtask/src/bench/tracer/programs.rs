//! Per-program cost from the daemons' stop records (kernel bpf_stats), as
//! both suites publish it: counters summed over runs, keyed by (family,
//! program), and ns/event from them.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{ProgramCost, StopRecord};

/// (family, program).
pub type Key = (String, String);

/// Counters of every program whose family `keep` accepts, summed over `stops`.
pub fn totals<'a>(
    stops: impl IntoIterator<Item = &'a StopRecord>,
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<Key, ProgramCost> {
    let mut out: BTreeMap<Key, ProgramCost> = BTreeMap::new();
    let programs = stops.into_iter().flat_map(|s| &s.programs);
    for p in programs.filter(|p| keep(&p.family)) {
        let e = out
            .entry((p.family.clone(), p.program.clone()))
            .or_insert_with(|| ProgramCost {
                run_count: 0,
                run_time_ns: 0,
                recursion_misses: 0,
                ..p.clone()
            });
        e.run_count += p.run_count;
        e.run_time_ns += p.run_time_ns;
        e.recursion_misses += p.recursion_misses;
    }
    out
}

/// None when it never ran.
pub fn ns_per_event(p: &ProgramCost) -> Option<f64> {
    (p.run_count > 0).then(|| p.run_time_ns as f64 / p.run_count as f64)
}

/// Records the daemons could not deliver, by source, summed over `stops`.
pub fn lost<'a>(stops: impl IntoIterator<Item = &'a StopRecord>) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for stop in stops {
        for (source, n) in &stop.lost {
            *out.entry(source.clone()).or_insert(0) += n;
        }
    }
    out
}

/// One program's counters over all the `--bpf-stats` runs of a suite; each
/// suite's result adds its per-depth or per-workload breakdown alongside
/// (flattened, so the JSON fields sit side by side).
#[derive(Serialize)]
pub struct ProgramTotal {
    pub family: String,
    pub program: String,
    pub run_count: u64,
    pub run_time_ns: u64,
    pub recursion_misses: u64,
    /// None when it never ran.
    pub ns_per_event: Option<f64>,
}

impl From<ProgramCost> for ProgramTotal {
    fn from(p: ProgramCost) -> Self {
        ProgramTotal {
            ns_per_event: ns_per_event(&p),
            family: p.family,
            program: p.program,
            run_count: p.run_count,
            run_time_ns: p.run_time_ns,
            recursion_misses: p.recursion_misses,
        }
    }
}

impl ProgramTotal {
    /// "family/program", as the tables name it.
    pub fn name(&self) -> String {
        format!("{}/{}", self.family, self.program)
    }
}

/// A ns/event table cell: whole ns, "–" when the program never ran.
fn ns_cell(ns: Option<f64>) -> String {
    ns.map_or("–".to_string(), |v| format!("{v:.0}"))
}

/// A program's row in a suite's cost table: its name and ns/event over all
/// runs; ns/event, events/s and events per unit of work of each part (a
/// depth, a workload), in `parts`' order; its recursion misses.
pub fn table_row(
    total: &ProgramTotal,
    parts: impl IntoIterator<Item = (Option<f64>, f64, f64)>,
) -> Vec<String> {
    let mut row = vec![total.name(), ns_cell(total.ns_per_event)];
    for (ns_per_event, events_per_s, events_per_unit) in parts {
        row.extend([
            ns_cell(ns_per_event),
            format!("{events_per_s:.0}"),
            format!("{events_per_unit:.2}"),
        ]);
    }
    row.push(total.recursion_misses.to_string());
    row
}

/// One program within one part of a suite (a depth, a workload), from that
/// part's totals: runs, ns/event, and runs per second of `seconds`.
pub struct InPart {
    pub run_count: u64,
    pub ns_per_event: Option<f64>,
    pub events_per_s: f64,
}

impl InPart {
    pub fn of(totals: &BTreeMap<Key, ProgramCost>, key: &Key, seconds: f64) -> Self {
        let p = totals.get(key);
        let run_count = p.map_or(0, |p| p.run_count);
        InPart {
            run_count,
            ns_per_event: p.and_then(ns_per_event),
            events_per_s: run_count as f64 / seconds.max(f64::MIN_POSITIVE),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stop(lost: &[(&str, u64)], programs: &[(&str, &str, u64, u64)]) -> StopRecord {
        StopRecord {
            kind: "stop".into(),
            lost: lost.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
            records: BTreeMap::new(),
            programs: programs
                .iter()
                .map(|(family, program, run_count, run_time_ns)| ProgramCost {
                    family: family.to_string(),
                    program: program.to_string(),
                    run_count: *run_count,
                    run_time_ns: *run_time_ns,
                    recursion_misses: 1,
                })
                .collect(),
        }
    }

    #[test]
    fn totals_sum_kept_families_over_runs() {
        let stops = [
            stop(
                &[("ring", 2)],
                &[("block", "on_issue", 10, 1000), ("tcp", "on_probe", 4, 800)],
            ),
            stop(
                &[("ring", 3), ("netdev", 1)],
                &[("block", "on_issue", 0, 0), ("block", "on_done", 0, 0)],
            ),
        ];
        let t = totals(&stops, |f| f == "block");
        assert_eq!(t.len(), 2, "tcp left out");
        let issue = &t[&("block".to_string(), "on_issue".to_string())];
        assert_eq!(
            (issue.run_count, issue.run_time_ns, issue.recursion_misses),
            (10, 1000, 2)
        );
        assert_eq!(ns_per_event(issue), Some(100.0));
        let done = ProgramTotal::from(t[&("block".to_string(), "on_done".to_string())].clone());
        assert_eq!((done.run_count, done.ns_per_event), (0, None));
        assert_eq!(
            table_row(&done, [(None, 0.0, 0.0), (Some(99.6), 12.4, 0.25)]),
            [
                "block/on_done",
                "–",
                "–",
                "0",
                "0.00",
                "100",
                "12",
                "0.25",
                "1"
            ]
        );

        let key = ("block".to_string(), "on_issue".to_string());
        let part = InPart::of(&t, &key, 2.0);
        assert_eq!((part.run_count, part.ns_per_event), (10, Some(100.0)));
        assert_eq!(part.events_per_s, 5.0);
        let missing = InPart::of(&t, &("tcp".to_string(), "on_probe".to_string()), 2.0);
        assert_eq!((missing.run_count, missing.ns_per_event), (0, None));

        assert_eq!(
            lost(&stops),
            BTreeMap::from([("netdev".to_string(), 1), ("ring".to_string(), 5)])
        );
    }
}
