//! Loading and attaching a probe family's eBPF object.
//!
//! Every family is embedded twice (build.rs): a tp_btf object and a raw_tp one.
//! `auto` tries tp_btf (cheapest: direct loads, no helper calls) and falls back
//! to raw_tp, for the whole family at once, when any required hook cannot be
//! served in tp_btf. The hooks are read from the object itself (hooks.rs), so
//! the C file is the only list of them. A hook may have several programs, tried
//! in order until one loads and attaches: its tracepoint first, then a kernel
//! function standing in for it where the tracepoint is missing (fentry in the
//! tp_btf object, kprobe in the raw_tp one). A hook whose programs are named
//! `on_*` (the HOOK macros) is required; `maybe_*` (OPTIONAL_HOOK) is attached
//! when it can be, and its failure is reported, not fatal.

mod hooks;
pub mod lost;
pub mod process_filter;
pub mod ring;
pub mod stats;

use std::cell::RefCell;

use aya::{Btf, Ebpf, EbpfLoader};

use crate::error::UserError;
pub use crate::records::run::{HookMode, HookStatus};

/// One family's objects, compiled and embedded by build.rs.
pub struct EmbeddedFamily {
    pub name: &'static str,
    pub tp_btf: &'static [u8],
    pub raw_tp: &'static [u8],
}

pub static FAMILIES: &[EmbeddedFamily] = include!(concat!(env!("OUT_DIR"), "/families.rs"));

pub fn embedded(name: &str) -> &'static EmbeddedFamily {
    FAMILIES
        .iter()
        .find(|f| f.name == name)
        .unwrap_or_else(|| panic!("family {name} is not embedded (no ebpf/{name}.bpf.c)"))
}

/// `--probe-mode`: which hook flavour to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ModeChoice {
    /// tp_btf, falling back to raw_tp when tp_btf cannot attach
    #[default]
    Auto,
    /// BTF-typed tracepoints only (direct loads: the cheapest)
    #[value(name = "tp_btf", alias = "tp-btf")]
    TpBtf,
    /// raw tracepoints only (every read through bpf_probe_read_kernel)
    #[value(name = "raw_tp", alias = "raw-tp")]
    RawTp,
}

/// A family whose programs are all attached. Dropping it detaches them (links
/// are file descriptors; nothing is pinned).
pub struct AttachedFamily {
    pub name: &'static str,
    pub ebpf: Ebpf,
    pub mode: HookMode,
    pub hooks: Vec<HookStatus>,
    /// Why tp_btf was not used, when auto fell back to raw_tp.
    pub fallback_reason: Option<String>,
}

/// A family that could not attach: every attempt's statuses and the error to show.
pub struct FamilyFailure {
    pub hooks: Vec<HookStatus>,
    pub error: UserError,
}

pub use crate::records::run::AttachKind;
pub use hooks::{Hook, hooks_in_object};

/// What a family sets before its programs run. Built with
/// `..Default::default()` for what a family leaves out, so a setting added
/// here does not touch every family.
#[derive(Default)]
#[non_exhaustive]
pub struct Setup<'a> {
    /// `const volatile` u64 globals, set at load.
    pub globals: &'a [(&'static str, u64)],
    /// Runs once the maps exist and before any program attaches (e.g. to fill
    /// filter maps, so no event slips through unfiltered).
    pub before_attach: Option<&'a BeforeAttach<'a>>,
    /// Maps whose size the daemon decides at load: (map, max_entries).
    pub max_entries: &'a [(&'static str, u32)],
}

pub type BeforeAttach<'a> = dyn Fn(&mut Ebpf) -> Result<(), String> + 'a;

/// Take map `name` out of `ebpf` as the typed map `T`.
pub fn take_map<T>(ebpf: &mut Ebpf, name: &str) -> anyhow::Result<T>
where
    T: TryFrom<aya::maps::Map, Error = aya::maps::MapError>,
{
    let map = ebpf
        .take_map(name)
        .ok_or_else(|| anyhow::anyhow!("the object has no map {name}"))?;
    Ok(T::try_from(map)?)
}

/// Load and attach `family` as `setup` says.
pub fn attach_family(
    family: &EmbeddedFamily,
    choice: ModeChoice,
    setup: &Setup,
    btf: &Btf,
) -> Result<AttachedFamily, FamilyFailure> {
    let first = match choice {
        ModeChoice::RawTp => HookMode::RawTp,
        _ => HookMode::TpBtf,
    };
    match attach_mode(family, first, setup, btf) {
        Ok((ebpf, hooks)) => Ok(AttachedFamily {
            name: family.name,
            ebpf,
            mode: first,
            hooks,
            fallback_reason: None,
        }),
        Err(failed) if choice == ModeChoice::Auto => {
            let reason = failed.error.problem.clone();
            match attach_mode(family, HookMode::RawTp, setup, btf) {
                Ok((ebpf, hooks)) => Ok(AttachedFamily {
                    name: family.name,
                    ebpf,
                    mode: HookMode::RawTp,
                    hooks,
                    fallback_reason: Some(reason),
                }),
                Err(mut second) => {
                    let mut hooks = failed.hooks;
                    hooks.append(&mut second.hooks);
                    // Name both attempts: the user needs to know tp_btf was tried first.
                    let error = UserError::new(
                        format!(
                            "{}; tp_btf had failed first: {reason}",
                            second.error.problem
                        ),
                        second.error.fix,
                    );
                    Err(FamilyFailure { hooks, error })
                }
            }
        }
        Err(failed) => Err(failed),
    }
}

fn attach_mode(
    family: &EmbeddedFamily,
    mode: HookMode,
    setup: &Setup,
    btf: &Btf,
) -> Result<(Ebpf, Vec<HookStatus>), FamilyFailure> {
    let bytes = match mode {
        HookMode::TpBtf => family.tp_btf,
        HookMode::RawTp => family.raw_tp,
    };
    let candidates = hooks::candidates(bytes, mode);
    let mut statuses: Vec<HookStatus> = candidates
        .iter()
        .map(|(name, programs)| HookStatus {
            optional: programs.iter().all(|p| p.optional),
            ..HookStatus::untried(family.name, name, mode)
        })
        .collect();

    let mut loader = take_blank_loader();
    loader.btf(Some(btf));
    for (name, value) in setup.globals {
        loader.override_global(name, value, true);
    }
    for &(name, entries) in setup.max_entries {
        loader.map_max_entries(name, entries);
    }
    let mut ebpf = loader.load(bytes).map_err(|e| FamilyFailure {
        hooks: statuses.clone(),
        error: UserError::probe_failed(family.name, "its maps", &describe(&e)),
    })?;
    if let Some(before_attach) = setup.before_attach {
        before_attach(&mut ebpf).map_err(|why| FamilyFailure {
            hooks: statuses.clone(),
            error: UserError::probe_failed(family.name, "its settings", &why),
        })?;
    }

    for (i, (name, programs)) in candidates.iter().enumerate() {
        let mut failures: Vec<String> = Vec::new();
        for program in programs {
            let target = hook_target(&program.target);
            match hooks::attach_one(&mut ebpf, program, &target, btf) {
                Ok(loaded) => {
                    let status = &mut statuses[i];
                    status.attached = true;
                    status.program_id = loaded.program_id;
                    status.verified_insns = loaded.verified_insns;
                    status.via = Some(program.kind);
                    status.target = Some(program.target.clone());
                    status.fallback_reason = (!failures.is_empty()).then(|| failures.join("; "));
                    status.note = hooks::limits(family.name, name, program.kind, btf);
                    break;
                }
                Err(why) => {
                    failures.push(format!("{} {}: {why}", program.kind.name(), program.target))
                }
            }
        }
        if statuses[i].attached {
            continue;
        }
        let why = failures.join("; ");
        statuses[i].error = Some(why.clone());
        if !statuses[i].optional {
            // Returning drops `ebpf`: whatever attached so far is detached with it.
            return Err(FamilyFailure {
                hooks: statuses,
                error: UserError::probe_failed(
                    family.name,
                    &format!("{name} ({})", mode.name()),
                    &why,
                ),
            });
        }
    }
    Ok((ebpf, statuses))
}

/// Fault injection for the tests of attach failures: `STALLTRACE_FAULT_MISSING_HOOK=<tracepoint>`
/// makes that tracepoint (and a kernel function of that name) look missing, as on
/// a kernel without it. Never set in production.
fn hook_target(target: &str) -> String {
    match std::env::var("STALLTRACE_FAULT_MISSING_HOOK") {
        Ok(missing) if missing == target => format!("{target}_missing_by_fault_injection"),
        _ => target.to_string(),
    }
}

/// Lines of a verifier log kept in an error: the reason and the instructions just before it.
const VERIFIER_LINES_KEPT: usize = 3;

/// An error and its causes on one line. A verifier rejection keeps only the
/// log's last lines (the reason), not the whole program listing.
pub fn describe(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut source = e.source();
    while let Some(s) = source {
        // aya's load error already names its io::Error: do not say it twice.
        let text = s.to_string();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        source = s.source();
    }
    for part in &mut parts {
        if let Some(pos) = part.find("Verifier output:") {
            let reason = verifier_reason(&part[pos + "Verifier output:".len()..]);
            *part = format!("{} verifier: {reason}", part[..pos].trim_end());
        }
    }
    parts
        .join(": ")
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

/// The last lines of a verifier log before its statistics: the reason, and the
/// instructions that led to it.
fn verifier_reason(log: &str) -> String {
    let mut reason: Vec<&str> = log
        .lines()
        .rev()
        .map(str::trim)
        .filter(|l| {
            !l.is_empty()
                && !l.starts_with("processed ")
                && !l.starts_with("verification time")
                && !l.starts_with("stack depth")
                && l.chars().any(char::is_alphabetic)
        })
        .take(VERIFIER_LINES_KEPT)
        .collect();
    reason.reverse();
    if reason.is_empty() {
        "(the kernel wrote no log)".to_string()
    } else {
        reason.join(" | ")
    }
}

/// What every family's records may need from the rest of the run.
pub struct Ctx<'a> {
    pub clock: &'a crate::host::clock::Clock,
    /// SQL Server correlation, when its family is attached: tags records with
    /// the session or instance they belong to.
    pub sql: Option<&'a mut dyn crate::enrich::Tagger>,
}

/// What the run loop needs from an attached probe family.
pub trait Family {
    fn attached(&self) -> &AttachedFamily;
    /// Turn every pending ring-buffer event into a record.
    fn drain_events(
        &mut self,
        ctx: &mut Ctx,
        out: &mut crate::output::JsonWriter,
    ) -> std::io::Result<()>;
    /// Emit this interval's aggregate records.
    fn collect(
        &mut self,
        interval: std::time::Duration,
        ts: &str,
        ctx: &mut Ctx,
        out: &mut crate::output::JsonWriter,
    ) -> std::io::Result<()>;
    /// New losses since the last call, by source.
    fn lost(&mut self) -> Vec<(String, u64)>;
}

thread_local! {
    /// Loaders made by `preflight` before it parses the kernel's BTF.
    static BLANK_LOADERS: RefCell<Vec<EbpfLoader<'static>>> = const { RefCell::new(Vec::new()) };
}

/// A loader that holds no BTF of its own.
///
/// `EbpfLoader::new()` parses /sys/kernel/btf/vmlinux itself (a 5.5 MiB file,
/// ~13 MiB parsed, ~19 MiB while parsing) even though every family is then
/// given the one BTF `preflight` returns. Made while that BTF was alive, those
/// parses were the daemon's peak memory: heaptrack measured 32.5 MiB of heap
/// at the peak, 19 of it in `EbpfLoader::new`. So `preflight` makes the
/// loaders first, dropping each one's BTF at once, and only then parses the
/// BTF that stays (docs/BENCHMARKS.md, "Driving the cost down").
fn blank_loader() -> EbpfLoader<'static> {
    let mut loader = EbpfLoader::new();
    loader.btf(None);
    loader
}

/// One of `preflight`'s blank loaders, or a new one when they are used up (a raw_tp fallback).
fn take_blank_loader() -> EbpfLoader<'static> {
    BLANK_LOADERS
        .with(|pool| pool.borrow_mut().pop())
        .unwrap_or_else(blank_loader)
}

/// Checks that must pass before anything is loaded; returns the kernel's BTF.
pub fn preflight() -> Result<Btf, UserError> {
    crate::host::caps::require_tracing_privileges()?;
    if !crate::host::kernel::has_btf() {
        return Err(UserError::no_btf());
    }
    if crate::host::kernel::lockdown().as_deref() == Some("confidentiality") {
        return Err(UserError::lockdown_confidentiality());
    }
    raise_memlock_limit();
    BLANK_LOADERS.with(|pool| {
        let mut pool = pool.borrow_mut();
        while pool.len() < FAMILIES.len() {
            pool.push(blank_loader());
        }
    });
    let btf = Btf::from_sys_fs().map_err(|e| {
        UserError::new(
            format!(
                "cannot parse the kernel's BTF ({}): {}",
                crate::host::kernel::VMLINUX_BTF,
                describe(&e)
            ),
            "report this with `stalltrace check` output and the kernel version",
        )
    })?;
    // Every family sends events through a BPF ring buffer (5.8+); its struct is in BTF where it exists.
    if btf
        .id_by_type_name_kind("bpf_ringbuf", aya_obj::btf::BtfKind::Struct)
        .is_err()
    {
        return Err(UserError::no_ring_buffer(&crate::host::kernel::release()));
    }
    Ok(btf)
}

/// Kernels before 5.11 charge BPF memory to RLIMIT_MEMLOCK; later ones use memory
/// cgroups and ignore it. Raising it is harmless where it is not needed.
fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: setrlimit reads the struct we pass; failure leaves the old limit.
    unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The families the records name are the objects built from ebpf/, and
    /// each writes some record: a family added in one place fails here.
    #[test]
    fn every_family_is_an_object_and_writes_records() {
        let mut objects: Vec<&str> = FAMILIES.iter().map(|f| f.name).collect();
        let mut named = crate::records::FAMILIES.to_vec();
        objects.sort_unstable();
        named.sort_unstable();
        assert_eq!(objects, named, "ebpf/*.bpf.c vs records::FAMILIES");
        for family in crate::records::FAMILIES {
            let writes: Vec<&str> = crate::records::RECORD_TYPES
                .iter()
                .copied()
                .filter(|kind| crate::records::family_of(kind) == Some(family))
                .collect();
            assert!(!writes.is_empty(), "{family} writes no record type");
        }
        // Every other record is the daemon's own: a family's type without its
        // `by` (the report would not infer the family from it) fails here.
        let own: Vec<&str> = crate::records::RECORD_TYPES
            .iter()
            .copied()
            .filter(|kind| crate::records::family_of(kind).is_none())
            .collect();
        assert_eq!(own, ["start", "stall", "lost", "heartbeat", "stop"]);
    }

    #[test]
    fn block_hooks_come_from_the_object_sections() {
        let block = embedded("block");
        for (mode, bytes) in [
            (HookMode::TpBtf, block.tp_btf),
            (HookMode::RawTp, block.raw_tp),
        ] {
            let hooks: Vec<String> = hooks_in_object(bytes, mode)
                .into_iter()
                .map(|h| {
                    // The settle pass is the one program run, not attached, and optional.
                    let run = h.kind == AttachKind::ProgRun;
                    assert_eq!(h.optional, run, "{}: optional only if run", h.name);
                    assert_eq!(h.name, h.target, "block hooks are tracepoints");
                    h.name
                })
                .collect();
            assert_eq!(
                hooks,
                [
                    "block_bio_complete",
                    "block_bio_queue",
                    "block_rq_complete",
                    "block_rq_issue",
                    "block_rq_requeue",
                    "settle_freed_requests"
                ],
                "{mode:?}"
            );
        }
    }

    #[test]
    fn a_hook_tries_its_tracepoint_before_the_function_standing_in_for_it() {
        let sql = embedded("sqlserver");
        for (mode, bytes, tracepoint, function) in [
            (
                HookMode::TpBtf,
                sql.tp_btf,
                AttachKind::TpBtf,
                AttachKind::Fentry,
            ),
            (
                HookMode::RawTp,
                sql.raw_tp,
                AttachKind::RawTp,
                AttachKind::Kprobe,
            ),
        ] {
            let candidates = hooks::candidates(bytes, mode);
            let names: Vec<&str> = candidates.iter().map(|(n, _)| n.as_str()).collect();
            assert_eq!(
                names,
                [
                    "inet_sock_set_state",
                    "tcp_probe",
                    "tcp_retransmit_skb",
                    "tcp_sendmsg_locked"
                ],
                "{mode:?}"
            );
            let (_, programs) = &candidates[3];
            let kinds: Vec<AttachKind> = programs.iter().map(|p| p.kind).collect();
            assert_eq!(kinds, [tracepoint, function], "{mode:?}");
            assert!(
                programs
                    .iter()
                    .all(|p| !p.optional && p.target == "tcp_sendmsg_locked")
            );
        }
        let tcp = embedded("tcp");
        let send: Vec<(AttachKind, String, bool)> = hooks::candidates(tcp.tp_btf, HookMode::TpBtf)
            .into_iter()
            .find(|(name, _)| name == "sock_send_length")
            .expect("tcp has sock_send_length")
            .1
            .into_iter()
            .map(|p| (p.kind, p.target, p.optional))
            .collect();
        assert_eq!(
            send,
            [
                (AttachKind::TpBtf, "sock_send_length".to_string(), true),
                (AttachKind::Fentry, "tcp_sendmsg".to_string(), true)
            ]
        );
    }
}
