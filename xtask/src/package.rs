//! `cargo xtask package`: the Debian package (cargo-deb, configured in
//! userspace/Cargo.toml under [package.metadata.deb]) checked by lintian, and
//! the RPM (rpmbuild, packaging/rpm/stalltrace.spec, with Cargo's metadata
//! defined into it) checked by rpmlint. Both ship the release binary and the
//! man pages generated from the command line definition.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde_json::Value;

use crate::util;

/// The release binary and the gzip'd man pages in target/release/man, as
/// both packages take them. Only `prepare` makes one.
pub struct Prepared(());

pub fn prepare() -> anyhow::Result<Prepared> {
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
    Ok(Prepared(()))
}

/// Builds target/debian/stalltrace_VERSION-1_ARCH.deb and returns its path.
pub fn deb(_: &Prepared) -> anyhow::Result<PathBuf> {
    let root = util::workspace_root();
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
    // --no-build: built by prepare(), with the man pages beside it. --strip:
    // the release profile keeps line tables for the benches' profiles; the
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
    said_built(&deb, "lintian: no errors")
}

/// Builds target/rpm/RPMS/ARCH/stalltrace-VERSION-1.ARCH.rpm, checks it (rpmlint, its glibc)
/// and returns its path.
pub fn rpm(_: &Prepared) -> anyhow::Result<PathBuf> {
    let root = util::workspace_root();
    let meta = CargoMetadata::of_stalltrace()?;
    let top = root.join("target/rpm");
    if top.exists() {
        std::fs::remove_dir_all(&top).with_context(|| format!("cannot clear {}", top.display()))?;
    }
    let sources = top.join("SOURCES");
    std::fs::create_dir_all(&sources)?;
    // rpmlint refuses description lines over 79 characters.
    let description = textwrap::fill(&meta.extended_description, 72);
    std::fs::write(sources.join("description"), description + "\n")?;
    let arch = util::output("rpm", &["--eval", "%{_arch}"])
        .context("rpm --eval %{_arch} (run `cargo xtask setup`)")?;
    let defines = [
        ("_topdir", top.to_string_lossy().into_owned()),
        ("stalltrace_root", root.to_string_lossy().into_owned()),
        ("version", meta.version.clone()),
        ("summary", meta.description),
        ("license", meta.license),
        ("url", meta.repository),
        ("packager", meta.maintainer),
    ];
    let mut args = vec!["-bb".to_string(), "--quiet".to_string()];
    for (name, value) in &defines {
        args.push("--define".into());
        args.push(format!("{name} {value}"));
    }
    args.push(
        root.join("packaging/rpm/stalltrace.spec")
            .to_string_lossy()
            .into_owned(),
    );
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    util::run("rpmbuild", &args)?;
    // Named by rpmbuild (the spec's Release carries %{?dist} where the
    // builder defines one): the one package it wrote.
    let written = top.join("RPMS").join(arch.trim());
    let rpms: Vec<PathBuf> = std::fs::read_dir(&written)
        .with_context(|| format!("rpmbuild wrote no {}", written.display()))?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    let [rpm] = rpms.as_slice() else {
        bail!(
            "rpmbuild wrote {} packages in {}, not one",
            rpms.len(),
            written.display()
        );
    };
    // --strict: a warning fails the package too (rpm/rpmlint.toml filters
    // what is meant, each with its reason).
    let config = root.join("packaging/rpm/rpmlint.toml");
    util::run(
        "rpmlint",
        &[
            "--strict",
            "--config",
            &config.to_string_lossy(),
            &rpm.to_string_lossy(),
        ],
    )?;
    glibc_at_most(rpm, GLIBC_FLOOR)?;
    said_built(rpm, "rpmlint --strict: nothing")
}

/// The newest glibc the RPM's distributions all have (RHEL 9: 2.34).
const GLIBC_FLOOR: (u32, u32) = (2, 34);

/// Fails when the binary needs a newer glibc than `floor`: the Debian
/// builder's glibc is newer than RHEL 9's, and a symbol from it would make
/// the RPM uninstallable there (dnf names the missing `libc.so.6(GLIBC_…)`).
fn glibc_at_most(rpm: &Path, floor: (u32, u32)) -> anyhow::Result<()> {
    let requires = util::output(
        "rpm",
        &["--query", "--package", "--requires", &rpm.to_string_lossy()],
    )
    .context("rpm --query --requires")?;
    let newest = requires
        .lines()
        .filter_map(|l| l.split("(GLIBC_").nth(1)?.split(')').next())
        .filter_map(|v| {
            let (major, minor) = v.split_once('.')?;
            Some((
                major.parse::<u32>().ok()?,
                minor.split('.').next()?.parse::<u32>().ok()?,
            ))
        })
        .max()
        .context("the RPM requires no versioned glibc symbol: rpm found no binary in it")?;
    if newest > floor {
        bail!(
            "the binary needs glibc {}.{}, newer than {}.{} (RHEL 9): it would not install there",
            newest.0,
            newest.1,
            floor.0,
            floor.1
        );
    }
    eprintln!(
        "xtask: the binary needs glibc {}.{} (at most {}.{})",
        newest.0, newest.1, floor.0, floor.1
    );
    Ok(())
}

fn said_built(package: &Path, checked: &str) -> anyhow::Result<PathBuf> {
    let size = std::fs::metadata(package)?.len();
    eprintln!(
        "xtask: {} ({} KiB), {checked}",
        package.display(),
        size / 1024
    );
    Ok(package.to_path_buf())
}

/// What both packages say about stalltrace, from `cargo metadata`: the .deb
/// reads the same fields through cargo-deb.
struct CargoMetadata {
    version: String,
    description: String,
    license: String,
    repository: String,
    maintainer: String,
    extended_description: String,
}

impl CargoMetadata {
    fn of_stalltrace() -> anyhow::Result<Self> {
        let json = util::output("cargo", &["metadata", "--no-deps", "--format-version", "1"])
            .context("cargo metadata")?;
        let all: Value = serde_json::from_str(&json).context("cargo metadata's JSON")?;
        let package = all["packages"]
            .as_array()
            .and_then(|p| p.iter().find(|p| p["name"] == "stalltrace"))
            .context("no package stalltrace in cargo metadata")?;
        let text = |value: &Value, what: &str| {
            value
                .as_str()
                .map(str::to_owned)
                .with_context(|| format!("userspace/Cargo.toml has no {what}"))
        };
        let deb = &package["metadata"]["deb"];
        Ok(Self {
            version: text(&package["version"], "version")?,
            description: text(&package["description"], "description")?,
            license: text(&package["license"], "license")?,
            repository: text(&package["repository"], "repository")?,
            maintainer: text(&deb["maintainer"], "package.metadata.deb.maintainer")?,
            extended_description: text(
                &deb["extended-description"],
                "package.metadata.deb.extended-description",
            )?,
        })
    }
}

/// The container image from the .deb, kept in podman's store.
pub fn image(deb: &Path) -> anyhow::Result<()> {
    let tag = format!("localhost/stalltrace:{}", env!("CARGO_PKG_VERSION"));
    let tag = stalltrace_lab::image::Image::build(deb, &tag).keep();
    eprintln!("xtask: image {tag} (podman images; `podman save {tag}` for a registry)");
    Ok(())
}
