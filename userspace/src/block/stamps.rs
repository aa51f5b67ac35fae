//! The time stamps the kernel keeps on requests and bios, as its BTF says:
//! which of them the block family reads instead of a hook of its own, and
//! which it cannot (ebpf/block.bpf.c). `stalltrace check` prints these lines,
//! so the kernel matrix records them for every kernel it boots.

use crate::host::btf_names::BtfNames;

/// One line per stamp: the field, whether this kernel has it, and what stalltrace does about it.
pub fn report(btf: &BtfNames) -> Vec<String> {
    let has = |strukt, member| btf.has_member(strukt, member);
    let allocated = if has("request", "start_time_ns") {
        "rq->start_time_ns: yes, read at completion (where the disk keeps iostats, the default)"
    } else {
        "rq->start_time_ns: MISSING (the block family cannot load)"
    };
    let issued = if has("request", "io_start_time_ns") {
        "rq->io_start_time_ns: yes, but only on queues keeping statistics (wbt, iocost); stamped by the hook on block_rq_issue"
    } else {
        "rq->io_start_time_ns: no; stamped by the hook on block_rq_issue"
    };
    // 6.18 stamps bios only on disks with blk-iolatency (the flag names that condition).
    let submitted = if has("bio", "bi_issue") {
        "bio->bi_issue: yes, every bio (cgroup kernels); not read yet, stamped by the hook on block_bio_queue"
    } else if has("bio", "issue_time_ns") && !btf.has_enumerator("QUEUE_FLAG_BIO_ISSUE_TIME") {
        "bio->issue_time_ns: yes, every bio (cgroup kernels); not read yet, stamped by the hook on block_bio_queue"
    } else if has("bio", "issue_time_ns") {
        "bio->issue_time_ns: only on disks with blk-iolatency; stamped by the hook on block_bio_queue"
    } else {
        "none; stamped by the hook on block_bio_queue"
    };
    vec![
        format!("request allocated  {allocated}"),
        format!("request issued     {issued}"),
        format!("bio submitted      {submitted}"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_kernel_says_where_each_stamp_comes_from() {
        let lines = report(&BtfNames::of_running_kernel().unwrap());
        assert_eq!(lines.len(), 3);
        assert!(lines[0].contains("start_time_ns: yes"), "{lines:?}");
    }
}
