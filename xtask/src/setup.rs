//! Idempotent installation of every build and test dependency.

use std::path::{Path, PathBuf};

use anyhow::bail;

use stalltrace_lab::sql::{MSSQL_PYTHON, Odbc};

use crate::util;

/// Debian packages: build (clang, llvm, libbpf headers, libclang for bindgen),
/// the lab (fio, iproute2, nftables, iperf3, sockperf, tshark, bpftool, bpftrace),
/// chromium, which loads the HTML report headless in tests/report.rs, and what
/// `cargo xtask kernels` boots its guests with.
const APT_PACKAGES: &[&str] = &[
    "clang",
    "llvm",
    "libbpf-dev",
    "libclang-dev",
    "linux-libc-dev",
    "pkg-config",
    "bpftool",
    "bpftrace",
    "fio",
    "iproute2",
    "nftables",
    "iperf3",
    "sockperf",
    "tshark",
    "ethtool",
    "util-linux",
    "e2fsprogs",
    "procps",
    // Loads both CPUs beside the suite: a tracer must hold on a busy host.
    "stress-ng",
    // tests/prometheus.rs: a real Prometheus scrapes `--prometheus`; promtool checks the scrape and the rules.
    "prometheus",
    // tests/shipping.rs: a real rsyslog pair ships `--out` while logrotate rotates it.
    "rsyslog",
    "logrotate",
    "chromium",
    // `cargo xtask kernels`: QEMU, the guest's busybox, kmod's depmod/modprobe,
    // and the initramfs compressor; lz4/xz for module and package formats.
    "qemu-system-x86",
    "busybox-static",
    "kmod",
    "zstd",
    "lz4",
    "xz-utils",
    "binutils",
    "debian-archive-keyring",
    // `cargo xtask package` and tests/package.rs: lintian checks the .deb;
    // mmdebstrap builds the systemd guest (nspawn) and the container image.
    "lintian",
    "mmdebstrap",
    // `cargo xtask package --rpm` and tests/package.rs: rpmbuild builds the
    // RPM, rpmlint checks it, and the guest installs it with rpm.
    "rpm",
    "rpmlint",
    "systemd-container",
    "podman",
    // podman's runtime in tests/package.rs: crun refuses hybrid cgroup hierarchies.
    "runc",
    // The virtual environments kubernetes-validate and mssql-python are
    // installed in (Debian's own Python refuses pip installs outside one).
    "python3-venv",
    // sim/: the openssl crate links the system's libssl (sqlservr's TLS must
    // be in a mapped libssl.so.3, where the tracer's uprobes attach).
    "libssl-dev",
    // sim/README.md: FreeTDS's tsql logs in to the simulator with TLS.
    "freetds-bin",
    // The Microsoft ODBC Driver 18 that mssql-python bundles links Kerberos'
    // GSSAPI (and dlopens libssl, above) from the system.
    "libgssapi-krb5-2",
];

fn installed(package: &str) -> bool {
    util::output("dpkg-query", &["-W", "-f=${Status}", package])
        .is_some_and(|s| s.contains("install ok installed"))
}

pub fn setup() -> anyhow::Result<()> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|p| !installed(p))
        .collect();
    if !missing.is_empty() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            bail!(
                "missing packages {}: run `cargo xtask setup` as root (it installs them with apt-get)",
                missing.join(" ")
            );
        }
        eprintln!("xtask: installing {}", missing.join(" "));
        util::run("apt-get", &["update", "-qq"])?;
        let mut args = vec!["install", "-y", "-qq", "--no-install-recommends"];
        args.extend(&missing);
        // tshark asks whether non-root users may capture; answer non-interactively.
        // SAFETY: setting an environment variable before spawning children, single-threaded.
        unsafe { std::env::set_var("DEBIAN_FRONTEND", "noninteractive") };
        util::run("apt-get", &args)?;
    }
    if util::output("cargo", &["nextest", "--version"]).is_none() {
        eprintln!("xtask: installing cargo-nextest");
        util::cargo(&["install", "cargo-nextest", "--locked"])?;
    }
    // tests/package.rs validates deploy/kubernetes/daemonset.yaml offline
    // against the Kubernetes API's schemas, which this PyPI package carries.
    let validate = kubernetes_validate();
    if util::output(&validate.to_string_lossy(), &["--version"])
        .is_none_or(|v| !v.contains(KUBERNETES_VALIDATE))
    {
        eprintln!("xtask: installing kubernetes-validate {KUBERNETES_VALIDATE}");
        let venv = validate.parent().and_then(Path::parent).unwrap();
        let venv_arg = venv.to_string_lossy().into_owned();
        util::run("python3", &["-m", "venv", &venv_arg])?;
        let spec = format!("kubernetes-validate=={KUBERNETES_VALIDATE}");
        util::run(venv.join("bin/pip"), &["install", "--quiet", &spec])?;
    }
    // The lab and sim/tests/odbc.rs drive the simulator with Microsoft ODBC
    // Driver 18, which this PyPI package bundles (sim/odbc/odbcload.py).
    let python = odbc_python();
    let check = "import importlib.metadata as m; print(m.version('mssql-python'))";
    if util::output(&python.to_string_lossy(), &["-c", check])
        .is_none_or(|v| v.trim() != MSSQL_PYTHON)
    {
        eprintln!("xtask: installing mssql-python {MSSQL_PYTHON}");
        let venv = python.parent().and_then(Path::parent).unwrap();
        let venv_arg = venv.to_string_lossy().into_owned();
        util::run("python3", &["-m", "venv", &venv_arg])?;
        let spec = format!("mssql-python=={MSSQL_PYTHON}");
        util::run(venv.join("bin/pip"), &["install", "--quiet", &spec])?;
    }
    // Pinned: the package layout (debhelper fragments, asset rules) is what
    // tests/package.rs checks.
    if util::output("cargo", &["deb", "--version"]).is_none_or(|v| !v.contains(CARGO_DEB)) {
        eprintln!("xtask: installing cargo-deb {CARGO_DEB}");
        util::cargo(&["install", "cargo-deb", "--locked", "--version", CARGO_DEB])?;
    }
    Ok(())
}

const CARGO_DEB: &str = "3.8.0";
const KUBERNETES_VALIDATE: &str = "1.37.0";

/// kubernetes-validate in a virtual environment of its own under
/// ~/.cache/stalltrace (`cargo xtask test` names it to the tests).
pub fn kubernetes_validate() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    Path::new(&home)
        .join(".cache/stalltrace")
        .join(format!("kubernetes-validate-{KUBERNETES_VALIDATE}"))
        .join("bin/kubernetes-validate")
}

/// The python of mssql-python's virtual environment (the lab's `Odbc` says
/// where; `cargo xtask test` names it to the tests).
pub fn odbc_python() -> PathBuf {
    Odbc::venv().join("bin/python")
}
