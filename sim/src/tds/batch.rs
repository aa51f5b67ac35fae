//! SQL batch (MS-TDS 2.2.6.7): since TDS 7.2, ALL_HEADERS (here just the
//! transaction descriptor header) and then the SQL text in UCS-2.

use std::io;

use super::{Cursor, get_ucs2, invalid, put_ucs2};

/// ALL_HEADERS header type of the transaction descriptor.
const HEADER_TRANSACTION_DESCRIPTOR: u16 = 0x0002;

/// A batch in autocommit mode (transaction descriptor 0, one outstanding request).
pub fn encode(sql: &str) -> Vec<u8> {
    // TotalLength(4) + HeaderLength(4) + HeaderType(2) + descriptor(8) + count(4).
    const ALL_HEADERS_LEN: u32 = 4 + 4 + 2 + 8 + 4;
    let mut out = Vec::with_capacity(ALL_HEADERS_LEN as usize + sql.len() * 2);
    out.extend_from_slice(&ALL_HEADERS_LEN.to_le_bytes());
    out.extend_from_slice(&(ALL_HEADERS_LEN - 4).to_le_bytes());
    out.extend_from_slice(&HEADER_TRANSACTION_DESCRIPTOR.to_le_bytes());
    out.extend_from_slice(&0u64.to_le_bytes());
    out.extend_from_slice(&1u32.to_le_bytes());
    put_ucs2(&mut out, sql);
    out
}

/// The SQL text. `all_headers` is whether the login's TDS version is 7.2 or later.
pub fn decode(payload: &[u8], all_headers: bool) -> io::Result<String> {
    let mut c = Cursor::new(payload);
    if all_headers {
        let total = c.u32_le()? as usize;
        if total < 4 || total > payload.len() {
            return Err(invalid(format!(
                "ALL_HEADERS length {total} in a {}-byte batch",
                payload.len()
            )));
        }
        // Each header is length-prefixed; they must tile ALL_HEADERS exactly.
        while c.pos() < total {
            let len = c.u32_le()? as usize;
            if len < 6 || c.pos() - 4 + len > total {
                return Err(invalid(format!("bad ALL_HEADERS entry of {len} bytes")));
            }
            c.bytes(len - 4)?;
        }
    }
    get_ucs2(c.bytes(c.remaining())?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_and_round_trip() {
        let b = encode("SELECT 1");
        assert_eq!(&b[..4], &[22, 0, 0, 0]);
        assert_eq!(&b[4..10], &[18, 0, 0, 0, 2, 0]);
        assert_eq!(&b[22..24], &[b'S', 0]);
        assert_eq!(decode(&b, true).unwrap(), "SELECT 1");
    }

    #[test]
    fn pre_7_2_batches_have_no_headers() {
        let mut b = Vec::new();
        put_ucs2(&mut b, "SELECT 1");
        assert_eq!(decode(&b, false).unwrap(), "SELECT 1");
    }

    #[test]
    fn broken_headers_are_rejected() {
        let mut b = encode("SELECT 1");
        b[0] = 200;
        assert!(decode(&b, true).is_err());
        let mut b = encode("SELECT 1");
        b[4] = 100;
        assert!(decode(&b, true).is_err());
    }
}
