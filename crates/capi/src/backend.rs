//! The back-end: joining the tree, receiving on any stream, sending up, leaving.

use std::ffi::c_char;

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot, Mutex as AsyncMutex};
use tokio::task::JoinHandle;
use treecast_api::{BackEnd, BackEndEvent, BackEndSender, Packet};
use treecast_files::{FileReceivers, FileWorker};

use crate::error::{guard, quiet, tc_result, Failure};
use crate::ffi::{
    arg, block_on, block_on_for, handle, opt_text, out_ok, put, ran_out, send_now_or_within, take,
    took_without_waiting,
};
use crate::packet::tc_packet;
use crate::readyfd::ReadySlot;
use crate::values::{encode_c, parse_c, tc_value};
use std::sync::atomic::{AtomicU64, Ordering};

/// A back-end's connection to the tree. Sends and receives may run from several
/// threads at once (receives take turns); `tc_backend_close` or `tc_backend_free`
/// must be the last call. Freeing without closing still writes what was sent.
#[allow(non_camel_case_types)]
pub struct tc_backend {
    sender: BackEndSender,
    rank: u32,
    /// The tool's packets, as the receiving task hands them over.
    packets: AsyncMutex<mpsc::Receiver<Result<Packet, Failure>>>,
    /// Tells the receiving task to stop and hand the link back.
    stop: Option<oneshot::Sender<()>>,
    /// The receiving task: it gives back the link and the file writer when stopped.
    task: Option<JoinHandle<(BackEnd, Option<FileWorker>)>>,
    /// The descriptor of `tc_backend_fd`, once asked for.
    pub(crate) ready: Arc<ReadySlot>,
    /// How long a blocking send waits for room, milliseconds.
    send_limit_ms: AtomicU64,
    /// Streams the front-end closed, oldest first, until `tc_backend_next_closed` takes them.
    closed: Arc<std::sync::Mutex<std::collections::VecDeque<u32>>>,
}

/// Packets the receiving task holds for the tool before it stops reading the link.
const HANDED_OVER: usize = 64;

/// Reads the link for as long as the back-end lives: file transfers are written on
/// the way (never cancelled half-way, whatever the tool's time limits), the tool's
/// packets go to `out`, and the descriptor is signalled after each one is there.
async fn receive(
    mut be: BackEnd,
    out: mpsc::Sender<Result<Packet, Failure>>,
    ready: Arc<ReadySlot>,
    closed: Arc<std::sync::Mutex<std::collections::VecDeque<u32>>>,
    mut stop: oneshot::Receiver<()>,
) -> (BackEnd, Option<FileWorker>) {
    let mut files: Option<FileWorker> = None;
    let signal = || ready.get().inspect(|fd| fd.signal());
    loop {
        let event = tokio::select! {
            e = be.next_event() => e,
            _ = &mut stop => break,
        };
        let handed = match event {
            Ok(BackEndEvent::Packet(p)) if FileReceivers::handles(p.tag()) => {
                match on_file_packet(&be, &mut files, p).await {
                    Ok(()) => continue,
                    Err(f) => Err(f),
                }
            }
            Ok(BackEndEvent::Packet(p)) => Ok(p),
            Ok(BackEndEvent::StreamClosed(id)) => {
                // A transfer the front-end gave up on leaves no temporary file behind.
                if let Some(w) = &files {
                    if let Err(e) = w.stream_closed(id).await {
                        tracing::warn!("the file writer is gone: {e}");
                    }
                }
                closed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).push_back(id);
                signal();
                continue;
            }
            Ok(_) => continue,
            Err(e) => Err(Failure::from(e)),
        };
        let over = handed.is_err();
        tokio::select! {
            sent = out.send(handed) => if sent.is_err() { break },
            _ = &mut stop => break,
        }
        signal();
        if over {
            break;
        }
    }
    // The end (or a closed link) must wake a tool waiting on the descriptor too.
    signal();
    (be, files)
}

/// Hands a file-protocol packet to the writer, starting it with the first one.
async fn on_file_packet(be: &BackEnd, files: &mut Option<FileWorker>, p: Packet) -> Result<(), Failure> {
    let worker = match files.as_mut() {
        Some(w) => w,
        None => files.insert(start_file_worker(be)?),
    };
    Ok(worker.packet(p).await?)
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

/// Starts the receiving task of a back-end that just joined (on the runtime: called
/// inside `block_on`).
fn wrap(be: BackEnd) -> tc_backend {
    let (tx, rx) = mpsc::channel(HANDED_OVER);
    let (stop_tx, stop_rx) = oneshot::channel();
    let ready = Arc::new(ReadySlot::new());
    let (sender, rank) = (be.sender(), be.rank());
    let closed = Arc::default();
    let task = tokio::spawn(receive(be, tx, ready.clone(), Arc::clone(&closed), stop_rx));
    tc_backend {
        sender,
        rank,
        packets: AsyncMutex::new(rx),
        stop: Some(stop_tx),
        task: Some(task),
        ready,
        send_limit_ms: AtomicU64::new(crate::ffi::TC_DEFAULT_SEND_TIMEOUT_MS),
        closed,
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
        let be = block_on(async { BackEnd::connect().await.map(wrap) })??;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(be)) };
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
        let be = block_on(async { BackEnd::attach(file.map(std::path::Path::new), rank).await.map(wrap) })??;
        // SAFETY: checked not NULL.
        unsafe { put(out, handle(be)) };
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
        let over = || Failure::new(tc_result::TC_ERR_CLOSED, "the network is over for this back-end");
        took_without_waiting(timeout_ms)?;
        // A packet already handed over is taken without entering the runtime.
        let ready = b.packets.try_lock().ok().and_then(|mut packets| match packets.try_recv() {
            Ok(packet) => Some(packet),
            Err(mpsc::error::TryRecvError::Empty) => None,
            Err(mpsc::error::TryRecvError::Disconnected) => Some(Err(over())),
        });
        let packet = match ready {
            Some(packet) => packet?,
            // A time limit of 0 still looks once; a receive cut short loses nothing.
            None => block_on_for(timeout_ms, async {
                let mut packets = b.packets.lock().await;
                packets.recv().await.unwrap_or_else(|| Err(over()))
            })?
            .ok_or_else(|| ran_out(timeout_ms, "packet"))??,
        };
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
        let (b, (format, fmt)) = unsafe { (arg(be, "be")?, parse_c(format)?) };
        // SAFETY: as the caller promised.
        let payload = unsafe { encode_c(&fmt, format, values, count) }?;
        send_now_or_within(
            b.send_limit_ms.load(Ordering::Relaxed),
            || b.sender.try_send_encoded(stream, tag, &fmt, payload),
            |unsent| b.sender.send_unsent(unsent),
        )
    })
}

/// Waits until everything this back-end sent is written out to its link (MRNet's
/// `flush`), at most `timeout_ms` (`TC_FOREVER`: no limit): the writes sends left for
/// later are done at once; beyond that it waits only while the link is full.
/// `TC_ERR_TIMEOUT` when it stayed full that long (the parent is not reading).
///
/// # Safety
/// `be` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_flush(be: *const tc_backend, timeout_ms: u64) -> tc_result {
    guard("tc_backend_flush", || {
        // SAFETY: as the caller promised.
        let b = unsafe { arg(be, "be") }?;
        crate::ffi::flush_within(timeout_ms, b.sender.flush(), "the parent comm node")
    })
}

/// Takes the id of the oldest stream the front-end closed that was not taken yet,
/// into `stream`; `TC_ERR_AGAIN` when there is none. A closing also makes the
/// back-end's descriptor readable (MRNet tools learn of closed streams this way).
///
/// # Safety
/// `be` is NULL or live; `stream` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_backend_next_closed(be: *const tc_backend, stream: *mut u32) -> tc_result {
    guard("tc_backend_next_closed", || {
        // SAFETY: as the caller promised.
        let b = unsafe { arg(be, "be") }?;
        out_ok(stream, "stream")?;
        let id = b.closed.lock().unwrap_or_else(std::sync::PoisonError::into_inner).pop_front();
        match id {
            // SAFETY: checked not NULL.
            Some(id) => unsafe { put(stream, id) },
            None => {
                return Err(Failure::new(tc_result::TC_ERR_AGAIN, "no stream was closed since the last call"))
            }
        }
        Ok(())
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
        let Some(mut b) = (unsafe { take(be) }) else { return Ok(()) };
        let (be, files) = block_on(b.stop_receiving())?;
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
    quiet((), || {
        // SAFETY: as the caller promised.
        if let Some(mut b) = unsafe { take(be) } {
            // Dropping the link writes what was sent (BackEnd's drop) without leaving.
            let _ = block_on(b.stop_receiving());
        }
    });
}

impl Drop for tc_backend {
    fn drop(&mut self) {
        // Not stopped in order (a failed close): the link still goes, writing what was sent.
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

impl tc_backend {
    /// Stops the receiving task and takes back the link and the file writer.
    async fn stop_receiving(&mut self) -> (Option<BackEnd>, Option<FileWorker>) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        match self.task.take() {
            Some(task) => match task.await {
                Ok((be, files)) => (Some(be), files),
                Err(_) => (None, None),
            },
            None => (None, None),
        }
    }
}
