//! SQL Server correlation (docs/ARCHITECTURE.md, "SQL Server correlation"): what stalltrace learns
//! about SQL Server from outside the process. `tds` reads the headers of its wire
//! protocol, the Tabular Data Stream, to tell requests from responses and to recover
//! the SPID of a session when the traffic is not encrypted; `tls` attaches the uprobes that
//! read the same headers in the TLS plaintext of encrypted sessions. Neither keeps SQL text
//! or any other payload.

pub mod dmv;
pub mod files;
pub mod inventory;
pub mod live;
pub mod tds;
pub mod tls;
