//! The hooks of an embedded object, and attaching one program of a hook.
//!
//! A program's ELF section says how it attaches (`tp_btf/<tracepoint>`,
//! `raw_tp/<tracepoint>`, `fentry/<function>`, `kprobe/<function>`) and its
//! name which hook it serves and whether the family needs it:
//! `on_<hook>` or `maybe_<hook>` for the tracepoint program, and
//! `on_<hook>__<function>` for a kernel function standing in for the
//! tracepoint where a kernel lacks it (the HOOK macros in
//! ebpf/include/core_fixes.h). A `run_<name>` program in a bare `raw_tp`
//! section is loaded but never attached: its family runs it itself
//! (BPF_PROG_RUN), in either mode, and works without it.

use aya::programs::{BtfTracePoint, FEntry, KProbe, ProgramError, RawTracePoint};
use aya::{Btf, Ebpf};
use aya_obj::btf::BtfKind;
use object::{Object, ObjectSection, ObjectSymbol, SymbolKind};

use super::{AttachKind, HookMode, describe};

impl AttachKind {
    fn from_section(section: &str) -> Option<(Self, &str)> {
        if section == "raw_tp" {
            return Some((AttachKind::ProgRun, ""));
        }
        [
            (AttachKind::TpBtf, "tp_btf/"),
            (AttachKind::RawTp, "raw_tp/"),
            (AttachKind::Fentry, "fentry/"),
            (AttachKind::Kprobe, "kprobe/"),
        ]
        .into_iter()
        .find_map(|(kind, prefix)| section.strip_prefix(prefix).map(|target| (kind, target)))
    }

    /// Whether a program of this kind belongs in an object of `mode`.
    fn in_mode(self, mode: HookMode) -> bool {
        match mode {
            HookMode::TpBtf => matches!(
                self,
                AttachKind::TpBtf | AttachKind::Fentry | AttachKind::ProgRun
            ),
            HookMode::RawTp => matches!(
                self,
                AttachKind::RawTp | AttachKind::Kprobe | AttachKind::ProgRun
            ),
        }
    }
}

/// One program of an object and where it attaches.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hook {
    /// The hook it serves: the tracepoint's name.
    pub name: String,
    pub kind: AttachKind,
    /// The tracepoint or kernel function it attaches to.
    pub target: String,
    pub program: String,
    pub optional: bool,
}

/// Every program of `mode` in an object, each hook's tracepoint program before
/// the kernel functions standing in for it, hooks by name.
pub fn hooks_in_object(bytes: &[u8], mode: HookMode) -> Vec<Hook> {
    let file = object::File::parse(bytes).expect("embedded eBPF object is valid ELF");
    let mut hooks = Vec::new();
    for sym in file.symbols() {
        if sym.kind() != SymbolKind::Text {
            continue;
        }
        let Some(section) = sym
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
        else {
            continue;
        };
        let (Ok(section), Ok(program)) = (section.name(), sym.name()) else {
            continue;
        };
        let Some((kind, target)) = AttachKind::from_section(section) else {
            continue;
        };
        if !kind.in_mode(mode) {
            continue;
        }
        let (optional, rest) = match (
            program.strip_prefix("on_"),
            program.strip_prefix("maybe_"),
            program.strip_prefix("run_"),
        ) {
            (Some(rest), ..) if kind != AttachKind::ProgRun => (false, rest),
            (_, Some(rest), _) if kind != AttachKind::ProgRun => (true, rest),
            (.., Some(rest)) if kind == AttachKind::ProgRun => (true, rest),
            _ => continue, // a helper subprogram, not a hook
        };
        let name = rest.split_once("__").map_or(rest, |(hook, _)| hook);
        // A program run by stalltrace serves no tracepoint: it is its own target.
        let target = if kind == AttachKind::ProgRun {
            name
        } else {
            target
        };
        hooks.push(Hook {
            name: name.to_string(),
            kind,
            target: target.to_string(),
            program: program.to_string(),
            optional,
        });
    }
    hooks.sort_by(|a, b| (&a.name, a.kind).cmp(&(&b.name, b.kind)));
    hooks
}

/// The hooks of an object of `mode`, each with its programs in the order to try.
pub fn candidates(bytes: &[u8], mode: HookMode) -> Vec<(String, Vec<Hook>)> {
    let mut grouped: Vec<(String, Vec<Hook>)> = Vec::new();
    for hook in hooks_in_object(bytes, mode) {
        match grouped.last_mut() {
            Some((name, programs)) if *name == hook.name => programs.push(hook),
            _ => grouped.push((hook.name.clone(), vec![hook])),
        }
    }
    grouped
}

/// What the kernel says of a program it accepted: its id, and the instructions
/// its verifier walked (5.16+).
#[derive(Clone, Copy, Debug, Default)]
pub struct Loaded {
    pub program_id: Option<u32>,
    pub verified_insns: Option<u32>,
}

/// Load and attach one program at `target`. A program that loaded but could
/// not attach is unloaded again.
pub fn attach_one(ebpf: &mut Ebpf, hook: &Hook, target: &str, btf: &Btf) -> Result<Loaded, String> {
    let program = ebpf
        .program_mut(&hook.program)
        .ok_or_else(|| format!("program {} missing from the object", hook.program))?;
    macro_rules! load_attach {
        ($ty:ty, $load:expr, $attach:expr) => {{
            let p: &mut $ty = program.try_into().map_err(|e| describe(&e))?;
            $load(&mut *p).map_err(|e| describe(&e))?;
            if let Err(e) = $attach(&mut *p) {
                let why = describe(&e);
                let _ = p.unload();
                return Err(why);
            }
            let info = p.info().ok();
            Ok(Loaded {
                program_id: info.as_ref().map(|i| i.id()),
                verified_insns: info.and_then(|i| i.verified_instruction_count()),
            })
        }};
    }
    match hook.kind {
        AttachKind::TpBtf => load_attach!(
            BtfTracePoint,
            |p: &mut BtfTracePoint| p.load(target, btf),
            |p: &mut BtfTracePoint| p.attach().map(drop)
        ),
        AttachKind::RawTp => load_attach!(
            RawTracePoint,
            |p: &mut RawTracePoint| p.load(),
            |p: &mut RawTracePoint| p.attach(target).map(drop)
        ),
        AttachKind::Fentry => load_attach!(
            FEntry,
            |p: &mut FEntry| p.load(target, btf),
            |p: &mut FEntry| p.attach().map(drop)
        ),
        AttachKind::Kprobe => load_attach!(KProbe, |p: &mut KProbe| p.load(), |p: &mut KProbe| p
            .attach(target, 0)
            .map(drop)),
        // Loaded only: its family runs it (BPF_PROG_RUN).
        AttachKind::ProgRun => load_attach!(
            RawTracePoint,
            |p: &mut RawTracePoint| p.load(),
            |_: &mut RawTracePoint| Ok::<(), ProgramError>(())
        ),
    }
}

/// What a hook served this way cannot tell on this kernel, for `start` and
/// `check` (docs/records.md has the same per field).
pub fn limits(family: &str, hook: &str, kind: AttachKind, btf: &Btf) -> Option<String> {
    let has_struct = |name: &str| btf.id_by_type_name_kind(name, BtfKind::Struct).is_ok();
    match (family, hook, kind) {
        // 6.17 gave the tracepoint `err` and an event struct of its own, and made it fire for every attempt.
        ("tcp", "tcp_retransmit_skb", _) if !has_struct("trace_event_raw_tcp_retransmit_skb") => Some(
            "this kernel's tracepoint fires only for retransmissions that went out: attempts that \
             failed to send (TCPRetransFail in /proc/net/netstat) are not seen, and err is always 0"
                .into(),
        ),
        ("tcp", "sock_send_length" | "sock_recv_length", AttachKind::Fentry | AttachKind::Kprobe) => {
            Some(
                "the socket's owner is noted, and its RTT sampled, at the start of each TCP send \
                 and receive call instead"
                    .into(),
            )
        }
        _ => None,
    }
}
