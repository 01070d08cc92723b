//! A descriptor a tool's own `poll`/`select`/`epoll` loop waits on beside its other
//! descriptors: an eventfd the network's task signals whenever a packet or an event
//! arrives, and when the tree ends.

use std::ffi::c_int;
use std::os::fd::AsRawFd;
use std::sync::Arc;

use crate::backend::tc_backend;
use crate::error::{guard, tc_result, Failure};
use crate::ffi::{arg, out_ok, put};
use crate::network::tc_network;
use crate::readyfd::{ReadyFd, ReadySlot};
use crate::stream::tc_stream;

/// The slot's descriptor; `install` hands a new one's signal to the handle, and
/// `queued` says whether something came before the hook was there.
fn descriptor(
    slot: &ReadySlot,
    install: impl FnOnce(Arc<ReadyFd>),
    queued: impl FnOnce() -> bool,
) -> Result<c_int, Failure> {
    if let Some(fd) = slot.get() {
        return Ok(fd.as_raw_fd());
    }
    let fd = Arc::new(ReadyFd::new()?);
    if slot.set(fd.clone()).is_ok() {
        install(fd.clone());
        if queued() {
            fd.signal();
        }
    }
    slot.get().map(|f| f.as_raw_fd()).ok_or_else(|| Failure::new(tc_result::TC_ERR_OTHER, "no descriptor"))
}

/// A descriptor that becomes readable when a packet (on any stream) or an event
/// arrives, and when the tree ends; it stays the network's (do not close it). When it
/// polls readable: call `tc_network_fd_clear`, then receive with a time limit of 0 on
/// every stream and `tc_network_next_event` until each says `TC_ERR_AGAIN`.
///
/// # Safety
/// `net` is NULL or live; `fd` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_network_fd(net: *const tc_network, fd: *mut c_int) -> tc_result {
    guard("tc_network_fd", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        out_ok(fd, "fd")?;
        // Something may have come before the hook was there: the tool looks once.
        let raw = descriptor(&n.ready, |f| n.net.on_ready(move || f.signal()), || true)?;
        // SAFETY: checked not NULL.
        unsafe { put(fd, raw) };
        Ok(())
    })
}

/// Makes the network's descriptor unreadable until something new arrives; call it
/// before the receives that follow a wake-up, so that nothing arriving meanwhile is missed.
///
/// # Safety
/// `net` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_network_fd_clear(net: *const tc_network) -> tc_result {
    guard("tc_network_fd_clear", || {
        // SAFETY: as the caller promised.
        let n = unsafe { arg(net, "net") }?;
        n.ready.get().inspect(|f| f.clear());
        Ok(())
    })
}

/// A back-end's descriptor: readable when a packet arrives and when the tree ends;
/// used as `tc_network_fd` is, with `tc_backend_fd_clear` and `tc_backend_recv`.
///
/// # Safety
/// `be` is NULL or live; `fd` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_fd(be: *const tc_backend, fd: *mut c_int) -> tc_result {
    guard("tc_backend_fd", || {
        // SAFETY: as the caller promised.
        let b = unsafe { arg(be, "be") }?;
        out_ok(fd, "fd")?;
        // The back-end's receiving task signals it once each packet is there to take.
        let raw = descriptor(&b.ready, |_| {}, || true)?;
        // SAFETY: checked not NULL.
        unsafe { put(fd, raw) };
        Ok(())
    })
}

/// Makes the back-end's descriptor unreadable until something new arrives.
///
/// # Safety
/// `be` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_fd_clear(be: *const tc_backend) -> tc_result {
    guard("tc_backend_fd_clear", || {
        // SAFETY: as the caller promised.
        let b = unsafe { arg(be, "be") }?;
        b.ready.get().inspect(|f| f.clear());
        Ok(())
    })
}

/// A stream's own descriptor: readable once a packet for this stream is queued (and
/// when the stream or the tree ends), so that a `poll` loop over several streams
/// learns which one has data; it stays the stream's (do not close it; it is closed
/// when the stream is freed and nothing polls it). When it polls readable: call
/// `tc_stream_fd_clear`, then `tc_stream_recv` with a time limit of 0 until it says
/// `TC_ERR_AGAIN`.
///
/// # Safety
/// `stream` is NULL or live; `fd` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_fd(stream: *const tc_stream, fd: *mut c_int) -> tc_result {
    guard("tc_stream_fd", || {
        // SAFETY: as the caller promised.
        let s = unsafe { arg(stream, "stream") }?;
        out_ok(fd, "fd")?;
        let raw = descriptor(&s.ready, |f| s.sender.on_ready(move || f.signal()), || s.sender.has_queued())?;
        // SAFETY: checked not NULL.
        unsafe { put(fd, raw) };
        Ok(())
    })
}

/// Makes the stream's descriptor unreadable until the next packet for it is queued;
/// if packets for it are still queued, it stays readable (so a loop that takes one
/// packet per wake-up misses none). Call it before the receives that follow a wake-up.
///
/// # Safety
/// `stream` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_stream_fd_clear(stream: *const tc_stream) -> tc_result {
    guard("tc_stream_fd_clear", || {
        // SAFETY: as the caller promised.
        let s = unsafe { arg(stream, "stream") }?;
        if let Some(f) = s.ready.get() {
            f.clear();
            if s.sender.has_queued() {
                f.signal();
            }
        }
        Ok(())
    })
}
