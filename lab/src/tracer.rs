//! `stalltrace run` as a child process writing to its own file.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::util::unique;

/// A running `stalltrace run --out FILE`; killed (and its file removed) on drop.
pub struct Tracer {
    child: Option<Child>,
    out: PathBuf,
    stderr: PathBuf,
}

impl Tracer {
    /// Start `stalltrace run --out FILE <args>` and wait for its `start` record.
    pub fn start(bin: &Path, args: &[&str]) -> Self {
        Self::start_with_env(bin, args, &[])
    }

    pub fn start_with_env(bin: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let out = std::env::temp_dir().join(format!("{}.jsonl", unique("stalltrace-out")));
        let stderr = out.with_extension("stderr");
        let child = Command::new(bin)
            .arg("run")
            .arg("--out")
            .arg(&out)
            .args(args)
            .envs(env.iter().copied())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&stderr).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display()));
        let mut tracer = Self {
            child: Some(child),
            out,
            stderr,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let text = std::fs::read_to_string(&tracer.out).unwrap_or_default();
            if text
                .lines()
                .next()
                .is_some_and(|l| l.contains(r#""type":"start""#))
            {
                break;
            }
            if let Some(status) = tracer.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "stalltrace exited before its start record ({status}): {}",
                    tracer.stderr_text()
                );
            }
            assert!(
                Instant::now() < deadline,
                "no start record after 30 s: {}",
                tracer.stderr_text()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        tracer
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Wait until a record written so far satisfies `what`; return it.
    pub fn wait_for(&mut self, timeout: Duration, what: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let text = std::fs::read_to_string(&self.out).unwrap_or_default();
            // Only whole lines: the last one may be half written.
            let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
            if let Some(found) = whole
                .lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .find(|v| what(v))
            {
                return found;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("stalltrace exited ({status}): {}", self.stderr_text());
            }
            assert!(
                Instant::now() < deadline,
                "no such record within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Every whole record written so far.
    pub fn records_so_far(&self) -> Vec<Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        let whole = &text[..text.rfind('\n').map_or(0, |i| i + 1)];
        parse_lines(whole)
    }

    pub fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// Send `signal`, wait for exit (it must succeed), and return the stream
    /// it wrote, as text.
    pub fn stop_text_with(mut self, signal: i32) -> String {
        let mut child = self.child.take().unwrap();
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(child.id() as i32, signal) };
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                panic!("stalltrace did not stop within 30 s of signal {signal}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(
            status.success(),
            "stalltrace exited with {status}: {}",
            self.stderr_text()
        );
        std::fs::read_to_string(&self.out).unwrap()
    }

    /// SIGINT, then the stream as text.
    pub fn stop_text(self) -> String {
        self.stop_text_with(libc::SIGINT)
    }

    /// SIGINT, then every record (parsed, not checked against the schema).
    pub fn stop(self) -> Vec<Value> {
        parse_lines(&self.stop_text())
    }
}

impl Drop for Tracer {
    fn drop(&mut self) {
        crate::util::kill_and_remove(self.child.take(), &[&self.out, &self.stderr]);
    }
}

/// JSON lines as values; panics on a line that is not JSON.
pub fn parse_lines(text: &str) -> Vec<Value> {
    text.lines()
        .enumerate()
        .map(|(n, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("line {}: not JSON ({e}): {line}", n + 1))
        })
        .collect()
}
