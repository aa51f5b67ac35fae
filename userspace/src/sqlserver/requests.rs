//! Each SQL Server request's latency, as the kernel side timed it from its
//! connection's turns (ebpf/include/tds_turns.bpf.h), summed per instance
//! into one `sql_requests` record an interval.

use std::collections::{BTreeMap, HashMap};

use aya::maps::{HashMap as BpfHashMap, MapData, RingBuf};

use super::inventory::Inventory;
use crate::abi::{self, sql_request, tds_retransmit_key, tds_retransmit_mark};
use crate::enrich::RetransmitVerdict;
use crate::hist::Histogram;
use crate::host::clock::Clock;
use crate::probes::ring;
use crate::records::sql_requests::{
    RequestCounts, SLOW_REQUEST_MS, SessionRequests, SlowRequest, SqlRequestsRecord,
};

/// The sessions of an instance followed one by one in an interval: a session
/// beyond them is in every figure but `by_session`.
const SESSIONS_FOLLOWED: usize = 4096;
/// `by_session` lists at most this many sessions.
const SESSIONS_LISTED: usize = 16;

pub struct Requests {
    ring: RingBuf<MapData>,
    /// The kernel's verdict on each retransmission during a timed request.
    retransmits: BpfHashMap<MapData, tds_retransmit_key, tds_retransmit_mark>,
    clock: Clock,
    by_worker: BTreeMap<u32, Tally>,
}

/// One instance's requests since the last record.
#[derive(Default)]
struct Tally {
    counts: RequestCounts,
    total: Histogram,
    server: Histogram,
    delivery: Histogram,
    sessions: u64,
    /// Each session's requests, by socket inode.
    by_session: HashMap<u64, Followed>,
}

/// A session's requests, and when its slowest arrived (monotonic ns): made a
/// timestamp only if the session is listed, not at every request.
struct Followed {
    requests: SessionRequests,
    slowest_arrived_ns: u64,
}

impl Requests {
    pub fn new(
        ring: RingBuf<MapData>,
        retransmits: BpfHashMap<MapData, tds_retransmit_key, tds_retransmit_mark>,
    ) -> Self {
        Self {
            ring,
            retransmits,
            clock: Clock::new(),
            by_worker: BTreeMap::new(),
        }
    }

    /// What the kernel judged of the retransmission of `seq` on `sock_ino`
    /// at `ts_ns`: made before the tcp family's record of the segment was
    /// written, as this family attaches first (run::attach_all).
    pub fn retransmit_verdict(
        &self,
        sock_ino: u64,
        seq: u32,
        ts_ns: u64,
    ) -> Option<RetransmitVerdict> {
        let key = tds_retransmit_key {
            ino: sock_ino,
            seq,
            pad: 0,
        };
        let mark = self.retransmits.get(&key, 0).ok()?;
        Some(RetransmitVerdict {
            held_up_response: mark.held_up != 0,
            request_waited_ms: ts_ns.saturating_sub(mark.request_at) as f64 / 1e6,
        })
    }

    /// Take what the kernel sent (every poll: the ring holds about 18,000
    /// requests), naming each session's client while discovery still knows
    /// it.
    pub fn drain(&mut self, inventory: &Inventory) {
        for r in ring::drain::<sql_request>(&mut self.ring) {
            let tally = self.by_worker.entry(r.tgid).or_default();
            tally.add(&r, inventory);
        }
    }

    /// Whether a session with requests since the last record is one discovery
    /// has not seen (it opened after the last refresh began).
    pub fn has_unknown_session(&self, inventory: &Inventory) -> bool {
        self.by_worker
            .values()
            .flat_map(|tally| tally.by_session.iter())
            .any(|(&ino, f)| f.requests.client.is_none() && inventory.session_seen(ino).is_none())
    }

    /// One record per instance that had requests since the last call or has
    /// MARS sessions (whose requests are not timed: the record says so).
    pub fn records(&mut self, interval_ms: u64, inventory: &Inventory) -> Vec<SqlRequestsRecord> {
        self.drain(inventory);
        let mars = inventory.mars_sessions();
        for &pid in mars.keys() {
            self.by_worker.entry(pid).or_default();
        }
        std::mem::take(&mut self.by_worker)
            .into_iter()
            .map(|(pid, tally)| {
                let mut r = tally.record(pid, interval_ms, inventory, &self.clock);
                r.mars_sessions = mars.get(&pid).copied().unwrap_or(0);
                r
            })
            .collect()
    }
}

impl Tally {
    fn add(&mut self, r: &sql_request, inventory: &Inventory) {
        let c = &mut self.counts;
        if r.spid == 0 {
            c.without_spid += 1;
            return;
        }
        let total_ns = r.server_ns + r.delivery_ns;
        c.requests += 1;
        let retransmitted = u64::from(r.flags & abi::SQL_REQ_RETRANSMITTED as u16 != 0);
        let slow = u64::from(total_ns >= SLOW_REQUEST_MS * 1_000_000);
        c.retransmitted += retransmitted;
        c.slow += slow;
        c.slow_retransmitted += slow * retransmitted;
        self.total.record(total_ns, 1);
        self.server.record(r.server_ns, 1);
        self.delivery.record(r.delivery_ns, 1);
        let request = SlowRequest {
            arrived: String::new(),
            total_us: total_ns / 1000,
            server_us: r.server_ns / 1000,
            delivery_us: r.delivery_ns / 1000,
            retransmits: r.retransmits,
            response_bytes: r.response_bytes,
        };
        if let Some(followed) = self.by_session.get_mut(&r.ino) {
            let session = &mut followed.requests;
            session.requests += 1;
            session.retransmitted += retransmitted;
            session.slow += slow;
            if request.total_us > session.slowest.total_us {
                session.slowest = request;
                followed.slowest_arrived_ns = r.arrived_ns;
            }
            return;
        }
        self.sessions += 1;
        if self.by_session.len() < SESSIONS_FOLLOWED {
            let session = SessionRequests {
                spid: r.spid,
                client: inventory.session_seen(r.ino).map(|s| s.remote),
                requests: 1,
                retransmitted,
                slow,
                slowest: request,
            };
            self.by_session.insert(
                r.ino,
                Followed {
                    requests: session,
                    slowest_arrived_ns: r.arrived_ns,
                },
            );
        }
    }

    fn record(
        self,
        pid: u32,
        interval_ms: u64,
        inventory: &Inventory,
        clock: &Clock,
    ) -> SqlRequestsRecord {
        let mut followed: Vec<(u64, Followed)> = self.by_session.into_iter().collect();
        followed.sort_by(|(_, a), (_, b)| {
            let (a, b) = (&a.requests, &b.requests);
            (b.slowest.total_us.cmp(&a.slowest.total_us)).then(a.spid.cmp(&b.spid))
        });
        followed.truncate(SESSIONS_LISTED);
        let by_session = followed
            .into_iter()
            .map(|(ino, f)| {
                let mut s = f.requests;
                // A session's first requests may end before discovery has seen it,
                // its last after discovery saw it close.
                s.client = s
                    .client
                    .or_else(|| inventory.session_seen(ino).map(|s| s.remote));
                s.slowest.arrived = clock.monotonic_to_rfc3339(f.slowest_arrived_ns);
                s
            })
            .collect();
        SqlRequestsRecord {
            interval_ms,
            pid,
            counts: RequestCounts {
                slow_ms: SLOW_REQUEST_MS,
                ..self.counts
            },
            total_us: self.total.to_record(1e-3),
            server_us: self.server.to_record(1e-3),
            delivery_us: self.delivery.to_record(1e-3),
            sessions: self.sessions,
            mars_sessions: 0,
            by_session,
        }
    }
}
