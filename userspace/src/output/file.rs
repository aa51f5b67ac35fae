//! `--out FILE` as a log file: opened for appending (a restart or a second
//! writer never truncates what is there), reopened on SIGHUP (logrotate's
//! `create` + `postrotate kill -HUP`), and rotated at `--out-max-mb` to
//! FILE.1 … FILE.K, newest first, as logrotate names them.
//!
//! The run loop decides when a new file begins (output/json.rs: it writes the
//! `start` record that opens each file, with its own `seqno`); this side only
//! does the file operations, in order with the lines, on the writer thread.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// What the writer does between two lines when a new file begins.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NextFile {
    /// Open the path again: whatever is there now (logrotate moved the old one).
    Reopen,
    /// Shift FILE → FILE.1 → … → FILE.keep (the oldest is removed), then open a new FILE.
    Rotate { keep: u32 },
}

/// Where the writer thread puts the lines.
pub trait Output: Write + Send {
    /// Begin the next file; outputs that are not files have none.
    fn next_file(&mut self, _how: NextFile) -> io::Result<()> {
        Ok(())
    }
}

impl<W: Write + Send> Output for BufWriter<W> {}
impl Output for File {}

pub struct LogFile {
    path: PathBuf,
    out: BufWriter<File>,
    /// A regular file: one that can be renamed and opened anew. Anything
    /// else (/dev/stdout, a FIFO) keeps its one descriptor: renaming
    /// /dev/stdout would put the stream in a file in RAM nobody reads.
    regular: bool,
}

impl LogFile {
    pub fn open(path: &Path) -> io::Result<Self> {
        let file = open_append(path)?;
        Ok(Self {
            path: path.to_path_buf(),
            regular: file.metadata()?.file_type().is_file(),
            out: BufWriter::new(file),
        })
    }
}

/// Whether `path` is a file `--out-max-mb` may rotate: a regular file, or
/// nothing yet.
pub fn rotatable(path: &Path) -> bool {
    fs::metadata(path).map_or(true, |m| m.file_type().is_file())
}

/// Append-only, created if missing, mode 0640: the stream names hosts, peers
/// and files, which is for the log's readers, not everyone on the host.
pub fn open_append(path: &Path) -> io::Result<File> {
    use std::os::unix::fs::OpenOptionsExt;
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .open(path)
}

/// FILE.n
pub fn rotated_name(path: &Path, n: u32) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(format!(".{n}"));
    PathBuf::from(name)
}

impl Write for LogFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.out.write(buf)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

impl Output for LogFile {
    fn next_file(&mut self, how: NextFile) -> io::Result<()> {
        self.out.flush()?;
        if !self.regular {
            return Ok(());
        }
        // The new file gets the old one's owner, group and mode, as
        // logrotate's `create` does: a shipper given read access by group
        // keeps it across rotations.
        let before = self.out.get_ref().metadata()?;
        if let NextFile::Rotate { keep } = how {
            // Oldest first, so that no rename lands on a file still to move.
            // A name already gone (logrotate or a person moved it) is no
            // error: the new file is opened all the same.
            let gone_is_fine = |r: io::Result<()>| match r {
                Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            };
            if keep > 0 {
                gone_is_fine(fs::remove_file(rotated_name(&self.path, keep)))?;
            }
            for n in (1..keep).rev() {
                gone_is_fine(fs::rename(
                    rotated_name(&self.path, n),
                    rotated_name(&self.path, n + 1),
                ))?;
            }
            gone_is_fine(if keep > 0 {
                fs::rename(&self.path, rotated_name(&self.path, 1))
            } else {
                fs::remove_file(&self.path)
            })?;
        }
        let file = open_append(&self.path)?;
        let now = file.metadata()?;
        if (now.uid(), now.gid()) != (before.uid(), before.gid()) {
            std::os::unix::fs::fchown(&file, Some(before.uid()), Some(before.gid()))?;
        }
        if now.mode() != before.mode() {
            file.set_permissions(before.permissions())?;
        }
        self.out = BufWriter::new(file);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(p: &Path) -> String {
        fs::read_to_string(p).unwrap_or_default()
    }

    #[test]
    fn what_is_no_regular_file_is_never_renamed() {
        assert!(!rotatable(Path::new("/dev/null")));
        assert!(rotatable(Path::new("/nonexistent/yet.jsonl")));
        let mut f = LogFile::open(Path::new("/dev/null")).unwrap();
        f.next_file(NextFile::Rotate { keep: 3 }).unwrap();
        assert!(Path::new("/dev/null").exists() && !Path::new("/dev/null.1").exists());
    }

    #[test]
    fn appends_reopens_and_rotates_like_logrotate() {
        let dir = std::env::temp_dir().join(format!("stalltrace-logfile-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join("s.jsonl");
        fs::write(&path, "old\n").unwrap();
        let mut f = LogFile::open(&path).unwrap();
        // An operator let a shipper's group read it: every new file keeps that.
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&path, fs::Permissions::from_mode(0o644)).unwrap();
        f.write_all(b"a\n").unwrap();
        f.flush().unwrap();
        assert_eq!(read(&path), "old\na\n", "appended, not truncated");
        // logrotate `create`: moved away, then HUP.
        fs::rename(&path, dir.join("moved")).unwrap();
        f.write_all(b"b\n").unwrap();
        f.next_file(NextFile::Reopen).unwrap();
        f.write_all(b"c\n").unwrap();
        f.flush().unwrap();
        assert_eq!(
            (read(&dir.join("moved")), read(&path)),
            ("old\na\nb\n".into(), "c\n".into())
        );
        for line in ["d\n", "e\n", "f\n"] {
            f.next_file(NextFile::Rotate { keep: 2 }).unwrap();
            f.write_all(line.as_bytes()).unwrap();
        }
        f.flush().unwrap();
        assert_eq!(read(&path), "f\n");
        assert_eq!(fs::metadata(&path).unwrap().mode() & 0o777, 0o644);
        assert_eq!(read(&rotated_name(&path, 1)), "e\n");
        assert_eq!(read(&rotated_name(&path, 2)), "d\n");
        assert!(!rotated_name(&path, 3).exists(), "keep bounds the set");
        // Moved away by someone else before the rotation: a new file all the same.
        fs::remove_file(&path).unwrap();
        f.next_file(NextFile::Rotate { keep: 2 }).unwrap();
        f.write_all(b"g\n").unwrap();
        f.flush().unwrap();
        assert_eq!(
            (read(&path), read(&rotated_name(&path, 2))),
            ("g\n".into(), "e\n".into())
        );
        assert!(!rotated_name(&path, 1).exists());
        fs::remove_dir_all(&dir).unwrap();
    }
}
