//! `stalltrace run` as a child for one check, with the slow guest's patience:
//! loading and verifying the programs under TCG takes many times the host's
//! time. Unlike the lab's `Tracer`, it returns errors (its stderr's last line)
//! instead of panicking where a check wants to report them.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::Opts;
use crate::util::unique;

/// How long `stalltrace run` may take to write `start` (loading in a TCG guest).
const START_TIMEOUT: Duration = Duration::from_secs(240);
/// How long it may take to stop after SIGINT.
const STOP_TIMEOUT: Duration = Duration::from_secs(120);

/// A running `stalltrace run --out FILE`; killed and its files removed on drop.
pub struct Run {
    child: Option<Child>,
    out: PathBuf,
    stderr: PathBuf,
    /// Its `start` record.
    pub start: Value,
    /// How long it took to write `start`.
    pub start_secs: f64,
}

impl Run {
    /// `stalltrace run --out FILE --interval 1s --slow-io-ms 0 <mode flags> <args>`,
    /// once its `start` record is written.
    pub fn start(opts: &Opts, args: &[&str]) -> Result<Self, String> {
        Self::start_with(opts, &["--interval", "1s", "--slow-io-ms", "0"], args)
    }

    /// `stalltrace run --out FILE <mode flags>`: every other setting at its
    /// default, as a user's first run has them.
    pub fn start_as_default(opts: &Opts) -> Result<Self, String> {
        Self::start_with(opts, &[], &[])
    }

    pub fn start_with(opts: &Opts, settings: &[&str], args: &[&str]) -> Result<Self, String> {
        Self::start_with_env(opts, settings, args, &[])
    }

    /// [`Run::start_with`] with `env` set for stalltrace (its fault injection).
    pub fn start_with_env(
        opts: &Opts,
        settings: &[&str],
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Result<Self, String> {
        let out = std::env::temp_dir().join(format!("{}.jsonl", unique("kernel-checks")));
        let stderr = out.with_extension("stderr");
        let t0 = Instant::now();
        let child = Command::new(&opts.bins.stalltrace)
            .arg("run")
            .arg("--out")
            .arg(&out)
            .args(settings)
            .args(opts.mode.flags())
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).map_err(|e| format!("{e}"))?)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", opts.bins.stalltrace.display()))?;
        let mut run = Self {
            child: Some(child),
            out,
            stderr,
            start: Value::Null,
            start_secs: 0.0,
        };
        eprintln!("kernel-checks:   stalltrace run {args:?}");
        loop {
            if let Some(first) = run.whole_lines().into_iter().next() {
                if first["type"] == "start" {
                    run.start = first;
                    run.start_secs = t0.elapsed().as_secs_f64();
                    return Ok(run);
                }
                return Err(format!("first record is not `start`: {first}"));
            }
            if let Some(status) = run.child.as_mut().unwrap().try_wait().unwrap() {
                return Err(format!(
                    "stalltrace run exited before its start record ({status}): {}",
                    run.stderr_tail()
                ));
            }
            if t0.elapsed() > START_TIMEOUT {
                return Err(format!(
                    "no start record after {START_TIMEOUT:?}: {}",
                    run.stderr_tail()
                ));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The records written so far (whole lines only).
    fn whole_lines(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        whole
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// Wait until a record satisfies `what`.
    pub fn wait_for(
        &mut self,
        timeout: Duration,
        what: impl Fn(&Value) -> bool,
    ) -> Result<Value, String> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(found) = self.whole_lines().into_iter().find(|v| what(v)) {
                return Ok(found);
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return Err(format!(
                    "stalltrace run exited ({status}): {}",
                    self.stderr_tail()
                ));
            }
            if Instant::now() > deadline {
                return Err(format!("no such record within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The last lines of its stderr (its error line is the last).
    pub fn stderr_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.stderr).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(3)..].join(" | ")
    }

    /// SIGINT, wait for a clean exit, and return every record. A record that
    /// is not JSON, a non-zero exit or a missing `stop` is an error.
    pub fn stop(mut self) -> Result<Vec<Value>, String> {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
        let deadline = Instant::now() + STOP_TIMEOUT;
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("stalltrace did not stop within {STOP_TIMEOUT:?}"));
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        if !status.success() {
            return Err(format!(
                "stalltrace run exited with {status}: {}",
                self.stderr_tail()
            ));
        }
        let text = std::fs::read_to_string(&self.out).map_err(|e| format!("{e}"))?;
        let mut records = Vec::new();
        for (n, line) in text.lines().enumerate() {
            records.push(
                serde_json::from_str::<Value>(line)
                    .map_err(|e| format!("line {} is not JSON ({e}): {line}", n + 1))?,
            );
        }
        if records.last().is_none_or(|r| r["type"] != "stop") {
            return Err("the stream does not end with `stop`".into());
        }
        Ok(records)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        crate::util::kill_and_remove(self.child.take(), &[&self.out, &self.stderr]);
    }
}

/// Losses by source (`family.what`) summed over the `lost` records, split into
/// those of `family` (which fail its check: that family's figures are short)
/// and the others (reported in the detail: another family's loss does not
/// make this one's figures wrong).
pub fn lost_by_family(records: &[Value], family: &str) -> (Vec<String>, Vec<String>) {
    let mut sums: std::collections::BTreeMap<String, u64> = Default::default();
    for r in records.iter().filter(|r| r["type"] == "lost") {
        if let Some(by) = r["by_source"].as_object() {
            for (source, n) in by {
                *sums.entry(source.clone()).or_default() += n.as_u64().unwrap_or(0);
            }
        }
    }
    let prefix = format!("{family}.");
    sums.into_iter()
        .map(|(source, n)| (source.starts_with(&prefix), format!("{source} {n}")))
        .fold(
            (Vec::new(), Vec::new()),
            |(mut own, mut other), (is_own, line)| {
                if is_own {
                    own.push(line)
                } else {
                    other.push(line)
                }
                (own, other)
            },
        )
}
