//! The previous sample of every established socket, per network namespace;
//! each new dump gives every socket's change since the last one. And the
//! rule that names what limited a flow.
//!
//! Sockets are keyed by their cookie, not their inode: the cookie is unique for
//! the boot, while an inode can be reused by a later socket and is 0 for a
//! connection still in the accept queue (which gets an inode when accepted).
//! Each dump replaces the namespace's whole table, so closed sockets are
//! dropped at once and memory follows the number of established sockets.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::diag::{TcpInfo, TcpSocket};
pub use crate::records::tcp::Limiter;

/// The cumulative tcp_info counters of one socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    pub bytes_acked: u64,
    pub bytes_received: u64,
    pub busy_us: u64,
    pub rwnd_limited_us: u64,
    pub sndbuf_limited_us: u64,
    pub retrans_segs: u64,
    pub data_segs_out: u64,
}

impl Counters {
    pub fn of(info: &TcpInfo) -> Self {
        Self {
            bytes_acked: info.bytes_acked,
            bytes_received: info.bytes_received,
            busy_us: info.busy_us,
            rwnd_limited_us: info.rwnd_limited_us,
            sndbuf_limited_us: info.sndbuf_limited_us,
            retrans_segs: u64::from(info.total_retrans),
            data_segs_out: u64::from(info.data_segs_out),
        }
    }

    /// The change since `prev`; None when any counter went down, which a
    /// socket's own counters never do: it is then not the same socket.
    pub fn since(&self, prev: &Self) -> Option<Self> {
        Some(Self {
            bytes_acked: self.bytes_acked.checked_sub(prev.bytes_acked)?,
            bytes_received: self.bytes_received.checked_sub(prev.bytes_received)?,
            busy_us: self.busy_us.checked_sub(prev.busy_us)?,
            rwnd_limited_us: self.rwnd_limited_us.checked_sub(prev.rwnd_limited_us)?,
            sndbuf_limited_us: self.sndbuf_limited_us.checked_sub(prev.sndbuf_limited_us)?,
            retrans_segs: self.retrans_segs.checked_sub(prev.retrans_segs)?,
            data_segs_out: self.data_segs_out.checked_sub(prev.data_segs_out)?,
        })
    }
}

/// The schema's rule, in the kernel's microseconds: `receiver` when the
/// receive window limited at least half the busy time; else `sender_buffer`
/// when the send buffer did; else `application` when the flow was busy less
/// than half the interval; else `network`. A flow that was never busy (no data
/// in flight) is `application`: "half of no time" limits nothing.
pub fn limiter(
    interval_us: u64,
    busy_us: u64,
    rwnd_limited_us: u64,
    sndbuf_limited_us: u64,
) -> Limiter {
    // Doubling instead of halving keeps the borderline exact; u128 cannot overflow.
    let twice = |v: u64| u128::from(v) * 2;
    let busy = u128::from(busy_us);
    if busy > 0 && twice(rwnd_limited_us) >= busy {
        Limiter::Receiver
    } else if busy > 0 && twice(sndbuf_limited_us) >= busy {
        Limiter::SenderBuffer
    } else if twice(busy_us) < u128::from(interval_us) {
        Limiter::Application
    } else {
        Limiter::Network
    }
}

/// One socket over one interval: its state at the end, and its counters' change.
#[derive(Clone, Debug, PartialEq)]
pub struct FlowDelta {
    pub socket: TcpSocket,
    pub delta: Counters,
    /// Between the two dumps.
    pub interval: Duration,
}

impl FlowDelta {
    /// Sent at least `bytes_per_s` (acknowledged by the peer) over the interval.
    /// Only the sending side qualifies: tcp_info's busy and limited times
    /// describe a socket's sending, so a socket that only receives has none.
    pub fn is_bulk(&self, bytes_per_s: f64) -> bool {
        let secs = self.interval.as_secs_f64();
        secs > 0.0 && self.delta.bytes_acked as f64 >= bytes_per_s * secs
    }

    pub fn limiter(&self) -> Limiter {
        let d = &self.delta;
        let interval_us = u64::try_from(self.interval.as_micros()).unwrap_or(u64::MAX);
        match limiter(
            interval_us,
            d.busy_us,
            d.rwnd_limited_us,
            d.sndbuf_limited_us,
        ) {
            Limiter::Network if self.socket.is_on_this_host() => Limiter::Host,
            other => other,
        }
    }
}

struct Namespace {
    /// When its last complete dump was taken.
    at: Duration,
    /// By socket cookie: the inode-independent identity.
    sockets: HashMap<u64, Counters>,
}

/// The previous sample of every socket, per namespace inode.
#[derive(Default)]
pub struct FlowTable {
    namespaces: HashMap<u32, Namespace>,
}

impl FlowTable {
    /// A complete dump of `netns` taken at `now` (any monotonic clock). Returns
    /// the change of every socket that was also in the namespace's previous
    /// dump with counters that did not go down. A socket seen for the first
    /// time (a new connection, or the first dump of the namespace) only sets
    /// its baseline: its counters cover an unknown span, so its first interval
    /// gives no record. Every socket not in this dump is forgotten.
    pub fn update(&mut self, netns: u32, now: Duration, sockets: Vec<TcpSocket>) -> Vec<FlowDelta> {
        let previous = self.namespaces.remove(&netns);
        let mut fresh = HashMap::with_capacity(sockets.len());
        let mut out = Vec::new();
        for socket in sockets {
            let counters = Counters::of(&socket.info);
            // A dump that raced with connections coming and going can list a
            // socket twice (the kernel resumes it by position): one record.
            if fresh.insert(socket.cookie, counters).is_some() {
                continue;
            }
            let Some(prev) = &previous else { continue };
            let Some(before) = prev.sockets.get(&socket.cookie) else {
                continue;
            };
            if let Some(delta) = counters.since(before) {
                out.push(FlowDelta {
                    socket,
                    delta,
                    interval: now.saturating_sub(prev.at),
                });
            }
        }
        self.namespaces.insert(
            netns,
            Namespace {
                at: now,
                sockets: fresh,
            },
        );
        out
    }

    /// Forget every namespace not in `keep` (gone, or no longer sampled).
    pub fn retain_namespaces(&mut self, keep: &HashSet<u32>) {
        self.namespaces.retain(|ns, _| keep.contains(ns));
    }

    /// Sockets remembered, over all namespaces.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.namespaces.values().map(|n| n.sockets.len()).sum()
    }
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
