//! Record output. `json` is the stream contract (schema v2, docs/schema.json).

pub mod file;
mod json;
mod queue;
mod split;

#[cfg(test)]
pub(crate) use json::SharedBuffer;
pub use json::{FileBudget, JsonWriter, RecordReader, Tapped};
pub use queue::{OutputQueue, Unwritten};
