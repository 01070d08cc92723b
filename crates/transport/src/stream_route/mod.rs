//! TCP and Unix-socket links behind the [`Route`] trait: one connection per link,
//! all driven from the task that owns the route.
//!
//! Each link has its own waker. When its socket becomes readable (or writable again
//! after a full kernel buffer), the waker puts the link on a ready list and wakes the
//! owning task, which then reads only the links that are ready: a frame goes from the
//! socket into the node's core with no task or channel in between, and a node with a
//! thousand links does not poll a thousand sockets per wake-up.
//!
//! The rooms: `ready.rs` (the ready list and the wakers), `out_queue.rs` (a link's
//! queue, staging, stamping and the timed writes), `read.rs` (reading a ready link
//! and handing its frames on; the cutter is `treecast_wire::cut_frames_into`),
//! `payload.rs` (payload files), and here the route itself.

mod out_queue;
mod payload;
mod read;
mod ready;
#[cfg(test)]
mod tests;

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use treecast_wire::{Frame, LaunchPlan, DEFAULT_MAX_CONTROL};

use out_queue::{stamp_in_flight, write_timed, OutQueue, Staged};
use payload::payload_file;
use ready::{LinkWaker, ReadyList};

use crate::recording::{
    mono_now, LinkPlace, LinkTiming, Monitoring, Mono, NodeClock, PeerClock, COUNT_BATCH, MAX_DEFERRED,
};
use crate::route::{Close, LinkPeer, MonitoredRoute, Route, RouteEvent};
use crate::{shared_payload, LinkId, LinkMap, Socket};

/// Bytes read from one link before the others get a turn.
const READ_BUDGET: usize = 512 << 10;
/// Payloads at least this large are written from their own buffer instead of copied.
const ZERO_COPY_MIN: usize = 8 << 10;
/// Slices per `writev`.
const MAX_IOV: usize = 64;
/// Most bytes read from a link after a write to it failed: more than any kernel
/// socket buffer holds, so a peer that exited is read to its end, while one that
/// shut only its reading side and keeps sending cannot hold the link open.
const DRAIN_AFTER_WRITE_FAILURE: usize = 16 << 20;

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
    /// Payload files received and not yet matched to their frame's header.
    files: VecDeque<OwnedFd>,
    /// Why a write failed, and bytes read since: the link is read to its end first.
    write_failed: Option<(String, usize)>,
    /// For a link to a child: the back-ends it reaches, which size the control
    /// frames it may send ([`StreamRoute::control_limit`]); `None` for other peers.
    reach: Option<u64>,
}

/// The largest control frame `c` may send (see [`StreamRoute::control_limit`]).
fn control_limit(c: &Conn, max_frame: usize, max_control: usize) -> usize {
    match c.reach {
        None => max_frame,
        Some(n) => {
            let n = usize::try_from(n.max(1)).unwrap_or(usize::MAX);
            max_control.saturating_mul(n).min(max_frame)
        }
    }
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
    /// A list that keeps its room, swapped in for `dirty` or for the ready links while
    /// a pass goes through them (empty between passes): a pass allocates no list.
    spare_links: Vec<LinkId>,
    /// Closures found while writing, reported by the next `poll_recv`.
    broken: Vec<(LinkId, Option<String>)>,
    max_frame: usize,
    /// Bytes of control frame a child may send per back-end it reaches.
    max_control: usize,
    monitor: Monitoring,
    /// Payloads at least this large go to Unix links as sealed memory files
    /// (`crate::shared_payload`); `None`: never.
    zero_copy_min: Option<usize>,
    /// When the first frame since the last flush was queued, read once for all the
    /// frames a node's loop sends in one pass (see `timing`, queue): one clock read
    /// per pass instead of one per frame.
    pass_start: Option<Mono>,
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
            spare_links: Vec::new(),
            broken: Vec::new(),
            max_frame,
            max_control: DEFAULT_MAX_CONTROL as usize,
            monitor: Monitoring::new(),
            zero_copy_min: None,
            pass_start: None,
        }
    }

    /// Carries `link` over `socket` (authenticated already); `name` is the peer, for logs.
    ///
    /// # Errors
    /// The socket could not be registered with the reactor (call inside a tokio runtime).
    pub fn add(&mut self, link: LinkId, socket: Socket, name: String) -> io::Result<()> {
        self.add_peer(link, socket, LinkPeer::Parent, name)
    }

    /// [`StreamRoute::add`] for a link to `peer`: a child's control frames are held
    /// to [`StreamRoute::control_limit`] from its first byte.
    ///
    /// # Errors
    /// As [`StreamRoute::add`].
    pub fn add_peer(&mut self, link: LinkId, socket: Socket, peer: LinkPeer, name: String) -> io::Result<()> {
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
            files: VecDeque::new(),
            write_failed: None,
            reach: matches!(peer, LinkPeer::Child { .. }).then_some(1),
        };
        self.conns.insert(link, conn);
        // Frames may have arrived with the end of the handshake.
        self.ready.push(link);
        Ok(())
    }

    /// Counts the samples taken since the last time (see `timing::Deferred`); those of a
    /// link gone since would count nothing, which is why links are removed through
    /// [`StreamRoute::remove_conn`].
    #[inline]
    fn record_deferred(&mut self) {
        if !self.monitor.deferred.is_empty() {
            self.record_deferred_now();
        }
    }

    /// [`StreamRoute::record_deferred`], once there is something to count.
    #[inline(never)]
    fn record_deferred_now(&mut self) {
        self.monitor.count_waiting(&mut self.conns, |c| &mut c.timing);
    }

    /// Stops carrying `link`, its samples not counted yet counted first (they would
    /// name a link gone).
    fn remove_conn(&mut self, link: LinkId) -> Option<Conn> {
        self.record_deferred();
        self.conns.remove(link)
    }

    /// Refuses frames over `max_frame` bytes from now on (a node learns its limit from its plan).
    pub fn set_max_frame(&mut self, max_frame: usize) {
        self.max_frame = max_frame;
    }

    /// Allows a child's control frames `bytes` bytes per back-end it reaches from
    /// now on (a node learns it from its plan).
    pub fn set_max_control(&mut self, bytes: usize) {
        self.max_control = bytes;
    }

    /// The largest control frame `link` may send, in bytes: the frame limit for a
    /// parent, and for a child the per-back-end allowance times the back-ends it
    /// reaches (at least one). Its legitimate reports (joins, attach points,
    /// monitoring) grow with its sub-tree; a leaf that makes its parent buffer more
    /// is refused while the parent holds at most the allowance for it.
    pub fn control_limit(&self, link: LinkId) -> Option<usize> {
        self.conns.get(link).map(|c| control_limit(c, self.max_frame, self.max_control))
    }

    /// The peer's name, for logs.
    pub fn name(&self, link: LinkId) -> Option<&str> {
        self.conns.get(link).map(|c| c.name.as_str())
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
        let written = write_timed(link, c, &mut self.monitor);
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
        if let Some(c) = self.remove_conn(link) {
            tracing::debug!(peer = %c.name, "link failed: {reason}");
            c.sock.shutdown(std::net::Shutdown::Both);
            if c.state == State::Open {
                self.broken.push((link, Some(reason)));
            }
        }
    }
}

impl Route for StreamRoute {
    fn add_link(&mut self, link: LinkId, socket: Socket, peer: LinkPeer, name: String) -> io::Result<()> {
        self.add_peer(link, socket, peer, name)
    }

    fn set_reach(&mut self, link: LinkId, backends: u64) {
        if let Some(c) = self.conns.get_mut(link) {
            if c.reach.is_some() {
                c.reach = Some(backends);
            }
        }
    }

    fn send(&mut self, links: &[LinkId], frame: &Frame) {
        // Not recording reads no clock, but for a clock probe: a frame keeps the
        // stamp it came with, if any.
        let record = self.monitor.recording;
        let queued = (record || frame.header.is_timed())
            .then(|| *self.pass_start.get_or_insert_with(|| self.monitor.ticker.now()));
        let as_file = self.zero_copy_min.is_some_and(|min| frame.payload.len() >= min);
        // Made once for every link of this host the frame goes to.
        let mut file: Option<Option<Arc<OwnedFd>>> = None;
        for &link in links {
            let Some(c) = self.conns.get_mut(link) else { continue };
            if c.state != State::Open || c.write_failed.is_some() {
                continue;
            }
            let file = match as_file && c.sock.is_unix() {
                true => file.get_or_insert_with(|| payload_file(&frame.payload)).clone(),
                false => None,
            };
            // Behind a staged frame, a frame is staged too, so as not to overtake it.
            let at = match queued {
                Some(at) => Some(at),
                None => (!c.out.staged.is_empty())
                    .then(|| *self.pass_start.get_or_insert_with(|| self.monitor.ticker.now())),
            };
            // A small frame recorded is encoded now and stamped in place: no copy.
            let in_place = record
                && file.is_none()
                && c.out.staged.is_empty()
                && frame.payload.len() < ZERO_COPY_MIN
                && !frame.header.is_timed();
            match at {
                Some(at) if in_place => c.out.push_unstamped(frame, at),
                Some(at) => c.out.staged.push(Staged { frame: frame.clone(), at, file, record }),
                None => {
                    c.out.push(frame, None, file);
                }
            }
            if !c.dirty {
                c.dirty = true;
                self.dirty.push(link);
            }
        }
    }

    fn flush(&mut self) {
        self.pass_start = None;
        let mut dirty = std::mem::replace(&mut self.dirty, std::mem::take(&mut self.spare_links));
        for &link in &dirty {
            self.flush_link(link);
        }
        dirty.clear();
        self.spare_links = dirty;
        // Last in the pass: every frame it sends is written before a sample is counted.
        if self.monitor.deferred.len() >= COUNT_BATCH {
            self.record_deferred_now();
        }
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>, sink: &mut dyn FnMut(LinkId, RouteEvent)) -> bool {
        let mut any = false;
        for (link, reason) in std::mem::take(&mut self.broken) {
            any = true;
            sink(link, RouteEvent::Closed(reason));
        }
        let mut ready = std::mem::take(&mut self.spare_links);
        self.ready.take_into(cx.waker(), &mut ready);
        for &link in &ready {
            if self.conns.get(link).is_some_and(|c| !c.out.is_empty()) {
                self.flush_link(link);
            }
            if let Some(closed) = self.read_link(link, sink, &mut any) {
                let Some(c) = self.remove_conn(link) else { continue };
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
        ready.clear();
        self.spare_links = ready;
        for (link, reason) in std::mem::take(&mut self.broken) {
            any = true;
            sink(link, RouteEvent::Closed(reason));
        }
        if self.monitor.deferred.len() >= MAX_DEFERRED {
            self.record_deferred();
        }
        any
    }

    fn close(&mut self, link: LinkId, how: Close) {
        let Some(c) = self.conns.get_mut(link) else { return };
        match how {
            Close::Now => {
                c.sock.shutdown(std::net::Shutdown::Both);
                self.remove_conn(link);
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
        self.pass_start = None;
        let links: Vec<LinkId> =
            self.conns.iter().filter(|(_, c)| !c.out.is_empty()).map(|(l, _)| l).collect();
        for link in links {
            let Some(c) = self.conns.get_mut(link) else { continue };
            if let Err(e) = c.sock.block_writes(limit) {
                tracing::debug!(peer = %c.name, "cannot make writes blocking: {e}");
                continue;
            }
            match write_timed(link, c, &mut self.monitor) {
                Ok(_) => c.sock.shutdown(std::net::Shutdown::Write),
                Err(e) => tracing::warn!(peer = %c.name, "could not deliver what was queued: {e}"),
            }
        }
        self.record_deferred();
    }

    fn apply_plan(&mut self, plan: &LaunchPlan) {
        self.set_max_frame(plan.max_frame as usize);
        self.set_max_control(plan.max_control as usize);
        self.set_zero_copy_min(plan.zero_copy_min());
    }

    /// Sends payloads of at least `bytes` bytes to links within this host as sealed
    /// memory files instead of through the socket; `None` (until set) never does.
    /// Off by default: on the machines measured the socket was faster at every
    /// size (docs/processes.md, "Large messages within a host").
    fn set_zero_copy_min(&mut self, bytes: Option<usize>) {
        if bytes.is_some() {
            shared_payload::raise_file_limit();
        }
        self.zero_copy_min = bytes;
    }

    fn unacknowledged(&self) -> usize {
        // Links that failed count as 0.
        self.conns.iter().map(|(_, c)| c.sock.unacknowledged().unwrap_or(0)).sum()
    }
}

impl MonitoredRoute for StreamRoute {
    fn set_clock(&mut self, clock: NodeClock) {
        // Reads waiting are turned to net with the clock they were taken on.
        self.record_deferred();
        self.monitor.clock = clock;
    }

    fn monitor_start(&mut self, program: u32) {
        // Samples taken before keep the program tag they were taken under.
        self.record_deferred();
        self.monitor.start(program);
    }

    fn set_stream_program(&mut self, stream: u32, program: Option<u32>) {
        self.record_deferred();
        self.monitor.set_stream_program(stream, program);
    }

    fn monitor_stop(&mut self) {
        // Staged frames are encoded now, so frames sent after the stop (encoded at
        // once) cannot overtake them.
        let start = mono_now();
        for (_, c) in self.conns.iter_mut() {
            stamp_in_flight(c, &mut self.monitor, start);
        }
        self.monitor.recording = false;
    }

    fn monitor_report(&mut self) -> treecast_monitor::Report {
        self.record_deferred();
        self.monitor.report()
    }

    fn monitor_clear(&mut self) {
        self.record_deferred();
        self.monitor.clear();
    }

    fn place_link(&mut self, link: LinkId, place: LinkPlace) {
        // Samples taken before keep the name they were taken under.
        self.record_deferred();
        if let Some(c) = self.conns.get_mut(link) {
            c.timing.set_place(place);
        }
    }

    fn set_peer_clock(&mut self, link: LinkId, clock: PeerClock) {
        // Reads waiting are turned to net with the offset in effect when taken.
        self.record_deferred();
        if let Some(c) = self.conns.get_mut(link) {
            c.timing.peer_clock = clock;
        }
    }
}
