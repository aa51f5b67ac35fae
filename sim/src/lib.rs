//! A workload simulator with SQL Server on Linux's kernel-visible footprint, for
//! testing stalltrace where no SQL Server can be installed.
//!
//! - `sqlservr` ([`watchdog`], [`server`]): a watchdog parent and a worker
//!   child, both named `sqlservr`; the worker listens for TDS ([`tds`]) and
//!   keeps O_DIRECT `.mdf`/`.ldf` files open ([`storage`]).
//! - `sqlclient` ([`client`]): N TDS sessions at a set rate; prints latency
//!   percentiles and each session's SPID and client port as one JSON line.

pub mod client;
pub mod server;
pub mod storage;
pub mod tds;
pub mod tls;
pub mod watchdog;

/// This host's name, for LOGIN7 and server messages.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "localhost".into())
}
