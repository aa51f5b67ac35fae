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

/// Prints the report, its verdict first; returns whether everything needed
/// for `run` attached.
pub fn check(args: &CheckArgs) -> bool {
    let mut out = Vec::new();
    let verdict = findings(args, &mut out);
    println!("verdict     {verdict}");
    for line in out {
        println!("{line}");
    }
    verdict.starts_with("ready")
}

/// Writes the report's lines to `out`; returns the verdict: whether `run`
/// can do its job here and whether a SQL Server runs.
fn findings(args: &CheckArgs, out: &mut Vec<String>) -> String {
    out.push(format!("stalltrace  {}", env!("CARGO_PKG_VERSION")));
    out.push(format!("kernel      {}", host::kernel::release()));
    let btf = host::kernel::has_btf();
    out.push(format!(
        "btf         {}",
        if btf {
            format!("yes ({})", host::kernel::VMLINUX_BTF)
        } else {
            "MISSING".into()
        }
    ));
    let privileges = host::caps::require_tracing_privileges();
    match &privileges {
        Ok(()) => out.push("privileges  ok".into()),
        Err(e) => out.push(format!("privileges  MISSING: {e}")),
    }
    out.extend(host::caps::report(
        host::caps::effective(),
        &host::kernel::release(),
    ));
    out.push(format!(
        "bpf stats   {}",
        if host::kernel::bpf_stats_enabled() {
            "on (sysctl kernel.bpf_stats_enabled=1)"
        } else {
            "off (`stalltrace run --bpf-stats` turns them on for the run)"
        }
    ));
    match host::btf_names::BtfNames::of_running_kernel() {
        Ok(names) => {
            out.push(
                "stamps      the kernel's own on each block I/O (read instead of a hook where kept)"
                    .into(),
            );
            for line in crate::block::stamps::report(&names) {
                out.push(format!("              {line}"));
            }
        }
        Err(e) => out.push(format!("stamps      unknown: {e}")),
    }
    let btf = match probes::preflight() {
        Ok(btf) => btf,
        Err(e) => {
            out.push(format!("probes      not tried: {e}"));
            return format!("NOT READY: {e}");
        }
    };

    let sql_workers = tls_lines(args, &btf, out);
    let requested = args.probes.probe_mode;
    out.push(format!(
        "families    each loaded as `run` loads it (--probe-mode {}), then in raw_tp, the fallback",
        mode_flag(requested)
    ));
    let mut attached_as = Vec::new();
    let mut failed = Vec::new();
    for family in probes::FAMILIES {
        let mut modes = vec![requested];
        if requested != ModeChoice::RawTp {
            modes.push(ModeChoice::RawTp);
        }
        for (i, mode) in modes.into_iter().enumerate() {
            let label = if i == 0 { "for run" } else { "fallback" };
            let globals = run_defaults(family.name);
            // As `run` prepares it, so that what loads here is what `run` loads.
            let block_tail = |ebpf: &mut aya::Ebpf| crate::block::prepare::fill_tail(ebpf, &btf);
            let setup = probes::Setup {
                globals: &globals,
                before_attach: (family.name == "block").then_some(&block_tail as _),
                ..Default::default()
            };
            match probes::attach_family(family, mode, &setup, &btf) {
                Ok(attached) => {
                    let n = attached.hooks.iter().filter(|h| h.attached).count();
                    out.push(format!(
                        "{:<11} {label} (--probe-mode {}): {} attached in {}",
                        family.name,
                        mode_flag(mode),
                        if n == 1 {
                            "1 hook".into()
                        } else {
                            format!("{n} hooks")
                        },
                        attached.mode.name()
                    ));
                    if i == 0 {
                        attached_as.push(format!("{} {}", family.name, attached.mode.name()));
                    }
                    if let Some(why) = &attached.fallback_reason {
                        out.push(format!("            tp_btf not usable: {why}"));
                    }
                    for h in &attached.hooks {
                        out.push(format!("              {:<28} {}", h.hook, hook_state(h)));
                    }
                }
                Err(failure) => {
                    if i == 0 {
                        failed.push(family.name);
                    }
                    out.push(format!(
                        "{:<11} {label} (--probe-mode {}): FAILED: {}",
                        family.name,
                        mode_flag(mode),
                        failure.error
                    ));
                    for h in &failure.hooks {
                        out.push(format!("              {:<28} {}", h.hook, hook_state(h)));
                    }
                }
            }
        }
    }
    let sql = match sql_workers.as_slice() {
        [] => "no SQL Server runs now (`run` finds one that starts later)".to_string(),
        [pid] => format!("SQL Server found: sqlservr pid {pid}"),
        pids => format!(
            "SQL Server found: sqlservr pids {}",
            pids.iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    };
    match (&privileges, failed.is_empty()) {
        (Err(e), _) => format!("NOT READY: {e}; {sql}"),
        (Ok(()), true) => format!(
            "ready: every family attaches as `run` attaches it ({}); {sql}",
            attached_as.join(", ")
        ),
        (Ok(()), false) => format!(
            "NOT READY: {} cannot attach (below; `run --degrade` traces without them); {sql}",
            failed.join(", ")
        ),
    }
}

/// The globals a `run` without options loads `family` with. They decide what
/// code the verifier keeps (block's slow_io events call a helper that 5.10
/// has for raw_tp only), so `check` loads the same and sees the same mode.
/// tcp's (no filters) are its compiled defaults.
fn run_defaults(family: &str) -> Vec<(&'static str, u64)> {
    match family {
        "block" => crate::block::load_globals(
            crate::cli::slow_io_threshold(crate::cli::DEFAULT_SLOW_IO_MS),
            0,
        )
        .to_vec(),
        "netdev" => crate::netdev::load_globals(host::kernel::hz().0).to_vec(),
        "sqlserver" => crate::sqlserver::load_globals().to_vec(),
        _ => Vec::new(),
    }
}

/// SPIDs of encrypted SQL Server sessions: whether the SSL_write uprobes can
/// be attached here, and to each worker running now. Never fails `check`: a
/// host without them still runs everything else.
fn tls_lines(args: &CheckArgs, btf: &aya::Btf, out: &mut Vec<String>) -> Vec<u32> {
    let mode = args.probes.probe_mode;
    match SqlServer::attach(mode, Discovery::default(), TlsPolicy::OnDemand, btf) {
        Ok(mut sql) => {
            let lines = sql.check_tls(&crate::host::clock::Clock::now_rfc3339());
            for (i, line) in lines.iter().enumerate() {
                let label = if i == 0 { "sql tls" } else { "" };
                out.push(format!("{label:<11} {line}"));
            }
            sql.inventory().worker_pids()
        }
        Err(failure) => {
            out.push(format!(
                "sql tls     not tried: the sqlserver family did not attach: {}",
                failure.error
            ));
            Vec::new()
        }
    }
}

/// `auto`, `tp_btf`, `raw_tp`: as the user types it.
fn mode_flag(mode: ModeChoice) -> String {
    use clap::ValueEnum;
    mode.to_possible_value()
        .map_or_else(|| format!("{mode:?}"), |v| v.get_name().to_string())
}

/// One hook's line: what served it and what it cannot tell, or why nothing could.
fn hook_state(h: &HookStatus) -> String {
    let mut state = match (h.attached, &h.error) {
        (true, _) if h.via == Some(probes::AttachKind::ProgRun) => {
            format!(
                "loaded: {}, not attached",
                probes::AttachKind::ProgRun.in_words()
            )
        }
        (true, _) => {
            let via = h.via.map_or("?".to_string(), |v| v.in_words());
            // The target is said only where it is not the hook's own name (a
            // function standing in for a tracepoint the kernel lacks).
            match h.target.as_deref().filter(|t| *t != h.hook) {
                Some(target) => format!("attached: {via} on {target}"),
                None => format!("attached: {via}"),
            }
        }
        (false, Some(e)) if h.optional => format!("not available (optional): {e}"),
        (false, Some(e)) => format!("FAILED ({}): {e}", h.mode.name()),
        (false, None) => "not tried".into(),
    };
    if let Some(n) = h.verified_insns {
        state.push_str(&format!(", {n} instructions verified"));
    }
    if let Some(why) = &h.fallback_reason {
        state.push_str(&format!(" (instead of the tracepoint: {why})"));
    }
    if let Some(note) = &h.note {
        state.push_str(&format!("; note: {note}"));
    }
    state
}
