//! The block section of docs/BENCHMARKS.md (also printed to the terminal).

use std::fmt::Write;

use super::results::{BlockResults, Verdict};
use crate::bench::stats::Summary;
use crate::bench::table;

fn range(s: &Summary, digits: usize) -> String {
    format!("{:.digits$}–{:.digits$}", s.min, s.max)
}

fn yes_no(v: &Verdict) -> &'static str {
    if v.met { "**met**" } else { "**missed**" }
}

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
         - Traced: `{}`; hooks: {}\n\
         - Order: each of {} rounds runs QD16 untraced, QD16 traced, QD1 untraced, QD1 \
         traced, so drift on the host hits both alike; figures are medians over rounds, \
         with min–max\n\
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
        r.load_average[0],
        r.load_average[1],
    );

    let t = &r.targets;
    s += "### Targets\n\n";
    s += &table::markdown(
        &["target", "measured", "verdict", "detail"],
        &[&t.iops_ratio_qd16, &t.ns_per_event_per_hook]
            .iter()
            .map(|v| {
                vec![
                    v.target.clone(),
                    v.measured.clone(),
                    yes_no(v).into(),
                    v.detail.clone(),
                ]
            })
            .collect::<Vec<_>>(),
    );

    s += "\n### fio, untraced vs traced\n\n";
    let mut rows = Vec::new();
    for d in &r.depths {
        for (name, side) in [("untraced", &d.untraced), ("traced", &d.traced)] {
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
        rows.push(vec![
            format!("QD{} traced/untraced", d.iodepth),
            format!("{:.3}", d.iops_ratio),
            String::new(),
            format!("{:.3}", d.traced.p50_us.median / d.untraced.p50_us.median),
            format!("{:.3}", d.p99_ratio),
            String::new(),
            String::new(),
            String::new(),
        ]);
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
            format!(
                "QD{} IOPS {:.3} ({}), p99 {:.3} ({})",
                d.iodepth,
                i.median,
                range(i, 3),
                p.median,
                range(p, 3)
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "\nPer-round ratios (each traced run over the untraced run just before it), \
         median (min–max): {}.",
        paired.join("; ")
    );

    s += "\n### Cost per program (kernel bpf_stats, summed over traced rounds)\n\n";
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
    let opt = |v: Option<f64>| v.map_or("–".to_string(), |v| format!("{v:.0}"));
    let rows: Vec<Vec<String>> = r
        .programs
        .iter()
        .map(|p| {
            let mut row = vec![format!("{}/{}", p.family, p.program), opt(p.ns_per_event)];
            for b in &p.by_depth {
                row.extend([
                    opt(b.ns_per_event),
                    format!("{:.0}", b.events_per_s),
                    format!("{:.2}", b.events_per_io),
                ]);
            }
            row.push(p.recursion_misses.to_string());
            row.push(match p.ns_per_event {
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
        "\nAll programs together: {} of BPF run time per I/O fio completed.",
        per_io.join(", ")
    );

    s += "\n### The daemon itself (traced rounds)\n\n";
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

    s += "\n### Notes\n\n";
    s += "- ns/event is the kernel's own accounting (`run_time_ns / run_count` with \
          bpf_stats on). It times the program body; turning bpf_stats on also adds two \
          clock reads and a counter update to every run (tens of ns) that the traced \
          rounds pay but that ns/event does not show, so the traced IOPS are slightly \
          pessimistic compared with stalltrace running without `--bpf-stats`.\n";
    s += "- fio's latency is submission to reaping, not the device's service time; on a \
          tmpfs-backed loop device most of it is the submission and completion path in a \
          2-CPU VM, which is where the hooks add their cost (see DESIGN.md, storage timing).\n";
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
          (the VM's own disk included), divided by fio's run time and fio's I/Os.\n";
    if !r.lost.is_empty() {
        let lost: Vec<String> = r.lost.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(
            s,
            "- Lost, as reported by the daemon over all traced rounds: {}.",
            lost.join(", ")
        );
    }
    for w in &r.warnings {
        let _ = writeln!(s, "- Warning: {w}.");
    }
    s
}
