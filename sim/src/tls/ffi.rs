//! The only `unsafe` TLS code: an `SSL` driven through libssl's own C entry
//! points, with OpenSSL's own BIOs, because the tracer's uprobes see exactly
//! these calls. The openssl crate's `SslStream` would route I/O through a Rust
//! custom BIO and its own `SSL_read`/`SSL_write` choice; here the server
//! decides:
//!
//! - memory BIOs (`BIO_s_mem`) for the handshake, and for the whole session in
//!   the `memory` style: `SSL_write_ex` encrypts into the write BIO and the
//!   caller sends the ciphertext itself afterwards;
//! - a socket BIO (`BIO_new_socket`) after the handshake in the `socket` style:
//!   `SSL_write` sends on the socket from inside libssl.
//!
//! Every call clears the thread's OpenSSL error queue first, so that
//! `SSL_get_error` describes that call and nothing older.

use std::io;
use std::os::fd::RawFd;
use std::os::raw::{c_int, c_long, c_void};

use foreign_types::ForeignType;
use openssl::error::ErrorStack;
use openssl::ssl::{Ssl, SslContext};
use openssl_sys as ffi;

/// `BIO_ctrl` command behind the `BIO_pending` macro (bio.h).
const BIO_CTRL_PENDING: c_int = 10;
/// `BIO_new_socket`'s close flag: the fd stays the `TcpStream`'s to close.
const BIO_NOCLOSE: c_int = 0;

/// What one `SSL_read_ex` gave.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadOutcome {
    /// Plaintext bytes.
    Data(usize),
    /// The read BIO ran dry: feed it ciphertext and call again (memory BIOs).
    WantRead,
    /// The peer sent close_notify, or closed the TCP connection.
    Closed,
}

/// A server-side `SSL` whose BIOs this module chose.
pub struct RawTls {
    ssl: Ssl,
}

impl RawTls {
    /// An `SSL` in accept state with a memory BIO each way.
    pub fn accept_with_memory_bios(ctx: &SslContext) -> io::Result<RawTls> {
        let ssl = Ssl::new(ctx).map_err(tls_error)?;
        // SAFETY: BIO_s_mem returns a static method table; BIO_new returns a
        // fresh BIO or null (checked). SSL_set_bio takes ownership of both
        // BIOs (freed with the SSL), and the SSL is valid while `ssl` lives.
        unsafe {
            let rbio = ffi::BIO_new(ffi::BIO_s_mem());
            let wbio = ffi::BIO_new(ffi::BIO_s_mem());
            if rbio.is_null() || wbio.is_null() {
                ffi::BIO_free_all(rbio);
                ffi::BIO_free_all(wbio);
                return Err(tls_error(ErrorStack::get()));
            }
            ffi::SSL_set_bio(ssl.as_ptr(), rbio, wbio);
            ffi::SSL_set_accept_state(ssl.as_ptr());
        }
        Ok(RawTls { ssl })
    }

    /// One `SSL_do_handshake` step: true once the handshake is complete,
    /// false if it needs more input from the peer.
    pub fn handshake(&mut self) -> io::Result<bool> {
        // SAFETY: a valid SSL; the call takes no buffers.
        let ret = unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_do_handshake(self.ssl.as_ptr())
        };
        if ret == 1 {
            return Ok(true);
        }
        match self.error(ret) {
            ffi::SSL_ERROR_WANT_READ => Ok(false),
            code => Err(self.describe("TLS handshake", ret, code)),
        }
    }

    /// Appends ciphertext from the peer to the memory read BIO.
    pub fn feed(&mut self, ciphertext: &[u8]) -> io::Result<()> {
        let len = c_int::try_from(ciphertext.len()).map_err(|_| invalid_len())?;
        // SAFETY: the read BIO is the memory BIO set in
        // accept_with_memory_bios (feed is only used before use_socket); the
        // buffer is valid for len bytes.
        let n = unsafe {
            ffi::ERR_clear_error();
            let rbio = ffi::SSL_get_rbio(self.ssl.as_ptr());
            ffi::BIO_write(rbio, ciphertext.as_ptr() as *const c_void, len)
        };
        if n != len {
            return Err(tls_error(ErrorStack::get()));
        }
        Ok(())
    }

    /// Takes everything libssl has written to the memory write BIO.
    pub fn take_output(&mut self) -> Vec<u8> {
        let mut out = Vec::new();
        // SAFETY: the write BIO is the memory BIO (see feed); BIO_ctrl with
        // BIO_CTRL_PENDING takes no pointer; BIO_read writes at most the
        // length given into the spare capacity reserved for it.
        unsafe {
            let wbio = ffi::SSL_get_wbio(self.ssl.as_ptr());
            loop {
                let pending = ffi::BIO_ctrl(wbio, BIO_CTRL_PENDING, 0, std::ptr::null_mut());
                if pending <= 0 {
                    break;
                }
                let want = pending.min(c_int::MAX as c_long) as usize;
                out.reserve(want);
                let spare = out.spare_capacity_mut();
                let n = ffi::BIO_read(wbio, spare.as_mut_ptr() as *mut c_void, want as c_int);
                if n <= 0 {
                    break;
                }
                out.set_len(out.len() + n as usize);
            }
        }
        out
    }

    /// Replaces both memory BIOs with one OpenSSL socket BIO on `fd`, which
    /// the caller keeps open (and closes) for as long as this object lives.
    /// Anything still pending in the write BIO must have been taken first.
    pub fn use_socket(&mut self, fd: RawFd) -> io::Result<()> {
        // SAFETY: BIO_new_socket returns a new BIO or null (checked).
        // SSL_set_bio with the same BIO for reading and writing takes one
        // reference to it and frees the old memory BIOs; BIO_NOCLOSE leaves
        // the fd to its owner.
        unsafe {
            ffi::ERR_clear_error();
            let bio = ffi::BIO_new_socket(fd, BIO_NOCLOSE);
            if bio.is_null() {
                return Err(tls_error(ErrorStack::get()));
            }
            ffi::SSL_set_bio(self.ssl.as_ptr(), bio, bio);
        }
        Ok(())
    }

    /// One `SSL_read_ex` into `buf`.
    pub fn read_ex(&mut self, buf: &mut [u8]) -> io::Result<ReadOutcome> {
        let mut got = 0usize;
        // SAFETY: buf is valid for buf.len() writable bytes; got is a valid
        // out-pointer.
        let ret = unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_read_ex(
                self.ssl.as_ptr(),
                buf.as_mut_ptr() as *mut c_void,
                buf.len(),
                &mut got,
            )
        };
        if ret == 1 {
            return Ok(ReadOutcome::Data(got));
        }
        match self.error(ret) {
            ffi::SSL_ERROR_WANT_READ => Ok(ReadOutcome::WantRead),
            ffi::SSL_ERROR_ZERO_RETURN => Ok(ReadOutcome::Closed),
            // A TCP close without close_notify: how most TDS clients leave.
            ffi::SSL_ERROR_SYSCALL if no_queued_error() => {
                let os = io::Error::last_os_error();
                match os.raw_os_error() {
                    Some(0) | None => Ok(ReadOutcome::Closed),
                    Some(_) => Err(os),
                }
            }
            code => Err(self.describe("TLS read", ret, code)),
        }
    }

    /// The `memory` style: the whole of `plaintext` in ONE `SSL_write_ex`,
    /// which encrypts into the memory write BIO; nothing is sent yet.
    pub fn write_ex(&mut self, plaintext: &[u8]) -> io::Result<()> {
        let mut written = 0usize;
        // SAFETY: plaintext is valid for its length; written is a valid
        // out-pointer.
        let ret = unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_write_ex(
                self.ssl.as_ptr(),
                plaintext.as_ptr() as *const c_void,
                plaintext.len(),
                &mut written,
            )
        };
        if ret == 1 && written == plaintext.len() {
            return Ok(());
        }
        let code = self.error(ret);
        Err(self.describe("TLS write (SSL_write_ex)", ret, code))
    }

    /// The `socket` style: the whole of `plaintext` in ONE `SSL_write`, which
    /// encrypts and sends on the socket BIO before it returns (blocking
    /// socket, no partial writes: all or an error).
    pub fn write(&mut self, plaintext: &[u8]) -> io::Result<()> {
        let len = c_int::try_from(plaintext.len()).map_err(|_| invalid_len())?;
        // SAFETY: plaintext is valid for len bytes.
        let ret = unsafe {
            ffi::ERR_clear_error();
            ffi::SSL_write(self.ssl.as_ptr(), plaintext.as_ptr() as *const c_void, len)
        };
        if ret == len {
            return Ok(());
        }
        let code = self.error(ret);
        if code == ffi::SSL_ERROR_SYSCALL {
            let os = io::Error::last_os_error();
            if os.raw_os_error().is_some_and(|e| e != 0) {
                return Err(os);
            }
        }
        Err(self.describe("TLS write (SSL_write)", ret, code))
    }

    fn error(&self, ret: c_int) -> c_int {
        // SAFETY: a valid SSL and the return value of the call just made on it.
        unsafe { ffi::SSL_get_error(self.ssl.as_ptr(), ret) }
    }

    fn describe(&self, what: &str, ret: c_int, code: c_int) -> io::Error {
        let stack = ErrorStack::get();
        let kind = if code == ffi::SSL_ERROR_SYSCALL && stack.errors().is_empty() {
            io::ErrorKind::UnexpectedEof
        } else {
            io::ErrorKind::InvalidData
        };
        io::Error::new(
            kind,
            format!("{what} failed (return {ret}, SSL_get_error {code}): {stack}"),
        )
    }
}

fn tls_error(e: ErrorStack) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, format!("TLS: {e}"))
}

fn invalid_len() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, "TLS buffer larger than 2 GiB")
}

/// Whether OpenSSL's error queue is empty: an `SSL_ERROR_SYSCALL` with
/// nothing queued is a socket error or EOF, not a TLS failure.
fn no_queued_error() -> bool {
    // SAFETY: reads the calling thread's error queue without changing it.
    unsafe { ffi::ERR_peek_last_error() == 0 }
}
