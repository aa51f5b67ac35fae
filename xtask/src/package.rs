//! `cargo xtask package`: the Debian package (cargo-deb, configured in
//! userspace/Cargo.toml under [package.metadata.deb]) with man pages generated
//! from the command line definition, checked by lintian.

use std::path::PathBuf;

use anyhow::{Context, bail};

use crate::util;

/// Builds target/debian/stalltrace_VERSION-1_ARCH.deb and returns its path.
pub fn deb() -> anyhow::Result<PathBuf> {
    let root = util::workspace_root();
    util::build_release(&["stalltrace"])?;
    let man = root.join("target/release/man");
    if man.exists() {
        std::fs::remove_dir_all(&man).with_context(|| format!("cannot clear {}", man.display()))?;
    }
    let man_arg = man.to_string_lossy().into_owned();
    // The debug profile: the example links the test dependencies, which the
    // suite builds in debug anyway.
    util::cargo(&[
        "run",
        "--quiet",
        "-p",
        "stalltrace",
        "--example",
        "man",
        "--",
        &man_arg,
    ])?;
    // -n: no name or time stamp in the header, so the same page gives the
    // same bytes (lintian and reproducible builds ask for it).
    let mut gzip = vec!["-9nf"];
    let pages: Vec<String> = std::fs::read_dir(&man)?
        .map(|e| e.map(|e| e.path().to_string_lossy().into_owned()))
        .collect::<Result<_, _>>()?;
    if pages.is_empty() {
        bail!("the man example wrote no page into {}", man.display());
    }
    gzip.extend(pages.iter().map(String::as_str));
    util::run("gzip", &gzip)?;

    // Named here rather than found afterwards: the architecture is the
    // host's (no cross builds), as dpkg names it.
    let arch =
        util::output("dpkg", &["--print-architecture"]).context("dpkg --print-architecture")?;
    let version = env!("CARGO_PKG_VERSION");
    let deb = root.join(format!(
        "target/debian/stalltrace_{version}-1_{}.deb",
        arch.trim()
    ));
    let out_arg = deb.to_string_lossy().into_owned();
    // --no-build: built above, with the man pages beside it. --strip: the
    // release profile keeps line tables for the benches' profiles; the
    // package ships the binary without them (15 MB instead of 70).
    util::cargo(&[
        "deb",
        "-p",
        "stalltrace",
        "--no-build",
        "--strip",
        "--output",
        &out_arg,
    ])?;
    if !deb.is_file() {
        bail!("cargo deb did not write {}", deb.display());
    }
    // Errors fail the package; warnings are printed for whoever reads them.
    util::run(
        "lintian",
        &[
            "--fail-on",
            "error",
            "--tag-display-limit",
            "0",
            &deb.to_string_lossy(),
        ],
    )?;
    let size = std::fs::metadata(&deb)?.len();
    eprintln!(
        "xtask: {} ({} KiB), lintian: no errors",
        deb.display(),
        size / 1024
    );
    Ok(deb)
}

/// The container image from the .deb, kept in podman's store.
pub fn image(deb: &std::path::Path) -> anyhow::Result<()> {
    let tag = format!("localhost/stalltrace:{}", env!("CARGO_PKG_VERSION"));
    let tag = stalltrace_lab::image::Image::build(deb, &tag).keep();
    eprintln!("xtask: image {tag} (podman images; `podman save {tag}` for a registry)");
    Ok(())
}
