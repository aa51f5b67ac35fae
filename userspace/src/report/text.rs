//! The terminal report: what an SRE reads first (the run, whether anything was
//! lost, the stall episodes ranked by impact and the sessions they hit), then
//! the evidence per disk and interface as bar charts, TCP peers, bulk flows.
//!
//! Plain UTF-8, no colours: it is as often read in a pager, a ticket or a
//! chat as in a terminal. Every string from the stream passes through
//! [`clean`]: process names and paths come from the traced host and could
//! carry terminal escape sequences.

use std::fmt::Write as _;

use super::bars;
use super::episodes::{Episode, EpisodeState, cause_words};
use super::merge::MergedHist;
use super::model::Report;
use super::network::{BulkFlow, Interface, TcpPeer};
use super::sessions::{SessionImpact, SqlTag};
use super::storage::{Disk, DiskOp};
use super::time::{bytes, clock, duration_ms, full, latency_us, sig3, thousands};

/// Rows of the long tables before "and N more".
const TOP_ROWS: usize = 12;

/// The report as text, laid out for `width` columns (at least 60).
pub fn render_text(report: &Report, width: usize) -> String {
    let width = width.clamp(60, 400);
    let mut o = String::new();
    header(&mut o, report, width);
    episodes(&mut o, report, width);
    sessions(&mut o, report, width);
    storage(&mut o, report, width);
    interfaces(&mut o, report, width);
    peers(&mut o, report, width);
    flows(&mut o, report, width);
    o.push('\n');
    o.push_str(&wrap(
        "Histogram rows group the log-linear buckets into readable ranges; percentiles are nearest rank, reported as bucket midpoints (within 3.2% of the true value); max is the top bucket's upper edge.",
        width,
        "",
        "",
    ));
    o
}

/// Control characters (terminal escapes among them) from the host become `?`.
pub fn clean(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

fn section(o: &mut String, title: &str, width: usize) {
    let head = format!("\n── {title} ");
    let rule = width.saturating_sub(head.chars().count() - 1);
    let _ = writeln!(o, "{head}{}", "─".repeat(rule));
}

/// Word-wrap `text` to `width`, the first line after `first`, the rest after `rest`.
fn wrap(text: &str, width: usize, first: &str, rest: &str) -> String {
    let mut out = String::new();
    let mut line = first.to_string();
    let mut empty = true;
    for word in text.split_whitespace() {
        let len = line.chars().count() + word.chars().count() + usize::from(!empty);
        if !empty && len > width {
            out.push_str(line.trim_end());
            out.push('\n');
            line = rest.to_string();
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    out.push_str(line.trim_end());
    out.push('\n');
    out
}

/// Columns padded to their widest cell; `right[i]` right-aligns column i.
fn table(rows: &[Vec<String>], right: &[bool], indent: usize) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = " ".repeat(indent);
        for (c, cell) in r.iter().enumerate() {
            let pad = widths[c].saturating_sub(cell.chars().count());
            if right.get(c).copied().unwrap_or(false) {
                line.push_str(&" ".repeat(pad));
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(pad));
            }
            line.push_str("  ");
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn opt_latency(v: Option<f64>) -> String {
    v.map(latency_us).unwrap_or_else(|| "-".into())
}

/// `p50 250 µs, p90 1.67 ms, p99 3.47 ms, max 11 ms`
fn percentiles(h: &MergedHist) -> String {
    format!(
        "p50 {}, p90 {}, p99 {}, max {}",
        opt_latency(h.percentile(0.5)),
        opt_latency(h.percentile(0.9)),
        opt_latency(h.percentile(0.99)),
        opt_latency(h.max()),
    )
}

// ---- header ---------------------------------------------------------------

fn header(o: &mut String, report: &Report, width: usize) {
    let run = &report.run;
    let what = if run.inferred {
        clean(&run.identity())
    } else {
        format!(
            "kernel {} — stalltrace {}, schema {}",
            clean(&run.kernel),
            clean(&run.version),
            run.schema
        )
    };
    o.push_str(&wrap(
        &format!("stalltrace report — host {} — {what}", clean(&run.host)),
        width,
        "",
        "  ",
    ));
    let ended = match &run.stop_reason {
        Some(r) => format!("ended by {}", clean(r)),
        None => "no stop record".into(),
    };
    o.push_str(&wrap(
        &format!(
            "{} to {} ({}; {}; {ended})",
            full(run.start_us),
            clock(run.end_us),
            duration_ms(run.window_ms()),
            run.intervals_words(),
        ),
        width,
        "window     ",
        "           ",
    ));
    let families: Vec<String> = run
        .families
        .iter()
        .map(|f| match (f.attached, &f.mode) {
            (true, Some(m)) => format!("{} ({})", clean(&f.family), clean(m)),
            (true, None) => clean(&f.family),
            (false, _) => format!("{} NOT ATTACHED", clean(&f.family)),
        })
        .collect();
    let attached = match run.families_note() {
        None => families.join(", "),
        Some(note) if families.is_empty() => note.to_string(),
        Some(note) => format!("{} ({note})", families.join(", ")),
    };
    o.push_str(&wrap(&attached, width, "attached   ", "           "));
    for f in run.families.iter().filter(|f| f.note.is_some()) {
        let what = if f.attached {
            "fell back to raw_tp"
        } else {
            "not attached"
        };
        o.push_str(&wrap(
            &format!(
                "{} {what}: {}",
                clean(&f.family),
                clean(f.note.as_deref().unwrap_or(""))
            ),
            width,
            "           ",
            "             ",
        ));
    }
    for hook in &run.missing_hooks {
        o.push_str(&wrap(
            &format!("optional hook missing: {}", clean(hook)),
            width,
            "           ",
            "             ",
        ));
    }
    if run.inferred {
        let _ = writeln!(o, "limited to unknown (no `start` record)");
    } else if !run.filters.is_empty() {
        let _ = writeln!(o, "limited to {}", clean(&run.filters.join("; ")));
    }
    if report.losses.any() {
        let parts: Vec<String> = report
            .losses
            .by_source
            .iter()
            .map(|(s, n)| format!("{} {}", clean(s), thousands(*n)))
            .collect();
        o.push_str(&wrap(
            &format!(
                "!! LOST {} events or measurements (in {} intervals): counts, histograms and event lists below are incomplete. {}",
                thousands(report.losses.total()),
                report.losses.intervals,
                parts.join(", ")
            ),
            width,
            "losses     ",
            "           ",
        ));
    } else {
        let _ = writeln!(
            o,
            "losses     none: every event and measurement was delivered"
        );
    }
    if let Some(files) = report.stream.files_summary() {
        o.push_str(&wrap(&clean(&files), width, "files      ", "           "));
    }
    let warnings = report.stream.warnings(run);
    if warnings.is_empty() {
        let _ = writeln!(
            o,
            "stream     complete: start to stop, every record the run wrote"
        );
    } else {
        for (i, w) in warnings.iter().enumerate() {
            let first = if i == 0 {
                "stream     !! "
            } else {
                "           !! "
            };
            o.push_str(&wrap(&clean(w), width, first, "              "));
        }
    }
    if !report.stream.unknown_types.is_empty() {
        let kinds: Vec<String> = report
            .stream
            .unknown_types
            .iter()
            .map(|(k, n)| format!("{} ({n})", clean(k)))
            .collect();
        o.push_str(&wrap(
            &format!(
                "record types this version does not know, ignored: {}",
                kinds.join(", ")
            ),
            width,
            "           ",
            "             ",
        ));
    }
    for inst in &report.instances {
        let mut s = format!("sqlservr pid {}", inst.pid);
        if let Some(w) = inst.watchdog_pid {
            let _ = write!(s, " (watchdog {w})");
        }
        let ports = |p: &[u64]| p.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        if !inst.tds_ports.is_empty() {
            let _ = write!(s, ", TDS port {}", ports(&inst.tds_ports));
        }
        if !inst.ag_ports.is_empty() {
            let _ = write!(s, ", endpoint port {}", ports(&inst.ag_ports));
        }
        let _ = write!(s, ", {} client sessions seen", inst.sessions_seen);
        if !inst.disk_roles.is_empty() {
            let roles: Vec<String> = inst
                .disk_roles
                .iter()
                .map(|(d, r)| format!("{} {}", clean(d), clean(r)))
                .collect();
            let _ = write!(s, "; disks {}", roles.join(", "));
        }
        let slow: u64 = inst.slow_ios_by_file.values().sum();
        if slow > 0 {
            let _ = write!(s, "; {slow} slow I/Os of its own");
        }
        o.push_str(&wrap(&s, width, "sql server ", "           "));
    }
}

// ---- episodes ---------------------------------------------------------------

fn episodes(o: &mut String, report: &Report, width: usize) {
    if report.episodes.is_empty() {
        section(o, "STALL EPISODES", width);
        let _ = writeln!(o, "No stalls: no stall episode in this recording.");
        at_a_glance(o, report, width);
        return;
    }
    let n = report.episodes.len();
    section(o, &format!("STALL EPISODES ({n}, ranked by impact)"), width);
    for (rank, e) in report.episodes.iter().enumerate() {
        episode(o, rank + 1, e, width);
    }
}

/// The clean case still says where things stood: the worst tail per path.
fn at_a_glance(o: &mut String, report: &Report, width: usize) {
    let mut lines = Vec::new();
    if let Some((d, op)) = report
        .disks
        .iter()
        .flat_map(|d| d.ops.iter().map(move |op| (d, op)))
        .filter(|(_, op)| op.latency.count() > 0)
        .max_by(|a, b| {
            let p = |x: &DiskOp| x.latency.percentile(0.99).unwrap_or(0.0);
            p(a.1).total_cmp(&p(b.1))
        })
    {
        lines.push(format!(
            "slowest storage tail: {} {} p99 {}",
            clean(&d.dev),
            clean(&op.op),
            opt_latency(op.latency.percentile(0.99))
        ));
    }
    if let Some(i) = report
        .interfaces
        .iter()
        .filter(|i| i.qdisc.count() > 0)
        .max_by(|a, b| {
            let p = |x: &Interface| x.qdisc.percentile(0.99).unwrap_or(0.0);
            p(a).total_cmp(&p(b))
        })
    {
        lines.push(format!(
            "longest transmit queue wait: {} p99 {}",
            clean(&i.iface),
            opt_latency(i.qdisc.percentile(0.99))
        ));
    }
    let rt = &report.retransmits;
    lines.push(format!(
        "TCP: {} retransmissions, {} retransmission timeouts waited out",
        thousands(rt.events),
        thousands(rt.timeouts)
    ));
    for l in lines {
        o.push_str(&wrap(&l, width, "  ", "    "));
    }
}

fn episode(o: &mut String, rank: usize, e: &Episode, width: usize) {
    let _ = writeln!(
        o,
        "\n#{rank} {}: {} — impact {}   (episode {})",
        clean(&cause_words(&e.kind)),
        clean(&cause_words(&e.cause)),
        duration_ms(e.impact_ms),
        e.id
    );
    // Continuation lines align with the text after the 10-column labels.
    let (label, rest) = ("   ", "             ");
    let when = match e.state {
        EpisodeState::Closed => format!(
            "{} to {} ({})",
            clock(e.start_us),
            clock(e.end_us),
            duration_ms(e.duration_ms)
        ),
        EpisodeState::StillOpen => format!(
            "{} to the end of the recording, {} and counting: STILL OPEN when the recording ended",
            clock(e.start_us),
            duration_ms(e.duration_ms)
        ),
        EpisodeState::ClosedOnly => format!(
            "{} to {} ({}; its opening is not in this file)",
            clock(e.start_us),
            clock(e.end_us),
            duration_ms(e.duration_ms)
        ),
    };
    o.push_str(&wrap(&when, width, &format!("{label}when      "), rest));
    let place = e.place();
    if !place.is_empty() {
        o.push_str(&wrap(
            &clean(&place),
            width,
            &format!("{label}where     "),
            rest,
        ));
    }
    for (i, ev) in e.evidence.iter().enumerate() {
        let first = if i == 0 {
            "evidence  • "
        } else {
            "          • "
        };
        let text = if ev.text.is_empty() {
            format!("{} = {}", ev.signal, ev.value)
        } else {
            ev.text.clone()
        };
        o.push_str(&wrap(
            &clean(&text),
            width,
            &format!("{label}{first}"),
            "               ",
        ));
    }
    if !e.next_step.is_empty() {
        o.push_str(&wrap(
            &clean(&e.next_step),
            width,
            &format!("{label}next step "),
            rest,
        ));
    }
    let hit = e.sessions_hit();
    if hit > 0 {
        let mut names: Vec<String> = e.sessions.iter().map(session_name).collect();
        if e.sessions_omitted > 0 {
            names.push(format!("and {} more", e.sessions_omitted));
        }
        o.push_str(&wrap(
            &format!("{hit} hit: {}", names.join("; ")),
            width,
            &format!("{label}sessions  "),
            rest,
        ));
    } else {
        let _ = writeln!(o, "{label}sessions  none known");
    }
    if !e.files.is_empty() {
        let files: Vec<String> = e.files.iter().map(|f| clean(f)).collect();
        o.push_str(&wrap(
            &files.join(", "),
            width,
            &format!("{label}files     "),
            rest,
        ));
    }
}

/// `SPID 51 from 10.0.0.9:50000 (login app, program OrderSvc)`
fn session_name(t: &SqlTag) -> String {
    let mut s = t.spid_label();
    if let Some(c) = &t.client {
        let _ = write!(s, " from {}", clean(c));
    }
    if let Some(who) = t.who() {
        let _ = write!(s, " ({})", clean(&who));
    }
    s
}

// ---- sessions -----------------------------------------------------------------

fn sessions(o: &mut String, report: &Report, width: usize) {
    if report.sessions.is_empty() {
        return;
    }
    section(
        o,
        &format!(
            "SQL SERVER SESSIONS HIT ({}, most time lost first)",
            report.sessions.len()
        ),
        width,
    );
    let mut rows = vec![vec![
        "session".to_string(),
        "client".into(),
        "episodes".into(),
        "in stalls".into(),
        "RTO wait".into(),
        "retransmits".into(),
        "who".into(),
    ]];
    for s in report.sessions.iter().take(TOP_ROWS) {
        rows.push(session_row(report, s));
    }
    o.push_str(&table(
        &rows,
        &[false, false, false, true, true, true, false],
        2,
    ));
    if report.sessions.len() > TOP_ROWS {
        let _ = writeln!(o, "  ... and {} more", report.sessions.len() - TOP_ROWS);
    }
    o.push_str(&wrap(
        "(in stalls: summed length of the episodes that hit it; RTO wait: retransmission timeouts its connection sat out)",
        width,
        "  ",
        "   ",
    ));
}

fn session_row(report: &Report, s: &SessionImpact) -> Vec<String> {
    // Numbered as the episode list numbers them: by rank.
    let mut ranks: Vec<usize> = s
        .episodes
        .iter()
        .filter_map(|id| report.rank_of(*id))
        .collect();
    ranks.sort_unstable();
    let episodes: Vec<String> = ranks.iter().map(|r| format!("#{r}")).collect();
    vec![
        s.tag.spid_label(),
        s.tag
            .client
            .as_deref()
            .map(clean)
            .unwrap_or_else(|| "-".into()),
        if episodes.is_empty() {
            "-".into()
        } else {
            episodes.join(" ")
        },
        if s.stall_ms > 0.0 {
            duration_ms(s.stall_ms)
        } else {
            "-".into()
        },
        if s.rto_wait_ms > 0.0 {
            duration_ms(s.rto_wait_ms)
        } else {
            "-".into()
        },
        format!("{} ({} segs)", s.retransmits, s.retrans_segs),
        s.tag.who().map(|w| clean(&w)).unwrap_or_default(),
    ]
}

// ---- storage ------------------------------------------------------------------

fn storage(o: &mut String, report: &Report, width: usize) {
    if report.disks.is_empty() {
        return;
    }
    let n = report.disks.len();
    section(
        o,
        &format!("STORAGE ({n} disk{})", if n == 1 { "" } else { "s" }),
        width,
    );
    for d in &report.disks {
        disk(o, d, &report.run.slow_io_words(), width);
    }
}

fn disk(o: &mut String, d: &Disk, slow_io: &str, width: usize) {
    let mut title = clean(&d.dev);
    if let Some(n) = &d.devno {
        let _ = write!(title, " ({})", clean(n));
    }
    if let Some(r) = &d.role {
        let _ = write!(title, " — SQL Server {} disk", clean(r));
    }
    let q = &d.queue_limit;
    let mut limits = Vec::new();
    if let Some(s) = &q.scheduler {
        limits.push(format!("scheduler {}", clean(s)));
    }
    for (name, v) in [
        ("nr_requests", q.nr_requests),
        ("hw queue depth", q.hw_queue_depth),
        ("device queue depth", q.device_queue_depth),
        ("hw queues", q.nr_hw_queues),
    ] {
        if let Some(v) = v {
            limits.push(format!("{name} {v}"));
        }
    }
    let _ = writeln!(o, "\n{title}");
    if !limits.is_empty() {
        o.push_str(&wrap(&limits.join(", "), width, "  queue: ", "         "));
    }
    let limit = q.effective_depth();
    for op in d
        .ops
        .iter()
        .filter(|op| op.requests > 0 || op.latency.count() > 0)
    {
        disk_op(o, op, limit, width);
    }
    if d.slow_io_count > 0 {
        let _ = writeln!(
            o,
            "  slow I/Os ({slow_io}): {}; the slowest:",
            thousands(d.slow_io_count)
        );
        for s in &d.slowest {
            let mut line = format!(
                "{} {} {}",
                latency_us(s.latency_us),
                clean(&s.op),
                clock(s.ts_us)
            );
            if let Some(dev) = s.device_us {
                let _ = write!(line, ", device {}", latency_us(dev));
            }
            if let Some(t) = s.tag_wait_us {
                let _ = write!(line, ", tag wait {}", latency_us(t));
            }
            match (&s.comm, s.pid) {
                (Some(c), Some(p)) => {
                    let _ = write!(line, ", {} (pid {p})", clean(c));
                }
                (None, Some(p)) => {
                    let _ = write!(line, ", pid {p}");
                }
                _ => {}
            }
            if let Some(f) = &s.file {
                let _ = write!(line, ", {}", clean(f));
            }
            o.push_str(&wrap(&line, width, "    ", "      "));
        }
    }
}

fn disk_op(o: &mut String, op: &DiskOp, limit: Option<u64>, width: usize) {
    let line = format!(
        "{}: {} requests, {} IOPS (peak {}), {} at {}/s; requeues {}, errors {}{}",
        clean(&op.op).to_uppercase(),
        thousands(op.requests),
        thousands(op.iops().round() as u64),
        thousands(op.peak_iops().round() as u64),
        bytes(op.bytes),
        bytes(op.bytes_per_second().round() as u64),
        op.requeues,
        op.errors,
        if op.completions_unseen > 0 {
            format!(", completions unseen {}", op.completions_unseen)
        } else {
            String::new()
        }
    );
    o.push_str(&wrap(&line, width, "  ", "    "));
    if op.latency.count() == 0 {
        return;
    }
    o.push_str(&wrap(
        &format!(
            "latency, submitted to completed: {}, mean {}",
            percentiles(&op.latency),
            opt_latency(op.latency.mean())
        ),
        width,
        "    ",
        "      ",
    ));
    // Phases without data (a flush has no tag wait) are left out.
    let phases: Vec<String> = [
        ("tag wait", &op.tag_wait),
        ("queue", &op.queue),
        ("device", &op.device),
    ]
    .iter()
    .filter(|(_, h)| h.count() > 0)
    .map(|(name, h)| {
        format!(
            "{name} {} / {}",
            opt_latency(h.mean()),
            opt_latency(h.percentile(0.99))
        )
    })
    .collect();
    if !phases.is_empty() {
        o.push_str(&wrap(
            &phases.join("; "),
            width,
            "    phases (mean / p99): ",
            "      ",
        ));
    }
    o.push_str(&bars::render(&bars::rows(&op.latency, None), width, 4));
    if op.inflight.count() > 0 {
        let at_limit = limit
            .map(|l| {
                let at: u64 = op
                    .inflight
                    .buckets()
                    .iter()
                    .filter(|(lo, _, _)| *lo >= l as f64)
                    .map(|(_, _, n)| n)
                    .sum();
                format!(
                    "; at the queue limit ({l}) for {:.0}% of issues",
                    at as f64 * 100.0 / op.inflight.count() as f64
                )
            })
            .unwrap_or_default();
        let line = format!(
            "requests in flight at each issue: p50 {}, p99 {}, max {}{at_limit}",
            op.inflight.percentile(0.5).map(sig3).unwrap_or_default(),
            op.inflight.percentile(0.99).map(sig3).unwrap_or_default(),
            op.inflight.max().map(sig3).unwrap_or_default(),
        );
        o.push_str(&wrap(&line, width, "    ", "      "));
        o.push_str(&bars::render(
            &bars::rows(&op.inflight, limit.map(|l| l as f64)),
            width,
            4,
        ));
    }
}

// ---- interfaces ---------------------------------------------------------------

fn interfaces(o: &mut String, report: &Report, width: usize) {
    if report.interfaces.is_empty() {
        return;
    }
    section(
        o,
        &format!("NETWORK INTERFACES ({})", report.interfaces.len()),
        width,
    );
    for i in &report.interfaces {
        interface(o, i, width);
    }
}

fn interface(o: &mut String, i: &Interface, width: usize) {
    let mut title = clean(&i.iface);
    if let Some(ns) = i.netns {
        let _ = write!(title, " (netns {ns})");
    }
    o.push('\n');
    o.push_str(&wrap(
        &format!(
            "{title}: sent {} in {} packets, received {} in {} packets",
            bytes(i.tx_bytes),
            thousands(i.tx_packets),
            bytes(i.rx_bytes),
            thousands(i.rx_packets)
        ),
        width,
        "",
        "  ",
    ));
    if let Some(l) = &i.link {
        let mut parts = vec![format!(
            "{}{}",
            l.oper_state
                .as_deref()
                .map(clean)
                .unwrap_or_else(|| "?".into()),
            match l.carrier {
                Some(false) => ", no carrier",
                _ => "",
            }
        )];
        if let Some(s) = &l.speed {
            parts.push(if s == "not exposed" {
                "speed not exposed".into()
            } else {
                format!("{} Mb/s", clean(s))
            });
        }
        if let Some(d) = &l.duplex {
            parts.push(if d == "not exposed" {
                "duplex not exposed".into()
            } else {
                format!("{} duplex", clean(d))
            });
        }
        match l.autoneg.as_deref() {
            Some("true") => parts.push("autoneg on".into()),
            Some("false") => parts.push("autoneg off".into()),
            Some(other) => parts.push(format!("autoneg {}", clean(other))),
            None => {}
        }
        parts.push(match &l.pause {
            None => "PAUSE not exposed".into(),
            Some(p) => format!(
                "PAUSE frames rx {} tx {}",
                p.rx_frames.map(thousands).unwrap_or_else(|| "?".into()),
                p.tx_frames.map(thousands).unwrap_or_else(|| "?".into())
            ),
        });
        if let Some(k) = &l.qdisc_kind {
            parts.push(format!(
                "qdisc {}: drops {}, backlog up to {}",
                clean(k),
                thousands(l.qdisc_drops),
                bytes(l.qdisc_backlog_max_bytes)
            ));
        }
        o.push_str(&wrap(&parts.join(", "), width, "  link: ", "        "));
        let problems = l.problems();
        if problems.is_empty() {
            let _ = writeln!(o, "  link problems: none seen");
        } else {
            o.push_str(&wrap(
                &clean(&problems.join("; ")),
                width,
                "  !! link problems: ",
                "       ",
            ));
        }
    }
    if i.tx_timeouts + i.tx_stalls + i.tx_busy > 0 {
        let _ = writeln!(
            o,
            "  !! transmit timeouts {}, BQL stalls {}, driver busy {}",
            i.tx_timeouts, i.tx_stalls, i.tx_busy
        );
    }
    if i.qdisc.count() > 0 {
        let line = format!(
            "transmit queue (qdisc) wait: {} ({} packets{})",
            percentiles(&i.qdisc),
            thousands(i.qdisc.count()),
            if i.qdisc_untimed > 0 {
                format!("; {} not timed", thousands(i.qdisc_untimed))
            } else {
                String::new()
            }
        );
        o.push_str(&wrap(&line, width, "  ", "    "));
        o.push_str(&bars::render(&bars::rows(&i.qdisc, None), width, 4));
    }
    let mut timing = Vec::new();
    if i.xmit.count() > 0 {
        timing.push(format!(
            "driver transmit p50 {} p99 {}",
            opt_latency(i.xmit.percentile(0.5)),
            opt_latency(i.xmit.percentile(0.99))
        ));
    }
    if i.rx.count() > 0 {
        timing.push(format!(
            "receive path (1 in 16 packets) p50 {} p99 {}",
            opt_latency(i.rx.percentile(0.5)),
            opt_latency(i.rx.percentile(0.99))
        ));
    }
    if !timing.is_empty() {
        o.push_str(&wrap(&timing.join("; "), width, "  ", "    "));
    }
}

// ---- TCP peers ------------------------------------------------------------------

fn peers(o: &mut String, report: &Report, width: usize) {
    let rt = &report.retransmits;
    if report.peers.is_empty() && rt.events == 0 {
        return;
    }
    let shown = report.peers.len().min(TOP_ROWS);
    section(
        o,
        &format!("TCP PEERS ({shown} of {}, worst first)", report.peers.len()),
        width,
    );
    let mut rows = vec![vec![
        "connection".to_string(),
        "session".into(),
        "srtt p50".into(),
        "p99".into(),
        "retrans".into(),
        "RTOs".into(),
        "RTO wait".into(),
        "max RTO".into(),
    ]];
    for p in report.peers.iter().take(TOP_ROWS) {
        rows.push(peer_row(p));
    }
    o.push_str(&table(
        &rows,
        &[false, false, true, true, true, true, true, true],
        2,
    ));
    if rt.events > 0 {
        let kinds: Vec<String> = rt
            .by_kind
            .iter()
            .map(|(k, n)| format!("{} {}", clean(k), thousands(*n)))
            .collect();
        o.push_str(&wrap(
            &format!(
                "retransmissions: {} ({}), {} segments; {} retransmission timeout{} waited {} in all, the longest {}; {} not sent (the attempt failed locally)",
                thousands(rt.events),
                kinds.join(", "),
                thousands(rt.segs),
                thousands(rt.timeouts),
                if rt.timeouts == 1 { "" } else { "s" },
                duration_ms(rt.rto_wait_ms),
                duration_ms(rt.max_rto_ms),
                thousands(rt.not_sent)
            ),
            width,
            "  ",
            "    ",
        ));
    }
}

fn peer_row(p: &TcpPeer) -> Vec<String> {
    let dash = |v: f64| if v > 0.0 { duration_ms(v) } else { "-".into() };
    vec![
        clean(&p.label()),
        p.sql.as_ref().map(SqlTag::spid_label).unwrap_or_default(),
        opt_latency(p.srtt.percentile(0.5)),
        opt_latency(p.srtt.percentile(0.99)),
        thousands(p.retransmits.max(p.events)),
        thousands(p.rtos),
        dash(p.rto_wait_ms),
        dash(p.max_rto_ms),
    ]
}

// ---- bulk flows -------------------------------------------------------------------

fn flows(o: &mut String, report: &Report, width: usize) {
    if report.flows.is_empty() {
        return;
    }
    section(o, &format!("BULK FLOWS ({})", report.flows.len()), width);
    for f in report.flows.iter().take(TOP_ROWS) {
        flow(o, f, width);
    }
    if report.flows.len() > TOP_ROWS {
        let _ = writeln!(o, "... and {} more", report.flows.len() - TOP_ROWS);
    }
}

fn flow(o: &mut String, f: &BulkFlow, width: usize) {
    let mut title = clean(&f.flow);
    if let Some(t) = &f.sql {
        let kind = t.kind.as_deref().unwrap_or("sql");
        let _ = write!(title, " [SQL Server {}]", clean(kind).replace('_', " "));
    }
    let _ = writeln!(o, "\n{title}");
    o.push_str(&wrap(
        &format!(
            "sent {}, received {}; {} Mbit/s mean, {} peak{}; {} segments retransmitted; srtt up to {}",
            bytes(f.bytes_acked),
            bytes(f.bytes_received),
            sig3(f.mean_send_mbps()),
            sig3(f.peak_send_mbps),
            f.delivery_mbps
                .map(|d| format!(", path delivery rate {} Mbit/s at the end", sig3(d)))
                .unwrap_or_default(),
            thousands(f.retrans_segs),
            latency_us(f.srtt_us_max)
        ),
        width,
        "  ",
        "    ",
    ));
    let total: u64 = f.limiter_time().iter().map(|(_, ms)| ms).sum();
    if total > 0 {
        let shares: Vec<String> = f
            .limiter_time()
            .iter()
            .map(|(l, ms)| {
                format!(
                    "{} {:.0}%",
                    limiter_words(l),
                    *ms as f64 * 100.0 / total as f64
                )
            })
            .collect();
        o.push_str(&wrap(&shares.join(", "), width, "  limited by: ", "    "));
        let spans: Vec<String> = f
            .limiter_spans()
            .iter()
            .map(|(start, end, l)| {
                format!("{}–{} {}", clock(*start), clock(*end), limiter_words(l))
            })
            .collect();
        o.push_str(&wrap(&spans.join(" → "), width, "  over time:  ", "    "));
    }
}

fn limiter_words(l: &str) -> String {
    match l {
        "network" => "network (congestion window)".into(),
        "receiver" => "receiver window".into(),
        "sender_buffer" => "send buffer".into(),
        "application" => "application (nothing to send)".into(),
        other => clean(other),
    }
}
