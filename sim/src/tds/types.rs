//! TYPE_INFO and values of RPC parameters (MS-TDS 2.2.5.4–2.2.5.6): enough to
//! read every parameter an ODBC driver sends for the usual C types, and to
//! refuse the rest by name rather than misread them.

use std::io;

use super::{Cursor, get_ucs2, invalid};

pub const NULLTYPE: u8 = 0x1F;
pub const INT1: u8 = 0x30;
pub const BIT: u8 = 0x32;
pub const INT2: u8 = 0x34;
pub const INT4: u8 = 0x38;
pub const DATETIM4: u8 = 0x3A;
pub const FLT4: u8 = 0x3B;
pub const MONEY: u8 = 0x3C;
pub const DATETIME: u8 = 0x3D;
pub const FLT8: u8 = 0x3E;
pub const MONEY4: u8 = 0x7A;
pub const INT8: u8 = 0x7F;
pub const GUID: u8 = 0x24;
pub const INTN: u8 = 0x26;
pub const DATEN: u8 = 0x28;
pub const TIMEN: u8 = 0x29;
pub const DATETIME2N: u8 = 0x2A;
pub const DATETIMEOFFSETN: u8 = 0x2B;
pub const DECIMALN: u8 = 0x6A;
pub const NUMERICN: u8 = 0x6C;
pub const BITN: u8 = 0x68;
pub const FLTN: u8 = 0x6D;
pub const MONEYN: u8 = 0x6E;
pub const DATETIMN: u8 = 0x6F;
pub const BIGVARBINARY: u8 = 0xA5;
pub const BIGVARCHAR: u8 = 0xA7;
pub const BIGBINARY: u8 = 0xAD;
pub const BIGCHAR: u8 = 0xAF;
pub const NVARCHAR: u8 = 0xE7;
pub const NCHAR: u8 = 0xEF;

/// A USHORTLEN type's max length that means (MAX): the value is PLP.
const MAX_LEN: u16 = 0xFFFF;
/// PLP total length of a NULL value.
const PLP_NULL: u64 = u64::MAX;

/// A parameter's declared type.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TypeInfo {
    pub type_id: u8,
    /// Declared length for length-prefixed types; 0xFFFF for (MAX).
    pub max_len: u32,
    pub precision: u8,
    pub scale: u8,
    pub collation: Option<[u8; 5]>,
}

/// A value: its type and bytes as sent (None for NULL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Value {
    pub info: TypeInfo,
    pub data: Option<Vec<u8>>,
}

/// The reason a parameter could not be read: the type is outside this
/// server's subset. Anything else wrong is malformed data.
pub fn unsupported(type_id: u8) -> io::Error {
    io::Error::new(
        io::ErrorKind::Unsupported,
        format!("parameter data type {type_id:#04x} is not supported by this simulator"),
    )
}

fn fixed_len(type_id: u8) -> Option<usize> {
    Some(match type_id {
        NULLTYPE => 0,
        INT1 | BIT => 1,
        INT2 => 2,
        INT4 | DATETIM4 | FLT4 | MONEY4 => 4,
        MONEY | DATETIME | FLT8 | INT8 => 8,
        _ => return None,
    })
}

pub fn read_type_info(c: &mut Cursor) -> io::Result<TypeInfo> {
    let type_id = c.u8()?;
    let mut t = TypeInfo {
        type_id,
        max_len: 0,
        precision: 0,
        scale: 0,
        collation: None,
    };
    match type_id {
        _ if fixed_len(type_id).is_some() => t.max_len = fixed_len(type_id).unwrap_or(0) as u32,
        GUID | INTN | BITN | FLTN | MONEYN | DATETIMN => t.max_len = c.u8()? as u32,
        DECIMALN | NUMERICN => {
            t.max_len = c.u8()? as u32;
            t.precision = c.u8()?;
            t.scale = c.u8()?;
        }
        DATEN => t.max_len = 3,
        TIMEN | DATETIME2N | DATETIMEOFFSETN => t.scale = c.u8()?,
        BIGVARBINARY | BIGBINARY => t.max_len = c.u16_le()? as u32,
        BIGVARCHAR | BIGCHAR | NVARCHAR | NCHAR => {
            t.max_len = c.u16_le()? as u32;
            t.collation = Some(c.bytes(5)?.try_into().expect("5 bytes"));
        }
        other => return Err(unsupported(other)),
    }
    Ok(t)
}

/// Reads the value that follows a TYPE_INFO.
pub fn read_value(c: &mut Cursor, info: TypeInfo) -> io::Result<Value> {
    let data = match info.type_id {
        t if fixed_len(t).is_some() => match fixed_len(t).unwrap_or(0) {
            0 => None,
            n => Some(c.bytes(n)?.to_vec()),
        },
        BIGVARBINARY | BIGVARCHAR | NVARCHAR if info.max_len == MAX_LEN as u32 => read_plp(c)?,
        BIGVARBINARY | BIGBINARY | BIGVARCHAR | BIGCHAR | NVARCHAR | NCHAR => match c.u16_le()? {
            MAX_LEN => None,
            n => Some(c.bytes(n as usize)?.to_vec()),
        },
        // The BYTELEN types: a one-byte length, 0 for NULL.
        _ => match c.u8()? {
            0 => None,
            n => Some(c.bytes(n as usize)?.to_vec()),
        },
    };
    Ok(Value { info, data })
}

/// A PLP value (MS-TDS 2.2.5.2.3): a ULONGLONG total length (or NULL or
/// "unknown"), then chunks each with a ULONG length, ended by a 0 chunk.
fn read_plp(c: &mut Cursor) -> io::Result<Option<Vec<u8>>> {
    let total = c.u64_le()?;
    if total == PLP_NULL {
        return Ok(None);
    }
    let mut out = Vec::new();
    loop {
        let n = c.u32_le()? as usize;
        if n == 0 {
            break;
        }
        out.extend_from_slice(c.bytes(n)?);
    }
    // u64::MAX - 1 is "length unknown"; any other total must match.
    if total != PLP_NULL - 1 && total != out.len() as u64 {
        return Err(invalid(format!(
            "PLP value of {} bytes announced as {total}",
            out.len()
        )));
    }
    Ok(Some(out))
}

impl Value {
    /// The text of a character value (UCS-2 for N types, 8-bit otherwise).
    pub fn text(&self) -> io::Result<Option<String>> {
        let Some(d) = &self.data else {
            return Ok(None);
        };
        match self.info.type_id {
            NVARCHAR | NCHAR => get_ucs2(d).map(Some),
            BIGVARCHAR | BIGCHAR => Ok(Some(d.iter().map(|&b| b as char).collect())),
            t => Err(invalid(format!("parameter of type {t:#04x} is not text"))),
        }
    }

    /// An integer value (INT1/2/4/8, INTN, BIT).
    pub fn int(&self) -> io::Result<Option<i64>> {
        let Some(d) = &self.data else {
            return Ok(None);
        };
        match (self.info.type_id, d.len()) {
            (INT1 | BIT | BITN | INTN, 1) => Ok(Some(d[0] as i64)),
            (INT2 | INTN, 2) => Ok(Some(i16::from_le_bytes([d[0], d[1]]) as i64)),
            (INT4 | INTN, 4) => Ok(Some(
                i32::from_le_bytes(d[..4].try_into().expect("4")) as i64
            )),
            (INT8 | INTN, 8) => Ok(Some(i64::from_le_bytes(d[..8].try_into().expect("8")))),
            (t, n) => Err(invalid(format!(
                "parameter of type {t:#04x} ({n} bytes) is not an integer"
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tds::put_ucs2;

    fn read(b: &[u8]) -> io::Result<Value> {
        let mut c = Cursor::new(b);
        let info = read_type_info(&mut c)?;
        let v = read_value(&mut c, info)?;
        assert_eq!(c.remaining(), 0, "{b:02x?}");
        Ok(v)
    }

    #[test]
    fn integers_fixed_and_nullable() {
        assert_eq!(read(&[INT4, 5, 0, 0, 0]).unwrap().int().unwrap(), Some(5));
        assert_eq!(
            read(&[INTN, 4, 4, 0xFF, 0xFF, 0xFF, 0xFF])
                .unwrap()
                .int()
                .unwrap(),
            Some(-1)
        );
        assert_eq!(read(&[INTN, 8, 0]).unwrap().int().unwrap(), None);
        let mut b = vec![INTN, 8, 8];
        b.extend_from_slice(&(1i64 << 40).to_le_bytes());
        assert_eq!(read(&b).unwrap().int().unwrap(), Some(1 << 40));
        assert_eq!(read(&[BITN, 1, 1, 1]).unwrap().int().unwrap(), Some(1));
        assert_eq!(read(&[NULLTYPE]).unwrap().data, None);
    }

    #[test]
    fn nvarchar_with_collation_and_as_plp() {
        let mut b = vec![NVARCHAR, 0x40, 0x1F, 0x09, 0x04, 0xD0, 0x00, 0x34, 4, 0];
        put_ucs2(&mut b, "hi");
        let v = read(&b).unwrap();
        assert_eq!(v.text().unwrap().as_deref(), Some("hi"));
        assert_eq!(v.info.collation, Some([0x09, 0x04, 0xD0, 0x00, 0x34]));
        // NVARCHAR(MAX): PLP in two chunks, then the terminator.
        let mut b = vec![NVARCHAR, 0xFF, 0xFF, 0x09, 0x04, 0xD0, 0x00, 0x34];
        b.extend_from_slice(&6u64.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        put_ucs2(&mut b, "a");
        b.extend_from_slice(&4u32.to_le_bytes());
        put_ucs2(&mut b, "bc");
        b.extend_from_slice(&0u32.to_le_bytes());
        assert_eq!(read(&b).unwrap().text().unwrap().as_deref(), Some("abc"));
        // NULL of both forms.
        let b = [NCHAR, 2, 0, 0x09, 0x04, 0xD0, 0x00, 0x34, 0xFF, 0xFF];
        assert_eq!(read(&b).unwrap().data, None);
        let mut b = vec![NVARCHAR, 0xFF, 0xFF, 0x09, 0x04, 0xD0, 0x00, 0x34];
        b.extend_from_slice(&u64::MAX.to_le_bytes());
        assert_eq!(read(&b).unwrap().data, None);
    }

    #[test]
    fn float_decimal_and_dates() {
        let mut b = vec![FLTN, 8, 8];
        b.extend_from_slice(&1.5f64.to_le_bytes());
        assert_eq!(read(&b).unwrap().data.unwrap().len(), 8);
        let v = read(&[DECIMALN, 17, 18, 2, 5, 1, 0x39, 0x30, 0, 0]).unwrap();
        assert_eq!((v.info.precision, v.info.scale), (18, 2));
        assert_eq!(read(&[DATEN, 3, 1, 2, 3]).unwrap().data.unwrap(), [1, 2, 3]);
        let v = read(&[DATETIME2N, 7, 8, 0, 0, 0, 0, 0, 1, 2, 3]).unwrap();
        assert_eq!(v.info.scale, 7);
        assert_eq!(
            read(&[BIGVARBINARY, 8, 0, 2, 0, 0xAB, 0xCD])
                .unwrap()
                .data
                .unwrap(),
            [0xAB, 0xCD]
        );
    }

    #[test]
    fn unknown_types_and_bad_data_are_errors_not_panics() {
        let e = read(&[0xF1, 0]).unwrap_err(); // XML
        assert_eq!(e.kind(), io::ErrorKind::Unsupported);
        assert!(read(&[INTN, 4, 4, 1]).is_err(), "truncated");
        let mut b = vec![NVARCHAR, 0xFF, 0xFF, 0, 0, 0, 0, 0];
        b.extend_from_slice(&10u64.to_le_bytes());
        b.extend_from_slice(&2u32.to_le_bytes());
        b.extend_from_slice(&[1, 0, 0, 0, 0, 0]);
        assert!(read(&b).is_err(), "PLP length mismatch");
        assert!(read(&[INT4, 1, 0, 0, 0]).unwrap().text().is_err());
    }
}
