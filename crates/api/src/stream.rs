//! Streams at the front-end: a communicator bound to filters, sending down and
//! receiving reductions.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use treecast_driver::{lock, Shared, Tool};
use treecast_filters::TransformKind;
use treecast_proto::{Command, CommandError, Delivery};
use treecast_wire::{
    FilterSpec, Frame, FrameHeader, RankSet, RouteChoice, SyncMode, Value, Window, DEFAULT_DOWN_WINDOW,
    DEFAULT_UP_WINDOW, FLAG_DIRECT,
};

use crate::encoding::encode_checked;
use crate::frontend::FeTool;
use crate::request::{register, InOrder, Item, Mailbox, Match, Request};
use crate::{ApiError, Communicator, Packet, FRONT_END_RANK};

/// How a stream's packets are filtered, and how much each link holds for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamOptions {
    /// How packets coming up are grouped into waves.
    pub sync: SyncMode,
    /// The filter that reduces a wave on the way up (built-ins: `TransformKind::X.into()`).
    pub up: FilterSpec,
    /// The filter applied at each comm node on the way down.
    pub down: FilterSpec,
    /// What a child may send up on this stream before its parent takes more.
    pub up_window: Window,
    /// What a parent may send down on this stream before its child takes more.
    pub down_window: Window,
    /// Program tag its frames are recorded under while the tree monitors (0: the
    /// tag given to `Network::monitor_start`): keeps two tools or phases that share
    /// the tree apart in the histograms.
    pub program: u32,
    /// Which of the network's routes carry its frames ([`RouteChoice::Tcp`]: each
    /// frame whole on one connection, for small-message latency on a network that
    /// multicasts or stripes its large frames).
    pub route: RouteChoice,
}

impl StreamOptions {
    /// Wait for all, reduce with `up`, nothing on the way down, default windows.
    pub fn reduce(up: TransformKind) -> Self {
        StreamOptions {
            sync: SyncMode::WaitForAll,
            up: up.spec(),
            down: TransformKind::Null.spec(),
            up_window: DEFAULT_UP_WINDOW,
            down_window: DEFAULT_DOWN_WINDOW,
            program: 0,
            route: RouteChoice::Network,
        }
    }
}

impl Default for StreamOptions {
    /// Wait for all and pass packets through.
    ///
    /// With the null filter a wave is one packet per child, and the next level up
    /// again takes one packet per child per wave: when sub-trees send different
    /// numbers of packets per request (they hold different numbers of back-ends), the
    /// extra packets wait for waves that never come. For pass-through streams over
    /// such trees, use `SyncMode::DoNotWait` or `SyncMode::TimeOut`.
    fn default() -> Self {
        StreamOptions::reduce(TransformKind::Null)
    }
}

/// A stream: a communicator bound to filters.
///
/// Sends and receives take `&self`; to send from other tasks or threads while one
/// receives, clone a [`StreamSender`]. Receives may match on tag and source rank
/// ([`Stream::recv_matching`]) and run as requests ([`Stream::irecv`]); what one
/// skips waits for the next.
#[derive(Debug)]
pub struct Stream {
    sender: StreamSender,
    options: StreamOptions,
    /// What arrived and was not taken, the receives posted, and the end once seen;
    /// shared with the stream's receive requests.
    recv: Arc<Mutex<RecvSide>>,
}

/// How a stream ended, as its receives report it.
#[derive(Debug, Clone)]
enum End {
    /// Closed by the tool, or every member is gone.
    Closed,
    /// A node could not make its filters.
    Refused(String),
}

/// A stream's receive side.
#[derive(Debug, Default)]
struct RecvSide {
    mail: Mailbox,
    end: Option<End>,
}

/// A receive posted on a stream; withdrawn when dropped (a receive that completed,
/// timed out or was cancelled), which hands what it skipped to the next ones.
struct Posted {
    recv: Arc<Mutex<RecvSide>>,
    id: u64,
}

impl Drop for Posted {
    fn drop(&mut self) {
        lock_recv(&self.recv).mail.unpost(self.id);
    }
}

/// Withdraws a receive posted without a [`Posted`] if the poll that posted it
/// panics, as dropping a `Posted` would: a receive left posted would keep every
/// later one from the packets it matches. Disarmed (`id` taken) once the poll
/// returned, not by asking whether the thread panics: a receive polled by a `Drop`
/// during another panic's unwinding must stay posted.
struct UnpostOnUnwind<'a> {
    recv: &'a Mutex<RecvSide>,
    id: Option<u64>,
}

impl Drop for UnpostOnUnwind<'_> {
    fn drop(&mut self) {
        if let Some(id) = self.id {
            lock_recv(self.recv).mail.unpost(id);
        }
    }
}

fn lock_recv(recv: &Mutex<RecvSide>) -> std::sync::MutexGuard<'_, RecvSide> {
    recv.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Sends down one stream, from any task or thread; cheap to clone. Sending on a
/// stream that was closed fails.
#[derive(Debug, Clone)]
pub struct StreamSender {
    id: u32,
    shared: Shared<FeTool>,
    comm: Communicator,
    backends: u32,
    /// Orders the stream's send requests (shared by every clone).
    sends: Arc<InOrder>,
}

/// A tool that can wait for room to send on a stream.
pub(crate) trait WaitsForCredit: Tool {
    /// Wakes `cx` once `stream` can take a frame again.
    fn wait_writable(&mut self, stream: u32, cx: &std::task::Context<'_>);
}

impl WaitsForCredit for FeTool {
    fn wait_writable(&mut self, stream: u32, cx: &Context<'_>) {
        register(self.writers.entry(stream).or_default(), cx);
    }
}

/// Gives the core a frame to send, waiting while its stream has no credit.
///
/// Cancel safety: cancel safe; a cancelled call sent nothing.
pub(crate) async fn send_with_credit<T: WaitsForCredit>(
    shared: &Shared<T>,
    frame: Frame,
) -> Result<(), ApiError> {
    let stream = frame.header.stream;
    // A message to a rank waits for the sender's peer window, not a stream's.
    let credit = match frame.header.kind {
        treecast_wire::FrameKind::Peer => treecast_proto::PEER_CREDIT,
        _ => stream,
    };
    let mut frame = Some(frame);
    std::future::poll_fn(|cx| {
        let mut d = lock(shared);
        let Some(f) = frame.take() else { return Poll::Ready(Ok(())) };
        match try_send(&mut d, f) {
            Ok(None) => Poll::Ready(Ok(())),
            Ok(Some(back)) => {
                frame = Some(back);
                d.tool().wait_writable(credit, cx);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(e)),
        }
    })
    .await
}

/// Gives the core a frame if its stream has credit; the frame back when it has none.
pub(crate) fn try_send<T: WaitsForCredit>(
    d: &mut treecast_driver::Driver<T, treecast_driver::NodeRoute>,
    frame: Frame,
) -> Result<Option<Frame>, ApiError> {
    let stream = frame.header.stream;
    match d.send(frame) {
        Ok(()) => Ok(None),
        Err(CommandError::Blocked(back)) => Ok(Some(back)),
        Err(e) => Err(ApiError::from_command(stream, e)),
    }
}

impl Stream {
    pub(crate) fn new(
        id: u32,
        shared: Shared<FeTool>,
        comm: Communicator,
        options: StreamOptions,
        backends: u32,
    ) -> Self {
        let sends = Arc::new(InOrder::default());
        Stream {
            sender: StreamSender { id, shared, comm, backends, sends },
            options,
            recv: Arc::new(Mutex::new(RecvSide::default())),
        }
    }

    /// The stream id.
    pub fn id(&self) -> u32 {
        self.sender.id
    }

    /// The back-ends of the stream.
    pub fn communicator(&self) -> &Communicator {
        &self.sender.comm
    }

    /// The filters of the stream.
    pub fn options(&self) -> StreamOptions {
        self.options.clone()
    }

    /// A sender usable from other tasks and threads while this handle receives.
    pub fn sender(&self) -> StreamSender {
        self.sender.clone()
    }

    /// Multicasts values to every back-end of the stream; see [`StreamSender::send`].
    ///
    /// # Errors
    /// As [`StreamSender::send`].
    ///
    /// Cancel safety: cancel safe: a cancelled send sent nothing.
    pub async fn send(&self, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        self.sender.send(tag, format, values).await
    }

    /// Multicasts an encoded payload; see [`StreamSender::send_encoded`].
    ///
    /// # Errors
    /// As [`StreamSender::send_encoded`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn send_encoded(&self, tag: i32, payload: Vec<u8>) -> Result<(), ApiError> {
        self.sender.send_encoded(tag, payload).await
    }

    /// Sends an encoded payload to one back-end; see [`StreamSender::send_encoded_to`].
    ///
    /// # Errors
    /// As [`StreamSender::send_encoded_to`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn send_encoded_to(&self, rank: u32, tag: i32, payload: Vec<u8>) -> Result<(), ApiError> {
        self.sender.send_encoded_to(rank, tag, payload).await
    }

    /// Sends values to one back-end; see [`StreamSender::send_to`].
    ///
    /// # Errors
    /// As [`StreamSender::send_to`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn send_to(&self, rank: u32, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        self.sender.send_to(rank, tag, format, values).await
    }

    /// New parameters for the stream's upward filter; see [`StreamSender::set_params`].
    ///
    /// # Errors
    /// As [`StreamSender::set_params`].
    pub fn set_params(&self, values: &[Value]) -> Result<(), ApiError> {
        self.sender.set_params(values)
    }

    /// New parameters for the stream's downstream filter; see
    /// [`StreamSender::set_down_params`].
    ///
    /// # Errors
    /// As [`StreamSender::set_down_params`].
    pub fn set_down_params(&self, values: &[Value]) -> Result<(), ApiError> {
        self.sender.set_down_params(values)
    }

    /// Waits for the next packet (a reduction result, or a back-end's packet with the null filter).
    ///
    /// # Errors
    /// [`ApiError::StreamClosed`] once every member is lost and nothing is left,
    /// [`ApiError::StreamRefused`] when a node could not make its filters,
    /// [`ApiError::NoAnswer`] for a request no rank answered (the stream goes on).
    ///
    /// Cancel safety: cancel safe.
    pub async fn recv(&self) -> Result<Packet, ApiError> {
        self.recv_matching(Match::any()).await
    }

    /// Waits for the next packet that `m` matches (tag, source rank; its stream field
    /// is ignored). Packets it skips are kept, in order, for later receives.
    ///
    /// # Errors
    /// As [`Stream::recv`]; [`ApiError::Unmatched`] when [`crate::HELD_LIMIT`]
    /// skipped packets are held and none matches.
    ///
    /// Cancel safety: cancel safe: a cancelled receive took nothing.
    pub async fn recv_matching(&self, m: Match) -> Result<Packet, ApiError> {
        // The first poll posts, looks and, when it takes a packet, withdraws under one
        // lock of the receive side (as a posted receive's drop would, right after);
        // only a receive that waits keeps a `Posted`. A burst's receive otherwise took
        // the lock three times and counted a reference up and down.
        let mut posted: Option<Posted> = None;
        std::future::poll_fn(|cx| {
            if let Some(p) = &posted {
                return poll_receive(p, &self.sender, Some(cx));
            }
            let (polled, waiting) = self.post_and_look(m, Some(cx));
            posted = waiting.map(|id| Posted { recv: self.recv.clone(), id });
            polled
        })
        .await
    }

    /// [`Stream::recv`] with a time limit.
    ///
    /// # Errors
    /// [`ApiError::Timeout`] or [`ApiError::StreamClosed`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn recv_timeout(&self, limit: Duration) -> Result<Packet, ApiError> {
        let mut recv = std::pin::pin!(self.recv());
        // A packet already here needs no timer: making one reads the clock, and a
        // burst's receives mostly find their packet at once.
        let first = std::future::poll_fn(|cx| Poll::Ready(recv.as_mut().poll(cx))).await;
        if let Poll::Ready(done) = first {
            return done;
        }
        tokio::time::timeout(limit, recv).await.map_err(|_| ApiError::Timeout(limit))?
    }

    /// Returns a packet if one is queued.
    pub fn try_recv(&self) -> Option<Packet> {
        self.try_recv_matching(Match::any()).ok().flatten()
    }

    /// The next packet `m` matches if one is here now, without waiting; receives
    /// posted earlier keep their turn (see [`Stream::recv_matching`]).
    ///
    /// # Errors
    /// As [`Stream::recv_matching`], when the stream ended or refused.
    pub fn try_recv_matching(&self, m: Match) -> Result<Option<Packet>, ApiError> {
        match self.post_and_look(m, None).0 {
            Poll::Ready(result) => result.map(Some),
            Poll::Pending => Ok(None),
        }
    }

    /// Posts a receive of what `m` matches, looks for it and, when it found it or
    /// there is no `cx` to wait with, withdraws it, all under one lock of the receive
    /// side: a tool reading a burst takes each packet with one lock and no reference
    /// count. Returns what the look gave and the id of a receive left posted, waiting.
    fn post_and_look(
        &self,
        m: Match,
        cx: Option<&Context<'_>>,
    ) -> (Poll<Result<Packet, ApiError>>, Option<u64>) {
        // Before the lock, so that an unwinding look unlocks before it withdraws.
        let mut unwinding = UnpostOnUnwind { recv: &self.recv, id: None };
        let mut side = lock_recv(&self.recv);
        let id = side.mail.post(m);
        unwinding.id = Some(id);
        let polled = poll_side(&mut side, id, &self.sender, cx);
        unwinding.id = None;
        if polled.is_ready() || cx.is_none() {
            side.mail.unpost(id);
            return (polled, None);
        }
        (polled, Some(id))
    }

    /// Starts a receive of the next packet `m` matches, as a request (see
    /// [`Stream::recv_matching`]); receives take packets in the order they were
    /// started. Call inside a tokio runtime.
    pub fn irecv(&self, m: Match) -> Request<Packet> {
        Request::spawn(self.post_recv(m), true)
    }

    /// Posts a receive of the next packet `m` matches now (no runtime needed) and
    /// returns the future that completes it: receives take packets in the order they
    /// were posted, and dropping the future withdraws the receive at once, leaving
    /// what it would have taken to the next ones.
    pub fn post_recv(&self, m: Match) -> impl Future<Output = Result<Packet, ApiError>> + Send + 'static {
        let posted = post(&self.recv, m);
        let sender = self.sender.clone();
        async move { std::future::poll_fn(|cx| poll_receive(&posted, &sender, Some(cx))).await }
    }

    /// Starts a send of values to every back-end of the stream, as a request that
    /// completes once the frame is written to the links; see [`StreamSender::isend`].
    ///
    /// # Errors
    /// As [`StreamSender::isend`].
    pub fn isend(&self, tag: i32, format: &str, values: &[Value]) -> Result<Request<()>, ApiError> {
        self.sender.isend(tag, format, values)
    }

    /// Closes the stream in the whole tree (after what was sent on it).
    ///
    /// Cancel safety: cancel safe.
    pub async fn close(mut self) {
        self.close_now();
    }

    fn close_now(&mut self) {
        {
            let mut side = lock_recv(&self.recv);
            side.end.get_or_insert(End::Closed);
            // A receive that looked before the end was set must see it.
            side.mail.wake_all();
        }
        let mut d = lock(&self.sender.shared);
        if d.core().has_stream(self.sender.id) {
            let _ = d.command(Command::CloseStream(self.sender.id));
        }
        d.tool().stream_ready.remove(&self.sender.id);
    }
}

impl StreamSender {
    /// The stream id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Multicasts values to every back-end of the stream.
    ///
    /// Waits while the stream already holds a window's worth of packets that some
    /// child has not taken yet (a slow back-end slows its stream's sender).
    ///
    /// # Errors
    /// A malformed format or values that do not match it (naming the first), or a
    /// network that is gone.
    ///
    /// Cancel safety: cancel safe: a cancelled send sent nothing.
    pub async fn send(&self, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        let payload = encode_checked(format, values)?;
        self.send_frame(Frame::new(FrameHeader::data(self.id, tag, FRONT_END_RANK), payload)).await
    }

    /// Starts a send of values to every back-end of the stream, as a request: it
    /// completes once the frame, and everything queued before it, is written to the
    /// links (waiting for the stream's window first, as [`StreamSender::send`]). Send
    /// requests of one stream go out in the order they were started. Call inside a
    /// tokio runtime.
    ///
    /// # Errors
    /// A malformed format or values that do not match it, at once; the send's own
    /// errors come with the request.
    pub fn isend(&self, tag: i32, format: &str, values: &[Value]) -> Result<Request<()>, ApiError> {
        let payload = encode_checked(format, values)?;
        let frame = Frame::new(FrameHeader::data(self.id, tag, FRONT_END_RANK), payload);
        let (turn, done) = self.sends.next();
        let sender = self.clone();
        Ok(Request::spawn(
            async move {
                turn.come().await;
                sender.send_frame(frame).await?;
                // The next send may go: the core holds this frame, in order.
                drop(done);
                std::future::poll_fn(|cx| lock(&sender.shared).poll_flushed(cx)).await;
                Ok(())
            },
            false,
        ))
    }

    /// Multicasts a payload that is already encoded (by the wire crate's encoders, as
    /// [`Stream::send`] would), so a large payload is not copied once more.
    ///
    /// # Errors
    /// [`ApiError::Closed`] when the network is gone.
    ///
    /// Cancel safety: cancel safe.
    pub async fn send_encoded(&self, tag: i32, payload: Vec<u8>) -> Result<(), ApiError> {
        self.send_frame(Frame::new(FrameHeader::data(self.id, tag, FRONT_END_RANK), payload)).await
    }

    /// Sends an encoded payload (see [`Stream::send_encoded`]) to one back-end of the
    /// stream.
    ///
    /// # Errors
    /// A rank outside the stream, or a network that is gone.
    ///
    /// Cancel safety: cancel safe.
    pub async fn send_encoded_to(&self, rank: u32, tag: i32, payload: Vec<u8>) -> Result<(), ApiError> {
        if !self.comm.ranks().contains(rank) {
            return Err(ApiError::NoSuchRanks {
                ranks: RankSet::single(rank),
                last: self.backends.saturating_sub(1),
            });
        }
        let mut header = FrameHeader::data(self.id, tag, rank);
        header.flags |= FLAG_DIRECT;
        self.send_frame(Frame::new(header, payload)).await
    }

    /// Sends values to one back-end of the stream (point to point).
    ///
    /// # Errors
    /// A rank outside the stream, or a format error.
    ///
    /// Cancel safety: cancel safe.
    pub async fn send_to(&self, rank: u32, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        if !self.comm.ranks().contains(rank) {
            return Err(ApiError::NoSuchRanks {
                ranks: RankSet::single(rank),
                last: self.backends.saturating_sub(1),
            });
        }
        let payload = encode_checked(format, values)?;
        let mut header = FrameHeader::data(self.id, tag, rank);
        header.flags |= FLAG_DIRECT;
        self.send_frame(Frame::new(header, payload)).await
    }

    /// New parameters for the stream's upward filter (typed values, as
    /// [`crate::FilterSpec::params`] at creation), at the front-end now and at every
    /// comm node of the stream before any packet sent down after this call: waves
    /// answering later requests are reduced with them. A comm node that refuses them
    /// reports an [`crate::Event::FilterError`] naming itself.
    ///
    /// # Errors
    /// The front-end's filter refuses them ([`ApiError::StreamFilter`]), or the stream
    /// is closed.
    pub fn set_params(&self, values: &[Value]) -> Result<(), ApiError> {
        self.params_command(values, false)
    }

    /// New parameters for the stream's downstream filter (typed values, as
    /// [`crate::FilterSpec::params`] at creation), which every comm node of the stream
    /// takes before any packet sent down after this call. A comm node that refuses
    /// them reports an [`crate::Event::FilterError`] naming itself.
    ///
    /// # Errors
    /// The stream has no downstream filter (the null filter), or is closed.
    pub fn set_down_params(&self, values: &[Value]) -> Result<(), ApiError> {
        self.params_command(values, true)
    }

    /// Closes the stream in the whole tree (after what was sent on it), as dropping
    /// its [`Stream`] does: a receive waiting on it ends with
    /// [`ApiError::StreamClosed`]. For a handle that cannot wait for every clone of
    /// its receiver to go.
    pub fn close(&self) {
        let mut d = lock(&self.shared);
        if d.core().has_stream(self.id) {
            let _ = d.command(Command::CloseStream(self.id));
        }
        // A receive already waiting on another thread must see the end now.
        d.tool().wake_stream(self.id);
        d.tool().stream_ready.remove(&self.id);
    }

    /// Calls `hook` whenever a packet for this stream is queued where none was, when
    /// the stream ends and when the network ends, so that a tool's own event loop can
    /// wait on one descriptor per stream (see [`crate::Network::on_ready`] for the
    /// whole network). It runs on the network's task: it must return at once (write
    /// to an eventfd) and not call into the network. Replaces any hook set before on
    /// this stream; [`StreamSender::close`] removes it.
    pub fn on_ready(&self, hook: impl Fn() + Send + Sync + 'static) {
        let hook = crate::frontend::ReadyHook(Arc::new(hook));
        lock(&self.shared).tool().stream_ready.insert(self.id, hook);
    }

    /// True when a packet (or the stream's end) waits in the network for this
    /// stream's receives: a tool's event loop that cleared its descriptor looks again.
    pub fn has_queued(&self) -> bool {
        let mut d = lock(&self.shared);
        d.core().has_delivery(Some(self.id)) || d.tool().over.is_some()
    }

    fn params_command(&self, values: &[Value], down: bool) -> Result<(), ApiError> {
        let mut params = Vec::new();
        treecast_wire::encode_values(values, &mut params);
        lock(&self.shared)
            .command(Command::SetParams { stream: self.id, params, down })
            .map_err(|e| ApiError::from_command(self.id, e))
    }

    async fn send_frame(&self, frame: Frame) -> Result<(), ApiError> {
        send_with_credit(&self.shared, frame).await
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        // A stream the tool no longer holds must not keep packets coming up.
        self.close_now();
    }
}

/// Posts a receive on `recv`.
fn post(recv: &Arc<Mutex<RecvSide>>, m: Match) -> Posted {
    let id = lock_recv(recv).mail.post(m);
    Posted { recv: recv.clone(), id }
}

/// Reads what the core has for the stream into its mailbox, then gives `posted` the
/// first item that is its own (see [`Mailbox`]), or the stream's end.
fn poll_receive(
    posted: &Posted,
    sender: &StreamSender,
    cx: Option<&Context<'_>>,
) -> Poll<Result<Packet, ApiError>> {
    // Lock order: a stream's receive side, then the driver.
    poll_side(&mut lock_recv(&posted.recv), posted.id, sender, cx)
}

/// [`poll_receive`] for the receive `posted` of the receive side `side`, locked.
fn poll_side(
    side: &mut RecvSide,
    posted: u64,
    sender: &StreamSender,
    cx: Option<&Context<'_>>,
) -> Poll<Result<Packet, ApiError>> {
    let id = sender.id;
    let mut d = None;
    let taken = |item| match item {
        Item::Packet(p) => Ok(p),
        Item::NoAnswer(stream) => Err(ApiError::NoAnswer(stream)),
    };
    // One item at a time, so that what the tool has not asked for stays in the core,
    // under its flow control (the mailbox looks at each item once per receive).
    loop {
        if let Some(item) = side.mail.take_for(posted) {
            return Poll::Ready(taken(item));
        }
        if side.end.is_some() || side.mail.is_full() {
            break;
        }
        let d = d.get_or_insert_with(|| lock(&sender.shared));
        match d.deliver(Some(id)) {
            Some(Delivery::Packet(f)) => side.mail.hold(Item::Packet(Packet::from_frame(f))),
            Some(Delivery::NoAnswer(stream)) => side.mail.hold(Item::NoAnswer(stream)),
            Some(Delivery::StreamClosed(_)) => {
                side.end = Some(match d.tool().refused.get(&id) {
                    Some(reason) => End::Refused(reason.clone()),
                    None => End::Closed,
                });
            }
            None => break,
        }
    }
    if side.end.is_none() {
        let d = d.get_or_insert_with(|| lock(&sender.shared));
        if let Some(reason) = &d.tool().over {
            return Poll::Ready(Err(ApiError::Closed(reason.clone())));
        }
        if !d.core().has_stream(id) {
            side.end = Some(End::Closed);
        } else if side.mail.is_full() {
            return Poll::Ready(Err(ApiError::Unmatched { stream: id, held: side.mail.held() }));
        } else {
            if let Some(cx) = cx {
                d.tool().wait_readable(id, cx);
                side.mail.wait(cx);
            }
            return Poll::Pending;
        }
    }
    Poll::Ready(Err(match side.end.clone() {
        Some(End::Refused(reason)) => ApiError::StreamRefused { stream: id, reason },
        _ => ApiError::StreamClosed(id),
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::pin::pin;
    use std::task::Waker;
    use treecast_proto::{control_frame, Node, NodeConfig, Peer, Role};
    use treecast_wire::{ControlMsg, LaunchPlan, LinkTable, StreamSpec};

    /// A front-end's stream 1 over two back-ends (do-not-wait, so each packet is
    /// delivered as it comes), in a driver with no links, holding one packet from
    /// rank 0 for each of `tags`.
    fn stream_with_packets(tags: &[i32]) -> Stream {
        let now = std::time::Instant::now();
        let mut core = Node::new(NodeConfig {
            role: Role::FrontEnd,
            node_id: 0,
            name: "fe".into(),
            registry: treecast_filters::FilterRegistry::builtin(),
            tool_window: Window { packets: 1000, bytes: 1 << 20 },
        });
        let mut plan = LaunchPlan::local("s", "h:0 => h:1 h:2 ;".into(), 2);
        plan.startup_timeout_ms = 100_000;
        (plan.heartbeat_ms, plan.dead_after_ms) = (0, 0);
        plan.rejoin_ms = 0;
        core.handle_command(Command::Launch(Box::new(plan)), now).unwrap();
        let mut t = LinkTable::new();
        let links: Vec<_> = (0..2).map(|_| t.insert(())).collect();
        for (i, &l) in links.iter().enumerate() {
            core.handle_link_up(l, Peer::Child { node_id: i as u32 + 1 }, now);
            core.handle_frame(
                l,
                control_frame(&ControlMsg::Join { ranks: RankSet::single(i as u32), commnodes: 0 }),
                now,
            );
        }
        assert!(core.is_running());
        let spec = StreamSpec {
            id: 1,
            ranks: RankSet::range(0, 2),
            sync: SyncMode::DoNotWait,
            up: TransformKind::Null.spec(),
            down: TransformKind::Null.spec(),
            up_window: Window { packets: 100, bytes: 100_000 },
            down_window: Window { packets: 100, bytes: 100_000 },
            program: 0,
            route: RouteChoice::Network,
        };
        core.handle_command(Command::NewStream(spec), now).unwrap();
        for &tag in tags {
            core.handle_frame(links[0], Frame::new(FrameHeader::data(1, tag, 0), Vec::new()), now);
        }
        while core.poll_event().is_some() {}
        while core.poll_transmit().is_some() {}
        let secret = treecast_transport::Secret::generate();
        let (tool, _lost) = FeTool::new(None, "s".into(), secret.clone());
        let driver = treecast_driver::Driver::new(
            core,
            tool,
            treecast_driver::Launching::new(secret, "/bin/false".into()),
            1 << 20,
        );
        let shared = Arc::new(Mutex::new(driver));
        let comm = crate::communicator::Communicator::over(RankSet::range(0, 2));
        Stream::new(1, shared, comm, StreamOptions::default(), 2)
    }

    fn posted(s: &Stream) -> Vec<u64> {
        lock_recv(&s.recv).mail.posted_ids()
    }

    #[test]
    fn a_receive_that_waits_stays_posted() {
        let s = stream_with_packets(&[5]);
        let mut f = pin!(s.recv_matching(Match::tag(9)));
        assert!(f.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
        assert_eq!(posted(&s), vec![0]);
    }

    /// Polls a receive from its drop, as a tool's guard that drains results while
    /// a panic unwinds would.
    struct PollsInDrop<'a>(&'a Stream, &'a Mutex<Vec<u64>>);
    impl Drop for PollsInDrop<'_> {
        fn drop(&mut self) {
            let mut f = pin!(self.0.recv_matching(Match::tag(9)));
            assert!(f.as_mut().poll(&mut Context::from_waker(Waker::noop())).is_pending());
            *self.1.lock().unwrap() = posted(self.0);
        }
    }

    #[test]
    fn a_receive_that_waits_stays_posted_when_polled_during_another_panic() {
        let s = stream_with_packets(&[5]);
        let seen = Mutex::new(vec![99]);
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let _g = PollsInDrop(&s, &seen);
            panic!("tool failed");
        }));
        assert_eq!(*seen.lock().unwrap(), vec![0], "the waiting receive must still be posted");
    }

    #[test]
    fn a_receive_that_takes_at_once_leaves_nothing_posted_and_skipped_packets_wait_in_order() {
        let s = stream_with_packets(&[5, 6]);
        let mut a = pin!(s.recv_matching(Match::tag(6)));
        let cx = &mut Context::from_waker(Waker::noop());
        // A takes 6, skipping 5 (held).
        match a.as_mut().poll(cx) {
            Poll::Ready(Ok(p)) => assert_eq!(p.tag(), 6),
            _ => panic!(),
        }
        assert!(posted(&s).is_empty());
        let mut b = pin!(s.recv_matching(Match::any()));
        match b.as_mut().poll(cx) {
            Poll::Ready(Ok(p)) => assert_eq!(p.tag(), 5),
            _ => panic!(),
        }
        let mut c = pin!(s.recv_matching(Match::any()));
        assert!(c.as_mut().poll(cx).is_pending());
        assert_eq!(posted(&s).len(), 1);
        let mut d = pin!(s.recv_matching(Match::any()));
        assert!(d.as_mut().poll(cx).is_pending());
        assert_eq!(posted(&s).len(), 2);
    }

    #[tokio::test]
    async fn a_timed_receive_takes_a_packet_that_is_here_even_with_no_time_left() {
        let s = stream_with_packets(&[5]);
        let p = s.recv_timeout(Duration::ZERO).await.unwrap();
        assert_eq!(p.tag(), 5);
        assert!(posted(&s).is_empty());
    }

    #[tokio::test]
    async fn a_timed_receive_with_nothing_here_times_out_and_leaves_nothing_posted() {
        let s = stream_with_packets(&[]);
        let limit = Duration::from_millis(30);
        let started = tokio::time::Instant::now();
        match s.recv_timeout(limit).await {
            Err(ApiError::Timeout(l)) => assert_eq!(l, limit),
            other => panic!("expected a time-out, got {other:?}"),
        }
        assert!(started.elapsed() >= limit, "it waited its limit");
        assert!(posted(&s).is_empty());
    }
}
