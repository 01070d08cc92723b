//! The eventfd behind a handle's pollable descriptor (see `pollfd`): a leaf that the
//! handles hold, so that they need not import the entry points that hand it out.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};

use crate::error::{tc_result, Failure};

/// An eventfd: readable once signalled, until cleared.
#[derive(Debug)]
pub(crate) struct ReadyFd(OwnedFd);

impl AsRawFd for ReadyFd {
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.0.as_raw_fd()
    }
}

impl ReadyFd {
    pub(crate) fn new() -> Result<ReadyFd, Failure> {
        // SAFETY: eventfd takes no pointers; a negative return is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            let e = std::io::Error::last_os_error();
            return Err(Failure::new(tc_result::TC_ERR_OTHER, format!("cannot make an eventfd: {e}")));
        }
        // SAFETY: a new descriptor this process owns and nothing else holds.
        Ok(ReadyFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the descriptor readable (a full counter is readable already).
    pub(crate) fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to a descriptor this owns.
        let _ = unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Makes the descriptor unreadable until the next signal.
    pub(crate) fn clear(&self) {
        let mut count: u64 = 0;
        // SAFETY: reads 8 bytes into a live u64 from a descriptor this owns; a
        // non-blocking eventfd read returns EAGAIN when there is nothing to clear.
        let _ = unsafe { libc::read(self.0.as_raw_fd(), (&mut count as *mut u64).cast(), 8) };
    }
}

/// The descriptor of a handle, made at the first call that asks for it.
pub(crate) type ReadySlot = OnceLock<Arc<ReadyFd>>;
