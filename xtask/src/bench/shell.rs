//! What every suite does around its measuring, the same for each: a private
//! scratch directory, a quiet host before it begins, a teardown that is
//! checked before any figure is judged, and the section printed and
//! published.

use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::Serialize;

use super::publish;
use super::quiet::{QUIET_BEFORE_SUITE, Quiet};
use super::{peers, tracer};

/// A private directory, removed on drop.
pub struct Scratch {
    dir: PathBuf,
}

impl Scratch {
    /// `{base}/stalltrace-bench-{suite}-{pid}`, where `base` is tmpfs when
    /// there is one (so the daemon's writes cause no disk I/O during a run).
    pub fn on_tmpfs(suite: &str) -> anyhow::Result<Self> {
        let base = if Path::new("/dev/shm").is_dir() {
            "/dev/shm"
        } else {
            "/tmp"
        };
        Self::under(base, suite)
    }

    /// `{base}/stalltrace-bench-{suite}-{pid}`.
    pub fn under(base: &str, suite: &str) -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!(
            "{base}/stalltrace-bench-{suite}-{}",
            std::process::id()
        ));
        // create_dir (not _all) fails if it exists: never adopt someone else's directory.
        fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        Ok(Scratch { dir })
    }

    pub fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if let Err(e) = fs::remove_dir_all(&self.dir) {
            eprintln!("bench: cannot remove {}: {e}", self.dir.display());
        }
    }
}

/// Waits for a quiet host before the suite begins, within the budget; a
/// warning into `warnings` when it never went quiet.
pub fn quiet_before_suite(quiet: &mut Quiet, warnings: &mut Vec<String>) -> anyhow::Result<()> {
    if let Some(why) = quiet.wait(QUIET_BEFORE_SUITE, &[])? {
        let w = format!("the host never went quiet before the suite began: {why}");
        eprintln!("bench: warning: {w}");
        warnings.push(w);
    }
    Ok(())
}

/// What the suite measured, once it has torn down: `leaks` are what it
/// left behind (its own list, then any daemon or peer of this process
/// still running), an error when there is any, said beside the suite's own
/// error when it failed; `cleaned` is said when all went.
pub fn torn_down<M>(
    measured: anyhow::Result<M>,
    mut leaks: Vec<String>,
    cleaned: &str,
) -> anyhow::Result<M> {
    leaks.extend(tracer::our_daemons_left());
    leaks.extend(peers::ours_left());
    if !leaks.is_empty() && measured.is_err() {
        eprintln!("bench: cleanup incomplete: {}", leaks.join("; "));
    }
    let measured = measured?;
    if !leaks.is_empty() {
        bail!("cleanup incomplete: {}", leaks.join("; "));
    }
    eprintln!("bench: cleaned up: {cleaned}");
    Ok(measured)
}

/// Prints the suite's section, and rewrites it and the suite's key in the docs.
pub fn print_and_publish(suite: &str, body: &str, results: &impl Serialize) -> anyhow::Result<()> {
    println!("\n{body}");
    publish::publish(suite, body, serde_json::to_value(results)?)
}
