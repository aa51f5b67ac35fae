//! Where results go: docs/BENCHMARKS.md and docs/benchmarks.json, each shared
//! by every suite. A suite rewrites only its own part (the text between its
//! markers, its own key), so publishing one suite keeps the others' figures.

use std::collections::BTreeMap;
use std::fs;
use std::path::PathBuf;

use anyhow::{Context, bail};
use serde::Serialize;

use super::stats::Outcome;
use super::table;
use crate::util;

/// The machine a run describes.
#[derive(Serialize, Clone, Debug)]
pub struct Host {
    pub date: String,
    pub kernel: String,
    pub cpu_model: String,
    pub cpus: usize,
}

impl Host {
    /// The first line of every suite's section: when and where it ran.
    pub fn line(&self) -> String {
        format!(
            "- Date: {} · kernel `{}` · CPU: {} ({} CPUs)",
            self.date, self.kernel, self.cpu_model, self.cpus
        )
    }
}

/// The last notes of a suite's section: records the daemons lost over their
/// lives (when any), then one line per warning.
pub fn lost_and_warnings(lost: &BTreeMap<String, u64>, warnings: &[String]) -> String {
    let mut s = String::new();
    if !lost.is_empty() {
        let lost: Vec<String> = lost.iter().map(|(k, v)| format!("{k} {v}")).collect();
        s += &format!(
            "- Lost, as reported by the daemons over their whole lives (every traced run, with and \
             without the accounting): {}.\n",
            lost.join(", ")
        );
    }
    for w in warnings {
        s += &format!("- Warning: {w}.\n");
    }
    s
}

/// A target and how a run fared against it.
#[derive(Serialize)]
pub struct Verdict {
    pub target: String,
    pub measured: String,
    /// Met, missed, or inconclusive (a noisy figure whose 95% interval
    /// straddles the target, or too few rounds for an interval).
    pub outcome: Outcome,
    /// How far inside or outside the target, in words.
    pub detail: String,
}

impl Verdict {
    /// The targets table of a suite's Markdown section.
    pub fn table<'a>(verdicts: impl IntoIterator<Item = &'a Verdict>) -> String {
        let rows: Vec<Vec<String>> = verdicts
            .into_iter()
            .map(|v| {
                vec![
                    v.target.clone(),
                    v.measured.clone(),
                    v.outcome.bold().into(),
                    v.detail.clone(),
                ]
            })
            .collect();
        table::markdown(&["target", "measured", "verdict", "detail"], &rows)
    }
}

impl Host {
    pub fn this() -> Self {
        let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let field = |line: &str| line.split_once(':').map(|(_, v)| v.trim().to_string());
        Host {
            date: util::output("date", &["-u", "+%Y-%m-%d %H:%M UTC"])
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            kernel: fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|s| s.trim().to_string())
                .unwrap_or_default(),
            cpu_model: cpuinfo
                .lines()
                .find(|l| l.starts_with("model name"))
                .and_then(field)
                .unwrap_or_else(|| "unknown".into()),
            cpus: cpuinfo
                .lines()
                .filter(|l| l.starts_with("processor"))
                .count(),
        }
    }
}

/// /proc/loadavg's 1, 5 and 15 minute figures: a busy host shows here.
pub fn load_average() -> String {
    fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

/// "commit abc1234" and, when userspace/ or ebpf/ differ from it, says so:
/// the tree is shared, and a bench builds whatever is in it. Read right after the build.
pub fn source() -> String {
    let git = |args: &[&str]| crate::util::output("git", args).unwrap_or_default();
    let root = crate::util::workspace_root();
    let root = root.to_string_lossy();
    let head = git(&["-C", &root, "rev-parse", "--short", "HEAD"]);
    let dirty = git(&[
        "-C",
        &root,
        "status",
        "--porcelain",
        "--",
        "userspace",
        "ebpf",
    ]);
    format!(
        "commit {}{}",
        head.trim(),
        if dirty.trim().is_empty() {
            String::new()
        } else {
            format!(
                " with uncommitted changes to {} file(s) under userspace/ or ebpf/",
                dirty.lines().count()
            )
        }
    )
}

const INTRO: &str = "# Benchmarks

What stalltrace costs the host it runs on, measured by `cargo xtask bench <suite>`
(`cargo xtask bench all` runs every suite). Each suite rewrites only its own section
of this file (between its `bench:<suite>` markers) and its own key in
[benchmarks.json](benchmarks.json); everything else here is kept, so edit freely
outside the markers.
";

fn docs() -> PathBuf {
    util::workspace_root().join("docs")
}

/// Replace `suite`'s section of docs/BENCHMARKS.md with `body`, and its key of
/// docs/benchmarks.json (under "suites") with `json`.
pub fn publish(suite: &str, body: &str, json: serde_json::Value) -> anyhow::Result<()> {
    let md_path = docs().join("BENCHMARKS.md");
    let old = match fs::read_to_string(&md_path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => INTRO.to_string(),
        Err(e) => return Err(e).context(format!("cannot read {}", md_path.display())),
    };
    let new = replace_section(&old, suite, body)?;

    let json_path = docs().join("benchmarks.json");
    let mut all: serde_json::Value = match fs::read_to_string(&json_path) {
        Ok(text) => serde_json::from_str(&text).with_context(|| {
            format!(
                "{} is not valid JSON; fix or remove it, then re-run",
                json_path.display()
            )
        })?,
        Err(_) => serde_json::json!({}),
    };
    let Some(map) = all.as_object_mut() else {
        bail!("{} is not a JSON object", json_path.display());
    };
    map.insert(
        "about".into(),
        "stalltrace benchmark results, one key per suite under `suites`; written by `cargo xtask bench`".into(),
    );
    let suites = map.entry("suites").or_insert_with(|| serde_json::json!({}));
    let Some(suites) = suites.as_object_mut() else {
        bail!("`suites` in {} is not an object", json_path.display());
    };
    suites.insert(suite.to_string(), json);

    fs::write(&md_path, new).with_context(|| format!("cannot write {}", md_path.display()))?;
    fs::write(&json_path, serde_json::to_string_pretty(&all)? + "\n")
        .with_context(|| format!("cannot write {}", json_path.display()))?;
    eprintln!(
        "bench: wrote {} and {}",
        md_path.display(),
        json_path.display()
    );
    Ok(())
}

/// `doc` with the text between `suite`'s markers replaced by `body`; the
/// section is appended when the markers are absent.
fn replace_section(doc: &str, suite: &str, body: &str) -> anyhow::Result<String> {
    let start = format!("<!-- bench:{suite}:start -->");
    let end = format!("<!-- bench:{suite}:end -->");
    let section = format!("{start}\n{}\n{end}", body.trim_end());
    match (doc.find(&start), doc.find(&end)) {
        (Some(s), Some(e)) if s < e => {
            Ok(format!("{}{section}{}", &doc[..s], &doc[e + end.len()..]))
        }
        (None, None) => Ok(format!("{}\n{section}\n", doc.trim_end())),
        _ => bail!("BENCHMARKS.md has a broken `{suite}` marker pair; fix it by hand"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rewrites_only_its_own_section() {
        let doc = "# B\n\n<!-- bench:net:start -->\nnet v1\n<!-- bench:net:end -->\n";
        let once = replace_section(doc, "block", "block v1\n").unwrap();
        assert!(once.contains("net v1") && once.contains("block v1"));
        let twice = replace_section(&once, "block", "block v2").unwrap();
        assert!(twice.contains("net v1") && twice.contains("block v2"));
        assert!(!twice.contains("block v1"));
        assert_eq!(twice.matches("bench:block:start").count(), 1);
        let net = replace_section(&twice, "net", "net v2").unwrap();
        assert!(net.contains("net v2") && net.contains("block v2") && !net.contains("net v1"));
    }

    #[test]
    fn broken_markers_are_an_error() {
        let doc = "<!-- bench:block:end -->\n<!-- bench:block:start -->\n";
        assert!(replace_section(doc, "block", "x").is_err());
    }

    #[test]
    fn verdicts_table_and_closing_notes() {
        let v = |outcome| Verdict {
            target: "t".into(),
            measured: "1.0".into(),
            outcome,
            detail: "d".into(),
        };
        let table = Verdict::table([
            &v(Outcome::Met),
            &v(Outcome::Missed),
            &v(Outcome::Inconclusive),
        ]);
        assert!(table.starts_with("| target "), "{table}");
        assert!(
            table.contains("**met**")
                && table.contains("**missed**")
                && table.contains("**inconclusive**"),
            "{table}"
        );
        assert_eq!(lost_and_warnings(&BTreeMap::new(), &[]), "");
        let lost = BTreeMap::from([("ring".to_string(), 2), ("tcp".to_string(), 1)]);
        assert_eq!(
            lost_and_warnings(&lost, &["busy host".to_string()]),
            "- Lost, as reported by the daemons over their whole lives (every traced run, with \
             and without the accounting): ring 2, tcp 1.\n- Warning: busy host.\n"
        );
    }
}
