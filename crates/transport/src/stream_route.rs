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
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;
use treecast_wire::{Frame, FrameHeader, FLAG_PAYLOAD_FD, FLAG_STAMPED, HEADER_LEN, TIMESTAMP_AT};

use crate::recording::{
    mono_now, FrameRun, LinkPlace, LinkTiming, Monitoring, Mono, NodeClock, PeerClock, Waiting, COUNT_BATCH,
    MAX_DEFERRED,
};
use crate::route::{Close, Route, RouteEvent};
use crate::{shared_payload, LinkId, LinkMap, Socket};

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
/// Payload files a link may hold that no frame has claimed yet; a sender sends
/// each with its frame's header, so more means the peer is not one of ours.
const MAX_WAITING_FILES: usize = 4 * shared_payload::MAX_FDS_PER_MSG;
/// Most frames a read's list of frames is sized for before it is cut.
const MAX_FRAMES_GUESS: usize = 1024;
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
    // The list a read's frames are cut into, taken and given back empty (at most
    // `MAX_FRAMES_GUESS` frames' room is kept).
    static FRAME_LIST: std::cell::Cell<Vec<Frame>> = const { std::cell::Cell::new(Vec::new()) };
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

    /// Swaps the links ready for `out`, an empty list whose room the next readiness
    /// takes: no allocation per pass.
    fn take_into(&self, task: &Waker, out: &mut Vec<LinkId>) {
        let mut s = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if !s.task.as_ref().is_some_and(|w| w.will_wake(task)) {
            s.task = Some(task.clone());
        }
        out.clear();
        std::mem::swap(&mut s.links, out);
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
    /// Frames to be stamped (while monitoring, and clock probes) not yet encoded;
    /// their header stamp is the start of the write that takes them (see `timing`).
    staged: Vec<Staged>,
    /// Runs of frames queued while recording, oldest first, until the end of the
    /// write that takes them records their queue and send. Small frames are encoded
    /// in `small` at once, and their header stamp written in place at the start of
    /// that write: no copy of the frame is kept. Staged frames are encoded and
    /// stamped at that start, and listed after them. The last run is `open`.
    recorded: Vec<RecordedRun>,
    /// The run the next frame encoded while recording joins if it is like it:
    /// kept apart from `recorded` so that joining is four comparisons and a count.
    open: Option<RecordedRun>,
    /// Payload files not sent yet, with where their frame's header starts in the
    /// byte stream: each goes with the write that carries that header, or earlier.
    files: VecDeque<(u64, Arc<OwnedFd>)>,
    /// Where the header of the last file sent ends: no file goes until the stream is
    /// written that far, so the receiver holds at most one write's files unclaimed.
    files_sent_to: u64,
    /// Bytes ever encoded and ever written: where each frame ends in the link's
    /// byte stream, to tell which write carried its last byte.
    pushed: u64,
    written: u64,
    /// Where the last run left in the link's in-flight list ([`LinkTiming`]) ends
    /// in the byte stream: a write that starts before it carries bytes of those
    /// runs, and its end is recorded for them. Kept here, where every write looks,
    /// so that a link with nothing in flight never touches its timing on a write.
    in_flight_to: u64,
}

/// Frames queued while recording, alike, one after another in the byte stream.
#[derive(Debug)]
struct RecordedRun {
    /// Where the first one's header starts in the buffer of small frames, until the
    /// write's start stamps it; `None` for frames staged, stamped when encoded.
    header_at: Option<usize>,
    run: FrameRun,
    /// When they were queued.
    at: Mono,
}

/// Writes `stamp` into the headers of run `u`'s frames in `small`, if they were
/// encoded there unstamped (once: the run then no longer says where they are).
#[inline]
fn stamp_run(small: &mut BytesMut, u: &mut RecordedRun, stamp: [u8; 8]) {
    let Some(header_at) = u.header_at.take() else { return };
    let (len, count) = (u.run.wire_len as usize, u.run.count as usize);
    if let Some(frames) = small.get_mut(header_at..header_at + len * count) {
        for f in frames.chunks_exact_mut(len) {
            f[TIMESTAMP_AT..TIMESTAMP_AT + stamp.len()].copy_from_slice(&stamp);
        }
    }
}

/// A frame waiting for the write that stamps it.
#[derive(Debug)]
struct Staged {
    frame: Frame,
    /// When it was queued.
    at: Mono,
    /// The file its payload goes in, if any.
    file: Option<Arc<OwnedFd>>,
    /// Queued while recording: its queue and send times are recorded.
    record: bool,
}

impl OutQueue {
    /// Encodes `frame`, with `stamp` as its timestamp when this hop took one while
    /// recording, and its payload in `file` if it goes as one (header only, then).
    /// Returns the bytes it adds to the link's byte stream.
    fn push(&mut self, frame: &Frame, stamp: Option<u64>, file: Option<Arc<OwnedFd>>) -> u64 {
        // A frame encoded otherwise ends the open run: its frames are contiguous.
        self.close_run();
        let mut header = stamped_header(frame, stamp);
        if let Some(file) = file {
            header.flags |= FLAG_PAYLOAD_FD;
            self.files.push_back((self.pushed, file));
            header.encode(frame.payload.len(), &mut self.small);
            self.bytes += HEADER_LEN;
            self.pushed += HEADER_LEN as u64;
            return HEADER_LEN as u64;
        }
        if frame.payload.len() < ZERO_COPY_MIN {
            return self.append_small(&header, &frame.payload);
        }
        self.bytes += frame.wire_len();
        self.pushed += frame.wire_len() as u64;
        header.encode(frame.payload.len(), &mut self.small);
        self.segments.push_back(self.small.split().freeze());
        self.segments.push_back(frame.payload.clone());
        frame.wire_len() as u64
    }

    /// Encodes a frame of `header` and a small `payload` into the buffer of small
    /// frames; returns the bytes it adds to the link's byte stream.
    #[inline]
    fn append_small(&mut self, header: &FrameHeader, payload: &[u8]) -> u64 {
        let wire_len = HEADER_LEN + payload.len();
        header.encode(payload.len(), &mut self.small);
        self.small.extend_from_slice(payload);
        self.bytes += wire_len;
        self.pushed += wire_len as u64;
        wire_len as u64
    }

    /// True when frames wait for the stamp of the next write.
    fn has_unstamped(&self) -> bool {
        !self.staged.is_empty() || !self.recorded.is_empty() || self.open.is_some()
    }

    /// Encodes `frame`, queued at `at` while recording, at once: its header stamp is
    /// written in place by [`OutQueue::stamp_queued`]. Only for a small frame
    /// without a file when nothing is staged, so that it stays in `small` in order.
    fn push_unstamped(&mut self, frame: &Frame, at: Mono) {
        let header_at = self.small.len();
        let wire_len = frame.wire_len() as u64;
        let like = |o: &&mut RecordedRun| {
            (o.at, o.run.wire_len, o.run.stream, o.run.tag)
                == (at, wire_len, frame.header.stream, frame.header.tag)
        };
        match self.open.as_mut().filter(like) {
            Some(o) => o.run.count += 1,
            None => {
                self.close_run();
                // Where it ends is set when the run closes: joining counts, no more.
                let run = FrameRun::one(frame, wire_len, 0);
                self.open = Some(RecordedRun { header_at: Some(header_at), run, at });
            }
        }
        self.append_small(&stamped_header(frame, Some(0)), &frame.payload);
    }

    /// Moves the open run to the list of runs waiting for their write, with where it
    /// ends in the link's byte stream (everything encoded since it opened is its).
    fn close_run(&mut self) {
        if let Some(o) = self.take_open() {
            self.recorded.push(o);
        }
    }

    /// The open run, closed: everything encoded since it opened is its.
    fn take_open(&mut self) -> Option<RecordedRun> {
        let pushed = self.pushed;
        self.open.take().map(|mut o| {
            o.run.last_end = pushed;
            o
        })
    }

    fn is_empty(&self) -> bool {
        self.bytes == 0 && self.staged.is_empty()
    }

    /// Writes header stamp `stamp` into the frames encoded while recording and
    /// encodes the staged frames with it; the runs recorded stay listed, for
    /// the end of the write to record.
    fn stamp_queued(&mut self, stamp: u64) {
        let stamp_bytes = stamp.to_le_bytes();
        // The open run stays open (most flushes take one run per link, and then the
        // list is not touched); a staged frame encoded below closes it.
        for u in self.recorded.iter_mut().chain(self.open.as_mut()) {
            stamp_run(&mut self.small, u, stamp_bytes);
        }
        if self.staged.is_empty() {
            return;
        }
        // Taken and given back, so the staging vector keeps its capacity: no
        // allocation per flush while recording.
        let mut staged = std::mem::take(&mut self.staged);
        for s in staged.drain(..) {
            // A frame staged only to keep its place behind a probe takes no stamp.
            let stamp = (s.record || s.frame.header.is_timed()).then_some(stamp);
            let wire_len = self.push(&s.frame, stamp, s.file);
            if s.record {
                let run = FrameRun::one(&s.frame, wire_len, self.pushed);
                // Like frames staged one after another make one run: one sample.
                let joined = self
                    .recorded
                    .last_mut()
                    .is_some_and(|last| last.header_at.is_none() && last.at == s.at && last.run.absorb(&run));
                if !joined {
                    self.recorded.push(RecordedRun { header_at: None, run, at: s.at });
                }
            }
        }
        self.staged = staged;
    }

    /// Writes header stamp `stamp` into the frames of the open run (under
    /// [`write_open_run`]'s condition, the only frames waiting for a stamp).
    #[inline]
    fn stamp_open(&mut self, stamp: u64) {
        if let Some(o) = self.open.as_mut() {
            stamp_run(&mut self.small, o, stamp.to_le_bytes());
        }
    }

    /// Writes as much as the socket takes; true when everything went.
    fn write(&mut self, sock: &Socket) -> io::Result<bool> {
        loop {
            if self.segments.is_empty() && self.small.is_empty() {
                self.bytes = 0;
                return Ok(true);
            }
            if !self.segments.is_empty() && !self.small.is_empty() {
                self.segments.push_back(self.small.split().freeze());
            }
            let result = if self.segments.is_empty() && self.files.is_empty() {
                // The common case: small frames only, written from the one buffer it keeps.
                sock.write_vectored(&[IoSlice::new(&self.small)])
            } else {
                let sources: Vec<&[u8]> = if self.segments.is_empty() {
                    vec![&self.small]
                } else {
                    self.segments.iter().take(MAX_IOV).map(|b| &b[..]).collect()
                };
                let total = sources.iter().map(|b| b.len() as u64).sum();
                let (files, limit) = if self.written < self.files_sent_to {
                    (Vec::new(), before_next_file(&self.files, self.written, total))
                } else {
                    files_for(&self.files, self.written, total)
                };
                let slices = slices_up_to(&sources, limit);
                if files.is_empty() {
                    sock.write_vectored(&slices)
                } else {
                    sock.send_with_fds(&slices, &files).inspect(|_| {
                        // Gone with the write's first byte, whatever its length.
                        if let Some((at, _)) = self.files.drain(..files.len()).next_back() {
                            self.files_sent_to = at + HEADER_LEN as u64;
                        }
                    })
                }
            };
            match result {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Drops the first `n` bytes queued: they were written.
    fn advance(&mut self, mut n: usize) {
        self.bytes -= n;
        self.written += n as u64;
        if self.segments.is_empty() {
            self.small.advance(n);
            if self.small.is_empty() {
                self.small.clear();
            }
            return;
        }
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
}

/// The payload files to send with a write of `total` bytes starting at byte
/// `written` of the stream: those whose header starts in them, at most
/// [`shared_payload::MAX_FDS_PER_MSG`]; and, when some are left over, how many bytes
/// the write may take so that no header goes before its file.
fn files_for(files: &VecDeque<(u64, Arc<OwnedFd>)>, written: u64, total: u64) -> (Vec<RawFd>, Option<usize>) {
    let end = written + total;
    let mut out = Vec::new();
    for (at, file) in files {
        if *at >= end {
            break;
        }
        if out.len() == shared_payload::MAX_FDS_PER_MSG {
            // `at > written`: the files taken start at `written` or later, before it.
            return (out, Some((*at - written) as usize));
        }
        out.push(file.as_raw_fd());
    }
    (out, None)
}

/// How many of `total` bytes from byte `written` may go before the header of the
/// next file to send, if that header starts within them.
fn before_next_file(files: &VecDeque<(u64, Arc<OwnedFd>)>, written: u64, total: u64) -> Option<usize> {
    let (at, _) = files.front()?;
    (*at < written + total).then(|| at.saturating_sub(written) as usize)
}

/// The first `limit` bytes of `sources` (all of them without a limit), as slices.
fn slices_up_to<'a>(sources: &[&'a [u8]], limit: Option<usize>) -> Vec<IoSlice<'a>> {
    let mut left = limit.unwrap_or(usize::MAX);
    let mut slices = Vec::with_capacity(sources.len());
    for &b in sources {
        if left == 0 {
            break;
        }
        let take = b.len().min(left);
        slices.push(IoSlice::new(&b[..take]));
        left -= take;
    }
    slices
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
    /// Payload files received and not yet matched to their frame's header.
    files: VecDeque<OwnedFd>,
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
    /// A list that keeps its room, swapped in for `dirty` or for the ready links while
    /// a pass goes through them (empty between passes): a pass allocates no list.
    spare_links: Vec<LinkId>,
    /// Closures found while writing, reported by the next `poll_recv`.
    broken: Vec<(LinkId, Option<String>)>,
    max_frame: usize,
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
        };
        self.conns.insert(link, conn);
        // Frames may have arrived with the end of the handshake.
        self.ready.push(link);
        Ok(())
    }

    /// Sets the clock that stamps frames while monitoring (the node's global-clock
    /// time base); the wall clock as read when the route was made until then.
    pub fn set_clock(&mut self, clock: NodeClock) {
        // Reads waiting are turned to net with the clock they were taken on.
        self.record_deferred();
        self.monitor.clock = clock;
    }

    /// Starts recording every frame's latency components under program tag `program`
    /// (see `crate::recording`); what was recorded before is kept.
    pub fn monitor_start(&mut self, program: u32) {
        // Samples taken before keep the program tag they were taken under.
        self.record_deferred();
        self.monitor.start(program);
    }

    /// Keeps the frames of `stream` under their own program tag (`None`: the stream
    /// is gone), so that workloads sharing the tree are told apart.
    pub fn set_stream_program(&mut self, stream: u32, program: Option<u32>) {
        self.record_deferred();
        self.monitor.set_stream_program(stream, program);
    }

    /// Stops recording; frames already queued are still stamped and recorded.
    pub fn monitor_stop(&mut self) {
        // Staged frames are encoded now, so frames sent after the stop (encoded at
        // once) cannot overtake them.
        let start = mono_now();
        for (_, c) in self.conns.iter_mut() {
            stamp_in_flight(c, &mut self.monitor, start);
        }
        self.monitor.recording = false;
    }

    /// What was recorded so far.
    pub fn monitor_report(&mut self) -> treecast_monitor::Report {
        self.record_deferred();
        self.monitor.report()
    }

    /// Forgets what was recorded.
    pub fn monitor_clear(&mut self) {
        self.record_deferred();
        self.monitor.clear();
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
        let mut deferred = std::mem::take(&mut self.monitor.deferred);
        for Waiting(link, sample) in deferred.drain(..) {
            if let Some(c) = self.conns.get_mut(link) {
                self.monitor.count_deferred(&mut c.timing, sample);
            }
        }
        // The list keeps its room from pass to pass, unless one pass made it large.
        if deferred.capacity() <= MAX_DEFERRED {
            self.monitor.deferred = deferred;
        }
    }

    /// Stops carrying `link`, its samples not counted yet counted first (they would
    /// name a link gone).
    fn remove_conn(&mut self, link: LinkId) -> Option<Conn> {
        self.record_deferred();
        self.conns.remove(link)
    }

    /// Says where `link` sits in the tree, which names its samples.
    pub fn place_link(&mut self, link: LinkId, place: LinkPlace) {
        // Samples taken before keep the name they were taken under.
        self.record_deferred();
        if let Some(c) = self.conns.get_mut(link) {
            c.timing.set_place(place);
        }
    }

    /// Sets the peer's clock against this node's, to correct the net component.
    pub fn set_peer_clock(&mut self, link: LinkId, clock: PeerClock) {
        // Reads waiting are turned to net with the offset in effect when taken.
        self.record_deferred();
        if let Some(c) = self.conns.get_mut(link) {
            c.timing.peer_clock = clock;
        }
    }

    /// Sends payloads of at least `bytes` bytes to links within this host as sealed
    /// memory files instead of through the socket; `None` (until set) never does.
    /// Off by default: on the machines measured the socket was faster at every
    /// size (docs/processes.md, "Large messages within a host").
    pub fn set_zero_copy_min(&mut self, bytes: Option<usize>) {
        if bytes.is_some() {
            shared_payload::raise_file_limit();
        }
        self.zero_copy_min = bytes;
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
            let result = guard.try_io(|inner| read_some(inner.get_ref(), &mut c.rbuf, &mut c.files));
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
            match read_some(&c.sock, &mut c.rbuf, &mut c.files) {
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
///
/// A Unix socket returns no more than one payload file per read, and stops there:
/// a short read that brought a file does not say the socket is drained.
fn read_some(sock: &Socket, rbuf: &mut BytesMut, files: &mut VecDeque<OwnedFd>) -> io::Result<(usize, bool)> {
    let room = rbuf.capacity() - rbuf.len();
    let files_before = files.len();
    let (n, asked) = if room >= READ_CHUNK {
        (sock.read_into_spare(rbuf, files)?, room)
    } else {
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let n = sock.read_with_fds(&mut scratch, files)?;
            rbuf.extend_from_slice(&scratch[..n]);
            Ok::<_, io::Error>((n, scratch.len()))
        })?
    };
    Ok((n, n < asked && files.len() == files_before))
}

/// `frame`'s header as this hop sends it: stamped with `stamp` when this hop took
/// one while recording, otherwise unstamped (a forwarded frame keeps the previous
/// hop's stamp in its header, which measures nothing for this hop); no payload file.
#[inline]
fn stamped_header(frame: &Frame, stamp: Option<u64>) -> FrameHeader {
    let mut header = frame.header;
    header.flags &= !FLAG_PAYLOAD_FD;
    match stamp {
        Some(ns) => {
            header.timestamp_ns = ns;
            header.flags |= FLAG_STAMPED;
        }
        None => header.flags &= !FLAG_STAMPED,
    }
    header
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
    let read_at = monitor.recording.then(|| monitor.ticker.now());
    // The list keeps its room from one read to the next: no allocation per read.
    let mut frames = FRAME_LIST.take();
    cut_frames_into(&mut c.rbuf, max_frame, &mut c.files, &mut frames).map_err(|e| e.to_string())?;
    // A clock probe needs the read's end, as the `Instant` the core measures with,
    // whether or not anything records; cutting small frames takes far less than the
    // clock's error bound.
    let timed_at = frames.iter().any(|f| f.header.is_timed()).then(Instant::now);
    if c.files.len() > MAX_WAITING_FILES {
        return Err(format!("the peer sent {} files no frame claims", c.files.len()));
    }
    if c.state != State::Open {
        frames.clear();
        FRAME_LIST.set(frames);
        return Ok(());
    }
    // The frames of one read reach the core together (it then takes them in order:
    // a frame's wait for the ones before it is the core's time, not the link's).
    if let Some(at) = read_at {
        let handed = monitor.ticker.now();
        monitor.read_deferred(link, &frames, at, handed);
    }
    for f in frames.drain(..) {
        *any = true;
        match timed_at {
            Some(at) if f.header.is_timed() => sink(link, RouteEvent::Timed(f, at)),
            _ => sink(link, RouteEvent::Frame(f)),
        }
    }
    if frames.capacity() <= MAX_FRAMES_GUESS {
        FRAME_LIST.set(frames);
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
    /// A frame says its payload came as a file, and none came with it (or the link
    /// cannot carry files).
    #[error("a frame says its payload came as a file beside it, and none came")]
    NoFile,
    /// A payload file that cannot be used.
    #[error("{0}")]
    File(String),
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
/// A frame whose payload comes as a file ([`FLAG_PAYLOAD_FD`]) is refused: a byte
/// stream carries none.
pub fn cut_frames(buf: &mut BytesMut, max_frame: usize) -> Result<Vec<Frame>, CutError> {
    let mut frames = Vec::new();
    cut_frames_into(buf, max_frame, &mut VecDeque::new(), &mut frames)?;
    Ok(frames)
}

/// [`cut_frames`] into `frames` (empty), so that a caller can keep its list's room
/// from one read to the next, for a link that carries payload files: `files` holds
/// those received and not yet matched, oldest first.
fn cut_frames_into(
    buf: &mut BytesMut,
    max_frame: usize,
    files: &mut VecDeque<OwnedFd>,
    frames: &mut Vec<Frame>,
) -> Result<(), CutError> {
    while buf.len() >= HEADER_LEN {
        let (mut header, len) = FrameHeader::decode(&buf[..HEADER_LEN])?;
        if len > max_frame {
            return Err(CutError::TooLarge { len, max: max_frame });
        }
        if frames.is_empty() {
            // Sized once, as if the rest were like the first: a read of many small
            // frames makes one allocation at most instead of growing again and again.
            frames.reserve((buf.len() / (HEADER_LEN + len)).clamp(1, MAX_FRAMES_GUESS));
        }
        if header.flags & FLAG_PAYLOAD_FD != 0 {
            // The sender sends a file no later than its header's first byte.
            let file = files.pop_front().ok_or(CutError::NoFile)?;
            let payload = shared_payload::map(file, len).map_err(CutError::File)?;
            buf.advance(HEADER_LEN);
            header.flags &= !FLAG_PAYLOAD_FD;
            frames.push(Frame { header, payload });
            continue;
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
    Ok(())
}

/// A sealed memory file holding `payload`, or `None` (said once) when the kernel
/// cannot make one: the payload then goes through the socket.
fn payload_file(payload: &Bytes) -> Option<Arc<OwnedFd>> {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    match shared_payload::file_for(payload) {
        Ok(file) => Some(file),
        Err(e) => {
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!("large payloads go through the socket: cannot make a sealed memory file: {e}");
            }
            None
        }
    }
}

/// Writes what `c` (the link `link`) has queued, stamping its frames while
/// monitoring; their queue and send are counted later (see [`record_write`]).
fn write_timed(link: LinkId, c: &mut Conn, monitor: &mut Monitoring) -> io::Result<bool> {
    // The first test's conditions are tested in this order, each only if the one
    // before passed: the common case when not recording reads no more than it must.
    if !c.out.has_unstamped() && !monitor.recording && c.out.written >= c.out.in_flight_to {
        return c.out.write(&c.sock);
    }
    if c.out.staged.is_empty() && c.out.recorded.is_empty() && c.out.written >= c.out.in_flight_to {
        return match c.out.open.is_some() {
            true => write_open_run(link, c, monitor),
            // Nothing to stamp and nothing in flight: nothing of this write is recorded.
            false => c.out.write(&c.sock),
        };
    }
    let (unstamped, in_flight) = (c.out.has_unstamped(), c.out.written < c.out.in_flight_to);
    // A clock probe's stamp is read exactly: the global clock is measured with it.
    let start = match c.out.staged.iter().any(|s| s.frame.header.is_timed()) {
        true => mono_now(),
        false => monitor.ticker.now(),
    };
    if unstamped {
        c.out.stamp_queued(monitor.stamp(start));
    }
    let result = c.out.write(&c.sock);
    let end = monitor.ticker.now();
    record_write(link, c, monitor, in_flight, start, end);
    result
}

/// The common write while recording: one run of frames encoded in place, nothing
/// staged, listed or in flight before it. What [`write_timed`] does then, without
/// the lists' bookkeeping (a third of the instructions recording added per write).
#[inline]
fn write_open_run(link: LinkId, c: &mut Conn, monitor: &mut Monitoring) -> io::Result<bool> {
    let start = monitor.ticker.now();
    c.out.stamp_open(monitor.stamp(start));
    let result = c.out.write(&c.sock);
    let end = monitor.ticker.now();
    if let Some(r) = c.out.take_open() {
        record_run(link, c, monitor, r, start, end);
    }
    // A write cut short left the run in flight: its end counts for it.
    if c.out.written < c.out.in_flight_to {
        monitor.write_deferred(link, c.out.written, end);
    }
    result
}

/// Records the write from `start` to `end` on `link`: each run it stamped that it
/// carried whole is deferred with its queue and send at once (the common case:
/// the link's timing is not touched); a run it cut waits in the link's in-flight
/// list, and so does what was there before it (`in_flight`), until the writes
/// that carry their last bytes are counted ([`Monitoring::write_deferred`]).
fn record_write(
    link: LinkId,
    c: &mut Conn,
    monitor: &mut Monitoring,
    in_flight: bool,
    start: Mono,
    end: Mono,
) {
    drain_runs(c, &mut |c, r| record_run(link, c, monitor, r, start, end));
    if in_flight || c.out.written < c.out.in_flight_to {
        monitor.write_deferred(link, c.out.written, end);
    }
}

/// Records run `r`, stamped by the write from `start` to `end` on `link` (see
/// [`record_write`]).
#[inline]
fn record_run(link: LinkId, c: &mut Conn, monitor: &mut Monitoring, r: RecordedRun, start: Mono, end: Mono) {
    let waited = start.since(r.at);
    if r.run.last_end <= c.out.written {
        monitor.sent_deferred(link, &r.run, waited, end.since(start));
    } else {
        leave_in_flight(c, monitor, r.run, waited, start);
    }
}

/// Puts `run`, queued `waited` ns before the write start `start` that stamped it,
/// in the in-flight list of `c`'s link: the writes that carry it count its send.
/// Out of line: only a write cut short or a stop comes here, and its code would
/// otherwise sit among the frame path's.
#[cold]
#[inline(never)]
fn leave_in_flight(c: &mut Conn, monitor: &mut Monitoring, run: FrameRun, waited: u64, start: Mono) {
    c.out.in_flight_to = run.last_end;
    monitor.queued(&mut c.timing, run, waited, start);
}

/// Stamps the frames `c` queued for a stamp with `start` without writing them (a
/// stop: frames sent after it must not overtake them), their runs left in flight.
fn stamp_in_flight(c: &mut Conn, monitor: &mut Monitoring, start: Mono) {
    if !c.out.has_unstamped() {
        return;
    }
    c.out.stamp_queued(monitor.stamp(start));
    drain_runs(c, &mut |c, r| leave_in_flight(c, monitor, r.run, start.since(r.at), start));
}

/// Hands `each` the runs of `c` that [`OutQueue::stamp_queued`] stamped, oldest
/// first: those listed, then the open one. The list keeps its room from one write
/// to the next.
fn drain_runs(c: &mut Conn, each: &mut dyn FnMut(&mut Conn, RecordedRun)) {
    let open = c.out.take_open();
    let mut runs = std::mem::take(&mut c.out.recorded);
    for r in runs.drain(..) {
        each(c, r);
    }
    c.out.recorded = runs;
    if let Some(r) = open {
        each(c, r);
    }
}

impl Route for StreamRoute {
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use treecast_wire::{encode_batch, FLAG_TIMED, MAX_PAYLOAD_LEN};

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

    /// Like frames staged together (behind a large frame or a probe) make one run,
    /// so one sample, not one per frame.
    #[test]
    fn like_frames_staged_together_make_one_run() {
        let mut q = OutQueue::default();
        let at = Mono::from_nanos(100);
        for tag in [1, 1, 1, 2] {
            let frame = Frame::new(FrameHeader::data(3, tag, 0), vec![7; 10]);
            q.staged.push(Staged { frame, at, file: None, record: true });
        }
        q.stamp_queued(0xABCD);
        q.close_run();
        let runs: Vec<_> = q.recorded.drain(..).map(|r| (r.run.tag, r.run.count)).collect();
        assert_eq!(runs, [(1, 3), (2, 1)]);
    }

    /// Frames encoded while recording form runs of like frames queued together; a
    /// frame encoded otherwise ends a run. Every recorded frame gets the flush's
    /// stamp in its header and the plain one keeps none.
    #[test]
    fn frames_encoded_while_recording_form_runs_and_all_get_the_stamp() {
        let mut q = OutQueue::default();
        let like = |tag| Frame::new(FrameHeader::data(3, tag, 0), vec![7; 10]);
        let (t0, t1) = (Mono::from_nanos(100), Mono::from_nanos(200));
        for (tag, at) in [(1, t0), (1, t0), (1, t0), (2, t0), (2, t1), (2, t1)] {
            q.push_unstamped(&like(tag), at);
        }
        q.push(&like(2), None, None);
        q.push_unstamped(&like(2), t1);
        q.stamp_queued(0xABCD);
        q.close_run();
        let start = Mono::from_nanos(1_000);
        let runs: Vec<_> = q
            .recorded
            .drain(..)
            .map(|r| (r.run.tag, r.run.count, r.run.last_end, start.since(r.at)))
            .collect();
        let len = (HEADER_LEN + 10) as u64;
        assert_eq!(
            runs,
            [(1, 3, 3 * len, 900), (2, 1, 4 * len, 900), (2, 2, 6 * len, 800), (2, 1, 8 * len, 800)]
        );
        let frames = cut_frames(&mut q.small.clone(), MAX_PAYLOAD_LEN).unwrap();
        let stamps: Vec<_> = frames.iter().map(|f| f.header.stamp()).collect();
        let stamped = Some(0xABCD);
        assert_eq!(stamps, [stamped, stamped, stamped, stamped, stamped, stamped, None, stamped]);
        assert!(!q.has_unstamped());
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

    /// Sends a 10-byte frame of tag 7 on `link` of `from` and returns what `to` read.
    async fn hop(from: &mut StreamRoute, link: LinkId, to: &mut StreamRoute) -> Vec<(LinkId, RouteEvent)> {
        from.send(&[link], &Frame::new(FrameHeader::data(1, 7, 0), vec![1; 10]));
        flushed(from).await;
        recv(to, 1).await
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

    /// A clock that stands at `ns`: its distortion takes back every nanosecond that passes.
    fn fixed_clock(ns: i64) -> NodeClock {
        NodeClock { base: mono_now(), base_ns: 0, offset_ns: ns, drift_ppb: -1_000_000_000, epoch_ns: 0 }
    }

    #[tokio::test]
    async fn while_monitoring_each_end_records_its_components_and_net_is_corrected_by_the_peer_clock() {
        use treecast_monitor::{Component, Key};
        let (mut child, la, mut parent, lb) = linked_routes();
        child.place_link(la, LinkPlace { lower_node: 4, to_parent: true });
        parent.place_link(lb, LinkPlace { lower_node: 4, to_parent: false });
        // The child's clock reads 5 s, the parent's 7 s, and the global clock says the
        // child's runs 2 s less 1 µs behind: each frame took 1 µs on the way.
        child.set_clock(fixed_clock(5_000_000_000));
        parent.set_clock(fixed_clock(7_000_000_000));
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
        // A read waiting to be counted keeps the offset in effect when it was taken.
        hop(&mut child, la, &mut parent).await;
        parent.set_peer_clock(lb, PeerClock { offset_ns: -2_000_000_000 + 5_000, drift_ppb: 0, at_ns: 0 });
        assert_eq!(count(&mut parent, Component::Net), (4, 4_000));
        assert_eq!(count(&mut child, Component::Queue).0, 4);
        // Taken after the change, with the new offset.
        hop(&mut child, la, &mut parent).await;
        assert_eq!(count(&mut parent, Component::Net), (5, 9_000));

        // Stopped: nothing more is recorded, and frames no longer carry this clock.
        child.monitor_stop();
        parent.monitor_stop();
        let got = hop(&mut child, la, &mut parent).await;
        let RouteEvent::Frame(f) = &got[0].1 else { panic!() };
        assert_ne!(f.header.timestamp_ns, 5_000_000_000);
        assert_eq!(child.monitor_report().count(), 10);
        assert_eq!(parent.monitor_report().count(), 10);
        parent.monitor_clear();
        assert_eq!(parent.monitor_report().count(), 0);
    }

    #[tokio::test]
    async fn samples_are_counted_by_batches_after_the_pass_has_written_what_it_sends_and_none_is_lost() {
        let (mut child, la, mut parent, lb) = linked_routes();
        child.monitor_start(1);
        parent.monitor_start(1);
        let frame = |tag| Frame::new(FrameHeader::data(1, tag, 0), vec![1; 10]);
        child.send(&[la], &frame(7));
        child.flush();
        assert_eq!(child.monitor.deferred.len(), 1, "a write's sample waits for its batch");
        assert_eq!(child.monitor.report().count(), 0);
        // The parent's read waits, and so does its reply's write.
        recv(&mut parent, 1).await;
        parent.send(&[lb], &frame(7));
        parent.flush();
        assert_eq!(parent.monitor.deferred.len(), 2);
        assert_eq!(parent.monitor.report().count(), 0, "nothing counted before a batch waits");
        // A report counts what waits.
        assert_eq!(parent.monitor_report().count(), 4, "net and deliver, queue and send");
        assert!(parent.monitor.deferred.is_empty());
        // The pass that fills a batch counts it, once its writes are done.
        for pass in 1..COUNT_BATCH {
            assert_eq!(child.monitor.report().count(), 0, "pass {pass}: nothing counted yet");
            child.send(&[la], &frame(7));
            child.flush();
            // Read, so that every write takes all it has (a full socket keeps frames in flight).
            recv(&mut parent, 1).await;
        }
        assert!(child.monitor.deferred.is_empty(), "a full batch is counted");
        assert_eq!(child.monitor.report().count(), 2 * COUNT_BATCH as u64, "queue and send of each");
        // A link closed before its samples are counted keeps them.
        recv(&mut child, 1).await;
        assert_eq!(child.monitor.deferred.len(), 1);
        child.close(la, Close::Now);
        assert_eq!(child.monitor_report().count(), 2 * COUNT_BATCH as u64 + 2);
        // A route read and never flushed still counts, within its bound: frames of
        // alternating tags make a sample each.
        let n = MAX_DEFERRED + 100;
        let (mut other, lo, mut reader, _) = linked_routes();
        reader.monitor_start(1);
        for i in 0..n {
            other.send(&[lo], &frame(7 + (i % 2) as i32));
        }
        flushed(&mut other).await;
        recv(&mut reader, n).await;
        assert!(
            reader.monitor.deferred.len() < MAX_DEFERRED,
            "{} samples waiting",
            reader.monitor.deferred.len()
        );
        assert_eq!(
            reader.monitor_report().count(),
            n as u64,
            "none lost (deliver only: the sender stamps none)"
        );
    }

    #[tokio::test]
    async fn samples_taken_before_a_link_moves_keep_the_place_they_were_taken_at() {
        let (mut child, la, mut parent, lb) = linked_routes();
        parent.place_link(lb, LinkPlace { lower_node: 4, to_parent: false });
        parent.monitor_start(1);
        child.send(&[la], &Frame::new(FrameHeader::data(1, 7, 0), vec![1; 10]));
        flushed(&mut child).await;
        recv(&mut parent, 1).await;
        // The child moves (a recovery) before the parent's pass ends.
        parent.place_link(lb, LinkPlace { lower_node: 6, to_parent: false });
        let links: Vec<u32> = parent.monitor_report().cells.iter().map(|c| c.link).collect();
        assert_eq!(links, [4], "counted under the place it was read at");
    }

    #[tokio::test]
    async fn frames_stamped_in_place_across_cut_short_writes_are_each_stamped_and_counted_once() {
        use treecast_monitor::Component;
        let (mut child, la, mut parent, _) = linked_routes();
        child.set_clock(fixed_clock(5_000_000_000));
        child.monitor_start(1);
        parent.monitor_start(1);
        // About 2.6 MB in passes of 1,000 frames: more than the socket holds while
        // nobody reads, so writes are cut short in the middle of runs of frames.
        let n = 20_000usize;
        for i in 0..n {
            let tag = if i % 3000 < 2 { 8 } else { 7 };
            child.send(&[la], &Frame::new(FrameHeader::data(1, tag, 0), vec![(i % 251) as u8; 100]));
            if i % 1000 == 999 {
                child.flush();
            }
        }
        let writer = tokio::spawn(async move {
            flushed(&mut child).await;
            child
        });
        let got = recv(&mut parent, n).await;
        let mut child = writer.await.unwrap();
        for (i, (_, event)) in got.iter().enumerate() {
            let RouteEvent::Frame(f) = event else { panic!("{event:?}") };
            assert_eq!((f.header.stamp(), f.payload[0]), (Some(5_000_000_000), (i % 251) as u8), "frame {i}");
        }
        let count = |route: &mut StreamRoute, component: Component| -> u64 {
            route.monitor_report().cells.iter().filter(|c| c.component == component).map(|c| c.count).sum()
        };
        assert_eq!(count(&mut child, Component::Queue), n as u64);
        assert_eq!(count(&mut child, Component::Send), n as u64);
        assert_eq!(count(&mut parent, Component::Net), n as u64);
        assert_eq!(count(&mut parent, Component::Deliver), n as u64);
    }

    #[tokio::test]
    async fn a_clock_probe_is_stamped_at_its_write_and_read_with_its_instant_while_nothing_records() {
        let (mut child, la, mut parent, _) = linked_routes();
        child.set_clock(fixed_clock(5_000_000_000));
        let mut probe = Frame::new(FrameHeader::control(), vec![1; 10]);
        probe.header.flags |= FLAG_TIMED;
        let before = Instant::now();
        child.send(&[la], &Frame::new(FrameHeader::data(1, 1, 0), vec![1; 10]));
        child.send(&[la], &probe);
        child.send(&[la], &Frame::new(FrameHeader::data(1, 3, 0), vec![1; 10]));
        flushed(&mut child).await;
        let got = recv(&mut parent, 3).await;
        let after = Instant::now();
        let frames: Vec<(&Frame, Option<Instant>)> = got
            .iter()
            .map(|(_, e)| match e {
                RouteEvent::Frame(f) => (f, None),
                RouteEvent::Timed(f, at) => (f, Some(*at)),
                RouteEvent::Closed(r) => panic!("closed: {r:?}"),
            })
            .collect();
        assert_eq!(frames.iter().map(|(f, _)| f.header.tag).collect::<Vec<_>>(), [1, 0, 3], "in order");
        let (timed, read_at) = frames[1];
        assert_eq!(timed.header.flags & FLAG_STAMPED, FLAG_STAMPED);
        assert_eq!(timed.header.timestamp_ns, 5_000_000_000, "stamped on the sender's clock");
        assert!(read_at.is_some_and(|at| before <= at && at <= after), "{read_at:?}");
        for (f, at) in [frames[0], frames[2]] {
            assert!(at.is_none() && f.header.flags & FLAG_STAMPED == 0, "nothing records: {f:?}");
        }
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
        // Gone: its frames fall back to the recording's tag. The parent's samples
        // of frames read before, not counted yet, keep the tag they came under.
        parent.set_stream_program(2, None);
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
        let report = parent.monitor_report();
        assert!(
            report.cells.iter().all(|c| c.count > 0),
            "no cell opened for samples that never came: {report:?}"
        );
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

    /// The payload size from which the tests send files.
    const FILE_MIN: usize = 64 << 10;

    /// Sends `frames` from one end of a Unix link to the other and returns them as read.
    async fn across(frames: &[Frame], zero_copy_min: Option<usize>, recording: bool) -> Vec<Frame> {
        let (mut a, la, mut b, _) = linked_routes();
        a.set_zero_copy_min(zero_copy_min);
        if recording {
            a.monitor_start(1);
        }
        for f in frames {
            a.send(&[la], f);
        }
        let writer = tokio::spawn(async move {
            flushed(&mut a).await;
            a
        });
        let got = recv(&mut b, frames.len()).await;
        drop(writer.await.unwrap());
        got.into_iter()
            .map(|(_, e)| match e {
                RouteEvent::Frame(f) => f,
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[tokio::test]
    async fn large_payloads_cross_a_unix_link_as_sealed_files_in_order_with_the_small_ones() {
        // More files than one write carries, between small frames.
        let frames: Vec<Frame> = (0..3 * shared_payload::MAX_FDS_PER_MSG + 5)
            .map(|i| {
                let n = if i % 3 == 2 { 10 } else { FILE_MIN + i };
                let payload: Vec<u8> = (0..n).map(|j| (i * 7 + j) as u8).collect();
                Frame::new(FrameHeader::data(1, i as i32, 0), payload)
            })
            .collect();
        for recording in [false, true] {
            let got = across(&frames, Some(FILE_MIN), recording).await;
            assert_eq!(got.len(), frames.len());
            for (sent, got) in frames.iter().zip(&got) {
                assert_eq!(got.header.tag, sent.header.tag);
                assert_eq!(got.header.flags & FLAG_PAYLOAD_FD, 0, "the core never sees the flag");
                assert_eq!(got.payload, sent.payload);
                let as_file = sent.payload.len() >= FILE_MIN;
                assert_eq!(
                    shared_payload::file_of(&got.payload).is_some(),
                    as_file,
                    "frame {}",
                    sent.header.tag
                );
            }
        }
    }

    #[tokio::test]
    async fn a_node_passes_a_payload_file_on_without_copying_it() {
        use std::os::unix::fs::MetadataExt;
        let inode = |payload: &Bytes| {
            let fd = shared_payload::file_of(payload).unwrap();
            std::fs::File::from(fd.try_clone().unwrap()).metadata().unwrap().ino()
        };
        let frame = Frame::new(FrameHeader::data(1, 0, 0), vec![9u8; 300_000]);
        let at_node = across(std::slice::from_ref(&frame), Some(FILE_MIN), false).await.remove(0);
        let passed_on = across(std::slice::from_ref(&at_node), Some(FILE_MIN), false).await.remove(0);
        assert_eq!(passed_on.payload, frame.payload);
        assert_eq!(inode(&at_node.payload), inode(&passed_on.payload), "the same file went on");
    }

    #[tokio::test]
    async fn files_never_run_ahead_of_their_headers_when_writes_are_cut_short() {
        // A regression: with many small frames between file frames and a full
        // socket, each short write sent the next files early, until the receiver
        // held more unclaimed files than it allows and closed the link.
        let mut frames = Vec::new();
        for i in 0..200 {
            frames.push(Frame::new(FrameHeader::data(1, i, 0), vec![i as u8; FILE_MIN]));
            for j in 0..50 {
                frames.push(Frame::new(FrameHeader::data(2, j, 0), vec![j as u8; 2000]));
            }
        }
        let got = across(&frames, Some(FILE_MIN), false).await;
        assert_eq!(got.len(), frames.len());
        assert!(frames.iter().zip(&got).all(|(a, b)| a.payload == b.payload && a.header.tag == b.header.tag));
    }

    #[tokio::test]
    async fn with_zero_copy_off_large_payloads_go_through_the_socket() {
        let frames = [Frame::new(FrameHeader::data(1, 0, 0), vec![3u8; 1 << 20])];
        let got = across(&frames, None, false).await;
        assert_eq!(got[0].payload, frames[0].payload);
        assert!(shared_payload::file_of(&got[0].payload).is_none());
    }

    #[test]
    fn a_frame_claiming_a_payload_file_on_a_byte_stream_is_refused() {
        let mut header = FrameHeader::data(1, 0, 0);
        header.flags = FLAG_PAYLOAD_FD;
        let mut buf = BytesMut::new();
        header.encode(100, &mut buf);
        assert_eq!(cut_frames(&mut buf, MAX_PAYLOAD_LEN).unwrap_err(), CutError::NoFile);
    }

    #[test]
    fn a_write_with_more_files_than_one_message_carries_stops_before_the_first_left_over() {
        let file = shared_payload::file_for(&Bytes::from_static(b"x")).unwrap();
        let max = shared_payload::MAX_FDS_PER_MSG as u64;
        // Headers every 28 bytes from byte 1000, the stream written up to 1000.
        let files: VecDeque<_> = (0..max + 3).map(|i| (1000 + 28 * i, file.clone())).collect();
        let (taken, limit) = files_for(&files, 1000, 28 * (max + 3));
        assert_eq!(taken.len() as u64, max);
        assert_eq!(limit, Some(28 * max as usize));
        let (a, b) = ([1u8; 500], [2u8; 2000]);
        let slices = slices_up_to(&[&a, &b], limit);
        assert_eq!(slices.iter().map(|s| s.len()).sum::<usize>(), 28 * max as usize);
        // A write that ends before a header takes no file for it.
        assert_eq!(files_for(&files, 1000, 1).0.len(), 1);
        assert!(files_for(&files, 0, 1000).0.is_empty());
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
