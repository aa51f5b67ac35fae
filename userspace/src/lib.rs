//! stalltrace: eBPF latency tracer for SQL Server on Linux hosts.
//!
//! The crate is organised as docs/ARCHITECTURE.md describes: one module per probe family
//! (mirroring `ebpf/`), `hist` for the log-linear histograms, `host` for what is
//! read from /proc and /sys, and `output` for the versioned JSON records.

pub mod abi;
pub mod block;
pub mod check;
pub mod cli;
pub mod enrich;
pub mod error;
pub mod hist;
pub mod host;
pub mod investigate;
pub mod metrics;
pub mod netdev;
pub mod output;
pub mod probes;
pub mod records;
pub mod report;
pub mod run;
pub mod sqlserver;
pub mod stall;
pub mod tcp;

/// The stream's contract held to docs/schema.json: every record type built
/// and written through the real writer, then validated (test code only).
#[cfg(test)]
mod schema_check;
