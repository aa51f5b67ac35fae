//! SQL Server correlation (docs/ARCHITECTURE.md, "SQL Server correlation"): what stalltrace learns
//! about SQL Server from outside the process. The kernel side reads the headers of its
//! wire protocol, the Tabular Data Stream (`ebpf/include/tds.h`), to recover the SPID of a
//! session; `tls` attaches the uprobes that read the same headers in the TLS plaintext of
//! encrypted sessions. Neither keeps SQL text or any other payload. `tds`, a Rust stream
//! parser of those headers, is compiled only for tests: the kernel reader's second oracle.

pub mod dmv;
pub mod files;
pub mod inventory;
pub mod live;
pub mod requests;
pub mod tls;

/// The inode of the initial PID namespace (the kernel's PROC_PID_INIT_INO).
const INITIAL_PIDNS_INO: u64 = 0xEFFF_FFFC;

/// The sqlserver programs' load-time globals: the device and inode of this
/// process's PID namespace when it is not the host's (a container without
/// the host's PID namespace, systemd-nspawn), so the kernel numbers SQL
/// Server workers as this process's /proc does (sqlserver.bpf.c); zeros on
/// the host, where the kernel's own numbering is /proc's.
pub fn load_globals() -> [(&'static str, u64); 2] {
    use std::os::unix::fs::MetadataExt;
    match std::fs::metadata("/proc/self/ns/pid") {
        Ok(ns) if ns.ino() != INITIAL_PIDNS_INO => {
            [("pidns_dev", ns.dev()), ("pidns_ino", ns.ino())]
        }
        _ => [("pidns_dev", 0), ("pidns_ino", 0)],
    }
}
