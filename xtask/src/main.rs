//! `cargo xtask <task>`: the project's commands. Every task that needs tools
//! installs them first (idempotently), so two commands on a fresh machine do
//! all the set-up: `cargo xtask run` and `cargo xtask test`.

mod bench;
mod kernels;
mod lab;
mod package;
mod setup;
mod util;
mod vmlinux;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask")]
struct Cli {
    #[command(subcommand)]
    task: Task,
}

#[derive(Subcommand)]
enum Task {
    /// Install every build and test dependency (apt packages, cargo-nextest); idempotent.
    Setup,
    /// Set up, build (release) and run `stalltrace run` with the given arguments.
    Run {
        /// Arguments for `stalltrace run` (e.g. -- --interval 5s --out /var/log/stalltrace.jsonl)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Set up, check formatting and lints, and run the whole test suite (nextest).
    Test {
        /// Extra arguments for `cargo nextest run` (e.g. a test name filter)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Measure what stalltrace costs: `block` (fio IOPS with and without, ns per event),
    /// `net`, `daemon`, `all`; `soak --minutes N` (not part of `all`: everything at once for N minutes).
    Bench {
        #[arg(default_value = "block")]
        suite: String,
        /// The suite's own options (only `soak` has any: --minutes N, --publish)
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// Run a field case in the lab (root): build it, record it with `stalltrace run`,
    /// print the report and a conclusion. Without a name: list the scenarios.
    Lab {
        /// Scenario: loss, queue-depth, throttle, rtt, backup
        name: Option<String>,
        /// The same load without the fault
        #[arg(long)]
        clean: bool,
    },
    /// Boot Debian cloud kernels under QEMU and run the end-to-end checks in
    /// each: a kernel x check x mode matrix (target/kernels/results.json).
    Kernels(kernels::Opts),
    /// Build the Debian package (target/debian/*.deb: binary, systemd unit,
    /// sysusers, tmpfiles, logrotate, defaults, man pages) and check it with lintian.
    Package {
        /// Also build the container image from it (mmdebstrap, Debian's
        /// packages) and import it into podman as localhost/stalltrace:VERSION.
        #[arg(long)]
        image: bool,
        /// Build the RPM (target/rpm/RPMS/*/*.rpm: the same files, with
        /// /etc/sysconfig/stalltrace for the defaults) and check it with
        /// rpmlint, instead of the .deb (unless --image asks for that too).
        #[arg(long)]
        rpm: bool,
    },
    /// Regenerate ebpf/include/vmlinux.h from this kernel's BTF.
    Vmlinux,
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.task {
        Task::Setup => setup::setup(),
        Task::Run { args } => {
            setup::setup()?;
            util::build_release(&["stalltrace"])?;
            let bin = util::workspace_root().join("target/release/stalltrace");
            let mut full = vec!["run".to_string()];
            full.extend(args);
            util::exec(&bin, &full)
        }
        Task::Test { args } => {
            setup::setup()?;
            util::cargo(&["fmt", "--all", "--", "--check"])?;
            util::cargo(&[
                "clippy",
                "--workspace",
                "--all-targets",
                "--all-features",
                "--",
                "-D",
                "warnings",
            ])?;
            // tests/package.rs installs the packages a user would get.
            let prepared = package::prepare()?;
            let deb = package::deb(&prepared)?;
            let rpm = package::rpm(&prepared)?;
            let static_sqlservr = util::build_static_sqlservr()?;
            // SAFETY: set before any thread or child starts; nextest inherits them.
            unsafe {
                std::env::set_var("STALLTRACE_DEB", &deb);
                std::env::set_var("STALLTRACE_RPM", &rpm);
                std::env::set_var(
                    "STALLTRACE_KUBERNETES_VALIDATE",
                    setup::kubernetes_validate(),
                );
                std::env::set_var("STALLTRACE_ODBC_PYTHON", setup::odbc_python());
                std::env::set_var("STALLTRACE_SQLSERVR_STATIC", &static_sqlservr);
            }
            // e2e: the root-only end-to-end tests (userspace/Cargo.toml says why they are a feature).
            let mut nextest = vec![
                "nextest",
                "run",
                "--workspace",
                "--features",
                "stalltrace/e2e",
                "--no-fail-fast",
            ];
            nextest.extend(args.iter().map(String::as_str));
            util::cargo(&nextest)?;
            kernels::after_tests()
        }
        Task::Bench { suite, args } => {
            setup::setup()?;
            bench::bench(&suite, &args)
        }
        Task::Lab { name, clean } => lab::lab(name.as_deref(), clean),
        Task::Kernels(opts) => {
            setup::setup()?;
            kernels::kernels(&opts)
        }
        Task::Package { image, rpm } => {
            setup::setup()?;
            let prepared = package::prepare()?;
            if rpm {
                package::rpm(&prepared)?;
            }
            if image || !rpm {
                let deb = package::deb(&prepared)?;
                if image {
                    package::image(&deb)?;
                }
            }
            Ok(())
        }
        Task::Vmlinux => vmlinux::regenerate(),
    }
}
