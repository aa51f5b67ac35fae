//! The database files and what a transaction does to them, with SQL Server's
//! I/O pattern as the kernel sees it: both files opened with O_DIRECT and kept
//! open, 8 KiB page reads and writes at random in the data file, sequential
//! log writes that wrap around the log file, each followed by fdatasync before
//! the commit is acknowledged.

use std::alloc::{Layout, alloc_zeroed, dealloc};
use std::fs::{File, OpenOptions};
use std::io;
use std::ops::{Deref, DerefMut};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr::NonNull;
use std::sync::Mutex;

/// SQL Server's page size.
pub const PAGE: usize = 8192;
/// Buffer, offset and length alignment for O_DIRECT: covers 512-byte and
/// 4 KiB logical blocks.
pub const ALIGN: usize = 4096;
/// Chunk used to fill the files at creation.
const FILL_CHUNK: usize = 1 << 20;

/// A zeroed heap buffer aligned for O_DIRECT.
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// `len` must be a non-zero multiple of ALIGN.
    pub fn new(len: usize) -> AlignedBuf {
        assert!(
            len > 0 && len.is_multiple_of(ALIGN),
            "O_DIRECT buffer of {len} bytes"
        );
        let layout = Layout::from_size_align(len, ALIGN).expect("valid layout");
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr is valid for len initialised (zeroed) bytes while self lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self makes the access exclusive.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated in new() with this very layout.
        unsafe {
            dealloc(
                self.ptr.as_ptr(),
                Layout::from_size_align(self.len, ALIGN).expect("valid layout"),
            )
        }
    }
}

/// A small xorshift64* generator: page choice needs to be spread, not secure,
/// and each session keeps its own so no lock is taken for it.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform enough in 0..n for n much smaller than 2^64.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Per-session I/O buffers, so transactions allocate nothing.
pub struct TxnBuffers {
    page: AlignedBuf,
    log: AlignedBuf,
}

impl Default for TxnBuffers {
    fn default() -> Self {
        TxnBuffers {
            page: AlignedBuf::new(PAGE),
            log: AlignedBuf::new(PAGE),
        }
    }
}

/// What one transaction did, for callers that want to check or report it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxnIo {
    pub pages_read: u32,
    pub log_offset: u64,
    pub log_bytes: u32,
}

/// The open data (.mdf) and log (.ldf) files.
pub struct Storage {
    data: File,
    log: File,
    data_path: PathBuf,
    log_path: PathBuf,
    data_pages: u64,
    log_bytes: u64,
    /// Next log offset and LSN. One lock, like SQL Server's single log tail:
    /// records are laid down in order even when sessions commit together.
    log_tail: Mutex<(u64, u64)>,
}

impl Storage {
    /// Creates (or re-creates) both files at their full size and fills them, so
    /// later reads and writes hit allocated, written blocks (reads of
    /// fallocated-but-unwritten extents would never reach the device), and
    /// keeps them open with O_DIRECT.
    pub fn create(
        data_path: &Path,
        data_bytes: u64,
        log_path: &Path,
        log_bytes: u64,
    ) -> io::Result<Storage> {
        for (path, bytes) in [(data_path, data_bytes), (log_path, log_bytes)] {
            if bytes < FILL_CHUNK as u64 || !bytes.is_multiple_of(FILL_CHUNK as u64) {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "{}: size must be a whole number of MiB, at least 1",
                        path.display()
                    ),
                ));
            }
        }
        let data = create_file(data_path, data_bytes, |page_no, page| {
            // A recognisable page header: its number in the first 4 bytes.
            page[..4].copy_from_slice(&(page_no as u32).to_le_bytes());
        })?;
        let log = create_file(log_path, log_bytes, |_, _| {})?;
        Ok(Storage {
            data,
            log,
            data_path: data_path.to_path_buf(),
            log_path: log_path.to_path_buf(),
            data_pages: data_bytes / PAGE as u64,
            log_bytes,
            log_tail: Mutex::new((0, 1)),
        })
    }

    pub fn data_path(&self) -> &Path {
        &self.data_path
    }

    pub fn log_path(&self) -> &Path {
        &self.log_path
    }

    /// One committed transaction: read 1–2 random pages, write the log record
    /// (4 or 8 KiB) and fdatasync the log — the commit — then write one random
    /// data page. The data write comes after the log flush as in write-ahead
    /// logging (SQL Server defers it to the lazy writer; here it stays in the
    /// request so every transaction writes both files).
    pub fn transaction(
        &self,
        bufs: &mut TxnBuffers,
        rng: &mut Rng,
        spid: u16,
    ) -> io::Result<TxnIo> {
        let pages_read = 1 + rng.below(2) as u32;
        for _ in 0..pages_read {
            let page_no = rng.below(self.data_pages);
            read_full(&self.data, &mut bufs.page, page_no * PAGE as u64)?;
        }

        let log_len = if rng.below(2) == 0 { ALIGN } else { PAGE };
        let (log_offset, lsn) = {
            let mut tail = self.log_tail.lock().unwrap_or_else(|e| e.into_inner());
            if tail.0 + log_len as u64 > self.log_bytes {
                tail.0 = 0; // wrap, like a circular log whose VLFs were truncated
            }
            let at = *tail;
            tail.0 += log_len as u64;
            tail.1 += 1;
            at
        };
        let rec = &mut bufs.log[..log_len];
        rec[..8].copy_from_slice(&lsn.to_le_bytes());
        rec[8..10].copy_from_slice(&spid.to_le_bytes());
        rec[10..14].copy_from_slice(&(log_len as u32).to_le_bytes());
        self.log.write_all_at(rec, log_offset)?;
        self.log.sync_data()?;

        let page_no = rng.below(self.data_pages);
        bufs.page[..4].copy_from_slice(&(page_no as u32).to_le_bytes());
        bufs.page[4..12].copy_from_slice(&lsn.to_le_bytes());
        self.data.write_all_at(&bufs.page, page_no * PAGE as u64)?;

        Ok(TxnIo {
            pages_read,
            log_offset,
            log_bytes: log_len as u32,
        })
    }

    /// A checkpoint burst: write `pages` random data pages, then fdatasync the
    /// data file, as SQL Server's checkpoint flushes dirty pages.
    pub fn checkpoint(&self, pages: usize, rng: &mut Rng) -> io::Result<()> {
        let mut buf = AlignedBuf::new(PAGE);
        for _ in 0..pages {
            let page_no = rng.below(self.data_pages);
            buf[..4].copy_from_slice(&(page_no as u32).to_le_bytes());
            self.data.write_all_at(&buf, page_no * PAGE as u64)?;
        }
        self.data.sync_data()
    }
}

/// Opens `path` with O_DIRECT (truncating), preallocates `bytes` and writes
/// every page once; `page_init` stamps each 8 KiB page before it is written.
fn create_file(path: &Path, bytes: u64, page_init: impl Fn(u64, &mut [u8])) -> io::Result<File> {
    let with_path = |e: io::Error, what: &str| {
        io::Error::new(e.kind(), format!("{}: {what}: {e}", path.display()))
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o640)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .map_err(|e| {
            let hint = if e.raw_os_error() == Some(libc::EINVAL) {
                "open with O_DIRECT (does the filesystem support it?)"
            } else {
                "open"
            };
            with_path(e, hint)
        })?;
    // SAFETY: plain syscall on an fd we own.
    let rc = unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, bytes as libc::off_t) };
    if rc != 0 {
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EOPNOTSUPP) {
            return Err(with_path(e, "fallocate"));
        }
        // No fallocate (e.g. some tmpfs/FUSE): the writes below allocate.
    }
    let mut buf = AlignedBuf::new(FILL_CHUNK);
    let mut off = 0u64;
    while off < bytes {
        for (i, page) in buf.chunks_exact_mut(PAGE).enumerate() {
            page_init(off / PAGE as u64 + i as u64, page);
        }
        file.write_all_at(&buf, off)
            .map_err(|e| with_path(e, "write"))?;
        off += FILL_CHUNK as u64;
    }
    file.sync_all().map_err(|e| with_path(e, "fsync"))?;
    Ok(file)
}

/// pread until `buf` is full; a short file is an error.
fn read_full(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    file.read_exact_at(buf, offset)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("stalltrace-sim-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn aligned_buf_is_aligned_and_zeroed() {
        let b = AlignedBuf::new(PAGE);
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert!(b.iter().all(|x| *x == 0));
    }

    #[test]
    fn rng_spreads() {
        let mut r = Rng::new(7);
        let mut seen = [false; 8];
        for _ in 0..200 {
            seen[r.below(8) as usize] = true;
        }
        assert!(seen.iter().all(|s| *s));
    }

    #[test]
    fn transactions_write_the_log_sequentially_and_wrap() {
        // /var/tmp is a disk filesystem (O_DIRECT); fall back to the temp dir.
        let base = if Path::new("/var/tmp").is_dir() {
            PathBuf::from("/var/tmp")
        } else {
            tmpdir("x")
        };
        let dir = base.join(format!("stalltrace-sim-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (data, log) = (dir.join("t.mdf"), dir.join("t_log.ldf"));
        let s = Storage::create(&data, 1 << 20, &log, 1 << 20).unwrap();
        assert_eq!(std::fs::metadata(&data).unwrap().len(), 1 << 20);
        let (mut bufs, mut rng) = (TxnBuffers::default(), Rng::new(1));
        let mut expect = 0u64;
        let mut wrapped = false;
        for _ in 0..300 {
            let io = s.transaction(&mut bufs, &mut rng, 51).unwrap();
            if expect + io.log_bytes as u64 > 1 << 20 {
                expect = 0;
                wrapped = true;
            }
            assert_eq!(io.log_offset, expect);
            assert!((1..=2).contains(&io.pages_read));
            expect += io.log_bytes as u64;
        }
        assert!(wrapped, "300 records of ≥ 4 KiB wrap a 1 MiB log");
        s.checkpoint(4, &mut rng).unwrap();
        drop(s);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn sizes_must_be_whole_mib() {
        let dir = tmpdir("size");
        assert!(Storage::create(&dir.join("a.mdf"), 4096, &dir.join("a.ldf"), 1 << 20).is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
