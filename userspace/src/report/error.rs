//! Why a stream cannot be reported, and the one line `stalltrace report`
//! says of it.

use std::fmt;

use super::field::readable_schemas;
use crate::error::UserError;

/// Why a stream cannot be reported.
#[derive(Debug)]
pub enum ReportError {
    Empty,
    /// No line is a JSON object; `line` is the first that is not.
    NotJsonLines {
        line: usize,
    },
    /// JSON records, but no `start`, and none that says its run (schema 1
    /// records do not): not a stalltrace stream, or its head is cut off.
    NoStart {
        records: usize,
    },
    /// `start.schema` is not one this version reads.
    Schema {
        found: String,
        writer: Option<String>,
    },
    Read(std::io::Error),
}

impl fmt::Display for ReportError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.to_user_error("the stream"))
    }
}

impl std::error::Error for ReportError {}

impl ReportError {
    /// The one-line error `stalltrace report` prints for `source` (a path, or `stdin`).
    pub fn to_user_error(&self, source: &str) -> UserError {
        const RECORD_IT: &str =
            "give a file written by `stalltrace run --out FILE` (or its stdout saved to a file)";
        match self {
            ReportError::Empty => UserError::new(format!("{source} is empty"), RECORD_IT),
            ReportError::NotJsonLines { line } => UserError::new(
                format!("{source} is not JSON lines (line {line} is not a JSON object)"),
                RECORD_IT,
            ),
            ReportError::NoStart { records } => UserError::new(
                format!(
                    "{source} has no `start` record ({records} JSON records, none of type start): it is not a stalltrace stream, or its beginning was cut off"
                ),
                "give the whole file `stalltrace run` wrote, from its first line",
            ),
            ReportError::Schema { found, writer } => UserError::new(
                format!(
                    "{source} was written with record schema {found}{}; this stalltrace ({}) reads {}",
                    writer
                        .as_ref()
                        .map(|w| format!(" (by stalltrace {w})"))
                        .unwrap_or_default(),
                    env!("CARGO_PKG_VERSION"),
                    readable_schemas(),
                ),
                match writer {
                    Some(w) => format!(
                        "report it with stalltrace {w} or a later version that reads schema {found}"
                    ),
                    None => {
                        format!("report it with a stalltrace version that reads schema {found}")
                    }
                },
            ),
            ReportError::Read(e) => UserError::new(
                format!("cannot read {source}: {e}"),
                "check the path and its permissions (`-` reads stdin)",
            ),
        }
    }
}
