//! The settle pass: once an interval, block.bpf.c's `settle_freed_requests`
//! ends the lives of request slots whose request the kernel has freed while
//! the slot still says in flight (a completion the kernel skipped the hook
//! for). Without it such a request holds its disk's in-flight gauge up until
//! the same request is issued again, which on a busy disk can be never
//! (block.bpf.c says why), and every `inflight` sample reads one too many
//! meanwhile.
//!
//! The kernel side does the settling, with the same code as the issue hook,
//! so the counts land where the hooks put theirs (`block.kernel_skipped`,
//! `completions_unseen`). The program is never attached: the daemon runs it
//! with BPF_PROG_RUN, SETTLE_CHUNK slots a run.

use std::io;
use std::mem;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd};

use aya::Ebpf;
use aya_obj::generated::{bpf_attr, bpf_cmd};

use crate::abi;
use crate::probes::AttachedFamily;

/// The hook name of the program (`run_settle_freed_requests` in block.bpf.c).
pub const HOOK: &str = "settle_freed_requests";
const PROGRAM: &str = "run_settle_freed_requests";

/// The loaded program, found in the family's object.
pub struct SettlePass;

impl SettlePass {
    /// Present when the family loaded the program (it is optional: its
    /// status in `start` says why not, with what that costs).
    pub fn of(family: &AttachedFamily) -> Option<Self> {
        family
            .hooks
            .iter()
            .any(|h| h.hook == HOOK && h.attached)
            .then_some(Self)
    }

    /// One pass over every request slot.
    pub fn run(&self, ebpf: &Ebpf) -> io::Result<()> {
        let program = ebpf
            .program(PROGRAM)
            .ok_or_else(|| io::Error::other(format!("program {PROGRAM} missing")))?;
        let fd = program.fd().map_err(io::Error::other)?;
        let slots = 1u32 << abi::BLOCK_RQ_SLOT_BITS;
        for first in (0..slots).step_by(abi::SETTLE_CHUNK as usize) {
            prog_run(fd.as_fd(), u64::from(first))?;
        }
        Ok(())
    }
}

/// BPF_PROG_RUN of a raw_tp program with one argument (its ctx->args[0]).
fn prog_run(prog: BorrowedFd<'_>, arg: u64) -> io::Result<()> {
    let args = [arg];
    // SAFETY: all-zero is a valid bpf_attr; the fields set are those of
    // `test`, and `args` lives across the call that reads it.
    let mut attr: bpf_attr = unsafe { mem::zeroed() };
    attr.test.prog_fd = prog.as_raw_fd() as u32;
    attr.test.ctx_in = args.as_ptr() as u64;
    attr.test.ctx_size_in = mem::size_of_val(&args) as u32;
    // SAFETY: `attr` is valid for the call; BPF_PROG_RUN writes only into it.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_PROG_TEST_RUN as libc::c_int,
            &mut attr as *mut bpf_attr,
            mem::size_of::<bpf_attr>(),
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
