//! A server inside a side of the pair that can be started again the same
//! way: on a host shared with other people's tests, their clean-up may kill
//! processes it does not know, and the bench must not lose its run to that.

use std::path::{Path, PathBuf};

use super::run::{Background, try_spawn_with, try_wait_listening_in};
use super::{NetPair, Side};

/// A server started with [`NetPair::try_server`]: killed on drop, and it
/// borrows the pair, so it cannot outlive the namespace it runs in.
pub struct Server<'a> {
    pair: &'a NetPair,
    side: Side,
    port: u16,
    args: Vec<String>,
    log_dir: PathBuf,
    process: Background<'a>,
}

impl NetPair {
    /// Start `args` inside `side`, its output in a file of `log_dir` (removed
    /// when it stops), returned once something listens on TCP `port` there;
    /// an error with its log if it exits or 10 s pass first. It dies with the
    /// thread that starts it (see [`NetPair::spawn`]).
    pub fn try_server(
        &self,
        side: Side,
        port: u16,
        args: &[&str],
        log_dir: &Path,
    ) -> anyhow::Result<Server<'_>> {
        Ok(Server {
            pair: self,
            side,
            port,
            args: args.iter().map(|a| a.to_string()).collect(),
            log_dir: log_dir.to_path_buf(),
            process: self.start_server(side, port, args, log_dir)?,
        })
    }

    fn start_server(
        &self,
        side: Side,
        port: u16,
        args: &[&str],
        log_dir: &Path,
    ) -> anyhow::Result<Background<'_>> {
        let mut process = try_spawn_with(self, self.netns(side), args, log_dir, |_| {})?;
        try_wait_listening_in(self.netns(side), port, &mut process)?;
        Ok(process)
    }
}

impl Server<'_> {
    /// Start it again, the same way, after it died (its log goes with it).
    pub fn restart(&mut self) -> anyhow::Result<()> {
        let args: Vec<&str> = self.args.iter().map(String::as_str).collect();
        self.process = self
            .pair
            .start_server(self.side, self.port, &args, &self.log_dir)?;
        Ok(())
    }

    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// What it is: `["iperf3", "-s", ...] in NS`.
    pub fn what(&self) -> &str {
        self.process.what()
    }

    /// The last lines of its log on one line, for an error message.
    pub fn log_tail(&self) -> String {
        self.process.log_tail()
    }
}
