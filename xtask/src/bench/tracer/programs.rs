//! Per-program cost (kernel bpf_stats), as both suites publish it: each
//! run's counters read around it ([`Snapshot`]) and named by the daemon's
//! stop record ([`resolve`]), summed over runs, keyed by (family, program),
//! and ns/event from them.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{ProgramCost, StopRecord};
use crate::bench::stats::Estimate;

/// (family, program).
pub type Key = (String, String);

/// Counters of every program whose family `keep` accepts, summed over `stops`.
pub fn totals<'a>(
    stops: impl IntoIterator<Item = &'a StopRecord>,
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<Key, ProgramCost> {
    sum(stops.into_iter().flat_map(|s| &s.programs), keep)
}

/// Counters of every program whose family `keep` accepts, summed over `programs`.
pub fn sum<'a>(
    programs: impl IntoIterator<Item = &'a ProgramCost>,
    keep: impl Fn(&str) -> bool,
) -> BTreeMap<Key, ProgramCost> {
    let mut out: BTreeMap<Key, ProgramCost> = BTreeMap::new();
    for p in programs.into_iter().filter(|p| keep(&p.family)) {
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

/// The headers of a suite's cost table: the program, ns/event over all runs
/// and per round, then three columns a part (`parts`: its name and its unit
/// of work, in the rows' order), then recursion misses.
pub fn table_headers<'a>(parts: impl IntoIterator<Item = (String, &'a str)>) -> Vec<String> {
    let mut headers = vec![
        "program".to_string(),
        "ns/event".into(),
        "per round: median [95% CI]".into(),
    ];
    for (part, unit) in parts {
        headers.extend([
            format!("ns/event {part}"),
            format!("events/s {part}"),
            format!("per {unit} {part}"),
        ]);
    }
    headers.push("recursion misses".into());
    headers
}

/// A program's row in a suite's cost table: its name and ns/event over all
/// runs and per round (`by_round`); ns/event, events/s and events per unit
/// of work of each part (a depth, a workload), in `parts`' order; its
/// recursion misses.
pub fn table_row(
    total: &ProgramTotal,
    by_round: Option<&Estimate>,
    parts: impl IntoIterator<Item = (Option<f64>, f64, f64)>,
) -> Vec<String> {
    let mut row = vec![
        total.name(),
        ns_cell(total.ns_per_event),
        by_round.map_or("–".into(), |e| e.text(0)),
    ];
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

/// One program's counters at one moment, as `bpftool prog show` reads them.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Counter {
    /// The kernel's name for it: the full name where bpftool finds it in the
    /// program's BTF, else the first 15 characters.
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

/// The counters of some programs at one moment, by program id: read before
/// and after each run under a daemon, so that one daemon serves several runs
/// (as deployed, and with the kernel's accounting on) and each run gets its
/// own figures.
#[derive(Clone, Debug, Default)]
pub struct Snapshot(pub BTreeMap<u64, Counter>);

impl Snapshot {
    /// One `bpftool prog show --json` (every program on the host), kept for `ids`.
    pub fn take(ids: &[u64]) -> anyhow::Result<Self> {
        let text = crate::util::output("bpftool", &["prog", "show", "--json"])
            .ok_or_else(|| anyhow::anyhow!("`bpftool prog show --json` failed"))?;
        Self::parse(&text, ids)
    }

    fn parse(text: &str, ids: &[u64]) -> anyhow::Result<Self> {
        let all: Vec<serde_json::Value> = serde_json::from_str(text)
            .map_err(|e| anyhow::anyhow!("bpftool prog show printed no JSON list: {e}"))?;
        Ok(Snapshot(
            all.iter()
                .filter_map(|p| {
                    let id = p["id"].as_u64().filter(|id| ids.contains(id))?;
                    let n = |k: &str| p[k].as_u64().unwrap_or(0);
                    Some((
                        id,
                        Counter {
                            name: p["name"].as_str().unwrap_or("?").to_string(),
                            run_count: n("run_cnt"),
                            run_time_ns: n("run_time_ns"),
                        },
                    ))
                })
                .collect(),
        ))
    }

    /// What each program gained since `earlier` (a program missing from
    /// `earlier` counts from 0).
    pub fn since(&self, earlier: &Snapshot) -> BTreeMap<u64, Counter> {
        self.0
            .iter()
            .map(|(id, now)| {
                let then = earlier.0.get(id);
                let base = |f: fn(&Counter) -> u64| then.map_or(0, f);
                (
                    *id,
                    Counter {
                        name: now.name.clone(),
                        run_count: now.run_count.saturating_sub(base(|c| c.run_count)),
                        run_time_ns: now.run_time_ns.saturating_sub(base(|c| c.run_time_ns)),
                    },
                )
            })
            .collect()
    }
}

/// Runs counted over all of `delta`'s programs.
pub fn total_runs(delta: &BTreeMap<u64, Counter>) -> u64 {
    delta.values().map(|c| c.run_count).sum()
}

/// The (family, program) of each attached program id of one daemon, as its
/// `stop` record names them: `attached` is (id, family, hook) from its
/// `start` record, `names` the kernel's names by id. The kernel's name is
/// the program's when bpftool read it from BTF; a name cut at 15 characters
/// is matched to the one program of its family it begins, and where several
/// begin alike (`on_net_dev_xmit` and `on_net_dev_xmit_timeout`), to the one
/// whose name ends with its hook. Unmatched, the kernel's name stays.
pub fn resolve(
    attached: &[(u64, String, String)],
    names: &BTreeMap<u64, String>,
    stop: &StopRecord,
) -> BTreeMap<u64, Key> {
    attached
        .iter()
        .map(|(id, family, hook)| {
            let name = names.get(id).cloned().unwrap_or_default();
            let ours: Vec<&str> = stop
                .programs
                .iter()
                .filter(|p| &p.family == family)
                .map(|p| p.program.as_str())
                .collect();
            let cut = name.chars().count() == 15;
            let candidates: Vec<&str> = ours
                .iter()
                .copied()
                .filter(|p| *p == name || (cut && p.starts_with(&name)))
                .collect();
            let by_hook: Vec<&str> = candidates
                .iter()
                .copied()
                .filter(|p| p.ends_with(hook.as_str()))
                .collect();
            let program = match (candidates.as_slice(), by_hook.as_slice()) {
                ([one], _) => one.to_string(),
                (_, [one]) => one.to_string(),
                _ => name,
            };
            (*id, (family.clone(), program))
        })
        .collect()
}

/// One run's counters as program costs: every program of the daemon's
/// `stop` record (0 where it did not run then), plus the run's `delta` by
/// the names [`resolve`] gave. Recursion misses are left to the stop records.
pub fn window_costs(
    delta: &BTreeMap<u64, Counter>,
    names: &BTreeMap<u64, Key>,
    stop: &StopRecord,
) -> Vec<ProgramCost> {
    let mut out: BTreeMap<Key, ProgramCost> = stop
        .programs
        .iter()
        .map(|p| {
            (
                (p.family.clone(), p.program.clone()),
                ProgramCost {
                    run_count: 0,
                    run_time_ns: 0,
                    recursion_misses: 0,
                    ..p.clone()
                },
            )
        })
        .collect();
    for (id, c) in delta {
        let Some(key) = names.get(id) else { continue };
        let e = out.entry(key.clone()).or_insert_with(|| ProgramCost {
            family: key.0.clone(),
            program: key.1.clone(),
            run_count: 0,
            run_time_ns: 0,
            recursion_misses: 0,
        });
        e.run_count += c.run_count;
        e.run_time_ns += c.run_time_ns;
    }
    out.into_values().collect()
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
    fn snapshots_keep_our_ids_and_subtract() {
        let before = r#"[{"id":7,"name":"on_block_rq_iss","run_cnt":10,"run_time_ns":1000},
            {"id":8,"name":"other","run_cnt":5,"run_time_ns":50},
            {"id":9,"name":"on_block_rq_complete"}]"#;
        let after = r#"[{"id":7,"name":"on_block_rq_iss","run_cnt":25,"run_time_ns":2500},
            {"id":9,"name":"on_block_rq_complete","run_cnt":4,"run_time_ns":400}]"#;
        let b = Snapshot::parse(before, &[7, 9]).unwrap();
        assert_eq!(b.0.len(), 2, "8 is not ours");
        let a = Snapshot::parse(after, &[7, 9]).unwrap();
        let d = a.since(&b);
        assert_eq!((d[&7].run_count, d[&7].run_time_ns), (15, 1500));
        assert_eq!((d[&9].run_count, d[&9].run_time_ns), (4, 400));
        assert_eq!(total_runs(&d), 19);
        assert!(Snapshot::parse("Error: x", &[7]).is_err());
    }

    #[test]
    fn kernel_names_are_matched_to_the_stop_records() {
        let s = stop(
            &[],
            &[
                ("netdev", "on_net_dev_xmit", 0, 0),
                ("netdev", "on_net_dev_xmit_timeout", 0, 0),
                ("tcp", "on_tcp_probe", 0, 0),
                ("netdev", "on_tcp_probe", 0, 0),
                ("block", "on_block_rq_issue", 0, 0),
            ],
        );
        let attached: Vec<(u64, String, String)> = [
            (1, "netdev", "net_dev_xmit"),
            (2, "netdev", "net_dev_xmit_timeout"),
            (3, "tcp", "tcp_probe"),
            (4, "block", "block_rq_issue"),
            (5, "block", "block_rq_merge"),
        ]
        .iter()
        .map(|(i, f, h)| (*i, f.to_string(), h.to_string()))
        .collect();
        let names: BTreeMap<u64, String> = [
            (1, "on_net_dev_xmit"),
            (2, "on_net_dev_xmit"),
            (3, "on_tcp_probe"),
            (4, "on_block_rq_iss"),
            (5, "on_block_rq_mer"),
        ]
        .iter()
        .map(|(i, n)| (*i, n.to_string()))
        .collect();
        let r = resolve(&attached, &names, &s);
        let key = |f: &str, p: &str| (f.to_string(), p.to_string());
        assert_eq!(r[&1], key("netdev", "on_net_dev_xmit"));
        assert_eq!(r[&2], key("netdev", "on_net_dev_xmit_timeout"));
        assert_eq!(r[&3], key("tcp", "on_tcp_probe"), "family told them apart");
        assert_eq!(r[&4], key("block", "on_block_rq_issue"));
        assert_eq!(
            r[&5],
            key("block", "on_block_rq_mer"),
            "unmatched: as named"
        );

        let delta = BTreeMap::from([(
            4,
            Counter {
                name: "on_block_rq_iss".into(),
                run_count: 3,
                run_time_ns: 300,
            },
        )]);
        let costs = window_costs(&delta, &r, &s);
        assert_eq!(costs.len(), 5, "every program of the stop record");
        let issue = costs
            .iter()
            .find(|p| p.program == "on_block_rq_issue")
            .unwrap();
        assert_eq!((issue.run_count, issue.run_time_ns), (3, 300));
        assert!(
            costs
                .iter()
                .filter(|p| p.program != "on_block_rq_issue")
                .all(|p| p.run_count == 0)
        );
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
            table_row(&done, None, [(None, 0.0, 0.0), (Some(99.6), 12.4, 0.25)]),
            [
                "block/on_done",
                "–",
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
