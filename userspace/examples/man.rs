//! Writes the man pages of `stalltrace` and of each subcommand, generated from
//! the command line definition itself so they cannot drift from `--help`:
//! `cargo run --example man -- OUT_DIR` (run by `cargo xtask package`).
//!
//! An example rather than a subcommand or an xtask step: clap_mangen stays a
//! dev-dependency (not in the shipped binary), and xtask does not have to
//! build the eBPF programs just to read the CLI.

use std::path::PathBuf;

use clap::CommandFactory;
use stalltrace::cli::Cli;

fn main() -> anyhow::Result<()> {
    let out = std::env::args_os()
        .nth(1)
        .map(PathBuf::from)
        .ok_or_else(|| anyhow::anyhow!("usage: man OUT_DIR"))?;
    std::fs::create_dir_all(&out)?;
    // `help` is a subcommand only for the shell, not a page of its own.
    let mut cmd = Cli::command().disable_help_subcommand(true);
    cmd.build();
    // One page for the tool (stalltrace.1) and one per subcommand
    // (stalltrace-run.1, ...), the layout git and cargo use.
    clap_mangen::generate_to(cmd, &out)?;
    Ok(())
}
