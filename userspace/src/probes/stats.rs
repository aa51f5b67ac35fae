//! Per-program cost and loss figures from the kernel's own accounting.

use std::mem;
use std::os::fd::{AsFd, AsRawFd};

pub use crate::records::run::ProgramStats;
use aya::Ebpf;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};

/// Counters of every program in `ebpf`.
///
/// Read with BPF_OBJ_GET_INFO_BY_FD directly: aya 0.14's `ProgramInfo` has run
/// time and count but does not expose `recursion_misses`.
pub fn program_stats(ebpf: &Ebpf) -> Vec<ProgramStats> {
    let mut out = Vec::new();
    for (name, program) in ebpf.programs() {
        let Ok(fd) = program.fd() else { continue };
        let fd = fd.as_fd();
        let Some(info) = prog_info(fd.as_raw_fd()) else {
            continue;
        };
        out.push(ProgramStats {
            program: name.to_string(),
            run_count: info.run_cnt,
            run_time_ns: info.run_time_ns,
            recursion_misses: info.recursion_misses,
        });
    }
    out.sort_by(|a, b| a.program.cmp(&b.program));
    out
}

fn prog_info(fd: i32) -> Option<bpf_prog_info> {
    // SAFETY: both are plain C structs for which all-zero is valid; the kernel
    // writes at most info_len bytes into `info`, which lives across the call.
    unsafe {
        let mut info: bpf_prog_info = mem::zeroed();
        let mut attr: bpf_attr = mem::zeroed();
        attr.info.bpf_fd = fd as u32;
        attr.info.info_len = mem::size_of::<bpf_prog_info>() as u32;
        attr.info.info = &mut info as *mut _ as u64;
        let rc = libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_int,
            &mut attr as *mut bpf_attr,
            mem::size_of::<bpf_attr>(),
        );
        (rc == 0).then_some(info)
    }
}
