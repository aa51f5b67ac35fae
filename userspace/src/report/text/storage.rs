//! The storage section of the terminal report: per disk its queue, per op
//! its traffic, latency and phases as lines and bar charts, the slowest I/Os.

use std::fmt::Write as _;

use super::{section, wrap};
use crate::report::bars;
use crate::report::view::{DiskView, OpView, View, count};

pub(super) fn storage(o: &mut String, v: &View, width: usize) {
    if v.disks.is_empty() {
        return;
    }
    section(
        o,
        &format!("STORAGE ({})", count(v.disks.len() as u64, "disk", "disks")),
        width,
    );
    for d in &v.disks {
        disk(o, d, width);
    }
}

fn disk(o: &mut String, d: &DiskView, width: usize) {
    let mut title = d.dev.clone();
    if let Some(n) = &d.devno {
        let _ = write!(title, " ({n})");
    }
    if let Some(r) = &d.role {
        let _ = write!(title, " — {r}");
    }
    let _ = writeln!(o, "\n{title}");
    if !d.limits.is_empty() {
        o.push_str(&wrap(&d.limits.join(", "), width, "  queue: ", "         "));
    }
    for op in d
        .ops
        .iter()
        .filter(|op| op.data.requests > 0 || op.data.latency.count() > 0)
    {
        disk_op(o, op, d.limit, width);
    }
    if let Some(slow) = &d.slow {
        let _ = writeln!(o, "  {}", slow.heading);
        for line in &slow.slowest {
            o.push_str(&wrap(line, width, "    ", "      "));
        }
    }
}

fn disk_op(o: &mut String, op: &OpView, limit: Option<u64>, width: usize) {
    let line = format!("{}: {}; {}", op.op.to_uppercase(), op.traffic, op.faults);
    o.push_str(&wrap(&line, width, "  ", "    "));
    if op.data.latency.count() == 0 {
        return;
    }
    // The latency is each bio's (what a submitter waited): merged bios make
    // its count differ from the requests above, which the line then says.
    let bios = op.data.latency.count();
    let of_what = if bios == op.data.requests {
        String::new()
    } else {
        format!(" of each of {bios} bios")
    };
    o.push_str(&wrap(
        &format!(
            "latency{of_what}, submitted to completed: {}, mean {}",
            op.latency.percentiles(),
            op.latency.mean
        ),
        width,
        "    ",
        "      ",
    ));
    // Phases without data (a flush has no tag wait) are left out.
    let phases: Vec<String> = op
        .phases
        .iter()
        .filter(|(_, _, any)| *any)
        .map(|(name, s, _)| format!("{name} {} / {}", s.mean, s.p99))
        .collect();
    if !phases.is_empty() {
        o.push_str(&wrap(
            &phases.join("; "),
            width,
            "    phases (mean / p99): ",
            "      ",
        ));
    }
    o.push_str(&bars::render(&bars::rows(&op.data.latency, None), width, 4));
    if op.data.inflight.count() > 0 {
        let s = &op.inflight;
        let line = format!(
            "requests in flight at each issue: p50 {}, p99 {}, max {}{}",
            s.p50,
            s.p99,
            s.max,
            op.at_limit
                .as_ref()
                .map(|a| format!("; {a}"))
                .unwrap_or_default()
        );
        o.push_str(&wrap(&line, width, "    ", "      "));
        o.push_str(&bars::render(
            &bars::rows(&op.data.inflight, limit.map(|l| l as f64)),
            width,
            4,
        ));
    }
}
