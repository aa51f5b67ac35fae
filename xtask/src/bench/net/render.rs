//! The net section of docs/BENCHMARKS.md (also printed to the terminal).

mod floor;

use std::fmt::Write;

use super::results::{NetResults, WorkloadResult};
use super::workload::{Bound, WORKLOADS, Workload};
use crate::bench::configs::{self, Column, ratio_row, side_row};
use crate::bench::publish::{self, Verdict};
use crate::bench::quiet::{BUSY_USER_CPU_PCT, QUIET_BUDGET, QUIET_PER_RUN};
use crate::bench::stats::{Summary, range};
use crate::bench::tracer::programs;
use crate::bench::{parts, table, unitcost};

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
         {}\n\
         - Command: `{}` (this suite took {:.0} s)\n\
         - Network: {}; congestion control `{}` (inherited from the host)\n\
         - SQL Server: an idle simulator worker (`sqlservr`, no session) in the server \
         namespace throughout, as on the hosts this tool is for: each daemon waits for its \
         `sql_instance` record before its first run, so the sqlserver programs check every \
         segment for a worker socket as they do there\n\
         - sockperf: `{}` (against `sockperf server --tcp` in the server namespace)\n\
         - iperf3, unpaced: `{}`\n\
         - iperf3, loss case: `{}`, with {}\n\
         - Traced: `{}` (\"traced\", stalltrace as deployed: the ratios and the targets use it); \
         \"traced+bpf-stats\": {} (per-program ns/event and events/s come from it; its figures \
         are shown but judge nothing); network-path hooks: {}\n\
         - Peer: `bpftrace` running the script shown under Peers (\"bpftrace\"; with the \
         accounting on, \"bpftrace+bpf-stats\")\n\
         {}\
         - Order: {} rounds of {} s runs of sockperf, iperf3 unpaced and iperf3 with loss; {}. \
         Figures that judge are per-round ratios (each run over the untraced run of the same \
         round and workload) or per-round costs, given as median [95% interval] (method: see \
         [Method](#method-rounds-intervals-verdicts)); the configurations' own figures are \
         medians over rounds, with min–max\n\
         - Load average (1/5/15 min) before: {}, after: {}\n",
        h.line(),
        r.command,
        r.wall_time_s,
        st.network,
        st.congestion_control,
        st.sockperf,
        st.iperf3,
        st.iperf3_loss,
        st.loss_rule,
        st.paired.tracer,
        st.paired.tracer_bpf_stats,
        r.hooks.join("; "),
        floor::setup_line(r),
        st.paired.rounds,
        st.paired.runtime_s,
        st.paired.order,
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
             time (kernel bpf_stats, traced+bpf-stats runs; the accounting adds two clock \
             reads per run, so a little high): {}. Against a 2% target.",
            shares.join("; ")
        );
    }

    for wr in &r.workloads {
        workload_table(&mut s, wr);
    }

    programs(&mut s, r);
    unit_costs(&mut s, r);
    floor::section(&mut s, r);
    s += &r.peer.markdown();
    daemon(&mut s, r);
    notes(&mut s, r);
    s
}

fn workload_table(s: &mut String, wr: &WorkloadResult) {
    let _ = writeln!(s, "\n### {}: {}\n", wr.key, wr.title);
    let columns: Vec<Column> = workload(wr.key)
        .figures
        .iter()
        .map(|f| Column {
            key: f.key,
            header: f.header,
            digits: f.digits,
            range: Some("min–max"),
        })
        .collect();
    let c = &wr.configs;
    let sides = [
        ("untraced", &c.untraced),
        ("traced", &c.traced),
        ("traced+bpf-stats", &c.traced_bpf_stats),
        ("bpftrace", &c.peer),
    ];
    let ratios = [
        ("traced", &wr.ratio),
        ("traced+bpf-stats", &c.bpf_stats_ratio),
        ("bpftrace", &c.peer_ratio),
    ];
    let mut rows: Vec<Vec<String>> = sides
        .into_iter()
        .map(|(name, side)| side_row(name.into(), &columns, side))
        .collect();
    rows.extend(
        ratios
            .into_iter()
            .map(|(name, ratio)| ratio_row(format!("{name}/untraced, per round"), &columns, ratio)),
    );
    *s += &table::markdown(&configs::headers(&columns), &rows);
    *s += "\nRows \"X/untraced, per round\": each run over the untraced run of the same round; \
           median [95% interval] of those ratios, and their min–max.\n";
}

fn programs(s: &mut String, r: &NetResults) {
    *s += "\n### Cost per network-path program (kernel bpf_stats, the traced+bpf-stats runs)\n\n";
    let headers = programs::table_headers(
        r.workloads
            .iter()
            .map(|wr| (wr.key.to_string(), workload(wr.key).unit)),
    );
    let rows: Vec<Vec<String>> = r
        .programs
        .iter()
        .map(|p| {
            let parts = p
                .by_part
                .by_workload
                .iter()
                .map(|b| (b.ns_per_event, b.events_per_s, b.events_per_unit));
            programs::table_row(&p.total, p.by_round.as_ref(), parts)
        })
        .collect();
    *s += &table::markdown(&headers, &rows);
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
        "\n\"ns/event\" is over every traced+bpf-stats run (run time summed over runs summed); \
         \"per round\" takes each round's runs (every workload) alone. All network-path programs \
         together, BPF run time in the traced+bpf-stats runs: {}.",
        together.join("; ")
    );
}

fn unit_costs(s: &mut String, r: &NetResults) {
    let others: Vec<String> = r
        .workloads
        .iter()
        .filter_map(|wr| {
            let e = wr.bpf.other_ns_per_segment.as_ref()?;
            Some(format!("{} {} ns", wr.key, e.text(0)))
        })
        .collect();
    let _ = writeln!(
        s,
        "\n### Cost per unit of work\n\n\
         BPF run time per TCP segment, as the kernel counts segments (InSegs and OutSegs of \
         /proc/net/snmp, both namespaces: a TSO or GRO packet counts as the segments it \
         carries): the receive path's programs (tcp_probe, the receive hooks, socket reads) \
         per segment received, the send path's (transmit hooks, socket writes, \
         retransmissions) per segment sent; each round's accounting run, median [95% \
         interval]; the same as a share of one core at 100 000 segments per second (the \
         formula is under [Method](#method-rounds-intervals-verdicts)); and the tool's own \
         process while the client ran, in the runs without the accounting (stalltrace's \
         daemon; bpftrace). The floor rows are empty programs on stalltrace's hooks, each \
         counted on the path of stalltrace's program on its hook (see [Network floor on this \
         VM](#network-floor-on-this-vm)), run in the bench's own process; stalltrace's work over \
         the floor is, round by round, its BPF ns per segment less the floor's of the same \
         round. Programs on neither path (socket state changes, transmit timeouts, \
         BQL stalls) per segment received or sent: {}. The peer's one hook \
         (tcp_retransmit_skb) runs only on retransmissions, so outside the loss case its cost \
         per segment is nothing.\n",
        if others.is_empty() {
            "not measured".to_string()
        } else {
            others.join("; ")
        }
    );
    *s += &unitcost::markdown(&r.unit_costs);
}

/// The hooks against the kernel's own packet counters.
fn cross_check(r: &NetResults) -> String {
    let fmt = |c: Option<Summary>| {
        c.map_or("–".to_string(), |c| {
            format!("{:.3} ({})", c.median, range(&c, 3))
        })
    };
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
    let records = r.daemon_lives.tx_seen_per_counted;
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
         (min–max). (1) Each round's daemon's own `netdev` records for the client's veth, over \
         its life: transmits its hooks sampled (`qdisc_us.count + qdisc_untimed`) over the \
         `tx_packets` it read from netlink over the same intervals (by design about 1/64: one \
         packet in 64 per CPU, and a CPU's first after ~10 ms without a sample): {}. (2) \
         bpf_stats: runs of net_dev_start_xmit over the packets both veth \
         ends sent while the client ran (`ip -s link`; at least 1 when none is missed, as the \
         daemon also sees packets on other interfaces), per traced+bpf-stats run: {}; {}.\n",
        fmt(records),
        stats.join("; "),
        judge(stats_worst, 0.98),
    )
}

fn daemon(s: &mut String, r: &NetResults) {
    *s += &parts::daemon_table(
        "workload",
        "the client",
        r.workloads
            .iter()
            .map(|wr| (wr.key.to_string(), &wr.configs.daemon)),
    );
    let l = &r.daemon_lives;
    let _ = writeln!(
        s,
        "\nEach round's daemon over its life (load, verify, attach, its {} runs, detach), \
         median (min–max): CPU s {:.2} ({}), records written {:.0} ({}), of which \
         `tcp_retransmit` {:.0} ({}).",
        2 * r.workloads.len(),
        l.lifetime_cpu_s.median,
        range(&l.lifetime_cpu_s, 2),
        l.records.median,
        range(&l.records, 0),
        l.tcp_retransmit_records.median,
        range(&l.tcp_retransmit_records, 0),
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
    *s += "- ns/event is the kernel's own accounting (`run_time_ns / run_count`), read with \
           `bpftool prog show` before and after each traced+bpf-stats run; with the accounting \
           on, the kernel reads the clock before and after every run of every BPF program on \
           the host, so those runs are slower than stalltrace as deployed and judge nothing. \
           In a traced run the programs count no runs; a traced run whose programs did \
           (someone else held bpf_stats on) was run again. What a program on those hooks costs at least \
           (empty programs with one clock read, measured in the same rounds) is under \
           [Network floor on this VM](#network-floor-on-this-vm).\n";
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
           runs; the per-round ratios' intervals say how far to trust a ratio, and a target \
           whose interval straddles it is inconclusive. The p99 is noisier still and judges \
           nothing. \"others' CPU %\" is the user-space \
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
    let _ = writeln!(
        s,
        "- Before each run the suite waits for a quiet host: nobody else's network-path BPF \
         links or fio/iperf3/sockperf, and under {BUSY_USER_CPU_PCT:.0}% of a CPU of user time \
         on the host (up to {} s per run and {} s in all, then it measures anyway). A run that \
         had someone else's network hooks or load generators around it is run again, up to 3 \
         attempts, and kept with a warning below after that; a failed run (a server killed by \
         someone else's cleanup) runs its whole block again; CPU load alone only shows in \
         \"others' CPU %\". The suite's wall time includes that waiting.",
        QUIET_PER_RUN.as_secs(),
        QUIET_BUDGET.as_secs()
    );
    *s += &cross_check(r);
    *s += "- The daemon's CPU is user + system time of all its threads while the client ran \
           (schedstat, to the ns), in % of one CPU; \"CPU s\" over a daemon's life includes \
           loading and verifying the programs, attaching and detaching.\n";
    *s += &publish::lost_and_warnings(&r.lost, &r.warnings);
}
