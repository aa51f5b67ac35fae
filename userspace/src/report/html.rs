//! The report as one self-contained HTML page: inline CSS, inline SVG, a few
//! lines of inline JS (hovering an episode highlights it everywhere), no
//! fetch of any kind, so it can be mailed or attached to a ticket and opened
//! offline.
//!
//! A layout of the [`View`], written with maud templates: every string they
//! splice in is escaped, so host names, process names, paths and DMV fields
//! from the traced host cannot become markup.
//!
//! Stable hooks for tests and scripts: `svg.heatmap` (one per disk op and per
//! interface, with `data-dev`/`data-op` or `data-iface`), `svg.timeline`,
//! `rect.episode` (`id="episode-N"`), `tr.episode-row`, `.episode-band`,
//! `table#sessions`, `body[data-ready="1"]` once the script has run.

mod sections;
mod svg;

use maud::{DOCTYPE, Markup, PreEscaped, html};

use super::episodes::EpisodeState;
use super::model::Report;
use super::view::{self, EpisodeView, Header, View, count};
use svg::TimeAxis;

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
    let v = View::of(report);
    let axis = TimeAxis {
        start_us: v.start_us,
        end_us: v.end_us.max(v.start_us + 1),
    };
    let body = html! {
        (header(&v.header))
        (episodes(&v, axis))
        (sessions(&v))
        (sections::requests(&v, axis))
        (sections::storage(&v, axis))
        (sections::network(&v, axis))
        (sections::peers(&v))
        (sections::flows(&v, axis))
    }
    .into_string();
    // The policy forbids every fetch and every script or style but the page's
    // own (by nonce): even markup that got past the template could load or
    // run nothing.
    let nonce = nonce(&body);
    let policy = format!(
        "default-src 'none'; style-src 'nonce-{nonce}'; script-src 'nonce-{nonce}'; img-src data:; base-uri 'none'; form-action 'none'"
    );
    let page = html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="Content-Security-Policy" content=(policy);
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { "stalltrace report: " (v.header.host) " " (v.header.started) }
                style nonce=(nonce) { (PreEscaped(STYLE)) }
            }
            body data-ready="0" {
                (PreEscaped(body))
                footer {
                    "stalltrace " (env!("CARGO_PKG_VERSION")) " · " (view::PERCENTILES_NOTE)
                    "; heatmap rows are powers of two, colour is count on a log scale"
                }
                script nonce=(nonce) { (PreEscaped(SCRIPT)) }
            }
        }
    };
    page.into_string() + "\n"
}

fn header(h: &Header) -> Markup {
    html! {
        header {
            h1 { "stalltrace report " span class="host" { (h.host) } }
            dl class="run" {
                dt { "window" } dd { (h.window) }
                dt { "host" } dd { (h.identity) }
                dt { "attached" }
                dd {
                    @for (i, f) in h.families.iter().enumerate() {
                        @if i > 0 { ", " }
                        @match &f.note {
                            Some(note) => span title=(note) { (f.label) },
                            None => (f.label),
                        }
                    }
                    @if let Some(note) = h.families_note {
                        @if h.families.is_empty() { (note) } @else { " (" (note) ")" }
                    }
                }
                @for hook in &h.missing_hooks { dt {} dd { (hook) } }
                @if let Some(l) = &h.limited_to { dt { "limited to" } dd { (l) } }
                dt { "losses" }
                @match &h.losses {
                    Some(lost) if lost.serious => dd class="losses bad" { (lost.text) },
                    Some(lost) => dd class="losses minor" { (lost.text) },
                    None => dd class="losses ok" { (view::LOSSES_NONE) },
                }
                @if let Some(files) = &h.files { dt { "files" } dd { (files) } }
                dt { "stream" }
                @if h.stream.is_empty() {
                    dd class="stream ok" { (view::STREAM_COMPLETE) }
                } @else {
                    dd class="stream bad" { ul { @for w in &h.stream { li { (w) } } } }
                }
                @if let Some(kinds) = &h.unknown_types { dt {} dd { (kinds) } }
                @for inst in &h.instances { dt { "SQL Server" } dd { (inst) } }
            }
        }
    }
}

fn episodes(v: &View, axis: TimeAxis) -> Markup {
    html! {
        section id="episodes" {
            h2 { "Stall episodes" }
            @if v.episodes.is_empty() {
                p class="no-stalls" { (view::NO_STALLS) }
                ul class="glance" { @for l in &v.glance { li { (l) } } }
                (svg::timeline(axis, &v.episodes))
            } @else {
                p {
                    (count(v.episodes.len() as u64, "episode", "episodes"))
                    ", ranked by impact. Hover one to find it on every chart."
                    br;
                    small { (view::IMPACT_MEANS) }
                }
                (svg::timeline(axis, &v.episodes))
                table class="episodes" {
                    thead { tr {
                        th { "#" } th { "when" } th { "kind and cause" } th class="num" { "impact" }
                        th { "where" } th { "evidence" } th { "next step" } th { "sessions hit" }
                    } }
                    tbody { @for e in &v.episodes { (episode_row(e)) } }
                }
            }
        }
    }
}

fn episode_row(e: &EpisodeView) -> Markup {
    let w = &e.when;
    let names = html! {
        @for (i, name) in e.sessions.iter().enumerate() { @if i > 0 { br; } (name) }
    };
    html! {
        tr class=(format!("episode-row kind-{}", e.kind)) id=(format!("episode-row-{}", e.id))
            data-episode=(e.id) data-start=(e.start_iso) data-end=(e.end_iso) {
            td { (e.rank) }
            td {
                @match (w.state, w.note()) {
                    (EpisodeState::StillOpen, Some(note)) => {
                        (w.start) " on" br; (w.length) "+ " strong class="still-open" { (note) }
                    }
                    (_, Some(note)) => { (w.start) " to " (w.end) br; (w.length) " " em { "(" (note) ")" } }
                    (_, None) => { (w.start) " to " (w.end) br; (w.length) }
                }
            }
            td { strong { (e.kind_words) } br; (e.cause_words) }
            td class="num" { (e.impact) }
            td {
                (e.place)
                @if !e.files.is_empty() {
                    br; small { @for (i, f) in e.files.iter().enumerate() { @if i > 0 { br; } (f) } }
                }
            }
            td { ul { @for ev in &e.evidence { li title=(ev.detail) { (ev.text) } } } }
            td { (e.next_step) }
            td {
                // A long list folds away: the count is what the table is read for.
                @if e.sessions.is_empty() {
                    "none known"
                } @else if e.sessions.len() > 3 {
                    details { summary { (count(e.sessions_hit, "session", "sessions")) } (names) }
                } @else {
                    (names)
                }
            }
        }
    }
}

fn sessions(v: &View) -> Markup {
    if v.sessions.is_empty() {
        return html! {};
    }
    html! {
        section id="sessions-section" {
            h2 { "SQL Server sessions hit" }
            p {
                "Most time lost first. " em { "In stalls" } ": " (view::IN_STALLS_MEANS) "; "
                em { "timeout wait" } ": " (view::TIMEOUT_WAIT_MEANS) "."
            }
            table id="sessions" class="sessions" {
                thead { tr {
                    th { "session" } th { "client" } th { "who" } th { "episodes" }
                    th class="num" { "in stalls" } th class="num" { "timeout wait" }
                    th class="num" { "retransmits" } th class="num" { "segments" }
                } }
                tbody {
                    @for s in &v.sessions {
                        tr class="session" {
                            td { (s.spid) } td { (s.client) } td { (s.who) }
                            td {
                                @for (i, (rank, id)) in s.episodes.iter().enumerate() {
                                    @if i > 0 { " " }
                                    a href=(format!("#episode-row-{id}")) data-episode=(id) { "#" (rank) }
                                }
                            }
                            td class="num" { (s.in_stalls) } td class="num" { (s.timeout_wait) }
                            td class="num" { (s.retransmits) } td class="num" { (s.segments) }
                        }
                    }
                }
            }
        }
    }
}
