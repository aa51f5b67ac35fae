//! Response tokens (MS-TDS 2.2.7): encoders for what the simulated server sends,
//! and a decoder for the same subset (plus the other length-prefixed tokens,
//! which it skips) for the client. Everything inside tokens is little-endian,
//! except LOGINACK's TDS version, which is big-endian on the wire.

use std::io;

use super::{Cursor, invalid, put_ucs2};

pub const RETURNSTATUS: u8 = 0x79;
pub const COLMETADATA: u8 = 0x81;
pub const TABNAME: u8 = 0xA4;
pub const COLINFO: u8 = 0xA5;
pub const ORDER: u8 = 0xA9;
pub const ERROR: u8 = 0xAA;
pub const INFO: u8 = 0xAB;
pub const RETURNVALUE: u8 = 0xAC;
pub const LOGINACK: u8 = 0xAD;
pub const ROW: u8 = 0xD1;
pub const ENVCHANGE: u8 = 0xE3;
pub const SSPI: u8 = 0xED;
pub const DONE: u8 = 0xFD;
pub const DONEPROC: u8 = 0xFE;
pub const DONEINPROC: u8 = 0xFF;

/// DONE status bits.
pub const DONE_FINAL: u16 = 0x0000;
pub const DONE_MORE: u16 = 0x0001;
pub const DONE_ERROR: u16 = 0x0002;
pub const DONE_COUNT: u16 = 0x0010;
pub const DONE_ATTN: u16 = 0x0020;

/// DONEPROC CurCmd: the end of an RPC (as SQL Server sends it).
pub const CMD_EXECUTE: u16 = 0x00E0;

/// ENVCHANGE types used here.
pub const ENV_DATABASE: u8 = 1;
pub const ENV_LANGUAGE: u8 = 2;
pub const ENV_PACKET_SIZE: u8 = 4;
pub const ENV_SQL_COLLATION: u8 = 7;
pub const ENV_BEGIN_TRAN: u8 = 8;
pub const ENV_COMMIT_TRAN: u8 = 9;
pub const ENV_ROLLBACK_TRAN: u8 = 10;

/// ENVCHANGE types whose values are B_VARBYTE rather than B_VARCHAR:
/// collation, the transaction ones (begin, commit, rollback, enlist, defect,
/// manager address, ended) and reset-connection ack.
fn env_is_bytes(kind: u8) -> bool {
    matches!(kind, 7..=12 | 16..=18)
}

/// Column types the decoder understands (fixed-length integers and INTN/BITN).
pub use super::types::{
    BIT as TYPE_BIT, BITN as TYPE_BITN, INT1 as TYPE_INT1, INT2 as TYPE_INT2, INT4 as TYPE_INT4,
    INT8 as TYPE_INT8, INTN as TYPE_INTN,
};

/// The interface a LOGINACK announces: T-SQL.
const INTERFACE_TSQL: u8 = 1;

/// Appends a token of type `token` whose body `body` writes, prefixed by the
/// body's USHORT length (the layout of every variable-length token here).
fn with_len(buf: &mut Vec<u8>, token: u8, body: impl FnOnce(&mut Vec<u8>)) {
    buf.push(token);
    let at = buf.len();
    buf.extend_from_slice(&[0, 0]);
    body(buf);
    let len = (buf.len() - at - 2) as u16;
    buf[at..at + 2].copy_from_slice(&len.to_le_bytes());
}

fn put_b_varchar(buf: &mut Vec<u8>, s: &str) {
    buf.push(s.encode_utf16().count() as u8);
    put_ucs2(buf, s);
}

fn put_us_varchar(buf: &mut Vec<u8>, s: &str) {
    buf.extend_from_slice(&(s.encode_utf16().count() as u16).to_le_bytes());
    put_ucs2(buf, s);
}

/// LOGINACK: the login succeeded, with this TDS version and server program.
pub fn login_ack(buf: &mut Vec<u8>, tds_version: u32, prog_name: &str, prog_version: [u8; 4]) {
    with_len(buf, LOGINACK, |b| {
        b.push(INTERFACE_TSQL);
        b.extend_from_slice(&tds_version.to_be_bytes());
        put_b_varchar(b, prog_name);
        b.extend_from_slice(&prog_version);
    });
}

/// ENVCHANGE with B_VARCHAR values (database, language, packet size, ...).
pub fn env_change(buf: &mut Vec<u8>, kind: u8, new: &str, old: &str) {
    with_len(buf, ENVCHANGE, |b| {
        b.push(kind);
        put_b_varchar(b, new);
        put_b_varchar(b, old);
    });
}

/// ENVCHANGE with B_VARBYTE values: the collation (5 bytes), transaction
/// begin (new: the descriptor), commit and rollback (old: the descriptor).
pub fn env_change_bytes(buf: &mut Vec<u8>, kind: u8, new: &[u8], old: &[u8]) {
    with_len(buf, ENVCHANGE, |b| {
        b.push(kind);
        b.push(new.len() as u8);
        b.extend_from_slice(new);
        b.push(old.len() as u8);
        b.extend_from_slice(old);
    });
}

/// ENVCHANGE of the SQL collation.
pub fn env_change_collation(buf: &mut Vec<u8>, new: [u8; 5]) {
    env_change_bytes(buf, ENV_SQL_COLLATION, &new, &[]);
}

/// SQL_Latin1_General_CP1_CI_AS, the default collation of an English install.
pub const COLLATION_LATIN1_CI_AS: [u8; 5] = [0x09, 0x04, 0xD0, 0x00, 0x34];

/// A message for the client: INFO (class ≤ 10) or ERROR (class ≥ 11).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServerMessage {
    pub number: i32,
    pub state: u8,
    pub class: u8,
    pub text: String,
    pub server: String,
    pub procedure: String,
    pub line: i32,
}

pub fn message(buf: &mut Vec<u8>, m: &ServerMessage) {
    let token = if m.class > 10 { ERROR } else { INFO };
    with_len(buf, token, |b| {
        b.extend_from_slice(&m.number.to_le_bytes());
        b.push(m.state);
        b.push(m.class);
        put_us_varchar(b, &m.text);
        put_b_varchar(b, &m.server);
        put_b_varchar(b, &m.procedure);
        b.extend_from_slice(&m.line.to_le_bytes());
    });
}

/// DONE: the end of a statement (DONE_MORE) or of the whole response.
pub fn done(buf: &mut Vec<u8>, status: u16, cur_cmd: u16, row_count: u64) {
    done_token(buf, DONE, status, cur_cmd, row_count);
}

/// DONE, DONEINPROC (a statement inside an RPC) or DONEPROC (the RPC's end).
pub fn done_token(buf: &mut Vec<u8>, token: u8, status: u16, cur_cmd: u16, row_count: u64) {
    buf.push(token);
    buf.extend_from_slice(&status.to_le_bytes());
    buf.extend_from_slice(&cur_cmd.to_le_bytes());
    buf.extend_from_slice(&row_count.to_le_bytes());
}

/// Bytes of a fixed-length integer type (INT1, INT2, INT4, INT8).
fn int_size(type_id: u8) -> usize {
    match type_id {
        TYPE_INT1 => 1,
        TYPE_INT2 => 2,
        TYPE_INT8 => 8,
        _ => 4,
    }
}

/// COLMETADATA for NOT NULL fixed-length integer columns (name, type).
pub fn col_metadata_int(buf: &mut Vec<u8>, columns: &[(&str, u8)]) {
    buf.push(COLMETADATA);
    buf.extend_from_slice(&(columns.len() as u16).to_le_bytes());
    for (name, type_id) in columns {
        buf.extend_from_slice(&0u32.to_le_bytes()); // UserType
        buf.extend_from_slice(&0u16.to_le_bytes()); // Flags: not nullable, read-only
        buf.push(*type_id);
        put_b_varchar(buf, name);
    }
}

/// A ROW matching `col_metadata_int`: each value in its column's type.
pub fn row_int(buf: &mut Vec<u8>, values: &[(u8, i64)]) {
    buf.push(ROW);
    for (type_id, v) in values {
        buf.extend_from_slice(&v.to_le_bytes()[..int_size(*type_id)]);
    }
}

/// RETURNSTATUS: the RPC's return code.
pub fn return_status(buf: &mut Vec<u8>, status: i32) {
    buf.push(RETURNSTATUS);
    buf.extend_from_slice(&status.to_le_bytes());
}

/// RETURNVALUE of an INT OUTPUT parameter (a prepared statement's handle).
/// Unlike its neighbours this token has no length: the TYPE_INFO and value
/// say where it ends.
pub fn return_value_int(buf: &mut Vec<u8>, ordinal: u16, name: &str, value: i32) {
    buf.push(RETURNVALUE);
    buf.extend_from_slice(&ordinal.to_le_bytes());
    put_b_varchar(buf, name);
    buf.push(0x01); // Status: an output parameter
    buf.extend_from_slice(&0u32.to_le_bytes()); // UserType
    buf.extend_from_slice(&0x0001u16.to_le_bytes()); // Flags: nullable
    buf.extend_from_slice(&[TYPE_INTN, 4, 4]); // TYPE_INFO, then the value
    buf.extend_from_slice(&value.to_le_bytes());
}

/// A column as COLMETADATA described it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Column {
    pub type_id: u8,
    /// Value length for INTN/BITN (from TYPE_INFO); the fixed size otherwise.
    pub size: u8,
    pub name: String,
}

/// One decoded token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Token {
    LoginAck {
        interface: u8,
        tds_version: u32,
        prog_name: String,
        prog_version: [u8; 4],
    },
    EnvChange {
        kind: u8,
        new: Vec<u8>,
        old: Vec<u8>,
    },
    Info(ServerMessage),
    Error(ServerMessage),
    ColMetadata(Vec<Column>),
    ReturnStatus(i32),
    /// An OUTPUT parameter's value (integers only).
    ReturnValue {
        ordinal: u16,
        name: String,
        value: Option<i64>,
    },
    /// Integer values; `None` for NULL.
    Row(Vec<Option<i64>>),
    Done {
        token: u8,
        status: u16,
        cur_cmd: u16,
        row_count: u64,
    },
    /// A length-prefixed token this decoder skips (ORDER, COLINFO, ...).
    Skipped(u8),
}

impl Token {
    /// ENVCHANGE's new value as text (for the B_VARCHAR kinds).
    pub fn env_text(new: &[u8]) -> io::Result<String> {
        super::get_ucs2(new)
    }
}

/// Decodes a whole tabular-result message (TDS 7.2+ layouts).
pub fn decode(payload: &[u8]) -> io::Result<Vec<Token>> {
    let mut c = Cursor::new(payload);
    let mut out = Vec::new();
    let mut columns: Vec<Column> = Vec::new();
    while c.remaining() > 0 {
        let token = c.u8()?;
        let t = match token {
            DONE | DONEPROC | DONEINPROC => Token::Done {
                token,
                status: c.u16_le()?,
                cur_cmd: c.u16_le()?,
                row_count: c.u64_le()?,
            },
            COLMETADATA => {
                columns = decode_col_metadata(&mut c)?;
                Token::ColMetadata(columns.clone())
            }
            ROW => Token::Row(decode_row(&mut c, &columns)?),
            RETURNSTATUS => Token::ReturnStatus(c.u32_le()? as i32),
            RETURNVALUE => {
                let ordinal = c.u16_le()?;
                let name = c.b_varchar()?;
                c.bytes(1 + 4 + 2)?; // Status, UserType, Flags
                let info = super::types::read_type_info(&mut c)?;
                let value = super::types::read_value(&mut c, info)?.int()?;
                Token::ReturnValue {
                    ordinal,
                    name,
                    value,
                }
            }
            LOGINACK | ENVCHANGE | INFO | ERROR | ORDER | COLINFO | TABNAME | SSPI => {
                let len = c.u16_le()? as usize;
                let mut b = Cursor::new(c.bytes(len)?);
                let t = match token {
                    LOGINACK => Token::LoginAck {
                        interface: b.u8()?,
                        tds_version: b.u32_be()?,
                        prog_name: b.b_varchar()?,
                        prog_version: b.bytes(4)?.try_into().expect("4 bytes"),
                    },
                    ENVCHANGE => {
                        let kind = b.u8()?;
                        let unit = if env_is_bytes(kind) { 1 } else { 2 };
                        let n = b.u8()? as usize;
                        let new = b.bytes(n * unit)?.to_vec();
                        let n = b.u8()? as usize;
                        let old = b.bytes(n * unit)?.to_vec();
                        Token::EnvChange { kind, new, old }
                    }
                    INFO | ERROR => {
                        let m = ServerMessage {
                            number: b.u32_le()? as i32,
                            state: b.u8()?,
                            class: b.u8()?,
                            text: b.us_varchar()?,
                            server: b.b_varchar()?,
                            procedure: b.b_varchar()?,
                            line: b.u32_le()? as i32,
                        };
                        if token == INFO {
                            Token::Info(m)
                        } else {
                            Token::Error(m)
                        }
                    }
                    _ => Token::Skipped(token),
                };
                if !matches!(t, Token::Skipped(_)) && b.remaining() != 0 {
                    return Err(invalid(format!(
                        "{} bytes left over in token {token:#04x}",
                        b.remaining()
                    )));
                }
                t
            }
            _ => {
                return Err(invalid(format!(
                    "unsupported TDS token {token:#04x} at offset {}",
                    c.pos() - 1
                )));
            }
        };
        out.push(t);
    }
    Ok(out)
}

fn decode_col_metadata(c: &mut Cursor) -> io::Result<Vec<Column>> {
    let count = c.u16_le()?;
    if count == 0xFFFF {
        return Ok(Vec::new()); // "no metadata"
    }
    let mut cols = Vec::with_capacity(count as usize);
    for _ in 0..count {
        c.u32_le()?; // UserType
        c.u16_le()?; // Flags
        let type_id = c.u8()?;
        let size = match type_id {
            TYPE_INT1 | TYPE_BIT => 1,
            TYPE_INT2 => 2,
            TYPE_INT4 => 4,
            TYPE_INT8 => 8,
            TYPE_INTN | TYPE_BITN => c.u8()?,
            _ => return Err(invalid(format!("unsupported column type {type_id:#04x}"))),
        };
        cols.push(Column {
            type_id,
            size,
            name: c.b_varchar()?,
        });
    }
    Ok(cols)
}

fn decode_row(c: &mut Cursor, columns: &[Column]) -> io::Result<Vec<Option<i64>>> {
    if columns.is_empty() {
        return Err(invalid("ROW without COLMETADATA"));
    }
    columns
        .iter()
        .map(|col| {
            let len = match col.type_id {
                TYPE_INTN | TYPE_BITN => c.u8()? as usize,
                _ => col.size as usize,
            };
            let b = c.bytes(len)?;
            Ok(match len {
                0 => None,
                1 => Some(b[0] as i64),
                2 => Some(i16::from_le_bytes([b[0], b[1]]) as i64),
                4 => Some(i32::from_le_bytes(b.try_into().expect("4")) as i64),
                8 => Some(i64::from_le_bytes(b.try_into().expect("8"))),
                _ => return Err(invalid(format!("integer of {len} bytes"))),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tds::TDS_7_4;
    use crate::tds::sql::CMD_SELECT;

    #[test]
    fn done_layout() {
        let mut b = Vec::new();
        done(&mut b, DONE_COUNT, CMD_SELECT, 1);
        assert_eq!(b, [0xFD, 0x10, 0x00, 0xC1, 0x00, 1, 0, 0, 0, 0, 0, 0, 0]);
        let mut b = Vec::new();
        done_token(&mut b, DONEPROC, DONE_FINAL, CMD_EXECUTE, 0);
        assert_eq!(&b[..5], &[0xFE, 0, 0, 0xE0, 0]);
    }

    #[test]
    fn login_ack_layout() {
        let mut b = Vec::new();
        login_ack(&mut b, TDS_7_4, "SQL", [16, 0, 3, 0xE8]);
        // Length = interface 1 + version 4 + name 1+6 + prog version 4 = 16.
        assert_eq!(&b[..4], &[0xAD, 16, 0, 1]);
        assert_eq!(&b[4..8], &[0x74, 0, 0, 0x04], "TDS version big-endian");
        assert_eq!(b[8], 3);
        assert_eq!(b.len(), 3 + 16);
    }

    #[test]
    fn env_change_layout() {
        let mut b = Vec::new();
        env_change(&mut b, ENV_PACKET_SIZE, "4096", "512");
        assert_eq!(&b[..5], &[0xE3, 1 + 1 + 8 + 1 + 6, 0, ENV_PACKET_SIZE, 4]);
        assert_eq!(&b[5..7], &[b'4', 0]);
    }

    #[test]
    fn round_trip_of_everything_the_server_sends() {
        let msg = ServerMessage {
            number: 5701,
            state: 2,
            class: 0,
            text: "Changed database context to 'x'.".into(),
            server: "srv".into(),
            procedure: "".into(),
            line: 1,
        };
        let err = ServerMessage {
            number: 823,
            class: 16,
            ..msg.clone()
        };
        let mut b = Vec::new();
        env_change(&mut b, ENV_DATABASE, "x", "master");
        message(&mut b, &msg);
        env_change_collation(&mut b, COLLATION_LATIN1_CI_AS);
        login_ack(&mut b, TDS_7_4, "Microsoft SQL Server", [16, 0, 3, 0xE8]);
        col_metadata_int(&mut b, &[("", TYPE_INT4), ("b", TYPE_INT2)]);
        row_int(&mut b, &[(TYPE_INT4, 1), (TYPE_INT2, -7)]);
        message(&mut b, &err);
        done(&mut b, DONE_COUNT | DONE_ERROR, CMD_SELECT, 1);
        env_change_bytes(&mut b, ENV_BEGIN_TRAN, &[1, 2, 3, 4, 5, 6, 7, 8], &[]);
        return_status(&mut b, 0);
        return_value_int(&mut b, 0, "@handle", 3);
        let t = decode(&b).unwrap();
        assert_eq!(t.len(), 11);
        match &t[0] {
            Token::EnvChange { kind, new, .. } => {
                assert_eq!(*kind, ENV_DATABASE);
                assert_eq!(Token::env_text(new).unwrap(), "x");
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(t[1], Token::Info(msg));
        assert!(
            matches!(&t[2], Token::EnvChange { kind: ENV_SQL_COLLATION, new, .. } if new.len() == 5)
        );
        assert!(
            matches!(&t[3], Token::LoginAck { tds_version: TDS_7_4, prog_name, .. } if prog_name == "Microsoft SQL Server")
        );
        assert!(matches!(&t[4], Token::ColMetadata(c) if c.len() == 2 && c[1].name == "b"));
        assert_eq!(t[5], Token::Row(vec![Some(1), Some(-7)]));
        assert_eq!(t[6], Token::Error(err));
        assert_eq!(
            t[7],
            Token::Done {
                token: DONE,
                status: DONE_COUNT | DONE_ERROR,
                cur_cmd: CMD_SELECT,
                row_count: 1
            }
        );
        assert_eq!(
            t[8],
            Token::EnvChange {
                kind: ENV_BEGIN_TRAN,
                new: vec![1, 2, 3, 4, 5, 6, 7, 8],
                old: vec![]
            }
        );
        assert_eq!(t[9], Token::ReturnStatus(0));
        assert_eq!(
            t[10],
            Token::ReturnValue {
                ordinal: 0,
                name: "@handle".into(),
                value: Some(3)
            }
        );
    }

    #[test]
    fn intn_rows_and_nulls() {
        // COLMETADATA: one INTN(4) column named "n"; rows 5 and NULL.
        let b = [
            0x81, 1, 0, 0, 0, 0, 0, 1, 0, TYPE_INTN, 4, 1, b'n', 0, //
            0xD1, 4, 5, 0, 0, 0, //
            0xD1, 0,
        ];
        let t = decode(&b).unwrap();
        assert_eq!(t[1], Token::Row(vec![Some(5)]));
        assert_eq!(t[2], Token::Row(vec![None]));
    }

    #[test]
    fn unknown_or_truncated_tokens_are_errors() {
        assert!(decode(&[0x42]).is_err());
        assert!(decode(&[0xFD, 0, 0]).is_err());
        assert!(
            decode(&[0xD1, 1, 0, 0, 0]).is_err(),
            "ROW before COLMETADATA"
        );
        let mut b = Vec::new();
        env_change(&mut b, ENV_DATABASE, "x", "y");
        b.truncate(b.len() - 1);
        assert!(decode(&b).is_err());
    }
}
