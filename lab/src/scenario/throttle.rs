//! `throttle`: the flow-control story. One sender on a switch sends to two
//! receivers at once; its uplink is throttled (tbf on its egress, standing in
//! for the PAUSE frames a switch sends when one port cannot keep up), so both
//! streams queue in the same transmit queue and each gets a share of the
//! throttled rate. veth has no PAUSE frames to show (`not exposed`): the cause
//! stalltrace can name here is the transmit queue's wait, `tx_throttled`.
//! Clean: the same two streams without the shaper.

use std::time::Duration;

use super::{Expected, Fault, Outcome, tracer_args};
use crate::Bins;
use crate::net::{Iperf3, Switch};
use crate::tracer::Tracer;

pub const ABOUT: &str = "one host streams to two receivers through one uplink (a bridge); fault: tbf 40 Mbit/s on that uplink";

const SECS: u32 = 5;
/// What each stream asks for: together far above the throttled rate, well
/// below what veth carries unthrottled (an unpaced iperf3 on 2 vCPUs
/// retransmits without any loss, from reordering: see net/mod.rs).
const EACH: &str = "100M";
const RATE: &str = "40mbit";
/// The congestion control of a typical SQL Server host (RHEL, Ubuntu, SLES
/// default to cubic), set per socket: this VM's namespaces inherit bbr, which
/// drains the shaper's queue once past its start-up (measured: qdisc wait p99
/// above 20 ms for the first second only), and a namespace may not change its
/// default to an algorithm outside `tcp_allowed_congestion_control`.
pub const CC: &str = "cubic";

pub fn run(bins: &Bins, fault: Fault) -> Outcome {
    crate::require_root();
    bins.check();
    // Host 0 sends; hosts 1 and 2 receive.
    let sw = Switch::new(3);
    if fault == Fault::Injected {
        sw.limit_rate(0, RATE, "64kb", "200ms");
    }
    let servers: Vec<(usize, u16)> = [1usize, 2]
        .into_iter()
        .map(|h| (h, crate::net::next_port()))
        .collect();
    let mut guards = Vec::new();
    for &(h, port) in &servers {
        let mut g = sw.spawn(h, &["iperf3", "-s", "-p", &port.to_string()]);
        crate::net::wait_listening_in(&sw.host(h).netns, port, &mut g);
        guards.push(g);
    }
    let args = tracer_args(&[&sw.host(0).netns, &sw.host(1).netns, &sw.host(2).netns]);
    let tracer = Tracer::start(&bins.stalltrace, &args);
    let mut during = None;
    let results: Vec<Iperf3> = std::thread::scope(|s| {
        let sw = &sw;
        let runs: Vec<_> = servers
            .iter()
            .map(|&(h, port)| s.spawn(move || iperf3_to(sw, h, port)))
            .collect();
        // The queue while both streams run.
        std::thread::sleep(Duration::from_millis(SECS as u64 * 500));
        if fault == Fault::Injected {
            during = Some(sw.qdisc_stats(0));
        }
        runs.into_iter().map(|r| r.join().unwrap()).collect()
    });
    std::thread::sleep(Duration::from_millis(1200));
    let stream = tracer.stop_text();
    drop(guards);

    let mut o = Outcome::new("throttle", fault, stream);
    o.args = args.iter().map(|s| s.to_string()).collect();
    o.ifaces = (0..3).map(|h| sw.host(h).veth.clone()).collect();
    o.ifaces.extend((0..3).map(|h| sw.host(h).port.clone()));
    o.peers = (0..3).map(|h| sw.host(h).v4.to_string()).collect();
    o.netns = (0..3).map(|h| sw.host(h).inode).collect();
    for (r, &(h, _)) in results.iter().zip(&servers) {
        o.values.insert(
            if h == 1 {
                "received_mbps_1"
            } else {
                "received_mbps_2"
            },
            r.received_bps / 1e6,
        );
        o.figures.push(format!(
            "iperf3 host 0 -> host {h} ({}): asked {EACH}bit/s, received {:.1} Mbit/s, {} retransmits",
            sw.host(h).v4,
            r.received_bps / 1e6,
            r.retransmits.unwrap_or(0)
        ));
    }
    if let Some(q) = during {
        o.figures.push(format!(
            "tc -s qdisc on {} mid-run: {} backlog {} bytes ({} packets), {} dropped, {} overlimits",
            sw.host(0).veth,
            q.kind,
            q.backlog_bytes,
            q.qlen,
            q.drops,
            q.overlimits
        ));
    }
    if fault == Fault::Injected {
        o.expected = vec![Expected {
            kind: "network",
            cause: "tx_throttled",
            field: "iface",
            value: sw.host(0).veth.clone(),
            netns: Some(sw.host(0).inode),
            sessions: Vec::new(),
        }];
    }
    o
}

fn iperf3_to(sw: &Switch, host: usize, port: u16) -> Iperf3 {
    let (addr, port, secs) = (
        sw.host(host).v4.to_string(),
        port.to_string(),
        SECS.to_string(),
    );
    let out = sw.exec_output(
        0,
        &[
            "timeout", "-s", "KILL", "40", "iperf3", "-c", &addr, "-p", &port, "-t", &secs, "-J",
            "-4", "-b", EACH, "-C", CC,
        ],
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "iperf3 to host {host} printed no JSON ({e}): {}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert!(
        out.status.success() && json.get("error").is_none(),
        "iperf3 to host {host} failed: {}",
        json["error"]
    );
    Iperf3::from_json(json)
}
