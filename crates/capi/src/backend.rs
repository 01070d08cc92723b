//! The back-end: joining the tree, receiving on any stream, sending up, leaving.

use std::ffi::c_char;

use tokio::sync::Mutex as AsyncMutex;
use treecast_api::{BackEnd, BackEndEvent, BackEndSender, Packet};
use treecast_files::{FileReceivers, FileWorker};

use crate::error::{guard, quiet, tc_result, Failure};
use crate::ffi::{
    arg, block_on, block_on_for, handle, opt_text, out_ok, put, ran_out, send_within, take, text,
};
use crate::packet::tc_packet;
use crate::pollfd::ReadySlot;
use crate::values::{from_c, tc_value};
use std::sync::atomic::{AtomicU64, Ordering};

/// A back-end's connection to the tree. Sends and receives may run from several
/// threads at once (receives take turns); `tc_backend_close` or `tc_backend_free`
/// must be the last call. Freeing without closing still writes what was sent.
#[allow(non_camel_case_types)]
pub struct tc_backend {
    sender: BackEndSender,
    rank: u32,
    receiver: AsyncMutex<Receiving>,
    /// The descriptor of `tc_backend_fd`, once asked for.
    pub(crate) ready: ReadySlot,
    /// How long a blocking send waits for room, milliseconds.
    send_limit_ms: AtomicU64,
}

impl tc_backend {
    /// Calls `hook` whenever a packet arrives, and at the end.
    pub(crate) fn on_ready(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.sender.on_ready(hook);
    }
}

/// What receiving needs: the link, and the writer of files pushed to this back-end.
struct Receiving {
    be: Option<BackEnd>,
    /// Started with the first file transfer; it writes on a thread of its own.
    files: Option<FileWorker>,
}

impl Receiving {
    /// The next packet for the tool; file transfers are handled on the way.
    async fn next(&mut self) -> Result<Packet, Failure> {
        let Some(be) = self.be.as_mut() else {
            return Err(Failure::new(tc_result::TC_ERR_CLOSED, "the back-end was closed"));
        };
        loop {
            match be.next_event().await? {
                BackEndEvent::Packet(p) if FileReceivers::handles(p.tag()) => {
                    let worker = match self.files.as_mut() {
                        Some(w) => w,
                        None => self.files.insert(start_file_worker(be)?),
                    };
                    worker.packet(p).await?;
                }
                BackEndEvent::Packet(p) => return Ok(p),
                BackEndEvent::StreamClosed(id) => {
                    // A transfer the front-end gave up on leaves no temporary file behind.
                    if let Some(files) = &self.files {
                        files.stream_closed(id).await?;
                    }
                }
                _ => {}
            }
        }
    }
}

/// Starts the file-writing thread and the task that sends its answers up.
fn start_file_worker(be: &BackEnd) -> Result<FileWorker, Failure> {
    let mut files = FileWorker::start(be.rank())?;
    let mut answers = files.take_answers();
    let answering = be.sender();
    tokio::spawn(async move {
        while let Some(a) = answers.recv().await {
            if let Err(e) = answering.send(a.stream, a.tag, a.format, &a.values).await {
                tracing::warn!("could not answer a file transfer: {e}");
            }
        }
    });
    Ok(files)
}

fn wrap(be: BackEnd) -> tc_backend {
    tc_backend {
        sender: be.sender(),
        rank: be.rank(),
        receiver: AsyncMutex::new(Receiving { be: Some(be), files: None }),
        ready: ReadySlot::new(),
        send_limit_ms: AtomicU64::new(crate::ffi::TC_DEFAULT_SEND_TIMEOUT_MS),
    }
}

/// How long `tc_backend_send` waits for room in its stream's window before it fails
/// with `TC_ERR_TIMEOUT`, sending nothing (`TC_FOREVER`: as long as it takes; default 60 s).
///
/// # Safety
/// `be` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_set_send_timeout(be: *const tc_backend, ms: u64) -> tc_result {
    guard("tc_backend_set_send_timeout", || {
        // SAFETY: as the caller promised.
        unsafe { arg(be, "be") }?.send_limit_ms.store(ms, Ordering::Relaxed);
        Ok(())
    })
}

/// Joins the tree as a back-end treecast launched (its environment says where).
///
/// # Safety
/// `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_connect(out: *mut *mut tc_backend) -> tc_result {
    guard("tc_backend_connect", || {
        out_ok(out, "out")?;
        let be = block_on(BackEnd::connect())??;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(wrap(be))) };
        Ok(())
    })
}

/// Joins a tree launched in attach mode, through its attach file (`file`, or NULL for
/// `TREECAST_ATTACH`), as `rank` (negative: from the launcher's environment, such as
/// `TREECAST_RANK`, `OMPI_COMM_WORLD_RANK`, `PMI_RANK` or `SLURM_PROCID`).
///
/// # Safety
/// `file` is NULL or NUL-terminated; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_attach(
    file: *const c_char,
    rank: i64,
    out: *mut *mut tc_backend,
) -> tc_result {
    guard("tc_backend_attach", || {
        // SAFETY: as the caller promised.
        let file = unsafe { opt_text(file, "file") }?;
        out_ok(out, "out")?;
        let rank = match rank {
            r if r < 0 => None,
            r => Some(u32::try_from(r).map_err(|_| {
                Failure::new(
                    tc_result::TC_ERR_RANGE,
                    format!("rank {r} is past the largest rank, {}", u32::MAX),
                )
            })?),
        };
        let be = block_on(BackEnd::attach(file.map(std::path::Path::new), rank))??;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(wrap(be))) };
        Ok(())
    })
}

/// This back-end's rank (`UINT32_MAX` for NULL).
///
/// # Safety
/// `be` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_rank(be: *const tc_backend) -> u32 {
    // SAFETY: as the caller promised.
    quiet(u32::MAX, || unsafe { be.as_ref() }.map_or(u32::MAX, |b| b.rank))
}

/// The number of back-ends in the network (0 for NULL).
///
/// # Safety
/// `be` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_size(be: *const tc_backend) -> u32 {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { be.as_ref() }.map_or(0, |b| b.sender.size()))
}

/// Waits up to `timeout_ms` (0: do not wait; `TC_FOREVER`) for the next packet on any
/// stream; `tc_packet_stream` says which. `TC_ERR_CLOSED` once the tree is over.
///
/// # Safety
/// `be` is NULL or live; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_recv(
    be: *const tc_backend,
    timeout_ms: u64,
    out: *mut *mut tc_packet,
) -> tc_result {
    guard("tc_backend_recv", || {
        // SAFETY: as the caller promised.
        let b = unsafe { arg(be, "be") }?;
        out_ok(out, "out")?;
        let packet = block_on_for(timeout_ms, async { b.receiver.lock().await.next().await })?
            .ok_or_else(|| ran_out(timeout_ms, "packet"))??;
        let p = tc_packet::new(packet)?;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(p)) };
        Ok(())
    })
}

/// Sends `values[0..count]`, typed as `format` says, up `stream`; waits while the
/// stream's window is full. Values the stream's filter cannot take are refused here.
///
/// # Safety
/// `be` is NULL or live; `format` is NULL or NUL-terminated; `values` points to
/// `count` values valid as `tc_value` says.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_send_values(
    be: *const tc_backend,
    stream: u32,
    tag: i32,
    format: *const c_char,
    values: *const tc_value,
    count: usize,
) -> tc_result {
    guard("tc_backend_send_values", || {
        // SAFETY: as the caller promised.
        let (b, format) = unsafe { (arg(be, "be")?, text(format, "format")?) };
        // SAFETY: as the caller promised.
        let values = unsafe { from_c(format, values, count) }?;
        send_within(b.send_limit_ms.load(Ordering::Relaxed), b.sender.send(stream, tag, format, &values))
    })
}

/// Leaves the tree in order (the front-end sees the rank leave, not fail) after what
/// was sent is delivered, and frees the back-end; NULL is ignored.
///
/// # Safety
/// `be` is NULL or a back-end not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_close(be: *mut tc_backend) -> tc_result {
    guard("tc_backend_close", || {
        // SAFETY: as the caller promised.
        let Some(b) = (unsafe { take(be) }) else { return Ok(()) };
        let Receiving { be, files } = b.receiver.into_inner();
        // Unfinished transfers remove their temporary files before the back-end goes.
        drop(files);
        if let Some(be) = be {
            block_on(be.close())?;
        }
        Ok(())
    })
}

/// Frees the back-end without leaving in order (what was sent is still written, and
/// the front-end reports the rank lost); NULL is ignored. Prefer `tc_backend_close`.
///
/// # Safety
/// `be` is NULL or a back-end not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_free(be: *mut tc_backend) {
    // SAFETY: as the caller promised.
    quiet((), || drop(unsafe { take(be) }));
}
