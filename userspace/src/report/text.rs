//! The terminal report: what an SRE reads first (the run, whether anything was
//! lost, the stall episodes ranked by impact and the sessions they hit), then
//! the evidence per disk and interface as bar charts, TCP peers, bulk flows.
//!
//! Plain UTF-8, no colours: it is as often read in a pager, a ticket or a
//! chat as in a terminal. A layout of the [`View`]: the words are the view's
//! (already cleaned of control characters); this file decides where they go,
//! wraps them to the width, and draws the bar charts.

mod network;
mod requests;
mod storage;

use std::fmt::Write as _;

use super::episodes::EpisodeState;
use super::model::Report;
use super::view::{self, EpisodeView, Header, View};

/// Rows of the long tables before "and N more".
const TOP_ROWS: usize = 12;

/// The report as text, laid out for `width` columns (at least 60).
pub fn render_text(report: &Report, width: usize) -> String {
    let width = width.clamp(60, 400);
    let v = View::of(report);
    let mut o = String::new();
    header(&mut o, &v.header, width);
    episodes(&mut o, &v, width);
    sessions(&mut o, &v, width);
    requests::requests(&mut o, &v, width);
    storage::storage(&mut o, &v, width);
    network::interfaces(&mut o, &v, width);
    network::peers(&mut o, &v, width);
    network::flows(&mut o, &v, width);
    o.push('\n');
    o.push_str(&wrap(
        &format!(
            "Histogram rows group the log-linear buckets into readable ranges; {}; max is the top bucket's upper edge.",
            view::PERCENTILES_NOTE
        ),
        width,
        "",
        "",
    ));
    o
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

// ---- header ---------------------------------------------------------------

/// Continuation lines align with the text after the 11-column labels.
const LABEL: &str = "           ";

fn header(o: &mut String, h: &Header, width: usize) {
    o.push_str(&wrap(
        &format!("stalltrace report — host {} — {}", h.host, h.identity),
        width,
        "",
        "  ",
    ));
    o.push_str(&wrap(&h.window, width, "window     ", LABEL));
    o.push_str(&wrap(&h.attached(), width, "attached   ", LABEL));
    let more = "             ";
    for note in h.families.iter().filter_map(|f| f.note.as_ref()) {
        o.push_str(&wrap(note, width, LABEL, more));
    }
    for hook in &h.missing_hooks {
        o.push_str(&wrap(hook, width, LABEL, more));
    }
    if let Some(l) = &h.limited_to {
        let _ = writeln!(o, "limited to {l}");
    }
    match &h.losses {
        Some(lost) if lost.serious => o.push_str(&wrap(
            &format!("!! {}", lost.text),
            width,
            "losses     ",
            LABEL,
        )),
        Some(lost) => o.push_str(&wrap(&lost.text, width, "losses     ", LABEL)),
        None => {
            let _ = writeln!(o, "losses     {}", view::LOSSES_NONE);
        }
    }
    if let Some(files) = &h.files {
        o.push_str(&wrap(files, width, "files      ", LABEL));
    }
    if h.stream.is_empty() {
        let _ = writeln!(o, "stream     {}", view::STREAM_COMPLETE);
    }
    for (i, w) in h.stream.iter().enumerate() {
        let first = if i == 0 {
            "stream     !! "
        } else {
            "           !! "
        };
        o.push_str(&wrap(w, width, first, "              "));
    }
    if let Some(kinds) = &h.unknown_types {
        o.push_str(&wrap(kinds, width, LABEL, more));
    }
    for inst in &h.instances {
        o.push_str(&wrap(inst, width, "sql server ", LABEL));
    }
}

// ---- episodes ---------------------------------------------------------------

fn episodes(o: &mut String, v: &View, width: usize) {
    if v.episodes.is_empty() {
        section(o, "STALL EPISODES", width);
        let _ = writeln!(o, "{}", view::NO_STALLS);
        for l in &v.glance {
            o.push_str(&wrap(l, width, "  ", "    "));
        }
        return;
    }
    let n = v.episodes.len();
    section(o, &format!("STALL EPISODES ({n}, ranked by impact)"), width);
    o.push_str(&wrap(view::IMPACT_MEANS, width, "", ""));
    for e in &v.episodes {
        episode(o, e, width);
    }
}

fn episode(o: &mut String, e: &EpisodeView, width: usize) {
    let _ = writeln!(
        o,
        "\n#{} {}: {} — impact {}   (episode {})",
        e.rank, e.kind_words, e.cause_words, e.impact, e.id
    );
    // Continuation lines align with the text after the 10-column labels.
    let (label, rest) = ("   ", "             ");
    let w = &e.when;
    let when = match (w.state, w.note()) {
        (EpisodeState::StillOpen, Some(note)) => format!(
            "{} to the end of the recording, {} and counting: {note}",
            w.start, w.length
        ),
        (_, Some(note)) => format!("{} to {} ({}; {note})", w.start, w.end, w.length),
        (_, None) => format!("{} to {} ({})", w.start, w.end, w.length),
    };
    o.push_str(&wrap(&when, width, &format!("{label}when      "), rest));
    if !e.place.is_empty() {
        o.push_str(&wrap(&e.place, width, &format!("{label}where     "), rest));
    }
    for (i, ev) in e.evidence.iter().enumerate() {
        let first = if i == 0 {
            "evidence  • "
        } else {
            "          • "
        };
        o.push_str(&wrap(
            &ev.text,
            width,
            &format!("{label}{first}"),
            "               ",
        ));
    }
    if !e.next_step.is_empty() {
        o.push_str(&wrap(
            &e.next_step,
            width,
            &format!("{label}next step "),
            rest,
        ));
    }
    if e.sessions_hit > 0 {
        o.push_str(&wrap(
            &format!("{} hit: {}", e.sessions_hit, e.sessions.join("; ")),
            width,
            &format!("{label}sessions  "),
            rest,
        ));
    } else {
        let _ = writeln!(o, "{label}sessions  none known");
    }
    if !e.files.is_empty() {
        o.push_str(&wrap(
            &e.files.join(", "),
            width,
            &format!("{label}files     "),
            rest,
        ));
    }
}

// ---- sessions -----------------------------------------------------------------

fn sessions(o: &mut String, v: &View, width: usize) {
    if v.sessions.is_empty() {
        return;
    }
    section(
        o,
        &format!(
            "SQL SERVER SESSIONS HIT ({}, most time lost first)",
            v.sessions.len()
        ),
        width,
    );
    let mut rows = vec![vec![
        "session".to_string(),
        "client".into(),
        "episodes".into(),
        "in stalls".into(),
        "timeout wait".into(),
        "retransmits".into(),
        "who".into(),
    ]];
    for s in v.sessions.iter().take(TOP_ROWS) {
        let episodes: Vec<String> = s.episodes.iter().map(|(r, _)| format!("#{r}")).collect();
        rows.push(vec![
            s.spid.clone(),
            s.client.clone(),
            if episodes.is_empty() {
                "-".into()
            } else {
                episodes.join(" ")
            },
            s.in_stalls.clone(),
            s.timeout_wait.clone(),
            format!("{} ({} segs)", s.retransmits, s.segments),
            s.who.clone(),
        ]);
    }
    o.push_str(&table(
        &rows,
        &[false, false, false, true, true, true, false],
        2,
    ));
    if v.sessions.len() > TOP_ROWS {
        let _ = writeln!(o, "  ... and {} more", v.sessions.len() - TOP_ROWS);
    }
    o.push_str(&wrap(
        &format!(
            "(in stalls: {}; timeout wait: {})",
            view::IN_STALLS_MEANS,
            view::TIMEOUT_WAIT_MEANS
        ),
        width,
        "  ",
        "   ",
    ));
}
