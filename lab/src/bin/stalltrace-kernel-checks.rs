//! `stalltrace-kernel-checks`: checks, inside a guest booted with another
//! kernel, that stalltrace measures correctly there (see
//! `stalltrace_lab::kernel_checks`). One `STALLTRACE-MATRIX {json}` line per
//! check on stdout, progress on stderr. Exits 0 when the checks ran, whatever
//! their verdicts; 2 on a bad command line, 1 when not root.

use stalltrace_lab::kernel_checks::{Opts, run_all};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let opts = match Opts::parse(&args) {
        Ok(opts) => opts,
        Err(e) => {
            eprintln!("stalltrace-kernel-checks: {e}");
            std::process::exit(2);
        }
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("stalltrace-kernel-checks: needs root (namespaces, eBPF programs)");
        std::process::exit(1);
    }
    let failed = run_all(&opts);
    eprintln!("stalltrace-kernel-checks: done, {failed} check(s) failed");
}
