//! What collection asks of enrichment (docs/ARCHITECTURE.md, "Data flow":
//! kernel → collect → enrich → emit).
//!
//! A family turns kernel events and maps into records, then asks the
//! [`Tagger`] in its `probes::Ctx` what the kernel maps do not hold: which SQL
//! Server session or instance a record belongs to, a disk's role, a slow I/O's
//! file. The SQL Server correlation (`sqlserver::live::SqlServer`) implements
//! it; the families and `probes` know only this trait, so neither imports
//! `sqlserver`.

use std::path::Path;

/// The `sql` object a record carries (the one place its path is named).
pub use crate::records::sql::SqlTag;
/// The connection a TCP record names, which a socket is looked up by.
pub use crate::records::tcp::Connection;

/// Whether a retransmission on a SQL Server session held up a response.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RetransmitVerdict {
    /// The segment was data of the response to the request then open.
    pub held_up_response: bool,
    /// How long that request had waited, since its arrival, when the segment went out.
    pub request_waited_ms: f64,
}

/// Tags for the records of the block, tcp and netdev families.
pub trait Tagger {
    /// The session of a socket, by inode (0: unknown); or by its
    /// connection: its namespace, local port and remote end, which tell a
    /// worker's sessions apart (the local address is not compared).
    fn tag_socket(&self, sock_ino: u64, connection: &Connection) -> Option<SqlTag>;

    /// The SQL Server side's verdict on a retransmission of the segment
    /// starting at `seq` on socket `sock_ino`, sent at `ts_ns` (monotonic):
    /// None where no request of that socket was being timed.
    fn retransmit_verdict(&self, sock_ino: u64, seq: u32, ts_ns: u64) -> Option<RetransmitVerdict>;

    /// Tag for something a process did (a slow I/O): the instance when it is a worker.
    fn tag_process(&self, pid: u32) -> Option<SqlTag>;

    /// A record of `pid` found no tag: it may belong to a session or an
    /// instance younger than the last discovery. Look again now (rate-limited)
    /// so the next lookup can tag it; what it finds is written by the run
    /// loop after the family's turn, never from inside it.
    fn missed(&mut self, pid: Option<u32>, ts: &str);

    /// `data`, `log`, `tempdb`, `backup` or `mixed`, for a disk (major, minor)
    /// holding SQL Server files.
    fn disk_role(&self, disk: (u32, u32)) -> Option<&'static str>;

    /// The database file holding `sector` of a disk (major, minor).
    fn file_at(&self, disk: (u32, u32), sector: u64) -> Option<&Path>;
}
