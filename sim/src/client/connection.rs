//! One TDS connection of the load driver: connect, PRELOGIN (and TLS as
//! agreed), LOGIN7, `SELECT @@SPID`, then SQL batches.
//!
//! With `--mars`, everything after the login response travels inside SMP
//! (as Microsoft's ODBC Driver 18 does it): every request is sent twice, on
//! logical sessions 0 and 1, both before either answer is read: two requests
//! in flight on one connection, as a MARS application has them.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use openssl::ssl::SslStream;

use super::{ClientConfig, ErrorKind, SessionError, protocol};
use crate::tds::login7::{self, Login7};
use crate::tds::prelogin::{self, ENCRYPT_NOT_SUP, ENCRYPT_OFF, ENCRYPT_ON, ENCRYPT_REQ};
use crate::tds::smp::Mux;
use crate::tds::tokens::{self, Token};
use crate::tds::{self, DEFAULT_PACKET_SIZE, TDS_7_4, batch, packet_type};
use crate::tls::client::{self as tls, Wire};

/// What the client asks for (`--encrypt`), as ODBC's Encrypt= keyword.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Encrypt {
    /// ENCRYPT_NOT_SUP: no TLS at all (the simulator's historical default).
    NotSupported,
    /// ENCRYPT_OFF: TLS for the login only, unless the server insists.
    Off,
    /// ENCRYPT_ON: TLS for the whole session.
    On,
    /// TDS 8.0: TLS before anything else.
    Strict,
}

/// The encryption in force on a connection, as the JSON reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InForce {
    None,
    LoginOnly,
    Full,
    Strict,
}

impl InForce {
    pub fn name(self) -> &'static str {
        match self {
            InForce::None => "none",
            InForce::LoginOnly => "login_only",
            InForce::Full => "full",
            InForce::Strict => "strict",
        }
    }
}

enum Stream {
    Plain(Wire),
    Tls(Box<SslStream<Wire>>),
}

impl Stream {
    fn wire(&mut self) -> &mut Wire {
        match self {
            Stream::Plain(w) => w,
            Stream::Tls(s) => s.get_mut(),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(w) => w.read(buf),
            Stream::Tls(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Plain(w) => w.write(buf),
            Stream::Tls(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        match self {
            Stream::Plain(w) => w.flush(),
            Stream::Tls(s) => s.flush(),
        }
    }
}

/// A logged-in TDS session.
pub struct Connection {
    stream: Stream,
    /// From the header of the LOGINACK response.
    pub spid: u16,
    /// What `SELECT @@SPID` answered.
    pub spid_selected: u16,
    pub client_port: u16,
    pub encryption: InForce,
    packet_size: usize,
    timeout: Duration,
    /// MARS: SMP's state, and whether the second logical session is open.
    mars: Option<Mux>,
    pair: bool,
}

impl Connection {
    /// Connects and logs in: PRELOGIN, TLS as agreed, LOGIN7, LOGINACK;
    /// then `SELECT @@SPID`.
    pub fn open(
        addr: SocketAddr,
        cfg: &ClientConfig,
        thread_id: u32,
    ) -> Result<Connection, SessionError> {
        let tcp = TcpStream::connect_timeout(&addr, cfg.timeout).map_err(|e| SessionError {
            kind: ErrorKind::Connect,
            detail: format!("{addr}: {e}"),
        })?;
        tcp.set_nodelay(true)?;
        tcp.set_write_timeout(Some(cfg.timeout))?;
        let client_port = tcp.local_addr()?.port();
        let wire = Wire::new(tcp, Instant::now() + cfg.timeout);
        let mut c = Connection {
            stream: Stream::Plain(wire),
            spid: 0,
            spid_selected: 0,
            client_port,
            encryption: InForce::None,
            packet_size: DEFAULT_PACKET_SIZE,
            timeout: cfg.timeout,
            mars: None,
            pair: false,
        };
        c.negotiate(cfg.encrypt, thread_id, cfg.mars)?;
        c.login(addr, cfg)?;
        if cfg.mars {
            let mut mux = Mux::default();
            let mut syns = mux.syn(0).to_vec();
            syns.extend_from_slice(&mux.syn(1));
            c.stream.write_all(&syns)?;
            c.mars = Some(mux);
            c.pair = true;
        }
        std::thread::sleep(cfg.idle_after_login);
        c.spid_selected = c.select_spid()?;
        Ok(c)
    }

    /// PRELOGIN and the TLS it leads to.
    fn negotiate(
        &mut self,
        encrypt: Encrypt,
        thread_id: u32,
        mars: bool,
    ) -> Result<(), SessionError> {
        let reply = self.prelogin(encrypt, thread_id, mars)?;
        if mars && !prelogin::mars(&reply) {
            return Err(protocol("PRELOGIN: asked for MARS, the server refused it"));
        }
        Ok(())
    }

    /// PRELOGIN and the TLS it leads to; the server's PRELOGIN options.
    fn prelogin(
        &mut self,
        encrypt: Encrypt,
        thread_id: u32,
        mars: bool,
    ) -> Result<Vec<prelogin::PreloginOption>, SessionError> {
        if encrypt == Encrypt::Strict {
            self.start_tls(true)?;
            self.encryption = InForce::Strict;
            // In TDS 8.0 PRELOGIN travels inside TLS and its ENCRYPTION
            // value negotiates nothing; ODBC Driver 18 sends ENCRYPT_NOT_SUP.
            let reply = self.request(
                packet_type::PRELOGIN,
                &prelogin::client_request(ENCRYPT_NOT_SUP, thread_id, mars),
            )?;
            return Ok(prelogin::decode(&reply.payload)?);
        }
        let asked = match encrypt {
            Encrypt::NotSupported => ENCRYPT_NOT_SUP,
            Encrypt::Off => ENCRYPT_OFF,
            _ => ENCRYPT_ON,
        };
        let reply = self.request(
            packet_type::PRELOGIN,
            &prelogin::client_request(asked, thread_id, mars),
        )?;
        let options = prelogin::decode(&reply.payload)?;
        let answer = prelogin::encryption(&options);
        // The client's half of MS-TDS's encryption table.
        self.encryption = match (asked, answer) {
            (ENCRYPT_NOT_SUP, Some(ENCRYPT_NOT_SUP)) => InForce::None,
            (ENCRYPT_OFF, Some(ENCRYPT_NOT_SUP)) => InForce::None,
            (ENCRYPT_OFF, Some(ENCRYPT_OFF)) => InForce::LoginOnly,
            (ENCRYPT_OFF | ENCRYPT_ON, Some(ENCRYPT_ON | ENCRYPT_REQ)) => InForce::Full,
            (_, other) => {
                return Err(protocol(format!(
                    "PRELOGIN: asked for encryption {asked}, the server answered {other:?}: \
                     no way to go on (MS-TDS 2.2.6.5)"
                )));
            }
        };
        if self.encryption != InForce::None {
            self.start_tls(false)?;
        }
        Ok(options)
    }

    fn start_tls(&mut self, strict: bool) -> Result<(), SessionError> {
        let Stream::Plain(wire) = &self.stream else {
            return Err(protocol("TLS started twice"));
        };
        let wire = Wire::new(wire.tcp().try_clone()?, Instant::now() + self.timeout);
        let s = if strict {
            tls::connect_strict(wire)
        } else {
            tls::connect_wrapped(wire)
        };
        self.stream = Stream::Tls(Box::new(s?));
        Ok(())
    }

    fn login(&mut self, addr: SocketAddr, cfg: &ClientConfig) -> Result<(), SessionError> {
        let login = Login7 {
            tds_version: TDS_7_4,
            packet_size: cfg.packet_size,
            client_prog_ver: 1,
            client_pid: std::process::id(),
            option_flags1: login7::OPTION_FLAGS1_DEFAULT,
            option_flags2: login7::OPTION_FLAGS2_DEFAULT,
            client_lcid: 0x0409,
            hostname: crate::hostname(),
            username: cfg.user.clone(),
            password: cfg.password.clone(),
            app_name: cfg.app.clone(),
            server_name: addr.ip().to_string(),
            library_name: "stalltrace-sim".into(),
            database: cfg.database.clone(),
            ..Login7::default()
        };
        self.send(0, packet_type::LOGIN7, &login.encode())?;
        if self.encryption == InForce::LoginOnly {
            // Login-only: TLS carried LOGIN7 alone; the response comes in
            // cleartext on the same socket.
            let tcp = self.stream.wire().tcp().try_clone()?;
            self.stream = Stream::Plain(Wire::new(tcp, Instant::now() + self.timeout));
        }
        let reply = self.receive()?;
        let mut acked = false;
        for t in tokens::decode(&reply.payload)? {
            match t {
                Token::LoginAck { .. } => acked = true,
                Token::EnvChange {
                    kind: tokens::ENV_PACKET_SIZE,
                    new,
                    ..
                } => {
                    let text = Token::env_text(&new)?;
                    self.packet_size = text
                        .parse()
                        .map_err(|_| protocol(format!("packet size {text:?}")))?;
                }
                Token::Error(m) => {
                    return Err(SessionError {
                        kind: ErrorKind::Server,
                        detail: format!("login: {}", m.text),
                    });
                }
                _ => {}
            }
        }
        if !acked {
            return Err(protocol("login response without LOGINACK"));
        }
        if reply.spid == 0 {
            return Err(protocol("login response with SPID 0"));
        }
        self.spid = reply.spid;
        Ok(())
    }

    fn send(&mut self, sid: u16, ptype: u8, payload: &[u8]) -> Result<(), SessionError> {
        let mut wire = tds::encode_message(ptype, 0, payload, self.packet_size);
        if let Some(mux) = &mut self.mars {
            wire = mux.wrap(sid, &wire);
        }
        self.stream.write_all(&wire)?;
        self.stream.flush()?;
        Ok(())
    }

    /// Reads one whole response (a tabular result) before the deadline.
    fn receive(&mut self) -> Result<tds::Message, SessionError> {
        self.stream.wire().deadline = Instant::now() + self.timeout;
        let reply = match &mut self.mars {
            None => tds::read_message(&mut self.stream)?,
            Some(mux) => tds::read_message(&mut mux.reader(&mut self.stream))?,
        };
        let reply = reply.ok_or_else(|| SessionError {
            kind: ErrorKind::Disconnected,
            detail: "server closed the connection".into(),
        })?;
        if reply.packet_type != packet_type::TABULAR_RESULT {
            return Err(protocol(format!(
                "response of packet type {:#04x}",
                reply.packet_type
            )));
        }
        if self.spid != 0 && reply.spid != self.spid {
            return Err(protocol(format!(
                "response with SPID {} on session {}",
                reply.spid, self.spid
            )));
        }
        Ok(reply)
    }

    /// One request and its response; with MARS, the same request on both
    /// logical sessions at once, and session 0's response.
    fn request(&mut self, ptype: u8, payload: &[u8]) -> Result<tds::Message, SessionError> {
        self.send(0, ptype, payload)?;
        if !self.pair {
            return self.receive();
        }
        self.send(1, ptype, payload)?;
        let first = self.receive()?;
        self.receive()?;
        Ok(first)
    }

    /// [`Self::execute`], and the time from just before the request was
    /// written to the kernel's receipt of the response's last bytes: what the
    /// session waited for, without this thread's own lateness in reading it.
    pub fn execute_timed(
        &mut self,
        sql: &str,
    ) -> Result<(Vec<Token>, Option<Duration>), SessionError> {
        self.stream.wire().last_arrival = None;
        let sent = std::time::SystemTime::now();
        let toks = self.execute(sql)?;
        let waited = self
            .stream
            .wire()
            .last_arrival
            .and_then(|at| at.duration_since(sent).ok());
        Ok((toks, waited))
    }

    /// Runs one SQL batch; an ERROR token or a response that does not end in a
    /// final DONE is an error. Returns the response's tokens.
    pub fn execute(&mut self, sql: &str) -> Result<Vec<Token>, SessionError> {
        let reply = self.request(packet_type::SQL_BATCH, &batch::encode(sql, 0))?;
        let toks = tokens::decode(&reply.payload)?;
        if let Some(Token::Error(m)) = toks.iter().find(|t| matches!(t, Token::Error(_))) {
            return Err(SessionError {
                kind: ErrorKind::Server,
                detail: format!("{}: {}", m.number, m.text),
            });
        }
        match toks.last() {
            Some(Token::Done { status, .. }) if status & tokens::DONE_MORE == 0 => Ok(toks),
            _ => Err(protocol("response does not end with a final DONE")),
        }
    }

    /// The session's SPID as the server's SQL sees it.
    fn select_spid(&mut self) -> Result<u16, SessionError> {
        let toks = self.execute("SELECT @@SPID")?;
        let value = toks.iter().find_map(|t| match t {
            Token::Row(v) if v.len() == 1 => v[0],
            _ => None,
        });
        value
            .and_then(|v| u16::try_from(v).ok())
            .ok_or_else(|| protocol(format!("SELECT @@SPID answered {toks:?}")))
    }
}
