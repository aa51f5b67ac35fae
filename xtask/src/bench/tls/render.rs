//! The tls section of docs/BENCHMARKS.md (also printed to the terminal).

use std::fmt::Write;

use super::RUN_COUNT_TOLERANCE;
use super::results::{BioResult, ProgramRow, TlsResults};
use crate::bench::paired::TRACER_BPF_STATS;
use crate::bench::publish;
use crate::bench::quiet::{ATTEMPTS, BUSY_USER_CPU_PCT, QUIET_BUDGET, QUIET_PER_RUN};
use crate::bench::stats::{Estimate, Summary, range};
use crate::bench::table;

fn est(e: &Option<Estimate>, digits: usize) -> String {
    e.as_ref().map_or("–".into(), |e| e.text(digits))
}

/// "median (min–max)".
fn own(s: &Summary, digits: usize) -> String {
    format!("{:.digits$} ({})", s.median, range(s, digits))
}

fn label(b: &BioResult) -> String {
    format!("{} (`{}`)", b.bio.arg(), b.symbol)
}

/// A table with a row per BIO style: its label, then `cells` under `headers`.
fn per_bio(r: &TlsResults, headers: &[&str], cells: impl Fn(&BioResult) -> Vec<String>) -> String {
    let heads: Vec<&str> = std::iter::once("BIO (function)")
        .chain(headers.iter().copied())
        .collect();
    let rows: Vec<Vec<String>> = r
        .bios
        .iter()
        .map(|b| std::iter::once(label(b)).chain(cells(b)).collect())
        .collect();
    table::markdown(&heads, &rows)
}

pub fn markdown(r: &TlsResults) -> String {
    let mut s = String::new();
    // Writing to a String cannot fail.
    let _ = writeln!(
        s,
        "## tls: what the SSL_write uprobes of `--sql-tls` cost the SQL Server worker per send\n\n\
         {}\n\
         - Command: `{}` (this suite took {:.0} s); stalltrace and the simulator built from {}\n\
         - Server: the simulator, one per BIO style, for the whole suite: `{}` (`memory`: each \
         TDS response is one `SSL_write_ex`, then one `write()`; `socket`: one `SSL_write`, \
         which sends inside it)\n\
         - Client: `{}` (TLS for the whole session; `SELECT @@SPID` is answered without storage \
         I/O), one run per BIO style and configuration; every thread of the worker and of the \
         client on CPU {} (as `taskset -c`; the daemon unpinned), as in the net suite: \
         unpinned, whether a response's wake-up crosses CPUs is the scheduler's choice from \
         run to run\n\
         - Configurations: **none** (no stalltrace); **off**: `{}`; **always**: `{}` (the \
         uprobes on `SSL_write` and `SSL_write_ex` of each worker's libssl, scoped to its pid, \
         attached at discovery and for the daemon's whole life: every response traps). Under \
         each daemon each BIO style runs as deployed and once more (\"+bpf-stats\") with {}\n\
         - Order: {} rounds of {} s client runs; each round runs none, off and always (one \
         daemon per configuration and round) in one of the six orders, all six over every six \
         rounds, the BIO styles' order rotating from round to round and which of a daemon's \
         two runs of a style comes first alternating, so drift on the host hits every \
         configuration alike\n\
         - Measured: the worker's CPU time (utime + stime of its pid, every thread, from \
         /proc/PID/stat, in 10 ms ticks) over the client's run, divided by the TLS responses \
         it sent (the client's transactions + 2 per session: the login response and one \
         `SELECT @@SPID` answer), so the uprobe's trap is in it, not only its program. The \
         uprobes' cost per send is **always − off** in the same round; figures are medians \
         over rounds with a 95% interval (see [Method](#method-rounds-intervals-verdicts)); \
         a configuration's own figures are medians with min–max\n\
         - Load average (1/5/15 min) before: {}, after: {}\n",
        r.host.line(),
        r.command,
        r.wall_time_s,
        r.source,
        r.server_command,
        r.client_command,
        super::CPU,
        r.daemon_commands[0],
        r.daemon_commands[1],
        TRACER_BPF_STATS,
        r.rounds,
        r.runtime_s,
        r.load_average_before,
        r.load_average_after,
    );

    s += "### Worker CPU per server send\n\n";
    s += &per_bio(
        r,
        &[
            "none µs",
            "off µs",
            "always µs",
            "always − off µs [95% CI]",
            "% of off [95% CI]",
            "off / none",
            "always / none",
        ],
        |b| {
            vec![
                own(&b.cpu_us.none, 2),
                own(&b.cpu_us.off, 2),
                own(&b.cpu_us.always, 2),
                est(&b.uprobe_us, 2),
                est(&b.uprobe_pct_of_off, 1),
                est(&b.off_over_none, 3),
                est(&b.always_over_none, 3),
            ]
        },
    );
    s += "\n\"always − off\" is the uprobes' cost per send, round by round (the same round's \
          runs as deployed); \"% of off\" is that over the worker's CPU per send under off; \
          \"off / none\" and \"always / none\" are the worker's CPU per send over its CPU \
          per send without stalltrace in the same round (all median [95% interval] over \
          rounds); the three configurations' own columns are median (min–max).\n";
    s += "\nAt R server sends per second the uprobes cost **µs per send × R ÷ 10⁴ % of one \
          core** (10 µs per send at 10 000 sends/s is 10% of a core): a worker's sends are its \
          TDS responses (one per request, more for a result over the packet size).\n";

    s += "\n### Where the uprobes' cost goes (per server send)\n\n";
    s += &per_bio(
        r,
        &[
            "always − off ns",
            "uprobe program ns per call",
            "uprobe programs ns per send",
            "other programs' extra ns per send",
            "outside any program ns per send",
        ],
        |b| {
            vec![
                b.uprobe_us
                    .as_ref()
                    .map_or("–".into(), |e| e.scaled(|x| x * 1e3).text(0)),
                est(&b.uprobe_program_ns_per_call, 0),
                est(&b.uprobe_programs_ns_per_response, 0),
                est(&b.other_programs_extra_ns_per_response, 0),
                est(&b.outside_programs_ns_per_response, 0),
            ]
        },
    );
    s += "\nThe program figures come from the runs with the accounting on (kernel bpf_stats: \
          run time inside the program, per round); \"other programs' extra\" is every other \
          program's run time per send under always minus under off, host-wide (the send hook \
          pairs a watched worker's TLS records with its writes); what is left of always − off is \
          outside any program: the breakpoint trap, the kernel's uprobe dispatch and \
          single-step, and the return to the worker. Each column is its own median over \
          rounds, so the parts need not add up exactly.\n";

    s += "\n### BPF per request, without the uprobes (off)\n\n";
    s += &per_bio(
        r,
        &[
            "every program ns per request",
            "sqlserver socket hooks ns per request",
        ],
        |b| {
            vec![
                est(&b.bpf_ns_per_response_off, 0),
                est(&b.sql_socket_ns_per_response_off, 0),
            ]
        },
    );
    s += "\nEach request is one server send here (`SELECT @@SPID`, one TDS packet). \
          \"sqlserver socket hooks\" are the family's programs on the send, `tcp_probe` \
          (every segment received), `tcp_retransmit_skb` and `inet_sock_set_state`: the SPID \
          from the send and each request's timing from its connection's turns \
          (`sql_requests`), run at both ends of the connection (the client's sends and \
          receipts trigger them too, and leave at the first check). \"Every program\" adds the \
          tcp and netdev families' hooks on the same packets. Host-wide, from the accounting \
          runs (bpf_stats), medians over rounds with a 95% interval. The client sends as fast \
          as it can (thousands of requests a second): the cost per request does not depend on \
          the rate.\n";

    s += "\n### Throughput and the daemon\n\n";
    s += &per_bio(
        r,
        &[
            "tps none",
            "tps off",
            "tps always",
            "tps off / none",
            "tps always / off",
            "p50 µs none / off / always",
            "daemon CPU % off / always",
        ],
        |b| {
            vec![
                own(&b.tps.none, 0),
                own(&b.tps.off, 0),
                own(&b.tps.always, 0),
                est(&b.tps_off_over_none, 3),
                est(&b.tps_always_over_off, 3),
                format!(
                    "{:.0} / {:.0} / {:.0}",
                    b.p50_us.none.median, b.p50_us.off.median, b.p50_us.always.median
                ),
                format!(
                    "{:.2} / {:.2}",
                    b.daemon_cpu_pct_off.median, b.daemon_cpu_pct_always.median
                ),
            ]
        },
    );
    s += "\nThe client and the worker share one CPU and the client sends as fast as it can, \
          so throughput is what that CPU does over the time both ends spend per request: it \
          moves with every µs either side spends, and is shown, but the worker's CPU per send \
          above is the figure.\n";

    s += "\n### BPF programs in the accounting runs\n\n";
    let mut rows = Vec::new();
    for b in &r.bios {
        let row = |config: &str, p: &ProgramRow| {
            vec![
                label(b),
                config.to_string(),
                p.total.name(),
                p.total
                    .ns_per_event
                    .map_or("–".into(), |v| format!("{v:.0}")),
                format!("{:.3}", p.runs_per_response),
                format!(
                    "{:.0}",
                    p.total.ns_per_event.unwrap_or(0.0) * p.runs_per_response
                ),
            ]
        };
        rows.extend(b.programs_off.iter().map(|p| row("off+bpf-stats", p)));
        rows.extend(b.programs_always.iter().map(|p| row("always+bpf-stats", p)));
    }
    s += &table::markdown(
        &[
            "BIO (function)",
            "config",
            "program",
            "ns per run",
            "runs per send",
            "ns per send",
        ],
        &rows,
    );
    s += "\nOver every accounting run of the suite, host-wide: the client's sends run the \
          tcp and sqlserver send hooks too, in the client, so runs per send count both ends; \
          only the uprobe programs run in the worker alone. Programs that never ran are left \
          out.\n";

    notes(&mut s, r);
    s
}

fn notes(s: &mut String, r: &TlsResults) {
    *s += "\n### Checks and notes\n\n";
    let runs_per_response: Vec<String> = r
        .bios
        .iter()
        .map(|b| {
            format!(
                "{} {} per response ({})",
                b.program,
                own(&b.uprobe_runs_per_response, 4),
                b.bio.arg()
            )
        })
        .collect();
    let _ = writeln!(
        s,
        "- Uprobes attached where claimed, checked run by run (a failed check ends the bench \
         and publishes nothing): in all {} runs under always the daemon held a uprobe link on \
         the worker's libssl for each of the two functions before and after the run (its \
         /proc/PID/fdinfo), and in the accounting runs the uprobe programs ran once per \
         response within {:.0}%: {}. In all {} runs under off it held none and they never ran.",
        r.always_runs_checked,
        RUN_COUNT_TOLERANCE * 100.0,
        runs_per_response.join("; "),
        r.off_runs_checked,
    );
    let _ = writeln!(
        s,
        "- Quiet host: before each run the suite waits for no one else's uprobe on a libssl, \
         no other sqlservr, sqlclient, stalltrace, bpftrace, fio, iperf3, sockperf or \
         qemu-system, and under {BUSY_USER_CPU_PCT:.0}% of a CPU of others' user time (up to \
         {} s per run, {} s in all); a run with someone else's uprobe or process around it is \
         run again, up to {ATTEMPTS} attempts, and kept with a warning below after that \
         (in trials, a VM guest busy on the other vCPU made every response cost the worker up \
         to half as much CPU again, on its own CPU, none of it counted as steal). In \
         this run {} attempt(s) were run again{}, the runs waited {:.0} s in all for a quiet \
         host, and steal time was at most {:.1}% in any run.",
        QUIET_PER_RUN.as_secs(),
        QUIET_BUDGET.as_secs(),
        r.disturbed.len(),
        if r.disturbed.is_empty() {
            String::new()
        } else {
            format!(" (first: {})", r.disturbed[0])
        },
        r.quiet_wait_s,
        r.max_steal_pct,
    );
    let _ = writeln!(
        s,
        "- The CPU per send includes everything the worker does for a response: reading and \
         decrypting the request (`SSL_read_ex`), encrypting and sending the response, and \
         waking up; each client run also logs its sessions in (TLS handshakes), a fixed cost \
         spread over the run's responses, the same in every configuration. /proc/PID/stat \
         counts in clock ticks (10 ms), at most {:.2}% of any run's worker CPU, so each \
         reading is that much off at most.",
        r.tick_pct_of_worker_cpu
    );
    s.push_str(
        "- `--sql-tls on-demand` (the default) attaches the same uprobes at a worker's \
         discovery and while it has encrypted sessions without a SPID that keep sending, then \
         detaches them 60 s after the last is identified: while attached it costs what \
         always costs here, per send; detached, what off costs.\n",
    );
    let _ = writeln!(
        s,
        "- The daemon's lifetime CPU (load, verify, attach, discovery, detach): {} s (median, \
         min–max) per daemon.",
        own(&r.daemon_lifetime_cpu_s, 2)
    );
    s.push_str(&publish::lost_and_warnings(&r.lost, &r.warnings));
}
