//! Transaction manager requests (MS-TDS 2.2.6.9, packet type 0x0E): how ODBC
//! drivers begin, commit and roll back transactions when autocommit is off,
//! instead of sending BEGIN/COMMIT TRANSACTION as SQL. ALL_HEADERS, a USHORT
//! request type, then the request's own fields.

use std::io;

use super::batch::{self, AllHeaders};
use super::{Cursor, invalid};

pub const TM_GET_DTC_ADDRESS: u16 = 0;
pub const TM_PROPAGATE_XACT: u16 = 1;
pub const TM_BEGIN_XACT: u16 = 5;
pub const TM_PROMOTE_XACT: u16 = 6;
pub const TM_COMMIT_XACT: u16 = 7;
pub const TM_ROLLBACK_XACT: u16 = 8;
pub const TM_SAVE_XACT: u16 = 9;

/// fFlags of commit and rollback: start a new transaction right after.
const F_BEGIN_XACT: u8 = 0x01;

/// A new transaction's isolation level (0: unchanged) and name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BeginXact {
    pub isolation_level: u8,
    pub name: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TmRequest {
    Begin(BeginXact),
    /// Commit (or roll back) the transaction `name` (empty: the current
    /// one), and perhaps begin the next at once.
    Commit {
        name: String,
        then: Option<BeginXact>,
    },
    Rollback {
        name: String,
        then: Option<BeginXact>,
    },
    Save {
        name: String,
    },
    /// DTC requests (get address, propagate, promote), which this server
    /// does not take part in: kept by type for the error message.
    Distributed(u16),
}

/// A decoded request and the transaction it was sent in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tm {
    pub headers: AllHeaders,
    pub request: TmRequest,
}

pub fn decode(payload: &[u8]) -> io::Result<Tm> {
    let mut c = Cursor::new(payload);
    let headers = batch::all_headers(&mut c)?;
    let kind = c.u16_le()?;
    let begin = |c: &mut Cursor| -> io::Result<BeginXact> {
        Ok(BeginXact {
            isolation_level: c.u8()?,
            name: c.b_varchar()?,
        })
    };
    let end = |c: &mut Cursor| -> io::Result<(String, Option<BeginXact>)> {
        let name = c.b_varchar()?;
        let flags = c.u8()?;
        let then = if flags & F_BEGIN_XACT != 0 {
            Some(begin(c)?)
        } else {
            None
        };
        Ok((name, then))
    };
    let request = match kind {
        TM_BEGIN_XACT => TmRequest::Begin(begin(&mut c)?),
        TM_COMMIT_XACT => {
            let (name, then) = end(&mut c)?;
            TmRequest::Commit { name, then }
        }
        TM_ROLLBACK_XACT => {
            let (name, then) = end(&mut c)?;
            TmRequest::Rollback { name, then }
        }
        TM_SAVE_XACT => TmRequest::Save {
            name: c.b_varchar()?,
        },
        TM_GET_DTC_ADDRESS | TM_PROPAGATE_XACT | TM_PROMOTE_XACT => {
            // Their payloads (a DTC cookie) are of no use here.
            c.bytes(c.remaining())?;
            TmRequest::Distributed(kind)
        }
        other => {
            return Err(invalid(format!(
                "unknown transaction manager request type {other}"
            )));
        }
    };
    if c.remaining() != 0 {
        return Err(invalid(format!(
            "{} bytes left over in a transaction manager request of type {kind}",
            c.remaining()
        )));
    }
    Ok(Tm { headers, request })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tds::put_ucs2;

    /// A request as an ODBC driver sends it, for the tests here and in the server.
    pub(crate) fn encode(descriptor: u64, kind: u16, body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        batch::put_all_headers(&mut out, descriptor);
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(body);
        out
    }

    fn b_varchar(s: &str) -> Vec<u8> {
        let mut b = vec![s.len() as u8];
        put_ucs2(&mut b, s);
        b
    }

    #[test]
    fn begin_as_odbc_sends_it() {
        // Isolation 0 (unchanged), no name: 34 bytes on the wire with the header.
        let p = encode(0, TM_BEGIN_XACT, &[0, 0]);
        assert_eq!(p.len() + 8, 34);
        let tm = decode(&p).unwrap();
        assert_eq!(tm.headers.transaction_descriptor, 0);
        assert_eq!(
            tm.request,
            TmRequest::Begin(BeginXact {
                isolation_level: 0,
                name: String::new()
            })
        );
    }

    #[test]
    fn commit_and_rollback_with_and_without_a_new_transaction() {
        let tm = decode(&encode(7, TM_COMMIT_XACT, &[0, 0])).unwrap();
        assert_eq!(tm.headers.transaction_descriptor, 7);
        assert_eq!(
            tm.request,
            TmRequest::Commit {
                name: String::new(),
                then: None
            }
        );
        let mut body = b_varchar("t1");
        body.extend_from_slice(&[F_BEGIN_XACT, 2]);
        body.extend(b_varchar("t2"));
        let tm = decode(&encode(7, TM_ROLLBACK_XACT, &body)).unwrap();
        assert_eq!(
            tm.request,
            TmRequest::Rollback {
                name: "t1".into(),
                then: Some(BeginXact {
                    isolation_level: 2,
                    name: "t2".into()
                })
            }
        );
    }

    #[test]
    fn save_dtc_unknown_and_truncated() {
        let tm = decode(&encode(7, TM_SAVE_XACT, &b_varchar("sp"))).unwrap();
        assert_eq!(tm.request, TmRequest::Save { name: "sp".into() });
        let tm = decode(&encode(0, TM_GET_DTC_ADDRESS, &[0, 0])).unwrap();
        assert_eq!(tm.request, TmRequest::Distributed(TM_GET_DTC_ADDRESS));
        assert!(decode(&encode(0, 42, &[])).is_err());
        assert!(decode(&encode(0, TM_COMMIT_XACT, &[0])).is_err());
        assert!(decode(&encode(0, TM_BEGIN_XACT, &[0, 0, 9])).is_err());
    }
}
