//! `cargo xtask bench <suite>`: what stalltrace costs the host.
//!
//! Each suite is one module with a `run()`: it builds its own situation,
//! measures, prints its tables, and rewrites only its own section of
//! docs/BENCHMARKS.md and its own key of docs/benchmarks.json, so suites can be
//! added (net, daemon, ...) and re-run independently without clobbering each
//! other's published figures.

mod block;
mod fio;
mod hostcpu;
mod interrupt;
mod loopdisk;
mod net;
mod netpair;
mod publish;
mod quiet;
mod settings;
mod stats;
mod table;
mod tracer;

use anyhow::bail;

use crate::util;

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
];

pub fn bench(suite: &str) -> anyhow::Result<()> {
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
    util::cargo(&["build", "--release", "-p", "stalltrace"])?;
    interrupt::check()?;
    for s in selected {
        (s.run)()?;
    }
    Ok(())
}
