//! The bench's network: the lab's `NetPair` (two namespaces joined by a
//! veth pair, see stalltrace_lab::net), made as `Owner::Bench` so its names
//! (`stbench-{pid}-{client|server}`, veths `stb{pid}{c|s}`), addresses
//! (10.201.0.0/16) and nftables table are the bench's own, and through the
//! lab's `try_` calls, so a failure is an error the bench reports while the
//! pair's `Drop` still deletes the namespaces (after Ctrl-C too, see
//! `interrupt`). What the bench alone reads of the pair is here.

use std::path::Path;

use anyhow::Context;

pub use stalltrace_lab::net::{NetPair, Owner, Server, Side};

use super::interrupt;

/// Side A of the pair runs the clients, B the servers.
pub const CLIENT: Side = Side::A;
pub const SERVER: Side = Side::B;

/// The bench's pair; an error, with whatever was made deleted, if it cannot
/// be built.
pub fn create() -> anyhow::Result<NetPair> {
    NetPair::try_new(Owner::Bench)
}

/// A server in the server namespace, up once it listens on `port` (see
/// `NetPair::try_server`). A Ctrl-C also stops a server that is starting:
/// then say "interrupted", not that the server failed.
pub fn server<'a>(
    pair: &'a NetPair,
    port: u16,
    args: &[String],
    log_dir: &Path,
) -> anyhow::Result<Server<'a>> {
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    pair.try_server(SERVER, port, &args, log_dir).or_else(|e| {
        interrupt::check()?;
        Err(e)
    })
}

/// Packets `side`'s veth has sent so far, as the kernel counts them (`ip -s link`).
pub fn tx_packets(pair: &NetPair, side: Side) -> anyhow::Result<u64> {
    let veth = pair.veth(side);
    let text = pair.try_exec(side, &["ip", "-s", "-j", "link", "show", veth])?;
    let json: serde_json::Value = serde_json::from_str(&text).context("ip -j printed no JSON")?;
    json[0]["stats64"]["tx"]["packets"]
        .as_u64()
        .with_context(|| format!("no tx packets for {veth} in: {text}"))
}

/// TCP segments `side`'s namespace has received and sent so far, as the
/// kernel counts them (InSegs and OutSegs of /proc/net/snmp there: MSS-sized
/// segments, so a TSO or GRO packet counts as the segments it carries).
pub fn tcp_segments(pair: &NetPair, side: Side) -> anyhow::Result<(u64, u64)> {
    let counters = pair.try_counters(side)?;
    let get = |name: &str| {
        counters
            .0
            .get(name)
            .copied()
            .with_context(|| format!("no {name} in {}'s /proc/net/snmp", pair.netns(side)))
    };
    Ok((get("Tcp.InSegs")?, get("Tcp.OutSegs")?))
}

/// Whether a namespace of that name exists (`ip netns list` reads the same
/// directory): after the pair's drop, none of its should.
pub fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}
