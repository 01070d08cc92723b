//! The back-end side: join the tree, receive on any stream, send up.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use treecast_node::{connect_parent, connect_to, control_frame, env};
use treecast_transport::SendCredits;
use treecast_transport::{spawn_socket_link_with_credits, Inbound, LinkEvent, LinkSender};
use treecast_wire::{ControlMsg, Frame, FrameHeader, FrameKind, RankSet, TransformKind, Value};

use crate::network::{check_filter, encode_checked};
use crate::{rank_from_env, ApiError, AttachInfo, Packet};

/// Time allowed to reach and authenticate with the parent.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);

type StreamTable = Arc<Mutex<HashMap<u32, TransformKind>>>;

/// What [`BackEnd::next_event`] returns.
#[derive(Debug)]
#[non_exhaustive]
pub enum BackEndEvent {
    /// A packet of some stream; [`Packet::stream`] says which.
    Packet(Packet),
    /// The front-end closed this stream: nothing more arrives on it, and state kept
    /// for it (a [`crate::FileReceivers`] transfer, say) can go.
    StreamClosed(u32),
}

/// A back-end's connection to the tree.
///
/// `recv` takes `&mut self`; to send from other tasks, clone a [`BackEndSender`].
/// [`BackEnd::send`] queues; what it queued is delivered even when the back-end
/// returns from `main` right after, without [`BackEnd::close`].
#[derive(Debug)]
pub struct BackEnd {
    sender: BackEndSender,
    size: u32,
    inbound: mpsc::Receiver<Inbound>,
    pending: VecDeque<Frame>,
    writer: Option<JoinHandle<()>>,
    closed: Option<String>,
}

/// Sends packets up the tree from a back-end; cheap to clone.
#[derive(Debug, Clone)]
pub struct BackEndSender {
    rank: u32,
    size: u32,
    link: LinkSender,
    streams: StreamTable,
    credits: Arc<SendCredits>,
}

impl BackEndSender {
    /// Number of back-ends in the network.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Queues values to send upstream on `stream`; the link's writer sends them in
    /// the background, batched with other packets.
    ///
    /// When this returns `Ok` the packet is queued, not yet written. It is still
    /// delivered if the back-end then returns from `main` (or leaves it through `?`)
    /// without [`BackEnd::close`]: when the runtime drops the link's writer, the writer
    /// writes what is queued before it goes, blocking for at most
    /// [`treecast_transport::LEAVE_LIMIT`]. Only a process that ends without unwinding
    /// (`std::process::exit`, a signal, an abort) loses what is queued; call
    /// [`BackEnd::close`] first there.
    ///
    /// Waits when this back-end already has [`treecast_wire::UP_WINDOW`] packets on
    /// `stream` that the tree has not yet reduced (flow control: a wave is waiting
    /// for slower back-ends, or the front-end is not reading). Packets sent to it
    /// keep arriving meanwhile; if the tool also waits for those, it should receive
    /// in another task (see [`BackEnd::sender`]).
    ///
    /// # Errors
    /// A malformed format, values that do not match it, a format the stream's
    /// filter cannot reduce, an unknown stream, or a closed link.
    ///
    /// Cancel safety: cancel safe.
    pub async fn send(&self, stream: u32, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        let up = self.filter_of(stream)?;
        let (format, payload) = encode_checked(format, values)?;
        check_filter(stream, up, &format)?;
        let frame = Frame::new(FrameHeader::data(stream, tag, self.rank), payload);
        let credit = self.credits.acquire(stream).await;
        self.link
            .send(frame)
            .await
            .map_err(|_| ApiError::Closed("the link to the parent is closed".into()))?;
        if let Some(credit) = credit {
            credit.spend();
        }
        Ok(())
    }

    fn filter_of(&self, stream: u32) -> Result<TransformKind, ApiError> {
        let table = self.streams.lock().map_err(|_| ApiError::Closed("stream table poisoned".into()))?;
        table.get(&stream).copied().ok_or(ApiError::UnknownStream(stream))
    }
}

impl BackEnd {
    /// Joins the tree with the settings the launcher put in the environment
    /// (`TREECAST_PARENT`, `TREECAST_NODE_ID`, `TREECAST_RANK`, `TREECAST_SIZE`, `TREECAST_SECRET`).
    ///
    /// It removes `TREECAST_SECRET` from the environment once read (also from what
    /// `/proc/PID/environ` shows), so call it before starting threads that read or
    /// change the environment.
    ///
    /// # Errors
    /// Missing environment (the program was not started by treecast), or a
    /// parent that cannot be reached or authenticated.
    ///
    /// Cancel safety: not cancel safe.
    pub async fn connect() -> Result<BackEnd, ApiError> {
        let rank = env_u32(env::RANK)?;
        let size = env_u32(env::SIZE)?;
        let (stream, parent, _, _) = connect_parent(CONNECT_LIMIT).await?;
        Self::join(stream, parent, rank, size).await
    }

    /// Joins a network in attach mode, through its attach file: `file`, or the
    /// path in `TREECAST_ATTACH`. The rank comes from `rank` or, when `None`, from
    /// the environment (`TREECAST_RANK`, then the MPI launchers' and Slurm's
    /// variables, see [`crate::RANK_VARS`]).
    ///
    /// The file is used only if it is a regular file owned by this user (or root) that
    /// group and others can neither read nor write (see [`AttachInfo::read`]).
    ///
    /// # Errors
    /// No attach file or rank, a file that fails those checks ([`ApiError::Attach`]),
    /// a rank without a place in the file, or a parent that cannot be reached or
    /// authenticated.
    ///
    /// Cancel safety: not cancel safe.
    pub async fn attach(file: Option<&std::path::Path>, rank: Option<u32>) -> Result<BackEnd, ApiError> {
        let path = match file {
            Some(p) => p.to_path_buf(),
            None => std::env::var_os(env::ATTACH_FILE).map(Into::into).ok_or_else(|| {
                ApiError::Env(format!("no attach file given: pass one or set {}", env::ATTACH_FILE))
            })?,
        };
        let info = AttachInfo::read(&path)?;
        let rank = match rank {
            Some(r) => r,
            None => rank_from_env()?,
        };
        let (node_id, parent) = info.point(rank)?;
        let stream = connect_to(parent, node_id, &info.secret, CONNECT_LIMIT).await?;
        Self::join(stream, parent.to_owned(), rank, info.size).await
    }

    async fn join(
        stream: treecast_transport::Stream,
        parent: String,
        rank: u32,
        size: u32,
    ) -> Result<BackEnd, ApiError> {
        let (tx, inbound) = mpsc::channel(128);
        let socket = stream
            .into_socket()
            .map_err(|e| ApiError::Closed(format!("taking over the parent link: {e}")))?;
        let credits = SendCredits::new();
        let (link, writer) =
            spawn_socket_link_with_credits(socket, 0, format!("parent {parent}"), tx, credits.clone())
                .map_err(|e| ApiError::Closed(format!("registering the parent link: {e}")))?;
        let ready = ControlMsg::Ready { ranks: RankSet::single(rank), commnodes: 0 };
        link.send(control_frame(&ready))
            .await
            .map_err(|_| ApiError::Closed("the parent closed the link".into()))?;
        let sender = BackEndSender { rank, size, link, streams: Arc::default(), credits };
        Ok(BackEnd { sender, size, inbound, pending: VecDeque::new(), writer: Some(writer), closed: None })
    }

    /// This back-end's rank.
    pub fn rank(&self) -> u32 {
        self.sender.rank
    }

    /// Number of back-ends in the network.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// A sender usable from other tasks.
    pub fn sender(&self) -> BackEndSender {
        self.sender.clone()
    }

    /// Waits for the next packet on any stream; [`Packet::stream`] says which.
    ///
    /// # Errors
    /// [`ApiError::Closed`] once the front-end shut the network down or the parent is gone.
    ///
    /// Cancel safety: cancel safe.
    pub async fn recv(&mut self) -> Result<Packet, ApiError> {
        loop {
            if let BackEndEvent::Packet(p) = self.next_event().await? {
                return Ok(p);
            }
        }
    }

    /// Waits for the next packet on any stream, or the close of a stream.
    ///
    /// # Errors
    /// [`ApiError::Closed`] once the front-end shut the network down or the parent is gone.
    ///
    /// Cancel safety: cancel safe.
    pub async fn next_event(&mut self) -> Result<BackEndEvent, ApiError> {
        loop {
            while let Some(frame) = self.pending.pop_front() {
                if frame.header.kind == FrameKind::Data {
                    return Ok(BackEndEvent::Packet(Packet::from_frame(frame)));
                }
                if let Some(closed) = self.on_control(&frame)? {
                    return Ok(BackEndEvent::StreamClosed(closed));
                }
            }
            if let Some(reason) = &self.closed {
                return Err(ApiError::Closed(reason.clone()));
            }
            match self.inbound.recv().await {
                Some(Inbound { event: LinkEvent::Frames(frames), .. }) => self.pending.extend(frames),
                Some(Inbound { event: LinkEvent::Closed(reason), .. }) => {
                    self.closed = Some(reason.unwrap_or_else(|| "the parent closed the link".into()));
                }
                None => self.closed = Some("the link task ended".into()),
            }
        }
    }

    /// Applies a control frame; returns the id of a stream it closed.
    fn on_control(&mut self, frame: &Frame) -> Result<Option<u32>, ApiError> {
        match ControlMsg::decode(&frame.payload) {
            Ok(ControlMsg::NewStream { id, up, .. }) => {
                if let Ok(mut t) = self.sender.streams.lock() {
                    t.insert(id, up);
                }
            }
            Ok(ControlMsg::CloseStream { id }) => {
                if let Ok(mut t) = self.sender.streams.lock() {
                    t.remove(&id);
                }
                self.sender.credits.remove(id);
                return Ok(Some(id));
            }
            Ok(ControlMsg::Shutdown) => {
                self.closed = Some("the front-end shut the network down".into());
                self.pending.clear();
                return Err(ApiError::Closed("the front-end shut the network down".into()));
            }
            Ok(other) => tracing::debug!("back-end ignoring {other:?}"),
            Err(e) => tracing::warn!("back-end ignoring malformed control frame: {e}"),
        }
        Ok(None)
    }

    /// Queues values to send upstream on `stream`; see [`BackEndSender::send`] for
    /// what is guaranteed when the back-end leaves right after.
    ///
    /// # Errors
    /// As [`BackEndSender::send`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn send(&self, stream: u32, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        self.sender.send(stream, tag, format, values).await
    }

    /// Leaves the tree in order: waits (up to [`treecast_transport::LEAVE_LIMIT`]) until
    /// everything sent is written and acknowledged by the parent. Needed before a
    /// process ends without unwinding (`std::process::exit`); returning from `main`
    /// delivers what was sent without it.
    ///
    /// Cancel safety: cancel safe.
    pub async fn close(mut self) {
        let writer = self.writer.take();
        drop(self);
        if let Some(w) = writer {
            let _ = tokio::time::timeout(treecast_transport::LEAVE_LIMIT, w).await;
        }
    }
}

fn env_u32(var: &'static str) -> Result<u32, ApiError> {
    let text = std::env::var(var).map_err(|_| {
        ApiError::Env(format!("{var} is not set: this program must be started by treecast as a back-end"))
    })?;
    text.parse().map_err(|_| ApiError::Env(format!("{var}={text:?} is not a number")))
}
