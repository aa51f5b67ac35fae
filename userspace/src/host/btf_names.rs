//! Which struct members and enumerators the running kernel's BTF has, by name:
//! what `stalltrace check` reports about the time stamps the kernel keeps.
//!
//! Written here because the parsers at hand keep this private: aya-obj's
//! `Btf` exposes only type lookups by name (its member and string accessors are
//! crate-private), and btf-rs is LGPL. Only the layout needed to walk the type
//! section is read (uapi linux/btf.h); the programs' CO-RE relocations remain
//! the authority on what actually loads.

use std::collections::{BTreeMap, BTreeSet};

const BTF_MAGIC: u16 = 0xeb9f;

/// Kinds (linux/btf.h BTF_KIND_*) whose trailing data this reader must size or reads.
const KIND_INT: u32 = 1;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_ENUM64: u32 = 19;

/// The named structs' member names and every enumerator name of one BTF blob.
#[derive(Debug, Default)]
pub struct BtfNames {
    members: BTreeMap<String, BTreeSet<String>>,
    enumerators: BTreeSet<String>,
}

impl BtfNames {
    /// The running kernel's (`/sys/kernel/btf/vmlinux`).
    pub fn of_running_kernel() -> Result<Self, String> {
        let path = super::kernel::VMLINUX_BTF;
        let data = std::fs::read(path).map_err(|e| format!("{path}: {e}"))?;
        Self::parse(&data).map_err(|e| format!("{path}: {e}"))
    }

    pub fn parse(data: &[u8]) -> Result<Self, String> {
        let u16_at = |at: usize| {
            data.get(at..at + 2)
                .map(|b| u16::from_le_bytes([b[0], b[1]]))
        };
        let u32_at = |at: usize| {
            data.get(at..at + 4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        };
        if u16_at(0) != Some(BTF_MAGIC) {
            return Err("not little-endian BTF (bad magic)".into());
        }
        let field = |at: usize| u32_at(at).map(|v| v as usize).ok_or("truncated BTF header");
        let header_len = field(4)?;
        let (type_off, type_len) = (field(8)?, field(12)?);
        let (str_off, str_len) = (field(16)?, field(20)?);
        let types = header_len + type_off..header_len + type_off + type_len;
        let strings = data
            .get(header_len + str_off..header_len + str_off + str_len)
            .ok_or("string section out of bounds")?;
        let name = |offset: u32| -> String {
            let tail = strings.get(offset as usize..).unwrap_or_default();
            let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
            String::from_utf8_lossy(&tail[..end]).into_owned()
        };

        let mut names = BtfNames::default();
        let mut at = types.start;
        while at < types.end {
            let (name_off, info) = (
                u32_at(at).ok_or("truncated type")?,
                u32_at(at + 4).ok_or("truncated type")?,
            );
            let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
            at += 12;
            let (entry, entries) = match kind {
                KIND_INT | KIND_VAR | KIND_DECL_TAG => (4, 1),
                KIND_ARRAY => (12, 1),
                KIND_STRUCT | KIND_UNION | KIND_DATASEC | KIND_ENUM64 => (12, vlen),
                KIND_ENUM | KIND_FUNC_PROTO => (8, vlen),
                _ => (0, 0),
            };
            match kind {
                KIND_STRUCT if name_off != 0 => {
                    let members = names.members.entry(name(name_off)).or_default();
                    for i in 0..vlen {
                        members.insert(name(u32_at(at + i * entry).ok_or("truncated member")?));
                    }
                }
                KIND_ENUM | KIND_ENUM64 => {
                    for i in 0..vlen {
                        names
                            .enumerators
                            .insert(name(u32_at(at + i * entry).ok_or("truncated enumerator")?));
                    }
                }
                _ => {}
            }
            at += entry * entries;
        }
        Ok(names)
    }

    /// Whether `struct strukt` has a member `member` (in any struct of that name).
    pub fn has_member(&self, strukt: &str, member: &str) -> bool {
        self.members.get(strukt).is_some_and(|m| m.contains(member))
    }

    pub fn has_enumerator(&self, name: &str) -> bool {
        self.enumerators.contains(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A BTF blob with `struct request { u64 start_time_ns; }` and `enum { QUEUE_FLAG_STATS }`.
    fn blob() -> Vec<u8> {
        let strings = b"\0request\0start_time_ns\0QUEUE_FLAG_STATS\0u64\0";
        let mut types = Vec::new();
        let word = |v: &mut Vec<u8>, x: u32| v.extend_from_slice(&x.to_le_bytes());
        // [1] int u64
        word(&mut types, 40);
        word(&mut types, KIND_INT << 24);
        word(&mut types, 8);
        word(&mut types, 64);
        // [2] struct request, 1 member
        word(&mut types, 1);
        word(&mut types, (KIND_STRUCT << 24) | 1);
        word(&mut types, 8);
        word(&mut types, 9); // name
        word(&mut types, 1); // type
        word(&mut types, 0); // offset
        // [3] anonymous enum, 1 enumerator
        word(&mut types, 0);
        word(&mut types, (KIND_ENUM << 24) | 1);
        word(&mut types, 4);
        word(&mut types, 23);
        word(&mut types, 7);
        let mut data = Vec::new();
        data.extend_from_slice(&BTF_MAGIC.to_le_bytes());
        data.extend_from_slice(&[1, 0]); // version, flags
        for v in [
            24,
            0,
            types.len() as u32,
            types.len() as u32,
            strings.len() as u32,
        ] {
            word(&mut data, v);
        }
        data.extend_from_slice(&types);
        data.extend_from_slice(strings);
        data
    }

    #[test]
    fn members_and_enumerators_are_found_by_name() {
        let names = BtfNames::parse(&blob()).unwrap();
        assert!(names.has_member("request", "start_time_ns"));
        assert!(!names.has_member("request", "io_start_time_ns"));
        assert!(!names.has_member("bio", "start_time_ns"));
        assert!(names.has_enumerator("QUEUE_FLAG_STATS"));
        assert!(!names.has_enumerator("QUEUE_FLAG_BIO_ISSUE_TIME"));
    }

    #[test]
    fn a_blob_that_is_not_btf_is_refused() {
        assert!(BtfNames::parse(b"\x7fELF").is_err());
        let mut cut = blob();
        cut.truncate(30);
        assert!(BtfNames::parse(&cut).is_err());
    }

    #[test]
    fn the_running_kernel_keeps_the_request_stamp_the_block_family_reads() {
        let names = BtfNames::of_running_kernel().unwrap();
        assert!(names.has_member("request", "start_time_ns"));
        assert!(names.has_member("sk_buff", "len"));
    }
}
