//! Streams at the front-end: a communicator bound to filters, sending down and
//! receiving reductions.

use std::task::Poll;
use std::time::Duration;

use treecast_driver::{lock, Shared, Tool};
use treecast_filters::TransformKind;
use treecast_proto::{Command, CommandError, Delivery};
use treecast_wire::{
    encode_values, FilterSpec, Format, Frame, FrameHeader, RankSet, SyncMode, Value, Window,
    DEFAULT_DOWN_WINDOW, DEFAULT_UP_WINDOW, FLAG_DIRECT,
};

use crate::frontend::FeTool;
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
/// `recv` takes `&mut self`; to send from other tasks or threads while one receives,
/// clone a [`StreamSender`].
#[derive(Debug)]
pub struct Stream {
    sender: StreamSender,
    options: StreamOptions,
    /// The tool saw its end (or closed it).
    ended: bool,
}

/// Sends down one stream, from any task or thread; cheap to clone. Sending on a
/// stream that was closed fails.
#[derive(Debug, Clone)]
pub struct StreamSender {
    id: u32,
    shared: Shared<FeTool>,
    comm: Communicator,
    backends: u32,
}

/// A tool that can wait for room to send on a stream.
pub(crate) trait WaitsForCredit: Tool {
    /// Wakes `cx` once `stream` can take a frame again.
    fn wait_writable(&mut self, stream: u32, cx: &std::task::Context<'_>);
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
        match d.command(Command::Send(f)) {
            Ok(()) => Poll::Ready(Ok(())),
            Err(CommandError::Blocked(back)) => {
                frame = Some(back);
                d.tool().wait_writable(credit, cx);
                Poll::Pending
            }
            Err(e) => Poll::Ready(Err(ApiError::from_command(stream, e))),
        }
    })
    .await
}

/// Encodes `values` after checking them against `format`; returns the parsed format too.
pub(crate) fn encode_checked(format: &str, values: &[Value]) -> Result<(Format, Vec<u8>), ApiError> {
    let fmt = Format::parse(format)?;
    fmt.check(values)?;
    let mut payload = Vec::with_capacity(values.len() * 8 + 8);
    encode_values(values, &mut payload);
    Ok((fmt, payload))
}

impl Stream {
    pub(crate) fn new(
        id: u32,
        shared: Shared<FeTool>,
        comm: Communicator,
        options: StreamOptions,
        backends: u32,
    ) -> Self {
        Stream { sender: StreamSender { id, shared, comm, backends }, options, ended: false }
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

    fn poll_packet(&mut self, cx: Option<&std::task::Context<'_>>) -> Poll<Result<Packet, ApiError>> {
        if self.ended {
            return Poll::Ready(Err(ApiError::StreamClosed(self.sender.id)));
        }
        let id = self.sender.id;
        let mut d = lock(&self.sender.shared);
        match d.deliver(Some(id)) {
            Some(Delivery::Packet(f)) => return Poll::Ready(Ok(Packet::from_frame(f))),
            Some(Delivery::NoAnswer(id)) => return Poll::Ready(Err(ApiError::NoAnswer(id))),
            Some(Delivery::StreamClosed(_)) => {
                self.ended = true;
                return Poll::Ready(Err(match d.tool().refused.get(&self.sender.id) {
                    Some(reason) => {
                        ApiError::StreamRefused { stream: self.sender.id, reason: reason.clone() }
                    }
                    None => ApiError::StreamClosed(self.sender.id),
                }));
            }
            None => {}
        }
        if let Some(reason) = &d.tool().over {
            return Poll::Ready(Err(ApiError::Closed(reason.clone())));
        }
        if !d.core().has_stream(self.sender.id) {
            self.ended = true;
            return Poll::Ready(Err(ApiError::StreamClosed(self.sender.id)));
        }
        if let Some(cx) = cx {
            d.tool().wait_readable(self.sender.id, cx);
        }
        Poll::Pending
    }

    /// Waits for the next packet (a reduction result, or a back-end's packet with the null filter).
    ///
    /// # Errors
    /// [`ApiError::StreamClosed`] once every member is lost and nothing is left,
    /// [`ApiError::StreamRefused`] when a node could not make its filters,
    /// [`ApiError::NoAnswer`] for a request no rank answered (the stream goes on).
    ///
    /// Cancel safety: cancel safe.
    pub async fn recv(&mut self) -> Result<Packet, ApiError> {
        std::future::poll_fn(|cx| self.poll_packet(Some(cx))).await
    }

    /// [`Stream::recv`] with a time limit.
    ///
    /// # Errors
    /// [`ApiError::Timeout`] or [`ApiError::StreamClosed`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn recv_timeout(&mut self, limit: Duration) -> Result<Packet, ApiError> {
        tokio::time::timeout(limit, self.recv()).await.map_err(|_| ApiError::Timeout(limit))?
    }

    /// Returns a packet if one is queued.
    pub fn try_recv(&mut self) -> Option<Packet> {
        match self.poll_packet(None) {
            Poll::Ready(Ok(p)) => Some(p),
            _ => None,
        }
    }

    /// Closes the stream in the whole tree (after what was sent on it).
    ///
    /// Cancel safety: cancel safe.
    pub async fn close(mut self) {
        self.close_now();
    }

    fn close_now(&mut self) {
        self.ended = true;
        let mut d = lock(&self.sender.shared);
        if d.core().has_stream(self.sender.id) {
            let _ = d.command(Command::CloseStream(self.sender.id));
        }
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
        let (_, payload) = encode_checked(format, values)?;
        self.send_frame(Frame::new(FrameHeader::data(self.id, tag, FRONT_END_RANK), payload)).await
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
        let (_, payload) = encode_checked(format, values)?;
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
