//! One client connection, from its first byte to its close:
//!
//! 1. the first byte tells TDS 8.0 strict (0x16, a TLS ClientHello) from TDS
//!    7.x (0x12, a PRELOGIN packet);
//! 2. TDS 7.x: PRELOGIN in cleartext, the ENCRYPTION answer from MS-TDS's
//!    table, then, if encryption was agreed, the TLS handshake inside PRELOGIN
//!    packets; strict: the TLS handshake first, then PRELOGIN inside TLS;
//! 3. LOGIN7 (inside TLS unless neither side does encryption), and the login
//!    response: in cleartext after a login-only exchange, else in TLS;
//! 4. requests until the client leaves.
//!
//! With MARS (asked for in PRELOGIN, granted as SQL Server does), everything
//! after the login response travels inside SMP (LOGIN7 and its response do
//! not, as Microsoft's ODBC Driver 18 sends them), and each request is
//! answered on the logical session it came on, in the order requests arrive.
//!
//! Every packet before the login response carries SPID 0, as SQL Server's
//! do; the login response and everything after carry the session's SPID.

use std::io::{self, BufReader, Write};
use std::net::TcpStream;

use super::requests::{self, Session};
use super::{Shared, login_response, negotiated_packet_size, seed};
use crate::storage::Rng;
use crate::tds::login7::Login7;
use crate::tds::prelogin::{self, Encryption};
use crate::tds::smp::Mux;
use crate::tds::{self, DEFAULT_PACKET_SIZE, Message, TDS_7_4, packet_type};
use crate::tls::TLS_HANDSHAKE;
use crate::tls::channel::TlsChannel;

/// Where TDS messages travel: the socket itself, or TLS over it.
enum Link<'a> {
    /// Cleartext: reads buffered (nothing follows that must stay in the
    /// socket), each message written with one `write()`.
    Clear(BufReader<&'a TcpStream>, &'a TcpStream),
    Tls(TlsChannel<'a>),
}

impl io::Read for Link<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Link::Clear(r, _) => r.read(buf),
            Link::Tls(c) => c.read(buf),
        }
    }
}

impl Link<'_> {
    fn read(&mut self) -> io::Result<Option<Message>> {
        tds::read_message(self)
    }

    /// One whole message: one `write()` in cleartext, one libssl write call
    /// in TLS.
    fn send(&mut self, ptype: u8, spid: u16, payload: &[u8], packet_size: usize) -> io::Result<()> {
        self.write_wire(&tds::encode_message(ptype, spid, payload, packet_size))
    }

    fn write_wire(&mut self, wire: &[u8]) -> io::Result<()> {
        match self {
            Link::Clear(_, s) => (&mut &**s).write_all(wire),
            Link::Tls(c) => c.send(wire),
        }
    }
}

/// A link with MARS on or off: messages read with the logical session they
/// came on (0 without MARS), and answered on it.
struct Sessions<'a> {
    link: Link<'a>,
    mars: Option<Mux>,
}

impl Sessions<'_> {
    fn read(&mut self) -> io::Result<Option<(Message, u16)>> {
        match &mut self.mars {
            None => Ok(self.link.read()?.map(|m| (m, 0))),
            Some(mux) => {
                let msg = tds::read_message(&mut mux.reader(&mut self.link))?;
                Ok(msg.map(|m| (m, mux.last_sid())))
            }
        }
    }

    fn send(&mut self, sid: u16, spid: u16, payload: &[u8], packet_size: usize) -> io::Result<()> {
        let wire = tds::encode_message(packet_type::TABULAR_RESULT, spid, payload, packet_size);
        match &mut self.mars {
            None => self.link.write_wire(&wire),
            Some(mux) => self.link.write_wire(&mux.wrap(sid, &wire)),
        }
    }
}

/// The session's state machine; `Ok` on a clean close by either side.
pub fn serve(shared: &Shared, stream: &TcpStream, spid: u16) -> io::Result<()> {
    let Some(first) = peek_first_byte(stream)? else {
        return Ok(());
    };
    let (link, login_only, mars) = if first == TLS_HANDSHAKE {
        let Some(tls) = &shared.tls else {
            return Err(tds::invalid(
                "a TLS handshake first (TDS 8.0 strict), but this server runs with --no-tls",
            ));
        };
        let mut link = Link::Tls(TlsChannel::accept_strict(&tls.strict, stream, tls.bio)?);
        // PRELOGIN comes inside TLS; the encryption it asks for is moot.
        let Some(msg) = link.read()? else {
            return Ok(());
        };
        if msg.packet_type != packet_type::PRELOGIN {
            let mut plain = Sessions { link, mars: None };
            return refuse_before_login(&mut plain, shared, msg.packet_type);
        }
        let opts = prelogin::decode(&msg.payload)?;
        let (answer, _) = prelogin::negotiate(prelogin::encryption(&opts), true, false);
        let mars = prelogin::mars(&opts);
        let reply = prelogin::server_response(answer, mars);
        link.send(packet_type::TABULAR_RESULT, 0, &reply, DEFAULT_PACKET_SIZE)?;
        (link, false, mars)
    } else {
        match prelogin_7x(shared, stream)? {
            Some(l) => l,
            None => return Ok(()),
        }
    };
    let mut conn = Sessions { link, mars: None };

    let Some((msg, sid)) = conn.read()? else {
        return Ok(());
    };
    if msg.packet_type != packet_type::LOGIN7 {
        return refuse_before_login(&mut conn, shared, msg.packet_type);
    }
    let login = Login7::decode(&msg.payload)?;
    if login_only {
        // Login-only encryption: TLS ends with the LOGIN7 packet; the login
        // response and everything after it go in cleartext.
        conn.link = Link::Clear(BufReader::with_capacity(64 << 10, stream), stream);
    }
    let version = login.tds_version.min(TDS_7_4);
    let mut reply = Vec::with_capacity(256);
    login_response(&mut reply, shared, version, login.packet_size);
    // The response still goes at the old packet size; the new one applies
    // from the next message on.
    conn.send(sid, spid, &reply, DEFAULT_PACKET_SIZE)?;
    let packet_size = negotiated_packet_size(login.packet_size);
    conn.mars = mars.then(Mux::default);

    let mut session = Session::new(spid, version, Rng::new(seed(spid)));
    while let Some((msg, sid)) = conn.read()? {
        let reply = match msg.packet_type {
            packet_type::SQL_BATCH => session.sql_batch(shared, &msg.payload)?,
            packet_type::RPC => session.rpc(shared, &msg.payload),
            packet_type::TRANSACTION_MANAGER => session.transaction_manager(shared, &msg.payload),
            packet_type::ATTENTION => {
                // Requests run to completion before the next is read, so
                // there is nothing to cancel: just acknowledge.
                let mut r = Vec::new();
                tds::tokens::done(&mut r, tds::tokens::DONE_ATTN, 0, 0);
                r
            }
            t => session.unsupported(shared, t),
        };
        conn.send(sid, spid, &reply, packet_size)?;
    }
    Ok(())
}

/// TDS 7.x's PRELOGIN in cleartext, read exactly (a TLS handshake may
/// follow), answered per MS-TDS's encryption table; then the handshake if
/// encryption was agreed. The link LOGIN7 comes on, whether TLS ends after
/// it (login-only encryption) and whether MARS is on; None when the session
/// ends here.
fn prelogin_7x<'a>(
    shared: &Shared,
    stream: &'a TcpStream,
) -> io::Result<Option<(Link<'a>, bool, bool)>> {
    let Some(msg) = tds::read_message(&mut &*stream)? else {
        return Ok(None);
    };
    let clear = Link::Clear(BufReader::new(stream), stream);
    if msg.packet_type != packet_type::PRELOGIN {
        let mut plain = Sessions {
            link: clear,
            mars: None,
        };
        refuse_before_login(&mut plain, shared, msg.packet_type)?;
        return Ok(None);
    }
    let opts = prelogin::decode(&msg.payload)?;
    let forced = shared.tls.as_ref().is_some_and(|t| t.force_encryption);
    let (answer, mode) =
        prelogin::negotiate(prelogin::encryption(&opts), shared.tls.is_some(), forced);
    let mars = prelogin::mars(&opts);
    let reply = prelogin::server_response(answer, mars);
    tds::write_message(
        &mut &*stream,
        packet_type::TABULAR_RESULT,
        0,
        &reply,
        DEFAULT_PACKET_SIZE,
    )?;
    let tls = match (mode, &shared.tls) {
        (Encryption::None, _) | (_, None) => return Ok(Some((clear, false, mars))),
        (Encryption::Refuse, _) => {
            eprintln!(
                "sqlservr: {}: the client cannot encrypt and --force-encryption is set: closing",
                peer(stream)
            );
            return Ok(None);
        }
        (_, Some(tls)) => tls,
    };
    let channel = TlsChannel::accept_wrapped(&tls.wrapped, stream, tls.bio)?;
    Ok(Some((
        Link::Tls(channel),
        mode == Encryption::LoginOnly,
        mars,
    )))
}

/// Anything but PRELOGIN or LOGIN7 before login: SQL Server says why (with
/// SPID 0, there being no session yet) and drops the client.
fn refuse_before_login(conn: &mut Sessions, shared: &Shared, ptype: u8) -> io::Result<()> {
    let mut reply = Vec::new();
    let text = format!("Unexpected request type {ptype:#04x} before login.");
    requests::error(&mut reply, shared, 4002, &text, tds::tokens::DONE);
    conn.send(0, 0, &reply, DEFAULT_PACKET_SIZE)
}

/// The connection's first byte, left in the socket; None if the client
/// closed without sending anything.
fn peek_first_byte(stream: &TcpStream) -> io::Result<Option<u8>> {
    let mut b = [0u8; 1];
    loop {
        match stream.peek(&mut b) {
            Ok(0) => return Ok(None),
            Ok(_) => return Ok(Some(b[0])),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

pub fn peer(stream: &TcpStream) -> String {
    stream
        .peer_addr()
        .map(|a| a.to_string())
        .unwrap_or_default()
}
