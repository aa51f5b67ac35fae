//! `cli/check`: `stalltrace check` exits 0 and lists its hooks; `stalltrace
//! run` (without `--degrade`) starts with every family attached, each in the
//! mode `check` said it would, and no program past the verifier budget.

use std::collections::BTreeMap;
use std::process::{Command, Output};
use std::time::Instant;

use super::{Judge, Opts, Run};

pub fn check(opts: &Opts, judge: &mut Judge) {
    // `stalltrace check [--probe-mode raw_tp]`.
    let t0 = Instant::now();
    let out = Command::new(&opts.bins.stalltrace)
        .arg("check")
        .args(opts.mode.flags())
        .output();
    let mut checked = BTreeMap::new();
    let mut families = Vec::new();
    match out {
        Err(e) => judge.fail(format!("cannot run stalltrace check: {e}")),
        Ok(out) => {
            if matches!(opts.mode, super::Mode::Auto) {
                say_for_the_matrix(&out, t0.elapsed().as_secs_f64());
            }
            let text = String::from_utf8_lossy(&out.stdout);
            checked = selected_modes(&text);
            families = families_listed(&text);
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

    // `stalltrace run` as a user's first (its slow_io events on, unlike the
    // other checks' runs): every family attached, each hook's way recorded.
    match Run::start_as_default(opts) {
        Err(e) => judge.fail(e),
        Ok(run) => {
            judge.note(format!(
                "start after {:.1} s, kernel {}",
                run.start_secs, run.start["kernel"]
            ));
            // The families are the binary's own (its registry, as `check`
            // lists them), so a new one is held to attach on every kernel.
            judge.expect(!families.is_empty(), || {
                "`stalltrace check` listed no family".to_string()
            });
            let families: Vec<&str> = families.iter().map(String::as_str).collect();
            judge.families_attached(&run.start, &families);
            // Where the kernel reports it (5.16+): every program well inside the verifier's limit.
            let (verified, over) = crate::records::verified_insns(&run.start);
            if !verified.is_empty() {
                judge.note(format!("instructions verified: {}", verified.join(", ")));
            }
            judge.expect(over.is_empty(), || {
                format!(
                    "over the verifier budget of {}: {}",
                    crate::records::VERIFIER_BUDGET,
                    over.join(", ")
                )
            });
            for (family, mode) in &checked {
                let ran = run.start["families"]
                    .as_array()
                    .and_then(|fs| fs.iter().find(|f| f["family"] == family.as_str()))
                    .and_then(|f| f["mode"].as_str())
                    .unwrap_or("none");
                judge.expect(ran == mode, || {
                    format!("{family}: `check` attached it in {mode}, `run` in {ran}")
                });
            }
            if let Err(e) = run.stop() {
                judge.fail(e);
            }
        }
    }
}

/// A plain `stalltrace check`'s output and time, as the kernel matrix's
/// report shows them per guest (its "`stalltrace check`" column and section):
/// this check's run of it stands for a separate one, which would load and
/// verify every family once more.
fn say_for_the_matrix(out: &Output, secs: f64) {
    let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
    for line in text.lines() {
        println!("{}out check {line}", super::PREFIX);
    }
    let rc = out.status.code().unwrap_or(-1);
    println!("{}time check 0 {secs:.1} {rc}", super::PREFIX);
}

/// `stalltrace check`'s verdict and per-family lines (`block for run
/// (--probe-mode auto): 6 hooks attached in raw_tp`, ...), the hooks it lists under them that are not
/// `ok`, and its `sql tls` lines. The lines before the first family
/// (capabilities, stamps) are neither hooks nor families.
fn summarize_check(text: &str) -> String {
    let mut families = Vec::new();
    let mut not_ok = Vec::new();
    let mut tls = Vec::new();
    let mut hooks = 0;
    // The heading the indented lines belong to: a family, `sql tls`, or another.
    let mut family: Option<&str> = None;
    let mut in_tls = false;
    let mut verdict = "no verdict line".to_string();
    for line in text.lines() {
        let indented = line.starts_with(' ');
        let words: Vec<&str> = line.split_whitespace().collect();
        if !indented {
            in_tls = words.starts_with(&["sql", "tls"]);
            family = None;
            if in_tls {
                tls.push(words[2..].join(" "));
            } else if words.first() == Some(&"verdict") {
                verdict = words[1..].join(" ");
            } else if words.len() > 2 && matches!(words[1], "for" | "fallback") {
                family = Some(words[0]);
                families.push(words.join(" "));
            }
        } else if in_tls {
            tls.push(words.join(" "));
        } else if let Some(family) = family {
            if words.len() >= 2 && !line.trim_start().starts_with("tp_btf not") {
                hooks += 1;
                if words[1] != "attached:" {
                    not_ok.push(format!("{family}/{} {}", words[0], words[1..].join(" ")));
                }
            } else if !words.is_empty() {
                families.push(line.trim().to_string());
            }
        }
    }
    let mut s = format!(
        "check: {verdict}; {} ({hooks} hook lines)",
        families.join(", ")
    );
    if !not_ok.is_empty() {
        s.push_str(&format!("; hooks not ok: {}", not_ok.join(", ")));
    }
    if !tls.is_empty() {
        s.push_str(&format!("; sql tls: {}", tls.join(" / ")));
    }
    s
}

/// Each family's mode in `check`'s `for run` lines (`block for run
/// (--probe-mode auto): 6 hooks attached in raw_tp` gives block: raw_tp).
fn selected_modes(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            let attached = line.split_once(" attached in ")?.1;
            (words.get(1) == Some(&"for"))
                .then(|| (words[0].to_string(), attached.trim().to_string()))
        })
        .collect()
}

/// Every family `check` printed a line for, attached or not.
fn families_listed(text: &str) -> Vec<String> {
    text.lines()
        .filter(|line| !line.starts_with(' '))
        .filter_map(|line| {
            let words: Vec<&str> = line.split_whitespace().collect();
            (words.get(1..3) == Some(&["for", "run"][..])).then(|| words[0].to_string())
        })
        .collect()
}

fn last_line(text: &str) -> &str {
    text.lines().last().unwrap_or("")
}

#[cfg(test)]
mod tests {
    use super::{families_listed, selected_modes, summarize_check};

    #[test]
    fn selected_modes_are_the_selected_lines_last_words() {
        let text = "\
block       for run (--probe-mode auto): 6 hooks attached in raw_tp
            tp_btf not usable: invalid func unknown#158
              block_bio_queue              attached: raw tracepoint (raw_tp)
block       fallback (--probe-mode raw_tp): 6 hooks attached in raw_tp
tcp         for run (--probe-mode auto): FAILED: no BTF
tcp         fallback (--probe-mode raw_tp): 5 hooks attached in raw_tp
";
        let modes = selected_modes(text);
        assert_eq!(modes.len(), 1, "{modes:?}");
        assert_eq!(modes["block"], "raw_tp");
        // A family whose selected mode failed is still one `run` must attach.
        assert_eq!(families_listed(text), ["block", "tcp"]);
    }

    #[test]
    fn summary_takes_hooks_under_families_only_and_the_tls_lines() {
        let text = "\
verdict     ready: every family attaches as `run` attaches it (netdev tp_btf, sqlserver tp_btf); no SQL Server runs now
stalltrace  0.1.0
capabilities (the effective set of this process)
  CAP_BPF              yes      every family: loading the eBPF programs
stamps      the kernel's own on each block I/O
              request allocated  rq->start_time_ns: yes
sql tls     uprobes available: SSL_write and SSL_write_ex
            no SQL Server worker runs now: nothing else to try
families    each loaded as `run` loads it (--probe-mode auto), then in raw_tp, the fallback
netdev      for run (--probe-mode auto): 2 hooks attached in tp_btf
              dql_stall_detected           not available (optional): unknown BTF type
              net_dev_xmit                 attached: BTF tracepoint (tp_btf)
sqlserver   for run (--probe-mode auto): 1 hook attached in tp_btf
              tcp_sendmsg_locked           attached: function entry (fentry)
";
        let s = summarize_check(text);
        assert_eq!(
            s,
            "check: ready: every family attaches as `run` attaches it (netdev tp_btf, sqlserver \
             tp_btf); no SQL Server runs now; netdev for run (--probe-mode auto): 2 hooks attached \
             in tp_btf, sqlserver for run (--probe-mode auto): 1 hook attached in tp_btf (3 hook \
             lines); hooks not ok: netdev/dql_stall_detected \
             not available (optional): unknown BTF type; sql tls: uprobes available: SSL_write \
             and SSL_write_ex / no SQL Server worker runs now: nothing else to try"
        );
    }
}
