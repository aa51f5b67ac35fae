//! `cargo xtask bench <suite>`: what stalltrace costs the host.

use anyhow::bail;

pub fn bench(suite: &str) -> anyhow::Result<()> {
    bail!("bench suite `{suite}` is not implemented yet")
}
