//! `investigate --last/--at`: the recording to look back at, the file the
//! stalltrace service writes (or `--from`), with the files rotated from it.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the package's unit writes, when its unit cannot be asked.
const PACKAGE_OUT: &str = "/var/log/stalltrace/stalltrace.jsonl";
/// The package's unit.
const UNIT: &str = "stalltrace.service";

/// A recording: its current file and the files rotated from it.
#[derive(Debug)]
pub struct Recording {
    /// The file `run --out` writes.
    pub out: PathBuf,
    /// It and its rotated files (FILE.1, FILE.2.gz, FILE-20261128.gz), in
    /// name order: the report places them itself.
    pub files: Vec<PathBuf>,
    /// How `out` was found, for the line that says what was read.
    pub found_by: String,
}

/// The recording at `from`, else the service's; Err names where it looked
/// when there is none.
pub fn find(from: Option<&Path>) -> Result<Recording, String> {
    let (out, found_by) = match from {
        Some(path) => (path.to_path_buf(), "--from".to_string()),
        None => match unit_out() {
            Some(out) => (out, format!("{UNIT}'s --out")),
            None => (
                PathBuf::from(PACKAGE_OUT),
                "the package's default (no stalltrace.service found)".to_string(),
            ),
        },
    };
    let files = set_of(&out);
    if files.is_empty() {
        return Err(format!("{} ({found_by})", out.display()));
    }
    Ok(Recording {
        out,
        files,
        found_by,
    })
}

/// The `--out` of the unit's ExecStart, as systemd has loaded it.
fn unit_out() -> Option<PathBuf> {
    let shown = Command::new("systemctl")
        .args(["show", UNIT, "--property=ExecStart", "--value"])
        .output()
        .ok()
        .filter(|o| o.status.success())?;
    out_of_exec_start(&String::from_utf8_lossy(&shown.stdout))
}

/// `--out FILE`, `--out=FILE` or `-o FILE` in systemd's rendering of an
/// ExecStart: `{ path=/usr/bin/stalltrace ; argv[]=/usr/bin/stalltrace run
/// --out FILE $STALLTRACE_OPTS ; ignore_errors=no ; ... }`.
fn out_of_exec_start(shown: &str) -> Option<PathBuf> {
    let argv = shown.split("argv[]=").nth(1)?.split(" ; ").next()?;
    let mut words = argv.split_whitespace();
    while let Some(w) = words.next() {
        if let Some(path) = w.strip_prefix("--out=") {
            return Some(PathBuf::from(path));
        }
        if w == "--out" || w == "-o" {
            return words.next().map(PathBuf::from);
        }
    }
    None
}

/// `out` and the files logrotate or `--out-max-mb` made of it in its
/// directory: its name followed by `.` or `-` (dateext) and anything.
fn set_of(out: &Path) -> Vec<PathBuf> {
    let (Some(dir), Some(name)) = (out.parent(), out.file_name()) else {
        return Vec::new();
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    let name = name.to_string_lossy();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(Result::ok)
        .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n == *name
                || n.strip_prefix(name.as_ref())
                    .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('-'))
        })
        .map(|e| dir.join(e.file_name()))
        .collect();
    files.sort();
    files
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_out_of_the_unit_is_read_from_systemd_s_rendering() {
        // `systemctl show stalltrace.service --property=ExecStart --value`, systemd 252.
        let shown = "{ path=/usr/bin/stalltrace ; argv[]=/usr/bin/stalltrace run --out /var/log/stalltrace/stalltrace.jsonl $STALLTRACE_OPTS ; ignore_errors=no ; start_time=[n/a] ; stop_time=[n/a] ; pid=0 ; code=(null) ; status=0/0 }";
        assert_eq!(
            out_of_exec_start(shown),
            Some(PathBuf::from("/var/log/stalltrace/stalltrace.jsonl"))
        );
        let drop_in = "{ path=/usr/bin/stalltrace ; argv[]=/usr/bin/stalltrace run -i 5s --out=/srv/st.jsonl ; ignore_errors=no }";
        assert_eq!(
            out_of_exec_start(drop_in),
            Some(PathBuf::from("/srv/st.jsonl"))
        );
        assert_eq!(out_of_exec_start(""), None);
        assert_eq!(
            out_of_exec_start("{ path=/usr/bin/stalltrace ; argv[]=/usr/bin/stalltrace run ; }"),
            None
        );
    }

    #[test]
    fn the_set_is_the_file_and_what_was_rotated_from_it() {
        // Removed on drop, a failed assertion included.
        let scratch = tempfile::tempdir().unwrap();
        let dir = scratch.path();
        for name in [
            "st.jsonl",
            "st.jsonl.1",
            "st.jsonl.2.gz",
            "st.jsonl-20261127.gz",
            "st.jsonlx",
            "other.jsonl",
        ] {
            std::fs::write(dir.join(name), "").unwrap();
        }
        let names: Vec<String> = set_of(&dir.join("st.jsonl"))
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "st.jsonl",
                "st.jsonl-20261127.gz",
                "st.jsonl.1",
                "st.jsonl.2.gz"
            ]
        );
        // Rotated away and not yet created again: the set is still there.
        std::fs::remove_file(dir.join("st.jsonl")).unwrap();
        assert_eq!(set_of(&dir.join("st.jsonl")).len(), 3);
        assert!(set_of(&dir.join("none.jsonl")).is_empty());
    }
}
