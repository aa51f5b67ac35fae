//! `stalltrace investigate`: record for a while with a progress line, then
//! print the report of what was recorded (or the records themselves); or,
//! with --last/--at, the report of what the service already recorded then.

use std::fs::File;
use std::io::{self, IsTerminal, Write};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::cli::InvestigateArgs;
use crate::error::UserError;
use crate::report::{
    Report, ReportBuilder, ReportError, Window, parse_time, read_reports_within, render_text,
    write_html,
};
use crate::run::{Progress, run_into};

mod recording;

/// How long to record when --duration is not given.
const DEFAULT_DURATION: Duration = Duration::from_secs(30);
/// How far either side of --at to look when --around is not given.
const DEFAULT_AROUND: Duration = Duration::from_secs(300);

pub fn investigate(args: &InvestigateArgs) -> anyhow::Result<()> {
    let Some(window) = looking_back(args)? else {
        return record_forward(args);
    };
    match recording::find(args.from.as_deref()) {
        Ok(recording) => look_back(args, &recording, window),
        Err(looked) if args.from.is_some() => Err(UserError::new(
            format!("--from: no recording at {looked}"),
            "give the file `stalltrace run --out` writes (the files rotated from it are read too)",
        )
        .into()),
        Err(looked) => {
            let secs = args.run.duration.unwrap_or(DEFAULT_DURATION).as_secs();
            eprintln!(
                "stalltrace: no recording to look back at ({looked}): recording forward for {secs} s instead"
            );
            record_forward(args)
        }
    }
}

/// The window --last or --at asks for, if either does.
fn looking_back(args: &InvestigateArgs) -> Result<Option<Window>, UserError> {
    let now_us = chrono::Utc::now().timestamp_micros();
    let us = |d: Duration| i64::try_from(d.as_micros()).unwrap_or(i64::MAX);
    if let Some(last) = args.last {
        return Ok(Some(Window {
            since_us: now_us.saturating_sub(us(last)),
            until_us: now_us,
        }));
    }
    if let Some(at) = &args.at {
        let at_us = parse_time(at, now_us).map_err(|e| {
            UserError::new(
                format!("--at {e}"),
                "see `stalltrace investigate --help` for the forms a time takes",
            )
        })?;
        let around = us(args.around.unwrap_or(DEFAULT_AROUND));
        return Ok(Some(Window {
            since_us: at_us.saturating_sub(around),
            until_us: at_us.saturating_add(around),
        }));
    }
    if args.from.is_some() {
        return Err(UserError::new(
            "--from names the recording --last or --at looks back at, and neither is given",
            "add --last SPAN (e.g. --last 10m) or --at TIME",
        ));
    }
    Ok(None)
}

/// The report of `window` in `recording`: nothing is attached or recorded.
fn look_back(
    args: &InvestigateArgs,
    recording: &recording::Recording,
    window: Window,
) -> anyhow::Result<()> {
    let clock = |us: i64| {
        chrono::DateTime::<chrono::Utc>::from_timestamp_micros(us)
            .map(|t| t.format("%Y-%m-%d %H:%M:%S").to_string())
            .unwrap_or_default()
    };
    eprintln!(
        "stalltrace: looking back at {} ({}; {} file{}) from {} to {} UTC; nothing new is recorded",
        recording.out.display(),
        recording.found_by,
        recording.files.len(),
        if recording.files.len() == 1 { "" } else { "s" },
        clock(window.since_us),
        clock(window.until_us),
    );
    let report = read_reports_within(&recording.files, Some(window))?;
    print(&report, args)
}

/// The text report on stdout, and the page with --html.
fn print(report: &Report, args: &InvestigateArgs) -> anyhow::Result<()> {
    if let Some(out) = &args.html {
        write_html(report, out)?;
    }
    let width = crate::report::terminal_width();
    let mut stdout = io::stdout().lock();
    let written = stdout.write_all(render_text(report, width).as_bytes());
    match written.and_then(|()| stdout.flush()) {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

/// Record for --duration, then report what was recorded.
fn record_forward(args: &InvestigateArgs) -> anyhow::Result<()> {
    let mut run = args.run.clone();
    let duration = *run.duration.get_or_insert(DEFAULT_DURATION);
    // The report is built as the records are written (or, with --json, they
    // go straight to stdout): a long investigation holds the report's
    // aggregates, never the recording itself.
    let building = Arc::new(Mutex::new(Building::default()));
    let mut sink = Tee {
        building: (!args.json).then(|| building.clone()),
        stdout: args.json.then(io::stdout),
        file: None,
    };
    if let Some(path) = &run.out {
        // As `run --out` writes it: appended to, never truncated, mode 0640.
        sink.file = Some(crate::output::file::open_append(path).map_err(|e| {
            UserError::new(
                format!("cannot write {}: {e}", path.display()),
                "give --out a path in a directory that exists and that you can write to",
            )
        })?);
    }
    let tty = io::stderr().is_terminal();
    let mut last_line: Option<Duration> = None;
    let mut progress = |p: &Progress| {
        let line = format!(
            "stalltrace: recording {:>4.0}/{} s: {} records, {} stall episode{}",
            p.elapsed.as_secs_f64().min(duration.as_secs_f64()),
            duration.as_secs(),
            p.records,
            p.stalls,
            if p.stalls == 1 { "" } else { "s" },
        );
        // A terminal gets one line rewritten in place; a log gets the first
        // and then a line every 10 s.
        if tty {
            eprint!("\r{line}\x1b[K");
        } else if last_line.is_none_or(|t| p.elapsed >= t + Duration::from_secs(10)) {
            eprintln!("{line}");
            last_line = Some(p.elapsed);
        }
    };
    let result = run_into(&run, Box::new(sink), &mut progress);
    if tty {
        eprintln!();
    }
    result?;
    if args.json {
        return Ok(());
    }
    let building = Arc::try_unwrap(building)
        .map_err(|_| anyhow::anyhow!("the recording is still being written"))?
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    if let Some(e) = building.error {
        return Err(e.to_user_error("the recording").into());
    }
    let report = building
        .builder
        .build()
        .map_err(|e| e.to_user_error("the recording"))?;
    print(&report, args)
}

/// Where the records go: the report being built (or stdout, with --json)
/// and, with --out, a file.
struct Tee {
    // Shared with the run's output thread, which feeds it.
    building: Option<Arc<Mutex<Building>>>,
    stdout: Option<io::Stdout>,
    file: Option<File>,
}

/// The report so far, and the end of a record not yet complete.
#[derive(Default)]
struct Building {
    builder: ReportBuilder,
    partial: Vec<u8>,
    /// The first record the report could not take; the rest are not fed.
    error: Option<ReportError>,
}

impl Building {
    fn feed(&mut self, b: &[u8]) {
        self.partial.extend_from_slice(b);
        while let Some(end) = self.partial.iter().position(|&c| c == b'\n') {
            let line: Vec<u8> = self.partial.drain(..=end).collect();
            if self.error.is_none()
                && let Err(e) = self
                    .builder
                    .push_line(&String::from_utf8_lossy(&line[..end]))
            {
                self.error = Some(e);
            }
        }
    }
}

impl crate::output::file::Output for Tee {}

impl Write for Tee {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        if let Some(f) = &mut self.file {
            f.write_all(b)?;
        }
        if let Some(out) = &mut self.stdout {
            out.write_all(b)?;
        }
        if let Some(building) = &self.building {
            building.lock().unwrap_or_else(|e| e.into_inner()).feed(b);
        }
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        if let Some(out) = &mut self.stdout {
            out.flush()?;
        }
        match &mut self.file {
            Some(f) => f.flush(),
            None => Ok(()),
        }
    }
}
