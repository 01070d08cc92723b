//! A connected stream socket, driven directly: no tokio stream type, so a link
//! registers for exactly the readiness it waits for.
//!
//! A tokio stream registers every socket for both readable and writable events.
//! With edge-triggered epoll, each time a peer drains our data the kernel then
//! reports "writable" and wakes this process for nothing: one extra context switch
//! per message. A [`crate::StreamRoute`] registers each socket for readable only and
//! writes straight away, registering a duplicate for writable only while the kernel
//! buffer is full.

use std::collections::VecDeque;
use std::io::{self, IoSlice, Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Duration;

/// A connected, non-blocking stream socket.
#[derive(Debug)]
pub enum Socket {
    /// TCP.
    Tcp(std::net::TcpStream),
    /// A Unix stream socket.
    Unix(std::os::unix::net::UnixStream),
}

impl Socket {
    /// Reads into the room `buf` has past its end, without zeroing it first; the
    /// bytes read become part of `buf`, and payload files that came with them (Unix
    /// sockets) go to `files`.
    pub(crate) fn read_into_spare(
        &self,
        buf: &mut bytes::BytesMut,
        files: &mut VecDeque<OwnedFd>,
    ) -> io::Result<usize> {
        let spare = buf.spare_capacity_mut();
        let (at, room) = (spare.as_mut_ptr().cast::<u8>(), spare.len());
        let n = match self {
            Socket::Unix(s) => crate::shared_payload::recv_into(s.as_raw_fd(), at, room, files)?,
            Socket::Tcp(_) => {
                #[allow(unsafe_code)]
                // SAFETY: read(2) writes at most `room` bytes at `at`, the start of
                // `buf`'s spare room: allocated, writable and not aliased while `buf`
                // is borrowed; the descriptor stays open while `self` is borrowed.
                let n = unsafe { libc::read(self.as_raw_fd(), at.cast(), room) };
                usize::try_from(n).map_err(|_| io::Error::last_os_error())?
            }
        };
        #[allow(unsafe_code)]
        // SAFETY: the read initialized the first `n` bytes of the spare room, and
        // `n <= room`, so the new length is within the capacity.
        unsafe {
            buf.set_len(buf.len() + n)
        };
        Ok(n)
    }

    /// Reads into `buf`; payload files that came with the bytes (Unix sockets) go to `files`.
    pub(crate) fn read_with_fds(&self, buf: &mut [u8], files: &mut VecDeque<OwnedFd>) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => crate::shared_payload::recv_with_fds(s.as_raw_fd(), buf, files),
            Socket::Tcp(s) => (&*s).read(buf),
        }
    }

    /// Writes `bufs` with the descriptors `fds` beside them: Unix sockets only.
    pub(crate) fn send_with_fds(&self, bufs: &[IoSlice<'_>], fds: &[RawFd]) -> io::Result<usize> {
        match self {
            Socket::Unix(s) => crate::shared_payload::send_with_fds(s.as_raw_fd(), bufs, fds),
            Socket::Tcp(_) => {
                Err(io::Error::new(io::ErrorKind::Unsupported, "a TCP link cannot carry descriptors"))
            }
        }
    }

    /// True for a Unix socket, which can carry descriptors.
    pub(crate) fn is_unix(&self) -> bool {
        matches!(self, Socket::Unix(_))
    }

    pub(crate) fn write_vectored(&self, bufs: &[IoSlice<'_>]) -> io::Result<usize> {
        match self {
            Socket::Tcp(s) => (&*s).write_vectored(bufs),
            Socket::Unix(s) => (&*s).write_vectored(bufs),
        }
    }

    /// This end's and the peer's IP addresses; `None` for a Unix socket (both ends
    /// on this host).
    ///
    /// # Errors
    /// The OS could not say (the connection is gone).
    pub fn ip_ends(&self) -> io::Result<Option<(std::net::IpAddr, std::net::IpAddr)>> {
        match self {
            Socket::Tcp(s) => Ok(Some((s.local_addr()?.ip(), s.peer_addr()?.ip()))),
            Socket::Unix(_) => Ok(None),
        }
    }

    pub(crate) fn try_clone(&self) -> io::Result<Socket> {
        Ok(match self {
            Socket::Tcp(s) => Socket::Tcp(s.try_clone()?),
            Socket::Unix(s) => Socket::Unix(s.try_clone()?),
        })
    }

    pub(crate) fn shutdown(&self, how: std::net::Shutdown) {
        let _ = match self {
            Socket::Tcp(s) => s.shutdown(how),
            Socket::Unix(s) => s.shutdown(how),
        };
    }

    /// Bytes written that the peer has not acknowledged yet (always 0 for a Unix
    /// socket, which hands written bytes to the peer at once).
    ///
    /// A process that exits while its TCP socket holds unread data makes the kernel
    /// reset the connection, and a reset throws away what the peer had not
    /// acknowledged: a last flush waits for this to reach 0 first.
    pub(crate) fn unacknowledged(&self) -> io::Result<usize> {
        let Socket::Tcp(_) = self else { return Ok(0) };
        let mut bytes: libc::c_int = 0;
        #[allow(unsafe_code)]
        // SAFETY: SIOCOUTQ (Linux defines it as TIOCOUTQ) on a socket stores one int
        // through the pointer, which points to a live, writable c_int; the descriptor
        // stays open while `self` is borrowed.
        let rc = unsafe { libc::ioctl(self.as_raw_fd(), libc::TIOCOUTQ, &mut bytes) };
        if rc < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(usize::try_from(bytes).unwrap_or(0))
    }

    /// Makes writes block, for at most `limit` each (a last flush before exit).
    pub(crate) fn block_writes(&self, limit: Duration) -> io::Result<()> {
        match self {
            Socket::Tcp(s) => {
                s.set_nonblocking(false)?;
                s.set_write_timeout(Some(limit))
            }
            Socket::Unix(s) => {
                s.set_nonblocking(false)?;
                s.set_write_timeout(Some(limit))
            }
        }
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
