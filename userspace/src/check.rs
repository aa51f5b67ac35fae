//! `stalltrace check`: what this host supports. Attaches every family in the
//! requested mode and in raw_tp (the fallback), reports each hook, and detaches.
//! Also lists the capabilities stalltrace uses, which this process has, and
//! what each missing one costs.

use crate::cli::CheckArgs;
use crate::host;
use crate::probes::{self, HookStatus, ModeChoice};
use crate::sqlserver::inventory::Discovery;
use crate::sqlserver::live::SqlServer;
use crate::sqlserver::tls::TlsPolicy;

/// Prints the report; returns whether everything needed for `run` attached.
pub fn check(args: &CheckArgs) -> bool {
    println!("stalltrace {}", env!("CARGO_PKG_VERSION"));
    println!("kernel      {}", host::kernel::release());
    let btf = host::kernel::has_btf();
    println!(
        "btf         {}",
        if btf {
            format!("yes ({})", host::kernel::VMLINUX_BTF)
        } else {
            "MISSING".into()
        }
    );
    let privileges = host::caps::require_tracing_privileges();
    match &privileges {
        Ok(()) => println!("privileges  ok"),
        Err(e) => println!("privileges  MISSING: {e}"),
    }
    for line in host::caps::report(host::caps::effective(), &host::kernel::release()) {
        println!("{line}");
    }
    println!(
        "bpf stats   {}",
        if host::kernel::bpf_stats_enabled() {
            "on (sysctl kernel.bpf_stats_enabled=1)"
        } else {
            "off (`stalltrace run --bpf-stats` turns them on for the run)"
        }
    );
    match host::btf_names::BtfNames::of_running_kernel() {
        Ok(names) => {
            println!(
                "stamps      the kernel's own on each block I/O (read instead of a hook where kept)"
            );
            for line in crate::block::stamps::report(&names) {
                println!("              {line}");
            }
        }
        Err(e) => println!("stamps      unknown: {e}"),
    }
    let btf = match probes::preflight() {
        Ok(btf) => btf,
        Err(e) => {
            println!("probes      not tried: {e}");
            return false;
        }
    };

    let mut ok = true;
    tls_lines(args, &btf);
    for family in probes::FAMILIES {
        let mut modes = vec![args.probes.probe_mode];
        if args.probes.probe_mode != ModeChoice::RawTp {
            modes.push(ModeChoice::RawTp);
        }
        for (i, mode) in modes.into_iter().enumerate() {
            let label = if i == 0 { "selected" } else { "fallback" };
            let globals = run_defaults(family.name);
            let setup = probes::Setup {
                globals: &globals,
                ..Default::default()
            };
            match probes::attach_family(family, mode, &setup, &btf) {
                Ok(attached) => {
                    println!(
                        "{:<11} {label} {mode:?}: {} hooks attached in {}",
                        family.name,
                        attached.hooks.iter().filter(|h| h.attached).count(),
                        attached.mode.name()
                    );
                    if let Some(why) = &attached.fallback_reason {
                        println!("            tp_btf not usable: {why}");
                    }
                    for h in &attached.hooks {
                        println!("              {:<24} {}", h.hook, hook_state(h));
                    }
                }
                Err(failure) => {
                    ok &= i != 0;
                    println!(
                        "{:<11} {label} {mode:?}: FAILED: {}",
                        family.name, failure.error
                    );
                    for h in &failure.hooks {
                        println!("              {:<24} {}", h.hook, hook_state(h));
                    }
                }
            }
        }
    }
    ok
}

/// The globals a `run` without options loads `family` with. They decide what
/// code the verifier keeps (block's slow_io events call a helper that 5.10
/// has for raw_tp only), so `check` loads the same and sees the same mode.
/// tcp's (no filters) and sqlserver's are their compiled defaults.
fn run_defaults(family: &str) -> Vec<(&'static str, u64)> {
    match family {
        "block" => crate::block::load_globals(crate::cli::slow_io_threshold(
            crate::cli::DEFAULT_SLOW_IO_MS,
        ))
        .to_vec(),
        "netdev" => crate::netdev::load_globals(host::kernel::hz().0).to_vec(),
        _ => Vec::new(),
    }
}

/// SPIDs of encrypted SQL Server sessions: whether the SSL_write uprobes can
/// be attached here, and to each worker running now. Never fails `check`: a
/// host without them still runs everything else.
fn tls_lines(args: &CheckArgs, btf: &aya::Btf) {
    let mode = args.probes.probe_mode;
    match SqlServer::attach(mode, Discovery::default(), TlsPolicy::OnDemand, btf) {
        Ok(mut sql) => {
            for (i, line) in sql
                .check_tls(&crate::host::clock::Clock::now_rfc3339())
                .iter()
                .enumerate()
            {
                let label = if i == 0 { "sql tls" } else { "" };
                println!("{label:<11} {line}");
            }
        }
        Err(failure) => println!(
            "sql tls     not tried: the sqlserver family did not attach: {}",
            failure.error
        ),
    }
}

/// One hook's line: what served it and what it cannot tell, or why nothing could.
fn hook_state(h: &HookStatus) -> String {
    let mut state = match (h.attached, &h.error) {
        (true, _) => format!(
            "ok: {} {}",
            h.via.map_or("?", |v| v.name()),
            h.target.as_deref().unwrap_or("?")
        ),
        (false, Some(e)) if h.optional => format!("not available (optional): {e}"),
        (false, Some(e)) => format!("FAILED ({}): {e}", h.mode.name()),
        (false, None) => "not tried".into(),
    };
    if let Some(why) = &h.fallback_reason {
        state.push_str(&format!(" (instead of the tracepoint: {why})"));
    }
    if let Some(note) = &h.note {
        state.push_str(&format!("; note: {note}"));
    }
    state
}
