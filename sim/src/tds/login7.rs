//! LOGIN7 (MS-TDS 2.2.6.4): a 94-byte fixed part (little-endian), whose
//! (offset, length-in-characters) pairs point at UCS-2 strings after it.
//! Offsets are from the start of the LOGIN7 data (after the packet header).

use std::io;

use super::{Cursor, get_ucs2, invalid, put_ucs2};

/// Bytes before the variable part, for TDS 7.2 and later.
pub const FIXED_LEN: usize = 94;

/// OptionFlags1: USE_DB_ON | INIT_DB_FATAL | SET_LANG_ON, as ODBC drivers send.
pub const OPTION_FLAGS1_DEFAULT: u8 = 0xE0;
/// OptionFlags2: INIT_LANG_FATAL | ODBC_ON.
pub const OPTION_FLAGS2_DEFAULT: u8 = 0x03;

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Login7 {
    pub tds_version: u32,
    pub packet_size: u32,
    pub client_prog_ver: u32,
    pub client_pid: u32,
    pub connection_id: u32,
    pub option_flags1: u8,
    pub option_flags2: u8,
    pub type_flags: u8,
    pub option_flags3: u8,
    pub client_time_zone: i32,
    pub client_lcid: u32,
    pub hostname: String,
    pub username: String,
    /// In clear here; obfuscated on the wire.
    pub password: String,
    pub app_name: String,
    pub server_name: String,
    /// The client library (CltIntName), e.g. "ODBC".
    pub library_name: String,
    pub language: String,
    pub database: String,
    /// The client's MAC address, or anything.
    pub client_id: [u8; 6],
    /// FeatureExt entries (id, data) of a TDS 7.4 client (session recovery,
    /// UTF-8 support, ...). Read so that a login carrying them is understood;
    /// this server acknowledges none, which tells the client it supports
    /// none of them. Never encoded: the simulator's own client sends none.
    pub features: Vec<(u8, Vec<u8>)>,
}

/// OptionFlags3 bit: ibExtension points at the FeatureExt offset.
pub const F_EXTENSION: u8 = 0x10;
/// FeatureExt terminator.
const FEATURE_TERMINATOR: u8 = 0xFF;

/// The fixed part's string slots, in wire order (ibExtension sits between
/// ServerName and CltIntName and is always empty here).
const SLOTS: usize = 9;

impl Login7 {
    pub fn encode(&self) -> Vec<u8> {
        let strings: [(&str, bool); SLOTS] = [
            (&self.hostname, false),
            (&self.username, false),
            (&self.password, true),
            (&self.app_name, false),
            (&self.server_name, false),
            ("", false), // ibExtension / cbExtension: no feature extensions
            (&self.library_name, false),
            (&self.language, false),
            (&self.database, false),
        ];
        let mut data = Vec::new();
        let mut table = Vec::with_capacity(SLOTS * 4);
        for (s, secret) in strings {
            let start = data.len();
            put_ucs2(&mut data, s);
            if secret {
                data[start..].iter_mut().for_each(|b| *b = obfuscate(*b));
            }
            table.extend_from_slice(&((FIXED_LEN + start) as u16).to_le_bytes());
            table.extend_from_slice(&(((data.len() - start) / 2) as u16).to_le_bytes());
        }
        let end = (FIXED_LEN + data.len()) as u16;

        let mut out = Vec::with_capacity(FIXED_LEN + data.len());
        out.extend_from_slice(&((FIXED_LEN + data.len()) as u32).to_le_bytes());
        out.extend_from_slice(&self.tds_version.to_le_bytes());
        out.extend_from_slice(&self.packet_size.to_le_bytes());
        out.extend_from_slice(&self.client_prog_ver.to_le_bytes());
        out.extend_from_slice(&self.client_pid.to_le_bytes());
        out.extend_from_slice(&self.connection_id.to_le_bytes());
        out.extend_from_slice(&[
            self.option_flags1,
            self.option_flags2,
            self.type_flags,
            self.option_flags3,
        ]);
        out.extend_from_slice(&self.client_time_zone.to_le_bytes());
        out.extend_from_slice(&self.client_lcid.to_le_bytes());
        out.extend_from_slice(&table[..6 * 4]); // HostName .. Extension
        out.extend_from_slice(&table[6 * 4..]); // CltIntName, Language, Database
        out.extend_from_slice(&self.client_id);
        for _ in 0..3 {
            // SSPI, AtchDBFile, ChangePassword: empty, pointing at the end.
            out.extend_from_slice(&end.to_le_bytes());
            out.extend_from_slice(&0u16.to_le_bytes());
        }
        out.extend_from_slice(&0u32.to_le_bytes()); // cbSSPILong
        debug_assert_eq!(out.len(), FIXED_LEN);
        out.extend_from_slice(&data);
        out
    }

    pub fn decode(payload: &[u8]) -> io::Result<Login7> {
        let mut c = Cursor::new(payload);
        let length = c.u32_le()? as usize;
        if length > payload.len() || length < FIXED_LEN {
            return Err(invalid(format!(
                "LOGIN7 length {length} does not fit a {}-byte message",
                payload.len()
            )));
        }
        let body = &payload[..length];
        let mut l = Login7 {
            tds_version: c.u32_le()?,
            packet_size: c.u32_le()?,
            client_prog_ver: c.u32_le()?,
            client_pid: c.u32_le()?,
            connection_id: c.u32_le()?,
            option_flags1: c.u8()?,
            option_flags2: c.u8()?,
            type_flags: c.u8()?,
            option_flags3: c.u8()?,
            client_time_zone: c.u32_le()? as i32,
            client_lcid: c.u32_le()?,
            ..Login7::default()
        };
        let string = |c: &mut Cursor, secret: bool| -> io::Result<String> {
            let off = c.u16_le()? as usize;
            let chars = c.u16_le()? as usize;
            let raw = body.get(off..off + chars * 2).ok_or_else(|| {
                invalid(format!(
                    "LOGIN7 string at {off} ({chars} chars) is past the end"
                ))
            })?;
            if secret {
                let clear: Vec<u8> = raw.iter().map(|b| deobfuscate(*b)).collect();
                get_ucs2(&clear)
            } else {
                get_ucs2(raw)
            }
        };
        l.hostname = string(&mut c, false)?;
        l.username = string(&mut c, false)?;
        l.password = string(&mut c, true)?;
        l.app_name = string(&mut c, false)?;
        l.server_name = string(&mut c, false)?;
        let ib_extension = c.u16_le()? as usize;
        let cb_extension = c.u16_le()? as usize;
        if l.option_flags3 & F_EXTENSION != 0 && cb_extension >= 4 {
            l.features = features(body, ib_extension)?;
        }
        l.library_name = string(&mut c, false)?;
        l.language = string(&mut c, false)?;
        l.database = string(&mut c, false)?;
        l.client_id = c.bytes(6)?.try_into().expect("6 bytes");
        Ok(l)
    }
}

/// The FeatureExt block: ibExtension points at a DWORD offset (from the
/// start of LOGIN7) to a list of (FeatureId, DWORD length, data) ended by
/// 0xFF.
fn features(body: &[u8], ib_extension: usize) -> io::Result<Vec<(u8, Vec<u8>)>> {
    let at = body
        .get(ib_extension..ib_extension + 4)
        .ok_or_else(|| invalid("LOGIN7 ibExtension points past the end"))?;
    let offset = u32::from_le_bytes(at.try_into().expect("4 bytes")) as usize;
    let mut c =
        Cursor::new(body.get(offset..).ok_or_else(|| {
            invalid(format!("LOGIN7 FeatureExt offset {offset} is past the end"))
        })?);
    let mut out = Vec::new();
    loop {
        let id = c.u8()?;
        if id == FEATURE_TERMINATOR {
            return Ok(out);
        }
        let len = c.u32_le()? as usize;
        out.push((id, c.bytes(len)?.to_vec()));
    }
}

/// Password bytes on the wire: nibbles swapped, then XOR 0xA5 (MS-TDS 2.2.6.4).
pub fn obfuscate(b: u8) -> u8 {
    b.rotate_left(4) ^ 0xA5
}

pub fn deobfuscate(b: u8) -> u8 {
    (b ^ 0xA5).rotate_left(4)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tds::TDS_7_4;

    fn sample() -> Login7 {
        Login7 {
            tds_version: TDS_7_4,
            packet_size: 4096,
            client_prog_ver: 7,
            client_pid: 4242,
            option_flags1: OPTION_FLAGS1_DEFAULT,
            option_flags2: OPTION_FLAGS2_DEFAULT,
            client_lcid: 0x0409,
            hostname: "host1".into(),
            username: "stalltrace".into(),
            password: "P@ss".into(),
            app_name: "sqlclient".into(),
            server_name: "127.0.0.1".into(),
            library_name: "stalltrace-sim".into(),
            language: "".into(),
            database: "stalltrace".into(),
            client_id: [1, 2, 3, 4, 5, 6],
            ..Login7::default()
        }
    }

    #[test]
    fn fixed_part_offsets() {
        let b = sample().encode();
        assert_eq!(
            u32::from_le_bytes(b[0..4].try_into().unwrap()) as usize,
            b.len()
        );
        assert_eq!(
            &b[4..8],
            &[0x04, 0x00, 0x00, 0x74],
            "TDS 7.4, little-endian"
        );
        assert_eq!(&b[8..12], &4096u32.to_le_bytes());
        assert_eq!(b[24], OPTION_FLAGS1_DEFAULT);
        // ibHostName at 36 points just past the fixed part, 5 characters.
        assert_eq!(&b[36..40], &[94, 0, 5, 0]);
        // ibUserName follows the host name's 10 bytes.
        assert_eq!(&b[40..44], &[104, 0, 10, 0]);
        assert_eq!(&b[72..78], &[1, 2, 3, 4, 5, 6], "ClientID");
        assert_eq!(&b[94..96], &[b'h', 0]);
    }

    #[test]
    fn password_is_obfuscated_on_the_wire() {
        let b = sample().encode();
        let off = u16::from_le_bytes([b[44], b[45]]) as usize;
        // 'P' = 0x50: swap nibbles 0x05, XOR 0xA5 = 0xA0; the high byte 0 → 0xA5.
        assert_eq!(&b[off..off + 2], &[0xA0, 0xA5]);
        for x in 0..=255u8 {
            assert_eq!(deobfuscate(obfuscate(x)), x);
        }
    }

    #[test]
    fn round_trip() {
        let l = sample();
        assert_eq!(Login7::decode(&l.encode()).unwrap(), l);
    }

    #[test]
    fn feature_extensions_are_read() {
        // As ODBC Driver 18 lays it out: the DWORD offset in the ibExtension
        // slot, the FeatureExt block at the end.
        let mut l = sample();
        l.option_flags3 = F_EXTENSION;
        let mut b = l.encode();
        let slot = b.len();
        let feature_at = slot + 4;
        b.extend_from_slice(&(feature_at as u32).to_le_bytes());
        b.extend_from_slice(&[0x01, 0, 0, 0, 0]); // SESSIONRECOVERY, no data
        b.extend_from_slice(&[0x0A, 1, 0, 0, 0, 1]); // UTF8_SUPPORT, 1 byte
        b.push(FEATURE_TERMINATOR);
        b[56..58].copy_from_slice(&(slot as u16).to_le_bytes()); // ibExtension
        b[58..60].copy_from_slice(&4u16.to_le_bytes()); // cbExtension
        let len = b.len() as u32;
        b[..4].copy_from_slice(&len.to_le_bytes());
        let d = Login7::decode(&b).unwrap();
        assert_eq!(d.features, vec![(0x01, vec![]), (0x0A, vec![1])]);
        assert_eq!(d.username, "stalltrace");
        // A block without its terminator is an error, not a panic.
        let cut = &b[..b.len() - 1];
        let mut cut = cut.to_vec();
        let len = cut.len() as u32;
        cut[..4].copy_from_slice(&len.to_le_bytes());
        assert!(Login7::decode(&cut).is_err());
    }

    #[test]
    fn strings_past_the_end_are_rejected() {
        let mut b = sample().encode();
        b[38] = 200; // cchHostName
        assert!(Login7::decode(&b).is_err());
        let b = sample().encode();
        assert!(Login7::decode(&b[..60]).is_err());
    }
}
