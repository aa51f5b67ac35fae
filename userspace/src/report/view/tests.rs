//! The two layouts say the same thing: each fact the view words appears, in
//! those words, in the text and in the page.

use serde_json::{Value, json};

use super::View;
use crate::report::fixtures::*;
use crate::report::model::Report;
use crate::report::{render_html, render_text};

/// The text with its line wrapping undone.
fn flat(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// `fact` as the page's template writes it.
fn escaped(fact: &str) -> String {
    maud::html! { (fact) }.into_string()
}

/// Every fact of the header and each episode's figures, in both renderings.
fn assert_both_say_the_same(r: &Report) {
    let v = View::of(r);
    let h = &v.header;
    let mut facts: Vec<String> = vec![
        h.host.clone(),
        h.identity.clone(),
        h.window.clone(),
        h.losses
            .clone()
            .map_or(super::LOSSES_NONE.into(), |l| l.text),
    ];
    facts.extend(h.families.iter().map(|f| f.label.clone()));
    facts.extend(h.families.iter().filter_map(|f| f.note.clone()));
    facts.extend(h.families_note.map(String::from));
    facts.extend(h.missing_hooks.iter().cloned());
    facts.extend(h.limited_to.iter().cloned());
    facts.extend(h.files.iter().cloned());
    facts.extend(h.stream.iter().cloned());
    if h.stream.is_empty() {
        facts.push(super::STREAM_COMPLETE.into());
    }
    facts.extend(h.unknown_types.iter().cloned());
    facts.extend(h.instances.iter().cloned());
    if !v.episodes.is_empty() {
        facts.push(super::IMPACT_MEANS.into());
    }
    for e in &v.episodes {
        facts.extend([
            e.impact.clone(),
            e.kind_words.clone(),
            e.cause_words.clone(),
            e.place.clone(),
            e.next_step.clone(),
            e.when.start.clone(),
            e.when.length.clone(),
        ]);
        facts.extend(e.evidence.iter().map(|ev| ev.text.clone()));
        facts.extend(e.sessions.iter().cloned());
    }
    let text = flat(&render_text(r, 100));
    let page = render_html(r);
    for fact in facts.iter().filter(|f| !f.is_empty()) {
        assert!(
            text.contains(&flat(fact)),
            "{fact:?} not in the text:\n{text}"
        );
        assert!(page.contains(&escaped(fact)), "{fact:?} not in the page");
    }
}

#[test]
fn text_and_page_show_the_same_header_and_episodes() {
    let recorded = recorded_with_episodes().join("\n") + "\n";
    assert_both_say_the_same(&Report::from_text(&recorded).unwrap());

    // Losses in one interval, a fallback and a missing hook, filters, an
    // instance, a record type this version does not know, a cut stream.
    let mut s = start();
    s["filters"] = json!({"ports": [1433], "netns": [], "ifaces": ["eth0"]});
    s["probes"] = json!([{"family": "block", "hook": "block_rq_insert", "mode": "tp_btf",
        "optional": true, "attached": false, "error": "no such tracepoint"}]);
    let records: Vec<Value> = vec![
        s,
        json!({"ts": ts(0.5), "host": HOST, "type": "sql_instance", "pid": 4242,
            "tds_ports": [1433], "ag_ports": [], "files": [], "disk_roles": {"8:0": "log"},
            "container": {"runtime": "cri-o", "id": "2e2222c3a81289eb9bef02d9d669e8d0e12c6b9fa0470ae84110ead8628cfd5d",
                "pod_uid": "0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b", "cgroup": "/kubepods/pod0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b/crio-2e2222c3a81289eb9bef02d9d669e8d0e12c6b9fa0470ae84110ead8628cfd5d"}}),
        block(
            1.0,
            "sda",
            "read",
            json!([[1.024, 1.087, 5]]),
            json!([[2.0, 2.0, 5]]),
        ),
        json!({"ts": ts(1.0), "host": HOST, "type": "lost", "interval_ms": 1000,
            "by_source": {"block.slow_io_ringbuf_full": 1}}),
        json!({"ts": ts(1.5), "host": HOST, "type": "gpu_stall", "dev": "gpu0"}),
        stall(
            1,
            "open",
            2.0,
            1.0,
            None,
            30.0,
            json!([session_tag(51, 50000)]),
        ),
    ];
    let r = Report::from_text(&lines(&records)).unwrap();
    let v = View::of(&r);
    assert_eq!(
        v.header.losses.as_ref().map(|l| l.text.as_str()),
        Some(
            "LOST in 1 interval: block.slow_io_ringbuf_full 1 of 1 slow I/Os (100%): missing from the slow I/O lists; in the histograms"
        )
    );
    assert!(v.header.instances[0].contains("0 client sessions seen"));
    assert!(
        v.header.instances[0].contains(
            "sqlservr pid 4242 in cri-o container 2e2222c3a812 of pod 0f1e2d3c-4b5a-6978-8a9b-0c1d2e3f4a5b,"
        ),
        "{}",
        v.header.instances[0]
    );
    assert_both_say_the_same(&r);
}

#[test]
fn requests_in_flight_are_whole_numbers() {
    // 10 issues with 80 to 83 requests in flight: one bucket, whose values'
    // mean, 81.6, is every percentile.
    let mut records = vec![
        start(),
        block(
            1.0,
            "sda",
            "read",
            json!([[1.024, 1.087, 10]]),
            json!([[80.0, 83.0, 10]]),
        ),
    ];
    records[1]["inflight"]["mean"] = json!(81.6);
    let r = Report::from_text(&lines(&records)).unwrap();
    let v = View::of(&r);
    let inflight = &v.disks[0].ops[0].inflight;
    assert_eq!(inflight.p99, "82", "{inflight:?}");
    assert!(!inflight.percentiles().contains('.'), "{inflight:?}");
}
