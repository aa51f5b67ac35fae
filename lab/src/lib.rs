//! The stalltrace lab: the situations the end-to-end tests and `cargo xtask
//! lab` build on the shared kernel, and the field cases built from them.
//!
//! - disk.rs, fio.rs: loop devices (over tmpfs or disk files, with their queue
//!   settings) and fio as load and oracle; /proc/diskstats.
//! - net/: network namespaces joined by veth (`NetPair`) or by a bridge
//!   (`Switch`), loss with nftables, rate limits with tbf, iperf3 and sockperf,
//!   the kernel's own counters.
//! - sql/: the SQL Server simulator (`sqlservr`, `sqlclient`), filesystems on
//!   loop devices, a blkio cgroup that makes a device slow.
//! - tracer.rs, records.rs: `stalltrace run` as a child process, and reading
//!   what it wrote.
//! - bpftrace.rs: a bpftrace script of a test's own as the oracle of a span
//!   stalltrace does not time.
//! - kernel_objects.rs: the eBPF programs, maps, pins and bpffs mounts a
//!   tracer leaves (bpftool, /proc); churn.rs: namespaces and loop devices
//!   made and removed by the hundred while a tracer runs.
//! - kernel_checks/: `stalltrace-kernel-checks`, the checks run inside a guest
//!   booted with another kernel (`cargo xtask kernels`).
//! - systemd_guest.rs: a Debian guest booting systemd as PID 1 (mmdebstrap,
//!   systemd-nspawn) on this kernel, where tests/package.rs installs the .deb;
//!   image.rs: the container image built from that .deb, run with podman.
//! - scenario/: the field cases (`loss`, `queue-depth`, `throttle`, `rtt`,
//!   `backup`), each with a fault and a clean variant.
//!
//! Everything the lab creates has a unique name and a Drop guard that removes
//! it, also when the caller panics, so labs may run beside each other and
//! beside other tests. The lab panics on any failure (with the command's
//! output): a half-built situation is never measured.

pub mod bpftrace;
pub mod churn;
pub mod container;
pub mod disk;
pub mod fio;
pub mod image;
pub mod kernel_checks;
pub mod kernel_objects;
pub mod net;
pub mod prometheus;
pub mod records;
pub mod rsyslog;
pub mod scenario;
pub mod sql;
pub mod systemd_guest;
pub mod tracer;
mod util;

use std::path::PathBuf;

pub use bpftrace::Bpftrace;
pub use disk::{Backing, DiskStats, LoopDevice};
pub use fio::{Fio, fio, randread_4k};
pub use records::{
    Buckets, HIST_BUCKET_ERROR, SqlSide, block_records, of_type, requests_untimed, retransmits_in,
    retransmits_unjudged, retransmits_unseen, sql_retransmit_hooks_skipped, sum_field, sum_segs,
};
pub use tracer::{Tracer, parse_lines};
pub use util::{ScratchDir, die_with_parent, require_root, sh, sh_stdin, strip_ansi, unique};

/// The binaries a lab runs: the caller says where they are (the tests: cargo's
/// `CARGO_BIN_EXE_*` and its siblings; xtask: its release build).
#[derive(Clone, Debug)]
pub struct Bins {
    pub stalltrace: PathBuf,
    pub sqlservr: PathBuf,
    pub sqlclient: PathBuf,
}

impl Bins {
    /// `stalltrace`, with the simulator's binaries beside it (cargo puts every
    /// binary of the workspace in the same directory).
    pub fn beside(stalltrace: impl Into<PathBuf>) -> Self {
        let stalltrace = stalltrace.into();
        Self {
            sqlservr: stalltrace.with_file_name("sqlservr"),
            sqlclient: stalltrace.with_file_name("sqlclient"),
            stalltrace,
        }
    }

    /// Panic naming whichever binary is missing and how to build it.
    pub fn check(&self) {
        for (path, how) in [
            (&self.stalltrace, "cargo build -p stalltrace"),
            (&self.sqlservr, "cargo build -p stalltrace-sim"),
            (&self.sqlclient, "cargo build -p stalltrace-sim"),
        ] {
            assert!(
                path.exists(),
                "{} is missing: build it (`{how}`, or run `cargo xtask test`)",
                path.display()
            );
        }
    }
}
