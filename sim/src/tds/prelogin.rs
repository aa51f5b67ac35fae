//! PRELOGIN (MS-TDS 2.2.6.5): a table of (token, offset, length) entries, all
//! big-endian and ended by 0xFF, then the option values. The client sends it as
//! packet type 0x12; the server answers in the same layout as packet type 4.

use std::io;

use super::{Cursor, invalid};

pub const VERSION: u8 = 0x00;
pub const ENCRYPTION: u8 = 0x01;
pub const INSTOPT: u8 = 0x02;
pub const THREADID: u8 = 0x03;
pub const MARS: u8 = 0x04;
pub const TERMINATOR: u8 = 0xFF;

pub const ENCRYPT_OFF: u8 = 0x00;
pub const ENCRYPT_ON: u8 = 0x01;
pub const ENCRYPT_NOT_SUP: u8 = 0x02;
pub const ENCRYPT_REQ: u8 = 0x03;

/// The version the simulated server claims: SQL Server 2022 RTM, 16.0.1000
/// (major, minor, build big-endian; sub-build 0, so its byte order is moot).
pub const SERVER_VERSION: [u8; 6] = [16, 0, 0x03, 0xE8, 0x00, 0x00];

/// One option: its token and value bytes.
pub type PreloginOption = (u8, Vec<u8>);

/// Lays out the option table and the values behind it.
pub fn encode(options: &[PreloginOption]) -> Vec<u8> {
    let table_len = options.len() * 5 + 1;
    let mut out = Vec::with_capacity(table_len + options.iter().map(|o| o.1.len()).sum::<usize>());
    let mut offset = table_len;
    for (token, data) in options {
        out.push(*token);
        out.extend_from_slice(&(offset as u16).to_be_bytes());
        out.extend_from_slice(&(data.len() as u16).to_be_bytes());
        offset += data.len();
    }
    out.push(TERMINATOR);
    for (_, data) in options {
        out.extend_from_slice(data);
    }
    out
}

/// Reads the option table, in the order sent.
pub fn decode(payload: &[u8]) -> io::Result<Vec<PreloginOption>> {
    let mut c = Cursor::new(payload);
    let mut options = Vec::new();
    loop {
        let token = c.u8()?;
        if token == TERMINATOR {
            return Ok(options);
        }
        let offset = c.u16_be()? as usize;
        let len = c.u16_be()? as usize;
        let data = payload.get(offset..offset + len).ok_or_else(|| {
            invalid(format!(
                "PRELOGIN option {token:#04x} points past the message"
            ))
        })?;
        options.push((token, data.to_vec()));
    }
}

/// The value of one option, if present.
pub fn option(options: &[PreloginOption], token: u8) -> Option<&[u8]> {
    options
        .iter()
        .find(|o| o.0 == token)
        .map(|o| o.1.as_slice())
}

/// The ENCRYPTION byte, if present.
pub fn encryption(options: &[PreloginOption]) -> Option<u8> {
    option(options, ENCRYPTION).and_then(|v| v.first().copied())
}

/// Whether the MARS option asks for (or grants) MARS: its value is 1.
pub fn mars(options: &[PreloginOption]) -> bool {
    option(options, MARS) == Some(&[1][..])
}

/// What the session does after PRELOGIN, from the two ENCRYPTION values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encryption {
    /// No TLS at all: everything, login included, in cleartext.
    None,
    /// TLS for the LOGIN7 packet only; the login response and everything
    /// after it in cleartext (both sides said ENCRYPT_OFF).
    LoginOnly,
    /// TLS for the whole session.
    Full,
    /// The server answers and then closes: it requires encryption and the
    /// client cannot do it.
    Refuse,
}

/// The server's side of MS-TDS 2.2.6.5's encryption table: the ENCRYPTION
/// value it answers and what follows. `tls` is whether the server has a
/// certificate (false: it is ENCRYPT_NOT_SUP); `forced` is SQL Server's
/// "Force Encryption" (the server's own setting is ENCRYPT_ON rather than
/// ENCRYPT_OFF). A client value with the client-certificate bit (0x80) is
/// taken as its low bits; a missing ENCRYPTION option as ENCRYPT_NOT_SUP.
pub fn negotiate(client: Option<u8>, tls: bool, forced: bool) -> (u8, Encryption) {
    let client = client.map_or(ENCRYPT_NOT_SUP, |v| v & 0x7F);
    if !tls {
        // A client that insists on encryption hangs up on this answer.
        return (ENCRYPT_NOT_SUP, Encryption::None);
    }
    match (client, forced) {
        (ENCRYPT_OFF, false) => (ENCRYPT_OFF, Encryption::LoginOnly),
        (ENCRYPT_OFF, true) => (ENCRYPT_REQ, Encryption::Full),
        (ENCRYPT_NOT_SUP, false) => (ENCRYPT_NOT_SUP, Encryption::None),
        (ENCRYPT_NOT_SUP, true) => (ENCRYPT_REQ, Encryption::Refuse),
        // ENCRYPT_ON, ENCRYPT_REQ, and values MS-TDS does not define (taken
        // as a wish for encryption).
        _ => (ENCRYPT_ON, Encryption::Full),
    }
}

/// A client's PRELOGIN: driver version, the given ENCRYPTION value, default
/// instance, its thread id, and whether it asks for MARS.
pub fn client_request(encryption: u8, thread_id: u32, mars: bool) -> Vec<u8> {
    encode(&[
        (VERSION, vec![0x01, 0x00, 0x00, 0x00, 0x00, 0x00]),
        (ENCRYPTION, vec![encryption]),
        (INSTOPT, vec![0x00]),
        (THREADID, thread_id.to_be_bytes().to_vec()),
        (MARS, vec![u8::from(mars)]),
    ])
}

/// The server's answer: its version, the negotiated ENCRYPTION value,
/// instance ok, and whether MARS is on (as SQL Server, whenever the client
/// asks).
pub fn server_response(encryption: u8, mars: bool) -> Vec<u8> {
    encode(&[
        (VERSION, SERVER_VERSION.to_vec()),
        (ENCRYPTION, vec![encryption]),
        (INSTOPT, vec![0x00]),
        (THREADID, Vec::new()),
        (MARS, vec![u8::from(mars)]),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_response_layout() {
        let b = server_response(ENCRYPT_NOT_SUP, false);
        // 5 entries of 5 bytes + terminator = 26; VERSION's 6 bytes start there.
        assert_eq!(&b[..5], &[VERSION, 0, 26, 0, 6]);
        assert_eq!(&b[5..10], &[ENCRYPTION, 0, 32, 0, 1]);
        assert_eq!(b[25], TERMINATOR);
        assert_eq!(&b[26..32], &SERVER_VERSION);
        assert_eq!(b[32], ENCRYPT_NOT_SUP);
        // Values: VERSION 6, ENCRYPTION 1, INSTOPT 1, THREADID 0, MARS 1.
        assert_eq!(b.len(), 26 + 6 + 1 + 1 + 1);
    }

    #[test]
    fn round_trip() {
        let opts = decode(&client_request(ENCRYPT_NOT_SUP, 0x0102_0304, false)).unwrap();
        assert_eq!(encryption(&opts), Some(ENCRYPT_NOT_SUP));
        assert_eq!(option(&opts, THREADID), Some(&[1u8, 2, 3, 4][..]));
        assert_eq!(opts.len(), 5);
        let opts = decode(&server_response(ENCRYPT_NOT_SUP, false)).unwrap();
        assert_eq!(option(&opts, VERSION), Some(&SERVER_VERSION[..]));
        assert_eq!(option(&opts, THREADID), Some(&[][..]));
    }

    #[test]
    fn encryption_table_of_ms_tds() {
        use Encryption::*;
        let n = |c, tls, forced| negotiate(Some(c), tls, forced);
        // Server set to ENCRYPT_OFF (a certificate, not forced).
        assert_eq!(n(ENCRYPT_OFF, true, false), (ENCRYPT_OFF, LoginOnly));
        assert_eq!(n(ENCRYPT_ON, true, false), (ENCRYPT_ON, Full));
        assert_eq!(n(ENCRYPT_NOT_SUP, true, false), (ENCRYPT_NOT_SUP, None));
        assert_eq!(n(ENCRYPT_REQ, true, false), (ENCRYPT_ON, Full));
        // Server set to ENCRYPT_ON (Force Encryption).
        assert_eq!(n(ENCRYPT_OFF, true, true), (ENCRYPT_REQ, Full));
        assert_eq!(n(ENCRYPT_ON, true, true), (ENCRYPT_ON, Full));
        assert_eq!(n(ENCRYPT_REQ, true, true), (ENCRYPT_ON, Full));
        assert_eq!(n(ENCRYPT_NOT_SUP, true, true), (ENCRYPT_REQ, Refuse));
        // Server set to ENCRYPT_NOT_SUP (--no-tls): the client decides.
        for c in [ENCRYPT_OFF, ENCRYPT_ON, ENCRYPT_NOT_SUP, ENCRYPT_REQ] {
            assert_eq!(n(c, false, false), (ENCRYPT_NOT_SUP, None));
        }
        // The client-certificate bit is ignored; no option means no TLS.
        assert_eq!(n(0x81, true, false), (ENCRYPT_ON, Full));
        assert_eq!(
            negotiate(Option::None, true, false),
            (ENCRYPT_NOT_SUP, None)
        );
    }

    #[test]
    fn bad_offsets_and_missing_terminator_are_errors() {
        assert!(decode(&[ENCRYPTION, 0, 50, 0, 1, TERMINATOR]).is_err());
        assert!(decode(&[ENCRYPTION, 0, 6, 0, 1]).is_err());
    }
}
