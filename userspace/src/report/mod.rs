//! Reports from a record stream: `stalltrace report FILE.jsonl [--html OUT]`,
//! and the renderers `stalltrace investigate` prints with.
//!
//! Its files are layers, each importing only those below it
//! (tests/architecture.rs checks there is no cycle):
//! - the stream as lines: `lines` (the cap on a line, where a line is),
//!   `field` (a record's envelope), `error` (why a stream cannot be reported);
//! - what the run was and whether the stream is whole: `run`, `sequence`,
//!   `split`, `health`;
//! - `model` turns records into a [`Report`] (whole-run histograms merged
//!   from the intervals, episodes paired and ranked, sessions and what they
//!   lost), with `episodes`, `network`, `storage`, `sessions`, `requests`;
//! - `view` words each fact of one once; `text` and `html` lay that view out;
//! - `input` reads files into a report; `command` reads, then renders.
//!
//! Nothing here needs the kernel: a report is a pure function of the stream.

mod bars;
mod command;
mod episodes;
mod error;
mod field;
mod health;
pub mod html;
mod input;
mod lines;
mod merge;
pub mod model;
mod network;
mod requests;
mod run;
mod sequence;
mod series;
mod sessions;
mod split;
mod storage;
pub mod text;
mod time;
mod typed;
mod view;
mod window;

pub use command::{ReportArgs, command, terminal_width, write_html};
pub use episodes::{Episode, EpisodeState, Evidence};
pub use error::ReportError;
pub use health::{FileRead, StreamFile, StreamHealth};
pub use html::render_html;
pub use input::{read_report, read_reports_within};
pub use lines::LineRef;
pub use merge::{MergedHist, Unit};
pub use model::{Losses, Report, ReportBuilder};
pub use network::{BulkFlow, Interface, LinkOverRun, Retransmits, TcpPeer};
pub use run::{FamilyStatus, RunInfo};
pub use sequence::{SeqRange, SeqRanges, Sequence};
pub use sessions::{Instance, SessionImpact, SessionTag};
pub use split::SplitHealth;
pub use storage::{Disk, DiskOp, SlowIo};
pub use text::render_text;
pub use window::{Window, parse as parse_time};

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod model_tests;
#[cfg(test)]
mod stream_tests;
