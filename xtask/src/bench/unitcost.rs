//! Cost per unit of work a user can scale by their own rates: BPF run time
//! per I/O, per received and per sent TCP segment (the kernel's bpf_stats,
//! round by round), what that is in % of one core at 100 000 units per
//! second, and the user-space process's own CPU and memory (stalltrace's
//! daemon; bpftrace), for stalltrace and for the peer doing the same job on
//! the same hooks.

use serde::Serialize;

use super::parts::ProcessResult;
use super::stats::Estimate;
use super::table;

/// The rate the tables scale to.
pub const RATE: f64 = 100_000.0;

/// % of one core that `ns` of BPF run time per unit costs at [`RATE`] units per second.
pub fn pct_of_core_at_rate(ns: f64) -> f64 {
    ns * RATE / 1e9 * 100.0
}

/// The formula, once, for the sections that use it.
pub const FORMULA: &str = "% of one core = BPF ns per unit × units per second ÷ 10⁹ × 100, \
     so at 100 000 units per second it is BPF ns per unit ÷ 100";

/// One unit of work and a tool's BPF run time per unit.
#[derive(Serialize)]
pub struct PerUnit {
    pub unit: &'static str,
    /// Round by round: each round's bpf_stats run, run time over units.
    pub bpf_ns: Option<Estimate>,
    /// The same in % of one core at [`RATE`] units per second.
    pub pct_of_core_at_100k: Option<Estimate>,
    /// Round by round, `bpf_ns` less what empty programs on the same hooks
    /// cost in the same round (see `floor`): the tool's own work. Only where
    /// a suite measures a floor.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_over_floor_ns: Option<Estimate>,
}

impl PerUnit {
    pub fn new(unit: &'static str, ns_by_round: impl IntoIterator<Item = f64>) -> Self {
        let bpf_ns = Estimate::of(ns_by_round);
        PerUnit {
            unit,
            pct_of_core_at_100k: bpf_ns.as_ref().map(|e| e.scaled(pct_of_core_at_rate)),
            bpf_ns,
            work_over_floor_ns: None,
        }
    }

    /// With the tool's work over the floor, round by round.
    pub fn with_work_over_floor(self, ns_by_round: impl IntoIterator<Item = f64>) -> Self {
        PerUnit {
            work_over_floor_ns: Estimate::of(ns_by_round),
            ..self
        }
    }
}

/// One tool on one workload.
#[derive(Serialize)]
pub struct UnitCost {
    pub workload: String,
    pub tool: String,
    pub per_unit: Vec<PerUnit>,
    /// Its process while the workload ran (runs without the accounting): CPU
    /// time over wall time, in % of one core, round by round.
    pub process_cpu_pct: Option<Estimate>,
    /// The rate the process figure was measured at, in words ("183k I/O/s").
    pub measured_at: String,
    /// Peak RSS (VmHWM) of the process, the largest over the rounds; None
    /// for programs without a process of their own (the floor's).
    pub peak_rss_mib: Option<f64>,
}

/// The floor's row in the cost-per-unit tables.
pub const FLOOR_TOOL: &str = "floor (empty programs, same hooks)";

impl UnitCost {
    /// A tool with a process of its own (stalltrace's daemon, a peer), its
    /// `process` measured at `measured_at`.
    pub fn of_process(
        workload: &str,
        tool: &str,
        per_unit: Vec<PerUnit>,
        process: &ProcessResult,
        measured_at: String,
    ) -> Self {
        UnitCost {
            workload: workload.into(),
            tool: tool.into(),
            per_unit,
            process_cpu_pct: process.cpu_pct_of_one_cpu.clone(),
            measured_at,
            peak_rss_mib: Some(process.peak_rss_mib),
        }
    }

    /// The floor's row: its programs run in the bench's own process, which
    /// has nothing else to show.
    pub fn floor(workload: &str, per_unit: Vec<PerUnit>) -> Self {
        UnitCost {
            workload: workload.into(),
            tool: FLOOR_TOOL.into(),
            per_unit,
            process_cpu_pct: None,
            measured_at: "–".into(),
            peak_rss_mib: None,
        }
    }
}

/// "183k", "4.1k", "950": a rate in words.
pub fn rate_text(per_s: f64) -> String {
    if per_s >= 100_000.0 {
        format!("{:.0}k", per_s / 1000.0)
    } else if per_s >= 1000.0 {
        format!("{:.1}k", per_s / 1000.0)
    } else {
        format!("{per_s:.0}")
    }
}

fn plural(unit: &str) -> String {
    if unit.ends_with('s') {
        unit.to_string()
    } else {
        format!("{unit}s")
    }
}

fn cell(e: &Option<Estimate>, digits: usize) -> String {
    e.as_ref().map_or("–".into(), |e| e.text(digits))
}

/// The table of `rows` (all with the same units, in the same order).
pub fn markdown(rows: &[UnitCost]) -> String {
    let Some(first) = rows.first() else {
        return String::new();
    };
    let mut headers = vec!["workload".to_string(), "tool".to_string()];
    // The work-over-the-floor column of a unit only where some row has it.
    let floors: Vec<bool> = (0..first.per_unit.len())
        .map(|i| {
            rows.iter().any(|r| {
                r.per_unit
                    .get(i)
                    .is_some_and(|u| u.work_over_floor_ns.is_some())
            })
        })
        .collect();
    for (u, floor) in first.per_unit.iter().zip(&floors) {
        headers.push(format!("BPF ns per {}", u.unit));
        headers.push(format!("% of one core at 100k {}/s", plural(u.unit)));
        if *floor {
            headers.push(format!("work over the floor, BPF ns per {}", u.unit));
        }
    }
    headers.extend([
        "process CPU, % of one core".to_string(),
        "measured at".to_string(),
        "process peak RSS MiB".to_string(),
    ]);
    let body: Vec<Vec<String>> = rows
        .iter()
        .map(|r| {
            let mut row = vec![r.workload.clone(), r.tool.clone()];
            for (u, floor) in r.per_unit.iter().zip(&floors) {
                row.push(cell(&u.bpf_ns, 0));
                row.push(cell(&u.pct_of_core_at_100k, 2));
                if *floor {
                    row.push(cell(&u.work_over_floor_ns, 0));
                }
            }
            row.extend([
                cell(&r.process_cpu_pct, 2),
                r.measured_at.clone(),
                r.peak_rss_mib.map_or("–".into(), |m| format!("{m:.1}")),
            ]);
            row
        })
        .collect();
    let refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    table::markdown(&refs, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_core_share_at_100k_per_second() {
        // 701 ns per I/O at 100 000 IOPS: 70.1 ms of every second, 7.01% of a core.
        assert!((pct_of_core_at_rate(701.0) - 7.01).abs() < 1e-9);
        let u = PerUnit::new("I/O", [700.0, 702.0, 701.0, 699.0, 703.0, 701.0]);
        let pct = u.pct_of_core_at_100k.unwrap();
        assert!((pct.median - 7.01).abs() < 1e-9);
        assert!((pct.ci.unwrap().low - 6.99).abs() < 1e-9);
        assert_eq!(rate_text(183_456.0), "183k");
        assert_eq!(rate_text(4_120.0), "4.1k");
        assert_eq!(rate_text(950.0), "950");
    }

    #[test]
    fn the_table_names_each_unit() {
        let row = |tool: &str| UnitCost {
            workload: "sockperf".into(),
            tool: tool.into(),
            per_unit: vec![
                PerUnit::new("received segment", [300.0; 6]),
                PerUnit::new("sent segment", [500.0; 6]),
            ],
            process_cpu_pct: Estimate::of([0.5; 6]),
            measured_at: "10k received segments/s".into(),
            peak_rss_mib: Some(33.2),
        };
        let t = markdown(&[row("stalltrace"), row("bpftrace")]);
        assert!(t.contains("BPF ns per received segment"), "{t}");
        assert!(t.contains("% of one core at 100k sent segments/s"), "{t}");
        assert!(t.contains(" 300 [300–300] |"), "{t}");
        assert!(t.contains("3.00 [3.00–3.00]"), "{t}");
        assert!(t.contains(" 33.2 |"), "{t}");
        assert!(!t.contains("over the floor"), "no floor, no column: {t}");
        assert_eq!(markdown(&[]), "");

        // A floor for the first unit: its column there only, "–" where a row has none.
        let mut st = row("stalltrace");
        st.per_unit[0] = PerUnit::new("received segment", [300.0; 6])
            .with_work_over_floor([110.0, 120.0, 130.0, 120.0, 120.0, 120.0]);
        let floor = UnitCost {
            peak_rss_mib: None,
            ..row("floor")
        };
        let t = markdown(&[st, floor]);
        assert!(
            t.contains("work over the floor, BPF ns per received segment"),
            "{t}"
        );
        assert!(
            !t.contains("over the floor, BPF ns per sent segment"),
            "{t}"
        );
        assert!(t.contains(" 120 [110–130] |"), "{t}");
        let floor_row = t.lines().find(|l| l.contains("| floor")).unwrap();
        let dashes = floor_row.split('|').filter(|c| c.trim() == "–").count();
        assert_eq!(dashes, 2, "no work over itself, no RSS: {floor_row}");
    }
}
