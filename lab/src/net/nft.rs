//! Loss and blackholes with nftables, on the receiving side.

use serde_json::Value;

use super::{NetPair, Side};
use crate::util::sh_stdin;

/// The lab's nftables table in each namespace.
pub(crate) const NFT_TABLE: &str = "stalltrace_lab";

impl NetPair {
    /// Drop `percent` % of the packets arriving at `side` (nft `numgen random`
    /// on the input hook, IPv4 and IPv6), only TCP/UDP to or from `port` when
    /// given. Loss on the receiving side is loss on the wire to the sender; the
    /// same rule in the sender's output hook would be a local send failure.
    /// Counts skbs, not wire segments: see the notes at the top of this file.
    pub fn drop_random(&self, side: Side, percent: u8, port: Option<u16>) {
        assert!(percent <= 100, "percent {percent} > 100");
        // nft rejects `< 100` (the value exceeds `mod 100`'s range).
        let chance = match percent {
            100 => "counter drop".to_string(),
            _ => format!("numgen random mod 100 < {percent} counter drop"),
        };
        let rules = match port {
            // Matching dport and sport in two rules: a packet with both equal to
            // `port` would roll twice; no test connection looks like that.
            Some(port) => format!(
                "add rule inet {NFT_TABLE} input meta l4proto {{ tcp, udp }} th dport {port} {chance}\n\
                 add rule inet {NFT_TABLE} input meta l4proto {{ tcp, udp }} th sport {port} {chance}\n"
            ),
            // Neighbour discovery stays exempt (inserted at the head of the chain):
            // losing it stalls every flow for seconds, which is not packet loss.
            None => format!(
                "insert rule inet {NFT_TABLE} input icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept\n\
                 add rule inet {NFT_TABLE} input {chance}\n"
            ),
        };
        self.nft(side, &rules);
    }

    /// Drop every TCP/UDP packet to or from `port` arriving at `side`. Call it on
    /// both sides to cut a connection in both directions.
    pub fn blackhole(&self, side: Side, port: u16) {
        self.nft(
            side,
            &format!(
                "add rule inet {NFT_TABLE} input meta l4proto {{ tcp, udp }} th dport {port} counter drop\n\
                 add rule inet {NFT_TABLE} input meta l4proto {{ tcp, udp }} th sport {port} counter drop\n"
            ),
        );
    }

    /// Remove every drop rule of `side` (and their counters).
    pub fn clear_drops(&self, side: Side) {
        // Created and deleted in one transaction: deleting is no error when
        // no rule was ever added.
        self.nft(side, &format!("delete table inet {NFT_TABLE}\n"));
    }

    /// Packets (skbs) the lab's rules dropped at `side` since they were added.
    pub fn dropped_packets(&self, side: Side) -> u64 {
        let out = self.exec_output(side, &["nft", "-j", "list", "table", "inet", NFT_TABLE]);
        if !out.status.success() {
            return 0; // no rules yet
        }
        let json: Value = serde_json::from_slice(&out.stdout).expect("nft -j output");
        dropped_by_rules(&json)
    }

    /// Apply an nft script to `side`, creating the lab's table and input chain
    /// first (`add` is idempotent), all in one transaction.
    fn nft(&self, side: Side, rules: &str) {
        nft_in(self.netns(side), rules);
    }
}

/// Sum of the counters of every drop rule in `nft -j list table` output
/// (the lab's and the bench's tables alike).
pub fn dropped_by_rules(json: &Value) -> u64 {
    json["nftables"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|item| item["rule"]["expr"].as_array())
        .filter(|exprs| exprs.iter().any(|x| x.get("drop").is_some()))
        .flatten()
        .filter_map(|x| x["counter"]["packets"].as_u64())
        .sum()
}

/// Apply an nft script in namespace `netns`, creating the lab's table and
/// input chain first (`add` is idempotent), all in one transaction.
pub(crate) fn nft_in(netns: &str, rules: &str) {
    let script = format!(
        "add table inet {NFT_TABLE}\n\
         add chain inet {NFT_TABLE} input {{ type filter hook input priority filter; policy accept; }}\n\
         {rules}"
    );
    sh_stdin("ip", &["netns", "exec", netns, "nft", "-f", "-"], &script);
}
