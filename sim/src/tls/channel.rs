//! The server side of a TLS session: the handshake (inside PRELOGIN packets
//! for TDS 7.x, straight on TCP for TDS 8.0 strict), then TDS messages in and
//! out through libssl on the session's own thread.
//!
//! The handshake always runs on memory BIOs: each client flight is read from
//! the socket exactly (one PRELOGIN message, or one TLS record at a time),
//! fed to libssl, and libssl's answer is sent wrapped (or raw, strict). So no
//! byte past the handshake is ever read into a buffer of ours, and the switch
//! to a socket BIO loses nothing.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;

use openssl::ssl::SslContext;

use super::ffi::{RawTls, ReadOutcome};
use super::{BioStyle, read_record};
use crate::tds::{self, DEFAULT_PACKET_SIZE, packet_type};

/// A session's TLS after the handshake.
pub struct TlsChannel<'a> {
    tls: RawTls,
    stream: &'a TcpStream,
    bio: BioStyle,
}

impl<'a> TlsChannel<'a> {
    /// TDS 7.x: the client's handshake records arrive as the payloads of
    /// PRELOGIN messages (packet type 0x12) and the server's go back the same
    /// way, with SPID 0 as every packet before the login response; after the
    /// handshake, TLS records travel raw on the TCP stream.
    pub fn accept_wrapped(
        ctx: &SslContext,
        stream: &'a TcpStream,
        bio: BioStyle,
    ) -> io::Result<TlsChannel<'a>> {
        let mut tls = RawTls::accept_with_memory_bios(ctx)?;
        let mut r = stream;
        loop {
            let msg = tds::read_message(&mut r)?.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "client closed during the TLS handshake",
                )
            })?;
            if msg.packet_type != packet_type::PRELOGIN {
                return Err(tds::invalid(format!(
                    "packet type {:#04x} during the TLS handshake (expected PRELOGIN)",
                    msg.packet_type
                )));
            }
            tls.feed(&msg.payload)?;
            let done = tls.handshake();
            // Send libssl's output even when the handshake failed: it is
            // the alert that tells the client why.
            let out = tls.take_output();
            if !out.is_empty() {
                tds::write_message(
                    &mut &*stream,
                    packet_type::PRELOGIN,
                    0,
                    &out,
                    DEFAULT_PACKET_SIZE,
                )?;
            }
            if done? {
                return Self::established(tls, stream, bio);
            }
        }
    }

    /// TDS 8.0 strict: TLS first thing on the connection, one record at a
    /// time from the socket, libssl's output written raw.
    pub fn accept_strict(
        ctx: &SslContext,
        stream: &'a TcpStream,
        bio: BioStyle,
    ) -> io::Result<TlsChannel<'a>> {
        let mut tls = RawTls::accept_with_memory_bios(ctx)?;
        let mut r = stream;
        loop {
            let rec = read_record(&mut r)?.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "client closed during the TLS handshake",
                )
            })?;
            tls.feed(&rec)?;
            let done = tls.handshake();
            let out = tls.take_output();
            if !out.is_empty() {
                (&mut &*stream).write_all(&out)?;
            }
            if done? {
                return Self::established(tls, stream, bio);
            }
        }
    }

    fn established(
        mut tls: RawTls,
        stream: &'a TcpStream,
        bio: BioStyle,
    ) -> io::Result<TlsChannel<'a>> {
        // Whatever the last handshake step left (TLS 1.3 session tickets)
        // goes out before the BIOs may change.
        let out = tls.take_output();
        if !out.is_empty() {
            (&mut &*stream).write_all(&out)?;
        }
        if bio == BioStyle::Socket {
            tls.use_socket(stream.as_raw_fd())?;
        }
        Ok(TlsChannel { tls, stream, bio })
    }

    /// Encrypts and sends one whole TDS message (all its packets) with one
    /// libssl write call on this thread:
    /// - `memory`: `SSL_write_ex` into the memory BIO, and only after it has
    ///   returned, one `write()` of the ciphertext to the socket;
    /// - `socket`: `SSL_write`, which sends on the socket itself.
    ///
    /// The plaintext starts with the message's first TDS header, so its first
    /// 8 bytes carry the SPID.
    pub fn send(&mut self, wire: &[u8]) -> io::Result<()> {
        match self.bio {
            BioStyle::Memory => {
                self.tls.write_ex(wire)?;
                let out = self.tls.take_output();
                (&mut &*self.stream).write_all(&out)
            }
            BioStyle::Socket => self.tls.write(wire),
        }
    }
}

impl Read for TlsChannel<'_> {
    /// Plaintext from `SSL_read_ex`; with memory BIOs, a TLS record is read
    /// from the socket (exactly) whenever libssl wants more.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.tls.read_ex(buf)? {
                ReadOutcome::Data(n) => return Ok(n),
                ReadOutcome::Closed => return Ok(0),
                ReadOutcome::WantRead if self.bio == BioStyle::Memory => {
                    let mut r = self.stream;
                    match read_record(&mut r)? {
                        Some(rec) => self.tls.feed(&rec)?,
                        None => return Ok(0),
                    }
                }
                // A blocking socket BIO only wants more after a
                // non-application record (a TLS 1.3 key update): read again.
                ReadOutcome::WantRead => {}
            }
        }
    }
}
