//! `sql_requests`: what a SQL Server instance's clients waited for in an
//! interval, request by request, split into the server's time and the
//! network's delivery (ebpf/include/tds_turns.bpf.h measures them).

use std::net::SocketAddr;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::hist::HistogramRecord;

/// A request is `slow` from this total: a TCP retransmission timeout's floor (200 ms), the
/// first step of the tail a lossy or mismatched link gives.
pub const SLOW_REQUEST_MS: u64 = 200;

/// `sql_requests`: one instance's requests that ended in the interval. A request is timed from
/// the turns its connection takes (the client's bytes arrive, the worker answers, the client's
/// next bytes arrive), with no payload read, so encrypted sessions are timed as plain ones. It
/// ends, and is counted, when the session's next request arrives or the connection closes.
/// Written only for an instance that had requests in the interval or has MARS sessions.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields)]
pub struct SqlRequestsRecord {
    /// Length of the interval, ms.
    pub interval_ms: u64,
    /// The instance's worker process.
    pub pid: u32,
    #[serde(flatten)]
    pub counts: RequestCounts,
    /// What the client waited for, µs: `server` + `delivery`. The client also waited for its
    /// request's own trip to the server, which the server cannot see; the acknowledgement's trip
    /// back, inside `delivery`, stands in for it.
    pub total_us: HistogramRecord,
    /// From the request's first byte arriving at the server to the response's last byte handed
    /// to TCP, µs: the server's work and its queueing.
    pub server_us: HistogramRecord,
    /// From there until the response was delivered, µs: its last transmission (its last
    /// retransmission, if any) plus the connection's minimum round trip, or the client's
    /// acknowledgement when that came first.
    pub delivery_us: HistogramRecord,
    /// Sessions with requests in the interval.
    pub sessions: u64,
    /// The instance's open sessions that use MARS (`sql_session` `mars`): several requests can be
    /// in flight on such a connection, so none of theirs is in any figure here. Present when
    /// there are any; an instance with such sessions gets a record every interval.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub mars_sessions: u64,
    /// The sessions whose slowest requests were the slowest of the interval, slowest first: at
    /// most 16 of `sessions`.
    pub by_session: Vec<SessionRequests>,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// How many requests, and of what kind.
#[derive(Clone, Debug, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "sql_request_counts")]
pub struct RequestCounts {
    /// Requests of sessions whose SPID was known when they arrived: every figure below is of
    /// them.
    pub requests: u64,
    /// Of them, requests whose response had a segment sent again.
    pub retransmitted: u64,
    /// Of them, requests whose `total` reached `slow_ms`.
    pub slow: u64,
    /// Of the slow ones, those whose response had a segment sent again: the rest were slow
    /// without the network losing anything.
    pub slow_retransmitted: u64,
    /// The `slow` threshold, ms.
    pub slow_ms: u64,
    /// Requests that arrived before their session's SPID was known (the login exchange, or an
    /// encrypted session whose SPID nothing read): counted here, in no other figure.
    pub without_spid: u64,
}

impl RequestCounts {
    /// Add another interval's counts (the threshold is the same in a run).
    pub fn add(&mut self, other: &RequestCounts) {
        self.requests += other.requests;
        self.retransmitted += other.retransmitted;
        self.slow += other.slow;
        self.slow_retransmitted += other.slow_retransmitted;
        self.slow_ms = other.slow_ms;
        self.without_spid += other.without_spid;
    }
}

/// One session's requests in the interval.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "sql_session_requests")]
pub struct SessionRequests {
    /// The session's SPID.
    pub spid: u16,
    /// The client's end of the connection, when the session was known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client: Option<SocketAddr>,
    /// Its requests that ended in the interval.
    pub requests: u64,
    /// Of them, those whose response had a segment sent again.
    pub retransmitted: u64,
    /// Of them, those whose `total` reached the record's `slow_ms`.
    pub slow: u64,
    /// Its slowest request.
    pub slowest: SlowRequest,
}

/// A request, timed.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema, PartialEq)]
#[schemars(deny_unknown_fields, rename = "sql_request")]
pub struct SlowRequest {
    /// When its first byte arrived (RFC 3339).
    pub arrived: String,
    /// What the client waited for, µs (as `total_us` of the record).
    pub total_us: u64,
    /// The server's part, µs.
    pub server_us: u64,
    /// The network's delivery, µs.
    pub delivery_us: u64,
    /// Retransmissions of its response's data.
    pub retransmits: u32,
    /// Bytes of its response.
    pub response_bytes: u32,
}
