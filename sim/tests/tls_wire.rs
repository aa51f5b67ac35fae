//! The simulator's TLS on the wire, checked by Wireshark's dissectors: a
//! relay between `sqlclient --encrypt MODE` and `sqlservr` records the bytes
//! each way; `sqlservr` writes its session secrets to SSLKEYLOGFILE; tshark
//! decrypts the pcap made of those bytes and dissects the TDS inside.
//!
//! Wireshark 4.0 (Debian 12) decrypts all three modes, but hands decrypted
//! TDS 7.x application data to nothing (its TDS dissector does not register
//! for TLS payloads, and there is no `tls.port` entry for TDS), and cannot
//! put TDS on a strict session's ALPN. So each mode is checked in two
//! passes: the capture as sent (cleartext TDS, the handshake, decryption
//! with the key log: `Finished` is only shown decrypted), then the
//! decrypted application data (`-z follow,tls,raw`) as a cleartext TDS
//! conversation of its own.

mod common;

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};

use common::pcap::{Transcript, build_pcap, tshark_available};
use common::{Server, test_dir};
use serde_json::Value;

/// The client port written in the pcaps (any: the pcap is synthetic).
const CLIENT_PORT: u16 = 40123;

/// Accepts one connection, relays it to `server`, and records every chunk
/// each way in order: a chunk is recorded before it is passed on, so a
/// response is always recorded after its request.
fn relay(server: String) -> (u16, JoinHandle<Transcript>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handle = thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let upstream = TcpStream::connect(server).unwrap();
        let log = Arc::new(Mutex::new(Transcript::new()));
        let pump = |mut from: TcpStream, mut to: TcpStream, from_client: bool| {
            let log = log.clone();
            thread::spawn(move || {
                let mut buf = vec![0u8; 1 << 16];
                loop {
                    let n = from.read(&mut buf).unwrap_or(0);
                    if n == 0 {
                        let _ = to.shutdown(Shutdown::Write);
                        return;
                    }
                    let mut l = log.lock().unwrap();
                    l.push((from_client, buf[..n].to_vec()));
                    if to.write_all(&buf[..n]).is_err() {
                        return;
                    }
                }
            })
        };
        let a = pump(
            client.try_clone().unwrap(),
            upstream.try_clone().unwrap(),
            true,
        );
        let b = pump(upstream, client, false);
        a.join().unwrap();
        b.join().unwrap();
        Arc::try_unwrap(log).unwrap().into_inner().unwrap()
    });
    (port, handle)
}

/// One sqlclient session through the relay: its JSON and the transcript.
fn session(server: &Server, encrypt: &str) -> (Value, Transcript) {
    let (port, recorder) = relay(server.addr());
    let out = Command::new(env!("CARGO_BIN_EXE_sqlclient"))
        .args(["--server", &format!("127.0.0.1:{port}")])
        .args(["--sessions", "1", "--rate", "20", "--duration", "1"])
        .args(["--timeout", "20", "--encrypt", encrypt])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(
        out.status.success(),
        "sqlclient --encrypt {encrypt}: {text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let r: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(r["errors"], 0, "{text}");
    (r, recorder.join().unwrap())
}

fn tshark(pcap: &Path, args: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(pcap)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "tshark {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn assert_clean(verbose: &str, what: &str) {
    for bad in ["Malformed", "Expert Info (Error", "Expert Info (Warning"] {
        assert!(
            !verbose.contains(bad),
            "{what}: tshark reports {bad}:\n{verbose}"
        );
    }
}

fn assert_has(verbose: &str, what: &str, expect: &[&str]) {
    for e in expect {
        assert!(
            verbose.contains(e),
            "{what}: tshark lacks {e:?}:\n{verbose}"
        );
    }
}

/// The decrypted application data of the pcap's only TLS stream, each
/// chunk with its direction (the client is whoever speaks first).
fn decrypted(pcap: &Path, keylog: &str, decode_as: &str) -> Transcript {
    let out = tshark(
        pcap,
        &[
            "-o",
            keylog,
            "-d",
            decode_as,
            "-q",
            "-z",
            "follow,tls,raw,0",
        ],
    );
    // After the header ("Follow: ...", "Filter: ...", "Node 0", "Node 1"),
    // one hex line per chunk, a tab before those of one direction.
    let mut lines = out.lines().skip_while(|l| !l.starts_with("Node 1"));
    lines.next();
    let mut t = Transcript::new();
    let mut client_tabbed = None;
    for l in lines.take_while(|l| !l.starts_with("====")) {
        let tabbed = l.starts_with('\t');
        let client_tabbed = *client_tabbed.get_or_insert(tabbed);
        let hex = l.trim();
        let bytes = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        t.push((tabbed == client_tabbed, bytes));
    }
    assert!(!t.is_empty(), "nothing decrypted:\n{out}");
    t
}

/// (TDS type, SPID) of every server packet tshark dissected.
fn server_headers(fields: &str, server_port: u16) -> Vec<(String, u16)> {
    fields
        .lines()
        .filter_map(|l| {
            let c: Vec<&str> = l.split('\t').collect();
            (c[0] == server_port.to_string() && !c[1].is_empty()).then(|| {
                let spid = c[2].split(',').next().unwrap().parse().unwrap();
                (c[1].split(',').next().unwrap().to_string(), spid)
            })
        })
        .collect()
}

const FIELDS: &[&str] = &[
    "-T",
    "fields",
    "-e",
    "tcp.srcport",
    "-e",
    "tds.type",
    "-e",
    "tds.channel",
];

#[test]
fn tshark_decrypts_login_only_full_and_strict_sessions_memory_bio() {
    check_modes("memory");
}

#[test]
fn tshark_decrypts_login_only_full_and_strict_sessions_socket_bio() {
    check_modes("socket");
}

fn check_modes(bio: &str) {
    if !tshark_available() {
        return;
    }
    let dir = test_dir(&format!("tlswire-{bio}"));
    let keylog_path = dir.join("keys.log");
    let srv = Server::start_with(
        "tlswire",
        &["--tls-bio", bio],
        &[("SSLKEYLOGFILE", &keylog_path)],
    );
    let keylog = format!("tls.keylog_file:{}", keylog_path.display());
    let tds_port = format!("tcp.port=={},tds", srv.port);
    let tls_port = format!("tcp.port=={},tls", srv.port);

    for (mode, in_force) in [("off", "login_only"), ("on", "full"), ("strict", "strict")] {
        let (r, transcript) = session(&srv, mode);
        let s = &r["sessions"][0];
        assert_eq!(s["encryption"], in_force, "{r}");
        let spid = s["spid"].as_u64().unwrap() as u16;
        assert_eq!(s["spid_selected"], spid as u64, "{r}");
        let pcap = dir.join(format!("{mode}.pcap"));
        std::fs::write(&pcap, build_pcap(&transcript, CLIENT_PORT, srv.port)).unwrap();

        // Pass 1: the capture as sent.
        let decode_as = if mode == "strict" {
            &tls_port
        } else {
            &tds_port
        };
        let base = ["-o", keylog.as_str(), "-d", decode_as.as_str()];
        let verbose = tshark(&pcap, &[&base[..], &["-V"]].concat());
        let what = format!("{mode}, as sent");
        assert_clean(&verbose, &what);
        assert_has(&verbose, &what, &["Handshake Protocol: Finished"]);
        if mode == "strict" {
            assert_has(
                &verbose,
                &what,
                &["ALPN Next Protocol: tds/8.0", "Supported Version: TLS 1.3"],
            );
        } else {
            let asked = if mode == "off" {
                "Encryption: Encryption is available but off (0)"
            } else {
                "Encryption: Encryption is available and on (1)"
            };
            assert_has(&verbose, &what, &["Pre-Login Message", asked]);
            // Before the login response, SPID 0: the PRELOGIN response and
            // the PRELOGIN packets carrying the server's handshake.
            let headers = server_headers(&tshark(&pcap, &[&base[..], FIELDS].concat()), srv.port);
            assert_eq!(headers[0], ("4".to_string(), 0), "{mode}: {headers:?}");
            let handshake: Vec<_> = headers.iter().filter(|h| h.0 == "18").collect();
            assert!(!handshake.is_empty() && handshake.iter().all(|h| h.1 == 0));
            if mode == "off" {
                // After a login-only exchange everything is cleartext: the
                // login response and the batches carry the SPID.
                assert_has(
                    &verbose,
                    &what,
                    &["Token - LoginAck", "Query: SELECT @@SPID"],
                );
                let after: Vec<_> = headers.iter().skip(1 + handshake.len()).collect();
                assert!(after.len() > 10, "{headers:?}");
                assert!(
                    after.iter().all(|h| h.0 == "4" && h.1 == spid),
                    "{headers:?}"
                );
            }
        }

        // Pass 2: the decrypted application data as TDS.
        let inner = decrypted(&pcap, &keylog, decode_as);
        let inner_pcap = dir.join(format!("{mode}-decrypted.pcap"));
        std::fs::write(&inner_pcap, build_pcap(&inner, CLIENT_PORT, srv.port)).unwrap();
        let verbose = tshark(&inner_pcap, &["-d", &tds_port, "-V"]);
        let what = format!("{mode}, decrypted");
        assert_clean(&verbose, &what);
        assert_has(
            &verbose,
            &what,
            &["TDS7 Login Packet", "Username: stalltrace"],
        );
        let headers = server_headers(
            &tshark(
                &inner_pcap,
                &[&["-d", tds_port.as_str()][..], FIELDS].concat(),
            ),
            srv.port,
        );
        match mode {
            // TLS carried LOGIN7 alone.
            "off" => assert!(headers.is_empty(), "{headers:?}"),
            _ => {
                assert_has(
                    &verbose,
                    &what,
                    &["Token - LoginAck", "Query: SELECT @@SPID", "Token - Row"],
                );
                // Strict: PRELOGIN inside TLS, its response with SPID 0.
                let first = if mode == "strict" {
                    assert_eq!(headers[0], ("4".to_string(), 0), "{headers:?}");
                    1
                } else {
                    0
                };
                assert!(headers.len() > first + 10, "{headers:?}");
                assert!(
                    headers[first..].iter().all(|h| h.0 == "4" && h.1 == spid),
                    "{mode}: every server packet from the login response on carries SPID {spid}: {headers:?}"
                );
            }
        }
    }
    drop(srv);
    let _ = std::fs::remove_dir_all(&dir);
}
