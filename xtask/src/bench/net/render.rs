//! The net section of docs/BENCHMARKS.md (also printed to the terminal).

use std::fmt::Write;

use super::results::{NetResults, Side, WorkloadResult};
use super::workload::{Bound, WORKLOADS, Workload};
use crate::bench::publish::{self, Verdict};
use crate::bench::stats::{Summary, range};
use crate::bench::table;
use crate::bench::tracer::programs;

fn workload(key: &str) -> &'static Workload {
    WORKLOADS
        .iter()
        .find(|w| w.key == key)
        .expect("results are made from WORKLOADS")
}

pub fn markdown(r: &NetResults) -> String {
    let mut s = String::new();
    let h = &r.host;
    let st = &r.setup;
    // Writing to a String cannot fail.
    let _ = writeln!(
        s,
        "## net: sockperf round trip and iperf3 throughput between two network namespaces\n\n\
         - Date: {} · kernel `{}` · CPU: {} ({} CPUs)\n\
         - Command: `{}` (this suite took {:.0} s)\n\
         - Network: {}; congestion control `{}` (inherited from the host)\n\
         - sockperf: `{}` (against `sockperf server --tcp` in the server namespace)\n\
         - iperf3, unpaced: `{}`\n\
         - iperf3, loss case: `{}`, with {}\n\
         - Traced: `{}` (\"traced\", stalltrace as deployed: the ratios and the targets use it); \
         the same with `--bpf-stats` (\"traced+bpf-stats\": per-program ns/event and events/s \
         come from it; its figures are shown but judge nothing); network-path hooks: {}\n\
         - Peer: `bpftrace` running the script shown under Peers (\"bpftrace\"; with bpf_stats \
         on, \"bpftrace+bpf-stats\")\n\
         - Order: each of {} rounds runs sockperf, then iperf3 unpaced, then iperf3 with loss, \
         each untraced, traced, traced+bpf-stats, bpftrace, bpftrace+bpf-stats in turn (the \
         two bpf-stats configurations in the first {} rounds only), so drift on the host hits \
         them alike; {} s per run; figures are medians over rounds, with min–max\n\
         - Load average (1/5/15 min) before: {}, after: {}\n",
        h.date,
        h.kernel,
        h.cpu_model,
        h.cpus,
        r.command,
        r.wall_time_s,
        st.network,
        st.congestion_control,
        st.sockperf,
        st.iperf3,
        st.iperf3_loss,
        st.loss_rule,
        st.tracer,
        r.hooks.join("; "),
        st.rounds,
        r.peer.bpf_stats_rounds,
        st.runtime_s,
        r.load_average[0],
        r.load_average[1],
    );

    s += "### Targets (round-trip p50 and throughput within 2% of no tracer; a third of the \
          peer's cost)\n\n";
    s += &Verdict::table(&r.targets);

    let shares: Vec<String> = r
        .workloads
        .iter()
        .filter_map(|wr| {
            let share = 100.0 * wr.bpf.share_of_bound?;
            Some(match workload(wr.key).bound {
                Bound::RoundTrip => format!(
                    "{}: {:.2} µs of BPF run time per round trip, {share:.1}% of the untraced \
                     p50 round trip",
                    wr.key,
                    wr.bpf.ns_per_unit / 1000.0
                ),
                _ => format!(
                    "{}: BPF run time {share:.1}% of the one CPU it keeps busy, so about as \
                     much of its throughput",
                    wr.key
                ),
            })
        })
        .collect();
    if !shares.is_empty() {
        let _ = writeln!(
            s,
            "\nThe same question answered without run-to-run noise, from the hooks' own run \
             time (kernel bpf_stats, traced+bpf-stats rounds; the accounting adds two clock \
             reads per run, so a little high): {}. Against a 2% target.",
            shares.join("; ")
        );
    }

    for wr in &r.workloads {
        workload_table(&mut s, wr);
    }

    programs(&mut s, r);
    let per_unit: Vec<(String, String, f64, f64)> = r
        .workloads
        .iter()
        .map(|wr| {
            let c = &wr.versus_peer;
            (
                wr.key.to_string(),
                c.unit.clone(),
                c.stalltrace_ns_per_unit,
                c.peer_ns_per_unit,
            )
        })
        .collect();
    s += &r.peer.markdown(&per_unit);
    daemon(&mut s, r);
    notes(&mut s, r);
    s
}

fn workload_table(s: &mut String, wr: &WorkloadResult) {
    let w = workload(wr.key);
    let _ = writeln!(s, "\n### {}: {}\n", wr.key, wr.title);
    let mut headers: Vec<String> = vec!["config".into()];
    for f in w.figures {
        headers.push(f.header.into());
        headers.push("min–max".into());
    }
    headers.extend(["others' CPU % (max)".into(), "steal % (max)".into()]);
    let mut rows = Vec::new();
    let sides: [(&str, &Side); 4] = [
        ("untraced", &wr.untraced),
        ("traced", &wr.traced),
        ("traced+bpf-stats", &wr.traced_bpf_stats),
        ("bpftrace", &wr.peer),
    ];
    for (name, side) in sides {
        let mut row = vec![name.to_string()];
        for f in w.figures {
            match side.figures.get(f.key) {
                Some(v) => row.extend([format!("{:.*}", f.digits, v.median), range(v, f.digits)]),
                None => row.extend(["–".into(), "–".into()]),
            }
        }
        row.push(format!(
            "{:.1} ({:.1})",
            side.others_user_cpu_pct.median, side.others_user_cpu_pct.max
        ));
        row.push(format!(
            "{:.1} ({:.1})",
            side.steal_pct.median, side.steal_pct.max
        ));
        rows.push(row);
    }
    for (name, ratios) in [
        ("traced/untraced", &wr.ratio),
        ("traced+bpf-stats/untraced", &wr.bpf_stats_ratio),
        ("bpftrace/untraced", &wr.peer_ratio),
    ] {
        let mut row = vec![name.to_string()];
        for f in w.figures {
            row.push(ratios.get(f.key).map_or("–".into(), |r| format!("{r:.3}")));
            row.push(String::new());
        }
        row.extend([String::new(), String::new()]);
        rows.push(row);
    }
    let refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    *s += &table::markdown(&refs, &rows);
    let (p, b, pe) = (
        &wr.paired_ratio,
        &wr.paired_bpf_stats_ratio,
        &wr.paired_peer_ratio,
    );
    let _ = writeln!(
        s,
        "\nPer-round ratios of {} (each run over the untraced run of the same round), median \
         (min–max): traced {:.3} ({}), traced+bpf-stats {:.3} ({}), bpftrace {:.3} ({}).",
        w.figures[0].header,
        p.median,
        range(p, 3),
        b.median,
        range(b, 3),
        pe.median,
        range(pe, 3)
    );
}

fn programs(s: &mut String, r: &NetResults) {
    *s += "\n### Cost per network-path program (kernel bpf_stats, summed over the traced+bpf-stats rounds)\n\n";
    let mut headers = vec!["program".to_string(), "ns/event".into()];
    for wr in &r.workloads {
        let w = workload(wr.key);
        headers.extend([
            format!("ns/event {}", wr.key),
            format!("events/s {}", wr.key),
            format!("per {} {}", w.unit, wr.key),
        ]);
    }
    headers.push("recursion misses".into());
    let rows: Vec<Vec<String>> = r
        .programs
        .iter()
        .map(|p| {
            let parts = p
                .by_workload
                .iter()
                .map(|b| (b.ns_per_event, b.events_per_s, b.events_per_unit));
            programs::table_row(&p.total, parts)
        })
        .collect();
    let refs: Vec<&str> = headers.iter().map(String::as_str).collect();
    *s += &table::markdown(&refs, &rows);
    let together: Vec<String> = r
        .workloads
        .iter()
        .map(|wr| {
            format!(
                "{}: {:.0} ns per {} ({:.2}% of one CPU)",
                wr.key, wr.bpf.ns_per_unit, wr.bpf.unit, wr.bpf.cpu_pct_of_one_cpu
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "\nAll network-path programs together, BPF run time in the traced+bpf-stats rounds: {}.",
        together.join("; ")
    );
}

/// The hooks against the kernel's own packet counters.
fn cross_check(r: &NetResults) -> String {
    let fmt = |c: Option<Summary>| {
        c.map_or("–".to_string(), |c| {
            format!("{:.3} ({})", c.median, range(&c, 3))
        })
    };
    let records: Vec<String> = r
        .workloads
        .iter()
        .map(|wr| {
            let c = &wr.tx_seen_per_counted;
            format!(
                "{} traced {}, traced+bpf-stats {}",
                wr.key,
                fmt(c.traced),
                fmt(c.traced_bpf_stats)
            )
        })
        .collect();
    let stats: Vec<String> = r
        .workloads
        .iter()
        .map(|wr| format!("{} {}", wr.key, fmt(wr.xmit_runs_per_veth_packet)))
        .collect();
    let worst = |c: &[Option<Summary>]| {
        c.iter()
            .flatten()
            .map(|s| s.min)
            .fold(f64::INFINITY, f64::min)
    };
    let records_worst = worst(
        &r.workloads
            .iter()
            .flat_map(|wr| {
                [
                    wr.tx_seen_per_counted.traced,
                    wr.tx_seen_per_counted.traced_bpf_stats,
                ]
            })
            .collect::<Vec<_>>(),
    );
    let stats_worst = worst(
        &r.workloads
            .iter()
            .map(|wr| wr.xmit_runs_per_veth_packet)
            .collect::<Vec<_>>(),
    );
    let judge = |w: f64, low: f64| {
        if w.is_infinite() {
            "not measured".to_string()
        } else if w >= low {
            "none missed".to_string()
        } else {
            format!("**some runs missed transmits: lowest {w:.3}**")
        }
    };
    format!(
        "- Cross-checks of the hooks against the kernel's own packet counters, median \
         (min–max) over runs. (1) The daemon's own `netdev` records for the client's veth: \
         transmits its hooks saw (`qdisc_us.count + qdisc_untimed`) over the `tx_packets` it \
         read from netlink over the same intervals (1.000 when no transmit is missed): {}; {}. \
         (2) bpf_stats: runs of net_dev_start_xmit over the packets both veth ends sent while \
         the client ran (`ip -s link`; at least 1 when none is missed, as the daemon also \
         sees packets around the client's window and on other interfaces): {}; {}.\n",
        records.join("; "),
        judge(records_worst, 0.99),
        stats.join("; "),
        judge(stats_worst, 0.98),
    )
}

fn daemon(s: &mut String, r: &NetResults) {
    *s += "\n### The daemon itself (traced rounds, without --bpf-stats)\n\n";
    let rows: Vec<Vec<String>> = r
        .workloads
        .iter()
        .map(|wr| {
            let d = &wr.daemon;
            vec![
                wr.key.to_string(),
                format!("{:.2}", d.cpu_pct_of_one_cpu.median),
                range(&d.cpu_pct_of_one_cpu, 2),
                format!("{:.2}", d.lifetime_cpu_s.median),
                format!("{:.1}", d.peak_rss_mib.max),
                format!("{:.0}", d.records.median),
                format!("{:.0}", d.tcp_retransmit_records.median),
            ]
        })
        .collect();
    *s += &table::markdown(
        &[
            "workload",
            "CPU % of one CPU while the client ran",
            "min–max",
            "CPU s over its life",
            "peak RSS MiB (VmHWM)",
            "records per run",
            "tcp_retransmit records per run",
        ],
        &rows,
    );
}

fn notes(s: &mut String, r: &NetResults) {
    *s += "\n### Notes\n\n";
    *s += "- The peer does one job, retransmissions, on one hook; without loss that hook never \
           fires, so it costs sockperf and unpaced iperf3 nothing, while stalltrace's \
           per-packet hooks (transmit timing, RTT histograms, socket owners) run on every \
           packet. The peer target is therefore judged on the loss case only, where both do \
           the job; its detail also compares the one hook both attach to, per event. The \
           peer prints every event through bpftrace's perf-event output (with a timestamp), \
           which is most of its cost per event; stalltrace writes a fixed record to a ring \
           buffer and formats it in user space.\n";
    *s += "- ns/event is the kernel's own accounting (`run_time_ns / run_count`), from the \
           traced+bpf-stats rounds only; with bpf_stats on, the kernel reads the clock before \
           and after every run of every BPF program on the host, so those rounds are slower \
           than stalltrace as deployed and judge nothing. Without `--bpf-stats` the programs \
           count no runs; a traced run whose programs did (someone else held bpf_stats on) \
           was run again. The floor measured by hand on this VM for the block suite (an empty \
           tp_btf program ~60 ns/event with bpf_stats on, one `bpf_ktime_get_ns()` ~60 ns) \
           applies here too.\n";
    *s += "- events/s and events per transaction count every event on the host while the \
           daemon ran (both namespaces, both directions, and anyone else's traffic), over the \
           client's run time and the transactions its tool reported (sockperf: round trips \
           of the whole run, warm-up included; iperf3: MB received). `--netns` makes the tcp \
           programs skip other namespaces' sockets in the kernel (after reading the socket's \
           tuple, so they still run); the netdev programs have no in-kernel filter and run \
           for every packet of every interface. \"Network-path programs\" are those of every \
           family but block; the daemon also attaches its block hooks (there is no switch to \
           leave a family out), which run only for the VM's own disk I/O and are left out of \
           these tables.\n";
    *s += "- Noise on this VM: 2 vCPUs shared by the workload, the daemon and whatever else \
           runs on the host, and a hypervisor that steals time (steal % above). Every client \
           and server is pinned to one CPU: unpinned, the scheduler's placement decided the \
           figures (sockperf p50 ~17 µs with both ends on one CPU, 60–90 µs across the two, \
           a cross-CPU wake-up in a VM being an IPI and an exit from idle), switching from \
           run to run. Pinned, sockperf's p50 is mostly the sleep/wake-up path on one CPU, \
           so 2% of it is a fraction of a µs, well inside what moves between two untraced \
           runs; the min–max columns and the per-round ratios say how far to trust a ratio. \
           The p99 is noisier still and judges nothing. \"others' CPU %\" is the user-space \
           CPU of every other process on the host while the client ran (host user time minus \
           the client's, the servers' and the daemon's): where it is high, a neighbour, not \
           stalltrace, moved the figures; kernel-side noise (someone else's networking or \
           I/O, interrupts) does not show in it.\n";
    *s += "- Unpaced iperf3 over veth is CPU-bound: sender, receiver and both softirq paths \
           run on the one pinned CPU, so every ns the hooks take comes straight out of \
           throughput; it is the worst case for the tracer. Its retransmitted segments are \
           what it counted without any injected loss.\n";
    *s += "- The loss case drops *skbs* at the receiver's input hook; with veth's TSO/GSO on, \
           one skb is many segments, so retransmitted segments exceed dropped skbs many times \
           over. Its throughput is what the congestion control (here the host's default) \
           makes of 2% loss under a 500 Mbit/s pace; it is where `tcp_retransmit_skb` fires \
           and the daemon writes `tcp_retransmit` records.\n";
    *s += "- Before each run the suite waits for a quiet host: nobody else's network-path \
           BPF links or fio/iperf3/sockperf, and under 25% of a CPU of other processes' user \
           time (up to 1 minute per run and 3 minutes in all, then it measures anyway). A run \
           that had someone else's network hooks or load generators around it is run again, \
           up to 3 attempts, and kept with a warning below after that; CPU load alone only \
           shows in \"others' CPU %\". The suite's wall time includes that waiting.\n";
    *s += &cross_check(r);
    *s += "- \"CPU s over its life\" includes loading and verifying the programs, attaching and \
           detaching; the percentage is the steady state while the client ran.\n";
    *s += &publish::lost_and_warnings(&r.lost, &r.warnings);
}
