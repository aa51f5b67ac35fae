//! The client side, for `sqlclient`: the openssl crate's safe `SslStream`
//! over a [`Wire`], which carries the TDS 7.x handshake inside PRELOGIN
//! packets and passes TLS records through raw afterwards. No certificate
//! check, as with TrustServerCertificate=yes.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant, SystemTime};

use openssl::ssl::{Ssl, SslContext, SslMethod, SslStream, SslVerifyMode, SslVersion};

use super::ALPN_TDS_8;
use crate::tds::{self, DEFAULT_PACKET_SIZE, packet_type};

/// The socket as TLS (or cleartext TDS) sees it, with an absolute deadline
/// for reads: a server that trickles bytes still times out.
pub struct Wire {
    tcp: TcpStream,
    pub deadline: Instant,
    /// Handshake of TDS 7.x: writes are collected and sent as one PRELOGIN
    /// message at each flush (the end of a TLS flight), reads come from
    /// PRELOGIN messages' payloads.
    wrapping: bool,
    out: Vec<u8>,
    input: Vec<u8>,
    input_pos: usize,
    /// When the kernel received the data of the last read (SO_TIMESTAMPNS):
    /// when a response reached this host, however late this thread ran.
    pub last_arrival: Option<SystemTime>,
}

impl Wire {
    pub fn new(tcp: TcpStream, deadline: Instant) -> Wire {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt on an open socket with an int option of its size.
        // A kernel that refuses it leaves `last_arrival` None.
        unsafe {
            libc::setsockopt(
                tcp.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_TIMESTAMPNS,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        Wire {
            tcp,
            deadline,
            wrapping: false,
            out: Vec::new(),
            input: Vec::new(),
            input_pos: 0,
            last_arrival: None,
        }
    }

    pub fn tcp(&self) -> &TcpStream {
        &self.tcp
    }

    fn read_raw(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let timed_out = || io::Error::new(io::ErrorKind::TimedOut, "no complete response in time");
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(timed_out());
        }
        self.tcp.set_read_timeout(Some(left))?;
        match self.recv_stamped(buf) {
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Err(timed_out()),
            r => r,
        }
    }

    /// `read`, with the kernel's receive time of what it returned: recvmsg
    /// and its SCM_TIMESTAMPNS message, which std's TcpStream does not give.
    fn recv_stamped(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut iov = libc::iovec {
            iov_base: buf.as_mut_ptr().cast(),
            iov_len: buf.len(),
        };
        let mut control = [0u64; 8];
        // SAFETY: msghdr is plain data; every pointer in it is to a live local.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: recvmsg writes at most iov_len bytes to buf and
        // msg_controllen bytes to control.
        let n = unsafe { libc::recvmsg(self.tcp.as_raw_fd(), &mut msg, 0) };
        if n < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: the CMSG_* walk stays within msg_controllen, as recvmsg set it.
        unsafe {
            let mut cmsg = libc::CMSG_FIRSTHDR(&msg);
            while !cmsg.is_null() {
                if (*cmsg).cmsg_level == libc::SOL_SOCKET
                    && (*cmsg).cmsg_type == libc::SCM_TIMESTAMPNS
                {
                    let ts =
                        std::ptr::read_unaligned(libc::CMSG_DATA(cmsg).cast::<libc::timespec>());
                    self.last_arrival = Some(
                        SystemTime::UNIX_EPOCH + Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32),
                    );
                }
                cmsg = libc::CMSG_NXTHDR(&msg, cmsg);
            }
        }
        Ok(n as usize)
    }
}

/// Reads through the deadline (for `tds::read_message` on the raw wire).
struct Raw<'a>(&'a mut Wire);

impl Read for Raw<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.0.read_raw(buf)
    }
}

impl Read for Wire {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if !self.wrapping {
            return self.read_raw(buf);
        }
        if self.input_pos == self.input.len() {
            let msg = tds::read_message(&mut Raw(self))?.ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "server closed during the TLS handshake",
                )
            })?;
            if msg.packet_type != packet_type::PRELOGIN {
                return Err(tds::invalid(format!(
                    "packet type {:#04x} during the TLS handshake",
                    msg.packet_type
                )));
            }
            self.input = msg.payload;
            self.input_pos = 0;
        }
        let n = buf.len().min(self.input.len() - self.input_pos);
        buf[..n].copy_from_slice(&self.input[self.input_pos..self.input_pos + n]);
        self.input_pos += n;
        Ok(n)
    }
}

impl Write for Wire {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if self.wrapping {
            self.out.extend_from_slice(buf);
            Ok(buf.len())
        } else {
            self.tcp.write(buf)
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.wrapping && !self.out.is_empty() {
            let out = std::mem::take(&mut self.out);
            tds::write_message(
                &mut self.tcp,
                packet_type::PRELOGIN,
                0,
                &out,
                DEFAULT_PACKET_SIZE,
            )?;
        }
        self.tcp.flush()
    }
}

/// A client context: no verification; TLS 1.2 at most for TDS 7.x, ALPN
/// `tds/8.0` for strict.
fn context(strict: bool) -> io::Result<SslContext> {
    let build = || -> Result<SslContext, openssl::error::ErrorStack> {
        let mut b = SslContext::builder(SslMethod::tls_client())?;
        b.set_verify(SslVerifyMode::NONE);
        b.set_min_proto_version(Some(SslVersion::TLS1_2))?;
        if strict {
            b.set_alpn_protos(ALPN_TDS_8)?;
        } else {
            b.set_max_proto_version(Some(SslVersion::TLS1_2))?;
        }
        Ok(b.build())
    };
    build().map_err(|e| io::Error::other(format!("TLS context: {e}")))
}

/// The TDS 7.x handshake, inside PRELOGIN packets, after the PRELOGIN
/// exchange agreed on encryption. Raw TLS records from then on.
pub fn connect_wrapped(mut wire: Wire) -> io::Result<SslStream<Wire>> {
    wire.wrapping = true;
    let mut s = handshake(wire, false)?;
    let w = s.get_mut();
    if w.input_pos != w.input.len() {
        return Err(tds::invalid(
            "server sent more than its handshake in PRELOGIN packets",
        ));
    }
    w.wrapping = false;
    Ok(s)
}

/// TDS 8.0 strict: TLS first thing on the connection.
pub fn connect_strict(wire: Wire) -> io::Result<SslStream<Wire>> {
    handshake(wire, true)
}

fn handshake(wire: Wire, strict: bool) -> io::Result<SslStream<Wire>> {
    let ctx = context(strict)?;
    let tls_err = |e: openssl::error::ErrorStack| io::Error::other(format!("TLS: {e}"));
    let mut ssl = Ssl::new(&ctx).map_err(tls_err)?;
    ssl.set_connect_state();
    let mut s = SslStream::new(ssl, wire).map_err(tls_err)?;
    s.connect().map_err(|e| match e.into_io_error() {
        Ok(io) => io,
        Err(e) => io::Error::new(
            io::ErrorKind::InvalidData,
            format!("TLS handshake failed: {e}"),
        ),
    })?;
    Ok(s)
}
