//! Sockets driven directly, so a link registers for exactly the readiness it waits for.
//!
//! A tokio stream registers every socket for both readable and writable
//! events. With edge-triggered epoll, each time a peer drains our data the
//! kernel then reports "writable" and wakes this process for nothing: one
//! extra context switch per message. Here the reader registers for readable
//! only, and the writer writes straight away, registering a duplicate of the
//! socket for writable only while the kernel buffer is full.

use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

/// Bytes read per syscall at most.
const READ_CHUNK: usize = 16 << 10;

/// A connected, non-blocking stream socket.
#[derive(Debug)]
pub enum Socket {
    /// TCP.
    Tcp(std::net::TcpStream),
    /// A Unix stream socket.
    Unix(std::os::unix::net::UnixStream),
}

impl Socket {
    fn read(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&*s).read(buf),
            Socket::Unix(s) => (&*s).read(buf),
        }
    }

    fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&*s).write_vectored(bufs),
            Socket::Unix(s) => (&*s).write_vectored(bufs),
        }
    }

    /// Whether the peer has acknowledged every byte written: `Some(true)` yes (always
    /// for a Unix socket, which hands written bytes to the peer at once), `Some(false)`
    /// not yet, `None` never (the connection failed).
    fn all_acknowledged(&self) -> Option<bool> {
        let Socket::Tcp(tcp) = self else { return Some(true) };
        match (tcp.take_error(), self.unacknowledged()) {
            (Ok(None), Ok(0)) => Some(true),
            (Ok(None), Ok(_)) => Some(false),
            _ => None,
        }
    }

    /// Bytes written to this TCP socket that the peer has not acknowledged yet.
    #[allow(unsafe_code)]
    fn unacknowledged(&self) -> io::Result<usize> {
        let mut bytes: libc::c_int = 0;
        // SAFETY: SIOCOUTQ (Linux defines it as TIOCOUTQ) on a socket stores one int
        // through the pointer, which points to a live, writable c_int; the descriptor
        // stays open while `self` is borrowed.
        let rc = unsafe { libc::ioctl(self.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(usize::try_from(bytes).unwrap_or(0))
    }

    fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }

    fn shutdown_both(&self) {
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(std::net::Shutdown::Both),
            Socket::Unix(s) => s.shutdown(std::net::Shutdown::Both),
        };
    }

    fn shutdown_write(&self) {
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(std::net::Shutdown::Write),
            Socket::Unix(s) => s.shutdown(std::net::Shutdown::Write),
        };
    }
}

impl AsRawFd for Socket {
    fn as_raw_fd(&self) -> RawFd {
        match self {
            Socket::Tcp(s) => s.as_raw_fd(),
            Socket::Unix(s) => s.as_raw_fd(),
        }
    }
}

/// Where a link's reader gets bytes from.
pub(crate) trait ByteSource: Send + 'static {
    /// Appends at least one byte to `buf`, or returns 0 at end of stream.
    fn read_some(
        &mut self,
        buf: &mut BytesMut,
    ) -> impl std::future::Future<Output = io::Result<usize>> + Send;
}

/// Where a link's writer puts bytes.
pub(crate) trait ByteSink: Send + 'static {
    /// Writes some of `bufs`, returning how many bytes were taken.
    fn write_some(
        &mut self,
        bufs: &[IoSlice<'_>],
    ) -> impl std::future::Future<Output = io::Result<usize>> + Send;
    /// Signals end of stream to the peer.
    fn finish(&mut self) -> impl std::future::Future<Output = ()> + Send;
    /// Closes the connection both ways after a failure.
    fn abort(&mut self) {}
    /// After [`ByteSink::finish`]: waits up to `limit` until the peer has acknowledged
    /// every byte; false when it did not (or cannot tell).
    fn confirm(&mut self, limit: Duration) -> impl std::future::Future<Output = bool> + Send {
        let _ = limit;
        std::future::ready(false)
    }
    /// Writes some of `bufs` outside any runtime, blocking the thread while the kernel
    /// buffer is full, until `deadline`.
    fn write_blocking(&mut self, bufs: &[IoSlice<'_>], deadline: Instant) -> io::Result<usize> {
        let _ = (bufs, deadline);
        Err(io::ErrorKind::Unsupported.into())
    }
    /// Signals end of stream and waits, blocking the thread until `deadline`, until the
    /// peer has acknowledged every byte; false when it did not (or cannot tell).
    fn finish_blocking(&mut self, deadline: Instant) -> bool {
        let _ = deadline;
        false
    }
}

/// How often the acknowledgement of the last bytes is checked.
const CONFIRM_POLL: Duration = Duration::from_millis(1);

/// The reading side of a [`Socket`], registered for readable events only.
pub(crate) struct SocketReader {
    fd: AsyncFd<Arc<Socket>>,
}

thread_local! {
    // One read buffer per thread, not per link: a comm node with many children
    // stays small. It is borrowed only for the duration of one read syscall.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> = std::cell::RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
}

/// The writing side of a [`Socket`].
pub(crate) struct SocketWriter {
    sock: Arc<Socket>,
}

/// Registers a socket with the reactor for `interest` only.
#[allow(unsafe_code)]
fn register(sock: Arc<Socket>, interest: Interest) -> io::Result<AsyncFd<Arc<Socket>>> {
    // SAFETY: the `Socket` owns its file descriptor and closes it only when dropped;
    // the `AsyncFd` holds an `Arc` to it, so the descriptor stays open and keeps
    // referring to the same socket for as long as the registration exists, and
    // `as_raw_fd` always returns that same descriptor.
    Ok(unsafe { AsyncFd::register_with_interest(sock, interest) }?)
}

/// Splits a socket for a link's two tasks.
///
/// # Errors
/// The socket could not be registered with the reactor (must run inside tokio).
pub(crate) fn split(sock: Socket) -> io::Result<(SocketReader, SocketWriter)> {
    let sock = Arc::new(sock);
    let fd = register(sock.clone(), Interest::READABLE)?;
    Ok((SocketReader { fd }, SocketWriter { sock }))
}

impl ByteSource for SocketReader {
    async fn read_some(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        loop {
            let mut guard = self.fd.readable().await?;
            let result = SCRATCH.with(|scratch| {
                let mut scratch = scratch.borrow_mut();
                guard.try_io(|inner| {
                    let n = inner.get_ref().read(&mut scratch)?;
                    buf.extend_from_slice(&scratch[..n]);
                    Ok((n, n < scratch.len()))
                })
            });
            match result {
                Ok(Ok((n, drained))) => {
                    // A short read drained the socket: edge-triggered epoll will report new data.
                    if drained {
                        guard.clear_ready();
                    }
                    return Ok(n);
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Err(e),
                Err(_would_block) => continue,
            }
        }
    }
}

impl ByteSink for SocketWriter {
    async fn write_some(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        loop {
            match self.sock.write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    // Full kernel buffer: wait for room on a duplicate registered for writable only.
                    let waiter = register(Arc::new(self.sock.try_clone()?), Interest::WRITABLE)?;
                    let _ready = waiter.writable().await?;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    async fn finish(&mut self) {
        self.sock.shutdown_write();
    }

    fn abort(&mut self) {
        self.sock.shutdown_both();
    }

    async fn confirm(&mut self, limit: Duration) -> bool {
        let deadline = Instant::now() + limit;
        loop {
            match self.sock.all_acknowledged() {
                Some(true) => return true,
                Some(false) if Instant::now() < deadline => tokio::time::sleep(CONFIRM_POLL).await,
                _ => return false,
            }
        }
    }

    fn write_blocking(&mut self, bufs: &[IoSlice<'_>], deadline: Instant) -> io::Result<usize> {
        loop {
            match self.sock.write_vectored(bufs) {
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if Instant::now() >= deadline {
                        return Err(io::ErrorKind::TimedOut.into());
                    }
                    std::thread::sleep(CONFIRM_POLL);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }

    fn finish_blocking(&mut self, deadline: Instant) -> bool {
        self.sock.shutdown_write();
        loop {
            match self.sock.all_acknowledged() {
                Some(true) => return true,
                Some(false) if Instant::now() < deadline => std::thread::sleep(CONFIRM_POLL),
                _ => return false,
            }
        }
    }
}

/// Adapts any tokio reader (tests use in-memory pipes).
pub(crate) struct TokioReader<R>(pub(crate) R);
/// Adapts any tokio writer.
pub(crate) struct TokioWriter<W>(pub(crate) W);

impl<R: tokio::io::AsyncRead + Unpin + Send + 'static> ByteSource for TokioReader<R> {
    async fn read_some(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(READ_CHUNK);
        }
        tokio::io::AsyncReadExt::read_buf(&mut self.0, buf).await
    }
}

impl<W: tokio::io::AsyncWrite + Unpin + Send + 'static> ByteSink for TokioWriter<W> {
    async fn write_some(&mut self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        tokio::io::AsyncWriteExt::write_vectored(&mut self.0, bufs).await
    }

    async fn finish(&mut self) {
        let _ = tokio::io::AsyncWriteExt::shutdown(&mut self.0).await;
    }
}
