//! RPC requests (MS-TDS 2.2.6.6, packet type 3): how ODBC drivers run
//! parameterised and prepared statements. ALL_HEADERS, then one or more
//! calls separated by a batch flag byte: each names its procedure (by a
//! well-known ProcID behind 0xFFFF, or by name), has option flags, and a list
//! of parameters (name, status, TYPE_INFO, value).

use std::io;

use super::batch::{self, AllHeaders};
use super::types::{self, Value};
use super::{Cursor, invalid};

/// Well-known procedure ids (NameLenProcID after 0xFFFF).
pub const SP_EXECUTESQL: u16 = 10;
pub const SP_PREPARE: u16 = 11;
pub const SP_EXECUTE: u16 = 12;
pub const SP_PREPEXEC: u16 = 13;
pub const SP_UNPREPARE: u16 = 15;

/// The procedures this server runs, however the client named them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Proc {
    ExecuteSql,
    Prepare,
    Execute,
    PrepExec,
    Unprepare,
}

/// How a call named its procedure.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProcName {
    Id(u16),
    Name(String),
}

impl ProcName {
    /// The procedure, if it is one of the five; `sp_prepexec` by name, with
    /// or without `sys.`/`master..`, is the same as ProcID 13.
    pub fn known(&self) -> Option<Proc> {
        let id = match self {
            ProcName::Id(id) => *id,
            ProcName::Name(n) => {
                let n = n.to_ascii_lowercase();
                let bare = n.rsplit('.').next().unwrap_or(&n);
                match bare {
                    "sp_executesql" => SP_EXECUTESQL,
                    "sp_prepare" => SP_PREPARE,
                    "sp_execute" => SP_EXECUTE,
                    "sp_prepexec" => SP_PREPEXEC,
                    "sp_unprepare" => SP_UNPREPARE,
                    _ => return None,
                }
            }
        };
        Some(match id {
            SP_EXECUTESQL => Proc::ExecuteSql,
            SP_PREPARE => Proc::Prepare,
            SP_EXECUTE => Proc::Execute,
            SP_PREPEXEC => Proc::PrepExec,
            SP_UNPREPARE => Proc::Unprepare,
            _ => return None,
        })
    }

    pub fn display(&self) -> String {
        match self {
            ProcName::Id(id) => format!("ProcID {id}"),
            ProcName::Name(n) => n.clone(),
        }
    }
}

/// Parameter status flag: an OUTPUT parameter (passed by reference).
pub const BY_REF: u8 = 0x01;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Param {
    pub name: String,
    pub status: u8,
    pub value: Value,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Call {
    pub proc_name: ProcName,
    pub options: u16,
    pub params: Vec<Param>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Rpc {
    pub headers: AllHeaders,
    pub calls: Vec<Call>,
}

/// BatchFlag between calls: 0xFF in TDS 7.2+ (0x80 before), 0xFE NoExec.
fn is_batch_flag(b: u8) -> bool {
    matches!(b, 0xFF | 0xFE | 0x80)
}

/// Decodes a whole RPC request. A parameter of a type outside the subset is
/// an error of kind `Unsupported`; anything malformed, `InvalidData`.
pub fn decode(payload: &[u8]) -> io::Result<Rpc> {
    let mut c = Cursor::new(payload);
    let headers = batch::all_headers(&mut c)?;
    let mut calls = vec![decode_call(&mut c)?];
    while c.remaining() > 0 {
        // decode_call stops at a batch flag or the end.
        c.u8()?;
        calls.push(decode_call(&mut c)?);
    }
    Ok(Rpc { headers, calls })
}

fn decode_call(c: &mut Cursor) -> io::Result<Call> {
    let n = c.u16_le()?;
    let proc_name = if n == 0xFFFF {
        ProcName::Id(c.u16_le()?)
    } else {
        ProcName::Name(super::get_ucs2(c.bytes(n as usize * 2)?)?)
    };
    let options = c.u16_le()?;
    let mut params = Vec::new();
    while c.remaining() > 0 {
        if is_batch_flag(c.peek()?) {
            break;
        }
        let name = c.b_varchar()?;
        let status = c.u8()?;
        let info = types::read_type_info(c)?;
        let value = types::read_value(c, info)?;
        params.push(Param {
            name,
            status,
            value,
        });
    }
    Ok(Call {
        proc_name,
        options,
        params,
    })
}

impl Call {
    /// Parameter `i` as text (the statement or parameter definitions).
    pub fn text(&self, i: usize, what: &str) -> io::Result<String> {
        self.param(i, what)?
            .value
            .text()?
            .ok_or_else(|| invalid(format!("{what} is NULL")))
    }

    /// Parameter `i` as an integer (a prepared handle).
    pub fn int(&self, i: usize, what: &str) -> io::Result<i64> {
        self.param(i, what)?
            .value
            .int()?
            .ok_or_else(|| invalid(format!("{what} is NULL")))
    }

    pub fn param(&self, i: usize, what: &str) -> io::Result<&Param> {
        self.params.get(i).ok_or_else(|| {
            invalid(format!(
                "{} called without {what} (parameter {})",
                self.proc_name.display(),
                i + 1
            ))
        })
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::tds::put_ucs2;
    use crate::tds::types::{INTN, NVARCHAR};

    const COLLATION: [u8; 5] = [0x09, 0x04, 0xD0, 0x00, 0x34];

    /// An RPC as ODBC Driver 18 sends it: ALL_HEADERS, ProcID, parameters
    /// given as (name, status, TYPE_INFO + value bytes).
    pub(crate) fn encode(descriptor: u64, proc_id: u16, params: &[(&str, u8, Vec<u8>)]) -> Vec<u8> {
        let mut out = Vec::new();
        batch::put_all_headers(&mut out, descriptor);
        out.extend_from_slice(&0xFFFFu16.to_le_bytes());
        out.extend_from_slice(&proc_id.to_le_bytes());
        out.extend_from_slice(&0u16.to_le_bytes());
        for (name, status, bytes) in params {
            out.push(name.encode_utf16().count() as u8);
            put_ucs2(&mut out, name);
            out.push(*status);
            out.extend_from_slice(bytes);
        }
        out
    }

    /// NVARCHAR(4000) (or NVARCHAR(MAX) as PLP when `max`).
    pub(crate) fn nvarchar(s: &str, max: bool) -> Vec<u8> {
        let mut text = Vec::new();
        put_ucs2(&mut text, s);
        let mut b = vec![NVARCHAR];
        if max {
            b.extend_from_slice(&[0xFF, 0xFF]);
            b.extend_from_slice(&COLLATION);
            b.extend_from_slice(&(text.len() as u64).to_le_bytes());
            if !text.is_empty() {
                b.extend_from_slice(&(text.len() as u32).to_le_bytes());
                b.extend_from_slice(&text);
            }
            b.extend_from_slice(&0u32.to_le_bytes()); // PLP terminator
        } else {
            b.extend_from_slice(&8000u16.to_le_bytes());
            b.extend_from_slice(&COLLATION);
            b.extend_from_slice(&(text.len() as u16).to_le_bytes());
            b.extend_from_slice(&text);
        }
        b
    }

    pub(crate) fn int4(v: Option<i32>) -> Vec<u8> {
        match v {
            Some(v) => {
                let mut b = vec![INTN, 4, 4];
                b.extend_from_slice(&v.to_le_bytes());
                b
            }
            None => vec![INTN, 4, 0],
        }
    }

    #[test]
    fn sp_executesql_with_a_parameter() {
        let p = encode(
            5,
            SP_EXECUTESQL,
            &[
                (
                    "",
                    0,
                    nvarchar("UPDATE t SET v = v + 1 WHERE id = @P1", false),
                ),
                ("", 0, nvarchar("@P1 int", false)),
                ("@P1", 0, int4(Some(7))),
            ],
        );
        let r = decode(&p).unwrap();
        assert_eq!(r.headers.transaction_descriptor, 5);
        assert_eq!(r.calls.len(), 1);
        let call = &r.calls[0];
        assert_eq!(call.proc_name.known(), Some(Proc::ExecuteSql));
        assert_eq!(
            call.text(0, "@stmt").unwrap(),
            "UPDATE t SET v = v + 1 WHERE id = @P1"
        );
        assert_eq!(call.params[2].name, "@P1");
        assert_eq!(call.int(2, "@P1").unwrap(), 7);
        assert!(call.text(5, "@x").is_err());
    }

    #[test]
    fn sp_prepexec_by_name_and_two_calls_in_one_request() {
        let mut p = encode(
            0,
            SP_PREPEXEC,
            &[
                ("@handle", BY_REF, int4(None)),
                ("", 0, nvarchar("", true)),
                ("", 0, nvarchar("SELECT @@SPID", true)),
            ],
        );
        // A second call, by name, after a batch flag.
        p.push(0xFF);
        p.extend_from_slice(&16u16.to_le_bytes());
        put_ucs2(&mut p, "sys.sp_unprepare");
        p.extend_from_slice(&0u16.to_le_bytes());
        p.extend_from_slice(&[0, 0]);
        p.extend(int4(Some(1)));
        let r = decode(&p).unwrap();
        assert_eq!(r.calls.len(), 2);
        assert_eq!(r.calls[0].params[0].status, BY_REF);
        assert_eq!(r.calls[0].text(2, "@stmt").unwrap(), "SELECT @@SPID");
        assert_eq!(
            r.calls[1].proc_name,
            ProcName::Name("sys.sp_unprepare".into())
        );
        assert_eq!(r.calls[1].proc_name.known(), Some(Proc::Unprepare));
        assert_eq!(ProcName::Name("my_proc".into()).known(), None);
        assert_eq!(ProcName::Id(14).known(), None);
    }

    #[test]
    fn unsupported_type_is_reported_as_such() {
        let p = encode(0, SP_EXECUTESQL, &[("", 0, vec![0xF1, 0])]);
        assert_eq!(decode(&p).unwrap_err().kind(), io::ErrorKind::Unsupported);
        let mut p = encode(0, SP_EXECUTESQL, &[("", 0, nvarchar("x", false))]);
        p.truncate(p.len() - 1);
        assert_eq!(decode(&p).unwrap_err().kind(), io::ErrorKind::InvalidData);
    }
}
