//! Record output. `json` is the stream contract (schema v1, docs/schema.json).

mod json;
mod queue;
pub mod records;
#[cfg(test)]
mod schema_check;

#[cfg(test)]
pub(crate) use json::SharedBuffer;
pub use json::{JsonWriter, OUTPUT_LOST, SCHEMA_VERSION, Tapped};
pub use queue::{OutputQueue, Unwritten};
