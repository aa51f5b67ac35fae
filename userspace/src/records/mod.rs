//! The stream's vocabulary: one type per record `stalltrace run` writes.
//!
//! The emitters build these, the stall detector and the report read them
//! back with the same types, and docs/schema.json is generated from them
//! (`schema.rs`): a field exists once, with its meaning in its doc comment.
//! Readers skip fields they do not know (a newer stream adds fields; a
//! removal or a change of meaning bumps [`SCHEMA_VERSION`]), while the
//! schema closes every object, so a field the code writes and the schema
//! lacks fails its test.
//!
//! This module is a leaf: it imports only `hist` (the histogram's wire form),
//! `abi` (the kernel events some records decode) and `host` (link health and
//! namespaces, which `host` reads and a record carries as they are).

pub mod run;
// Each family's record types (`records/NAME.rs`), declared in lib.rs with the
// family's registration.
pub use crate::family_records::*;
pub mod schema;
pub mod stall;

use schemars::JsonSchema;
use serde::Serialize;
use serde::de::DeserializeOwned;

pub use crate::hist::HistogramRecord;

/// Bumped when a field is removed or changes meaning or encoding; additions
/// keep it. 2: histograms by bucket index (hist/record.rs), `schema` and `run`
/// on every record. 3: every TCP record names its connection with the same
/// fields (`tcp::Connection`): `tcp_rtt`'s `peer`, `peer_port`, `local_port`
/// became `daddr`, `dport`, `sport`, and it gained `saddr`.
pub const SCHEMA_VERSION: u32 = 3;

/// The longest line written, newline included: 7.5 KiB leaves rsyslog room
/// for its header with a host name of up to 255 bytes. A longer record is
/// split into parts (output/split.rs).
pub const MAX_LINE_BYTES: usize = 7680;

/// The `lost` source of records the output queue had no room for.
pub const OUTPUT_LOST: &str = "output.queue_full";

/// A record type: its fields, and the `type` the envelope names it by.
pub trait Record: Serialize + DeserializeOwned + JsonSchema + Clone + Into<AnyRecord> {
    const TYPE: &'static str;
}

/// Realistic instances of a record type, its optional fields both present
/// and absent: what the schema's tests write and validate. Every type a
/// family writes has them (a family's own may live beside its type).
#[cfg(test)]
pub trait Examples: Sized {
    fn examples() -> Vec<Self>;
}

/// What takes a record as its own type ([`AnyRecord::visit`]).
#[cfg(test)]
pub trait Visit {
    fn record<R: Record>(&mut self, record: &R);
}

/// `Some(family)` for a record a probe family writes, `None` for the daemon's own.
macro_rules! writer {
    () => {
        None
    };
    ($family:ident) => {
        Some(stringify!($family))
    };
}

/// Declares which types are records, under which `type`, and which family
/// writes them (`by`; none: the daemon itself): the one list the schema,
/// the report, the readers of the daemon's own records and the tests iterate.
macro_rules! record_types {
    ($($variant:ident($ty:ty) => $name:literal $(by $family:ident)?,)*) => {
        $(impl Record for $ty { const TYPE: &'static str = $name; })*

        /// Any record, typed: what the writer hands the daemon's own readers
        /// (the stall detector, the metrics) as it emits a record, and what a
        /// line of the stream reads back into ([`AnyRecord::read`]).
        #[derive(Clone, Debug)]
        pub enum AnyRecord {
            $($variant($ty),)*
        }

        $(impl From<$ty> for AnyRecord {
            fn from(record: $ty) -> Self {
                Self::$variant(record)
            }
        })*

        impl AnyRecord {
            /// Hands the record, as its own type, to `visitor`.
            #[cfg(test)]
            pub fn visit(&self, visitor: &mut impl Visit) {
                match self {
                    $(Self::$variant(record) => visitor.record(record),)*
                }
            }

            /// Its `type`.
            pub fn kind(&self) -> &'static str {
                match self {
                    $(Self::$variant(_) => $name,)*
                }
            }

            /// The boundary from the stream: a record as a line carries it
            /// (JSON, the envelope's fields included, which the record types
            /// skip) read as the type `kind` names. None for a type this
            /// version does not know; an error for a record that does not
            /// have its type's shape.
            pub fn read(kind: &str, record: &serde_json::Value) -> Option<Result<Self, serde_json::Error>> {
                match kind {
                    $($name => Some(<$ty as serde::Deserialize>::deserialize(record).map(Self::$variant)),)*
                    _ => None,
                }
            }
        }

        /// Every record type, in the order docs/schema.json lists them.
        pub const RECORD_TYPES: &[&str] = &[$($name,)*];

        /// Each record type and the family that writes it.
        const WRITERS: &[(&str, Option<&str>)] = &[$(($name, writer!($($family)?)),)*];

        /// Calls `visit` with each record type's name and its schema.
        pub(crate) fn each_schema(generator: &mut schemars::SchemaGenerator, mut visit: impl FnMut(&'static str, schemars::Schema)) {
            $(visit($name, generator.subschema_for::<$ty>());)*
        }
    };
}

/// The record types: the daemon's own around each family's, as lib.rs's
/// `with_families!` registers them.
macro_rules! records_of_families {
    ($($family:ident {
        records: [$($variant:ident($ty:ty) => $name:literal),* $(,)?],
        $(attach: $attach:expr,)?
    })*) => {
        /// The probe families, in the order `start` lists them and the daemon
        /// reports them; each is an object `ebpf/NAME.bpf.c` (a test in
        /// `probes` holds the two lists together).
        pub const FAMILIES: &[&str] = &[$(stringify!($family),)*];

        record_types! {
            Start(run::StartRecord) => "start",
            $($($variant($ty) => $name by $family,)*)*
            Stall(stall::StallRecord) => "stall",
            Lost(run::LostRecord) => "lost",
            Heartbeat(run::HeartbeatRecord) => "heartbeat",
            Stop(run::StopRecord) => "stop",
        }

        /// Realistic instances of every record type a family writes, for
        /// the schema's tests (schema_check/).
        #[cfg(test)]
        pub fn family_examples() -> Vec<AnyRecord> {
            let mut all = Vec::new();
            $($(all.extend(<$ty as Examples>::examples().into_iter().map(AnyRecord::$variant));)*)*
            all
        }
    };
}

with_families!(records_of_families);

/// The probe family that writes records of type `kind`; None for the
/// daemon's own records and for a type this version does not know.
pub fn family_of(kind: &str) -> Option<&'static str> {
    WRITERS
        .iter()
        .find(|(name, _)| *name == kind)
        .and_then(|(_, family)| *family)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The boundary refuses what is not a record of the type: each type has
    /// fields a line must carry, and a type this version does not know is
    /// no record of it.
    #[test]
    fn a_line_reads_as_its_type_or_is_refused() {
        let envelope = serde_json::json!({"ts": "2026-12-02T10:00:00Z", "host": "db1",
            "schema": SCHEMA_VERSION, "run": "r1", "seqno": 7});
        for kind in RECORD_TYPES {
            let mut line = envelope.clone();
            line["type"] = (*kind).into();
            assert!(
                matches!(AnyRecord::read(kind, &line), Some(Err(_))),
                "{kind} read from its envelope alone"
            );
        }
        let block = serde_json::json!({"type": "block", "dev": "loop3"});
        assert!(matches!(AnyRecord::read("block", &block), Some(Err(_))));
        assert!(AnyRecord::read("fsync", &envelope).is_none());
    }
}
