//! The uprobe programs' stack stays under the 64 bytes from which kernels
//! 6.13+ give a KPROBE-type program a private stack. That stack is per CPU,
//! and a uprobe program runs preemptible and without the per-CPU recursion
//! guard the other kinds have: on a kernel that preempts (PREEMPT_LAZY, the
//! default from 7.x) two threads' runs on one CPU then share it, and the
//! kernel matrix caught one thread's TLS write stored under another thread's
//! key. The depth is read from the compiled objects, as the verifier counts
//! it: the deepest stack slot any instruction reaches below r10.

use stalltrace::probes::FAMILIES;

/// `BPF_PRIV_STACK_MIN_SIZE` in kernel/bpf/verifier.c: a smaller (rounded-up)
/// stack keeps the program on the task's own kernel stack.
const PRIVATE_STACK_FROM: i64 = 64;

const FRAME: usize = 10; // r10, the read-only frame pointer
const BPF_LD_IMM64: u8 = 0x18;
const BPF_MOV64_REG: u8 = 0xbf;
const BPF_ADD64_IMM: u8 = 0x07;
const BPF_CALL: u8 = 0x85;
const CLASS_LDX: u8 = 0x01;
const CLASS_ST: u8 = 0x02;
const CLASS_STX: u8 = 0x03;

/// The deepest stack byte the instructions reach: loads and stores based
/// on r10, and pointers made from it (`rX = r10; rX += -N`) that helpers
/// are given.
fn stack_depth(code: &[u8]) -> i64 {
    let mut from_frame: [Option<i64>; 11] = [None; 11];
    let mut depth = 0i64;
    let mut at = 0;
    while at + 8 <= code.len() {
        let insn = &code[at..at + 8];
        let (op, dst, src) = (
            insn[0],
            usize::from(insn[1] & 0x0f),
            usize::from(insn[1] >> 4),
        );
        let off = i64::from(i16::from_le_bytes([insn[2], insn[3]]));
        let imm = i64::from(i32::from_le_bytes([insn[4], insn[5], insn[6], insn[7]]));
        at += if op == BPF_LD_IMM64 { 16 } else { 8 };
        let base = match op & 0x07 {
            CLASS_LDX => Some(src),
            CLASS_ST | CLASS_STX => Some(dst),
            _ => None,
        };
        if let Some(base) = base {
            if base == FRAME {
                depth = depth.max(-off);
            } else if let Some(o) = from_frame.get(base).copied().flatten() {
                depth = depth.max(-(o + off));
            }
        }
        match op {
            BPF_MOV64_REG if src == FRAME && dst < FRAME => from_frame[dst] = Some(0),
            BPF_ADD64_IMM if dst < FRAME && from_frame[dst].is_some() => {
                let o = from_frame[dst].unwrap_or(0) + imm;
                from_frame[dst] = Some(o);
                depth = depth.max(-o);
            }
            BPF_CALL => from_frame[..=5].fill(None),
            _ if matches!(op & 0x07, 0x00 | 0x01 | 0x04 | 0x07) && dst < FRAME => {
                from_frame[dst] = None;
            }
            _ => {}
        }
    }
    depth
}

#[test]
fn uprobe_programs_keep_their_stack_under_the_private_stack_limit() {
    use object::{Object, ObjectSection};
    let mut checked = 0;
    for family in FAMILIES {
        for (flavour, bytes) in [("tp_btf", family.tp_btf), ("raw_tp", family.raw_tp)] {
            let obj = object::File::parse(bytes).expect("an embedded BPF object parses");
            for section in obj.sections() {
                // Every function is inlined (`__always_inline`): a uprobe
                // program is its section, with no subprogram in .text.
                let name = section.name().unwrap_or_default();
                if !(name.starts_with("uprobe") || name.starts_with("uretprobe")) {
                    continue;
                }
                let subprograms = obj.section_by_name(".text").map_or(0, |t| t.size());
                assert_eq!(subprograms, 0, "{}: code in .text", family.name);
                let depth = stack_depth(section.data().expect("section data"));
                // The verifier rounds a JITed program's depth up to 16 bytes first.
                assert!(
                    depth > 0 && (depth + 15) / 16 * 16 < PRIVATE_STACK_FROM,
                    "{}.{flavour}.bpf.o section {name}: stack {depth} bytes; under \
                     {PRIVATE_STACK_FROM} keeps it off the per-CPU private stack",
                    family.name
                );
                checked += 1;
            }
        }
    }
    assert!(
        checked >= 2,
        "no uprobe program found in the embedded objects"
    );
}

#[test]
fn the_depth_counts_frame_pointers_handed_to_helpers() {
    // r2 = r10; r2 += -72; *(u64 *)(r10 - 8) = r1
    let code: Vec<u8> = [
        [BPF_MOV64_REG, 0xa2, 0, 0, 0, 0, 0, 0],
        [BPF_ADD64_IMM, 0x02, 0, 0, 0xb8, 0xff, 0xff, 0xff],
        [0x7b, 0x1a, 0xf8, 0xff, 0, 0, 0, 0],
    ]
    .concat();
    assert_eq!(stack_depth(&code), 72);
}
