//! `stalltrace report`: read the stream, then lay the report out as text
//! (and as a page with `--html`). The one place that both reads and renders.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};

use super::html::render_html;
use super::input::read_reports_within;
use super::model::Report;
use super::text::render_text;
use super::window::Window;
use crate::error::UserError;

/// `stalltrace report`'s options (cli.rs lists it with the other subcommands).
#[derive(clap::Args, Debug, Clone)]
pub struct ReportArgs {
    /// A stream written by `stalltrace run` (JSON lines, gzip-compressed or
    /// not), or all the files of a rotated set in any order (`FILE*`); `-`
    /// reads stdin.
    // Not `required`: no path is the report's own one-line error, not clap's usage text.
    #[arg(value_name = "FILE.jsonl")]
    pub files: Vec<PathBuf>,
    /// Also write the report as one self-contained HTML page (heatmaps, episode timeline).
    #[arg(long, value_name = "OUT.html")]
    pub html: Option<PathBuf>,
    /// Width of the text report in columns (default: the terminal's, else 100).
    #[arg(long, value_name = "COLUMNS", value_parser = clap::value_parser!(u16).range(60..=400))]
    pub width: Option<u16>,
    /// Report only from this time on: 2026-11-28T03:12:00Z, "2026-11-28 03:12",
    /// 03:12 (UTC, the last one before now) or "10m ago".
    #[arg(long, value_name = "TIME")]
    pub since: Option<String>,
    /// Report only up to this time (the same forms as --since).
    #[arg(long, value_name = "TIME")]
    pub until: Option<String>,
}

/// The `report` subcommand.
pub fn command(args: &ReportArgs) -> anyhow::Result<()> {
    let now_us = chrono::Utc::now().timestamp_micros();
    let window = Window::of(args.since.as_deref(), args.until.as_deref(), now_us).map_err(|e| {
        UserError::new(
            e,
            "see `stalltrace report --help` for the forms a time takes",
        )
    })?;
    let report = read_reports_within(&args.files, window)?;
    // The page first: an unwritable --html fails before anything is printed.
    if let Some(out) = &args.html {
        write_html(&report, out)?;
    }
    let width = args.width.map(usize::from).unwrap_or_else(terminal_width);
    let text = render_text(&report, width);
    let mut stdout = std::io::stdout().lock();
    match stdout
        .write_all(text.as_bytes())
        .and_then(|()| stdout.flush())
    {
        // `stalltrace report x | head` is not an error.
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other?,
    }
    if let Some(out) = &args.html {
        eprintln!("stalltrace: wrote {}", out.display());
    }
    Ok(())
}

/// Writes the report as an HTML page to `out`.
pub fn write_html(report: &Report, out: &Path) -> Result<(), UserError> {
    std::fs::write(out, render_html(report)).map_err(|e| {
        UserError::new(
            format!("cannot write {}: {e}", out.display()),
            "give --html a path in a directory that exists and that you can write to",
        )
    })
}

/// The terminal's width when stdout is one, else `$COLUMNS`, else 100.
pub fn terminal_width() -> usize {
    let stdout = std::io::stdout();
    if stdout.is_terminal() {
        let mut ws = libc::winsize {
            ws_row: 0,
            ws_col: 0,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCGWINSZ writes a winsize into the struct we own.
        let rc = unsafe { libc::ioctl(libc::STDOUT_FILENO, libc::TIOCGWINSZ, &mut ws) };
        if rc == 0 && ws.ws_col > 0 {
            return usize::from(ws.ws_col);
        }
    }
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .unwrap_or(100)
}
