//! `cargo xtask bench <suite>`: what stalltrace costs the host.
//!
//! Each suite is one module with a `run()`: it builds its own situation,
//! measures, prints its tables, and rewrites only its own section of
//! docs/BENCHMARKS.md and its own key of docs/benchmarks.json, so suites can be
//! added (net, daemon, ...) and re-run independently without clobbering each
//! other's published figures.

mod block;
mod configs;
mod daemon;
mod engine;
mod fio;
mod floor;
mod hostcpu;
mod interrupt;
mod loopdisk;
mod net;
mod netpair;
mod paired;
mod parts;
mod peers;
mod publish;
mod quiet;
mod settings;
mod shell;
mod soak;
mod stats;
mod table;
mod tls;
mod tracer;
mod unitcost;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::{Context, bail};

use crate::util;

/// The stalltrace binary every suite runs: a private copy of the one just
/// built, so that someone else rebuilding target/release in the same tree
/// mid-run (the eBPF programs are being tuned alongside) cannot swap the
/// binary under test between rounds.
static BIN: OnceLock<PathBuf> = OnceLock::new();

pub fn stalltrace_bin() -> PathBuf {
    BIN.get()
        .cloned()
        .unwrap_or_else(|| util::workspace_root().join("target/release/stalltrace"))
}

/// The private copy's directory, removed on drop.
struct BinCopy {
    dir: PathBuf,
}

impl BinCopy {
    fn create() -> anyhow::Result<Self> {
        let dir = PathBuf::from(format!("/tmp/stalltrace-bench-bin-{}", std::process::id()));
        std::fs::create_dir(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let copy = BinCopy { dir };
        let bin = copy.dir.join("stalltrace");
        std::fs::copy(
            util::workspace_root().join("target/release/stalltrace"),
            &bin,
        )
        .context("cannot copy target/release/stalltrace")?;
        let _ = BIN.set(bin);
        Ok(copy)
    }

    fn path(&self) -> &Path {
        &self.dir
    }
}

impl Drop for BinCopy {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(self.path());
    }
}

/// The stalltrace under test, and private copies of the simulator's
/// binaries in `dir` (someone rebuilding target/release mid-run cannot swap
/// the workload).
fn sim_bins(dir: &Path) -> anyhow::Result<stalltrace_lab::Bins> {
    util::build_release(&["stalltrace-sim"])?;
    let release = util::workspace_root().join("target/release");
    let copy = |name: &str| -> anyhow::Result<PathBuf> {
        let to = dir.join(name);
        std::fs::copy(release.join(name), &to)
            .with_context(|| format!("cannot copy target/release/{name}"))?;
        Ok(to)
    };
    Ok(stalltrace_lab::Bins {
        stalltrace: stalltrace_bin(),
        sqlservr: copy("sqlservr")?,
        sqlclient: copy("sqlclient")?,
    })
}

struct Suite {
    name: &'static str,
    run: fn() -> anyhow::Result<()>,
}

/// Every suite `all` runs, in order. A new suite is one module plus one line here.
const SUITES: &[Suite] = &[
    Suite {
        name: "block",
        run: block::run,
    },
    Suite {
        name: "net",
        run: net::run,
    },
    Suite {
        name: "daemon",
        run: daemon::run,
    },
    Suite {
        name: "tls",
        run: tls::run,
    },
];

pub fn bench(suite: &str, args: &[String]) -> anyhow::Result<()> {
    // The soak runs for as long as it is told and builds more than stalltrace,
    // so it has options of its own and is not one of `all`.
    if suite == "soak" {
        return soak::run(args);
    }
    if let Some(arg) = args.first() {
        bail!("`bench {suite}` takes no options (got `{arg}`); only `bench soak` has some");
    }
    let selected: Vec<&Suite> = match suite {
        "all" => SUITES.iter().collect(),
        name => match SUITES.iter().find(|s| s.name == name) {
            Some(s) => vec![s],
            None => {
                let valid: Vec<&str> = SUITES.iter().map(|s| s.name).chain(["all"]).collect();
                bail!(
                    "unknown bench suite `{suite}`; valid suites: {}",
                    valid.join(", ")
                );
            }
        },
    };
    // Installed before anything is spawned, so a Ctrl-C at any point unwinds
    // through the suites' guards instead of killing xtask mid-setup.
    interrupt::install();
    let began = std::time::Instant::now();
    util::build_release(&["stalltrace"])?;
    eprintln!(
        "bench: built stalltrace in {:.0} s",
        began.elapsed().as_secs_f64()
    );
    interrupt::check()?;
    let _bin = BinCopy::create()?;
    let mut took = Vec::new();
    for s in &selected {
        let t = std::time::Instant::now();
        (s.run)()?;
        took.push(format!("{} {:.0} s", s.name, t.elapsed().as_secs_f64()));
    }
    if selected.len() > 1 {
        eprintln!(
            "bench: all suites took {:.0} s in all, build included ({})",
            began.elapsed().as_secs_f64(),
            took.join(", ")
        );
    }
    Ok(())
}
