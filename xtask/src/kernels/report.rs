//! What one guest said (parsed from its console's STALLTRACE-MATRIX lines),
//! the matrix on stdout, the JSON results file and docs/KERNELS.md.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

use serde_json::{Value, json};

use super::fetch::Kernel;
use super::qemu::{self, Outcome};

const MARKER: &str = "STALLTRACE-MATRIX ";

/// Everything learned from one boot.
pub struct KernelRun {
    pub kernel: Kernel,
    pub checks: Vec<Value>,
    /// Host seconds from QEMU's start to the guest's /init running.
    pub boot_secs: Option<f64>,
    /// Guest uptime when /init ran (kernel boot as the guest saw it).
    pub guest_boot_uptime: Option<f64>,
    /// Named guest phases: (seconds, exit code), from `time` markers.
    pub times: BTreeMap<String, (f64, i32)>,
    pub check_output: Vec<String>,
    pub missing_modules: Vec<String>,
    pub exit: Option<i32>,
    pub outcome: Outcome,
    /// Why this kernel failed as a whole (beyond failed checks).
    pub problems: Vec<String>,
    pub console_log: String,
    /// The first boot crashed before /init and this is the second (see run_one).
    pub early_crash: Option<String>,
}

impl KernelRun {
    /// `expect_checks`: no result line is a failure (not so for an ad-hoc --exec).
    pub fn parse(
        kernel: Kernel,
        outcome: Outcome,
        console_log: &Path,
        expect_checks: bool,
    ) -> KernelRun {
        let mut r = KernelRun {
            kernel,
            checks: Vec::new(),
            boot_secs: None,
            guest_boot_uptime: None,
            times: BTreeMap::new(),
            check_output: Vec::new(),
            missing_modules: Vec::new(),
            exit: None,
            outcome,
            problems: Vec::new(),
            console_log: console_log.display().to_string(),
            early_crash: None,
        };
        for line in &r.outcome.lines {
            // A kernel message may share the line; the marker need not start it.
            let Some(i) = line.text.find(MARKER) else {
                continue;
            };
            let rest = &line.text[i + MARKER.len()..];
            if rest.starts_with('{') {
                match serde_json::from_str::<Value>(rest) {
                    Ok(v) => r.checks.push(v),
                    Err(e) => r
                        .problems
                        .push(format!("unparsable check line ({e}): {rest}")),
                }
                continue;
            }
            let words: Vec<&str> = rest.split_whitespace().collect();
            let num = |i: usize| words.get(i).and_then(|w| w.parse::<f64>().ok());
            match words.first().copied() {
                Some("boot") => {
                    r.boot_secs = Some(line.at);
                    r.guest_boot_uptime = num(1);
                }
                Some("module-missing") => r
                    .missing_modules
                    .extend(words.get(1).map(|w| w.to_string())),
                Some("out") => {
                    let text = rest.splitn(3, ' ').nth(2).unwrap_or("");
                    r.check_output.push(text.to_string());
                }
                Some("time") => {
                    if let (Some(name), Some(t0), Some(t1)) = (words.get(1), num(2), num(3)) {
                        let rc = num(4).map_or(-1, |c| c as i32);
                        r.times.insert(name.to_string(), (t1 - t0, rc));
                    }
                }
                Some("exit") => r.exit = num(1).map(|c| c as i32),
                Some("problem") => r.problems.push(format!("guest: {}", &rest[8..])),
                _ => {}
            }
        }
        let o = &r.outcome;
        if o.timed_out {
            r.problems.push(format!("guest hung: {}", o.qemu_status));
        } else if r.exit.is_none() {
            r.problems.push(format!(
                "guest stopped before the command finished ({})",
                o.qemu_status
            ));
        }
        r.problems
            .extend(o.trouble.iter().map(|t| format!("console: {t}")));
        if r.checks.is_empty() && expect_checks {
            r.problems.push("no check results".into());
        }
        if !r.problems.is_empty() {
            r.problems.push(format!(
                "console tail:\n    {}",
                qemu::tail(&o.lines, 25).join("\n    ")
            ));
        }
        r
    }

    pub fn failed_checks(&self) -> usize {
        self.checks
            .iter()
            .filter(|c| c["verdict"] != "pass")
            .count()
    }

    pub fn ok(&self) -> bool {
        self.problems.is_empty() && self.failed_checks() == 0
    }

    fn secs(&self, name: &str) -> String {
        self.times
            .get(name)
            .map_or("-".into(), |(s, rc)| format!("{s:.1} s (exit {rc})"))
    }

    pub fn json(&self) -> Value {
        json!({
            "kernel": self.kernel.kver,
            "requested": self.kernel.requested,
            "packages": self.kernel.packages,
            "ok": self.ok(),
            "boot_secs": self.boot_secs,
            "guest_boot_uptime": self.guest_boot_uptime,
            "wall_secs": self.outcome.wall,
            "times": self.times.iter().map(|(k, (s, rc))| (k.clone(), json!({"secs": s, "exit": rc}))).collect::<serde_json::Map<_, _>>(),
            "checks": self.checks,
            "stalltrace_check_output": self.check_output,
            "missing_modules": self.missing_modules,
            "problems": self.problems,
            "warnings": self.outcome.warnings,
            "console_log": self.console_log,
            "first_boot_crashed_before_init": self.early_crash,
        })
    }
}

fn s<'a>(v: &'a Value, k: &str) -> &'a str {
    v[k].as_str().unwrap_or("?")
}

/// The matrix: one row per kernel × check × mode, then per-kernel timings and problems.
pub fn print(runs: &[KernelRun]) {
    println!();
    println!(
        "{:<28} {:<22} {:<10} {:<7} {:<5} {:>6}  detail",
        "kernel", "check", "family", "mode", "ok", "secs"
    );
    for r in runs {
        for c in &r.checks {
            let detail: String = s(c, "detail").chars().take(100).collect();
            println!(
                "{:<28} {:<22} {:<10} {:<7} {:<5} {:>6}  {detail}",
                r.kernel.kver,
                s(c, "check"),
                s(c, "family"),
                s(c, "mode"),
                if c["verdict"] == "pass" {
                    "PASS"
                } else {
                    "FAIL"
                },
                c["secs"].as_f64().map_or("-".into(), |x| format!("{x:.1}")),
            );
        }
        if r.checks.is_empty() {
            println!("{:<28} (no results)", r.kernel.kver);
        }
    }
    println!();
    for r in runs {
        println!(
            "{}: {} | boot {} | stalltrace check {} | wall {:.0} s{}",
            r.kernel.kver,
            if r.ok() { "ok" } else { "FAILED" },
            r.boot_secs.map_or("-".into(), |b| format!("{b:.1} s")),
            r.secs("check"),
            r.outcome.wall,
            if r.missing_modules.is_empty() {
                String::new()
            } else {
                format!(" | modules missing: {}", r.missing_modules.join(" "))
            }
        );
        for p in &r.problems {
            println!("  problem: {p}");
        }
        // In full, after the table: CI keeps only the tail of this output, and
        // the table's detail column is cut at 100 characters.
        for c in r.checks.iter().filter(|c| c["verdict"] != "pass") {
            println!(
                "  failed: {} ({}): {}",
                s(c, "check"),
                s(c, "mode"),
                s(c, "detail")
            );
        }
        if let Some(c) = &r.early_crash {
            println!("  note: the first boot crashed before /init and was retried: {c}");
        }
        for w in &r.outcome.warnings {
            println!("  kernel warning: {w}");
        }
    }
}

/// What each hook attached as, per kernel and mode, merged over the checks'
/// `hooks` objects: `tp_btf`, `raw_tp`, `fentry` …, or "no" when it did not attach.
/// (family, hook) → one cell per column.
type HookRows = BTreeMap<(String, String), Vec<String>>;

fn hook_matrix(runs: &[KernelRun]) -> (Vec<String>, HookRows) {
    let mut columns: Vec<String> = Vec::new();
    let mut rows = HookRows::new();
    for r in runs {
        for mode in ["auto", "raw_tp"] {
            let col = columns.len();
            let mut any = false;
            for c in r.checks.iter().filter(|c| c["mode"] == mode) {
                let Some(hooks) = c["hooks"].as_object() else {
                    continue;
                };
                for (name, h) in hooks {
                    any = true;
                    let key = (s(h, "family").to_string(), name.clone());
                    let row = rows.entry(key).or_default();
                    row.resize(col + 1, String::new());
                    let cell = if h["attached"] == true {
                        h["via"].as_str().unwrap_or("yes").to_string()
                    } else {
                        "no".to_string()
                    };
                    // Attached in any check wins over not attached in another.
                    if row[col].is_empty() || row[col] == "no" {
                        row[col] = cell;
                    }
                }
            }
            if any {
                columns.push(format!(
                    "{} {mode}",
                    r.kernel.kver.trim_end_matches("-cloud-amd64")
                ));
            }
        }
    }
    for row in rows.values_mut() {
        row.resize(columns.len(), String::new());
    }
    (columns, rows)
}

fn clip(text: &str, n: usize) -> String {
    let one_line = text.replace('|', "\\|").replace('\n', " ");
    if one_line.chars().count() <= n {
        return one_line;
    }
    format!("{}…", one_line.chars().take(n).collect::<String>())
}

/// docs/KERNELS.md: the table, the date, the exact packages, hooks and times.
pub fn markdown(runs: &[KernelRun], date: &str, command: &str) -> String {
    let mut m = String::new();
    let _ = writeln!(
        m,
        "# Kernel matrix\n\nGenerated by `{command}` on {date}: each Debian cloud kernel booted \
         under QEMU (TCG, 2 vCPUs, 2 GiB, single-threaded TCG on a 2-core host) with a \
         busybox initramfs, its test disk on NVMe; the checks run inside the guest \
         (`stalltrace-kernel-checks`, lab crate). bpffs is not mounted (a fresh host).\n"
    );
    let _ = writeln!(
        m,
        "## Kernels\n\n| kernel | packages | result | boot | `stalltrace check` | wall |\n|---|---|---|---|---|---|"
    );
    for r in runs {
        let _ = writeln!(
            m,
            "| {} | {} | {} | {} | {} | {:.0} s |",
            r.kernel.kver,
            r.kernel
                .packages
                .iter()
                .map(|p| format!("`{p}`"))
                .collect::<Vec<_>>()
                .join("<br>"),
            if r.ok() {
                "pass".to_string()
            } else {
                format!(
                    "**FAIL** ({} checks failed{})",
                    r.failed_checks(),
                    if r.problems.is_empty() {
                        ""
                    } else {
                        "; see Problems"
                    }
                )
            },
            r.boot_secs.map_or("-".into(), |b| format!("{b:.1} s")),
            r.secs("check"),
            r.outcome.wall
        );
    }
    let _ = writeln!(
        m,
        "\n## Checks\n\nEach detail is cut at 300 characters; target/kernels/results.json has them whole.\n\n\
         | kernel | check | family | mode | verdict | secs | detail |\n|---|---|---|---|---|---|---|"
    );
    for r in runs {
        for c in &r.checks {
            let _ = writeln!(
                m,
                "| {} | {} | {} | {} | {} | {} | {} |",
                r.kernel.kver,
                s(c, "check"),
                s(c, "family"),
                s(c, "mode"),
                if c["verdict"] == "pass" {
                    "pass"
                } else {
                    "**FAIL**"
                },
                c["secs"].as_f64().map_or("-".into(), |x| format!("{x:.1}")),
                clip(s(c, "detail"), 300),
            );
        }
    }
    let (columns, rows) = hook_matrix(runs);
    if !columns.is_empty() {
        let _ = writeln!(
            m,
            "\n## Hooks\n\nHow each probe attached, per kernel and `--probe-mode` (from the checks' \
             `hooks`; `no`: not attached, an optional hook the kernel lacks or a failure).\n\n\
             | family | hook | {} |\n|---|---|{}",
            columns.join(" | "),
            "---|".repeat(columns.len())
        );
        for ((family, hook), cells) in &rows {
            let _ = writeln!(m, "| {family} | {hook} | {} |", cells.join(" | "));
        }
    }
    for r in runs {
        if let Some(c) = &r.early_crash {
            let _ = writeln!(
                m,
                "\n**{}**: the first boot crashed before /init (before anything of \
                 stalltrace's ran) and was booted once more: `{c}`",
                r.kernel.kver
            );
        }
    }
    let problems: Vec<&KernelRun> = runs.iter().filter(|r| !r.problems.is_empty()).collect();
    if !problems.is_empty() {
        let _ = writeln!(m, "\n## Problems\n");
        for r in problems {
            let _ = writeln!(
                m,
                "### {}\n\n```\n{}\n```",
                r.kernel.kver,
                r.problems.join("\n")
            );
        }
    }
    let _ = writeln!(m, "\n## `stalltrace check` in each guest\n");
    for r in runs {
        let _ = writeln!(
            m,
            "### {}\n\n```\n{}\n```\n",
            r.kernel.kver,
            r.check_output.join("\n")
        );
    }
    m
}
