//! The floor in the block section: its setup line, and what it cost.

use std::fmt::Write;

use super::super::NS_PER_EVENT_TARGET;
use super::super::results::BlockResults;
use super::est;
use crate::bench::floor::Description;
use crate::bench::table;

/// The setup line: how the floor ran, what each program does, and where.
pub fn setup_line(r: &BlockResults) -> String {
    Description::setup_line(
        r.floor.as_ref().map(|f| &f.description),
        r.setup.paired.floor,
        ("Floor on this VM", "#floor-on-this-vm"),
        "I/O",
    )
}

/// Floor and work per I/O at each depth, in words: "QD16 floor 190 [185–200]
/// ns + work 410 [380–450] ns".
pub fn per_io_text(r: &BlockResults) -> String {
    r.depths
        .iter()
        .map(|d| {
            format!(
                "{} floor {} ns + work {} ns",
                d.label,
                est(&d.floor_ns_per_io, 0),
                est(&d.work_over_floor_ns_per_io, 0),
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// The "Floor on this VM" subsection: the floor per I/O and per hook, and its C.
pub fn section(s: &mut String, r: &BlockResults) {
    *s += "\n### Floor on this VM\n\n";
    let Some(f) = &r.floor else {
        *s += "Not measured: no traced block ran, so no hooks were known.\n";
        return;
    };
    let _ = writeln!(
        s,
        "Measured by this suite, in each round's traced block right after the daemon stopped: \
         one program per hook the daemon attached, with the same attach type, each doing {}, \
         with the kernel's accounting on. It is what the accounting charges a program on \
         those hooks that does only what any timing hook does at least; what stalltrace's \
         programs are charged beyond it (\"work\") is their own. Per I/O fio completed, round \
         by round (median [95% interval]): {}.\n",
        f.description.body,
        per_io_text(r),
    );
    let rows: Vec<Vec<String>> = f
        .programs
        .iter()
        .map(|p| {
            let mut row = p.row();
            row.push(p.by_round.as_ref().map_or("–".into(), |e| {
                format!("{:.0}", NS_PER_EVENT_TARGET - e.median)
            }));
            row
        })
        .collect();
    let room =
        format!("left under the {NS_PER_EVENT_TARGET:.0} ns/hook target for a hook's own work, ns");
    *s += &table::markdown(
        &[
            "floor program",
            "ns/event",
            "per round: median [95% CI]",
            "runs",
            room.as_str(),
        ],
        &rows,
    );
    let _ = writeln!(
        s,
        "\nstalltrace's ns/event above includes this floor, so each hook's own work is its \
         ns/event less the floor's on the same hook. {}",
        f.description.source_text()
    );
}
