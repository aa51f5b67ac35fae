//! Which programs a received or a sent TCP segment pays for: the net
//! suite's cost per 100 000 segments divides the receive path's programs'
//! run time by the segments received (InSegs of both namespaces) and the
//! send path's by the segments sent (OutSegs), so a user can scale each by
//! their own `nstat` counters. Programs on neither path (state changes,
//! timeouts, stalls) are counted apart, per segment either way.

use serde::Serialize;

#[derive(Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    Receive,
    Send,
    Other,
}

/// The path a program (`on_tcp_probe`, `maybe_sock_send_length`) or a
/// tracepoint (`tcp_retransmit_skb`) sits on, by the hook in its name.
pub fn direction(program: &str) -> Direction {
    const OTHER: &[&str] = &["xmit_timeout", "dql_stall", "set_state"];
    const RECEIVE: &[&str] = &[
        "tcp_probe",
        "recv",
        "rcv",
        "receive",
        "netif_rx",
        "napi_gro",
    ];
    const SEND: &[&str] = &["xmit", "send", "retransmit"];
    let has = |words: &[&str]| words.iter().any(|w| program.contains(w));
    if has(OTHER) {
        Direction::Other
    } else if has(RECEIVE) {
        Direction::Receive
    } else if has(SEND) {
        Direction::Send
    } else {
        Direction::Other
    }
}

/// Run time by direction: (receive, send, other), in ns, of `programs`
/// given as (name, run_time_ns).
pub fn split<'a>(programs: impl IntoIterator<Item = (&'a str, u64)>) -> (f64, f64, f64) {
    let mut out = (0.0, 0.0, 0.0);
    for (name, ns) in programs {
        let ns = ns as f64;
        match direction(name) {
            Direction::Receive => out.0 += ns,
            Direction::Send => out.1 += ns,
            Direction::Other => out.2 += ns,
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_network_hook_on_its_path() {
        for p in [
            "on_tcp_probe",
            "maybe_sock_recv_length",
            "on_netif_rx_entry",
            "on_netif_receive_skb_entry",
            "on_netif_receive_skb_list_entry",
            "on_napi_gro_receive_entry",
        ] {
            assert_eq!(direction(p), Direction::Receive, "{p}");
        }
        for p in [
            "on_net_dev_start_xmit",
            "on_net_dev_xmit",
            "maybe_sock_send_length",
            "on_tcp_sendmsg_locked",
            "on_tcp_retransmit_skb",
            "on_tcp_retransmit_synack",
            "tcp_retransmit_skb",
        ] {
            assert_eq!(direction(p), Direction::Send, "{p}");
        }
        for p in [
            "on_inet_sock_set_state",
            "on_net_dev_xmit_timeout",
            "maybe_dql_stall_detected",
            "on_something_new",
        ] {
            assert_eq!(direction(p), Direction::Other, "{p}");
        }
        assert_eq!(
            split([("on_tcp_probe", 10), ("on_net_dev_xmit", 20), ("x", 5)]),
            (10.0, 20.0, 5.0)
        );
    }
}
