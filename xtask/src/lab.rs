//! `cargo xtask lab [NAME] [--clean]`: run one of the field cases in the lab
//! (the `stalltrace-lab` crate, shared with the end-to-end tests): set up,
//! build stalltrace and the simulator in release, build the situation with
//! its fault (or without, `--clean`), record it with `stalltrace run`, tear it
//! down, and print stalltrace's own report of the recording and a conclusion.
//! Without a name, list the scenarios.

use std::io::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};

use anyhow::{Context, bail};
use stalltrace_lab::Bins;
use stalltrace_lab::scenario::{self, Fault};

use crate::{setup, util};

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

pub fn lab(name: Option<&str>, clean: bool) -> anyhow::Result<()> {
    let Some(name) = name else {
        list();
        return Ok(());
    };
    let Some(sc) = scenario::find(name) else {
        list();
        bail!("unknown scenario `{name}`");
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "the lab needs root (network namespaces, loop devices, eBPF): run `cargo xtask lab {name}` as root"
        );
    }
    setup::setup()?;
    util::build_release(&["stalltrace", "stalltrace-sim"])?;
    let bins = Bins::beside(util::workspace_root().join("target/release/stalltrace"));
    bins.check();
    // Ctrl-C reaches the scenario's children (same process group): the step
    // that runs fails, and the scenario unwinds through its guards, which
    // remove every namespace, loop device, mount and cgroup. xtask itself only
    // notes it, so it is still there to clean up.
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic (async-signal-safe);
        // children get the default disposition back at exec.
        unsafe { libc::signal(sig, on_signal as *const () as libc::sighandler_t) };
    }
    let fault = if clean { Fault::Clean } else { Fault::Injected };
    eprintln!(
        "xtask: lab `{}`{}: {}",
        sc.name,
        if clean { " (clean)" } else { "" },
        sc.about
    );
    let outcome = std::panic::catch_unwind(|| (sc.run)(&bins, fault));
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; the lab cleaned up after itself");
    }
    let outcome = match outcome {
        Ok(o) => o,
        Err(panic) => {
            let why = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_default();
            bail!("the scenario failed (everything it built is removed): {why}");
        }
    };

    let dir = util::workspace_root().join("target/lab");
    std::fs::create_dir_all(&dir)?;
    let suffix = if clean { "-clean" } else { "" };
    let path = dir.join(format!("{}{suffix}.jsonl", sc.name));
    std::fs::write(&path, &outcome.stream)
        .with_context(|| format!("writing {}", path.display()))?;

    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "== stalltrace run {} (recording: {})\n",
        outcome.args.join(" "),
        path.display()
    )?;
    out.flush()?;
    util::run(
        &bins.stalltrace,
        &["report", &path.to_string_lossy(), "--width", "100"],
    )?;
    writeln!(out, "\n== What the load generators measured\n")?;
    for line in &outcome.figures {
        writeln!(out, "{line}")?;
    }
    writeln!(out, "\n== Conclusion\n\n{}", outcome.conclusion())?;
    if outcome.verdict().is_err() {
        bail!("stalltrace did not conclude what the scenario expects (see above)");
    }
    Ok(())
}

fn list() {
    println!(
        "cargo xtask lab NAME [--clean]: scenarios (each with a fault; --clean runs it without)\n"
    );
    for s in scenario::ALL {
        println!("  {:<12} {}", s.name, s.about);
    }
}
