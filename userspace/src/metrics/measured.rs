//! The records the metrics read, read once from the emitted line into their
//! types (records.rs then reads typed fields only).

use serde::Deserialize;
use serde_json::Value;

use crate::records::Record;
use crate::records::block::{BlockRecord, SlowIoRecord};
use crate::records::netdev::NetdevRecord;
use crate::records::run::{LostRecord, StartRecord};
use crate::records::sql_requests::SqlRequestsRecord;
use crate::records::stall::StallRecord;
use crate::records::tcp::{TcpRetransmitRecord, TcpRttRecord};

/// The record types that feed the metrics: those [`Measured::read`] reads.
pub fn wanted(kind: &str) -> bool {
    matches!(
        kind,
        StartRecord::TYPE
            | BlockRecord::TYPE
            | SlowIoRecord::TYPE
            | TcpRetransmitRecord::TYPE
            | TcpRttRecord::TYPE
            | NetdevRecord::TYPE
            | SqlRequestsRecord::TYPE
            | StallRecord::TYPE
            | LostRecord::TYPE
    )
}

/// The envelope's fields the metrics read (output/json.rs writes them on
/// every line, around the record's own).
#[derive(Debug, Deserialize)]
pub struct Envelope {
    pub ts: String,
    pub schema: u32,
}

/// An emitted record the metrics read, as its type.
#[derive(Debug)]
pub enum Measured {
    Start(Envelope, Box<StartRecord>),
    Block(Box<BlockRecord>),
    SlowIo(Box<SlowIoRecord>),
    TcpRetransmit(Box<TcpRetransmitRecord>),
    TcpRtt(Box<TcpRttRecord>),
    Netdev(Box<NetdevRecord>),
    SqlRequests(Box<SqlRequestsRecord>),
    Stall(Box<StallRecord>),
    Lost(LostRecord),
}

impl Measured {
    /// The one place the metrics read JSON: an emitted line read as the
    /// record type `kind` names (fields the type does not know, the
    /// envelope's among them, skipped). None for a type the metrics do not
    /// read, and for a record that does not read as its type.
    pub fn read(kind: &str, line: &Value) -> Option<Self> {
        fn read<'a, R: Deserialize<'a>>(line: &'a Value) -> Option<R> {
            R::deserialize(line).ok()
        }
        Some(match kind {
            StartRecord::TYPE => Self::Start(read(line)?, read(line)?),
            BlockRecord::TYPE => Self::Block(read(line)?),
            SlowIoRecord::TYPE => Self::SlowIo(read(line)?),
            TcpRetransmitRecord::TYPE => Self::TcpRetransmit(read(line)?),
            TcpRttRecord::TYPE => Self::TcpRtt(read(line)?),
            NetdevRecord::TYPE => Self::Netdev(read(line)?),
            SqlRequestsRecord::TYPE => Self::SqlRequests(read(line)?),
            StallRecord::TYPE => Self::Stall(read(line)?),
            LostRecord::TYPE => Self::Lost(read(line)?),
            _ => return None,
        })
    }
}
