//! Process helpers for xtask.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, bail};

pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Run a command to completion in the workspace root; fail if it fails.
pub fn run(program: impl AsRef<Path>, args: &[&str]) -> anyhow::Result<()> {
    let program = program.as_ref();
    // Its stdout goes to stderr: stdout is a task's result (`cargo xtask run`
    // streams JSON there after its setup ran apt-get), never a tool's chatter.
    let status = Command::new(program)
        .args(args)
        .current_dir(workspace_root())
        .stdout(std::io::stderr())
        .status()
        .with_context(|| format!("cannot start {}", program.display()))?;
    if !status.success() {
        bail!("{} {} failed ({status})", program.display(), args.join(" "));
    }
    Ok(())
}

/// `cargo build --release` of these workspace packages.
pub fn build_release(packages: &[&str]) -> anyhow::Result<()> {
    let mut args = vec!["build", "--release"];
    for p in packages {
        args.extend(["-p", p]);
    }
    cargo(&args)
}

/// The simulator's `sqlservr` linked statically against Debian's libssl.a
/// (in target/sim-static, beside the usual build): a worker that maps no
/// libssl, for tests/sqltls.rs. openssl-sys asks pkg-config otherwise, which
/// never links a library from /usr statically, hence the explicit paths.
pub fn build_static_sqlservr() -> anyhow::Result<PathBuf> {
    let target = workspace_root().join("target/sim-static");
    let status = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
        .args([
            "build",
            "--release",
            "-p",
            "stalltrace-sim",
            "--bin",
            "sqlservr",
        ])
        .arg("--target-dir")
        .arg(&target)
        .env("OPENSSL_STATIC", "1")
        .env("OPENSSL_LIB_DIR", "/usr/lib/x86_64-linux-gnu")
        .env("OPENSSL_INCLUDE_DIR", "/usr/include")
        .status()
        .context("cannot run cargo")?;
    anyhow::ensure!(status.success(), "the static build of sqlservr failed");
    Ok(target.join("release/sqlservr"))
}

pub fn cargo(args: &[&str]) -> anyhow::Result<()> {
    run(
        std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()),
        args,
    )
}

/// Output of a command, or None if it cannot run or fails.
pub fn output(program: &str, args: &[&str]) -> Option<String> {
    let out = Command::new(program).args(args).output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Replace this process with `program` (so signals reach it directly).
pub fn exec(program: &Path, args: &[String]) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let err = Command::new(program).args(args).exec();
    Err(err).with_context(|| format!("cannot run {}", program.display()))
}
