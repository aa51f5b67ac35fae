//! TLS as SQL Server does it, through the host's libssl (the openssl crate,
//! dynamically linked to libssl.so.3; README.md says how to link it
//! statically instead).
//!
//! - [`ServerTls`]: the worker's self-signed certificate, made in memory at
//!   start as SQL Server makes one when none is configured, and the two
//!   contexts: TDS 7.x (TLS 1.2 at most, the handshake carried in PRELOGIN
//!   packets) and TDS 8.0 strict (TLS 1.2 or 1.3 straight on TCP, ALPN
//!   `tds/8.0`).
//! - [`channel`]: the server side of a session (handshakes, then TDS messages
//!   through `SSL_write_ex` or `SSL_write`, see [`BioStyle`]).
//! - [`client`]: the client side, for `sqlclient`.
//! - [`ffi`]: the raw libssl calls, the only `unsafe` here.

pub mod channel;
pub mod client;
pub mod ffi;

use std::fs::OpenOptions;
use std::io::{self, Read, Write};
use std::path::Path;
use std::sync::Mutex;

use openssl::asn1::Asn1Time;
use openssl::bn::{BigNum, MsbOption};
use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::pkey::{PKey, Private};
use openssl::rsa::Rsa;
use openssl::ssl::{
    AlpnError, SslContext, SslContextBuilder, SslMethod, SslOptions, SslVersion, select_next_proto,
};
use openssl::x509::extension::{BasicConstraints, ExtendedKeyUsage, KeyUsage};
use openssl::x509::{X509, X509NameBuilder};

/// The ALPN protocol of TDS 8.0, in wire format (length-prefixed).
pub const ALPN_TDS_8: &[u8] = b"\x07tds/8.0";
/// The first byte of a TLS handshake record: how a strict (TDS 8.0) client
/// opens, where a TDS 7.x client sends a PRELOGIN packet (0x12).
pub const TLS_HANDSHAKE: u8 = 0x16;
/// Largest TLS record body accepted (2^14 plaintext plus the most any cipher
/// adds, RFC 8446 5.2).
const MAX_RECORD: usize = 16384 + 2048;
/// TLS record header: content type, version, length.
pub const RECORD_HEADER: usize = 5;

/// How the server hands a TDS message to libssl once the handshake is done.
/// Both styles encrypt each message with one call on the session's thread;
/// they differ in which entry point and who sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum BioStyle {
    /// Memory BIOs: one `SSL_write_ex` encrypts into the write BIO, then the
    /// same thread takes the ciphertext and `write()`s it to the socket.
    Memory,
    /// An OpenSSL socket BIO: one `SSL_write`, which sends on the socket
    /// itself before it returns.
    Socket,
}

impl BioStyle {
    pub fn name(self) -> &'static str {
        match self {
            BioStyle::Memory => "memory",
            BioStyle::Socket => "socket",
        }
    }
}

/// The worker's TLS: its certificate and contexts.
pub struct ServerTls {
    /// TDS 7.x: the handshake inside PRELOGIN packets, TLS 1.2 at most (SQL
    /// Server only speaks TLS 1.3 with TDS 8.0).
    pub wrapped: SslContext,
    /// TDS 8.0 strict: TLS 1.2 or 1.3 first thing on the connection.
    pub strict: SslContext,
    pub bio: BioStyle,
    pub force_encryption: bool,
    /// The certificate's subject CN, for the start-up line.
    pub common_name: String,
    /// The certificate in PEM, for a client that must trust it explicitly
    /// (ODBC Driver 18 ignores TrustServerCertificate in strict mode and
    /// takes `ServerCertificate=FILE` instead).
    pub certificate_pem: Vec<u8>,
}

impl ServerTls {
    /// A fresh self-signed certificate for `common_name` and both contexts.
    /// With `keylog`, every session's secrets are appended to that file in
    /// NSS key log format (SSLKEYLOGFILE; for tests only).
    pub fn new(
        common_name: &str,
        bio: BioStyle,
        force_encryption: bool,
        keylog: Option<&Path>,
    ) -> anyhow::Result<ServerTls> {
        let key = PKey::from_rsa(Rsa::generate(2048)?)?;
        let cert = self_signed(&key, common_name)?;
        let keylog = match keylog {
            Some(p) => Some(std::sync::Arc::new(Mutex::new(
                OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(p)
                    .map_err(|e| anyhow::anyhow!("SSLKEYLOGFILE {}: {e}", p.display()))?,
            ))),
            None => None,
        };
        let build = |max: SslVersion, alpn: bool| -> Result<SslContext, ErrorStack> {
            let mut b = SslContextBuilder::new(SslMethod::tls_server())?;
            b.set_private_key(&key)?;
            b.set_certificate(&cert)?;
            b.check_private_key()?;
            b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
            b.set_max_proto_version(Some(max))?;
            // A client that drops the TCP connection without close_notify
            // (most do) ends the session cleanly rather than with an error.
            b.set_options(SslOptions::IGNORE_UNEXPECTED_EOF);
            if alpn {
                b.set_alpn_select_callback(|_, client| {
                    select_next_proto(ALPN_TDS_8, client).ok_or(AlpnError::NOACK)
                });
            }
            if let Some(file) = keylog.clone() {
                b.set_keylog_callback(move |_, line| {
                    let mut f = file.lock().unwrap_or_else(|e| e.into_inner());
                    let _ = writeln!(f, "{line}");
                });
            }
            Ok(b.build())
        };
        Ok(ServerTls {
            wrapped: build(SslVersion::TLS1_2, false)?,
            strict: build(SslVersion::TLS1_3, true)?,
            bio,
            force_encryption,
            common_name: common_name.to_string(),
            certificate_pem: cert.to_pem()?,
        })
    }
}

/// A certificate like the one SQL Server generates for itself: RSA 2048,
/// SHA-256, CN = the host name, valid for a year, for server authentication.
fn self_signed(key: &PKey<Private>, common_name: &str) -> Result<X509, ErrorStack> {
    let mut name = X509NameBuilder::new()?;
    name.append_entry_by_text("CN", common_name)?;
    let name = name.build();
    let mut serial = BigNum::new()?;
    serial.rand(64, MsbOption::MAYBE_ZERO, false)?;
    let mut b = X509::builder()?;
    b.set_version(2)?;
    let serial = serial.to_asn1_integer()?;
    b.set_serial_number(&serial)?;
    b.set_subject_name(&name)?;
    b.set_issuer_name(&name)?;
    b.set_pubkey(key)?;
    let (from, until) = (Asn1Time::days_from_now(0)?, Asn1Time::days_from_now(365)?);
    b.set_not_before(&from)?;
    b.set_not_after(&until)?;
    b.append_extension(BasicConstraints::new().build()?)?;
    b.append_extension(
        KeyUsage::new()
            .digital_signature()
            .key_encipherment()
            .build()?,
    )?;
    b.append_extension(ExtendedKeyUsage::new().server_auth().build()?)?;
    b.sign(key, MessageDigest::sha256())?;
    Ok(b.build())
}

/// Reads exactly one TLS record (header and body) from `r`, never a byte
/// more, so that what follows it stays in the socket for whoever reads next
/// (libssl's socket BIO, or the cleartext TDS after a login-only exchange).
/// `Ok(None)` when the stream ends before the record starts.
pub fn read_record(r: &mut impl Read) -> io::Result<Option<Vec<u8>>> {
    let mut rec = vec![0u8; RECORD_HEADER];
    let mut got = 0;
    while got < RECORD_HEADER {
        match r.read(&mut rec[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let len = u16::from_be_bytes([rec[3], rec[4]]) as usize;
    if !(20..=24).contains(&rec[0]) || rec[1] != 3 || len > MAX_RECORD {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "not a TLS record: header {:02x?} (a TDS packet where TLS was expected?)",
                &rec[..RECORD_HEADER]
            ),
        ));
    }
    rec.resize(RECORD_HEADER + len, 0);
    r.read_exact(&mut rec[RECORD_HEADER..])?;
    Ok(Some(rec))
}

/// The key log file named by SSLKEYLOGFILE, if set and not empty.
pub fn keylog_from_env() -> Option<std::path::PathBuf> {
    std::env::var_os("SSLKEYLOGFILE")
        .filter(|v| !v.is_empty())
        .map(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_reader_takes_one_record_exactly() {
        let mut wire = vec![0x17, 3, 3, 0, 2, 0xAA, 0xBB];
        wire.extend_from_slice(&[0x04, 1, 0, 8]);
        let mut r = &wire[..];
        assert_eq!(read_record(&mut r).unwrap().unwrap().len(), 7);
        assert_eq!(r, &[0x04, 1, 0, 8], "the rest is left unread");
        let mut empty: &[u8] = &[];
        assert!(read_record(&mut empty).unwrap().is_none());
    }

    #[test]
    fn a_tds_packet_is_not_a_tls_record() {
        let mut r: &[u8] = &[0x12, 1, 0, 47, 0, 0, 1, 0];
        assert_eq!(
            read_record(&mut r).unwrap_err().kind(),
            io::ErrorKind::InvalidData
        );
    }

    #[test]
    fn certificate_is_self_signed_for_the_host() {
        let tls = ServerTls::new("simhost", BioStyle::Memory, false, None).unwrap();
        let ssl = openssl::ssl::Ssl::new(&tls.wrapped).unwrap();
        let cert = ssl.certificate().unwrap();
        let cn = cert
            .subject_name()
            .entries_by_nid(openssl::nid::Nid::COMMONNAME)
            .next()
            .unwrap()
            .data()
            .as_slice()
            .to_vec();
        assert_eq!(cn, b"simhost");
        assert!(cert.verify(&cert.public_key().unwrap()).unwrap());
    }
}
