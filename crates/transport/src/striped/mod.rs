//! A striped route: one logical link carried over several connections to the same
//! peer, on different rails where both hosts have them (the connections go to the
//! peer's address on each rail, and the kernel picks the local address of that
//! rail), else all on one path.
//!
//! # Design
//!
//! * **Joining.** The connecting side draws a 16-byte token per link and opens its
//!   `count` connections, each authenticated on its own by the HMAC handshake with a
//!   version-2 answer that carries the token, the connection's index and the count
//!   under the MAC ([`crate::handshake::connect_rail`], [`connect`]). The accepting
//!   side groups connections by node id and token ([`Rails`]) and hands the whole
//!   group to [`StripedRoute::add_striped`] once every connection arrived.
//! * **Pieces.** The link's byte stream (its encoded frames, in order, as a TCP link
//!   would carry them) is cut into pieces numbered from 0 per link
//!   ([`treecast_wire::PieceHeader`]): a frame of at most [`SMALL`] bytes is one
//!   piece, a larger one is cut into pieces of [`PIECE`] bytes (the first copies the
//!   frame header, the others are slices of the payload: no copy). Each piece goes
//!   to the connection with the fewest bytes queued, so a faster rail takes more.
//! * **Order.** The receiver puts pieces back in number order (`pieces::Incoming`),
//!   then cuts frames from that stream exactly as a TCP link does: the link keeps
//!   its frames' order, which is all the core assumes of a link (a stream's order
//!   follows from it, as on TCP).
//! * **Acknowledgements.** After each pass over what arrived, the receiver sends
//!   on one of its connections a cumulative acknowledgement (the first piece
//!   number not yet held in order). The sender keeps each piece (a reference, not a
//!   copy) until acknowledged (`pieces::Outgoing`).
//! * **Failure.** A connection that ends (end of stream, reset, any I/O error) is
//!   shut both ways on this side; every piece it carried that is not acknowledged
//!   goes again, under its number, on the connections left. The peer drops a piece
//!   whose number it holds already: nothing is lost or delivered twice. The link
//!   itself closes when its last connection ends.
//! * **Stalls.** A rail brought down fails nothing: its connection just stops
//!   delivering. A task per link ([`stall`]) gives up a connection that held bytes
//!   without delivering any for [`stall::STALL_ENV`] seconds (5 by default) while
//!   another connection of the link moved, as if it had failed; small frames take
//!   the connections in turn, so every rail of a quiet link carries something.
//!   When every connection stands still the peer is not reading, and the core's
//!   heartbeat judges the link.
//! * **I/O.** Each connection has a writer task fed from its queue and a reader task
//!   that hands whole pieces to the route through one bounded channel (a slow node
//!   stops its readers, and so its peers). The bookkeeping has no I/O and is tested
//!   on its own; the piece header is encoded in `treecast_wire`.
//!
//! For tests, [`CUT_ENV`] makes a process cut one connection of each of its
//! striped links mid-transfer.
//!
//! * **Monitoring.** While the node records, and for every clock probe, a frame's
//!   header is stamped when it is cut into pieces (there is no staging: that is
//!   when it leaves the node's hands), and the receiver records the frame's net
//!   latency, from that stamp to the handling of the piece that completed it, and
//!   its delivery to the core. The sender records no queue or send component: its
//!   pieces are written by the connections' tasks, so a striped link's net holds
//!   the time in the writers' queues and writes too (`docs/monitoring.md`).
//!
//! Not done here: payload files between processes of one host.

mod pieces;
pub mod rails;
pub mod stall;
#[cfg(test)]
mod tests;
mod with;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinHandle;
use treecast_wire::{
    cut_frames, Frame, FrameHeader, FrameKind, LaunchPlan, PieceHeader, RouteChoice, FLAG_STAMPED,
    HEADER_LEN, PIECE_HEADER_LEN,
};

use pieces::{cuts, Incoming, Outgoing};
use stall::{Progress, Watched};
pub use with::WithStriped;

use crate::handshake::{self, TOKEN};
use crate::recording::{LinkPlace, LinkTiming, Monitoring, NodeClock, PeerClock};
use crate::route::{Close, LinkPeer, MonitoredRoute, Route, RouteEvent, StreamChoices};
use crate::{LinkId, LinkMap, Secret, Socket, Stream, TransportError};

/// Frames of at most this many bytes (header included) travel as one piece.
pub const SMALL: usize = 64 << 10;
/// Bytes per piece of a larger frame.
pub const PIECE: usize = 256 << 10;
/// Most bytes a link holds behind a missing piece before it gives up.
const MAX_HELD: usize = 1 << 30;
/// Pieces waiting for the route, over all links.
const EVENTS: usize = 256;
/// Events taken per pass before other work gets a turn.
const EVENTS_PER_PASS: usize = 1024;
/// Fault injection for tests: after this many pieces of a link arrived in order,
/// this side cuts the link's connection 1 as [`StripedRoute::break_connection`] does
/// (a test hook of [`crate::testing`]).
pub const CUT_ENV: &str = crate::testing::STRIPE_CUT;
/// Small pieces written in one system call, bytes.
const BATCH: usize = 64 << 10;

/// What a connection's tasks tell the route.
#[derive(Debug)]
enum Event {
    Piece {
        link: LinkId,
        seq: u64,
        data: Bytes,
    },
    Ack {
        link: LinkId,
        next: u64,
    },
    /// The connection ended: `None` at a piece boundary, else why.
    Ended {
        link: LinkId,
        conn: usize,
        reason: Option<String>,
    },
    /// The stall watch gives the connection up: it delivers nothing while another moves.
    Stalled {
        link: LinkId,
        conn: usize,
        reason: String,
    },
}

#[derive(Debug)]
enum Item {
    Piece([u8; PIECE_HEADER_LEN], Bytes),
    /// Shut the writing side once everything before is written.
    Shutdown,
}

/// A connection's outgoing queue, drained by its writer task.
#[derive(Debug, Default)]
struct Queue {
    items: Mutex<VecDeque<Item>>,
    more: Notify,
    /// Bytes queued and not yet written.
    pending: AtomicUsize,
}

impl Queue {
    fn push(&self, item: Item) {
        if let Item::Piece(_, d) = &item {
            self.pending.fetch_add(PIECE_HEADER_LEN + d.len(), Ordering::AcqRel);
        }
        if let Ok(mut q) = self.items.lock() {
            q.push_back(item);
        }
        self.more.notify_one();
    }

    fn pop(&self) -> Option<Item> {
        self.items.lock().ok().and_then(|mut q| q.pop_front())
    }

    fn clear(&self) {
        if let Ok(mut q) = self.items.lock() {
            q.clear();
        }
        self.pending.store(0, Ordering::Release);
    }
}

/// Who to wake when a writer has emptied its queue (the task that polls the route).
#[derive(Debug, Default)]
struct WakeSlot(Mutex<Option<Waker>>);

impl WakeSlot {
    fn wake(&self) {
        if let Some(w) = self.0.lock().ok().and_then(|w| w.clone()) {
            w.wake();
        }
    }
}

#[derive(Debug)]
struct Conn {
    queue: Arc<Queue>,
    /// A duplicate of the socket, to shut it and to ask the kernel what it holds
    /// (shared with the link's stall watch).
    ctl: Arc<Socket>,
    /// Its reader and writer.
    _tasks: [OwnedTask; 2],
    /// What it moved, and whether it was given up (shared with the stall watch).
    progress: Arc<Progress>,
}

impl Conn {
    fn alive(&self) -> bool {
        !self.progress.ended.load(Ordering::Acquire)
    }

    /// Shuts it both ways and drops what it had queued; it is not used again.
    fn end(&self) {
        self.progress.ended.store(true, Ordering::Release);
        self.ctl.shutdown(std::net::Shutdown::Both);
        self.queue.clear();
    }
}

/// A task that ends with what owns it.
#[derive(Debug)]
struct OwnedTask(JoinHandle<()>);

impl Drop for OwnedTask {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[derive(Debug)]
struct Link {
    name: String,
    conns: Vec<Conn>,
    out: Outgoing,
    inc: Incoming,
    rbuf: BytesMut,
    /// Closed by this side: reported to nobody when its connections end.
    closing: bool,
    ack_due: bool,
    /// Connection 1 was cut by [`CUT_ENV`].
    cut: bool,
    /// The stall watch of a link of several connections.
    _watch: Option<OwnedTask>,
    /// Where [`Link::pick`] starts looking: ties go round, so that small frames
    /// (heartbeats, acknowledgements) cross every connection and a dead one shows.
    turn: usize,
    /// The link's part of the monitoring state.
    timing: LinkTiming,
}

impl Link {
    /// The live connection with the fewest bytes queued, ties taken in turn.
    fn pick(&mut self) -> Option<usize> {
        let n = self.conns.len();
        let start = self.turn % n.max(1);
        self.turn = self.turn.wrapping_add(1);
        (0..n)
            .map(|k| (start + k) % n)
            .filter(|&i| self.conns[i].alive())
            .min_by_key(|&i| self.conns[i].queue.pending.load(Ordering::Acquire))
    }

    fn has_live(&self) -> bool {
        self.conns.iter().any(Conn::alive)
    }

    /// Queues a piece on connection `on`, else on the one [`Link::pick`] names.
    fn queue_piece(&mut self, data: Bytes, on: Option<usize>) {
        let Some(c) = on.or_else(|| self.pick()) else { return };
        let seq = self.out.sent(c, data.clone());
        let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.conns[c].queue.push(Item::Piece(PieceHeader::Data { seq, len }.encode(), data));
    }

    fn shut_all(&mut self) {
        for c in &self.conns {
            c.end();
        }
    }
}

/// Links of several connections each; see the module documentation.
pub struct StripedRoute {
    links: LinkMap<Link>,
    events_tx: mpsc::Sender<Event>,
    events: mpsc::Receiver<Event>,
    wake: Arc<WakeSlot>,
    max_frame: usize,
    /// [`CUT_ENV`], read once: a malformed value refuses every striped link.
    cut_after: Result<Option<u64>, String>,
    /// How long a connection may hold bytes without delivering any (see [`stall`]),
    /// shared with every link's watch, so that a plan arriving after a link (a
    /// node's parent link) still sets it.
    stall_limit: stall::SharedLimit,
    /// Streams that keep to part of the route: some keep each frame on one
    /// connection ([`RouteChoice::stripes`]).
    choices: StreamChoices,
    /// Stamps and the received frames' samples (see the module documentation).
    monitor: Monitoring,
    /// A striped link was ever added. Until then nothing can come in, and a poll
    /// (every node's, several per wake-up, beside plain links) returns at once
    /// instead of taking the wake slot's lock and polling the events channel.
    used: bool,
}

impl std::fmt::Debug for StripedRoute {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StripedRoute").field("links", &self.links.iter().count()).finish()
    }
}

/// A connection's reading half, as its reader task holds it.
type ReadHalf = Box<dyn AsyncRead + Send + Unpin>;
/// A connection's writing half, as its writer task holds it.
type WriteHalf = Box<dyn AsyncWrite + Send + Unpin>;
/// The connections of one striped link waiting for the rest, by node id and token.
type Waiting = HashMap<(u32, [u8; TOKEN]), (Instant, Vec<Option<Socket>>)>;

/// Splits a socket into the tokio halves its tasks use and a duplicate to control it.
fn split(socket: Socket) -> io::Result<(ReadHalf, WriteHalf, Socket)> {
    let ctl = socket.try_clone()?;
    Ok(match socket {
        Socket::Tcp(s) => {
            let w = s.try_clone()?;
            s.set_nonblocking(true)?;
            w.set_nonblocking(true)?;
            (
                Box::new(tokio::net::TcpStream::from_std(s)?),
                Box::new(tokio::net::TcpStream::from_std(w)?),
                ctl,
            )
        }
        Socket::Unix(s) => {
            let w = s.try_clone()?;
            s.set_nonblocking(true)?;
            w.set_nonblocking(true)?;
            (
                Box::new(tokio::net::UnixStream::from_std(s)?),
                Box::new(tokio::net::UnixStream::from_std(w)?),
                ctl,
            )
        }
    })
}

async fn read_pieces(
    mut r: ReadHalf,
    link: LinkId,
    conn: usize,
    progress: Arc<Progress>,
    tx: mpsc::Sender<Event>,
) {
    let reason = loop {
        let mut head = [0u8; PIECE_HEADER_LEN];
        // A connection may rest for as long as its link does: the core's heartbeats
        // say when a peer is gone, not a timeout here.
        match r.read(&mut head[..1]).await {
            Ok(0) => break None,
            Ok(_) => {}
            Err(e) => break Some(format!("reading: {e}")),
        }
        if let Err(e) = r.read_exact(&mut head[1..]).await {
            break Some(format!("reading a piece header: {e}"));
        }
        let event = match PieceHeader::decode(&head) {
            Err(e) => break Some(format!("not a striped link: {e}")),
            Ok(PieceHeader::Ack { next }) => Event::Ack { link, next },
            Ok(PieceHeader::Data { seq, len }) => {
                let mut data = BytesMut::zeroed(len as usize);
                if let Err(e) = r.read_exact(&mut data).await {
                    break Some(format!("cut mid-piece: {e}"));
                }
                Event::Piece { link, seq, data: data.freeze() }
            }
        };
        progress.heard.fetch_add(1, Ordering::Release);
        if tx.send(event).await.is_err() {
            return;
        }
    };
    let _ = tx.send(Event::Ended { link, conn, reason }).await;
}

async fn write_pieces(
    mut w: WriteHalf,
    queue: Arc<Queue>,
    progress: Arc<Progress>,
    link: LinkId,
    conn: usize,
    tx: mpsc::Sender<Event>,
    wake: Arc<WakeSlot>,
) {
    let mut batch = BytesMut::with_capacity(BATCH);
    let failed = 'run: loop {
        let Some(item) = queue.pop() else {
            wake.wake();
            queue.more.notified().await;
            continue;
        };
        match item {
            Item::Piece(head, data) if data.len() + PIECE_HEADER_LEN <= BATCH => {
                batch.extend_from_slice(&head);
                batch.extend_from_slice(&data);
                // Take the small pieces queued behind it into the same write.
                while batch.len() < BATCH {
                    let next = queue.items.lock().ok().and_then(|mut q| match q.front() {
                        Some(Item::Piece(_, d)) if d.len() + PIECE_HEADER_LEN <= BATCH - batch.len() => {
                            q.pop_front()
                        }
                        _ => None,
                    });
                    let Some(Item::Piece(h, d)) = next else { break };
                    batch.extend_from_slice(&h);
                    batch.extend_from_slice(&d);
                }
                let n = batch.len();
                if let Err(e) = w.write_all(&batch).await {
                    break 'run format!("writing: {e}");
                }
                progress.written.fetch_add(n as u64, Ordering::Release);
                batch.clear();
                queue.pending.fetch_sub(n.min(queue.pending.load(Ordering::Acquire)), Ordering::AcqRel);
            }
            Item::Piece(head, data) => {
                let n = PIECE_HEADER_LEN + data.len();
                let mut chain = Buf::chain(&head[..], data);
                if let Err(e) = w.write_all_buf(&mut chain).await {
                    break 'run format!("writing: {e}");
                }
                progress.written.fetch_add(n as u64, Ordering::Release);
                queue.pending.fetch_sub(n.min(queue.pending.load(Ordering::Acquire)), Ordering::AcqRel);
            }
            Item::Shutdown => {
                let _ = w.shutdown().await;
                wake.wake();
                return;
            }
        }
    };
    queue.clear();
    wake.wake();
    let _ = tx.send(Event::Ended { link, conn, reason: Some(failed) }).await;
}

impl Default for StripedRoute {
    fn default() -> Self {
        Self::new(treecast_wire::MAX_PAYLOAD_LEN)
    }
}

impl StripedRoute {
    /// A route that refuses frames with a payload over `max_frame` bytes (the link closes).
    pub fn new(max_frame: usize) -> Self {
        let (events_tx, events) = mpsc::channel(EVENTS);
        StripedRoute {
            links: LinkMap::default(),
            events_tx,
            events,
            wake: Arc::default(),
            max_frame,
            cut_after: crate::testing::stripe_cut().map_err(|e| e.to_string()),
            stall_limit: stall::SharedLimit::default(),
            choices: StreamChoices::default(),
            monitor: Monitoring::new(),
            used: false,
        }
    }

    /// Sets how long a connection of any of its links may hold bytes without
    /// delivering any while another one moves, before it is given up (default
    /// [`stall::DEFAULT_LIMIT`]; the plans carry the front-end's:
    /// `NetworkBuilder::stripe_stall`, or [`stall::STALL_ENV`] of the `treecast`
    /// command). Held within 10 ms to one hour (`stall::LIMIT_RANGE`).
    pub fn set_stall_limit(&mut self, limit: Duration) {
        self.stall_limit.set(limit);
    }

    /// Carries `link` over `sockets` (each authenticated already, all to the same
    /// peer, in the same order on both sides is not needed); `name` is the peer, for logs.
    ///
    /// # Errors
    /// No socket, or one could not be registered with the reactor (call inside a
    /// tokio runtime).
    pub fn add_striped(&mut self, link: LinkId, sockets: Vec<Socket>, name: String) -> io::Result<()> {
        if sockets.is_empty() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "a striped link needs a connection"));
        }
        if let Err(e) = &self.cut_after {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, e.clone()));
        }
        // Before any task that could send an event is started.
        self.used = true;
        let mut conns = Vec::with_capacity(sockets.len());
        let mut watched = Vec::with_capacity(sockets.len());
        for (i, s) in sockets.into_iter().enumerate() {
            let (r, w, ctl) = split(s)?;
            let ctl = Arc::new(ctl);
            let queue = Arc::new(Queue::default());
            let progress = Arc::new(Progress::default());
            let reader = tokio::spawn(read_pieces(r, link, i, progress.clone(), self.events_tx.clone()));
            let writer = tokio::spawn(write_pieces(
                w,
                queue.clone(),
                progress.clone(),
                link,
                i,
                self.events_tx.clone(),
                self.wake.clone(),
            ));
            watched.push(Watched { queue: queue.clone(), progress: progress.clone(), ctl: ctl.clone() });
            conns.push(Conn { queue, ctl, _tasks: [OwnedTask(reader), OwnedTask(writer)], progress });
        }
        let watch = (watched.len() > 1).then(|| {
            let task =
                stall::watch(watched, link, name.clone(), self.stall_limit.clone(), self.events_tx.clone());
            OwnedTask(tokio::spawn(task))
        });
        let link_state = Link {
            name,
            conns,
            out: Outgoing::default(),
            inc: Incoming::new(MAX_HELD),
            rbuf: BytesMut::new(),
            closing: false,
            ack_due: false,
            cut: false,
            _watch: watch,
            turn: 0,
            timing: LinkTiming::default(),
        };
        self.links.insert(link, link_state);
        Ok(())
    }

    /// Cuts connection `index` of `link` as a failing rail would (shut both ways,
    /// what the kernel held for it thrown away on the peer's side or ours): for
    /// failure drills and tests. False when there is no such live connection.
    pub fn break_connection(&mut self, link: LinkId, index: usize) -> bool {
        let Some(c) = self.links.get(link).and_then(|l| l.conns.get(index)) else { return false };
        if !c.alive() {
            return false;
        }
        c.ctl.shutdown(std::net::Shutdown::Both);
        true
    }

    /// Live connections of `link`.
    pub fn connections(&self, link: LinkId) -> usize {
        self.links.get(link).map_or(0, |l| l.conns.iter().filter(|c| c.alive()).count())
    }

    /// Bytes sent on `link` that the peer has not acknowledged yet.
    pub fn unacked(&self, link: LinkId) -> usize {
        self.links.get(link).map_or(0, |l| l.out.unacked_bytes())
    }

    /// Bytes written so far on each connection of `link`, in connection order.
    pub fn written(&self, link: LinkId) -> Vec<u64> {
        self.links.get(link).map_or_else(Vec::new, |l| {
            l.conns.iter().map(|c| c.progress.written.load(Ordering::Acquire)).collect()
        })
    }

    /// Pieces sent again on `link` so far, after the connection that carried them failed.
    pub fn resent(&self, link: LinkId) -> u64 {
        self.links.get(link).map_or(0, |l| l.out.resent)
    }

    /// Copies dropped on `link` so far: pieces the peer sent again after a
    /// connection failed that had arrived already.
    pub fn duplicates(&self, link: LinkId) -> u64 {
        self.links.get(link).map_or(0, |l| l.inc.duplicates)
    }

    fn handle(&mut self, event: Event, sink: &mut dyn FnMut(LinkId, RouteEvent)) {
        match event {
            Event::Ack { link, next } => {
                if let Some(l) = self.links.get_mut(link) {
                    l.out.acked(next);
                }
            }
            Event::Piece { link, seq, data } => {
                let Some(l) = self.links.get_mut(link) else { return };
                if l.closing {
                    return;
                }
                l.ack_due = true;
                if matches!(self.cut_after, Ok(Some(n)) if l.inc.in_order() >= n)
                    && !l.cut
                    && l.conns.len() > 1
                {
                    l.cut = true;
                    tracing::warn!(peer = %l.name, "{CUT_ENV}: cutting connection 1 of the striped link");
                    l.conns[1].ctl.shutdown(std::net::Shutdown::Both);
                }
                let mut failure = l.inc.piece(seq, data, &mut l.rbuf).err().map(|e| e.to_string());
                if failure.is_none() {
                    match cut_frames(&mut l.rbuf, self.max_frame) {
                        Ok(frames) => deliver(&mut self.monitor, link, frames, sink),
                        Err(e) => failure = Some(e.to_string()),
                    }
                }
                if let Some(reason) = failure {
                    if let Some(mut l) = self.links.remove(link) {
                        tracing::warn!(peer = %l.name, "closing striped link: {reason}");
                        l.shut_all();
                    }
                    sink(link, RouteEvent::Closed(Some(reason)));
                }
            }
            Event::Ended { link, conn, reason } => self.conn_ended(link, conn, reason, sink),
            // A link closing in order keeps its connections until they drain or its
            // peer goes: giving one up now would drop what it still holds.
            Event::Stalled { link, .. } if !self.links.get(link).is_some_and(|l| !l.closing) => {}
            Event::Stalled { link, conn, reason } => self.conn_ended(link, conn, Some(reason), sink),
        }
    }

    /// Connection `conn` of `link` ended: what it had not delivered goes on the others.
    fn conn_ended(
        &mut self,
        link: LinkId,
        conn: usize,
        reason: Option<String>,
        sink: &mut dyn FnMut(LinkId, RouteEvent),
    ) {
        let Some(l) = self.links.get_mut(link) else { return };
        let Some(c) = l.conns.get(conn) else { return };
        if !c.alive() {
            return;
        }
        c.end();
        let live: Vec<usize> =
            l.conns.iter().enumerate().filter(|(_, c)| c.alive()).map(|(i, _)| i).collect();
        if live.is_empty() {
            let Some(l) = self.links.remove(link) else { return };
            if !l.closing {
                let reason = match reason {
                    None if l.inc.is_whole() => None,
                    None => Some("the last connection ended with pieces missing".to_owned()),
                    Some(r) => Some(r),
                };
                if let Some(r) = &reason {
                    tracing::warn!(peer = %l.name, "striped link lost: {r}");
                }
                sink(link, RouteEvent::Closed(reason));
            }
            return;
        }
        tracing::debug!(
            peer = %l.name,
            "connection {conn} of a striped link ended ({}); {} left carry it",
            reason.as_deref().unwrap_or("end of stream"),
            live.len()
        );
        if l.closing {
            return;
        }
        let mut turn = 0usize;
        let again = l.out.failed(conn, |_| {
            turn += 1;
            live[turn % live.len()]
        });
        for (c, seq, data) in again {
            let len = u32::try_from(data.len()).unwrap_or(u32::MAX);
            l.conns[c].queue.push(Item::Piece(PieceHeader::Data { seq, len }.encode(), data));
        }
    }

    fn send_acks(&mut self) {
        for (_, l) in self.links.iter_mut() {
            if !std::mem::take(&mut l.ack_due) {
                continue;
            }
            let Some(next) = l.inc.ack_due() else { continue };
            if let Some(c) = l.pick() {
                l.conns[c].queue.push(Item::Piece(PieceHeader::Ack { next }.encode(), Bytes::new()));
            }
        }
    }
}

impl Route for StripedRoute {
    fn add_link(&mut self, link: LinkId, socket: Socket, _peer: LinkPeer, name: String) -> io::Result<()> {
        self.add_striped(link, vec![socket], name)
    }

    fn send(&mut self, links: &[LinkId], frame: &Frame) {
        // Beside plain links (WithStriped) most frames go to none of these: no header
        // is encoded, and nothing allocated, for them.
        if !links.iter().any(|&l| self.links.get(l).is_some()) {
            return;
        }
        let len = frame.payload.len();
        let mut head = BytesMut::with_capacity(HEADER_LEN);
        stamped(&mut self.monitor, frame.header).encode(len, &mut head);
        let total = HEADER_LEN + len;
        let whole = frame.header.kind == FrameKind::Data && !self.choices.of(frame.header.stream).stripes();
        for &link in links {
            let Some(l) = self.links.get_mut(link) else { continue };
            if l.closing || !l.has_live() {
                continue;
            }
            // A stream kept off striping has every piece of a frame on one connection.
            let on = if whole { l.pick() } else { None };
            for r in cuts(total, SMALL, PIECE) {
                let data = if r.start >= HEADER_LEN {
                    frame.payload.slice(r.start - HEADER_LEN..r.end - HEADER_LEN)
                } else {
                    let mut b = BytesMut::with_capacity(r.len());
                    b.extend_from_slice(&head[r.start..r.end.min(HEADER_LEN)]);
                    if r.end > HEADER_LEN {
                        b.extend_from_slice(&frame.payload[..r.end - HEADER_LEN]);
                    }
                    b.freeze()
                };
                l.queue_piece(data, on);
            }
        }
    }

    fn flush(&mut self) {
        // The writer tasks write as soon as something is queued.
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>, sink: &mut dyn FnMut(LinkId, RouteEvent)) -> bool {
        if !self.used {
            return false;
        }
        if let Ok(mut w) = self.wake.0.lock() {
            if !w.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                *w = Some(cx.waker().clone());
            }
        }
        let mut any = false;
        let mut taken = 0;
        while taken < EVENTS_PER_PASS {
            match self.events.poll_recv(cx) {
                Poll::Ready(Some(event)) => {
                    any = true;
                    self.handle(event, sink);
                }
                Poll::Ready(None) | Poll::Pending => break,
            }
            taken += 1;
        }
        if taken == EVENTS_PER_PASS {
            cx.waker().wake_by_ref();
        }
        self.send_acks();
        self.record_deferred();
        any
    }

    fn close(&mut self, link: LinkId, how: Close) {
        match how {
            Close::Now => {
                self.record_deferred();
                if let Some(mut l) = self.links.remove(link) {
                    l.shut_all();
                }
            }
            Close::Flush => {
                let Some(l) = self.links.get_mut(link) else { return };
                l.closing = true;
                for c in l.conns.iter().filter(|c| c.alive()) {
                    c.queue.push(Item::Shutdown);
                }
            }
        }
    }

    fn is_flushed(&self) -> bool {
        self.links
            .iter()
            .all(|(_, l)| l.conns.iter().all(|c| !c.alive() || c.queue.pending.load(Ordering::Acquire) == 0))
    }

    /// Waits, sleeping, for the writer tasks: they run only on a runtime with
    /// other worker threads than this one.
    fn flush_blocking(&mut self, limit: Duration) {
        let until = Instant::now() + limit;
        while !self.is_flushed() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    fn apply_plan(&mut self, plan: &LaunchPlan) {
        self.max_frame = plan.max_frame as usize;
        if let Some(limit) = plan.stripe_stall() {
            self.set_stall_limit(limit);
        }
    }

    fn set_stripe_stall(&mut self, limit: Duration) {
        self.set_stall_limit(limit);
    }

    fn set_stream_route(&mut self, stream: u32, route: Option<RouteChoice>) {
        self.choices.set(stream, route);
    }

    fn unacknowledged(&self) -> usize {
        self.links
            .iter()
            .flat_map(|(_, l)| l.conns.iter().filter(|c| c.alive()))
            .map(|c| c.queue.pending.load(Ordering::Acquire) + c.ctl.unacknowledged().unwrap_or(0))
            .sum()
    }
}

/// What a striped link records (see the module documentation): the receiving side's
/// net and deliver; the stamps of the sending side.
impl MonitoredRoute for StripedRoute {
    fn set_clock(&mut self, clock: NodeClock) {
        self.monitor.clock = clock;
    }

    fn place_link(&mut self, link: LinkId, place: LinkPlace) {
        // Samples taken before keep the name they were taken under.
        self.record_deferred();
        if let Some(l) = self.links.get_mut(link) {
            l.timing.set_place(place);
        }
    }

    fn set_peer_clock(&mut self, link: LinkId, clock: PeerClock) {
        // Reads waiting are turned to net with the offset in effect when taken.
        self.record_deferred();
        if let Some(l) = self.links.get_mut(link) {
            l.timing.peer_clock = clock;
        }
    }

    fn monitor_start(&mut self, program: u32) {
        // Samples taken before keep the program tag they were taken under.
        self.record_deferred();
        self.monitor.start(program);
    }

    fn monitor_stop(&mut self) {
        self.monitor.recording = false;
    }

    fn set_stream_program(&mut self, stream: u32, program: Option<u32>) {
        self.record_deferred();
        self.monitor.set_stream_program(stream, program);
    }

    fn monitor_report(&mut self) -> treecast_monitor::Report {
        self.record_deferred();
        self.monitor.report()
    }

    fn monitor_clear(&mut self) {
        self.record_deferred();
        self.monitor.clear();
    }
}

impl StripedRoute {
    /// Counts the samples taken since the last time (see `recording::Deferred`),
    /// before a link they name goes.
    fn record_deferred(&mut self) {
        if !self.monitor.deferred.is_empty() {
            self.monitor.count_waiting(&mut self.links, |l| &mut l.timing);
        }
    }
}

/// `header` as this hop sends it: stamped now while recording or for a clock probe
/// ([`treecast_wire::FLAG_STAMPED`]), else without the stamp of an earlier hop.
fn stamped(monitor: &mut Monitoring, mut header: FrameHeader) -> FrameHeader {
    if monitor.recording || header.is_timed() {
        let now = monitor.ticker.now();
        header.timestamp_ns = monitor.stamp(now);
        header.flags |= FLAG_STAMPED;
    } else {
        header.flags &= !FLAG_STAMPED;
        header.timestamp_ns = 0;
    }
    header
}

/// Hands `frames`, completed by the piece just handled, to the core: a clock probe
/// with the instant, the others as they are; while recording, their samples are
/// taken (counted at the end of the pass).
fn deliver(
    monitor: &mut Monitoring,
    link: LinkId,
    frames: Vec<Frame>,
    sink: &mut dyn FnMut(LinkId, RouteEvent),
) {
    if frames.is_empty() {
        return;
    }
    let record = monitor.recording;
    let at = record.then(|| monitor.ticker.now());
    let kept = record.then(|| frames.clone());
    for f in frames {
        if f.header.is_timed() {
            sink(link, RouteEvent::Timed(f, Instant::now()));
        } else {
            sink(link, RouteEvent::Frame(f));
        }
    }
    if let (Some(at), Some(kept)) = (at, kept) {
        let handed = monitor.ticker.now();
        monitor.read_deferred(link, &kept, at, handed);
    }
}

/// Opens the `count` connections of one striped link to the peer at `addrs` (one
/// address per rail of the peer: connection `i` goes to `addrs[i % addrs.len()]`),
/// each authenticated as `node_id` with one token drawn for the link.
///
/// # Errors
/// No address, a count of 0, or a connection or handshake that fails.
///
/// Cancel safety: not cancel safe; the connections made are dropped.
pub async fn connect(
    addrs: &[String],
    count: u8,
    node_id: u32,
    secret: &Secret,
    limit: Duration,
) -> Result<Vec<Socket>, TransportError> {
    if addrs.is_empty() || count == 0 {
        return Err(TransportError::Io {
            what: "opening a striped link".into(),
            source: io::Error::new(
                io::ErrorKind::InvalidInput,
                "it needs an address and at least one connection",
            ),
        });
    }
    let mut token = [0u8; TOKEN];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut token);
    let mut sockets = Vec::with_capacity(usize::from(count));
    for index in 0..count {
        let addr = &addrs[usize::from(index) % addrs.len()];
        let mut stream = Stream::connect(addr, limit).await?;
        handshake::connect_rail(&mut stream, secret, node_id, token, (index, count), addr, limit).await?;
        let socket = stream.into_socket().map_err(|source| TransportError::Io {
            what: format!("taking over connection {index} to {addr}"),
            source,
        })?;
        sockets.push(socket);
    }
    Ok(sockets)
}

/// Connections of striped links that arrived, grouped by link until all are there.
#[derive(Debug, Default)]
pub struct Rails {
    waiting: Waiting,
}

impl Rails {
    /// Takes connection `index` of `count` of node `node_id`'s link `token`; returns
    /// the link's connections, in index order, once the last arrived. A repeated
    /// index replaces the earlier connection.
    pub fn arrived(
        &mut self,
        (node_id, token): (u32, [u8; TOKEN]),
        (index, count): (u8, u8),
        socket: Socket,
        now: Instant,
    ) -> Option<Vec<Socket>> {
        let entry =
            self.waiting.entry((node_id, token)).or_insert_with(|| (now, (0..count).map(|_| None).collect()));
        let slot = entry.1.get_mut(usize::from(index))?;
        *slot = Some(socket);
        if entry.1.iter().all(Option::is_some) {
            let (_, group) = self.waiting.remove(&(node_id, token))?;
            return Some(group.into_iter().flatten().collect());
        }
        None
    }

    /// Drops the groups still incomplete whose first connection came before
    /// `before`; returns how many.
    pub fn expire(&mut self, before: Instant) -> usize {
        let n = self.waiting.len();
        self.waiting.retain(|_, (at, _)| *at >= before);
        n - self.waiting.len()
    }
}
