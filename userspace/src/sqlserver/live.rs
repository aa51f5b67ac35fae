//! SQL Server correlation while running: discovery (inventory.rs) every
//! interval, the kernel side's TDS header reader for SPIDs
//! (`ebpf/sqlserver.bpf.c`), and the lookups other families use to tag their
//! records.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use aya::Btf;
use aya::maps::{HashMap as BpfHashMap, MapData};

use super::inventory::{Discovery, Inventory};
use super::record::{SqlInstanceRecord, SqlSessionRecord, SqlTag};
use crate::abi::{self, tds_session};
use crate::error::UserError;
use crate::output::JsonWriter;
use crate::probes::lost::LostCounters;
use crate::probes::{self, AttachedFamily, Ctx, Family, FamilyFailure, ModeChoice};

pub struct SqlServer {
    family: AttachedFamily,
    workers: BpfHashMap<MapData, u32, u8>,
    tds: BpfHashMap<MapData, u64, tds_session>,
    lost: LostCounters,
    inventory: Inventory,
    /// Worker pids already in the kernel's sql_workers map.
    pushed: HashSet<u32>,
    refreshed_for_miss: bool,
}

impl SqlServer {
    pub fn attach(
        mode: ModeChoice,
        discovery: Discovery,
        btf: &Btf,
    ) -> Result<Self, FamilyFailure> {
        let mut family = probes::attach_family(
            probes::embedded("sqlserver"),
            mode,
            &probes::Setup::default(),
            btf,
        )?;
        let ebpf = &mut family.ebpf;
        let maps = (|| -> anyhow::Result<_> {
            Ok((
                probes::take_map(ebpf, "sql_workers")?,
                probes::take_map(ebpf, "tds_sessions")?,
                LostCounters::take("sqlserver", ebpf)?,
            ))
        })();
        match maps {
            Ok((workers, tds, lost)) => Ok(Self {
                family,
                workers,
                tds,
                lost,
                inventory: Inventory::new(discovery),
                pushed: HashSet::new(),
                refreshed_for_miss: false,
            }),
            Err(e) => Err(FamilyFailure {
                hooks: family.hooks.clone(),
                error: UserError::probe_failed("sqlserver", "its maps", &e.to_string()),
            }),
        }
    }

    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// Discover again, tell the kernel side about new workers, read the SPIDs it
    /// learned, and write what changed.
    pub fn refresh(&mut self, ts: &str, out: &mut JsonWriter) -> io::Result<()> {
        self.refreshed_for_miss = false;
        let changes = self.inventory.refresh(ts);
        for pid in self.inventory.worker_pids() {
            if self.pushed.insert(pid) {
                let _ = self.workers.insert(pid, 1, 0);
            }
        }
        for instance in &changes.instances {
            out.emit("sql_instance", ts, &SqlInstanceRecord { instance })?;
        }
        for session in &changes.opened {
            out.emit(
                "sql_session",
                ts,
                &SqlSessionRecord {
                    event: "open",
                    session,
                },
            )?;
        }
        for session in &changes.closed {
            let _ = self.tds.remove(&session.sock_ino);
            out.emit(
                "sql_session",
                ts,
                &SqlSessionRecord {
                    event: "closed",
                    session,
                },
            )?;
        }
        let mut identified = Vec::new();
        for session in self.inventory.sessions_mut() {
            let Ok(t) = self.tds.get(&session.sock_ino, 0) else {
                continue;
            };
            let spid = (t.flags & abi::TDS_F_SPID as u8 != 0).then_some(t.spid);
            let encrypted = t.flags & abi::TDS_F_ENCRYPTED as u8 != 0;
            if spid != session.spid || encrypted != session.encrypted {
                session.spid = spid;
                session.encrypted = encrypted;
                identified.push(session.clone());
            }
        }
        for session in &identified {
            out.emit(
                "sql_session",
                ts,
                &SqlSessionRecord {
                    event: "identified",
                    session,
                },
            )?;
        }
        Ok(())
    }

    /// The session of a socket, by inode; or by its tuple.
    pub fn tag_socket(
        &self,
        sock_ino: u64,
        netns: u32,
        local_port: u16,
        remote: SocketAddr,
    ) -> Option<SqlTag> {
        let inv = &self.inventory;
        inv.session_by_inode(sock_ino)
            .or_else(|| inv.session_by_tuple(netns, local_port, remote))
            .map(SqlTag::for_session)
    }

    /// Tag for something a process did (a slow I/O): the instance when it is a worker.
    pub fn tag_process(&self, pid: u32) -> Option<SqlTag> {
        self.inventory
            .is_worker(pid)
            .then(|| SqlTag::for_instance(pid))
    }

    /// A worker's socket the last refresh did not know (a session younger than
    /// the interval): refresh once per drain so its records are tagged.
    pub fn missed(&mut self, pid: Option<u32>, ts: &str, out: &mut JsonWriter) -> io::Result<()> {
        if self.refreshed_for_miss || !pid.is_some_and(|p| self.inventory.is_worker(p)) {
            return Ok(());
        }
        self.refresh(ts, out)?;
        self.refreshed_for_miss = true;
        Ok(())
    }
}

/// `addr:port` as a SocketAddr.
pub fn socket(addr: &str, port: u16) -> Option<SocketAddr> {
    addr.parse::<IpAddr>()
        .ok()
        .map(|ip| SocketAddr::new(ip, port))
}

impl Family for SqlServer {
    fn attached(&self) -> &AttachedFamily {
        &self.family
    }

    fn drain_events(&mut self, _ctx: &mut Ctx, _out: &mut JsonWriter) -> io::Result<()> {
        Ok(())
    }

    /// The run loop calls `refresh` itself, before the other families collect.
    fn collect(
        &mut self,
        _interval: Duration,
        _ts: &str,
        _ctx: &mut Ctx,
        _out: &mut JsonWriter,
    ) -> io::Result<()> {
        Ok(())
    }

    fn lost(&mut self) -> Vec<(String, u64)> {
        self.lost.deltas(&self.family.ebpf)
    }
}
