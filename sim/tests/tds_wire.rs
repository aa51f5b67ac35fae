//! The server's bytes on the wire: a raw TDS conversation with sqlservr,
//! checked by our decoders and, when tshark is installed, by Wireshark's TDS
//! dissector (an independent oracle) from a pcap built out of the exact bytes
//! exchanged — no capture privileges needed.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::Command;
use std::time::Duration;

use common::Server;
use common::pcap::{Transcript, build_pcap, tshark_available};
use stalltrace_sim::tds::login7::{self, Login7};
use stalltrace_sim::tds::tokens::{self, Token};
use stalltrace_sim::tds::{self, HEADER_LEN, Header, TDS_7_4, batch, packet_type, prelogin};

/// Keeps a copy of everything read, so the test has the server's raw bytes.
struct Tee<'a> {
    inner: &'a TcpStream,
    copy: Vec<u8>,
}

impl Read for Tee<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = (&mut &*self.inner).read(buf)?;
        self.copy.extend_from_slice(&buf[..n]);
        Ok(n)
    }
}

struct Conversation {
    stream: TcpStream,
    transcript: Transcript,
    packet_size: usize,
}

impl Conversation {
    /// Sends a message and returns the response and its raw bytes.
    fn exchange(&mut self, ptype: u8, payload: &[u8]) -> tds::Message {
        let wire = tds::encode_message(ptype, 0, payload, self.packet_size);
        self.stream.write_all(&wire).unwrap();
        self.transcript.push((true, wire));
        let mut tee = Tee {
            inner: &self.stream,
            copy: Vec::new(),
        };
        let msg = tds::read_message(&mut tee).unwrap().expect("a response");
        self.transcript.push((false, tee.copy));
        msg
    }
}

/// The SPID of every packet header in a run of server bytes.
fn header_spids(mut b: &[u8]) -> Vec<u16> {
    let mut out = Vec::new();
    while b.len() >= HEADER_LEN {
        let h = Header::decode(b[..HEADER_LEN].try_into().unwrap()).unwrap();
        out.push(h.spid);
        b = &b[h.length as usize..];
    }
    assert!(b.is_empty(), "server bytes end on a packet boundary");
    out
}

#[test]
fn conversation_decodes_and_server_packets_carry_the_spid_from_the_login_response_on() {
    let srv = Server::start("wire");
    let stream = TcpStream::connect(srv.addr()).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let client_port = stream.local_addr().unwrap().port();
    let mut c = Conversation {
        stream,
        transcript: Vec::new(),
        packet_size: tds::DEFAULT_PACKET_SIZE,
    };

    let r = c.exchange(
        packet_type::PRELOGIN,
        &prelogin::client_request(prelogin::ENCRYPT_NOT_SUP, 1, false),
    );
    assert_eq!(r.packet_type, packet_type::TABULAR_RESULT);
    assert_eq!(
        r.spid, 0,
        "the PRELOGIN response carries SPID 0, as SQL Server's"
    );
    let opts = prelogin::decode(&r.payload).unwrap();
    assert_eq!(prelogin::encryption(&opts), Some(prelogin::ENCRYPT_NOT_SUP));

    // A 512-byte packet size: the long batch below spans several packets.
    let login = Login7 {
        tds_version: TDS_7_4,
        packet_size: 512,
        option_flags1: login7::OPTION_FLAGS1_DEFAULT,
        option_flags2: login7::OPTION_FLAGS2_DEFAULT,
        hostname: "testhost".into(),
        username: "tester".into(),
        password: "secret".into(),
        app_name: "tds_wire".into(),
        server_name: "127.0.0.1".into(),
        library_name: "stalltrace-sim".into(),
        database: "stalltrace".into(),
        ..Login7::default()
    };
    let r = c.exchange(packet_type::LOGIN7, &login.encode());
    let spid = r.spid;
    assert!(spid >= 51, "SPID {spid}");
    let toks = tokens::decode(&r.payload).unwrap();
    assert!(
        toks.iter().any(|t| matches!(
            t,
            Token::LoginAck {
                tds_version: TDS_7_4,
                ..
            }
        )),
        "{toks:?}"
    );
    let size = toks.iter().find_map(|t| match t {
        Token::EnvChange {
            kind: tokens::ENV_PACKET_SIZE,
            new,
            ..
        } => Some(Token::env_text(new).unwrap()),
        _ => None,
    });
    assert_eq!(size.as_deref(), Some("512"));
    c.packet_size = 512;

    let long_sql = format!("SELECT 1 /* {} */", "x".repeat(1500));
    for sql in ["SELECT 1", long_sql.as_str()] {
        let r = c.exchange(packet_type::SQL_BATCH, &batch::encode(sql, 0));
        let toks = tokens::decode(&r.payload).unwrap();
        assert_eq!(toks[1], Token::Row(vec![Some(1)]), "{toks:?}");
        assert!(matches!(
            toks.last(),
            Some(Token::Done {
                status: tokens::DONE_COUNT,
                row_count: 1,
                ..
            })
        ));
    }
    assert!(
        c.transcript[6].1.len() > 3 * 512,
        "the long batch went as several packets"
    );
    let r = c.exchange(packet_type::SQL_BATCH, &batch::encode("select @@spid", 0));
    let toks = tokens::decode(&r.payload).unwrap();
    assert_eq!(toks[1], Token::Row(vec![Some(spid as i64)]), "{toks:?}");

    let r = c.exchange(packet_type::ATTENTION, &[]);
    assert!(matches!(
        tokens::decode(&r.payload).unwrap()[..],
        [Token::Done {
            status: tokens::DONE_ATTN,
            ..
        }]
    ));

    for (i, (from_client, bytes)) in c.transcript.iter().enumerate() {
        if !from_client {
            // The PRELOGIN response (the 2nd message) carries 0, the rest the SPID.
            let want = if i == 1 { 0 } else { spid };
            assert!(
                header_spids(bytes).iter().all(|s| *s == want),
                "server message {i} carries SPID {want}"
            );
        }
    }

    // A request that cannot be read (an RPC without ALL_HEADERS) or is not
    // supported (bulk load) is answered with an ERROR, and the session goes on.
    let mut off_record = Conversation {
        stream: c.stream.try_clone().unwrap(),
        transcript: Vec::new(),
        packet_size: 512,
    };
    for (ptype, payload) in [
        (packet_type::RPC, &[0xFF, 0xFF, 10, 0, 0, 0][..]),
        (packet_type::BULK_LOAD, &[1, 2, 3][..]),
    ] {
        let r = off_record.exchange(ptype, payload);
        assert!(
            tokens::decode(&r.payload)
                .unwrap()
                .iter()
                .any(|t| matches!(t, Token::Error(_)))
        );
    }
    let r = off_record.exchange(packet_type::SQL_BATCH, &batch::encode("SELECT 1", 0));
    assert!(matches!(
        tokens::decode(&r.payload).unwrap().last(),
        Some(Token::Done { row_count: 1, .. })
    ));

    check_with_tshark(&c.transcript, client_port, srv.port, spid);
}

/// Writes the transcript as a pcap (raw IPv4, a TCP handshake, then one
/// segment per ≤ 1448 bytes) and has tshark decode it.
fn check_with_tshark(transcript: &Transcript, client_port: u16, server_port: u16, spid: u16) {
    if !tshark_available() {
        return;
    }
    let dir = common::test_dir("pcap");
    let pcap = dir.join("tds.pcap");
    std::fs::write(&pcap, build_pcap(transcript, client_port, server_port)).unwrap();
    let tshark = |args: &[&str]| {
        let out = Command::new("tshark")
            .arg("-r")
            .arg(&pcap)
            .args(["-d", &format!("tcp.port=={server_port},tds")])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "tshark: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    };
    let verbose = tshark(&["-V"]);
    let fields = tshark(&[
        "-Y",
        "tds",
        "-T",
        "fields",
        "-e",
        "tcp.srcport",
        "-e",
        "tds.type",
        "-e",
        "tds.channel",
    ]);
    let _ = std::fs::remove_dir_all(&dir);

    for bad in ["Malformed", "Expert Info (Error", "Expert Info (Warning"] {
        assert!(!verbose.contains(bad), "tshark reports {bad}:\n{verbose}");
    }
    for expect in [
        "Pre-Login Message",
        "Encryption is not available",
        "TDS7 Login Packet",
        "Username: tester",
        "App name: tds_wire",
        "Token - LoginAck",
        "TDS version: 0x74000004",
        "Type: Database (1)",
        "Type: Packet size (4)",
        "Token - ColumnMetaData",
        "Token - Row",
        "Token - Done",
        "Query: SELECT 1",
        "Query: select @@spid",
        "Type: 52 (INT2TYPE",
    ] {
        assert!(
            verbose.contains(expect),
            "tshark output lacks {expect:?}:\n{verbose}"
        );
    }
    // Every server packet tshark saw carries the session's SPID ("channel").
    let server_rows: Vec<&str> = fields
        .lines()
        .filter(|l| l.starts_with(&format!("{server_port}\t")))
        .collect();
    assert_eq!(
        server_rows.len(),
        6,
        "one response each to PRELOGIN, LOGIN7, 3 batches, attention: {fields}"
    );
    for (i, row) in server_rows.iter().enumerate() {
        let cols: Vec<&str> = row.split('\t').collect();
        assert_eq!(cols[1].split(',').next(), Some("4"), "{row}");
        let want = if i == 0 { 0 } else { spid };
        assert!(cols[2].split(',').all(|c| c == want.to_string()), "{row}");
    }
}
