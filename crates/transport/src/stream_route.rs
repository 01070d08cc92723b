//! TCP and Unix-socket links behind the [`Route`] trait: one connection per link,
//! all driven from the task that owns the route.
//!
//! Each link has its own waker. When its socket becomes readable (or writable again
//! after a full kernel buffer), the waker puts the link on a ready list and wakes the
//! owning task, which then reads only the links that are ready: a frame goes from the
//! socket into the node's core with no task or channel in between, and a node with a
//! thousand links does not poll a thousand sockets per wake-up.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use treecast_wire::{Frame, FrameHeader, FLAG_STAMPED, HEADER_LEN};

use crate::route::{Close, Route, RouteEvent};
use crate::timing::{ClockFn, LinkPlace, LinkTiming, Monitoring, PeerClock};
use crate::{LinkId, LinkMap, Socket};

/// Bytes read per syscall at most.
const READ_CHUNK: usize = 64 << 10;
/// Bytes read from one link before the others get a turn.
const READ_BUDGET: usize = 512 << 10;
/// Payloads smaller than this are copied out of the read buffer, so a frame the
/// node keeps (waiting for its wave) does not pin a whole read chunk.
const COPY_BELOW: usize = 4 << 10;
/// Payloads at least this large are written from their own buffer instead of copied.
const ZERO_COPY_MIN: usize = 8 << 10;
/// Most the read buffer grows by at once while a large frame arrives.
const RESERVE_STEP: usize = 1 << 20;
/// Slices per `writev`.
const MAX_IOV: usize = 64;
/// Most bytes read from a link after a write to it failed: more than any kernel
/// socket buffer holds, so a peer that exited is read to its end, while one that
/// shut only its reading side and keeps sending cannot hold the link open.
const DRAIN_AFTER_WRITE_FAILURE: usize = 16 << 20;

thread_local! {
    // One read buffer per thread, not per link: a node with many children stays
    // small. It is borrowed only for the duration of one read syscall.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> = std::cell::RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
}

/// Links ready for a read or a write, and the task to wake when one becomes ready.
#[derive(Debug, Default)]
struct ReadyList {
    state: Mutex<ReadyState>,
}

#[derive(Debug, Default)]
struct ReadyState {
    links: Vec<LinkId>,
    task: Option<Waker>,
}

impl ReadyList {
    fn push(&self, link: LinkId) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !s.links.contains(&link) {
            s.links.push(link);
        }
        if let Some(w) = s.task.take() {
            w.wake();
        }
    }

    fn take(&self, task: &Waker) -> Vec<LinkId> {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !s.task.as_ref().is_some_and(|w| w.will_wake(task)) {
            s.task = Some(task.clone());
        }
        std::mem::take(&mut s.links)
    }
}

/// A link's waker: readiness of its socket puts it on the ready list.
struct LinkWaker {
    link: LinkId,
    list: Arc<ReadyList>,
}

impl Wake for LinkWaker {
    fn wake(self: Arc<Self>) {
        self.list.push(self.link);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.list.push(self.link);
    }
}

/// Frames queued for one link: small ones gathered into one buffer, large payloads
/// by reference.
#[derive(Debug, Default)]
struct OutQueue {
    segments: VecDeque<Bytes>,
    small: BytesMut,
    bytes: usize,
    /// While monitoring: frames not yet encoded, with when they were queued; their
    /// header stamp is the start of the write that takes them (see `timing`).
    staged: Vec<(Frame, Instant)>,
    /// Bytes ever encoded and ever written: where each frame ends in the link's
    /// byte stream, to tell which write carried its last byte.
    pushed: u64,
    written: u64,
}

impl OutQueue {
    /// Encodes `frame`, with `stamp` as its timestamp when this hop took one while
    /// recording.
    fn push(&mut self, frame: &Frame, stamp: Option<u64>) {
        let mut header: FrameHeader = frame.header;
        // A stamp this hop did not take while recording (a forwarded frame keeps the
        // previous hop's) measures nothing for this hop.
        match stamp {
            Some(ns) => {
                header.timestamp_ns = ns;
                header.flags |= FLAG_STAMPED;
            }
            None => header.flags &= !FLAG_STAMPED,
        }
        self.bytes += frame.wire_len();
        self.pushed += frame.wire_len() as u64;
        header.encode(frame.payload.len(), &mut self.small);
        if frame.payload.len() >= ZERO_COPY_MIN {
            self.segments.push_back(self.small.split().freeze());
            self.segments.push_back(frame.payload.clone());
        } else {
            self.small.extend_from_slice(&frame.payload);
        }
    }

    fn is_empty(&self) -> bool {
        self.bytes == 0 && self.staged.is_empty()
    }

    /// Encodes the staged frames with header stamp `stamp`; `queued` is told each
    /// frame, how long it waited, and where it ends in the byte stream.
    fn encode_staged(&mut self, stamp: u64, start: Instant, queued: &mut dyn FnMut(&Frame, Duration, u64)) {
        // Taken and given back, so the staging vector keeps its capacity: no
        // allocation per flush while recording.
        let mut staged = std::mem::take(&mut self.staged);
        for (frame, at) in staged.drain(..) {
            self.push(&frame, Some(stamp));
            queued(&frame, start.saturating_duration_since(at), self.pushed);
        }
        self.staged = staged;
    }

    /// Writes as much as the socket takes; true when everything went.
    fn write(&mut self, sock: &Socket) -> io::Result<bool> {
        loop {
            if self.segments.is_empty() {
                if self.small.is_empty() {
                    self.bytes = 0;
                    return Ok(true);
                }
                // The common case: small frames only, written from the one buffer it keeps.
                match sock.write_vectored(&[IoSlice::new(&self.small)]) {
                    Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                    Ok(n) => {
                        self.small.advance(n);
                        self.bytes -= n;
                        self.written += n as u64;
                        if self.small.is_empty() {
                            self.small.clear();
                        }
                    }
                    Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) => return Err(e),
                }
                continue;
            }
            if !self.small.is_empty() {
                self.segments.push_back(self.small.split().freeze());
            }
            let slices: Vec<IoSlice<'_>> =
                self.segments.iter().take(MAX_IOV).map(|b| IoSlice::new(b)).collect();
            match sock.write_vectored(&slices) {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(mut n) => {
                    self.bytes -= n;
                    self.written += n as u64;
                    while n > 0 {
                        let Some(front) = self.segments.front_mut() else { break };
                        if n >= front.len() {
                            n -= front.len();
                            self.segments.pop_front();
                        } else {
                            front.advance(n);
                            n = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Open,
    /// Close once the queue is written.
    Closing,
    /// Our side is shut; waiting for the peer's end of stream.
    HalfClosed,
}

struct Conn {
    name: String,
    sock: Arc<Socket>,
    read_fd: AsyncFd<Arc<Socket>>,
    /// A duplicate registered for writable, only while the kernel buffer is full.
    write_fd: Option<AsyncFd<Arc<Socket>>>,
    waker: Waker,
    rbuf: BytesMut,
    out: OutQueue,
    state: State,
    /// On the route's dirty list.
    dirty: bool,
    timing: LinkTiming,
    /// Why a write failed, and bytes read since: the link is read to its end first.
    write_failed: Option<(String, usize)>,
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

/// TCP and Unix-socket links; see the module documentation.
pub struct StreamRoute {
    conns: LinkMap<Conn>,
    ready: Arc<ReadyList>,
    /// Links with something queued.
    dirty: Vec<LinkId>,
    /// Closures found while writing, reported by the next `poll_recv`.
    broken: Vec<(LinkId, Option<String>)>,
    max_frame: usize,
    monitor: Monitoring,
}

impl std::fmt::Debug for StreamRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StreamRoute").field("links", &self.conns.iter().count()).finish()
    }
}

impl StreamRoute {
    /// A route that refuses frames with a payload over `max_frame` bytes (the link closes).
    pub fn new(max_frame: usize) -> Self {
        StreamRoute {
            conns: LinkMap::default(),
            ready: Arc::default(),
            dirty: Vec::new(),
            broken: Vec::new(),
            max_frame,
            monitor: Monitoring::new(),
        }
    }

    /// Carries `link` over `socket` (authenticated already); `name` is the peer, for logs.
    ///
    /// # Errors
    /// The socket could not be registered with the reactor (call inside a tokio runtime).
    pub fn add(&mut self, link: LinkId, socket: Socket, name: String) -> io::Result<()> {
        let sock = Arc::new(socket);
        let read_fd = register(sock.clone(), Interest::READABLE)?;
        let waker = Waker::from(Arc::new(LinkWaker { link, list: self.ready.clone() }));
        let conn = Conn {
            name,
            sock,
            read_fd,
            write_fd: None,
            waker,
            rbuf: BytesMut::new(),
            out: OutQueue::default(),
            state: State::Open,
            dirty: false,
            timing: LinkTiming::default(),
            write_failed: None,
        };
        self.conns.insert(link, conn);
        // Frames may have arrived with the end of the handshake.
        self.ready.push(link);
        Ok(())
    }

    /// Sets the clock that stamps frames while monitoring (the node's global-clock
    /// time base); the wall clock until then.
    pub fn set_clock(&mut self, clock: ClockFn) {
        self.monitor.clock = clock;
    }

    /// Starts recording every frame's latency components under program tag `program`
    /// (see `crate::timing`); what was recorded before is kept.
    pub fn monitor_start(&mut self, program: u32) {
        self.monitor.start(program);
    }

    /// Keeps the frames of `stream` under their own program tag (`None`: the stream
    /// is gone), so that workloads sharing the tree are told apart.
    pub fn set_stream_program(&mut self, stream: u32, program: Option<u32>) {
        self.monitor.set_stream_program(stream, program);
    }

    /// Stops recording; frames already queued are still stamped and recorded.
    pub fn monitor_stop(&mut self) {
        // Staged frames are encoded now, so frames sent after the stop (encoded at
        // once) cannot overtake them.
        let start = Instant::now();
        for (_, c) in self.conns.iter_mut() {
            encode_staged(c, &mut self.monitor, start);
        }
        self.monitor.recording = false;
    }

    /// What was recorded so far.
    pub fn monitor_report(&mut self) -> treecast_monitor::Report {
        self.monitor.report()
    }

    /// Forgets what was recorded.
    pub fn monitor_clear(&mut self) {
        self.monitor.clear();
    }

    /// Says where `link` sits in the tree, which names its samples.
    pub fn place_link(&mut self, link: LinkId, place: LinkPlace) {
        if let Some(c) = self.conns.get_mut(link) {
            c.timing.place = Some(place);
        }
    }

    /// Sets the peer's clock against this node's, to correct the net component.
    pub fn set_peer_clock(&mut self, link: LinkId, clock: PeerClock) {
        if let Some(c) = self.conns.get_mut(link) {
            c.timing.peer_clock = clock;
        }
    }

    /// Refuses frames over `max_frame` bytes from now on (a node learns its limit from its plan).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// The peer's name, for logs.
    pub fn name(&self, link: LinkId) -> Option<&str> {
        self.conns.get(link).map(|c| c.name.as_str())
    }

    /// Bytes written on TCP links that their peers have not acknowledged yet (links
    /// that failed count as 0): a process must not exit before this is 0, or the
    /// kernel's reset may throw those bytes away.
    pub fn unacknowledged(&self) -> usize {
        self.conns.iter().map(|(_, c)| c.sock.unacknowledged().unwrap_or(0)).sum()
    }

    /// Number of links carried.
    pub fn len(&self) -> usize {
        self.conns.iter().count()
    }

    /// True when no link is carried.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn flush_link(&mut self, link: LinkId) {
        let Some(c) = self.conns.get_mut(link) else { return };
        c.dirty = false;
        let written = write_timed(c, &mut self.monitor);
        match written {
            Ok(true) => {
                c.write_fd = None;
                if c.state == State::Closing {
                    c.sock.shutdown(std::net::Shutdown::Write);
                    c.state = State::HalfClosed;
                }
            }
            Ok(false) => {
                // Full kernel buffer: wait for room on a duplicate registered for writable only.
                if c.write_fd.is_none() {
                    match c.sock.try_clone().and_then(|s| register(Arc::new(s), Interest::WRITABLE)) {
                        Ok(fd) => c.write_fd = Some(fd),
                        Err(e) => return self.break_link(link, format!("waiting to write: {e}")),
                    }
                }
                let Some(fd) = c.write_fd.as_ref() else { return };
                match fd.poll_write_ready(&mut Context::from_waker(&c.waker)) {
                    Poll::Ready(Ok(mut guard)) => {
                        guard.clear_ready();
                        self.ready.push(link);
                    }
                    Poll::Ready(Err(e)) => self.break_link(link, format!("waiting to write: {e}")),
                    Poll::Pending => {}
                }
            }
            Err(e) => self.write_failed(link, format!("write error: {e}")),
        }
    }

    /// A write to `link` failed, most often because the peer exited: what it wrote
    /// before it went is still in our receive buffer, and throwing that away would
    /// lose its last packets. The link stops writing and is read to its end, then
    /// reported closed with `reason`.
    fn write_failed(&mut self, link: LinkId, reason: String) {
        let Some(c) = self.conns.get_mut(link) else { return };
        tracing::debug!(peer = %c.name, "{reason}; reading what the peer sent before closing the link");
        c.sock.shutdown(std::net::Shutdown::Write);
        c.out = OutQueue::default();
        c.write_fd = None;
        c.write_failed = Some((reason, 0));
        self.ready.push(link);
    }

    /// A link failed while writing: it closes both ways and is reported closed.
    fn break_link(&mut self, link: LinkId, reason: String) {
        if let Some(c) = self.conns.remove(link) {
            tracing::debug!(peer = %c.name, "link failed: {reason}");
            c.sock.shutdown(std::net::Shutdown::Both);
            if c.state == State::Open {
                self.broken.push((link, Some(reason)));
            }
        }
    }

    /// Reads from one ready link; returns what to report, if it closed.
    fn read_link(
        &mut self,
        link: LinkId,
        sink: &mut dyn FnMut(LinkId, RouteEvent),
        any: &mut bool,
    ) -> Option<Option<String>> {
        let max_frame = self.max_frame;
        let c = self.conns.get_mut(link)?;
        if c.write_failed.is_some() {
            return self.drain_link(link, sink, any);
        }
        let mut budget = READ_BUDGET;
        loop {
            if budget == 0 {
                // Fair to the other links: come back to this one on the next turn.
                self.ready.push(link);
                return None;
            }
            let mut guard = match c.read_fd.poll_read_ready(&mut Context::from_waker(&c.waker)) {
                Poll::Pending => return None,
                Poll::Ready(Err(e)) => return Some(Some(format!("read error: {e}"))),
                Poll::Ready(Ok(g)) => g,
            };
            let result = guard.try_io(|inner| read_some(inner.get_ref(), &mut c.rbuf));
            match result {
                Ok(Ok((0, _))) => return Some(end_of_stream(&c.rbuf)),
                Ok(Ok((n, drained))) => {
                    budget = budget.saturating_sub(n);
                    // A short read drained the socket: edge-triggered epoll will report new data.
                    if drained {
                        guard.clear_ready();
                    }
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Some(Some(format!("read error: {e}"))),
                Err(_would_block) => continue,
            }
            if let Err(reason) = deliver(link, c, &mut self.monitor, max_frame, sink, any) {
                return Some(Some(reason));
            }
        }
    }

    /// Reads a link whose write failed straight from its socket, not waiting for the
    /// reactor to report it readable (the peer's last bytes may be there already),
    /// until nothing is left; then it is reported closed with the write's failure.
    fn drain_link(
        &mut self,
        link: LinkId,
        sink: &mut dyn FnMut(LinkId, RouteEvent),
        any: &mut bool,
    ) -> Option<Option<String>> {
        let max_frame = self.max_frame;
        let c = self.conns.get_mut(link)?;
        let mut budget = READ_BUDGET;
        loop {
            let (reason, drained) = c.write_failed.as_mut()?;
            if *drained >= DRAIN_AFTER_WRITE_FAILURE {
                return Some(Some(format!("{reason}; the peer kept sending after it")));
            }
            if budget == 0 {
                self.ready.push(link);
                return None;
            }
            match read_some(&c.sock, &mut c.rbuf) {
                // The peer closed first; our write failed only because of that.
                Ok((0, _)) => return Some(end_of_stream(&c.rbuf)),
                Ok((n, _)) => {
                    *drained += n;
                    budget = budget.saturating_sub(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_would_block_or_failed) => return Some(Some(reason.clone())),
            }
            if let Err(reason) = deliver(link, c, &mut self.monitor, max_frame, sink, any) {
                return Some(Some(reason));
            }
        }
    }
}

/// Reads what `sock` has, up to a chunk, onto the end of `rbuf`; says how much and
/// whether that drained the socket.
///
/// While a large frame arrives, [`cut_frames`] has made room in `rbuf` for it, and
/// the read goes straight there. Otherwise it goes through the thread's scratch
/// buffer, so that an idle link keeps no read room of its own.
fn read_some(sock: &Socket, rbuf: &mut BytesMut) -> io::Result<(usize, bool)> {
    let room = rbuf.capacity() - rbuf.len();
    if room >= READ_CHUNK {
        let n = sock.read_into_spare(rbuf)?;
        return Ok((n, n < room));
    }
    SCRATCH.with(|scratch| {
        let mut scratch = scratch.borrow_mut();
        let n = sock.read(&mut scratch)?;
        rbuf.extend_from_slice(&scratch[..n]);
        Ok((n, n < scratch.len()))
    })
}

/// What a link's end of stream reports: a clean close, or a frame cut short.
fn end_of_stream(rbuf: &BytesMut) -> Option<String> {
    (!rbuf.is_empty())
        .then(|| format!("the peer closed the link in the middle of a frame ({} bytes)", rbuf.len()))
}

/// Hands the whole frames `c` has read to `sink` (and records them while
/// monitoring); a link no longer open reads but delivers nothing.
fn deliver(
    link: LinkId,
    c: &mut Conn,
    monitor: &mut Monitoring,
    max_frame: usize,
    sink: &mut dyn FnMut(LinkId, RouteEvent),
    any: &mut bool,
) -> Result<(), String> {
    let read_at = monitor.recording.then(Instant::now);
    let frames = cut_frames(&mut c.rbuf, max_frame).map_err(|e| e.to_string())?;
    if c.state != State::Open {
        return Ok(());
    }
    let read = read_at.map(|at| monitor.read_clock(&c.timing, at));
    for f in frames {
        *any = true;
        if let Some(read) = &read {
            monitor.read(&c.timing, &f, read, Instant::now());
        }
        sink(link, RouteEvent::Frame(f));
    }
    Ok(())
}

/// Why the bytes of a link cannot be cut into frames: the link cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CutError {
    /// A frame header does not decode.
    #[error("malformed frame: {0}")]
    Malformed(#[from] treecast_wire::DecodeError),
    /// A frame announces more payload than this node accepts.
    #[error(
        "a frame of {len} bytes is over this node's limit of {max} bytes (TREECAST_MAX_FRAME); the link is closed"
    )]
    TooLarge {
        /// The payload length announced.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Cuts the whole frames at the front of `buf` (what a link read so far), leaving a
/// partial frame in it and reserving room for its payload in steps as bytes come.
/// Payloads under 4 KiB are copied out, so a frame the node keeps pins no read buffer.
///
/// # Errors
/// A malformed header or a frame over `max_frame` bytes: the stream cannot go on.
pub fn cut_frames(buf: &mut BytesMut, max_frame: usize) -> Result<Vec<Frame>, CutError> {
    let mut frames = Vec::new();
    while buf.len() >= HEADER_LEN {
        let (header, len) = FrameHeader::decode(&buf[..HEADER_LEN])?;
        if len > max_frame {
            return Err(CutError::TooLarge { len, max: max_frame });
        }
        if buf.len() < HEADER_LEN + len {
            // Grow in steps as the bytes come: a header alone must not make us allocate its payload.
            let missing = HEADER_LEN + len - buf.len();
            if buf.capacity() - buf.len() < missing.min(READ_CHUNK) {
                buf.reserve(missing.min(RESERVE_STEP));
            }
            break;
        }
        let payload = if len < COPY_BELOW {
            let p = Bytes::copy_from_slice(&buf[HEADER_LEN..HEADER_LEN + len]);
            buf.advance(HEADER_LEN + len);
            p
        } else {
            buf.advance(HEADER_LEN);
            buf.split_to(len).freeze()
        };
        frames.push(Frame { header, payload });
    }
    Ok(frames)
}

/// Encodes the frames `c` staged while recording, stamped with `start` (the flush's
/// start), and records how long each was queued.
fn encode_staged(c: &mut Conn, monitor: &mut Monitoring, start: Instant) {
    if c.out.staged.is_empty() {
        return;
    }
    let stamp = monitor.stamp(start);
    let timing = &mut c.timing;
    c.out.encode_staged(stamp, start, &mut |frame, waited, end| {
        monitor.queued(timing, frame, waited, end, start)
    });
}

/// Writes what `c` has queued, stamping and recording its frames while monitoring.
fn write_timed(c: &mut Conn, monitor: &mut Monitoring) -> io::Result<bool> {
    if c.out.staged.is_empty() && !monitor.recording && !c.timing.has_in_flight() {
        return c.out.write(&c.sock);
    }
    let start = Instant::now();
    encode_staged(c, monitor, start);
    let written = c.out.write(&c.sock);
    monitor.written(&mut c.timing, c.out.written, Instant::now());
    written
}

impl Route for StreamRoute {
    fn send(&mut self, links: &[LinkId], frame: &Frame) {
        // Not recording reads no clock: a frame keeps the stamp it came with, if any.
        let queued = self.monitor.recording.then(Instant::now);
        for &link in links {
            let Some(c) = self.conns.get_mut(link) else { continue };
            if c.state != State::Open || c.write_failed.is_some() {
                continue;
            }
            match queued {
                Some(at) => c.out.staged.push((frame.clone(), at)),
                None => c.out.push(frame, None),
            }
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(link);
            }
        }
    }

    fn flush(&mut self) {
        for link in std::mem::take(&mut self.dirty) {
            self.flush_link(link);
        }
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>, sink: &mut dyn FnMut(LinkId, RouteEvent)) -> bool {
        let mut any = false;
        for (link, reason) in std::mem::take(&mut self.broken) {
            any = true;
            sink(link, RouteEvent::Closed(reason));
        }
        for link in self.ready.take(cx.waker()) {
            if self.conns.get(link).is_some_and(|c| !c.out.is_empty()) {
                self.flush_link(link);
            }
            if let Some(closed) = self.read_link(link, sink, &mut any) {
                let Some(c) = self.conns.remove(link) else { continue };
                if let Some(r) = &closed {
                    tracing::warn!(peer = %c.name, "closing link: {r}");
                }
                c.sock.shutdown(std::net::Shutdown::Both);
                if c.state == State::Open {
                    any = true;
                    sink(link, RouteEvent::Closed(closed));
                }
            }
        }
        for (link, reason) in std::mem::take(&mut self.broken) {
            any = true;
            sink(link, RouteEvent::Closed(reason));
        }
        any
    }

    fn close(&mut self, link: LinkId, how: Close) {
        let Some(c) = self.conns.get_mut(link) else { return };
        match how {
            Close::Now => {
                c.sock.shutdown(std::net::Shutdown::Both);
                self.conns.remove(link);
            }
            Close::Flush if c.out.is_empty() => {
                c.sock.shutdown(std::net::Shutdown::Write);
                c.state = State::HalfClosed;
            }
            Close::Flush => {
                c.state = State::Closing;
                if !c.dirty {
                    c.dirty = true;
                    self.dirty.push(link);
                }
            }
        }
    }

    fn is_flushed(&self) -> bool {
        self.conns.iter().all(|(_, c)| c.out.is_empty())
    }

    fn flush_blocking(&mut self, limit: Duration) {
        let links: Vec<LinkId> =
            self.conns.iter().filter(|(_, c)| !c.out.is_empty()).map(|(l, _)| l).collect();
        for link in links {
            let Some(c) = self.conns.get_mut(link) else { continue };
            if let Err(e) = c.sock.block_writes(limit) {
                tracing::debug!(peer = %c.name, "cannot make writes blocking: {e}");
                continue;
            }
            match write_timed(c, &mut self.monitor) {
                Ok(_) => c.sock.shutdown(std::net::Shutdown::Write),
                Err(e) => tracing::warn!(peer = %c.name, "could not deliver what was queued: {e}"),
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use treecast_wire::{encode_batch, MAX_PAYLOAD_LEN};

    fn pair() -> (Socket, Socket) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        (Socket::Unix(a), Socket::Unix(b))
    }

    fn ids() -> (LinkId, LinkId) {
        let mut t = crate::LinkTable::new();
        (t.insert(()), t.insert(()))
    }

    /// Runs `poll_recv` until `n` events came.
    async fn recv(route: &mut StreamRoute, n: usize) -> Vec<(LinkId, RouteEvent)> {
        let mut got = Vec::new();
        tokio::time::timeout(
            Duration::from_secs(10),
            std::future::poll_fn(|cx| {
                route.poll_recv(cx, &mut |l, e| got.push((l, e)));
                if got.len() >= n {
                    Poll::Ready(())
                } else {
                    Poll::Pending
                }
            }),
        )
        .await
        .unwrap();
        got
    }

    /// Flushes `route` until everything queued is written.
    async fn flushed(route: &mut StreamRoute) {
        std::future::poll_fn(|cx| {
            route.flush();
            route.poll_recv(cx, &mut |_, _| {});
            if route.is_flushed() {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        })
        .await;
    }

    /// A child's route and its parent's, one link between them: (child, its link,
    /// parent, its link).
    fn linked_routes() -> (StreamRoute, LinkId, StreamRoute, LinkId) {
        let (a, b) = pair();
        let (la, lb) = ids();
        let (mut child, mut parent) = (StreamRoute::new(MAX_PAYLOAD_LEN), StreamRoute::new(MAX_PAYLOAD_LEN));
        child.add(la, a, "parent".into()).unwrap();
        parent.add(lb, b, "child 4".into()).unwrap();
        (child, la, parent, lb)
    }

    #[tokio::test]
    async fn while_monitoring_each_end_records_its_components_and_net_is_corrected_by_the_peer_clock() {
        use treecast_monitor::{Component, Key};
        let (mut child, la, mut parent, lb) = linked_routes();
        child.place_link(la, LinkPlace { lower_node: 4, to_parent: true });
        parent.place_link(lb, LinkPlace { lower_node: 4, to_parent: false });
        // The child's clock reads 5 s, the parent's 7 s, and the global clock says the
        // child's runs 2 s less 1 µs behind: each frame took 1 µs on the way.
        child.set_clock(Box::new(|_| 5_000_000_000));
        parent.set_clock(Box::new(|_| 7_000_000_000));
        parent.set_peer_clock(lb, PeerClock { offset_ns: -2_000_000_000 + 1_000, drift_ppb: 0, at_ns: 0 });
        child.monitor_start(9);
        parent.monitor_start(9);
        let sizes = [10usize, 100, ZERO_COPY_MIN * 2];
        for n in sizes {
            child.send(&[la], &Frame::new(FrameHeader::data(1, 7, 0), vec![1; n]));
        }
        flushed(&mut child).await;
        for (_, event) in recv(&mut parent, sizes.len()).await {
            let RouteEvent::Frame(f) = event else { panic!("{event:?}") };
            assert_eq!(f.header.timestamp_ns, 5_000_000_000, "stamped on the sender's clock");
        }
        let key = Key { link: 4, up: true, tag: 7, program: 9 };
        let count = |route: &mut StreamRoute, component: Component| -> (u64, u64) {
            let report = route.monitor_report();
            let cells = report.cells.iter().filter(|c| c.component == component);
            assert!(cells.clone().all(|c| c.key() == key), "{report:?}");
            cells.fold((0, 0), |(n, sum), c| (n + c.count, sum + c.sum_ns))
        };
        assert_eq!(count(&mut child, Component::Queue).0, 3);
        assert_eq!(count(&mut child, Component::Send).0, 3);
        assert_eq!(count(&mut child, Component::Net).0, 0, "the sender has no net");
        assert_eq!(count(&mut parent, Component::Net), (3, 3_000));
        assert_eq!(count(&mut parent, Component::Deliver).0, 3);
        assert_eq!(count(&mut parent, Component::Queue).0, 0);

        // Stopped: nothing more is recorded, and frames no longer carry this clock.
        child.monitor_stop();
        parent.monitor_stop();
        child.send(&[la], &Frame::new(FrameHeader::data(1, 7, 0), vec![1; 10]));
        flushed(&mut child).await;
        let got = recv(&mut parent, 1).await;
        let RouteEvent::Frame(f) = &got[0].1 else { panic!() };
        assert_ne!(f.header.timestamp_ns, 5_000_000_000);
        assert_eq!(child.monitor_report().count(), 6);
        assert_eq!(parent.monitor_report().count(), 6);
        parent.monitor_clear();
        assert_eq!(parent.monitor_report().count(), 0);
    }

    #[tokio::test]
    async fn a_streams_own_program_tag_keeps_its_frames_apart_at_both_ends() {
        use treecast_monitor::Component;
        let (mut child, la, mut parent, lb) = linked_routes();
        child.place_link(la, LinkPlace { lower_node: 4, to_parent: true });
        parent.place_link(lb, LinkPlace { lower_node: 4, to_parent: false });
        for route in [&mut child, &mut parent] {
            route.monitor_start(9);
            route.set_stream_program(2, Some(5));
        }
        let send = |route: &mut StreamRoute, stream: u32| {
            route.send(&[la], &Frame::new(FrameHeader::data(stream, 7, 0), vec![1; 10]));
        };
        send(&mut child, 1);
        send(&mut child, 2);
        send(&mut child, 2);
        flushed(&mut child).await;
        recv(&mut parent, 3).await;
        // Gone: its frames fall back to the recording's tag.
        child.set_stream_program(2, None);
        send(&mut child, 2);
        flushed(&mut child).await;
        let programs = |route: &mut StreamRoute, component: Component| {
            let mut by_program = std::collections::BTreeMap::new();
            for c in route.monitor_report().cells.iter().filter(|c| c.component == component) {
                *by_program.entry(c.program).or_insert(0) += c.count;
            }
            by_program.into_iter().collect::<Vec<_>>()
        };
        assert_eq!(programs(&mut child, Component::Queue), [(5, 2), (9, 2)]);
        assert_eq!(programs(&mut child, Component::Send), [(5, 2), (9, 2)]);
        assert_eq!(programs(&mut parent, Component::Deliver), [(5, 2), (9, 1)]);
    }

    #[tokio::test]
    async fn frames_staged_before_a_stop_keep_their_order_and_unstamped_frames_give_no_net() {
        use treecast_monitor::Component;
        let (mut child, la, mut parent, _) = linked_routes();
        child.monitor_start(1);
        parent.monitor_start(1);
        child.send(&[la], &Frame::new(FrameHeader::data(1, 1, 0), vec![1; 10]));
        child.monitor_stop();
        child.send(&[la], &Frame::new(FrameHeader::data(1, 2, 0), vec![2; 10]));
        flushed(&mut child).await;
        let tags: Vec<i32> = recv(&mut parent, 2)
            .await
            .into_iter()
            .map(|(_, e)| match e {
                RouteEvent::Frame(f) => f.header.tag,
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(tags, [1, 2], "the frame sent after the stop did not overtake the staged one");
        let count = |r: &mut StreamRoute, component: Component| -> u64 {
            r.monitor_report().cells.iter().filter(|c| c.component == component).map(|c| c.count).sum()
        };
        // Frame 2 was not stamped by a recording sender: it has no net, only deliver.
        assert_eq!((count(&mut parent, Component::Net), count(&mut parent, Component::Deliver)), (1, 2));
        // Frame 1 was queued before the stop: its send is recorded after it.
        assert_eq!((count(&mut child, Component::Queue), count(&mut child, Component::Send)), (1, 1));
    }

    #[tokio::test]
    async fn a_peer_that_sent_and_exited_is_read_to_its_end_although_our_write_to_it_failed() {
        // Regression: a write that failed (the peer had exited) dropped the link at
        // once, and the peer's last frames, already in our receive buffer, with it.
        use std::io::Write;
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        let (la, _) = ids();
        let mut route = StreamRoute::new(MAX_PAYLOAD_LEN);
        route.add(la, Socket::Unix(a), "back-end".into()).unwrap();
        let sent: Vec<Frame> = (0..3).map(|i| Frame::new(FrameHeader::data(1, i, 0), vec![7; 100])).collect();
        (&b).write_all(&encode_batch(&sent)).unwrap();
        drop(b);
        route.send(&[la], &Frame::new(FrameHeader::data(1, 9, 0), vec![1; 10]));
        route.flush();
        let got = recv(&mut route, sent.len() + 1).await;
        let tags: Vec<i32> = got
            .iter()
            .filter_map(|(_, e)| match e {
                RouteEvent::Frame(f) => Some(f.header.tag),
                _ => None,
            })
            .collect();
        assert_eq!(tags, [0, 1, 2], "{got:?}");
        assert!(matches!(got.last(), Some((_, RouteEvent::Closed(None)))), "a clean end after them: {got:?}");
        assert!(route.is_flushed(), "nothing stays queued for a link that cannot be written");
    }

    #[tokio::test]
    async fn frames_cross_in_order_small_and_large_and_a_close_is_seen() {
        let (a, b) = pair();
        let (la, lb) = ids();
        let mut ra = StreamRoute::new(MAX_PAYLOAD_LEN);
        let mut rb = StreamRoute::new(MAX_PAYLOAD_LEN);
        ra.add(la, a, "b".into()).unwrap();
        rb.add(lb, b, "a".into()).unwrap();
        let sizes = [0usize, 1, 100, ZERO_COPY_MIN, 3 << 20, 5];
        for (i, &n) in sizes.iter().enumerate() {
            ra.send(&[la], &Frame::new(FrameHeader::data(1, i as i32, 0), vec![i as u8; n]));
        }
        let writer = tokio::spawn(async move {
            flushed(&mut ra).await;
            ra.close(la, Close::Flush);
            ra
        });
        let got = recv(&mut rb, sizes.len() + 1).await;
        for (i, &n) in sizes.iter().enumerate() {
            match &got[i].1 {
                RouteEvent::Frame(f) => {
                    assert_eq!((f.header.tag, f.payload.len()), (i as i32, n));
                    assert_eq!(f.header.timestamp_ns, 0, "not stamped: nothing records");
                }
                other => panic!("{other:?}"),
            }
        }
        assert!(matches!(got[sizes.len()].1, RouteEvent::Closed(None)));
        drop(writer.await.unwrap());
    }

    #[tokio::test]
    async fn malformed_and_oversized_frames_close_the_link_with_a_reason() {
        for (bytes, want) in [
            (vec![0xEEu8; 64], "malformed frame"),
            (
                encode_batch(&[Frame::new(FrameHeader::data(1, 0, 0), vec![0u8; 2000])]).to_vec(),
                "over this node's limit",
            ),
        ] {
            let (a, b) = pair();
            let (_, lb) = ids();
            let mut rb = StreamRoute::new(1000);
            rb.add(lb, b, "peer".into()).unwrap();
            let Socket::Unix(a) = a else { unreachable!() };
            std::io::Write::write_all(&mut &a, &bytes).unwrap();
            let got = recv(&mut rb, 1).await;
            match &got[0].1 {
                RouteEvent::Closed(Some(reason)) => assert!(reason.contains(want), "{reason}"),
                other => panic!("{other:?}"),
            }
        }
    }

    #[test]
    fn a_header_alone_does_not_allocate_its_payload() {
        let mut buf = BytesMut::new();
        FrameHeader::data(1, 0, 0).encode(200 << 20, &mut buf);
        let frames = cut_frames(&mut buf, MAX_PAYLOAD_LEN).unwrap();
        assert!(frames.is_empty());
        assert!(buf.capacity() <= 2 * RESERVE_STEP, "reserved {} bytes", buf.capacity());
    }
}
