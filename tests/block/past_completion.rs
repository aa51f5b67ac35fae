//! The kernel's work on a request past stalltrace's completion hook, timed by
//! bpftrace: diskstats' span includes it, stalltrace's does not.

use super::*;

/// A bpftrace script timing, per request of `disk`, the kernel's work past
/// stalltrace's completion hook and before diskstats reads its clock:
/// block_rq_complete (start of blk_update_request) -> block_io_done (in
/// blk_account_io_done, right after that clock read; kernels 6.5+). A request
/// is known by its sector, which a full completion leaves as it was; one I/O
/// at a time, no two are in flight. Its maps: `past_n` requests, `past_ns`.
pub fn completion_to_accounting(disk: &LoopDevice) -> String {
    // dev_t as the kernel keeps it: MKDEV(major, minor) = major << 20 | minor.
    let dev = (disk.major << 20) | disk.minor;
    format!(
        "BEGIN {{ printf(\"ready\\n\"); }}\n\
         tracepoint:block:block_rq_complete /args->dev == {dev}/ {{ @done[args->sector] = nsecs; }}\n\
         tracepoint:block:block_io_done /args->dev == {dev} && @done[args->sector]/ {{\n\
         \t@past_ns = sum(nsecs - @done[args->sector]); @past_n = count(); delete(@done[args->sector]);\n\
         }}\n\
         END {{ clear(@done); }}\n"
    )
}
