//! What a run is set up with, resolved from its flags before anything
//! attaches: a flag naming nothing (a namespace, an interface, a disk, a
//! process, a container) is one line and a clean exit.

use std::time::Duration;

use crate::cli::RunArgs;
use crate::error::UserError;
use crate::host::netns::{self, Netns};
use crate::host::process_filter::ProcessFilter;
use crate::records::run::Filters;
use crate::sqlserver::inventory::{Discovery, check_sql_pid};
use crate::sqlserver::tls::TlsPolicy;

/// Everything the families are set up with.
pub struct Plan {
    pub slow_io: Option<Duration>,
    pub ports: Vec<u16>,
    pub netns: Vec<Netns>,
    pub ifaces: Vec<String>,
    /// `--disk`: the whole disks (major, first minor) the block family is limited to.
    pub disks: Vec<(u32, u32)>,
    /// `--pid`, `--comm`, `--container`: the processes watched.
    pub processes: ProcessFilter,
    pub hz: u32,
    pub sql: Discovery,
    /// `--sql-tls`: when the SSL_write uprobes are attached.
    pub sql_tls: TlsPolicy,
    /// `--bulk-mbps`: the `tcp_flow` threshold; 0: no `tcp_flow` records.
    pub bulk_mbps: f64,
}

impl Plan {
    /// The plan `args` ask for, on a kernel of `hz` ticks a second.
    pub fn resolve(args: &RunArgs, hz: u32) -> Result<Self, UserError> {
        let f = &args.filters;
        let netns = f
            .netns
            .iter()
            .map(|spec| netns::resolve(spec))
            .collect::<Result<Vec<_>, _>>()?;
        crate::netdev::check_ifaces(&netns, &f.ifaces)?;
        let disks = crate::block::resolve_disks(&f.disks)?;
        let processes = ProcessFilter::resolve(&f.pids, &f.comms, &f.containers)?;
        if let Some(comm) = args.sql.sql_pid.map(check_sql_pid).transpose()?.flatten() {
            eprintln!(
                "stalltrace: --sql-pid names {comm}, not sqlservr: its sessions are taken as SQL Server's"
            );
        }
        Ok(Plan {
            slow_io: crate::cli::slow_io_threshold(args.slow_io_ms),
            ports: f.ports.clone(),
            netns,
            ifaces: f.ifaces.clone(),
            disks,
            hz,
            sql: Discovery {
                pid: args.sql.sql_pid,
                tds_ports: args.sql.sql_ports.clone(),
                ag_ports: args.sql.sql_ag_ports.clone(),
                processes: processes.clone(),
            },
            sql_tls: args.sql.sql_tls,
            bulk_mbps: args.bulk_mbps,
            processes,
        })
    }

    /// What the `start` record says the run is limited to.
    pub fn filters(&self) -> Filters {
        Filters {
            ports: self.ports.clone(),
            netns: self.netns.clone(),
            ifaces: self.ifaces.clone(),
            disks: self.disks.iter().map(|(a, b)| format!("{a}:{b}")).collect(),
            pids: self.processes.tgids.clone(),
            comms: self.processes.comms.clone(),
            containers: self.processes.containers.clone(),
        }
    }
}
