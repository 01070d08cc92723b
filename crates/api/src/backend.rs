//! The back-end side: join the tree, receive on any stream, send up.

use std::task::{Context, Poll};
use std::time::Duration;

use tokio::task::JoinHandle;
use treecast_driver::{drive, lock, Driver, Launching, NodeRoute, Shared, LAST_FLUSH};
use treecast_driver::{env, read_secret, DEFAULT_MAX_FRAME};
use treecast_filters::{FilterRegistry, RegistryError};
use treecast_proto::{Command, Delivery, Node, NodeConfig, Role};
use treecast_transport::Secret;
use treecast_wire::{Format, Frame, FrameHeader, Value, Window};

use crate::betool::{BeTool, Placed};
use crate::collective::{Collected, ReduceOp, Request};
use crate::collective_run as collective;
use crate::encoding::{encode_checked, encode_checked_then};
use crate::stream::{send_with_credit, try_send};
use crate::{rank_from_env, ApiError, AttachError, AttachInfo, Group, Packet};
use treecast_wire::{CollectiveOp, Combine};

/// Time allowed to reach and authenticate with the parent.
const CONNECT_LIMIT: Duration = Duration::from_secs(30);
/// Time allowed for the parent's plan once the link is up (it is the parent's first
/// message, so this only runs out when the parent is stuck).
const PLAN_LIMIT: Duration = Duration::from_secs(30);
/// The rank a back-end announces before it knows it: its parent uses the rank it
/// started the process as.
const RANK_NOT_KNOWN: u32 = u32::MAX;

/// What [`BackEnd::next_event`] returns.
#[derive(Debug)]
#[non_exhaustive]
pub enum BackEndEvent {
    /// A packet of some stream; [`Packet::stream`] says which.
    Packet(Packet),
    /// A message from another back-end ([`BackEndSender::send_to_rank`]);
    /// [`Packet::rank`] is its sender, [`Packet::tag`] its tag.
    Message(Packet),
    /// The front-end closed this stream: nothing more arrives on it, and state kept
    /// for it (a `treecast_files::FileReceivers` transfer, say) can go.
    StreamClosed(u32),
}

/// What a back-end brings to the tree beyond what its launcher tells it.
#[derive(Clone)]
pub struct JoinOptions {
    /// The filters this back-end can make (the built-ins unless set): a filter a
    /// tool registers here can run on its back-ends too.
    pub registry: FilterRegistry,
}

impl Default for JoinOptions {
    fn default() -> Self {
        JoinOptions { registry: FilterRegistry::builtin() }
    }
}

/// A back-end's connection to the tree.
///
/// Sending queues a packet in the back-end's link and writes it to the socket at
/// once when the kernel takes it; what is still queued when the back-end is closed
/// or dropped is written before it goes (waiting at most 5 s), so a back-end that
/// returns from `main` right after sending loses nothing. `recv` takes `&mut self`;
/// to send from other tasks, clone a [`BackEndSender`].
///
/// [`BackEnd::close`] leaves the tree in order: the front-end sees the rank leave
/// ([`crate::Event::RanksLeft`]). A back-end dropped without it (its `main` returns
/// an error, it panics) is reported lost ([`crate::Event::RanksLost`]) with its exit
/// status and the end of its stderr, which says why.
#[derive(Debug)]
pub struct BackEnd {
    sender: BackEndSender,
    task: Option<JoinHandle<()>>,
    /// Packets a matched receive skipped, in arrival order, for the next receives.
    held: std::collections::VecDeque<Packet>,
}

/// A packet a full window handed back to [`BackEndSender::try_send_encoded`]; nothing
/// of it was sent.
#[derive(Debug)]
pub struct Unsent(Frame);

/// Sends packets up the tree from a back-end; cheap to clone.
#[derive(Debug, Clone)]
pub struct BackEndSender {
    rank: u32,
    size: u32,
    group: Option<treecast_wire::GroupPlace>,
    shared: Shared<BeTool>,
}

impl BackEndSender {
    /// Calls `hook` whenever a packet arrives and when the network ends, so that a
    /// tool's own event loop (`poll`, `epoll`) can wake and read with a zero time
    /// limit. It runs on the back-end's task: it must return at once and not call into
    /// the back-end. Replaces any hook set before.
    pub fn on_ready(&self, hook: impl Fn() + Send + Sync + 'static) {
        let hook = crate::frontend::ReadyHook(std::sync::Arc::new(hook));
        lock(&self.shared).tool().ready = Some(hook);
    }

    /// Number of back-ends in the network.
    pub fn size(&self) -> u32 {
        self.size
    }

    /// Resolves once the network is over for this back-end (shut down, left, or the
    /// parent lost for good), with why: a tool busy with long work of its own can
    /// stop then rather than learn it at its next call. Its process is not ended for
    /// it: with recovery on, a back-end outlives a lost parent to rejoin the tree.
    ///
    /// Cancel safety: cancel safe.
    pub async fn closed(&self) -> ApiError {
        std::future::poll_fn(|cx| {
            let mut d = lock(&self.shared);
            let tool = d.tool();
            match &tool.over {
                Some(reason) => Poll::Ready(ApiError::Closed(reason.clone())),
                None => {
                    crate::request::register(&mut tool.closers, cx);
                    Poll::Pending
                }
            }
        })
        .await
    }

    /// Waits until everything this back-end sent so far is written out to its link
    /// (MRNet's `flush`). Sends go out as soon as the kernel takes them, so this only
    /// waits while the link is full; bound it with a timeout, as a parent that stops
    /// reading never lets it end.
    ///
    /// Cancel safety: cancel safe.
    pub async fn flush(&self) {
        std::future::poll_fn(|cx| lock(&self.shared).poll_flushed(cx)).await
    }

    /// Sends values upstream on `stream`: queued at once, written to the link as the
    /// kernel takes it (see [`BackEnd`] for what closing and dropping guarantee).
    ///
    /// Waits when this back-end already has a window's worth of packets on `stream`
    /// that the tree has not yet reduced (a wave is waiting for slower back-ends, or
    /// the front-end is not reading). Packets sent to this back-end keep arriving
    /// and are queued meanwhile.
    ///
    /// # Errors
    /// A malformed format, values that do not match it, an unknown stream, or a
    /// closed link; [`ApiError::WrongFormat`] for values the stream's filter cannot
    /// take (`%s` on a `sum` stream): nothing is sent, and the front-end gets an
    /// [`crate::Event::FilterError`] naming this rank. The wave waits for this rank's
    /// next packet on the stream, as it would for a packet not yet sent.
    ///
    /// Cancel safety: cancel safe: a cancelled send sent nothing.
    pub async fn send(&self, stream: u32, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        let unsent = encode_checked_then(format, values, |format, payload| {
            self.try_send_encoded(stream, tag, format, payload)
        })?;
        match unsent {
            None => Ok(()),
            Some(unsent) => self.send_unsent(unsent).await,
        }
    }

    /// [`BackEndSender::send`] of values already encoded: `payload` must be the
    /// encoding (`treecast_wire::encode_values`) of values of `format`, which is what
    /// the stream's filter is checked against. For bindings that encode their own
    /// values; a payload that does not match its format is refused by the comm node
    /// whose filter reads it, which reports this rank.
    ///
    /// # Errors
    /// As [`BackEndSender::send`].
    ///
    /// Cancel safety: cancel safe: a cancelled send sent nothing.
    pub async fn send_encoded(
        &self,
        stream: u32,
        tag: i32,
        format: &Format,
        payload: impl Into<bytes::Bytes>,
    ) -> Result<(), ApiError> {
        match self.try_send_encoded(stream, tag, format, payload)? {
            None => Ok(()),
            Some(unsent) => self.send_unsent(unsent).await,
        }
    }

    /// [`BackEndSender::send_encoded`] without waiting, for callers that are not in a
    /// runtime: `Ok(None)` when the packet went into the stream's window, its
    /// [`Unsent`] frame when the window is full (then [`BackEndSender::send_unsent`]).
    /// A binding's send loop then builds no future for a send that has room.
    ///
    /// # Errors
    /// As [`BackEndSender::send`].
    pub fn try_send_encoded(
        &self,
        stream: u32,
        tag: i32,
        format: &Format,
        payload: impl Into<bytes::Bytes>,
    ) -> Result<Option<Unsent>, ApiError> {
        let frame = Frame::new(FrameHeader::data(stream, tag, self.rank), payload);
        // The check and the try under one lock: a send with room in its window takes
        // the lock once.
        let mut d = lock(&self.shared);
        let known = matches!(&d.tool().checked, Some((s, f)) if *s == stream && f == format);
        if !known {
            Self::check_filter(&mut d, stream, format)?;
            d.tool().checked = Some((stream, format.clone()));
        }
        Ok(try_send(&mut d, frame)?.map(Unsent))
    }

    /// Sends what [`BackEndSender::try_send_encoded`] handed back, once its stream's
    /// window has room.
    ///
    /// # Errors
    /// As [`BackEndSender::send`].
    ///
    /// Cancel safety: cancel safe: a cancelled send sent nothing.
    pub async fn send_unsent(&self, unsent: Unsent) -> Result<(), ApiError> {
        send_with_credit(&self.shared, unsent.0).await
    }

    /// Whether the filter of `stream` takes packets of `format`; a refusal is also
    /// reported to the front-end.
    fn check_filter(d: &mut Driver<BeTool, NodeRoute>, stream: u32, format: &Format) -> Result<(), ApiError> {
        {
            let spec = d.core().stream_filter(stream).ok_or(ApiError::UnknownStream(stream))?;
            // Borrowed: only a refused packet needs the filter's name, copied then.
            match d.core().registry().check_format(spec, format) {
                // Back-ends run no filter: one this back-end does not know (a plug-in the
                // comm nodes load) is checked where it runs, which names this rank.
                Ok(()) | Err(RegistryError::Unknown { .. }) => {}
                Err(RegistryError::Format(source)) => {
                    let filter = spec.name.clone();
                    let message = format!("{} did not send its packet: {source}", d.core().name());
                    // The front-end hears of it even if this back-end gives up on the error.
                    let _ = d.command(Command::ReportFilterError { stream, message });
                    return Err(ApiError::WrongFormat { stream, filter, source });
                }
                Err(other) => {
                    let node = d.core().name().to_owned();
                    return Err(ApiError::StreamFilter { stream, node, source: other });
                }
            }
        }
        Ok(())
    }

    /// Sends values to back-end `rank` (of any group), outside any stream: it goes up
    /// only as far as the lowest comm node above both ranks, then down; the receiver
    /// gets a [`BackEndEvent::Message`] with this rank and `tag`. Messages from one
    /// sender to one receiver arrive in order.
    ///
    /// Waits while this back-end has [`treecast_proto::PEER_WINDOW`] of messages
    /// not yet read by their receivers, and while it rejoins the tree after losing
    /// its comm node; wrap it in a time-out to bound the wait. A message to a rank
    /// that is gone is dropped and counts as read (when the front-end is where it is
    /// dropped, it sees [`crate::Event::MessageUndeliverable`]).
    ///
    /// # Errors
    /// A malformed format or values that do not match it, or a closed link.
    ///
    /// Cancel safety: cancel safe: a cancelled send sent nothing.
    pub async fn send_to_rank(
        &self,
        rank: u32,
        tag: i32,
        format: &str,
        values: &[Value],
    ) -> Result<(), ApiError> {
        let payload = encode_checked(format, values)?;
        send_with_credit(&self.shared, Frame::new(FrameHeader::peer(rank, tag, self.rank), payload)).await
    }

    /// Asks the front-end to start `n` back-ends running `command` (program first;
    /// empty: the launch's back-end command), placed as the front-end places its
    /// own spawns (least loaded), and waits until they have joined: the MPI case of a
    /// worker that spawns helpers. The request goes up through this back-end's
    /// parent; the answer comes back the same way.
    ///
    /// # Errors
    /// [`ApiError::SpawnRefused`] with the front-end's reason (a process that did not
    /// start, the time limit); [`ApiError::Timeout`] when no answer came within
    /// [`crate::DEFAULT_SPAWN_LIMIT`] and 10 s more; [`ApiError::Closed`].
    ///
    /// Cancel safety: not cancel safe: the processes of a cancelled spawn stay.
    pub async fn spawn(&self, n: u32, command: &[String]) -> Result<crate::Group, ApiError> {
        let id = {
            let mut d = lock(&self.shared);
            let id = d.tool().next_spawn;
            d.tool().next_spawn = id.wrapping_add(1);
            let request = Command::RequestSpawn { id, n, command: command.to_vec() };
            d.command(request).map_err(|e| ApiError::from_command(0, e))?;
            id
        };
        let limit = crate::DEFAULT_SPAWN_LIMIT + Duration::from_secs(10);
        let answer = std::future::poll_fn(|cx| {
            let mut d = lock(&self.shared);
            let tool = d.tool();
            if let Some(answer) = tool.spawn_replies.remove(&id) {
                return Poll::Ready(Ok(answer));
            }
            if let Some(reason) = &tool.over {
                return Poll::Ready(Err(ApiError::Closed(reason.clone())));
            }
            crate::request::register(&mut tool.spawn_waiters, cx);
            Poll::Pending
        });
        match tokio::time::timeout(limit, answer).await {
            Ok(Ok(Ok(group))) => Ok(group),
            Ok(Ok(Err(why))) => Err(ApiError::SpawnRefused(why)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(ApiError::Timeout(limit)),
        }
    }

    /// Sends values to every back-end of `ranks` at once (a group's broadcast): the
    /// message goes up to the lowest comm node above this rank and all of them, and
    /// down one copy per link, each naming only the ranks behind it. Each receiver
    /// gets a [`BackEndEvent::Message`], as from [`BackEndSender::send_to_rank`]; it
    /// counts once per receiver in this sender's window.
    ///
    /// # Errors
    /// As [`BackEndSender::send_to_rank`]; [`ApiError::NoSuchRanks`] for an empty set.
    ///
    /// Cancel safety: cancel safe: a cancelled send sent nothing.
    pub async fn send_to_ranks(
        &self,
        ranks: &treecast_wire::RankSet,
        tag: i32,
        format: &str,
        values: &[Value],
    ) -> Result<(), ApiError> {
        if ranks.is_empty() {
            return Err(ApiError::NoSuchRanks { ranks: ranks.clone(), last: self.size.saturating_sub(1) });
        }
        let payload = encode_checked(format, values)?;
        let mut header = FrameHeader::peer(u32::MAX, tag, self.rank);
        header.flags = treecast_wire::FLAG_PEER_MULTI;
        send_with_credit(&self.shared, Frame::new(header, treecast_wire::encode_multi(ranks, &payload))).await
    }
}

impl BackEndSender {
    /// Waits at most `limit` for the other members in each collective operation
    /// from now on (default [`crate::DEFAULT_COLLECTIVE_LIMIT`]).
    pub fn set_collective_limit(&self, limit: Duration) {
        lock(&self.shared).tool().collectives.limit = limit;
    }

    /// Returns once every member of `group` has entered this barrier (members lost
    /// meanwhile are not waited for).
    ///
    /// # Errors
    /// [`ApiError::Collective`]: this rank is not a member, members disagree on what
    /// they compute, or one has not entered within the limit; [`ApiError::Closed`].
    ///
    /// Cancel safety: not cancel safe. A call takes its number in the group's
    /// series first: cancelled, the others wait for this member in that operation
    /// (until their limit) unless it had entered, and this member's next call is
    /// the next operation either way.
    pub async fn barrier(&self, group: &Group) -> Result<Collected, ApiError> {
        let req = Request::new(group, CollectiveOp::Barrier, Combine::None, u32::MAX, None);
        collective::run(&self.shared, self.rank, req).await
    }

    /// Combines the members' values with `op`; every member gets the result.
    ///
    /// # Errors
    /// As [`BackEndSender::barrier`]; values that do not match `format`, or that
    /// `op` cannot combine (named in the error every member gets).
    ///
    /// Cancel safety: not cancel safe (see [`BackEndSender::barrier`]).
    pub async fn all_reduce(
        &self,
        group: &Group,
        op: ReduceOp,
        format: &str,
        values: &[Value],
    ) -> Result<Collected, ApiError> {
        let req =
            Request::new(group, CollectiveOp::AllReduce, op.combine(), u32::MAX, Some((format, values)));
        collective::run(&self.shared, self.rank, req).await
    }

    /// Combines the members' values with `op` and sends the result to `root`, which
    /// may belong to another group: there it is [`Collected::values`]; the members
    /// get empty values once it is done. The root calls too (with its values if it
    /// is a member; what a root outside the group passes is not used).
    ///
    /// # Errors
    /// As [`BackEndSender::all_reduce`].
    ///
    /// Cancel safety: not cancel safe (see [`BackEndSender::barrier`]).
    pub async fn reduce(
        &self,
        group: &Group,
        root: u32,
        op: ReduceOp,
        format: &str,
        values: &[Value],
    ) -> Result<Collected, ApiError> {
        let values = group.group_rank(self.rank).map(|_| (format, values));
        let req = Request { group, op: CollectiveOp::Reduce, combine: op.combine(), root, values };
        collective::run(&self.shared, self.rank, req).await
    }

    /// Every member gets every member's values ([`Collected::gathered`], in group
    /// order).
    ///
    /// # Errors
    /// As [`BackEndSender::barrier`], and values that do not match `format`.
    ///
    /// Cancel safety: not cancel safe (see [`BackEndSender::barrier`]).
    pub async fn all_gather(
        &self,
        group: &Group,
        format: &str,
        values: &[Value],
    ) -> Result<Collected, ApiError> {
        let req =
            Request::new(group, CollectiveOp::AllGather, Combine::None, u32::MAX, Some((format, values)));
        collective::run(&self.shared, self.rank, req).await
    }

    /// Combines the members' arrays with `op`, element-wise; member i (in group
    /// order) gets block i of each array. Every array's length must be a multiple of
    /// the group's size.
    ///
    /// # Errors
    /// As [`BackEndSender::all_reduce`], and arrays that do not split evenly.
    ///
    /// Cancel safety: not cancel safe (see [`BackEndSender::barrier`]).
    pub async fn reduce_scatter(
        &self,
        group: &Group,
        op: ReduceOp,
        format: &str,
        values: &[Value],
    ) -> Result<Collected, ApiError> {
        let req =
            Request::new(group, CollectiveOp::ReduceScatter, op.combine(), u32::MAX, Some((format, values)));
        collective::run(&self.shared, self.rank, req).await
    }
}

impl BackEnd {
    /// Joins the tree through the parent the launcher named in the environment
    /// (`TREECAST_PARENT`, `TREECAST_NODE_ID`, `TREECAST_SECRET`), and waits for the
    /// parent's plan: the rank, the network's size and limits come from there, not
    /// from the environment (`TREECAST_RANK` and `TREECAST_SIZE` are set for the
    /// tool's scripts only).
    ///
    /// It removes `TREECAST_SECRET` from the environment once read (also from what
    /// `/proc/PID/environ` shows), so call it before starting threads that read or
    /// change the environment.
    ///
    /// # Errors
    /// Missing environment (the program was not started by treecast), a
    /// parent that cannot be reached or authenticated, or no plan from it within 30 s
    /// or one this build cannot read ([`ApiError::NoPlan`]).
    ///
    /// Cancel safety: not cancel safe.
    pub async fn connect() -> Result<BackEnd, ApiError> {
        Self::connect_with(JoinOptions::default()).await
    }

    /// As [`BackEnd::connect`], with `options` (the filters this back-end can make).
    ///
    /// # Errors
    /// As [`BackEnd::connect`].
    ///
    /// Cancel safety: not cancel safe.
    pub async fn connect_with(options: JoinOptions) -> Result<BackEnd, ApiError> {
        let node_id = env_u32(env::NODE_ID)?;
        let parent = std::env::var(env::PARENT).map_err(|_| ApiError::NotLaunched { var: env::PARENT })?;
        let secret = read_secret().map_err(ApiError::Join)?;
        // A light join: the parent counts this process as joined from its
        // announcement; if it cannot be sent, joining by connecting still works.
        let announced = match std::env::var(env::JOIN_ANNOUNCE) {
            Ok(address) => {
                match treecast_transport::announce::send_announce(&address, &secret, node_id, RANK_NOT_KNOWN)
                {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::debug!("joining by connecting: {e}");
                        false
                    }
                }
            }
            Err(_) => false,
        };
        if announced {
            wait_for_gate().await?;
        }
        Self::join(&parent, node_id, &secret, announced, options).await
    }

    /// Joins a network in attach mode, through its attach file: `file`, or the
    /// path in `TREECAST_ATTACH`. The rank comes from `rank` or, when `None`, from
    /// the environment (`TREECAST_RANK`, then the MPI launchers' and Slurm's
    /// variables, see [`crate::RANK_VARS`]).
    ///
    /// # Errors
    /// No attach file or rank, a rank without a place in the file, or a parent
    /// that cannot be reached or authenticated.
    ///
    /// Cancel safety: not cancel safe.
    pub async fn attach(file: Option<&std::path::Path>, rank: Option<u32>) -> Result<BackEnd, ApiError> {
        Self::attach_with(file, rank, JoinOptions::default()).await
    }

    /// As [`BackEnd::attach`], with `options` (the filters this back-end can make).
    ///
    /// # Errors
    /// As [`BackEnd::attach`].
    ///
    /// Cancel safety: not cancel safe.
    pub async fn attach_with(
        file: Option<&std::path::Path>,
        rank: Option<u32>,
        options: JoinOptions,
    ) -> Result<BackEnd, ApiError> {
        let path = match file {
            Some(p) => p.to_path_buf(),
            None => std::env::var_os(env::ATTACH_FILE)
                .map(Into::into)
                .ok_or(ApiError::NoAttachFile { var: env::ATTACH_FILE })?,
        };
        let info = AttachInfo::read(&path)?;
        if info.network.is_some() {
            return Err(AttachError::NetworkPort { path }.into());
        }
        let rank = match rank {
            Some(r) => r,
            None => rank_from_env()?,
        };
        // In a port file the launcher's numbering (0, 1, …) is relative to its first rank.
        let rank = info.base.saturating_add(rank);
        let (node_id, parent) = info.point(rank)?;
        Self::join(parent, node_id, &info.secret, false, options).await
    }

    /// Joins a running network through the port file a front-end's
    /// [`crate::Network::accept`] wrote, as the `index`-th process of the group it
    /// accepts (`None`: from the launcher's environment, as [`BackEnd::attach`]):
    /// processes started by another job, a debugger or a batch system become a new
    /// group of the network.
    ///
    /// # Errors
    /// As [`BackEnd::attach`].
    ///
    /// Cancel safety: not cancel safe.
    pub async fn connect_port(port: &std::path::Path, index: Option<u32>) -> Result<BackEnd, ApiError> {
        Self::attach(Some(port), index).await
    }

    /// Links to the parent at `parent` as `node_id` and waits for its member plan;
    /// `announced`: a light join, whose announcement joined it already.
    async fn join(
        parent: &str,
        node_id: u32,
        secret: &Secret,
        announced: bool,
        options: JoinOptions,
    ) -> Result<BackEnd, ApiError> {
        let mut core = Node::new(NodeConfig {
            // Who it is comes with the member plan.
            role: Role::BackEnd { rank: RANK_NOT_KNOWN, size: 0 },
            node_id,
            name: format!("back-end (node {node_id})"),
            registry: options.registry,
            tool_window: Window { packets: 1, bytes: 1 },
        });
        if announced {
            core.set_announced();
        }
        let launching = Launching::new(secret.clone(), std::path::PathBuf::new());
        let driver =
            treecast_driver::join_parent(parent, core, BeTool::default(), launching, DEFAULT_MAX_FRAME)
                .await
                .map_err(ApiError::Join)?;
        let shared = std::sync::Arc::new(std::sync::Mutex::new(driver));
        let task = tokio::spawn(drive(shared.clone()));
        match placed(&shared, parent).await {
            Ok(Placed { rank, size, group }) => Ok(BackEnd {
                sender: BackEndSender { rank, size, group, shared },
                task: Some(task),
                held: std::collections::VecDeque::new(),
            }),
            Err(e) => {
                task.abort();
                Err(e)
            }
        }
    }

    /// This back-end's rank.
    pub fn rank(&self) -> u32 {
        self.sender.rank
    }

    /// Number of back-ends in the network.
    pub fn size(&self) -> u32 {
        self.sender.size
    }

    /// Calls `hook` whenever a packet arrives; see [`BackEndSender::on_ready`].
    pub fn on_ready(&self, hook: impl Fn() + Send + Sync + 'static) {
        self.sender.on_ready(hook);
    }

    /// The group this back-end was spawned in, with its rank and size there (`None`:
    /// one of the tree's own back-ends).
    pub fn group(&self) -> Option<treecast_wire::GroupPlace> {
        self.sender.group
    }

    /// A sender usable from other tasks.
    pub fn sender(&self) -> BackEndSender {
        self.sender.clone()
    }

    /// Waits for the next packet on any stream; [`Packet::stream`] says which.
    /// Messages from other back-ends are read and dropped here: a tool that
    /// receives them ([`BackEndSender::send_to_rank`]) reads with
    /// [`BackEnd::next_event`].
    ///
    /// # Errors
    /// [`ApiError::Closed`] once the front-end shut the network down or the parent is gone.
    ///
    /// Cancel safety: cancel safe.
    pub async fn recv(&mut self) -> Result<Packet, ApiError> {
        self.recv_matching(crate::Match::any()).await
    }

    /// Waits for the next packet that `m` matches (stream, tag, source rank); the
    /// packets it skips are kept, in order, for later receives and events.
    /// Messages from other back-ends are read and dropped, as by [`BackEnd::recv`].
    ///
    /// # Errors
    /// As [`BackEnd::recv`]; [`ApiError::Unmatched`] when [`crate::HELD_LIMIT`]
    /// skipped packets are held and none matches.
    ///
    /// Cancel safety: cancel safe: a packet read while waiting is kept, not lost.
    pub async fn recv_matching(&mut self, m: crate::Match) -> Result<Packet, ApiError> {
        if let Some(p) = self.held.iter().position(|p| m.accepts(p)).and_then(|i| self.held.remove(i)) {
            return Ok(p);
        }
        loop {
            if self.held.len() >= crate::HELD_LIMIT {
                let stream = m.stream.unwrap_or(0);
                return Err(ApiError::Unmatched { stream, held: self.held.len() });
            }
            // Straight from the driver, not through `next_event`, which would hand
            // the held packets back first.
            if let BackEndEvent::Packet(p) = std::future::poll_fn(|cx| self.poll_event(cx)).await? {
                if m.accepts(&p) {
                    return Ok(p);
                }
                self.held.push_back(p);
            }
        }
    }

    fn poll_event(&mut self, cx: &mut Context<'_>) -> Poll<Result<BackEndEvent, ApiError>> {
        let mut d = lock(&self.sender.shared);
        match d.deliver(None) {
            Some(Delivery::Packet(f)) if f.header.kind == treecast_wire::FrameKind::Peer => {
                Poll::Ready(Ok(BackEndEvent::Message(Packet::from_frame(f))))
            }
            Some(Delivery::Packet(f)) => Poll::Ready(Ok(BackEndEvent::Packet(Packet::from_frame(f)))),
            Some(Delivery::StreamClosed(id)) => Poll::Ready(Ok(BackEndEvent::StreamClosed(id))),
            // A front-end's delivery only; a back-end's core never makes it.
            Some(Delivery::NoAnswer(_)) | None => {
                let tool = d.tool();
                if let Some(reason) = &tool.over {
                    return Poll::Ready(Err(ApiError::Closed(reason.clone())));
                }
                tool.reader = Some(cx.waker().clone());
                Poll::Pending
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
        if let Some(p) = self.held.pop_front() {
            return Ok(BackEndEvent::Packet(p));
        }
        std::future::poll_fn(|cx| self.poll_event(cx)).await
    }

    /// Waits until everything sent so far is written out; see [`BackEndSender::flush`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn flush(&self) {
        self.sender.flush().await
    }

    /// Sends values upstream on `stream`; see [`BackEndSender::send`].
    ///
    /// # Errors
    /// As [`BackEndSender::send`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn send(&self, stream: u32, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        self.sender.send(stream, tag, format, values).await
    }

    /// Asks the front-end to start `n` back-ends; see [`BackEndSender::spawn`].
    ///
    /// # Errors
    /// As [`BackEndSender::spawn`].
    ///
    /// Cancel safety: not cancel safe.
    pub async fn spawn(&self, n: u32, command: &[String]) -> Result<crate::Group, ApiError> {
        self.sender.spawn(n, command).await
    }

    /// Sends values to every back-end of `ranks`; see [`BackEndSender::send_to_ranks`].
    ///
    /// # Errors
    /// As [`BackEndSender::send_to_ranks`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn send_to_ranks(
        &self,
        ranks: &treecast_wire::RankSet,
        tag: i32,
        format: &str,
        values: &[Value],
    ) -> Result<(), ApiError> {
        self.sender.send_to_ranks(ranks, tag, format, values).await
    }

    /// Sends values to back-end `rank`; see [`BackEndSender::send_to_rank`].
    ///
    /// # Errors
    /// As [`BackEndSender::send_to_rank`].
    ///
    /// Cancel safety: cancel safe.
    pub async fn send_to_rank(
        &self,
        rank: u32,
        tag: i32,
        format: &str,
        values: &[Value],
    ) -> Result<(), ApiError> {
        self.sender.send_to_rank(rank, tag, format, values).await
    }

    /// Leaves the tree: what was sent is delivered, then the link closes and the
    /// front-end sees this rank leave (not fail).
    ///
    /// Cancel safety: cancel safe.
    pub async fn close(mut self) {
        let _ = lock(&self.sender.shared).command(Command::Shutdown);
        let deadline = tokio::time::Instant::now() + LAST_FLUSH;
        if let Some(task) = self.task.take() {
            if tokio::time::timeout_at(deadline, task).await.is_err() {
                tracing::warn!("the link to the parent did not take what was queued within {LAST_FLUSH:?}");
            }
        }
        // Over TCP, the parent must have every byte before this process may exit: a
        // reset on exit throws away what it had not acknowledged.
        while lock(&self.sender.shared).unacknowledged() > 0 && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

impl Drop for BackEnd {
    fn drop(&mut self) {
        let Some(task) = self.task.take() else { return };
        // The runtime may be going away with us (main returned): write what is
        // queued now, with a time limit, rather than leave it to a task. No leave is
        // sent: without `close`, the back-end is ending on an error or a panic, and
        // its parent reports it lost with how its process ended.
        let mut d = lock(&self.sender.shared);
        d.flush_blocking(LAST_FLUSH);
        drop(d);
        task.abort();
    }
}

/// Waits for the member plan the parent at `parent` sends first, at most [`PLAN_LIMIT`].
///
/// Cancel safety: cancel safe.
async fn placed(shared: &Shared<BeTool>, parent: &str) -> Result<Placed, ApiError> {
    let no_plan = |why: String| ApiError::NoPlan { parent: parent.to_owned(), why };
    let wait = std::future::poll_fn(|cx| {
        let mut d = lock(shared);
        let tool = d.tool();
        if let Some(placed) = tool.placed {
            return Poll::Ready(Ok(placed));
        }
        if let Some(reason) = &tool.over {
            return Poll::Ready(Err(no_plan(reason.to_string())));
        }
        tool.placer = Some(cx.waker().clone());
        Poll::Pending
    });
    match tokio::time::timeout(PLAN_LIMIT, wait).await {
        Ok(answer) => answer,
        Err(_) => Err(no_plan(format!("none came within {PLAN_LIMIT:?}"))),
    }
}

/// Test hook ([`treecast_transport::testing::JOIN_GATE`]): a back-end that announced
/// itself waits for this file to exist before it connects, at most [`CONNECT_LIMIT`],
/// so that a test can hold its link back and see what its comm node keeps for it
/// meanwhile.
///
/// # Errors
/// The hook is set but empty.
async fn wait_for_gate() -> Result<(), ApiError> {
    let Some(gate) = treecast_transport::testing::join_gate().map_err(|e| ApiError::Env(e.to_string()))?
    else {
        return Ok(());
    };
    let until = tokio::time::Instant::now() + CONNECT_LIMIT;
    while !gate.exists() && tokio::time::Instant::now() < until {
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
    Ok(())
}

fn env_u32(var: &'static str) -> Result<u32, ApiError> {
    let text = std::env::var(var).map_err(|_| ApiError::NotLaunched { var })?;
    text.parse().map_err(|_| ApiError::BadEnv { var, value: text })
}
