//! SQL Server correlation while running: discovery (inventory.rs) every
//! interval, the kernel side's TDS header reader for SPIDs
//! (`ebpf/sqlserver.bpf.c`), and the lookups other families use to tag their
//! records.

use std::collections::HashSet;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use aya::Btf;
use aya::maps::{Array, HashMap as BpfHashMap, MapData};

use super::dmv::{Dmv, DmvRow, DmvSession, KnownSocket, join};
use super::inventory::{Discovery, Inventory, Session};
use super::procfs;
use super::record::{SqlInstanceRecord, SqlSessionRecord, SqlTag};
use crate::abi::{self, tds_session};
use crate::error::UserError;
use crate::output::JsonWriter;
use crate::probes::lost::LostCounters;
use crate::probes::{self, AttachedFamily, Ctx, Family, FamilyFailure, ModeChoice};

/// The least time between two refreshes made for records of unknown sockets.
const MISS_REFRESH_EVERY: Duration = Duration::from_millis(100);

pub struct SqlServer {
    family: AttachedFamily,
    workers: BpfHashMap<MapData, u32, u8>,
    /// Set to 1 with the first worker: until then the kernel side leaves at once.
    workers_known: Array<MapData, u32>,
    tds: BpfHashMap<MapData, u64, tds_session>,
    lost: LostCounters,
    inventory: Inventory,
    /// Worker pids already in the kernel's sql_workers map.
    pushed: HashSet<u32>,
    last_miss_refresh: Option<Instant>,
    /// DMV enrichment, when asked for (`--sql-dmv`).
    dmv: Option<Dmv>,
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
                probes::take_map(ebpf, "sql_workers_known")?,
                probes::take_map(ebpf, "tds_sessions")?,
                LostCounters::take("sqlserver", ebpf)?,
            ))
        })();
        match maps {
            Ok((workers, workers_known, tds, lost)) => Ok(Self {
                family,
                workers,
                workers_known,
                tds,
                lost,
                inventory: Inventory::new(discovery),
                pushed: HashSet::new(),
                last_miss_refresh: None,
                dmv: None,
            }),
            Err(e) => Err(FamilyFailure {
                hooks: family.hooks.clone(),
                error: UserError::probe_failed("sqlserver", "its maps", &e.to_string()),
            }),
        }
    }

    /// Poll SQL Server's DMVs and put what they say on sessions and tags.
    pub fn enable_dmv(&mut self, dmv: Dmv) {
        self.dmv = Some(dmv);
    }

    pub fn inventory(&self) -> &Inventory {
        &self.inventory
    }

    /// Discover again, tell the kernel side about new workers, read the SPIDs it
    /// learned, and write what changed.
    pub fn refresh(&mut self, ts: &str, out: &mut JsonWriter) -> io::Result<()> {
        let changes = self.inventory.refresh(ts);
        let live = self.inventory.worker_pids();
        for pid in &live {
            if self.pushed.insert(*pid) {
                let _ = self.workers.insert(pid, 1, 0);
                // After the worker is in the map, so the kernel side never sees the flag without it.
                let _ = self.workers_known.set(0, 1, 0);
            }
        }
        // A worker that exited (a restart, a crash) leaves the kernel's table:
        // it holds 64, and its pid may come back as another process's.
        let exited: Vec<u32> = self
            .pushed
            .iter()
            .copied()
            .filter(|pid| !live.contains(pid))
            .collect();
        for pid in exited {
            let _ = self.workers.remove(&pid);
            self.pushed.remove(&pid);
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
        let mut identified = self.join_dmv();
        for session in self.inventory.sessions_mut() {
            let Ok(t) = self.tds.get(&session.sock_ino, 0) else {
                continue;
            };
            let spid = (t.flags & abi::TDS_F_SPID as u8 != 0).then_some(t.spid);
            let encrypted = t.flags & abi::TDS_F_ENCRYPTED as u8 != 0;
            if spid != session.spid || encrypted != session.encrypted {
                session.spid = spid;
                session.encrypted = encrypted;
                identified.retain(|s| s.sock_ino != session.sock_ino);
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

    /// Put the latest DMV rows on the sessions; report the poller's news on
    /// stderr. Returns the sessions whose DMV identity changed (who is on the
    /// connection, not what it waits on: that changes at every poll).
    fn join_dmv(&mut self) -> Vec<Session> {
        let Some(dmv) = &self.dmv else {
            return Vec::new();
        };
        for status in dmv.take_status() {
            eprintln!("stalltrace: {status}");
        }
        let Some(snapshot) = dmv.latest() else {
            return Vec::new();
        };
        // Rows older than a few polls describe a SQL Server we no longer reach.
        let age_ms = chrono::Utc::now().timestamp_millis() - snapshot.polled_at_ms;
        if age_ms > 3 * dmv.poll_every().as_millis() as i64 {
            return Vec::new();
        }
        apply_dmv_rows(&snapshot.rows, self.inventory.sessions_mut().collect())
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
        let session = inv
            .session_by_inode(sock_ino)
            .or_else(|| inv.session_by_tuple(netns, local_port, remote))?;
        let mut tag = SqlTag::for_session(session);
        if tag.spid.is_none() && !tag.encrypted {
            // Learned by the kernel since the last refresh (the session's
            // `identified` record follows at the next one).
            tag.spid = self
                .tds
                .get(&session.sock_ino, 0)
                .ok()
                .filter(|t| t.flags & abi::TDS_F_SPID as u8 != 0)
                .map(|t| t.spid);
        }
        Some(tag)
    }

    /// Tag for something a process did (a slow I/O): the instance when it is a worker.
    pub fn tag_process(&self, pid: u32) -> Option<SqlTag> {
        self.inventory
            .is_worker(pid)
            .then(|| SqlTag::for_instance(pid))
    }

    /// A socket of a worker (or of a `sqlservr` not yet discovered) that the
    /// last refresh did not know: a session or an instance younger than the
    /// interval. Refresh now so its records are tagged, at most once per
    /// `MISS_REFRESH_EVERY`: a burst of misses costs one /proc scan.
    pub fn missed(&mut self, pid: Option<u32>, ts: &str, out: &mut JsonWriter) -> io::Result<()> {
        let Some(pid) = pid else { return Ok(()) };
        if self
            .last_miss_refresh
            .is_some_and(|at| at.elapsed() < MISS_REFRESH_EVERY)
        {
            return Ok(());
        }
        if !self.inventory.is_worker(pid) && !procfs::is_named(pid, "sqlservr") {
            return Ok(());
        }
        self.refresh(ts, out)?;
        self.last_miss_refresh = Some(Instant::now());
        Ok(())
    }
}

/// Put DMV rows on the sessions they join to (and clear those they no longer
/// do). Returns the sessions whose DMV identity changed: who is on the
/// connection, not what it waits on (that changes at every poll).
fn apply_dmv_rows(rows: &[DmvRow], mut sessions: Vec<&mut Session>) -> Vec<Session> {
    let sockets: Vec<KnownSocket> = sessions
        .iter()
        .filter_map(|s| KnownSocket::from_session(s, s.absent_at_ms))
        .collect();
    let mut joined = join(rows, &sockets);
    let mut changed = Vec::new();
    for session in sessions.iter_mut() {
        let fresh = joined.remove(&session.sock_ino).unwrap_or_default();
        let news = !same_people(&fresh, &session.dmv);
        session.dmv = fresh;
        if news {
            changed.push(session.clone());
        }
    }
    changed
}

/// Whether two DMV views of a connection name the same sessions, logins,
/// programs and databases.
fn same_people(a: &[DmvSession], b: &[DmvSession]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.session_id == y.session_id
                && x.connect_time_ms == y.connect_time_ms
                && x.login == y.login
                && x.program == y.program
                && x.database == y.database
        })
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sqlserver::inventory::SessionKind;
    use crate::sqlserver::record::SqlTag;

    fn session(ino: u64, client_port: u16) -> Session {
        Session {
            pid: 10,
            netns: 1,
            kind: SessionKind::Client,
            local: "10.0.0.1:1433".parse().unwrap(),
            remote: SocketAddr::new("10.0.0.7".parse().unwrap(), client_port),
            sock_ino: ino,
            first_seen: "2025-10-09T08:53:20.000000Z".into(),
            spid: None,
            encrypted: true,
            dmv: Vec::new(),
            absent_at_ms: None,
        }
    }

    fn row(spid: u16, client_port: u16, wait: &str) -> DmvRow {
        DmvRow {
            session_id: spid,
            connection_id: format!("C{spid}"),
            connect_time_ms: 1_760_000_000_000 - 60_000,
            net_transport: "TCP".into(),
            client_net_address: Some("10.0.0.7".into()),
            client_tcp_port: Some(client_port),
            local_tcp_port: Some(1433),
            encrypt_option: "TRUE".into(),
            login_name: Some("app".into()),
            program_name: Some("OrderService".into()),
            database: Some("sales".into()),
            session_status: Some("running".into()),
            wait_type: Some(wait.into()),
            ..Default::default()
        }
    }

    #[test]
    fn dmv_rows_name_encrypted_sessions_and_only_identity_is_news() {
        let (mut a, mut b) = (session(1, 50001), session(2, 50002));
        let changed = apply_dmv_rows(&[row(57, 50001, "WRITELOG")], vec![&mut a, &mut b]);
        assert_eq!(changed.len(), 1, "only the joined session changed");
        // An encrypted session's SPID and login come from the DMVs.
        let tag = SqlTag::for_session(&a);
        assert_eq!(tag.spid, Some(57));
        assert_eq!(tag.login.as_deref(), Some("app"));
        assert_eq!(tag.wait_type.as_deref(), Some("WRITELOG"));
        assert_eq!(SqlTag::for_session(&b).spid, None);

        // A new wait is not news; the tag follows it all the same.
        let changed = apply_dmv_rows(&[row(57, 50001, "ASYNC_NETWORK_IO")], vec![&mut a]);
        assert!(changed.is_empty());
        assert_eq!(
            SqlTag::for_session(&a).wait_type.as_deref(),
            Some("ASYNC_NETWORK_IO")
        );

        // The connection gone from the DMVs: its DMV fields go too, and that is news.
        let changed = apply_dmv_rows(&[], vec![&mut a]);
        assert_eq!(changed.len(), 1);
        assert!(a.dmv.is_empty());
    }
}
