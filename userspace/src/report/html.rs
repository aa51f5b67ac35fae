//! The report as one self-contained HTML page: inline CSS, inline SVG, a few
//! lines of inline JS (hovering an episode highlights it everywhere), no
//! fetch of any kind, so it can be mailed or attached to a ticket and opened
//! offline.
//!
//! Every string from the stream goes through [`esc`]: host names, process
//! names, paths and DMV fields come from the traced host.
//!
//! Stable hooks for tests and scripts: `svg.heatmap` (one per disk op and per
//! interface, with `data-dev`/`data-op` or `data-iface`), `svg.timeline`,
//! `rect.episode` (`id="episode-N"`), `tr.episode-row`, `.episode-band`,
//! `table#sessions`, `body[data-ready="1"]` once the script has run.

mod svg;

use std::fmt::Write as _;

use super::episodes::{Episode, EpisodeState, cause_words};
use super::merge::MergedHist;
use super::model::Report;
use super::sessions::SqlTag;
use super::time::{bytes, clock, duration_ms, full, latency_us, rfc3339, sig3, thousands};
use svg::{Column, TimeAxis};

/// Escape text for HTML element content and quoted attribute values.
pub fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c if c.is_control() && c != '\n' && c != '\t' => out.push('\u{fffd}'),
            c => out.push(c),
        }
    }
    out
}

/// A nonce for the page's policy: a hash of the page's content, so the same
/// report renders the same bytes, and content that wanted to carry the nonce
/// would change it.
fn nonce(content: &str) -> String {
    use std::hash::{Hash, Hasher};
    let mut a = std::collections::hash_map::DefaultHasher::new();
    content.hash(&mut a);
    let mut b = std::collections::hash_map::DefaultHasher::new();
    (a.finish(), content.len()).hash(&mut b);
    format!("{:016x}{:016x}", a.finish(), b.finish())
}

const STYLE: &str = include_str!("html/style.css");
const SCRIPT: &str = include_str!("html/script.js");

pub fn render_html(report: &Report) -> String {
    let axis = TimeAxis {
        start_us: report.run.start_us,
        end_us: report.run.end_us.max(report.run.start_us + 1),
    };
    let mut body = String::with_capacity(64 * 1024);
    header(&mut body, report);
    episodes(&mut body, report, axis);
    sessions(&mut body, report);
    storage(&mut body, report, axis);
    network(&mut body, report, axis);
    peers(&mut body, report);
    flows(&mut body, report, axis);
    // The policy forbids every fetch and every script or style but the page's
    // own (by nonce): even a string that escaped `esc` could load or run nothing.
    let nonce = nonce(&body);
    let mut o = String::with_capacity(body.len() + 8 * 1024);
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; img-src data:; base-uri 'none'; form-action 'none'\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>stalltrace report: {} {}</title><style nonce=\"{nonce}\">{STYLE}</style></head>\n<body data-ready=\"0\">\n{body}",
        esc(&report.run.host),
        esc(&clock(report.run.start_us))
    );
    let _ = write!(
        o,
        "<footer>stalltrace {} · percentiles are nearest rank, reported as bucket midpoints (within 3.2%); heatmap rows are powers of two, colour is count on a log scale</footer>\n<script nonce=\"{nonce}\">{SCRIPT}</script>\n</body></html>\n",
        esc(env!("CARGO_PKG_VERSION"))
    );
    o
}

fn header(o: &mut String, report: &Report) {
    let run = &report.run;
    let _ = write!(
        o,
        "<header><h1>stalltrace report <span class=\"host\">{}</span></h1><dl class=\"run\">",
        esc(&run.host)
    );
    let dd = |o: &mut String, k: &str, v: &str, class: &str| {
        let _ = write!(o, "<dt>{k}</dt><dd class=\"{class}\">{v}</dd>");
    };
    dd(
        o,
        "window",
        &esc(&format!(
            "{} to {} ({}; {}; {})",
            full(run.start_us),
            clock(run.end_us),
            duration_ms(run.window_ms()),
            run.intervals_words(),
            run.stop_reason
                .as_ref()
                .map(|r| format!("ended by {r}"))
                .unwrap_or_else(|| "no stop record".into())
        )),
        "",
    );
    dd(o, "host", &esc(&run.identity()), "");
    let fams: Vec<String> = run
        .families
        .iter()
        .map(|f| {
            let s = match (&f.mode, f.attached) {
                (Some(m), true) => format!("{} ({m})", f.family),
                (None, true) => f.family.clone(),
                (_, false) => format!("{} NOT ATTACHED", f.family),
            };
            match &f.note {
                Some(n) => format!("<span title=\"{}\">{}</span>", esc(n), esc(&s)),
                None => esc(&s),
            }
        })
        .collect();
    let attached = match run.families_note() {
        None => fams.join(", "),
        Some(note) if fams.is_empty() => esc(note),
        Some(note) => format!("{} ({})", fams.join(", "), esc(note)),
    };
    dd(o, "attached", &attached, "");
    if run.inferred {
        dd(o, "limited to", "unknown (no `start` record)", "");
    } else if !run.filters.is_empty() {
        dd(o, "limited to", &esc(&run.filters.join("; ")), "");
    }
    if report.losses.any() {
        let parts: Vec<String> = report
            .losses
            .by_source
            .iter()
            .map(|(s, n)| format!("{} {}", esc(s), thousands(*n)))
            .collect();
        dd(
            o,
            "losses",
            &format!(
                "LOST {} events or measurements in {} intervals: what follows is incomplete. {}",
                thousands(report.losses.total()),
                report.losses.intervals,
                parts.join(", ")
            ),
            "losses bad",
        );
    } else {
        dd(
            o,
            "losses",
            "none: every event and measurement was delivered",
            "losses ok",
        );
    }
    if let Some(files) = report.stream.files_summary() {
        dd(o, "files", &esc(&files), "");
    }
    let warnings = report.stream.warnings(run);
    if warnings.is_empty() {
        dd(
            o,
            "stream",
            "complete: start to stop, every record the run wrote",
            "stream ok",
        );
    } else {
        let items: Vec<String> = warnings
            .iter()
            .map(|w| format!("<li>{}</li>", esc(w)))
            .collect();
        dd(
            o,
            "stream",
            &format!("<ul>{}</ul>", items.join("")),
            "stream bad",
        );
    }
    for inst in &report.instances {
        let ports = |p: &[u64]| p.iter().map(u64::to_string).collect::<Vec<_>>().join(", ");
        let roles: Vec<String> = inst
            .disk_roles
            .iter()
            .map(|(d, r)| format!("{d} {r}"))
            .collect();
        dd(
            o,
            "SQL Server",
            &esc(&format!(
                "sqlservr pid {}{}, TDS port {}, endpoint port {}, {} client sessions seen{}",
                inst.pid,
                inst.watchdog_pid
                    .map(|w| format!(" (watchdog {w})"))
                    .unwrap_or_default(),
                ports(&inst.tds_ports),
                ports(&inst.ag_ports),
                inst.sessions_seen,
                if roles.is_empty() {
                    String::new()
                } else {
                    format!("; disks {}", roles.join(", "))
                }
            )),
            "",
        );
    }
    o.push_str("</dl></header>\n");
}

// ---- episodes ---------------------------------------------------------------

fn episodes(o: &mut String, report: &Report, axis: TimeAxis) {
    o.push_str("<section id=\"episodes\"><h2>Stall episodes</h2>\n");
    if report.episodes.is_empty() {
        o.push_str("<p class=\"no-stalls\">No stalls: no stall episode in this recording.</p>\n");
        o.push_str(&svg::timeline(axis, &report.episodes));
        o.push_str("</section>\n");
        return;
    }
    let _ = writeln!(
        o,
        "<p>{} episode{}, ranked by impact (time lost over what each hit). Hover one to find it on every chart.</p>",
        report.episodes.len(),
        if report.episodes.len() == 1 { "" } else { "s" }
    );
    o.push_str(&svg::timeline(axis, &report.episodes));
    o.push_str(
        "<table class=\"episodes\"><thead><tr><th>#</th><th>when</th><th>kind and cause</th><th class=\"num\">impact</th><th>where</th><th>evidence</th><th>next step</th><th>sessions hit</th></tr></thead><tbody>\n",
    );
    for (i, e) in report.episodes.iter().enumerate() {
        episode_row(o, i + 1, e);
    }
    o.push_str("</tbody></table></section>\n");
}

fn episode_row(o: &mut String, rank: usize, e: &Episode) {
    let when = match e.state {
        EpisodeState::Closed => format!(
            "{} to {}<br>{}",
            clock(e.start_us),
            clock(e.end_us),
            duration_ms(e.duration_ms)
        ),
        EpisodeState::StillOpen => format!(
            "{} on<br>{}+ <strong class=\"still-open\">still open when the recording ended</strong>",
            clock(e.start_us),
            duration_ms(e.duration_ms)
        ),
        EpisodeState::ClosedOnly => format!(
            "{} to {}<br>{} <em>(opened before this file)</em>",
            clock(e.start_us),
            clock(e.end_us),
            duration_ms(e.duration_ms)
        ),
    };
    let evidence: Vec<String> = e
        .evidence
        .iter()
        .map(|ev| {
            let text = if ev.text.is_empty() {
                format!("{} = {}", ev.signal, ev.value)
            } else {
                ev.text.clone()
            };
            format!(
                "<li title=\"{}\">{}</li>",
                esc(&format!(
                    "{} = {}{}{}",
                    ev.signal,
                    ev.value,
                    ev.unit
                        .as_ref()
                        .map(|u| format!(" {u}"))
                        .unwrap_or_default(),
                    ev.threshold
                        .map(|t| format!(" (threshold {t})"))
                        .unwrap_or_default()
                )),
                esc(&text)
            )
        })
        .collect();
    let mut names: Vec<String> = e.sessions.iter().map(|t| esc(&session_name(t))).collect();
    if e.sessions_omitted > 0 {
        names.push(format!("and {} more", e.sessions_omitted));
    }
    // A long list folds away: the count is what the table is read for.
    let sessions = if names.len() > 3 {
        format!(
            "<details><summary>{} sessions</summary>{}</details>",
            e.sessions_hit(),
            names.join("<br>")
        )
    } else {
        names.join("<br>")
    };
    let mut place = esc(&e.place());
    if !e.files.is_empty() {
        let files: Vec<String> = e.files.iter().map(|f| esc(f)).collect();
        let _ = write!(place, "<br><small>{}</small>", files.join("<br>"));
    }
    let _ = writeln!(
        o,
        "<tr class=\"episode-row kind-{}\" id=\"episode-row-{}\" data-episode=\"{}\" data-start=\"{}\" data-end=\"{}\"><td>{rank}</td><td>{when}</td><td><strong>{}</strong><br>{}</td><td class=\"num\">{}</td><td>{place}</td><td><ul>{}</ul></td><td>{}</td><td>{}</td></tr>",
        esc(&e.kind),
        e.id,
        e.id,
        rfc3339(e.start_us),
        rfc3339(e.end_us),
        esc(&cause_words(&e.kind)),
        esc(&cause_words(&e.cause)),
        duration_ms(e.impact_ms),
        evidence.join(""),
        esc(&e.next_step),
        if sessions.is_empty() {
            "none known".into()
        } else {
            sessions
        }
    );
}

fn session_name(t: &SqlTag) -> String {
    let mut s = t.spid_label();
    if let Some(c) = &t.client {
        let _ = write!(s, " from {c}");
    }
    if let Some(who) = t.who() {
        let _ = write!(s, " ({who})");
    }
    s
}

// ---- sessions -----------------------------------------------------------------

fn sessions(o: &mut String, report: &Report) {
    if report.sessions.is_empty() {
        return;
    }
    o.push_str(
        "<section id=\"sessions-section\"><h2>SQL Server sessions hit</h2>\
         <p>Most time lost first. <em>In stalls</em>: summed length of the episodes that hit the session; <em>RTO wait</em>: retransmission timeouts its own connection sat out.</p>\
         <table id=\"sessions\" class=\"sessions\"><thead><tr><th>session</th><th>client</th><th>who</th><th>episodes</th><th class=\"num\">in stalls</th><th class=\"num\">RTO wait</th><th class=\"num\">retransmits</th><th class=\"num\">segments</th></tr></thead><tbody>\n",
    );
    for s in &report.sessions {
        // Numbered as the episode list numbers them: by rank.
        let mut eps: Vec<(usize, u64)> = s
            .episodes
            .iter()
            .filter_map(|id| Some((report.rank_of(*id)?, *id)))
            .collect();
        eps.sort_unstable();
        let eps: Vec<String> = eps
            .iter()
            .map(|(rank, id)| {
                format!("<a href=\"#episode-row-{id}\" data-episode=\"{id}\">#{rank}</a>")
            })
            .collect();
        let dash = |ms: f64| {
            if ms > 0.0 {
                duration_ms(ms)
            } else {
                "-".into()
            }
        };
        let _ = writeln!(
            o,
            "<tr class=\"session\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&s.tag.spid_label()),
            esc(s.tag.client.as_deref().unwrap_or("-")),
            esc(&s.tag.who().unwrap_or_default()),
            eps.join(" "),
            dash(s.stall_ms),
            dash(s.rto_wait_ms),
            thousands(s.retransmits),
            thousands(s.retrans_segs)
        );
    }
    o.push_str("</tbody></table></section>\n");
}

// ---- storage and network --------------------------------------------------------

/// Episodes for a chart's bands: `own` when the episode is about this disk or interface.
fn bands(report: &Report, own: impl Fn(&Episode) -> bool) -> Vec<(&Episode, usize, bool)> {
    report
        .episodes
        .iter()
        .enumerate()
        .map(|(i, e)| (e, i + 1, own(e)))
        .collect()
}

fn stats_row(name: &str, h: &MergedHist, fmt: &dyn Fn(f64) -> String) -> String {
    let f = |v: Option<f64>| v.map(fmt).unwrap_or_else(|| "-".into());
    format!(
        "<tr><th>{}</th><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
        esc(name),
        thousands(h.count()),
        f(h.mean()),
        f(h.percentile(0.5)),
        f(h.percentile(0.9)),
        f(h.percentile(0.99)),
        f(h.max())
    )
}

const STATS_HEAD: &str = "<table class=\"stats\"><thead><tr><th></th><th class=\"num\">count</th><th class=\"num\">mean</th><th class=\"num\">p50</th><th class=\"num\">p90</th><th class=\"num\">p99</th><th class=\"num\">max</th></tr></thead><tbody>";

fn storage(o: &mut String, report: &Report, axis: TimeAxis) {
    if report.disks.is_empty() {
        return;
    }
    o.push_str("<section id=\"storage\"><h2>Storage</h2>\n");
    for d in &report.disks {
        let q = &d.queue_limit;
        let mut limits = Vec::new();
        if let Some(s) = &q.scheduler {
            limits.push(format!("scheduler {s}"));
        }
        for (n, v) in [
            ("nr_requests", q.nr_requests),
            ("hw queue depth", q.hw_queue_depth),
            ("device queue depth", q.device_queue_depth),
        ] {
            if let Some(v) = v {
                limits.push(format!("{n} {v}"));
            }
        }
        let _ = write!(
            o,
            "<article class=\"disk\" data-dev=\"{}\"><h3>{}{}{}</h3><p class=\"limits\">{}</p>",
            esc(&d.dev),
            esc(&d.dev),
            d.devno
                .as_ref()
                .map(|n| format!(" <small>({})</small>", esc(n)))
                .unwrap_or_default(),
            d.role
                .as_ref()
                .map(|r| format!(" <span class=\"role\">SQL Server {} disk</span>", esc(r)))
                .unwrap_or_default(),
            esc(&limits.join(", "))
        );
        for op in d.ops.iter().filter(|op| op.latency.count() > 0) {
            let columns: Vec<Column> = op
                .series
                .iter()
                .map(|p| Column {
                    ts_us: p.ts_us,
                    interval_ms: p.interval_ms,
                    buckets: &p.latency,
                })
                .collect();
            let title = format!("{} {} latency over time", d.dev, op.op);
            let _ = write!(
                o,
                "<h4>{} {}: {} requests, {} IOPS (peak {}), {} at {}/s</h4><figure>",
                esc(&d.dev),
                esc(&op.op),
                thousands(op.requests),
                thousands(op.iops().round() as u64),
                thousands(op.peak_iops().round() as u64),
                bytes(op.bytes),
                bytes(op.bytes_per_second().round() as u64)
            );
            o.push_str(&svg::heatmap(
                &title,
                op.latency.unit(),
                axis,
                &columns,
                &bands(report, |e| e.dev.as_deref() == Some(d.dev.as_str())),
                &format!("data-dev=\"{}\" data-op=\"{}\"", esc(&d.dev), esc(&op.op)),
            ));
            let _ = write!(
                o,
                "<figcaption>{} — latency (bio submitted to completed) per interval</figcaption></figure>{STATS_HEAD}{}{}{}{}{}</tbody></table>",
                esc(&title),
                stats_row("latency", &op.latency, &latency_us),
                stats_row("tag wait", &op.tag_wait, &latency_us),
                stats_row("queue", &op.queue, &latency_us),
                stats_row("device", &op.device, &latency_us),
                stats_row("in flight", &op.inflight, &sig3),
            );
        }
        if d.slow_io_count > 0 {
            let _ = write!(
                o,
                "<p>{} slow I/Os ({}). Slowest:</p><ul class=\"slow-io\">",
                thousands(d.slow_io_count),
                esc(&report.run.slow_io_words())
            );
            for s in &d.slowest {
                let _ = write!(
                    o,
                    "<li>{} {} at {}{}{}{}</li>",
                    latency_us(s.latency_us),
                    esc(&s.op),
                    clock(s.ts_us),
                    s.device_us
                        .map(|v| format!(", device {}", latency_us(v)))
                        .unwrap_or_default(),
                    match (&s.comm, s.pid) {
                        (Some(c), Some(p)) => format!(", {} (pid {p})", esc(c)),
                        (None, Some(p)) => format!(", pid {p}"),
                        _ => String::new(),
                    },
                    s.file
                        .as_ref()
                        .map(|f| format!(", {}", esc(f)))
                        .unwrap_or_default()
                );
            }
            o.push_str("</ul>");
        }
        o.push_str("</article>\n");
    }
    o.push_str("</section>\n");
}

fn network(o: &mut String, report: &Report, axis: TimeAxis) {
    if report.interfaces.is_empty() {
        return;
    }
    o.push_str("<section id=\"network\"><h2>Network interfaces</h2>\n");
    for i in &report.interfaces {
        let _ = write!(
            o,
            "<article class=\"iface\" data-iface=\"{}\"><h3>{}{}</h3><p>sent {} in {} packets, received {} in {} packets</p>",
            esc(&i.iface),
            esc(&i.iface),
            i.netns
                .map(|n| format!(" <small>(netns {n})</small>"))
                .unwrap_or_default(),
            bytes(i.tx_bytes),
            thousands(i.tx_packets),
            bytes(i.rx_bytes),
            thousands(i.rx_packets)
        );
        if let Some(l) = &i.link {
            let problems = l.problems();
            let autoneg = match l.autoneg.as_deref() {
                Some("true") => "on",
                Some("false") => "off",
                Some(other) => other,
                None => "?",
            };
            let _ = write!(
                o,
                "<p class=\"link\">link {}, {} Mb/s, {} duplex, autoneg {}, PAUSE {}, qdisc {} (drops {}, backlog up to {})</p>",
                esc(l.oper_state.as_deref().unwrap_or("?")),
                esc(l.speed.as_deref().unwrap_or("?")),
                esc(l.duplex.as_deref().unwrap_or("?")),
                esc(autoneg),
                match &l.pause {
                    None => "not exposed".into(),
                    Some(p) => format!(
                        "frames rx {} tx {}",
                        p.rx_frames.map(thousands).unwrap_or_else(|| "?".into()),
                        p.tx_frames.map(thousands).unwrap_or_else(|| "?".into())
                    ),
                },
                esc(l.qdisc_kind.as_deref().unwrap_or("?")),
                thousands(l.qdisc_drops),
                bytes(l.qdisc_backlog_max_bytes)
            );
            if problems.is_empty() {
                o.push_str("<p class=\"link-ok\">link problems: none seen</p>");
            } else {
                let _ = write!(
                    o,
                    "<p class=\"link-bad\">link problems: {}</p>",
                    esc(&problems.join("; "))
                );
            }
        }
        if i.tx_timeouts + i.tx_stalls + i.tx_busy > 0 {
            let _ = write!(
                o,
                "<p class=\"link-bad\">transmit timeouts {}, BQL stalls {}, driver busy {}</p>",
                i.tx_timeouts, i.tx_stalls, i.tx_busy
            );
        }
        if i.qdisc.count() > 0 {
            let columns: Vec<Column> = i
                .series
                .iter()
                .map(|p| Column {
                    ts_us: p.ts_us,
                    interval_ms: p.interval_ms,
                    buckets: &p.qdisc,
                })
                .collect();
            let title = format!("{} transmit queue wait over time", i.iface);
            o.push_str("<figure>");
            o.push_str(&svg::heatmap(
                &title,
                i.qdisc.unit(),
                axis,
                &columns,
                &bands(report, |e| e.iface.as_deref() == Some(i.iface.as_str())),
                &format!("data-iface=\"{}\"", esc(&i.iface)),
            ));
            let _ = write!(
                o,
                "<figcaption>{} — qdisc wait per interval</figcaption></figure>",
                esc(&title)
            );
        }
        let _ = writeln!(
            o,
            "{STATS_HEAD}{}{}{}</tbody></table></article>",
            stats_row("qdisc wait", &i.qdisc, &latency_us),
            stats_row("driver transmit", &i.xmit, &latency_us),
            stats_row("receive path (1 in 16)", &i.rx, &latency_us),
        );
    }
    o.push_str("</section>\n");
}

// ---- peers and flows ----------------------------------------------------------------

fn peers(o: &mut String, report: &Report) {
    if report.peers.is_empty() {
        return;
    }
    let rt = &report.retransmits;
    let kinds: Vec<String> = rt
        .by_kind
        .iter()
        .map(|(k, n)| format!("{} {n}", esc(k)))
        .collect();
    let _ = writeln!(
        o,
        "<section id=\"peers\"><h2>TCP peers</h2><p>{} retransmissions ({}), {} segments; {} retransmission timeouts waited {} in all.</p>\
         <table class=\"peers\"><thead><tr><th>connection</th><th>session</th><th class=\"num\">srtt p50</th><th class=\"num\">p99</th><th class=\"num\">max</th><th class=\"num\">retransmits</th><th class=\"num\">RTOs</th><th class=\"num\">RTO wait</th></tr></thead><tbody>",
        thousands(rt.events),
        kinds.join(", "),
        thousands(rt.segs),
        thousands(rt.timeouts),
        duration_ms(rt.rto_wait_ms)
    );
    let lat = |v: Option<f64>| v.map(latency_us).unwrap_or_else(|| "-".into());
    for p in report.peers.iter().take(PEERS_SHOWN) {
        let _ = writeln!(
            o,
            "<tr class=\"peer\"><td>{}</td><td>{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td><td class=\"num\">{}</td></tr>",
            esc(&p.label()),
            esc(&p.sql.as_ref().map(SqlTag::spid_label).unwrap_or_default()),
            lat(p.srtt.percentile(0.5)),
            lat(p.srtt.percentile(0.99)),
            lat(p.srtt.max()),
            thousands(p.retransmits.max(p.events)),
            thousands(p.rtos),
            if p.rto_wait_ms > 0.0 {
                duration_ms(p.rto_wait_ms)
            } else {
                "-".into()
            }
        );
    }
    o.push_str("</tbody></table>");
    if report.peers.len() > PEERS_SHOWN {
        let _ = write!(
            o,
            "<p>... and {} more peers, with fewer retransmissions and a shorter RTT tail.</p>",
            report.peers.len() - PEERS_SHOWN
        );
    }
    o.push_str("</section>\n");
}

/// A host with thousands of connections: the worst are the ones to read.
const PEERS_SHOWN: usize = 50;

fn flows(o: &mut String, report: &Report, axis: TimeAxis) {
    if report.flows.is_empty() {
        return;
    }
    o.push_str(
        "<section id=\"flows\"><h2>Bulk flows</h2><p class=\"legend\">limited by: \
         <span class=\"limiter-network\">network</span> \
         <span class=\"limiter-receiver\">receiver window</span> \
         <span class=\"limiter-sender_buffer\">send buffer</span> \
         <span class=\"limiter-application\">application</span>; the line is the send rate</p>\n",
    );
    for f in &report.flows {
        let total: u64 = f.limiter_time().iter().map(|(_, ms)| ms).sum();
        let shares: Vec<String> = f
            .limiter_time()
            .iter()
            .map(|(l, ms)| {
                format!(
                    "{} {:.0}%",
                    esc(l),
                    *ms as f64 * 100.0 / total.max(1) as f64
                )
            })
            .collect();
        let _ = write!(
            o,
            "<article class=\"bulk-flow\" data-flow=\"{}\"><h3>{}{}</h3><p>sent {}, received {}; {} Mbit/s mean, {} peak; {} segments retransmitted; limited by {}</p>",
            esc(&f.flow),
            esc(&f.flow),
            f.sql
                .as_ref()
                .and_then(|t| t.kind.as_ref())
                .map(|k| format!(" <small>SQL Server {}</small>", esc(&k.replace('_', " "))))
                .unwrap_or_default(),
            bytes(f.bytes_acked),
            bytes(f.bytes_received),
            sig3(f.mean_send_mbps()),
            sig3(f.peak_send_mbps),
            thousands(f.retrans_segs),
            shares.join(", ")
        );
        o.push_str(&svg::flow_strip(axis, f));
        o.push_str("</article>\n");
    }
    o.push_str("</section>\n");
}
