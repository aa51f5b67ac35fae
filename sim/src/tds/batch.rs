//! SQL batch (MS-TDS 2.2.6.7), and the ALL_HEADERS that, since TDS 7.2, start
//! SQL batches, RPC requests and transaction manager requests (2.2.5.3).

use std::io;

use super::{Cursor, get_ucs2, invalid, put_ucs2};

/// ALL_HEADERS header type of the transaction descriptor.
const HEADER_TRANSACTION_DESCRIPTOR: u16 = 0x0002;

/// What ALL_HEADERS says about the request's transaction.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct AllHeaders {
    /// 0 outside a transaction; else the descriptor the server handed out in
    /// its BEGIN TRANSACTION ENVCHANGE.
    pub transaction_descriptor: u64,
    pub outstanding_requests: u32,
}

/// Appends ALL_HEADERS with just the transaction descriptor header.
pub fn put_all_headers(out: &mut Vec<u8>, transaction_descriptor: u64) {
    // TotalLength(4) + HeaderLength(4) + HeaderType(2) + descriptor(8) + count(4).
    const ALL_HEADERS_LEN: u32 = 4 + 4 + 2 + 8 + 4;
    out.extend_from_slice(&ALL_HEADERS_LEN.to_le_bytes());
    out.extend_from_slice(&(ALL_HEADERS_LEN - 4).to_le_bytes());
    out.extend_from_slice(&HEADER_TRANSACTION_DESCRIPTOR.to_le_bytes());
    out.extend_from_slice(&transaction_descriptor.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
}

/// Reads ALL_HEADERS at the cursor (its start). Headers of other types (query
/// notifications, trace activity) are skipped; without a transaction
/// descriptor header the request is outside any transaction.
pub fn all_headers(c: &mut Cursor) -> io::Result<AllHeaders> {
    let start = c.pos();
    let total = c.u32_le()? as usize;
    if total < 4 || total - 4 > c.remaining() {
        return Err(invalid(format!(
            "ALL_HEADERS length {total} with {} bytes left",
            c.remaining() + 4
        )));
    }
    let mut h = AllHeaders::default();
    // Each header is length-prefixed; they must tile ALL_HEADERS exactly.
    while c.pos() < start + total {
        let len = c.u32_le()? as usize;
        if len < 6 || c.pos() - 4 + len > start + total {
            return Err(invalid(format!("bad ALL_HEADERS entry of {len} bytes")));
        }
        let body = c.bytes(len - 4)?;
        if u16::from_le_bytes([body[0], body[1]]) == HEADER_TRANSACTION_DESCRIPTOR {
            let mut b = Cursor::new(&body[2..]);
            h.transaction_descriptor = b.u64_le()?;
            h.outstanding_requests = b.u32_le()?;
        }
    }
    Ok(h)
}

/// A batch in the given transaction (0: autocommit), one outstanding request.
pub fn encode(sql: &str, transaction_descriptor: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(22 + sql.len() * 2);
    put_all_headers(&mut out, transaction_descriptor);
    put_ucs2(&mut out, sql);
    out
}

/// A decoded SQL batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub headers: AllHeaders,
    pub sql: String,
}

/// `has_all_headers` is whether the login's TDS version is 7.2 or later.
pub fn decode(payload: &[u8], has_all_headers: bool) -> io::Result<Batch> {
    let mut c = Cursor::new(payload);
    let headers = if has_all_headers {
        all_headers(&mut c)?
    } else {
        AllHeaders::default()
    };
    Ok(Batch {
        headers,
        sql: get_ucs2(c.bytes(c.remaining())?)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_round_trip() {
        let b = encode("SELECT 1", 0x0102);
        assert_eq!(&b[..4], &[22, 0, 0, 0]);
        assert_eq!(&b[4..10], &[18, 0, 0, 0, 2, 0]);
        assert_eq!(&b[10..12], &[2, 1], "descriptor little-endian");
        assert_eq!(&b[22..24], &[b'S', 0]);
        let d = decode(&b, true).unwrap();
        assert_eq!(d.sql, "SELECT 1");
        assert_eq!(d.headers.transaction_descriptor, 0x0102);
        assert_eq!(d.headers.outstanding_requests, 1);
    }

    #[test]
    fn pre_7_2_batches_have_no_headers() {
        let mut b = Vec::new();
        put_ucs2(&mut b, "SELECT 1");
        assert_eq!(decode(&b, false).unwrap().sql, "SELECT 1");
    }

    #[test]
    fn other_headers_are_skipped() {
        // A trace activity header (type 3, 20-byte GUID + 4-byte sequence)
        // before the transaction descriptor.
        let mut b = Vec::new();
        b.extend_from_slice(&(4u32 + 30 + 18).to_le_bytes());
        b.extend_from_slice(&30u32.to_le_bytes());
        b.extend_from_slice(&3u16.to_le_bytes());
        b.extend_from_slice(&[7; 24]);
        let mut td = Vec::new();
        put_all_headers(&mut td, 9);
        b.extend_from_slice(&td[4..]);
        put_ucs2(&mut b, "x");
        let d = decode(&b, true).unwrap();
        assert_eq!(d.headers.transaction_descriptor, 9);
        assert_eq!(d.sql, "x");
    }

    #[test]
    fn broken_headers_are_rejected() {
        let mut b = encode("SELECT 1", 0);
        b[0] = 200;
        assert!(decode(&b, true).is_err());
        let mut b = encode("SELECT 1", 0);
        b[4] = 100;
        assert!(decode(&b, true).is_err());
    }
}
