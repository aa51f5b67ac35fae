//! The page's evidence sections: per disk op and per interface a heatmap and
//! a table of percentiles, TCP peers, bulk flows with their limiter strip.

use maud::{Markup, html};

use super::svg::{self, Column, Subject, TimeAxis};
use crate::report::merge::Unit;
use crate::report::view::{self, EpisodeView, LIMITERS, LINK_OK, Stats, View};

/// A host with thousands of connections: the worst are the ones to read.
const PEERS_SHOWN: usize = 50;

/// Episodes for a chart's bands: `own` when the episode is about this disk,
/// interface or instance.
fn bands<'v>(v: &'v View, own: impl Fn(&EpisodeView) -> bool) -> Vec<(&'v EpisodeView, bool)> {
    v.episodes.iter().map(|e| (e, own(e))).collect()
}

/// A table of histograms, one row each: count, mean, p50, p90, p99, max.
fn stats_table(rows: &[(&str, &Stats)]) -> Markup {
    html! {
        table class="stats" {
            thead { tr {
                th {} th class="num" { "count" } th class="num" { "mean" } th class="num" { "p50" }
                th class="num" { "p90" } th class="num" { "p99" } th class="num" { "max" }
            } }
            tbody {
                @for (name, s) in rows {
                    tr {
                        th { (name) }
                        td class="num" { (s.count) } td class="num" { (s.mean) }
                        td class="num" { (s.p50) } td class="num" { (s.p90) }
                        td class="num" { (s.p99) } td class="num" { (s.max) }
                    }
                }
            }
        }
    }
}

pub fn storage(v: &View, axis: TimeAxis) -> Markup {
    if v.disks.is_empty() {
        return html! {};
    }
    html! {
        section id="storage" {
            h2 { "Storage" }
            @for d in &v.disks {
                article class="disk" data-dev=(d.dev) {
                    h3 {
                        (d.dev)
                        @if let Some(n) = &d.devno { " " small { "(" (n) ")" } }
                        @if let Some(r) = &d.role { " " span class="role" { (r) } }
                    }
                    p class="limits" { (d.limits.join(", ")) }
                    @for op in d.ops.iter().filter(|op| op.data.latency.count() > 0) {
                        @let title = format!("{} {} latency over time", d.dev, op.op);
                        @let columns: Vec<Column> = op.data.series.iter().map(|p| Column {
                            ts_us: p.ts_us,
                            interval_ms: p.interval_ms,
                            buckets: &p.latency,
                        }).collect();
                        h4 { (d.dev) " " (op.op) ": " (op.traffic) }
                        figure {
                            (svg::heatmap(
                                &title,
                                op.data.latency.unit(),
                                axis,
                                &columns,
                                &bands(v, |e| e.dev.as_deref() == Some(d.dev.as_str())),
                                Subject::Disk { dev: &d.dev, op: &op.op },
                            ))
                            figcaption { (title) " — latency (bio submitted to completed) per interval" }
                        }
                        @let [tag_wait, queue, device] = &op.phases;
                        (stats_table(&[
                            ("latency", &op.latency),
                            (tag_wait.0, &tag_wait.1),
                            (queue.0, &queue.1),
                            (device.0, &device.1),
                            ("in flight", &op.inflight),
                        ]))
                    }
                    @if let Some(slow) = &d.slow {
                        p { (slow.heading) }
                        ul class="slow-io" { @for s in &slow.slowest { li { (s) } } }
                    }
                }
            }
        }
    }
}

pub fn network(v: &View, axis: TimeAxis) -> Markup {
    if v.interfaces.is_empty() {
        return html! {};
    }
    html! {
        section id="network" {
            h2 { "Network interfaces" }
            @for i in &v.interfaces {
                article class="iface" data-iface=(i.iface) {
                    h3 { (i.iface) @if let Some(n) = &i.netns { " " small { "(" (n) ")" } } }
                    p { (i.traffic) }
                    @if let Some(l) = &i.link {
                        p class="link" { "link: " (l.state) }
                        @if l.problems.is_empty() {
                            p class="link-ok" { (LINK_OK) }
                        } @else {
                            p class="link-bad" { "link problems: " (l.problems.join("; ")) }
                        }
                    }
                    @if let Some(t) = &i.driver_trouble { p class="link-bad" { (t) } }
                    @if i.data.qdisc.count() > 0 {
                        @let title = format!("{} transmit queue wait over time", i.iface);
                        @let columns: Vec<Column> = i.data.series.iter().map(|p| Column {
                            ts_us: p.ts_us,
                            interval_ms: p.interval_ms,
                            buckets: &p.qdisc,
                        }).collect();
                        figure {
                            (svg::heatmap(
                                &title,
                                i.data.qdisc.unit(),
                                axis,
                                &columns,
                                &bands(v, |e| e.iface.as_deref() == Some(i.iface.as_str())),
                                Subject::Iface(&i.iface),
                            ))
                            figcaption { (title) " — qdisc wait per interval" }
                        }
                    }
                    @let rx_label = format!("receive path (1 in {})", crate::abi::NETDEV_RX_SAMPLE);
                    (stats_table(&[
                        ("qdisc wait", &i.qdisc),
                        ("driver transmit", &i.xmit),
                        (rx_label.as_str(), &i.rx),
                    ]))
                }
            }
        }
    }
}

pub fn peers(v: &View) -> Markup {
    let p = &v.peers;
    if p.rows.is_empty() {
        return html! {};
    }
    html! {
        section id="peers" {
            h2 { "TCP peers" }
            @if let Some(s) = &p.retransmissions { p { (s) } }
            table class="peers" {
                thead { tr {
                    th { "connection" } th { "session" } th class="num" { "srtt p50" }
                    th class="num" { "p99" } th class="num" { "max" } th class="num" { "retransmits" }
                    th class="num" { "RTOs" } th class="num" { "timeout wait" }
                } }
                tbody {
                    @for r in p.rows.iter().take(PEERS_SHOWN) {
                        tr class="peer" {
                            td { (r.label) } td { (r.session) }
                            td class="num" { (r.srtt_p50) } td class="num" { (r.srtt_p99) }
                            td class="num" { (r.srtt_max) } td class="num" { (r.retransmits) }
                            td class="num" { (r.rtos) } td class="num" { (r.timeout_wait) }
                        }
                    }
                }
            }
            @if p.rows.len() > PEERS_SHOWN {
                p {
                    "... and " (p.rows.len() - PEERS_SHOWN)
                    " more peers, with fewer retransmissions and a shorter RTT tail."
                }
            }
        }
    }
}

pub fn flows(v: &View, axis: TimeAxis) -> Markup {
    if v.flows.is_empty() {
        return html! {};
    }
    html! {
        section id="flows" {
            h2 { "Bulk flows" }
            p class="legend" {
                "limited by: "
                @for (key, words) in LIMITERS { span class=(format!("limiter-{key}")) { (words) } " " }
                "; the line is the send rate"
            }
            @for f in &v.flows {
                article class="bulk-flow" data-flow=(f.flow) {
                    h3 { (f.flow) @if let Some(sql) = &f.sql { " " small { (sql) } } }
                    p {
                        (f.summary)
                        @if !f.shares.is_empty() { "; limited by " (f.shares.join(", ")) }
                    }
                    (svg::flow_strip(axis, f))
                }
            }
        }
    }
}

/// SQL Server requests: per instance what the clients waited for, its split,
/// and the slowest requests.
pub(super) fn requests(v: &View, axis: TimeAxis) -> Markup {
    if v.requests.is_empty() {
        return html! {};
    }
    html! {
        section id="requests-section" {
            h2 { "SQL Server requests" }
            p { em { "Total" } ": " (view::TOTAL_MEANS) "." }
            @for r in &v.requests {
                h3 { (r.instance) ": " (r.requests) }
                @let title = format!("{} request latency over time", r.instance);
                @let columns: Vec<Column> = r.series.iter().map(|p| Column {
                    ts_us: p.ts_us,
                    interval_ms: p.interval_ms,
                    buckets: &p.total,
                }).collect();
                figure {
                    (svg::heatmap(
                        &title,
                        Unit::Micros,
                        axis,
                        &columns,
                        &bands(v, |e| e.worker_pid == Some(r.pid)),
                        Subject::Instance(r.pid),
                    ))
                    figcaption { (title) " — what the clients waited for (total) per interval" }
                }
                table class="requests" {
                    thead { tr {
                        th { "" } th class="num" { "p50" } th class="num" { "p90" }
                        th class="num" { "p99" } th class="num" { "max" } th class="num" { "mean" }
                    } }
                    tbody {
                        @for (name, s) in [("total", &r.total), ("server", &r.server), ("delivery", &r.delivery)] {
                            tr {
                                td { (name) } td class="num" { (s.p50) } td class="num" { (s.p90) }
                                td class="num" { (s.p99) } td class="num" { (s.max) } td class="num" { (s.mean) }
                            }
                        }
                    }
                }
                p { (r.split) ". " (r.slow) "." }
                @for w in r.without_spid.iter().chain(&r.mars) { p { (w) "." } }
                @if !r.slowest.is_empty() {
                    details { summary { "slowest requests" }
                        ul { @for s in &r.slowest { li { (s) } } }
                    }
                }
            }
        }
    }
}
