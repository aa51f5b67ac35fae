//! `stalltrace report FILE [--html OUT]`: read a recorded stream (a file, `-`
//! for stdin, gzip-compressed or not: rotated logs usually are), print the text
//! report, and write the HTML page.

use std::fs::File;
use std::io::{BufRead, BufReader, IsTerminal, Read, Write};
use std::path::Path;

use super::html::render_html;
use super::model::{Report, ReportError};
use super::text::render_text;
use crate::cli::ReportArgs;
use crate::error::UserError;

const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Read and build the report of `path` (`-`: stdin).
pub fn read_report(path: &Path) -> Result<Report, UserError> {
    let stdin = path.as_os_str() == "-";
    let name = if stdin {
        "stdin".to_string()
    } else {
        path.display().to_string()
    };
    let mut reader: Box<dyn BufRead> = if stdin {
        Box::new(BufReader::new(std::io::stdin()))
    } else {
        let file = File::open(path).map_err(|e| ReportError::Read(e).to_user_error(&name))?;
        Box::new(BufReader::with_capacity(1 << 16, file))
    };
    let head = reader
        .fill_buf()
        .map_err(|e| ReportError::Read(e).to_user_error(&name))?;
    if head.starts_with(&GZIP_MAGIC) {
        let decoder = flate2::read::MultiGzDecoder::new(reader);
        reader = Box::new(BufReader::new(GzErrors(decoder)));
    }
    Report::from_reader(reader).map_err(|e| e.to_user_error(&name))
}

/// A corrupt gzip member surfaces as a read error naming gzip.
struct GzErrors<R>(R);

impl<R: Read> Read for GzErrors<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        self.0
            .read(buf)
            .map_err(|e| std::io::Error::new(e.kind(), format!("gzip: {e}")))
    }
}

/// The `report` subcommand.
pub fn command(args: &ReportArgs) -> anyhow::Result<()> {
    let report = read_report(&args.file)?;
    // The page first: an unwritable --html fails before anything is printed.
    if let Some(out) = &args.html {
        std::fs::write(out, render_html(&report)).map_err(|e| {
            UserError::new(
                format!("cannot write {}: {e}", out.display()),
                "give --html a path in a directory that exists and that you can write to",
            )
        })?;
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
