//! SQL Server correlation while running: discovery (inventory.rs) every
//! interval, the kernel side's TDS header reader for SPIDs
//! (`ebpf/sqlserver.bpf.c`) with its uprobes on the TLS plaintext (tls.rs),
//! and the lookups other families use to tag their records.

use std::collections::{HashMap, HashSet};
use std::io;
use std::path::Path;
use std::time::{Duration, Instant};

use aya::Btf;
use aya::maps::{Array, HashMap as BpfHashMap, MapData};

use super::dmv::{Dmv, apply_dmv_rows};
use super::inventory::{Discovery, Inventory, Session};
use super::requests::Requests;
use super::tls::{self, TlsHooks, TlsPolicy, TlsSpids, TlsSpidsState};
use crate::abi::{self, tds_session};
use crate::enrich::{Connection, RetransmitVerdict, Tagger};
use crate::error::UserError;
use crate::host::procfs;
use crate::output::JsonWriter;
use crate::probes::lost::LostCounters;
use crate::probes::{self, AttachedFamily, FamilyFailure, ModeChoice};
use crate::records::sql::{
    Instance, SessionEvent, SpidSource, SqlSessionRecord, SqlTag, SqlTlsStart,
};

/// The `lost` source of workers the kernel's sql_workers table refused.
const WORKER_UNWATCHED: &str = "sqlserver.worker_unwatched";

/// The least time between two refreshes made for records of unknown sockets.
const MISS_REFRESH_EVERY: Duration = Duration::from_millis(100);

pub struct SqlServer {
    family: AttachedFamily,
    workers: BpfHashMap<MapData, u32, u8>,
    /// `enum sql_control_slot`: the first worker known, the TLS doorbell.
    control: Array<MapData, u32>,
    tds: BpfHashMap<MapData, u64, tds_session>,
    /// Each request's latency, from the kernel's `sql_requests` ring.
    requests: Requests,
    lost: LostCounters,
    inventory: Inventory,
    /// Worker pids already in the kernel's sql_workers map.
    pushed: HashSet<u32>,
    /// Workers the map had no room for: said once each, tried again at
    /// every refresh; and how many of them `lost` has not counted yet.
    unwatched: HashSet<u32>,
    unwatched_uncounted: u64,
    /// The SSL_write uprobes of each worker.
    tls: TlsHooks,
    /// Each worker's word on its TLS SPIDs, for its `sql_instance` records.
    tls_summaries: HashMap<u32, TlsSpids>,
    /// Encrypted sessions still without a SPID: the kernel's count of their
    /// watched sends that named none, at the last refresh.
    tls_tries: HashMap<u64, u32>,
    last_miss_refresh: Option<Instant>,
    /// DMV enrichment, when asked for (`--sql-dmv`).
    dmv: Option<Dmv>,
    /// What discovery found and the run loop has not written yet, with when
    /// it was found (`emit_news`): enrichment never writes output itself.
    news: Vec<(String, News)>,
}

/// A record discovery made.
enum News {
    Instance(Instance),
    Session(SqlSessionRecord),
}

impl SqlServer {
    pub fn attach(
        mode: ModeChoice,
        discovery: Discovery,
        tls: TlsPolicy,
        btf: &Btf,
    ) -> Result<Self, FamilyFailure> {
        let globals = super::load_globals();
        let setup = probes::Setup {
            globals: &globals,
            ..Default::default()
        };
        let mut family = probes::attach_family(probes::embedded("sqlserver"), mode, &setup, btf)?;
        let ebpf = &mut family.ebpf;
        let maps = (|| -> anyhow::Result<_> {
            Ok((
                probes::take_map(ebpf, "sql_workers")?,
                probes::take_map(ebpf, "sql_control")?,
                probes::take_map(ebpf, "tds_sessions")?,
                probes::take_map(ebpf, "sql_requests")?,
                probes::take_map(ebpf, "tds_retransmits")?,
                LostCounters::take("sqlserver", ebpf)?,
            ))
        })();
        let tls = TlsHooks::load(&mut family.ebpf, tls);
        match maps {
            Ok((workers, control, tds, requests, retransmits, lost)) => Ok(Self {
                family,
                workers,
                control,
                tds,
                requests: Requests::new(requests, retransmits),
                lost,
                inventory: Inventory::new(discovery),
                pushed: HashSet::new(),
                unwatched: HashSet::new(),
                unwatched_uncounted: 0,
                tls,
                tls_summaries: HashMap::new(),
                tls_tries: HashMap::new(),
                last_miss_refresh: None,
                dmv: None,
                news: Vec::new(),
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

    /// The loaded object and its hooks (the start record, program costs).
    pub fn attached(&self) -> &AttachedFamily {
        &self.family
    }

    /// What the `start` record says of SPIDs of encrypted sessions.
    pub fn tls_start(&self) -> SqlTlsStart {
        self.tls.start()
    }

    /// `stalltrace check`: whether this host can read encrypted sessions'
    /// SPIDs, and for each SQL Server worker running now, whether its libssl
    /// takes the uprobes (attached, then detached again). One line each.
    pub fn check_tls(&mut self, ts: &str) -> Vec<String> {
        let start = self.tls.start();
        let mut lines = vec![match &start.reason {
            None => "uprobes available: SSL_write and SSL_write_ex of each worker's libssl, \
                     attached while it has encrypted sessions without a SPID (--sql-tls)"
                .to_string(),
            Some(why) => {
                format!("UNAVAILABLE: {why}; encrypted sessions get SPIDs only from --sql-dmv")
            }
        }];
        self.inventory.refresh(ts);
        for pid in self.inventory.worker_pids() {
            let mut kernel = tls::Kernel {
                ebpf: &mut self.family.ebpf,
                workers: &mut self.workers,
            };
            let summary = self.tls.worker_found(&mut kernel, pid);
            let watching = self.tls.watching(pid);
            self.tls.worker_gone(&mut self.family.ebpf, pid);
            let _ = self.workers.remove(&pid);
            lines.push(match (&summary.reason, &summary.library) {
                (None, Some(lib)) if watching => format!(
                    "sqlservr {pid}: {} of {} attached (and detached again)",
                    summary.symbols.join(" and "),
                    lib.display()
                ),
                (Some(why), _) => format!(
                    "sqlservr {pid}: FAILED: {why}; its encrypted sessions get SPIDs only from \
                     --sql-dmv"
                ),
                _ => format!("sqlservr {pid}: not tried ({:?})", summary.state),
            });
        }
        if self.inventory.worker_pids().is_empty() {
            lines.push("no SQL Server worker runs now: nothing else to try".into());
        }
        lines
    }

    /// Between intervals (every 100 ms): when the kernel rang (a socket of
    /// an unwatched worker turned to TLS), attach the idle workers' uprobes
    /// at once rather than at the next refresh, so that the session's next
    /// response names it.
    pub fn poll(&mut self, ts: &str) {
        self.requests.drain(&self.inventory);
        let wanted = abi::SQL_CTL_TLS_WANTED;
        if !self.control.get(&wanted, 0).is_ok_and(|v| v != 0) {
            return;
        }
        let _ = self.control.set(wanted, 0, 0);
        let mut kernel = tls::Kernel {
            ebpf: &mut self.family.ebpf,
            workers: &mut self.workers,
        };
        for (pid, summary) in self.tls.rang(&mut kernel) {
            self.tls_changed(pid, summary, ts);
        }
    }

    /// A worker's TLS summary changed: say so, and write its `sql_instance` again.
    fn tls_changed(&mut self, pid: u32, summary: TlsSpids, ts: &str) {
        say_tls(pid, &summary);
        self.tls_summaries.insert(pid, summary.clone());
        if let Some(instance) = self.inventory.instances().iter().find(|i| i.pid == pid) {
            let instance = Instance {
                tls: Some(summary),
                ..instance.clone()
            };
            self.news.push((ts.to_string(), News::Instance(instance)));
        }
    }

    /// Write each instance's `sql_requests` record of the interval that ends.
    pub fn emit_requests(
        &mut self,
        interval_ms: u64,
        ts: &str,
        out: &mut JsonWriter,
    ) -> io::Result<()> {
        // A session that opened while the interval's refresh ran has requests
        // but no client yet: look once more, so that its record names it.
        self.requests.drain(&self.inventory);
        if self.requests.has_unknown_session(&self.inventory) {
            self.refresh(ts);
            self.emit_news(out)?;
        }
        for record in self.requests.records(interval_ms, &self.inventory) {
            out.emit(ts, &record)?;
        }
        Ok(())
    }

    /// New losses since the last call, by source: the kernel side's, and
    /// the workers the kernel's table had no room for.
    pub fn lost(&mut self) -> Vec<(String, u64)> {
        let mut lost = self.lost.deltas(&self.family.ebpf);
        if self.unwatched_uncounted > 0 {
            lost.push((WORKER_UNWATCHED.into(), self.unwatched_uncounted));
            self.unwatched_uncounted = 0;
        }
        lost
    }

    /// A worker the kernel's sql_workers table refused (full, on a host with
    /// more SQL Server processes than it holds; the error says if it was
    /// anything else): said and counted once, tried again at every refresh.
    fn unwatched_worker(&mut self, pid: u32, e: &aya::maps::MapError) {
        if self.unwatched.insert(pid) {
            self.unwatched_uncounted += 1;
            eprintln!(
                "stalltrace: sqlservr {pid} is not watched: the kernel's table of SQL Server \
                 workers refused it ({}); its sessions get no SPID from the kernel and its \
                 requests are not timed until it gets in (tried again every interval; `lost`: \
                 {WORKER_UNWATCHED})",
                probes::describe(e)
            );
        }
    }

    /// Write the records discovery made since the last call (instances and
    /// sessions found, identified or closed), in the order it found them.
    pub fn emit_news(&mut self, out: &mut JsonWriter) -> io::Result<()> {
        for (ts, news) in self.news.drain(..) {
            match news {
                News::Instance(instance) => out.emit(&ts, &instance)?,
                News::Session(session) => out.emit(&ts, &session)?,
            };
        }
        Ok(())
    }

    /// Discover again, tell the kernel side about new workers, read the SPIDs
    /// it learned, and keep what changed for `emit_news`.
    pub fn refresh(&mut self, ts: &str) {
        // Before discovery forgets the sessions that closed: their requests name their clients.
        self.requests.drain(&self.inventory);
        let changes = self.inventory.refresh(ts);
        let live = self.inventory.worker_pids();
        // A worker that exited (a restart, a crash) leaves the kernel's table
        // first: it holds 64, a restart's new worker takes the place, and the
        // old pid may come back as another process's.
        self.unwatched.retain(|pid| live.contains(pid));
        let exited: Vec<u32> = self
            .pushed
            .iter()
            .copied()
            .filter(|pid| !live.contains(pid))
            .collect();
        for pid in exited {
            self.tls.worker_gone(&mut self.family.ebpf, pid);
            self.tls_summaries.remove(&pid);
            let _ = self.workers.remove(&pid);
            self.pushed.remove(&pid);
        }
        for pid in &live {
            if !self.pushed.contains(pid) {
                if let Err(e) = self.workers.insert(pid, abi::SQL_WORKER_LISTED as u8, 0) {
                    self.unwatched_worker(*pid, &e);
                    continue;
                }
                self.unwatched.remove(pid);
                self.pushed.insert(*pid);
                // After the worker is in the map, so the kernel side never sees the flag without it.
                let _ = self.control.set(abi::SQL_CTL_WORKERS_KNOWN, 1, 0);
                let mut kernel = tls::Kernel {
                    ebpf: &mut self.family.ebpf,
                    workers: &mut self.workers,
                };
                let summary = self.tls.worker_found(&mut kernel, *pid);
                // A host without uprobes was said once, at start.
                if summary.reason != self.tls.start().reason {
                    say_tls(*pid, &summary);
                }
                self.tls_summaries.insert(*pid, summary);
            }
        }
        let session = |event, session| News::Session(SqlSessionRecord { event, session });
        let mut news: Vec<News> = changes
            .instances
            .into_iter()
            .map(|i| {
                News::Instance(Instance {
                    tls: self.tls_summaries.get(&i.pid).cloned(),
                    ..i
                })
            })
            .collect();
        news.extend(
            changes
                .opened
                .into_iter()
                .map(|s| session(SessionEvent::Open, s)),
        );
        for closed in changes.closed {
            let _ = self.tds.remove(&closed.sock_ino);
            news.push(session(SessionEvent::Closed, closed));
        }
        self.distrust_conflicts(ts);
        let mut identified = self.join_dmv();
        let mut need_tls = HashSet::new();
        let mut tries = HashMap::new();
        for session in self.inventory.sessions_mut() {
            let kernel = self.tds.get(&session.sock_ino, 0).ok();
            let encrypted = kernel.is_some_and(|t| t.flags & abi::TDS_F_ENCRYPTED as u8 != 0);
            let mars = kernel.is_some_and(|t| t.flags & abi::TDS_F_MARS as u8 != 0);
            let from_kernel = kernel.and_then(|t| kernel_spid(&t, self.tls.trusted(session.pid)));
            let own = session.dmv.first().map(|d| (d.session_id, SpidSource::Dmv));
            let (spid, source) = from_kernel.or(own).unzip();
            // Its SPID, or whether it is MARS, still to be read from TLS, and
            // sending since the last refresh: the uprobes stay (an idle one's
            // next send, counted by the kernel, brings them back).
            let tls_named = source == Some(SpidSource::TlsPlaintext);
            let (flag, still) = match from_kernel {
                None => (abi::TDS_F_TLS_GAVE_UP, encrypted),
                Some(_) => (abi::TDS_F_MARS_KNOWN, tls_named),
            };
            if let Some(t) = kernel.filter(|t| still && t.flags & flag as u8 == 0) {
                if self.tls_tries.get(&session.sock_ino) != Some(&t.tls_unpaired) {
                    need_tls.insert(session.pid);
                }
                tries.insert(session.sock_ino, t.tls_unpaired);
            }
            let was = (session.spid, session.spid_source);
            if (spid, source) != was || (encrypted, mars) != (session.encrypted, session.mars) {
                session.spid = spid;
                session.spid_source = source;
                session.encrypted = encrypted;
                session.mars = mars;
                identified.retain(|s| s.sock_ino != session.sock_ino);
                identified.push(session.clone());
            }
        }
        self.tls_tries = tries;
        news.extend(
            identified
                .into_iter()
                .map(|s| session(SessionEvent::Identified, s)),
        );
        self.news
            .extend(news.into_iter().map(|n| (ts.to_string(), n)));
        let mut kernel = tls::Kernel {
            ebpf: &mut self.family.ebpf,
            workers: &mut self.workers,
        };
        let mut failed = Vec::new();
        for &pid in &need_tls {
            failed.extend(self.tls.needed(&mut kernel, pid).map(|s| (pid, s)));
        }
        self.tls.expire(&mut kernel, &need_tls);
        for (pid, summary) in failed {
            self.tls_changed(pid, summary, ts);
        }
    }

    /// A worker on whose sockets a TLS pairing contradicted an earlier one:
    /// its TLS SPIDs stop, and the kernel forgets those it gave.
    fn distrust_conflicts(&mut self, ts: &str) {
        let conflicted: HashSet<u32> = self
            .inventory
            .sessions_mut()
            .filter(|s| {
                self.tds
                    .get(&s.sock_ino, 0)
                    .is_ok_and(|t| t.flags & abi::TDS_F_TLS_CONFLICT as u8 != 0)
            })
            .map(|s| s.pid)
            .collect();
        for pid in conflicted {
            let mut kernel = tls::Kernel {
                ebpf: &mut self.family.ebpf,
                workers: &mut self.workers,
            };
            if let Some(summary) = self.tls.distrust(&mut kernel, pid) {
                self.tls_changed(pid, summary, ts);
            }
        }
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
}

/// One line on stderr when a worker's encrypted sessions get no SPIDs from
/// TLS (not for `--sql-tls off`: the user chose it).
fn say_tls(pid: u32, summary: &TlsSpids) {
    if let Some(why) = &summary.reason
        && summary.state != TlsSpidsState::Off
    {
        eprintln!(
            "stalltrace: sqlservr {pid}: no SPIDs from TLS: {why}; its encrypted sessions get \
             theirs only from --sql-dmv"
        );
    }
}

/// The SPID the kernel side learned for a socket, and from where; one from
/// TLS only while the worker's TLS SPIDs are trusted.
fn kernel_spid(t: &tds_session, tls_trusted: bool) -> Option<(u16, SpidSource)> {
    if t.flags & abi::TDS_F_SPID as u8 == 0 {
        return None;
    }
    if t.flags & abi::TDS_F_SPID_TLS as u8 == 0 {
        return Some((t.spid, SpidSource::TdsHeader));
    }
    (tls_trusted && t.flags & abi::TDS_F_TLS_CONFLICT as u8 == 0)
        .then_some((t.spid, SpidSource::TlsPlaintext))
}

/// The lookups the other families tag their records with.
impl Tagger for SqlServer {
    /// The session of a socket, by inode; or by its connection.
    fn tag_socket(&self, sock_ino: u64, c: &Connection) -> Option<SqlTag> {
        let inv = &self.inventory;
        let session = inv
            .session_by_inode(sock_ino)
            .or_else(|| inv.session_by_tuple(c.netns, c.sport, c.remote()))?;
        let mut tag = SqlTag::for_session(session);
        tag.container = inv.container_id(session.pid);
        if tag.spid.is_none() {
            // Learned by the kernel since the last refresh (the session's
            // `identified` record follows at the next one).
            let trusted = self.tls.trusted(session.pid);
            if let Some((spid, source)) = self
                .tds
                .get(&session.sock_ino, 0)
                .ok()
                .and_then(|t| kernel_spid(&t, trusted))
            {
                tag.spid = Some(spid);
                tag.spid_source = Some(source);
            }
        }
        Some(tag)
    }

    fn retransmit_verdict(&self, sock_ino: u64, seq: u32, ts_ns: u64) -> Option<RetransmitVerdict> {
        self.requests.retransmit_verdict(sock_ino, seq, ts_ns)
    }

    fn tag_process(&self, pid: u32) -> Option<SqlTag> {
        self.inventory.is_worker(pid).then(|| SqlTag {
            container: self.inventory.container_id(pid),
            ..SqlTag::for_instance(pid)
        })
    }

    /// A socket of a worker (or of a `sqlservr` not yet discovered) that the
    /// last refresh did not know: a session or an instance younger than the
    /// interval. Refresh now so its records are tagged, at most once per
    /// `MISS_REFRESH_EVERY`: a burst of misses costs one /proc scan.
    fn missed(&mut self, pid: Option<u32>, ts: &str) {
        let Some(pid) = pid else { return };
        if self
            .last_miss_refresh
            .is_some_and(|at| at.elapsed() < MISS_REFRESH_EVERY)
        {
            return;
        }
        if !self.inventory.is_worker(pid) && !procfs::is_named(pid, "sqlservr") {
            return;
        }
        self.refresh(ts);
        self.last_miss_refresh = Some(Instant::now());
    }

    fn disk_role(&self, disk: (u32, u32)) -> Option<&'static str> {
        self.inventory.role_of(disk)
    }

    fn file_at(&self, disk: (u32, u32), sector: u64) -> Option<&Path> {
        self.inventory.file_at(disk, sector)
    }
}
