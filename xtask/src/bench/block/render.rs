//! The block section of docs/BENCHMARKS.md (also printed to the terminal).

use std::fmt::Write;

use super::results::BlockResults;
use crate::bench::publish::{self, Verdict};
use crate::bench::stats::range;
use crate::bench::table;
use crate::bench::tracer::programs;

pub fn markdown(r: &BlockResults) -> String {
    let mut s = String::new();
    let h = &r.host;
    let st = &r.setup;
    // Writing to a String cannot fail.
    let _ = writeln!(
        s,
        "## block: fio 4k random read on a tmpfs-backed loop device\n\n\
         - Date: {} · kernel `{}` · CPU: {} ({} CPUs)\n\
         - Command: `{}` (this suite took {:.0} s)\n\
         - Device: {} MiB of random data on a private tmpfs, on a loop device with \
         direct I/O {}\n\
         - Workload: `{}`\n\
         - Traced: `{}` (\"traced\", stalltrace as deployed: the IOPS and p99 ratios and \
         the IOPS target use it); the same with `--bpf-stats` (\"traced+bpf-stats\": \
         per-program ns/event and events/s come from it; its IOPS are shown but judge \
         nothing); hooks: {}\n\
         - Peer: `bpftrace` running the script shown under Peers (\"bpftrace\"; with \
         bpf_stats on, \"bpftrace+bpf-stats\")\n\
         - Order: each of {} rounds runs, at QD16 then at QD1: untraced, traced, \
         traced+bpf-stats, bpftrace, bpftrace+bpf-stats (the two bpf-stats configurations \
         in the first {} rounds only), so drift on the host hits them alike; figures are \
         medians over rounds, with min–max\n\
         - Load average (1/5/15 min) before: {}, after: {}\n",
        h.date,
        h.kernel,
        h.cpu_model,
        h.cpus,
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
        r.hooks.join(", "),
        st.rounds,
        r.peer.bpf_stats_rounds,
        r.load_average[0],
        r.load_average[1],
    );

    let t = &r.targets;
    s += "### Targets\n\n";
    s += &Verdict::table([
        &t.iops_ratio_qd16,
        &t.ns_per_event_per_hook,
        &t.versus_peer_qd16,
    ]);

    s += "\n### fio: untraced, traced, traced with --bpf-stats, the bpftrace peer\n\n";
    let mut rows = Vec::new();
    for d in &r.depths {
        for (name, side) in [
            ("untraced", &d.untraced),
            ("traced", &d.traced),
            ("traced+bpf-stats", &d.traced_bpf_stats),
            ("bpftrace", &d.peer),
        ] {
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
        for (name, side, iops, p99) in [
            ("traced", &d.traced, d.iops_ratio, d.p99_ratio),
            (
                "traced+bpf-stats",
                &d.traced_bpf_stats,
                d.bpf_stats_iops_ratio,
                d.bpf_stats_p99_ratio,
            ),
            ("bpftrace", &d.peer, d.peer_iops_ratio, d.peer_p99_ratio),
        ] {
            rows.push(vec![
                format!("QD{} {name}/untraced", d.iodepth),
                format!("{iops:.3}"),
                String::new(),
                format!("{:.3}", side.p50_us.median / d.untraced.p50_us.median),
                format!("{p99:.3}"),
                String::new(),
                String::new(),
                String::new(),
            ]);
        }
    }
    s += &table::markdown(
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
    let paired: Vec<String> = r
        .depths
        .iter()
        .map(|d| {
            let (i, p) = (&d.paired_iops_ratio, &d.paired_p99_ratio);
            let b = &d.paired_bpf_stats_iops_ratio;
            let pe = &d.paired_peer_iops_ratio;
            format!(
                "QD{} traced IOPS {:.3} ({}), p99 {:.3} ({}), traced+bpf-stats IOPS {:.3} ({}), \
                 bpftrace IOPS {:.3} ({})",
                d.iodepth,
                i.median,
                range(i, 3),
                p.median,
                range(p, 3),
                b.median,
                range(b, 3),
                pe.median,
                range(pe, 3)
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "\nPer-round ratios (each traced run over the untraced run of the same round and \
         depth), median (min–max): {}.",
        paired.join("; ")
    );

    s += "\n### Cost per program (kernel bpf_stats, summed over the traced+bpf-stats rounds)\n\n";
    let mut headers = vec!["program".to_string(), "ns/event".into()];
    for d in &r.depths {
        let q = d.iodepth;
        headers.extend([
            format!("ns/event QD{q}"),
            format!("events/s QD{q}"),
            format!("per I/O QD{q}"),
        ]);
    }
    headers.extend(["recursion misses".into(), "≤ 150 ns".into()]);
    let rows: Vec<Vec<String>> = r
        .programs
        .iter()
        .map(|p| {
            let total = &p.total;
            let parts = p
                .by_depth
                .iter()
                .map(|b| (b.ns_per_event, b.events_per_s, b.events_per_io));
            let mut row = programs::table_row(total, parts);
            row.push(match total.ns_per_event {
                None => "never ran".into(),
                Some(ns) if ns <= super::NS_PER_EVENT_TARGET => "yes".into(),
                Some(ns) => format!("no (+{:.0})", ns - super::NS_PER_EVENT_TARGET),
            });
            row
        })
        .collect();
    let header_refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    s += &table::markdown(&header_refs, &rows);
    let per_io: Vec<String> = r
        .depths
        .iter()
        .map(|d| format!("{:.0} ns at QD{}", d.bpf_ns_per_io, d.iodepth))
        .collect();
    let _ = writeln!(
        s,
        "\nAll programs together: {} of BPF run time per I/O fio completed \
         (traced+bpf-stats rounds).",
        per_io.join(", ")
    );

    let per_unit: Vec<(String, String, f64, f64)> = r
        .depths
        .iter()
        .map(|d| {
            (
                format!("fio QD{}", d.iodepth),
                "I/O".to_string(),
                d.bpf_ns_per_io,
                d.peer_ns_per_io,
            )
        })
        .collect();
    s += &r.peer.markdown(&per_unit);

    s += "\n### The daemon itself (traced rounds, without --bpf-stats)\n\n";
    let rows: Vec<Vec<String>> = r
        .depths
        .iter()
        .map(|d| {
            let m = &d.daemon;
            vec![
                format!("QD{}", d.iodepth),
                format!("{:.2}", m.cpu_pct_of_one_cpu.median),
                range(&m.cpu_pct_of_one_cpu, 2),
                format!("{:.2}", m.lifetime_cpu_s.median),
                format!("{:.1}", m.peak_rss_mib.max),
            ]
        })
        .collect();
    s += &table::markdown(
        &[
            "depth",
            "CPU % of one CPU while fio ran",
            "min–max",
            "CPU s over its life",
            "peak RSS MiB (VmHWM)",
        ],
        &rows,
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

    s += "\n### Notes\n\n";
    s += "- ns/event is the kernel's own accounting (`run_time_ns / run_count`), from the \
          traced+bpf-stats rounds only (run in the first rounds only: they are sums of \
          kernel counters, steady from round to round). With bpf_stats on, the kernel reads the clock \
          before and after every run of every BPF program on the host and updates a \
          per-CPU counter; the traced+bpf-stats rounds pay that on every hook of every \
          I/O, so their IOPS are lower than the traced rounds' (the difference between \
          the two rows is roughly what the accounting costs), and only the traced rounds, \
          stalltrace as deployed, are held to the IOPS target. Without `--bpf-stats` the \
          programs count no runs (`run_count` 0 in the stop record), as expected; a \
          traced run whose programs did count runs (someone else held bpf_stats on) was \
          run again, up to 3 attempts, and kept with a warning below after that.\n";
    s += "- fio's latency is submission to reaping, not the device's service time; on a \
          tmpfs-backed loop device most of it is the submission and completion path in a \
          2-CPU VM, which is where the hooks add their cost (see \
          docs/ARCHITECTURE.md, storage timing).\n";
    s += "- QD1 on a tmpfs-backed loop device is bimodal on the 2-vCPU VM this bench was \
          written on, traced or not: fio alone gave p50 ≈ 10 µs in some runs and ≈ 40–45 µs \
          in others, seemingly by where the scheduler put fio and the loop worker (pinning \
          fio to one CPU by hand made it mostly ≈ 11 µs). So QD1 medians and ratios swing \
          between rounds and runs; QD16, where the target is set, is steadier.\n";
    s += "- \"CPU s over its life\" includes loading and verifying the programs, attaching \
          and detaching; the percentage is the steady state between the start record and \
          SIGINT.\n";
    s += "- \"others' CPU %\" is the user-space CPU of every other process on the host \
          while fio ran (host user time minus fio's own), in % of one CPU, and \"steal %\" \
          the time the hypervisor ran other guests: where they are high, a neighbour, not \
          stalltrace, moved the figures. Kernel-side noise (someone else's I/O or \
          networking) does not show in them.\n";
    s += "- events/s and per I/O count every block I/O on the host while the daemon ran \
          (the VM's own disk included) in the traced+bpf-stats rounds, divided by fio's \
          run time and fio's I/Os in those rounds.\n";
    s += &publish::lost_and_warnings(&r.lost, &r.warnings);
    s
}
