//! The block section of docs/BENCHMARKS.md (also printed to the terminal).

mod floor;
mod rezolus;

use std::fmt::Write;

use super::results::{BlockResults, Ratios, Side};
use crate::bench::configs::{self, Column, ratio_row, side_row};
use crate::bench::publish::{self, Verdict};
use crate::bench::stats::{Estimate, range};
use crate::bench::tracer::programs;
use crate::bench::{parts, table, unitcost};

pub fn markdown(r: &BlockResults) -> String {
    let mut s = String::new();
    let h = &r.host;
    let st = &r.setup;
    // Writing to a String cannot fail.
    let _ = writeln!(
        s,
        "## block: fio 4k random read on a tmpfs-backed and a disk-backed loop device\n\n\
         {}\n\
         - Command: `{}` (this suite took {:.0} s)\n\
         - Devices: {} MiB of random data on a private tmpfs, on a loop device with \
         direct I/O {} (\"QD16\", \"QD1\": the worst case, no device time); the same on a \
         file on the VM's own disk under /var/tmp, on a loop device with direct I/O {} \
         (\"disk QD16\", \"disk QD1\": a real device's service time)\n\
         - Workload: `{}`\n\
         - Traced: `{}` (\"traced\", stalltrace as deployed: the IOPS and p99 ratios and \
         the IOPS target use it); \"traced+bpf-stats\": {} (per-program ns/event and events/s \
         come from it; its IOPS are shown but judge nothing); hooks: {}\n\
         {}\
         - Peers: `bpftrace` running the script shown under Peers (\"bpftrace\"; with \
         the accounting on, \"bpftrace+bpf-stats\"), and {}; {}\n\
         - Order: {} rounds of {} s runs at QD16 and QD1 on each device; {}. Figures that judge are \
         per-round ratios (each run over the untraced run of the same round, device and depth) or \
         per-round costs, given as median [95% interval] (method: see \
         [Method](#method-rounds-intervals-verdicts)); the configurations' own figures are \
         medians over rounds, with min–max\n\
         - Load average (1/5/15 min) before: {}, after: {}\n",
        h.line(),
        r.command,
        r.wall_time_s,
        st.file_mib,
        if st.loop_direct_io {
            "on (loop `dio`=1)"
        } else {
            "off (loop `dio`=0: tmpfs refused O_DIRECT; reads go through the page cache)"
        },
        if st.disk_loop_direct_io {
            "on (loop `dio`=1: reads reach the disk)"
        } else {
            "off (loop `dio`=0: refused; reads may hit the page cache)"
        },
        st.fio,
        st.paired.tracer,
        st.paired.tracer_bpf_stats,
        r.hooks.join(", "),
        floor::setup_line(r),
        rezolus::setup_words(r),
        st.peer_order,
        st.paired.rounds,
        st.paired.runtime_s,
        st.paired.order,
        r.load_average[0],
        r.load_average[1],
    );

    let t = &r.targets;
    s += "### Targets\n\n";
    s += &Verdict::table([
        &t.iops_ratio_qd16,
        &t.iops_ratio_qd1,
        &t.iops_ratio_disk_qd16,
        &t.iops_ratio_disk_qd1,
        &t.ns_per_io_qd16,
        &t.ns_per_event_per_hook,
        &t.versus_peer_qd16,
        &t.work_over_floor_qd16,
    ]);

    fio_table(&mut s, r);
    programs_table(&mut s, r);

    let _ = writeln!(
        s,
        "\n### Cost per unit of work\n\n\
         BPF run time per I/O fio completed (every program of each tool, each round's \
         accounting run; median [95% interval]), the same as a share of one core at \
         100 000 IOPS (the formula is under [Method](#method-rounds-intervals-verdicts)), and \
         the tool's own process while fio ran, in the runs without the accounting (stalltrace's \
         daemon; bpftrace; rezolus). The floor row is empty programs on stalltrace's hooks (see \
         [Floor on this VM](#floor-on-this-vm)), run in the bench's own process; \
         stalltrace's work over the floor is, round by round, its BPF ns per I/O less the \
         floor's of the same round. The process's CPU here does not grow with the I/O rate: at \
         the default `--slow-io-ms` (50 ms) no I/O of these devices is slow, so the daemon sends \
         no per-I/O record and reads its maps once per interval (a delivered `slow_io` record costs it ~10 µs: see the daemon suite).\n"
    );
    s += &unitcost::markdown(&r.unit_costs);

    s += &r.peer.markdown();
    rezolus::section(&mut s, r);

    s += &parts::daemon_table(
        "depth",
        "fio",
        r.depths
            .iter()
            .map(|d| (d.label.clone(), &d.configs.daemon)),
    );
    let l = &r.daemon_lifetime_cpu_s;
    let _ = writeln!(
        s,
        "\nCPU s over each round's daemon's life (load, verify, attach, its {} runs, detach): \
         {:.2} ({}).",
        2 * r.depths.len(),
        l.median,
        range(l, 2)
    );

    floor::section(&mut s, r);
    notes(&mut s, r);
    s
}

/// "median [low–high]", or "–".
fn est(e: &Option<Estimate>, digits: usize) -> String {
    e.as_ref().map_or("–".into(), |e| e.text(digits))
}

/// fio's columns: IOPS and p99 with their min–max, p50 alone.
const FIO_COLUMNS: [Column; 3] = [
    Column {
        key: "iops",
        header: "IOPS",
        digits: 0,
        range: Some("IOPS min–max"),
    },
    Column {
        key: "p50_us",
        header: "p50 µs",
        digits: 1,
        range: None,
    },
    Column {
        key: "p99_us",
        header: "p99 µs",
        digits: 1,
        range: Some("p99 min–max"),
    },
];

fn fio_table(s: &mut String, r: &BlockResults) {
    *s += "\n### fio: untraced, traced, traced with the accounting, the floor, the peers\n\n";
    let mut rows = Vec::new();
    for d in &r.depths {
        let c = &d.configs;
        let floor = d.floor_bpf_stats.as_ref();
        let rezolus = d.rezolus.as_ref();
        let sides: [(&str, Option<&Side>); 6] = [
            ("untraced", Some(&c.untraced)),
            ("traced", Some(&c.traced)),
            ("traced+bpf-stats", Some(&c.traced_bpf_stats)),
            ("floor+bpf-stats", floor),
            ("bpftrace", Some(&c.peer)),
            ("rezolus", rezolus.map(|z| &z.fio)),
        ];
        for (name, side) in sides {
            let Some(side) = side else { continue };
            rows.push(side_row(format!("{} {name}", d.label), &FIO_COLUMNS, side));
        }
        let ratio_rows: [(&str, Option<&Ratios>); 5] = [
            ("traced", Some(&d.traced_ratio)),
            ("traced+bpf-stats", Some(&c.bpf_stats_ratio)),
            ("floor+bpf-stats", floor.map(|_| &d.floor_ratio)),
            ("bpftrace", Some(&c.peer_ratio)),
            ("rezolus", rezolus.map(|z| &z.ratio)),
        ];
        for (name, ratio) in ratio_rows {
            let Some(ratio) = ratio else { continue };
            let label = format!("{} {name}/untraced, per round", d.label);
            rows.push(ratio_row(label, &FIO_COLUMNS, ratio));
        }
    }
    *s += &table::markdown(&configs::headers(&FIO_COLUMNS), &rows);
    *s += "\nRows \"X/untraced, per round\": each run over the untraced run of the same round, \
           device and depth; median [95% interval] of those ratios, and their min–max.\n";
}

fn programs_table(s: &mut String, r: &BlockResults) {
    *s += "\n### Cost per program (kernel bpf_stats, the traced+bpf-stats runs)\n\n";
    let mut headers = programs::table_headers(r.depths.iter().map(|d| (d.label.clone(), "I/O")));
    headers.push("≤ 150 ns".into());
    let rows: Vec<Vec<String>> = r
        .programs
        .iter()
        .map(|p| {
            let total = &p.total;
            let parts = p
                .by_part
                .by_depth
                .iter()
                .map(|b| (b.ns_per_event, b.events_per_s, b.events_per_io));
            let mut row = programs::table_row(total, p.by_round.as_ref(), parts);
            let target = super::NS_PER_EVENT_TARGET;
            row.push(match (&p.by_round, total.ns_per_event) {
                (None, _) | (_, None) => "never ran".into(),
                (Some(e), _) => match e.ci {
                    Some(c) if c.high <= target => "yes".into(),
                    Some(c) if c.low > target => format!("no (+{:.0})", e.median - target),
                    Some(_) => "straddles".into(),
                    None => "no CI".into(),
                },
            });
            row
        })
        .collect();
    *s += &table::markdown(&headers, &rows);
    let per_io: Vec<String> = r
        .depths
        .iter()
        .map(|d| {
            format!(
                "{:.0} ns at {} (per round {})",
                d.bpf_ns_per_io,
                d.label,
                est(&d.versus_peer.stalltrace_by_round, 0)
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "\n\"ns/event\" is over every traced+bpf-stats run (run time summed over runs summed); \
         \"per round\" takes each round's runs (both depths) alone. All programs together: {} \
         of BPF run time per I/O fio completed; round by round, the floor under it (empty \
         programs on the same hooks) and stalltrace's work over it: {} (see \
         [Floor on this VM](#floor-on-this-vm)).",
        per_io.join(", "),
        floor::per_io_text(r),
    );
}

fn notes(s: &mut String, r: &BlockResults) {
    *s += "\n### Notes\n\n";
    *s += "- ns/event is the kernel's own accounting (`run_time_ns / run_count`), read with \
          `bpftool prog show` before and after each traced+bpf-stats run. With the accounting \
          on, the kernel reads the clock before and after every run of every BPF program on \
          the host and updates a per-CPU counter; those runs pay that on every hook of every \
          I/O, so their IOPS are lower than the traced runs' (the difference between the two \
          rows is roughly what the accounting costs), and only the traced runs, stalltrace as \
          deployed, are held to the IOPS target. In a traced run the programs count no runs; \
          a traced run whose programs did count runs (someone else held bpf_stats on) was run \
          again, up to 3 attempts, and kept with a warning below after that.\n";
    *s += "- fio's latency is submission to reaping, not the device's service time; on a \
          tmpfs-backed loop device most of it is the submission and completion path in a \
          2-CPU VM, which is where the hooks add their cost (see \
          docs/ARCHITECTURE.md, storage timing).\n";
    *s += "- On the disk-backed device each I/O waits for the VM's virtual disk (its \
          host's storage behind it), so the hooks' cost is a smaller share of each I/O than \
          on tmpfs, and its IOPS target is tighter; the host's other I/O (another guest's, \
          the VM's own) moves its figures more, which the per-round pairing is there to \
          absorb.\n";
    *s += "- QD1 on a tmpfs-backed loop device is bimodal on the 2-vCPU VM this bench was \
          written on, traced or not: fio alone gave p50 ≈ 10 µs in some runs and ≈ 40–45 µs \
          in others, seemingly by where the scheduler put fio and the loop worker (pinning \
          fio to one CPU by hand made it mostly ≈ 11 µs). So QD1 per-round ratios spread \
          widely and their intervals are wide; QD16, where the target is set, is steadier.\n";
    *s += "- The daemon's CPU is user + system time of all its threads over fio's run \
          (schedstat, to the ns), in % of one CPU; \"CPU s over its life\" includes loading \
          and verifying the programs, attaching and detaching.\n";
    *s += "- \"others' CPU %\" is the user-space CPU of every other process on the host \
          while fio ran (host user time minus fio's own), in % of one CPU, and \"steal %\" \
          the time the hypervisor ran other guests: where they are high, a neighbour, not \
          stalltrace, moved the figures. Kernel-side noise (someone else's I/O or \
          networking) does not show in them.\n";
    *s += "- events/s and per I/O count every block I/O on the host during the \
          traced+bpf-stats runs (the VM's own disk included), over fio's run time and fio's \
          I/Os in those runs.\n";
    *s += &publish::lost_and_warnings(&r.lost, &r.warnings);
}
