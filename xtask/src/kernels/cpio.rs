//! A minimal cpio "newc" writer: the guest's initramfs is built in memory from
//! host files, so no staging tree, no root-only mknod (for /dev/console) and
//! no `cpio` dependency.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;

enum Node {
    Dir,
    File { mode: u32, data: FileData },
    Symlink(String),
    CharDev { major: u32, minor: u32 },
}

enum FileData {
    Host(PathBuf),
    Inline(Vec<u8>),
}

/// An archive under construction, keyed by guest path without the leading '/'.
#[derive(Default)]
pub struct Archive {
    nodes: BTreeMap<String, Node>,
}

/// Guest path of a host path. The guest is merged-/usr like the host: /bin,
/// /sbin, /lib, /lib64 are symlinks into /usr, so every file is stored at its
/// /usr path (the kernel's cpio unpacker does not create files through a
/// symlinked directory reliably).
pub fn guest_path(p: &Path) -> String {
    let s = p.to_string_lossy();
    let s = s.trim_start_matches('/');
    match s.split_once('/') {
        Some(("bin" | "sbin" | "lib" | "lib64" | "lib32", _)) => {
            format!("usr/{s}")
        }
        _ => s.to_string(),
    }
}

impl Archive {
    pub fn new() -> Archive {
        let mut a = Archive::default();
        for top in ["bin", "sbin", "lib", "lib64"] {
            a.nodes
                .insert(top.to_string(), Node::Symlink(format!("usr/{top}")));
        }
        for d in [
            "usr/bin",
            "usr/sbin",
            "usr/lib",
            "usr/lib64",
            "dev",
            "proc",
            "sys",
            "tmp",
            "run",
        ] {
            a.dir(d);
        }
        a.nodes
            .insert("dev/console".into(), Node::CharDev { major: 5, minor: 1 });
        a
    }

    pub fn contains(&self, path: &str) -> bool {
        self.nodes.contains_key(path)
    }

    /// A directory and all its parents.
    pub fn dir(&mut self, path: &str) {
        let mut cur = String::new();
        for part in path.split('/').filter(|p| !p.is_empty()) {
            if !cur.is_empty() {
                cur.push('/');
            }
            cur.push_str(part);
            self.nodes.entry(cur.clone()).or_insert(Node::Dir);
        }
    }

    fn parent(&mut self, path: &str) {
        if let Some((p, _)) = path.rsplit_once('/') {
            self.dir(p);
        }
    }

    pub fn inline(&mut self, path: &str, mode: u32, data: impl Into<Vec<u8>>) {
        self.parent(path);
        self.nodes.insert(
            path.to_string(),
            Node::File {
                mode,
                data: FileData::Inline(data.into()),
            },
        );
    }

    pub fn symlink(&mut self, path: &str, target: &str) {
        self.parent(path);
        self.nodes
            .insert(path.to_string(), Node::Symlink(target.to_string()));
    }

    /// A host file at `guest` (a guest path), with the host file's mode.
    pub fn host_file_at(&mut self, guest: &str, host: &Path) -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(host).with_context(|| format!("{}", host.display()))?;
        self.parent(guest);
        self.nodes.insert(
            guest.to_string(),
            Node::File {
                mode: meta.permissions().mode() & 0o7777,
                data: FileData::Host(host.to_path_buf()),
            },
        );
        Ok(())
    }

    /// A host file at its own path; symlinks are kept as symlinks and their
    /// targets added too (kmod dispatches on argv[0], libraries on their soname).
    pub fn host_path(&mut self, host: &Path) -> anyhow::Result<()> {
        let mut p = host.to_path_buf();
        for _ in 0..16 {
            let guest = guest_path(&p);
            let meta = std::fs::symlink_metadata(&p).with_context(|| format!("{}", p.display()))?;
            if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&p)?;
                self.symlink(&guest, &target.to_string_lossy());
                p = p.parent().unwrap_or(Path::new("/")).join(target);
                continue;
            }
            if meta.is_dir() {
                self.dir(&guest);
            } else {
                self.host_file_at(&guest, &p)?;
            }
            return Ok(());
        }
        anyhow::bail!("{}: too many symlinks", host.display())
    }

    /// Every file below a host directory, at its own path.
    pub fn host_tree(&mut self, host: &Path) -> anyhow::Result<()> {
        for e in std::fs::read_dir(host)? {
            let p = e?.path();
            if std::fs::symlink_metadata(&p)?.is_dir() {
                self.host_tree(&p)?;
            } else {
                self.host_path(&p)?;
            }
        }
        Ok(())
    }

    /// Write the archive (uncompressed newc) to `out`.
    pub fn write(&self, out: &mut impl Write) -> anyhow::Result<()> {
        for (ino, (path, node)) in (1u32..).zip(&self.nodes) {
            let (mode, data, rdev): (u32, Vec<u8>, (u32, u32)) = match node {
                Node::Dir => (0o040755, Vec::new(), (0, 0)),
                Node::Symlink(t) => (0o120777, t.as_bytes().to_vec(), (0, 0)),
                Node::CharDev { major, minor } => (0o020600, Vec::new(), (*major, *minor)),
                Node::File { mode, data } => {
                    let bytes = match data {
                        FileData::Inline(b) => b.clone(),
                        FileData::Host(p) => {
                            std::fs::read(p).with_context(|| format!("reading {}", p.display()))?
                        }
                    };
                    (0o100000 | mode, bytes, (0, 0))
                }
            };
            entry(out, ino, path, mode, &data, rdev)?;
        }
        entry(out, 0, "TRAILER!!!", 0, &[], (0, 0))?;
        Ok(())
    }
}

fn pad4(out: &mut impl Write, len: usize) -> std::io::Result<()> {
    out.write_all(&[0u8; 3][..(4 - len % 4) % 4])
}

fn entry(
    out: &mut impl Write,
    ino: u32,
    name: &str,
    mode: u32,
    data: &[u8],
    (rmaj, rmin): (u32, u32),
) -> anyhow::Result<()> {
    let namesize = name.len() + 1;
    let header = format!(
        "070701{ino:08x}{mode:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{:08x}{rmaj:08x}{rmin:08x}{namesize:08x}{:08x}",
        0, // uid
        0, // gid
        1, // nlink
        0, // mtime
        data.len(),
        0, // dev major
        0, // dev minor
        0, // check
    );
    out.write_all(header.as_bytes())?;
    out.write_all(name.as_bytes())?;
    out.write_all(&[0])?;
    pad4(out, header.len() + namesize)?;
    out.write_all(data)?;
    pad4(out, data.len())?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merged_usr_paths() {
        assert_eq!(guest_path(Path::new("/sbin/ip")), "usr/sbin/ip");
        assert_eq!(
            guest_path(Path::new("/lib64/ld-linux-x86-64.so.2")),
            "usr/lib64/ld-linux-x86-64.so.2"
        );
        assert_eq!(guest_path(Path::new("/usr/bin/fio")), "usr/bin/fio");
        assert_eq!(guest_path(Path::new("/etc/protocols")), "etc/protocols");
    }

    #[test]
    fn newc_entries_are_aligned_and_terminated() {
        let mut a = Archive::new();
        a.inline("init", 0o755, "#!/bin/sh\n");
        let mut out = Vec::new();
        a.write(&mut out).unwrap();
        assert_eq!(out.len() % 4, 0);
        assert!(out.starts_with(b"070701"));
        let trailer = out.windows(10).position(|w| w == b"TRAILER!!!").unwrap();
        assert!(trailer > out.len() - 24);
    }
}
