//! Reports from a record stream: `stalltrace report FILE.jsonl [--html OUT]`,
//! and the renderers `stalltrace investigate` prints with.
//!
//! `model` turns records into a [`Report`] (whole-run histograms merged from
//! the intervals, episodes paired and ranked, sessions and what they lost);
//! `view` words each fact of one once; `text` and `html` lay that view out.
//! Nothing here needs the kernel: a report is a pure function of the stream.

mod bars;
mod episodes;
mod health;
pub mod html;
mod input;
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

pub use episodes::{Episode, EpisodeState, Evidence};
pub use health::{FileRead, LineRef, StreamFile, StreamHealth};
pub use html::render_html;
pub use input::{
    ReportArgs, command, read_report, read_reports_within, terminal_width, write_html,
};
pub use merge::{MergedHist, Unit};
pub use model::{FamilyStatus, Losses, Report, ReportBuilder, ReportError, RunInfo};
pub use network::{BulkFlow, Interface, LinkHealth, Retransmits, TcpPeer};
pub use sequence::{SeqRange, SeqRanges, Sequence};
pub use sessions::{Instance, SessionImpact, SessionTag};
pub use split::SplitHealth;
pub use storage::{Disk, DiskOp, QueueLimit, SlowIo};
pub use text::render_text;
pub use window::{Window, parse as parse_time};

#[cfg(test)]
mod fixtures;
#[cfg(test)]
mod model_tests;
