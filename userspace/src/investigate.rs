//! `stalltrace investigate`: record for a while with a progress line, then
//! print the report of what was recorded (or the records themselves).

use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cli::InvestigateArgs;
use crate::error::UserError;
use crate::report::{Report, render_html, render_text};
use crate::run::{Progress, run_into};

/// How long to record when --duration is not given.
const DEFAULT_DURATION: Duration = Duration::from_secs(30);

pub fn investigate(args: &InvestigateArgs) -> anyhow::Result<()> {
    let mut run = args.run.clone();
    let duration = *run.duration.get_or_insert(DEFAULT_DURATION);
    let records = SharedBuffer::default();
    let mut sink = Tee {
        memory: records.clone(),
        file: None,
    };
    if let Some(path) = &run.out {
        sink.file = Some(File::create(path).map_err(|e| {
            UserError::new(
                format!("cannot write {}: {e}", path.display()),
                "give --out a path in a directory that exists and that you can write to",
            )
        })?);
    }
    let tty = io::stderr().is_terminal();
    let mut last_line = Duration::ZERO;
    let mut progress = |p: &Progress| {
        let line = format!(
            "stalltrace: recording {:>4.0}/{} s: {} records, {} stall episode{}",
            p.elapsed.as_secs_f64().min(duration.as_secs_f64()),
            duration.as_secs(),
            p.records,
            p.stalls,
            if p.stalls == 1 { "" } else { "s" },
        );
        // A terminal gets one line rewritten in place; a log gets a line
        // every 10 s.
        if tty {
            eprint!("\r{line}\x1b[K");
        } else if p.elapsed >= last_line + Duration::from_secs(10) {
            eprintln!("{line}");
            last_line = p.elapsed;
        }
    };
    let result = run_into(&run, Box::new(sink), &mut progress);
    if tty {
        eprintln!();
    }
    result?;
    let text = records.text();
    let mut stdout = io::stdout().lock();
    let written = if args.json {
        stdout.write_all(text.as_bytes())
    } else {
        let report = Report::from_text(&text).map_err(|e| e.to_user_error("the recording"))?;
        if let Some(out) = &args.html {
            std::fs::write(out, render_html(&report)).map_err(|e| {
                UserError::new(
                    format!("cannot write {}: {e}", out.display()),
                    "give --html a path in a directory that exists and that you can write to",
                )
            })?;
        }
        let width = crate::report::terminal_width();
        stdout.write_all(render_text(&report, width).as_bytes())
    };
    match written.and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// The records in memory (bounded by the duration: about a kilobyte per
/// record, a few hundred records a second on a busy host) and, with --out,
/// in a file.
struct Tee {
    memory: SharedBuffer,
    file: Option<File>,
}

impl Write for Tee {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if let Some(f) = &mut self.file {
            f.write_all(b)?;
        }
        self.memory
            .0
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        match &mut self.file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}

#[derive(Clone, Default)]
struct SharedBuffer(Arc<Mutex<Vec<u8>>>);

impl SharedBuffer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap_or_else(|p| p.into_inner())).into_owned()
    }
}
