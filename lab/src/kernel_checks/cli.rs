//! `cli/check`: `stalltrace check` exits 0 and lists its hooks; `stalltrace
//! run` (without `--degrade`) starts with every family attached.

use std::process::Command;

use super::{Judge, Opts, Run};

/// The families `start` must have attached.
pub const FAMILIES: &[&str] = &["block", "tcp", "netdev", "sqlserver"];

pub fn check(opts: &Opts, judge: &mut Judge) {
    // `stalltrace check [--probe-mode raw_tp]`.
    let out = Command::new(&opts.bins.stalltrace)
        .arg("check")
        .args(opts.mode.flags())
        .output();
    match out {
        Err(e) => judge.fail(format!("cannot run stalltrace check: {e}")),
        Ok(out) => {
            let text = String::from_utf8_lossy(&out.stdout);
            for line in text.lines() {
                eprintln!("kernel-checks:     | {line}");
            }
            judge.note(summarize_check(&text));
            judge.expect(out.status.success(), || {
                format!(
                    "stalltrace check exited with {}: {}",
                    out.status,
                    last_line(&String::from_utf8_lossy(&out.stderr))
                )
            });
        }
    }

    // `stalltrace run`: every family attached, each hook's way recorded.
    match Run::start(opts, &[]) {
        Err(e) => judge.fail(e),
        Ok(run) => {
            judge.note(format!(
                "start after {:.1} s, kernel {}",
                run.start_secs, run.start["kernel"]
            ));
            judge.families_attached(&run.start, FAMILIES);
            if let Err(e) = run.stop() {
                judge.fail(e);
            }
        }
    }
}

/// `stalltrace check`'s per-family lines (`block selected RawTp: 6 hooks
/// attached in raw_tp`, ...) and the hooks it lists that are not `ok`.
fn summarize_check(text: &str) -> String {
    let mut families = Vec::new();
    let mut not_ok = Vec::new();
    let mut hooks = 0;
    let mut family = "";
    for line in text.lines() {
        let indented = line.starts_with(' ');
        let words: Vec<&str> = line.split_whitespace().collect();
        if !indented && words.len() > 2 && matches!(words[1], "selected" | "fallback") {
            family = words[0];
            families.push(words.join(" "));
        } else if indented && words.len() >= 2 && !line.trim_start().starts_with("tp_btf not") {
            hooks += 1;
            if !words[1].starts_with("ok") {
                not_ok.push(format!("{family}/{} {}", words[0], words[1..].join(" ")));
            }
        } else if indented && !words.is_empty() {
            families.push(line.trim().to_string());
        }
    }
    let mut s = format!("check: {} ({hooks} hook lines)", families.join(", "));
    if !not_ok.is_empty() {
        s.push_str(&format!("; hooks not ok: {}", not_ok.join(", ")));
    }
    s
}

fn last_line(text: &str) -> &str {
    text.lines().last().unwrap_or("")
}
