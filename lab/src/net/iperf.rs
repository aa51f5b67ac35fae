//! iperf3 servers and clients inside a pair.

use serde_json::Value;

use super::names::next_port;
use super::run::Background;
use super::{Family, NetPair, Side};

impl NetPair {
    /// `iperf3 -s` inside `side` on a port of its own (listening on IPv4 and
    /// IPv6), returned once it accepts connections.
    pub fn iperf3_server(&self, side: Side) -> Iperf3Server<'_> {
        self.iperf3_server_under(side, &[])
    }

    /// [`NetPair::iperf3_server`] at nice -19: on a busy host the scheduler
    /// runs it before everything else at nice 0, so a receiver on the same
    /// host as its sender keeps up with it (it reads as fast as the data comes)
    /// where at nice 0 it would share the CPUs and close its window.
    pub fn iperf3_server_first(&self, side: Side) -> Iperf3Server<'_> {
        self.iperf3_server_under(side, &["nice", "-n", "-19"])
    }

    fn iperf3_server_under(&self, side: Side, prefix: &[&str]) -> Iperf3Server<'_> {
        let port = next_port();
        let port_arg = port.to_string();
        let mut command = prefix.to_vec();
        command.extend(["iperf3", "-s", "-p", &port_arg]);
        let mut process = self.spawn(side, &command);
        self.wait_listening(side, port, &mut process);
        Iperf3Server {
            side,
            port,
            _process: process,
        }
    }

    /// Run an iperf3 client from the server's peer for `secs` seconds to the
    /// server side's address of `family`, with `extra` options (e.g.
    /// `-b 200M`, `-R`, `-P 4`), and return iperf3's own figures. Unpaced it
    /// retransmits without any loss (see the top of this file). Killed if it
    /// runs 30 s past `secs`.
    pub fn iperf3(
        &self,
        server: &Iperf3Server,
        family: Family,
        secs: u32,
        extra: &[&str],
    ) -> Iperf3 {
        let addr = self.addr(server.side, family).to_string();
        let (port, secs_s, limit) = (
            server.port.to_string(),
            secs.to_string(),
            (secs + 30).to_string(),
        );
        let family_flag = match family {
            Family::V4 => "-4",
            Family::V6 => "-6",
        };
        let mut args = vec![
            "timeout",
            "-s",
            "KILL",
            &limit,
            "iperf3",
            "-c",
            &addr,
            "-p",
            &port,
            "-t",
            &secs_s,
            "-J",
            family_flag,
        ];
        args.extend_from_slice(extra);
        let out = self.exec_output(server.side.peer(), &args);
        let text = String::from_utf8_lossy(&out.stdout);
        let json: Value = serde_json::from_str(&text).unwrap_or_else(|e| {
            panic!(
                "iperf3 ({}) printed no JSON ({e}): {text}{}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )
        });
        assert!(
            out.status.success() && json.get("error").is_none(),
            "iperf3 failed ({}): {}",
            out.status,
            json["error"]
        );
        Iperf3::from_json(json)
    }
}

// ---- iperf3 ------------------------------------------------------------------------

/// A running `iperf3 -s`; stopped on drop.
pub struct Iperf3Server<'a> {
    pub side: Side,
    pub port: u16,
    _process: Background<'a>,
}

/// iperf3's own end-of-test figures (`-J`), as it reports them.
#[derive(Debug, Clone)]
pub struct Iperf3 {
    pub sent_bytes: u64,
    pub sent_bps: f64,
    pub received_bytes: u64,
    pub received_bps: f64,
    /// TCP only: the sender's retransmitted segments (tcpi_total_retrans).
    pub retransmits: Option<u64>,
    /// The whole report, for anything else.
    pub json: Value,
}

impl Iperf3 {
    /// From iperf3's `-J` report.
    pub fn from_json(json: Value) -> Self {
        let end = &json["end"];
        let num = |v: &Value| {
            v.as_f64()
                .unwrap_or_else(|| panic!("iperf3 JSON lacks a figure: {end}"))
        };
        Self {
            sent_bytes: num(&end["sum_sent"]["bytes"]) as u64,
            sent_bps: num(&end["sum_sent"]["bits_per_second"]),
            received_bytes: num(&end["sum_received"]["bytes"]) as u64,
            received_bps: num(&end["sum_received"]["bits_per_second"]),
            retransmits: end["sum_sent"]["retransmits"].as_u64(),
            json,
        }
    }
}
