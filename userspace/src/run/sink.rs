//! Where the records go, and how a run ends with them: the output is opened
//! before anything attaches, and at the end the `stop` record is written
//! through the queue (output/queue.rs) within a deadline, or the output's own
//! failure becomes the run's one-line error.

use std::fs::File;
use std::io::{self, BufWriter};
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use crate::cli::RunArgs;
use crate::error::UserError;
use crate::output::file::{LogFile, Output, rotatable};
use crate::output::{FileBudget, JsonWriter, Unwritten};
use crate::records::run::StopRecord;

/// How long after a signal the run may take to end, whatever its output does:
/// what the output has not taken by then is given up (and said so on
/// stderr), so a stuck reader cannot keep the programs attached.
pub(super) const STOP_WITHIN: Duration = Duration::from_millis(1000);

/// At the end of a run that was not signalled, how long the output may take
/// nothing before what is still queued is given up: a slow reader is waited
/// for, a stuck one is not.
const OUTPUT_STUCK: Duration = Duration::from_millis(1500);

pub(super) fn open_output(args: &RunArgs) -> Result<Box<dyn Output>, UserError> {
    match &args.out {
        // A descriptor of our own: std's stdout takes a lock per write that
        // a blocked write would hold at exit.
        None => io::stdout()
            .as_fd()
            .try_clone_to_owned()
            .map(|fd| Box::new(BufWriter::new(File::from(fd))) as Box<dyn Output>)
            .map_err(|e| {
                UserError::new(
                    format!("cannot use stdout: {e}"),
                    "run with a standard output, or pass --out FILE",
                )
            }),
        Some(path) if args.out_max_mb.is_some() && !rotatable(path) => Err(UserError::new(
            format!(
                "--out-max-mb rotates files by renaming them, and {} is no regular file",
                path.display()
            ),
            "give --out a path for a regular file, or leave --out-max-mb out",
        )),
        Some(path) => LogFile::open(path)
            .map(|f| Box::new(f) as Box<dyn Output>)
            .map_err(|e| {
                UserError::new(
                    format!("cannot write {}: {e}", path.display()),
                    "pass --out a path in a writable directory, or leave it out to write to stdout",
                )
            }),
    }
}

/// When `--out`'s next file begins: on SIGHUP, and at `--out-max-mb`
/// counted from what the file already holds.
pub(super) fn file_budget(args: &RunArgs) -> Option<FileBudget> {
    let path = args.out.as_ref()?;
    Some(FileBudget {
        path: path.clone(),
        max_bytes: args.out_max_mb.map(|mb| mb << 20),
        keep: args.out_keep,
        bytes: std::fs::metadata(path).map_or(0, |m| m.len()),
        begun: 0,
    })
}

/// Write the `stop` record and what is queued before it, giving up at
/// `deadline` or when the output takes nothing for OUTPUT_STUCK.
pub(super) fn finish_output(
    mut out: JsonWriter,
    ts: &str,
    stop_record: &StopRecord,
    deadline: Instant,
) -> anyhow::Result<()> {
    if let Some(queue) = out.queue() {
        // A stop record takes ~3 KiB with every program listed.
        queue.wait_for_room(16 << 10, OUTPUT_STUCK, deadline);
    }
    let stop_kept = out.emit(ts, stop_record)?;
    let unwritten = match out.into_queue() {
        Some(queue) => queue.close(OUTPUT_STUCK, deadline).err(),
        None => None,
    };
    if let Some(Unwritten { lines, bytes }) = unwritten {
        eprintln!(
            "stalltrace: the output took nothing at the end of the run: {lines} records ({bytes} bytes) not written{}",
            if stop_kept {
                ", the stop record among them"
            } else {
                ""
            },
        );
    } else if !stop_kept {
        eprintln!(
            "stalltrace: the output queue was full at the end of the run: the stop record was dropped"
        );
    }
    Ok(())
}

/// The one line an output failure ends the run with.
pub(super) fn output_failed(args: &RunArgs, e: &io::Error) -> UserError {
    let (to, fix) = match &args.out {
        Some(path) => (
            path.display().to_string(),
            match e.kind() {
                io::ErrorKind::StorageFull | io::ErrorKind::QuotaExceeded => {
                    "free space on its filesystem, or pass --out a path on another one"
                }
                _ => "check the file's filesystem and device (dmesg), or pass --out another path",
            },
        ),
        None => (
            "stdout".into(),
            match e.kind() {
                io::ErrorKind::BrokenPipe => {
                    "whatever reads stdout went away: keep it running, or pass --out FILE"
                }
                _ => "check what stdout is connected to, or pass --out FILE",
            },
        ),
    };
    UserError::new(
        format!("cannot write records to {to}: {e}; the run stopped"),
        fix,
    )
}
