//! Is the host quiet enough to measure? The kernel is shared: other people's
//! tests attach their own block-layer hooks (another stalltrace, bpftrace) for
//! seconds at a time, and a hook on every I/O in an "untraced" round would
//! make the baseline a lie. bpftool's list of BPF links tells us.

use crate::util;

/// Block-layer BPF links attached right now, e.g. "raw_tracepoint block_rq_issue".
/// Empty when bpftool is missing or fails: then nothing can be said.
pub fn block_links() -> Vec<String> {
    let Some(text) = util::output("bpftool", &["link", "show", "--json"]) else {
        return Vec::new();
    };
    let links: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap_or_default();
    links
        .iter()
        .filter_map(|link| {
            // tp_btf and raw_tp links name their tracepoint in tp_name; other
            // kinds (perf_event, tracing) use other fields, so look at them all.
            let target = link
                .as_object()?
                .values()
                .filter_map(|v| v.as_str())
                .find(|s| s.starts_with("block_") || s.starts_with("block:"))?;
            Some(format!("{} {target}", link["type"].as_str().unwrap_or("?")))
        })
        .collect()
}

/// Why a run may be disturbed, when more block-layer links are attached than
/// the `ours` our own daemon holds (0 in untraced rounds).
pub fn disturbance(ours: usize) -> Option<String> {
    let links = block_links();
    (links.len() > ours).then(|| {
        format!(
            "{} block-layer BPF link(s) not ours were attached ({} in all: {})",
            links.len() - ours,
            links.len(),
            links.join(", ")
        )
    })
}
