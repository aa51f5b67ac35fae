//! The network sections of the terminal report: interfaces (traffic, link,
//! transmit queue wait as a bar chart), TCP peers as a table, bulk flows.

use std::fmt::Write as _;

use super::{TOP_ROWS, section, table, wrap};
use crate::report::bars;
use crate::report::view::{FlowView, IfaceView, LINK_OK, View};

pub(super) fn interfaces(o: &mut String, v: &View, width: usize) {
    if v.interfaces.is_empty() {
        return;
    }
    section(
        o,
        &format!("NETWORK INTERFACES ({})", v.interfaces.len()),
        width,
    );
    for i in &v.interfaces {
        interface(o, i, width);
    }
}

fn interface(o: &mut String, i: &IfaceView, width: usize) {
    o.push('\n');
    o.push_str(&wrap(
        &format!("{}: {}", i.title, i.traffic),
        width,
        "",
        "  ",
    ));
    if let Some(l) = &i.link {
        o.push_str(&wrap(&l.state, width, "  link: ", "        "));
        if l.problems.is_empty() {
            let _ = writeln!(o, "  {LINK_OK}");
        } else {
            o.push_str(&wrap(
                &l.problems.join("; "),
                width,
                "  !! link problems: ",
                "       ",
            ));
        }
    }
    if let Some(t) = &i.driver_trouble {
        let _ = writeln!(o, "  !! {t}");
    }
    if let Some(line) = &i.qdisc_line {
        o.push_str(&wrap(line, width, "  ", "    "));
        o.push_str(&bars::render(&bars::rows(&i.data.qdisc, None), width, 4));
    }
    if !i.timing.is_empty() {
        o.push_str(&wrap(&i.timing.join("; "), width, "  ", "    "));
    }
}

pub(super) fn peers(o: &mut String, v: &View, width: usize) {
    let p = &v.peers;
    if p.rows.is_empty() && p.retransmissions.is_none() {
        return;
    }
    let shown = p.rows.len().min(TOP_ROWS);
    section(
        o,
        &format!("TCP PEERS ({shown} of {}, worst first)", p.rows.len()),
        width,
    );
    let mut rows = vec![vec![
        "connection".to_string(),
        "session".into(),
        "srtt p50".into(),
        "p99".into(),
        "retrans".into(),
        "RTOs".into(),
        "timeout wait".into(),
        "max RTO".into(),
    ]];
    for r in p.rows.iter().take(TOP_ROWS) {
        rows.push(vec![
            r.label.clone(),
            r.session.clone(),
            r.srtt_p50.clone(),
            r.srtt_p99.clone(),
            r.retransmits.clone(),
            r.rtos.clone(),
            r.timeout_wait.clone(),
            r.max_rto.clone(),
        ]);
    }
    o.push_str(&table(
        &rows,
        &[false, false, true, true, true, true, true, true],
        2,
    ));
    if let Some(s) = &p.retransmissions {
        o.push_str(&wrap(s, width, "  ", "    "));
    }
}

pub(super) fn flows(o: &mut String, v: &View, width: usize) {
    if v.flows.is_empty() {
        return;
    }
    section(o, &format!("BULK FLOWS ({})", v.flows.len()), width);
    for f in v.flows.iter().take(TOP_ROWS) {
        flow(o, f, width);
    }
    if v.flows.len() > TOP_ROWS {
        let _ = writeln!(o, "... and {} more", v.flows.len() - TOP_ROWS);
    }
}

fn flow(o: &mut String, f: &FlowView, width: usize) {
    let mut title = f.flow.clone();
    if let Some(sql) = &f.sql {
        let _ = write!(title, " [{sql}]");
    }
    let _ = writeln!(o, "\n{title}");
    o.push_str(&wrap(&f.summary, width, "  ", "    "));
    if !f.shares.is_empty() {
        o.push_str(&wrap(&f.shares.join(", "), width, "  limited by: ", "    "));
        let spans: Vec<&str> = f.spans.iter().map(|s| s.words.as_str()).collect();
        o.push_str(&wrap(&spans.join(" → "), width, "  over time:  ", "    "));
    }
}
