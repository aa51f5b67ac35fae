//! Rate limits (tc tbf), segmentation offloads (ethtool), and the qdisc
//! statistics `tc -s` reports, parsed here independently of stalltrace.

use serde_json::Value;

use super::{NetPair, Side};

impl NetPair {
    /// TCP connections from `side` to the other side's IPv4 address use
    /// congestion control `cc` (a host route with `congctl`). A namespace
    /// starts with the root namespace's default and may not change it to an
    /// algorithm outside `net.ipv4.tcp_allowed_congestion_control`; a route
    /// may name any the kernel has.
    pub fn congestion_control_to_peer(&self, side: Side, cc: &str) {
        let peer = format!("{}/32", self.v4(side.peer()));
        self.exec(
            side,
            &[
                "ip",
                "route",
                "replace",
                &peer,
                "dev",
                self.veth(side),
                "congctl",
                cc,
            ],
        );
    }

    /// Shape `side`'s veth egress with tbf, e.g. `limit_rate(A, "20mbit", "64kb",
    /// "200ms")`. Replaces any root qdisc, with counters starting at zero.
    pub fn limit_rate(&self, side: Side, rate: &str, burst: &str, latency: &str) {
        self.clear_qdisc(side);
        let dev = self.veth(side);
        self.exec(
            side,
            &[
                "tc", "qdisc", "add", "dev", dev, "root", "tbf", "rate", rate, "burst", burst,
                "latency", latency,
            ],
        );
    }

    /// Back to the veth default (`noqueue`).
    pub fn clear_qdisc(&self, side: Side) {
        // Fails when there is no root qdisc to delete; that is the wanted state.
        let _ = self.exec_output(
            side,
            &["tc", "qdisc", "del", "dev", self.veth(side), "root"],
        );
    }

    /// The root qdisc of `side`'s veth, from `tc -s -j qdisc show`: the oracle
    /// for backlog and qdisc drops. Sample it from another thread
    /// (`std::thread::scope`) while a load runs to see the backlog.
    pub fn qdisc_stats(&self, side: Side) -> QdiscStats {
        let out = self.exec(
            side,
            &["tc", "-s", "-j", "qdisc", "show", "dev", self.veth(side)],
        );
        parse_tc_qdisc(&out).unwrap_or_else(|| panic!("no root qdisc in: {out}"))
    }

    /// Turn TSO and GSO of `side`'s veth on or off. Off, every skb the sender's
    /// TCP hands down is one MSS segment, so one nft drop is one lost segment.
    pub fn set_segmentation_offload(&self, side: Side, on: bool) {
        let state = if on { "on" } else { "off" };
        self.exec(
            side,
            &["ethtool", "-K", self.veth(side), "tso", state, "gso", state],
        );
    }
}

// ---- tc qdisc stats ------------------------------------------------------------------

/// A qdisc's statistics from `tc -s -j qdisc show`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QdiscStats {
    pub kind: String,
    pub bytes: u64,
    pub packets: u64,
    pub drops: u64,
    pub overlimits: u64,
    pub requeues: u64,
    /// Bytes queued right now.
    pub backlog_bytes: u64,
    /// Packets queued right now.
    pub qlen: u64,
}

/// The root qdisc of `tc -s -j qdisc show dev X` output.
pub fn parse_tc_qdisc(json: &str) -> Option<QdiscStats> {
    let all: Value = serde_json::from_str(json).ok()?;
    let root = all.as_array()?.iter().find(|q| q["root"] == true)?;
    let n = |k: &str| root[k].as_u64().unwrap_or(0);
    Some(QdiscStats {
        kind: root["kind"].as_str()?.to_string(),
        bytes: n("bytes"),
        packets: n("packets"),
        drops: n("drops"),
        overlimits: n("overlimits"),
        requeues: n("requeues"),
        backlog_bytes: n("backlog"),
        qlen: n("qlen"),
    })
}
