//! The block section of docs/BENCHMARKS.md (also printed to the terminal).

use std::fmt::Write;

use super::results::{BlockResults, Ratios, Side};
use crate::bench::publish::{self, Verdict};
use crate::bench::stats::{Estimate, range};
use crate::bench::tracer::programs;
use crate::bench::{table, unitcost};

pub fn markdown(r: &BlockResults) -> String {
    let mut s = String::new();
    let h = &r.host;
    let st = &r.setup;
    // Writing to a String cannot fail.
    let _ = writeln!(
        s,
        "## block: fio 4k random read on a tmpfs-backed loop device\n\n\
         {}\n\
         - Command: `{}` (this suite took {:.0} s)\n\
         - Device: {} MiB of random data on a private tmpfs, on a loop device with \
         direct I/O {}\n\
         - Workload: `{}`\n\
         - Traced: `{}` (\"traced\", stalltrace as deployed: the IOPS and p99 ratios and \
         the IOPS target use it); \"traced+bpf-stats\": {} (per-program ns/event and events/s \
         come from it; its IOPS are shown but judge nothing); hooks: {}\n\
         - Peer: `bpftrace` running the script shown under Peers (\"bpftrace\"; with \
         the accounting on, \"bpftrace+bpf-stats\")\n\
         - Order: {} rounds of {} s runs at QD16 and QD1; {}. Figures that judge are \
         per-round ratios (each run over the untraced run of the same round and depth) or \
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
        st.fio,
        st.tracer,
        st.tracer_bpf_stats,
        r.hooks.join(", "),
        st.rounds,
        st.runtime_s,
        st.order,
        r.load_average[0],
        r.load_average[1],
    );

    let t = &r.targets;
    s += "### Targets\n\n";
    s += &Verdict::table([
        &t.iops_ratio_qd16,
        &t.iops_ratio_qd1,
        &t.ns_per_io_qd16,
        &t.ns_per_event_per_hook,
        &t.versus_peer_qd16,
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
         daemon; bpftrace). The process's CPU here does not grow with the I/O rate: with \
         `--slow-io-ms 0` the daemon sends no per-I/O record and reads its maps once per \
         interval (a delivered `slow_io` record costs it ~10 µs: see the daemon suite).\n"
    );
    s += &unitcost::markdown(&r.unit_costs);

    s += &r.peer.markdown();

    s += "\n### The daemon itself (traced runs, without the accounting)\n\n";
    let rows: Vec<Vec<String>> = r
        .depths
        .iter()
        .map(|d| {
            let m = &d.daemon;
            vec![
                format!("QD{}", d.iodepth),
                est(&m.cpu_pct_of_one_cpu, 2),
                m.cpu_pct_of_one_cpu
                    .as_ref()
                    .map_or("–".into(), |e| e.range_text(2)),
                format!("{:.1}", m.peak_rss_mib),
            ]
        })
        .collect();
    s += &table::markdown(
        &[
            "depth",
            "CPU % of one CPU while fio ran, median [95% CI]",
            "min–max",
            "peak RSS MiB (VmHWM)",
        ],
        &rows,
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

    let f = &r.floor;
    let _ = writeln!(
        s,
        "\n### Floor on this VM\n\n\
         Measured separately (not by this suite), with a scratch loader on this VM: an empty \
         tp_btf program on block_rq_issue costs ~{:.0} ns/event with bpf_stats on, and one \
         `bpf_ktime_get_ns()` call ~{:.0} ns. ns/event above includes that floor (an empty \
         program already shows it), so the {:.0} ns/hook target leaves ~{:.0} ns for a hook's own work, and ~{:.0} ns for \
         any hook that takes a timestamp ({:.0} − {:.0} floor − {:.0} clock read).",
        f.empty_tp_btf_ns,
        f.ktime_get_ns_call_ns,
        super::NS_PER_EVENT_TARGET,
        super::NS_PER_EVENT_TARGET - f.empty_tp_btf_ns,
        super::NS_PER_EVENT_TARGET - f.empty_tp_btf_ns - f.ktime_get_ns_call_ns,
        super::NS_PER_EVENT_TARGET,
        f.empty_tp_btf_ns,
        f.ktime_get_ns_call_ns,
    );
    notes(&mut s, r);
    s
}

/// "median [low–high]", or "–".
fn est(e: &Option<Estimate>, digits: usize) -> String {
    e.as_ref().map_or("–".into(), |e| e.text(digits))
}

fn fio_table(s: &mut String, r: &BlockResults) {
    *s += "\n### fio: untraced, traced, traced with the accounting, the bpftrace peer\n\n";
    let mut rows = Vec::new();
    for d in &r.depths {
        let sides: [(&str, &Side); 4] = [
            ("untraced", &d.untraced),
            ("traced", &d.traced),
            ("traced+bpf-stats", &d.traced_bpf_stats),
            ("bpftrace", &d.peer),
        ];
        for (name, side) in sides {
            rows.push(vec![
                format!("QD{} {name}", d.iodepth),
                format!("{:.0}", side.iops.median),
                range(&side.iops, 0),
                format!("{:.1}", side.p50_us.median),
                format!("{:.1}", side.p99_us.median),
                range(&side.p99_us, 1),
                format!(
                    "{:.1} ({:.1})",
                    side.others_user_cpu_pct.median, side.others_user_cpu_pct.max
                ),
                format!("{:.1} ({:.1})", side.steal_pct.median, side.steal_pct.max),
            ]);
        }
        let ratio_rows: [(&str, &Ratios); 3] = [
            ("traced", &d.traced_ratio),
            ("traced+bpf-stats", &d.bpf_stats_ratio),
            ("bpftrace", &d.peer_ratio),
        ];
        for (name, ratio) in ratio_rows {
            let span = |e: &Option<Estimate>| e.as_ref().map_or("–".into(), |e| e.range_text(3));
            rows.push(vec![
                format!("QD{} {name}/untraced, per round", d.iodepth),
                est(&ratio.iops, 3),
                span(&ratio.iops),
                ratio
                    .p50_us
                    .as_ref()
                    .map_or("–".into(), |e| format!("{:.3}", e.median)),
                est(&ratio.p99_us, 3),
                span(&ratio.p99_us),
                String::new(),
                String::new(),
            ]);
        }
    }
    *s += &table::markdown(
        &[
            "config",
            "IOPS",
            "IOPS min–max",
            "p50 µs",
            "p99 µs",
            "p99 min–max",
            "others' CPU % (max)",
            "steal % (max)",
        ],
        &rows,
    );
    *s += "\nRows \"X/untraced, per round\": each run over the untraced run of the same round \
           and depth; median [95% interval] of those ratios, and their min–max.\n";
}

fn programs_table(s: &mut String, r: &BlockResults) {
    *s += "\n### Cost per program (kernel bpf_stats, the traced+bpf-stats runs)\n\n";
    let mut headers =
        programs::table_headers(r.depths.iter().map(|d| (format!("QD{}", d.iodepth), "I/O")));
    headers.push("≤ 150 ns".into());
    let rows: Vec<Vec<String>> = r
        .programs
        .iter()
        .map(|p| {
            let total = &p.total;
            let parts = p
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
                "{:.0} ns at QD{} (per round {})",
                d.bpf_ns_per_io,
                d.iodepth,
                est(&d.versus_peer.stalltrace_by_round, 0)
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "\n\"ns/event\" is over every traced+bpf-stats run (run time summed over runs summed); \
         \"per round\" takes each round's runs (both depths) alone. All programs together: {} \
         of BPF run time per I/O fio completed.",
        per_io.join(", ")
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
