//! A link as two tasks: a batching writer and a batch-decoding reader.

use std::io::IoSlice;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::mpsc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinHandle;
use treecast_wire::{decode_batch, Frame, FrameHeader, FrameKind, HEADER_LEN};

use crate::credit::SendCredits;
use crate::socket::{split, ByteSink, ByteSource, Socket, TokioReader, TokioWriter};

/// Frames a link's send queue holds before senders wait.
pub const LINK_QUEUE_FRAMES: usize = 256;
/// Bytes gathered into one write before it is issued.
const BATCH_BYTES: usize = 256 << 10;
/// Most the read buffer grows by at once while a large frame arrives.
const RESERVE_STEP: usize = 1 << 20;
/// Payloads at least this large are written from their own buffer instead of being copied.
const ZERO_COPY_MIN: usize = 8 << 10;
/// Longest a back-end's link to its parent may block, when its writer is dropped, to
/// write what is left and have the parent acknowledge it (see [`spawn_socket_link_with_credits`]).
pub const LEAVE_LIMIT: Duration = Duration::from_secs(5);

/// What a link's reader reports to the node that owns it.
#[derive(Debug)]
pub struct Inbound {
    /// Which link (the owner's index).
    pub link: usize,
    /// What happened.
    pub event: LinkEvent,
}

/// An event on a link.
#[derive(Debug)]
pub enum LinkEvent {
    /// Frames decoded from one read, in order.
    Frames(Vec<Frame>),
    /// The link is gone: `None` for an orderly close, else the reason (I/O error, malformed frame).
    Closed(Option<String>),
}

/// Bytes a link's send queue holds before senders wait (besides the frame count bound).
pub const LINK_QUEUE_BYTES: usize = 4 << 20;

/// A queued frame and the share of the link's byte budget it holds until written.
#[derive(Debug)]
struct Queued {
    frame: Frame,
    budget: OwnedSemaphorePermit,
}

/// The sending side of a link. Cloning shares the same queue.
#[derive(Debug, Clone)]
pub struct LinkSender {
    tx: mpsc::Sender<Queued>,
    budget: Arc<Semaphore>,
    name: Arc<str>,
}

/// The budget a frame takes: its size, capped so one huge frame still fits alone.
fn cost(frame: &Frame) -> u32 {
    frame.wire_len().min(LINK_QUEUE_BYTES) as u32
}

impl LinkSender {
    /// Queues a frame, waiting while the queue is full.
    ///
    /// # Errors
    /// Hands the frame back when the link is closed.
    ///
    /// Cancel safety: cancel safe; a cancelled send queued nothing.
    pub async fn send(&self, frame: Frame) -> Result<(), Frame> {
        let Ok(budget) = self.budget.clone().acquire_many_owned(cost(&frame)).await else {
            return Err(frame);
        };
        self.tx.send(Queued { frame, budget }).await.map_err(|e| e.0.frame)
    }

    /// Queues a frame if there is room now.
    ///
    /// # Errors
    /// Hands the frame back when the queue is full or the link closed.
    pub fn try_send(&self, frame: Frame) -> Result<(), Frame> {
        let Ok(budget) = self.budget.clone().try_acquire_many_owned(cost(&frame)) else { return Err(frame) };
        self.tx.try_send(Queued { frame, budget }).map_err(|e| e.into_inner().frame)
    }

    /// True once the writer has stopped.
    pub fn is_closed(&self) -> bool {
        self.tx.is_closed()
    }

    /// The peer's name, for logs.
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// Starts the reader and writer tasks of an authenticated link.
///
/// Frames read are reported to `inbound` tagged with `link`; a malformed frame
/// or an I/O error closes the reader and is reported as [`LinkEvent::Closed`]
/// with the reason. The writer stops when every [`LinkSender`] is dropped,
/// which closes the connection. Returns the sender and the writer task.
pub fn spawn_link<R, W>(
    reader: R,
    writer: W,
    link: usize,
    name: String,
    inbound: mpsc::Sender<Inbound>,
) -> (LinkSender, JoinHandle<()>)
where
    R: AsyncRead + Unpin + Send + 'static,
    W: AsyncWrite + Unpin + Send + 'static,
{
    start(TokioReader(reader), TokioWriter(writer), link, name, inbound, None, None)
}

/// Starts the reader and writer tasks of an authenticated socket; see [`spawn_link`].
///
/// The socket is driven directly so that this process is woken only for data,
/// never for write space it is not waiting for.
///
/// # Errors
/// The socket could not be registered with the runtime's reactor.
pub fn spawn_socket_link(
    socket: Socket,
    link: usize,
    name: String,
    inbound: mpsc::Sender<Inbound>,
) -> std::io::Result<(LinkSender, JoinHandle<()>)> {
    let (r, w) = split(socket)?;
    Ok(start(r, w, link, name, inbound, None, None))
}

/// [`spawn_socket_link`] for a back-end's link to its parent: credit frames read
/// from it are added to `credits` at once (not queued behind data the tool has not
/// read yet) and are not reported to `inbound`.
///
/// Nothing queued is lost when the process leaves `main` right after queueing it. The
/// runtime then drops the writer task with frames still queued; the writer writes them
/// as it is dropped, blocking the thread, and ends the connection in order. Over TCP,
/// on that path and when every sender is dropped, it also waits until the parent has
/// acknowledged every byte: a process that exits with unread data from its peer makes
/// the kernel reset the connection, which throws away what the peer had not
/// acknowledged yet. Both waits together take at most [`LEAVE_LIMIT`]. A process that
/// ends without unwinding (`std::process::exit`, a signal) still loses what is queued.
///
/// # Errors
/// The socket could not be registered with the runtime's reactor.
pub fn spawn_socket_link_with_credits(
    socket: Socket,
    link: usize,
    name: String,
    inbound: mpsc::Sender<Inbound>,
    credits: Arc<SendCredits>,
) -> std::io::Result<(LinkSender, JoinHandle<()>)> {
    let (r, w) = split(socket)?;
    Ok(start(r, w, link, name, inbound, Some(credits), Some(LEAVE_LIMIT)))
}

fn start(
    reader: impl ByteSource,
    writer: impl ByteSink,
    link: usize,
    name: String,
    inbound: mpsc::Sender<Inbound>,
    credits: Option<Arc<SendCredits>>,
    flush_on_drop: Option<Duration>,
) -> (LinkSender, JoinHandle<()>) {
    let name: Arc<str> = name.into();
    let (tx, rx) = mpsc::channel(LINK_QUEUE_FRAMES);
    tokio::spawn(read_loop(reader, link, name.clone(), inbound, credits));
    let state =
        WriteState { writer, rx, segments: Vec::new(), flush_on_drop, ended: false, name: name.clone() };
    let writer = tokio::spawn(write_loop(state));
    (LinkSender { tx, budget: Arc::new(Semaphore::new(LINK_QUEUE_BYTES)), name }, writer)
}

/// Read chunks a link may have in flight (decoded but not yet dropped by the node).
///
/// This is what bounds a node's memory per link: once a slow consumer (say, a
/// wave waiting for another child) holds this many chunks, the reader stops
/// and the kernel's flow control slows the sender down.
pub const LINK_CHUNKS_IN_FLIGHT: usize = 4;

/// Received bytes holding one of the link's in-flight permits until every frame cut from them is dropped.
struct Chunk {
    bytes: BytesMut,
    _permit: OwnedSemaphorePermit,
}

impl AsRef<[u8]> for Chunk {
    fn as_ref(&self) -> &[u8] {
        &self.bytes
    }
}

/// Length of the longest prefix of `buf` made of whole frames.
///
/// # Errors
/// A malformed frame header (the stream cannot be resynchronised).
fn whole_frames_len(buf: &[u8]) -> Result<usize, treecast_wire::DecodeError> {
    let mut off = 0;
    while buf.len() - off >= HEADER_LEN {
        let (_, len) = FrameHeader::decode(&buf[off..off + HEADER_LEN])?;
        if buf.len() - off - HEADER_LEN < len {
            break;
        }
        off += HEADER_LEN + len;
    }
    Ok(off)
}

async fn read_loop(
    mut reader: impl ByteSource,
    link: usize,
    name: Arc<str>,
    inbound: mpsc::Sender<Inbound>,
    credits: Option<Arc<SendCredits>>,
) {
    let permits = Arc::new(Semaphore::new(LINK_CHUNKS_IN_FLIGHT));
    let mut buf = BytesMut::new();
    let reason = loop {
        let Ok(permit) = permits.clone().acquire_owned().await else { break None };
        let whole = loop {
            match reader.read_some(&mut buf).await {
                Ok(0) if buf.is_empty() => break Err(None),
                Ok(0) => {
                    break Err(Some(format!(
                        "the peer closed the link in the middle of a frame ({} bytes)",
                        buf.len()
                    )))
                }
                Ok(_) => {}
                Err(e) => break Err(Some(format!("read error: {e}"))),
            }
            match whole_frames_len(&buf) {
                Ok(0) => {
                    // Grow in steps: a header alone must not make us allocate a whole payload.
                    if buf.capacity() == buf.len() {
                        buf.reserve(RESERVE_STEP);
                    }
                }
                Ok(n) => break Ok(n),
                Err(e) => break Err(Some(format!("malformed frame: {e}"))),
            }
        };
        let n = match whole {
            Ok(n) => n,
            Err(reason) => {
                if let Some(r) = &reason {
                    tracing::warn!(peer = %name, "closing link: {r}");
                }
                break reason;
            }
        };
        let chunk = Bytes::from_owner(Chunk { bytes: buf.split_to(n), _permit: permit });
        let mut frames = match decode_batch(chunk) {
            Ok(f) => f,
            Err(e) => break Some(format!("malformed frame: {e}")),
        };
        if let Some(credits) = &credits {
            take_credits(&mut frames, credits);
            if frames.is_empty() {
                continue;
            }
        }
        if inbound.send(Inbound { link, event: LinkEvent::Frames(frames) }).await.is_err() {
            return;
        }
    };
    let _ = inbound.send(Inbound { link, event: LinkEvent::Closed(reason) }).await;
}

/// Applies and removes the credit frames of a batch.
fn take_credits(frames: &mut Vec<Frame>, credits: &SendCredits) {
    if frames.iter().any(|f| f.header.kind == FrameKind::Credit) {
        frames.retain(|f| {
            if f.header.kind != FrameKind::Credit {
                return true;
            }
            credits.grant(f.header.stream, f.header.credits());
            false
        });
    }
}

fn now_ns() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(0)
}

/// Gathers queued frames into segments: small frames copied together, large payloads by reference.
struct Batch {
    small: BytesMut,
    segments: Vec<Bytes>,
    bytes: usize,
}

impl Batch {
    fn new() -> Self {
        Batch { small: BytesMut::with_capacity(4 << 10), segments: Vec::new(), bytes: 0 }
    }

    fn push(&mut self, mut frame: Frame, stamp: u64) {
        if frame.header.timestamp_ns == 0 {
            frame.header.timestamp_ns = stamp;
        }
        self.bytes += frame.wire_len();
        frame.header.encode(frame.payload.len(), &mut self.small);
        if frame.payload.len() >= ZERO_COPY_MIN {
            self.segments.push(self.small.split().freeze());
            self.segments.push(frame.payload);
        } else {
            self.small.extend_from_slice(&frame.payload);
        }
    }

    fn finish(&mut self) {
        if !self.small.is_empty() {
            self.segments.push(self.small.split().freeze());
        }
    }
}

/// A link writer's state. The task keeps it outside its own stack frames so that, for
/// a back-end's link to its parent, what is left can still be written when the task is
/// dropped (see the [`Drop`] impl).
struct WriteState<W: ByteSink> {
    writer: W,
    rx: mpsc::Receiver<Queued>,
    /// What is left to write of the batch being written.
    segments: Vec<Bytes>,
    /// How long a dropped writer may block to write what is left and have the peer
    /// acknowledge it; `None` (every link but a back-end's) drops what is left.
    flush_on_drop: Option<Duration>,
    /// The writer ended on its own (finished or failed): nothing to do when dropped.
    ended: bool,
    name: Arc<str>,
}

async fn write_loop<W: ByteSink>(mut st: WriteState<W>) {
    let mut batch = Batch::new();
    // Budget shares are given back only once their frames are written.
    let mut held = Vec::new();
    while let Some(first) = st.rx.recv().await {
        let stamp = now_ns();
        batch.push(first.frame, stamp);
        held.push(first.budget);
        while batch.bytes < BATCH_BYTES {
            match st.rx.try_recv() {
                Ok(q) => {
                    batch.push(q.frame, stamp);
                    held.push(q.budget);
                }
                Err(_) => break,
            }
        }
        batch.finish();
        st.segments.append(&mut batch.segments);
        if let Err(e) = write_segments(&mut st.writer, &mut st.segments).await {
            tracing::debug!(peer = %st.name, "link write failed: {e}");
            // Close both ways so the reader reports the link closed and the node notices.
            st.writer.abort();
            st.ended = true;
            return;
        }
        batch.bytes = 0;
        held.clear();
    }
    st.writer.finish().await;
    if let Some(limit) = st.flush_on_drop {
        if !st.writer.confirm(limit).await {
            tracing::debug!(peer = %st.name, "the peer did not acknowledge the last bytes in time");
        }
    }
    st.ended = true;
}

impl<W: ByteSink> Drop for WriteState<W> {
    /// A back-end's writer dropped before it ended (the process is leaving `main` and
    /// its runtime drops every task): writes what is left, blocking the thread, and
    /// ends the connection in order, all within `flush_on_drop`.
    fn drop(&mut self) {
        let Some(limit) = self.flush_on_drop.filter(|_| !self.ended) else { return };
        let deadline = Instant::now() + limit;
        let mut batch = Batch::new();
        let stamp = now_ns();
        while let Ok(q) = self.rx.try_recv() {
            batch.push(q.frame, stamp);
        }
        batch.finish();
        self.segments.append(&mut batch.segments);
        while !self.segments.is_empty() {
            let slices: Vec<IoSlice<'_>> = self.segments.iter().take(64).map(|b| IoSlice::new(b)).collect();
            match self.writer.write_blocking(&slices, deadline) {
                Ok(n) if n > 0 => consume(&mut self.segments, n),
                other => {
                    let why = other.err().map_or_else(|| "wrote nothing".to_owned(), |e| e.to_string());
                    tracing::warn!(peer = %self.name, "{} bytes not sent on leaving: {why}", self.unsent());
                    return;
                }
            }
        }
        if !self.writer.finish_blocking(deadline) {
            tracing::debug!(peer = %self.name, "the peer did not acknowledge the last bytes in time");
        }
    }
}

impl<W: ByteSink> WriteState<W> {
    fn unsent(&self) -> usize {
        self.segments.iter().map(Bytes::len).sum()
    }
}

/// Writes every segment, removing each as it is written, so that `segments` always
/// holds exactly what is left (also when the future is dropped at an await).
async fn write_segments(writer: &mut impl ByteSink, segments: &mut Vec<Bytes>) -> std::io::Result<()> {
    while !segments.is_empty() {
        let slices: Vec<IoSlice<'_>> = segments.iter().take(64).map(|b| IoSlice::new(b)).collect();
        let written = writer.write_some(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        consume(segments, written);
    }
    Ok(())
}

/// Removes the first `n` bytes from `segments`.
fn consume(segments: &mut Vec<Bytes>, mut n: usize) {
    let mut whole = 0;
    while whole < segments.len() && n >= segments[whole].len() {
        n -= segments[whole].len();
        whole += 1;
    }
    segments.drain(..whole);
    if n > 0 {
        if let Some(first) = segments.first_mut() {
            let _ = first.split_to(n);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;
    use treecast_wire::FrameHeader;

    #[tokio::test]
    async fn frames_cross_in_order_small_and_large() {
        let (a, b) = tokio::io::duplex(4096);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let (in_tx, mut in_rx) = mpsc::channel(16);
        let (sender, _w) = spawn_link(ar, aw, 0, "a".into(), mpsc::channel(1).0);
        let (_bs, _bw) = spawn_link(br, bw, 5, "b".into(), in_tx);
        let sizes = [0usize, 1, 100, ZERO_COPY_MIN, ZERO_COPY_MIN * 3 + 7, 5];
        for (i, &n) in sizes.iter().enumerate() {
            sender.send(Frame::new(FrameHeader::data(1, i as i32, 0), vec![i as u8; n])).await.unwrap();
        }
        let mut got = Vec::new();
        while got.len() < sizes.len() {
            match in_rx.recv().await.unwrap() {
                Inbound { link: 5, event: LinkEvent::Frames(f) } => got.extend(f),
                other => panic!("unexpected {other:?}"),
            }
        }
        for (i, f) in got.iter().enumerate() {
            assert_eq!(f.header.tag, i as i32);
            assert_eq!(f.payload.len(), sizes[i]);
            assert!(f.header.timestamp_ns > 0);
        }
    }

    #[tokio::test]
    async fn a_consumer_that_holds_frames_stops_the_reader_then_resumes() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let (ar, aw) = tokio::io::split(a);
        let (br, bw) = tokio::io::split(b);
        let (in_tx, mut in_rx) = mpsc::channel(1024);
        let (sender, _w) = spawn_link(ar, aw, 0, "a".into(), mpsc::channel(1).0);
        let (_bs, _bw) = spawn_link(br, bw, 1, "b".into(), in_tx);
        const N: usize = 20_000;
        tokio::spawn(async move {
            for i in 0..N {
                sender.send(Frame::new(FrameHeader::data(1, i as i32, 0), vec![7u8; 100])).await.unwrap();
            }
        });
        let mut held = Vec::new();
        while let Ok(Some(Inbound { event: LinkEvent::Frames(f), .. })) =
            tokio::time::timeout(std::time::Duration::from_millis(300), in_rx.recv()).await
        {
            held.push(f);
        }
        assert_eq!(held.len(), LINK_CHUNKS_IN_FLIGHT, "the reader stops once every chunk is held");
        let mut total: usize = held.iter().map(Vec::len).sum();
        assert!(total < N);
        drop(held);
        while total < N {
            match in_rx.recv().await.unwrap().event {
                LinkEvent::Frames(f) => total += f.len(),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(total, N, "nothing was lost");
    }

    #[tokio::test]
    async fn a_stalled_link_holds_at_most_its_byte_budget() {
        // The peer never reads: the writer blocks and queued frames keep their budget.
        let (a, _peer) = tokio::io::duplex(1024);
        let (ar, aw) = tokio::io::split(a);
        let (sender, _w) = spawn_link(ar, aw, 0, "a".into(), mpsc::channel(1).0);
        let mib = Frame::new(FrameHeader::data(1, 0, 0), vec![0u8; 1 << 20]);
        let mut accepted = 0;
        while sender.try_send(mib.clone()).is_ok() {
            accepted += 1;
            assert!(accepted <= LINK_QUEUE_BYTES >> 20, "the byte budget did not hold");
            tokio::task::yield_now().await;
        }
        assert!(accepted >= 1);
    }

    #[tokio::test]
    async fn malformed_bytes_close_the_link_with_a_reason() {
        let (a, mut b) = tokio::io::duplex(4096);
        let (ar, aw) = tokio::io::split(a);
        let (in_tx, mut in_rx) = mpsc::channel(16);
        let (_s, _w) = spawn_link(ar, aw, 3, "peer".into(), in_tx);
        b.write_all(&[0xEE; 64]).await.unwrap();
        match in_rx.recv().await.unwrap().event {
            LinkEvent::Closed(Some(reason)) => assert!(reason.contains("malformed frame"), "{reason}"),
            other => panic!("unexpected {other:?}"),
        }
    }
}
