//! stalltrace: eBPF latency tracer for SQL Server on Linux hosts.
//!
//! The crate is organised as docs/ARCHITECTURE.md describes: one module per probe family
//! (mirroring `ebpf/`), `hist` for the log-linear histograms, `host` for what is
//! read from /proc and /sys, and `output` for the versioned JSON records.

/// Every probe family, registered here once. An entry names the family (its
/// module `src/NAME/`, its object `ebpf/NAME.bpf.c`), each record type it
/// writes (`Variant(type under records/) => "type"`) and, for a family the run
/// attaches through `probes::Family`, how the run's plan attaches it. SQL
/// Server's correlation has no `attach`: it is attached first and kept apart,
/// since the other families tag their records through it.
///
/// Whatever needs the list takes it from here, through a macro of its own
/// handed to this one: `records` makes the record types, `AnyRecord`, the
/// schema's list and `FAMILIES` of it, `run` its attach sequence. `check`
/// loads every object build.rs embeds, and the metrics and the report read a
/// family's records by type; tests fail while an object, a name, a record
/// type or an attach is missing (`probes`, `run`, `schema_check`,
/// tests/architecture.rs). The order is the order of `FAMILIES`, of the
/// schema's record types and of `start`'s families, which lists SQL
/// Server's correlation last (a test in `run` holds it there).
macro_rules! with_families {
    ($callback:ident) => {
        $callback! {
            block {
                records: [
                    Block(block::BlockRecord) => "block",
                    SlowIo(block::SlowIoRecord) => "slow_io",
                ],
                attach: |plan, mode, btf| crate::block::BlockProbe::attach(
                    &crate::block::BlockOptions {
                        slow_io: plan.slow_io,
                        mode,
                        disks: plan.disks.clone(),
                        processes: plan.processes.clone(),
                    },
                    btf,
                ),
            }
            tcp {
                records: [
                    TcpRetransmit(tcp::TcpRetransmitRecord) => "tcp_retransmit",
                    TcpRtt(tcp::TcpRttRecord) => "tcp_rtt",
                    TcpFlow(tcp::TcpFlowRecord) => "tcp_flow",
                ],
                attach: |plan, mode, btf| crate::tcp::TcpProbe::attach(
                    &crate::tcp::TcpOptions {
                        mode,
                        netns: plan.netns.iter().map(|n| n.inode).collect(),
                        ports: plan.ports.clone(),
                        processes: plan.processes.clone(),
                        hz: plan.hz,
                        flows: (plan.bulk_mbps > 0.0).then(|| crate::tcp::flows::FlowOptions {
                            bulk_mbps: plan.bulk_mbps,
                            netns: plan.netns.clone(),
                            ports: plan.ports.clone(),
                            processes: plan.processes.clone(),
                        }),
                    },
                    btf,
                ),
            }
            netdev {
                records: [Netdev(netdev::NetdevRecord) => "netdev"],
                attach: |plan, mode, btf| crate::netdev::NetdevProbe::attach(
                    &crate::netdev::NetdevOptions {
                        mode,
                        netns: plan.netns.clone(),
                        ifaces: plan.ifaces.clone(),
                        hz: plan.hz,
                    },
                    btf,
                ),
            }
            sqlserver {
                records: [
                    SqlInstance(sql::SqlInstanceRecord) => "sql_instance",
                    SqlSession(sql::SqlSessionRecord) => "sql_session",
                    SqlRequests(sql_requests::SqlRequestsRecord) => "sql_requests",
                ],
            }
        }
    };
}

/// Each family's record types, `records/NAME.rs`: declared here with the
/// family's entry above and its module below, so that a family is registered
/// in this file alone, and part of `records` (`records::block`, …), which
/// re-exports them and holds the daemon's own.
#[path = "records"]
mod family_records {
    pub mod block;
    pub mod netdev;
    pub mod sql;
    pub mod sql_requests;
    pub mod tcp;
}

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

/// The kernel's TDS header decision (`ebpf/include/tds.h`, compiled for the
/// host) held to a Rust stream parser, the simulator's encoder and a real
/// SQL Server capture (test code only).
#[cfg(test)]
mod tds_check;

/// The stream's contract held to docs/schema.json: every record type built
/// and written through the real writer, then validated (test code only).
#[cfg(test)]
mod schema_check;
