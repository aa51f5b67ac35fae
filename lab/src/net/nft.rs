//! Loss and blackholes with nftables, on the receiving side.

use anyhow::Context;
use serde_json::Value;

use super::{NetPair, Side};
use crate::util::try_sh_stdin;

impl NetPair {
    /// Drop `percent` % of the packets arriving at `side` (nft `numgen random`
    /// on the input hook, IPv4 and IPv6), only TCP/UDP to or from `port` when
    /// given. Loss on the receiving side is loss on the wire to the sender; the
    /// same rule in the sender's output hook would be a local send failure.
    /// Counts skbs, not wire segments: see the notes at the top of this file.
    pub fn drop_random(&self, side: Side, percent: u8, port: Option<u16>) {
        self.try_drop_random(side, percent, port)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// `drop_random`, an error if nft refuses the rules.
    pub fn try_drop_random(
        &self,
        side: Side,
        percent: u8,
        port: Option<u16>,
    ) -> anyhow::Result<()> {
        anyhow::ensure!(percent <= 100, "drop_random: percent {percent} > 100");
        let table = self.owner.nft_table();
        // nft rejects `< 100` (the value exceeds `mod 100`'s range).
        let chance = match percent {
            100 => "counter drop".to_string(),
            _ => format!("numgen random mod 100 < {percent} counter drop"),
        };
        let rules = match port {
            // Matching dport and sport in two rules: a packet with both equal to
            // `port` would roll twice; no test connection looks like that.
            Some(port) => format!(
                "add rule inet {table} input meta l4proto {{ tcp, udp }} th dport {port} {chance}\n\
                 add rule inet {table} input meta l4proto {{ tcp, udp }} th sport {port} {chance}\n"
            ),
            // Neighbour discovery stays exempt (inserted at the head of the chain):
            // losing it stalls every flow for seconds, which is not packet loss.
            None => format!(
                "insert rule inet {table} input icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert }} accept\n\
                 add rule inet {table} input {chance}\n"
            ),
        };
        self.nft(side, &rules)
    }

    /// Drop every TCP/UDP packet to or from `port` arriving at `side`. Call it on
    /// both sides to cut a connection in both directions.
    pub fn blackhole(&self, side: Side, port: u16) {
        let table = self.owner.nft_table();
        self.nft(
            side,
            &format!(
                "add rule inet {table} input meta l4proto {{ tcp, udp }} th dport {port} counter drop\n\
                 add rule inet {table} input meta l4proto {{ tcp, udp }} th sport {port} counter drop\n"
            ),
        )
        .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Remove every drop rule of `side` (and their counters).
    pub fn clear_drops(&self, side: Side) {
        // Created and deleted in one transaction: deleting is no error when
        // no rule was ever added.
        let table = self.owner.nft_table();
        self.nft(side, &format!("delete table inet {table}\n"))
            .unwrap_or_else(|e| panic!("{e:#}"));
    }

    /// Packets (skbs) the pair's rules dropped at `side` since they were added.
    pub fn dropped_packets(&self, side: Side) -> u64 {
        self.try_dropped_packets(side)
            .unwrap_or_else(|e| panic!("{e:#}"))
    }

    /// `dropped_packets`, an error if nft cannot be run or prints no JSON.
    pub fn try_dropped_packets(&self, side: Side) -> anyhow::Result<u64> {
        let table = self.owner.nft_table();
        let out = self
            .command(side, &["nft", "-j", "list", "table", "inet", table])
            .output()
            .with_context(|| format!("cannot run nft in {}", self.netns(side)))?;
        if !out.status.success() {
            return Ok(0); // no rules yet: nft knows no such table
        }
        let json: Value = serde_json::from_slice(&out.stdout).context("nft -j printed no JSON")?;
        Ok(dropped_by_rules(&json))
    }

    /// Apply an nft script to `side`, creating the pair's table and input chain
    /// first (`add` is idempotent), all in one transaction.
    fn nft(&self, side: Side, rules: &str) -> anyhow::Result<()> {
        let table = self.owner.nft_table();
        let script = format!(
            "add table inet {table}\n\
             add chain inet {table} input {{ type filter hook input priority filter; policy accept; }}\n\
             {rules}"
        );
        try_sh_stdin(
            "ip",
            &["netns", "exec", self.netns(side), "nft", "-f", "-"],
            &script,
        )?;
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn drops_are_summed_over_drop_rules_only() {
        let json: Value = serde_json::from_str(
            r#"{"nftables":[{"metainfo":{}},{"table":{"name":"t"}},
            {"rule":{"expr":[{"match":{}},{"counter":{"packets":7,"bytes":1}},{"drop":null}]}},
            {"rule":{"expr":[{"counter":{"packets":100,"bytes":1}},{"accept":null}]}}]}"#,
        )
        .unwrap();
        assert_eq!(dropped_by_rules(&json), 7);
    }
}
