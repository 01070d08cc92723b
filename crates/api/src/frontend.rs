//! The front-end's side of its driver: what the tool waits for (the launch, packets
//! on a stream, room to send, events), kept where the driver puts it.

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::task::{Context, Poll, Waker};

use tokio::sync::watch;
use treecast_driver::{lock, Shared, Tool};
use treecast_proto::{Event as CoreEvent, LostRanks};
use treecast_transport::Secret;
use treecast_wire::RankSet;

use crate::attach::AttachFile;
use crate::request::register;
use crate::{ApiError, AttachInfo, Event};

/// Events buffered for the tool; past this, events are logged and dropped.
const EVENT_QUEUE: usize = 65536;

/// Called from the driver's task whenever something arrives for the tool (a packet,
/// an event, the end), so that a tool's own event loop can wake; see
/// [`crate::Network::on_ready`].
#[derive(Clone)]
pub(crate) struct ReadyHook(pub(crate) std::sync::Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for ReadyHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ReadyHook")
    }
}

impl ReadyHook {
    /// Calls the hook, if there is one.
    pub(crate) fn call(hook: &Option<ReadyHook>) {
        if let Some(h) = hook {
            (h.0)();
        }
    }
}

/// How the launch ended.
#[derive(Debug)]
pub(crate) struct Launched {
    pub(crate) commnodes: u32,
}

/// Attach mode: where the attach file goes and what it holds besides the points.
#[derive(Debug, Clone)]
pub(crate) struct AttachTarget {
    pub(crate) path: PathBuf,
    pub(crate) session: String,
    pub(crate) secret: Secret,
    pub(crate) size: u32,
}

/// The front-end's tool state, inside its driver.
#[derive(Debug)]
pub(crate) struct FeTool {
    launch: Option<Result<Launched, ApiError>>,
    launch_waker: Option<Waker>,
    attach: Option<AttachTarget>,
    /// The attach file written; dropping it removes it (the network takes it out when
    /// it ends, as stream handles may keep this state alive longer).
    pub(crate) attach_written: Option<AttachFile>,
    readers: HashMap<u32, Vec<Waker>>,
    pub(crate) writers: HashMap<u32, Vec<Waker>>,
    events: VecDeque<Event>,
    /// Tasks awaiting an event (several threads of a C tool may wait at once).
    event_wakers: Vec<Waker>,
    lost: watch::Sender<LostRanks>,
    /// Why the network is over, once it is.
    pub(crate) over: Option<treecast_proto::EndReason>,
    /// Streams a node refused, and why.
    pub(crate) refused: HashMap<u32, String>,
    /// Every comm node loss so far: the ranks below it and why (see [`crate::Network::orphaned`]).
    pub(crate) orphaned: Vec<(RankSet, String)>,
    /// How many rejoins so far, and every rank that rejoined (for waits that ask a
    /// rejoined rank again what it may have missed, without reading the events).
    pub(crate) rejoined: watch::Sender<(u64, RankSet)>,
    /// Every rank that joined while the tree runs (spawned), for spawns to wait on.
    pub(crate) joined: watch::Sender<RankSet>,
    /// Every rank that left the tree in order ([`Event::RanksLeft`]): gone, not lost.
    pub(crate) left: RankSet,
    /// Where back-ends accepted while the tree runs connect, as the comm nodes report it.
    pub(crate) port_points: watch::Sender<Vec<treecast_wire::AttachPoint>>,
    /// The session, for port files.
    pub(crate) session: String,
    /// The session secret, for port files.
    pub(crate) secret: Secret,
    /// Back-ends' spawn requests waiting for the task that serves them.
    spawn_requests: VecDeque<SpawnRequest>,
    spawn_waker: Option<Waker>,
    /// The numbers given to the networks linked to this one.
    pub(crate) remotes: crate::remote_numbers::RemoteNumbers,
    /// Told of every packet, event and end, for a tool's own event loop.
    pub(crate) ready: Option<ReadyHook>,
    /// Per stream: told when a packet for that stream is queued, and at the end.
    pub(crate) stream_ready: HashMap<u32, ReadyHook>,
}

/// A back-end's request for a spawn ([`crate::BackEnd::spawn`]).
#[derive(Debug)]
pub(crate) struct SpawnRequest {
    pub(crate) id: u32,
    pub(crate) rank: u32,
    pub(crate) n: u32,
    pub(crate) command: Vec<String>,
}

/// Spawn requests held for the serving task; past this, a request is refused.
const SPAWN_QUEUE: usize = 1024;

impl FeTool {
    pub(crate) fn new(
        attach: Option<AttachTarget>,
        session: String,
        secret: Secret,
    ) -> (FeTool, watch::Receiver<LostRanks>) {
        let (lost, lost_rx) = watch::channel(LostRanks::default());
        let tool = FeTool {
            launch: None,
            launch_waker: None,
            attach,
            attach_written: None,
            readers: HashMap::new(),
            writers: HashMap::new(),
            events: VecDeque::new(),
            event_wakers: Vec::new(),
            lost,
            orphaned: Vec::new(),
            rejoined: watch::Sender::new((0, RankSet::new())),
            joined: watch::Sender::new(RankSet::new()),
            left: RankSet::new(),
            port_points: watch::Sender::new(Vec::new()),
            session,
            secret,
            spawn_requests: VecDeque::new(),
            spawn_waker: None,
            remotes: crate::remote_numbers::RemoteNumbers::default(),
            ready: None,
            stream_ready: HashMap::new(),
            over: None,
            refused: HashMap::new(),
        };
        (tool, lost_rx)
    }

    fn push(&mut self, e: Event) {
        if self.events.len() >= EVENT_QUEUE {
            tracing::warn!("event queue full: an event was dropped; read Network::next_event");
            return;
        }
        self.events.push_back(e);
        self.event_wakers.drain(..).for_each(Waker::wake);
        ReadyHook::call(&self.ready);
    }

    fn finish_launch(&mut self, outcome: Result<Launched, ApiError>) {
        if self.launch.is_none() {
            self.launch = Some(outcome);
        }
        if let Some(w) = self.launch_waker.take() {
            w.wake();
        }
    }

    fn wake_all(&mut self) {
        if let Some(w) = self.spawn_waker.take() {
            w.wake();
        }
        for (_, ws) in self.readers.drain().chain(self.writers.drain()) {
            ws.into_iter().for_each(Waker::wake);
        }
        self.event_wakers.drain(..).for_each(Waker::wake);
        if let Some(w) = self.launch_waker.take() {
            w.wake();
        }
    }

    /// Wakes every task waiting to receive on or send to `stream` (it was closed here,
    /// and the core tells no one of a close it was asked for).
    pub(crate) fn wake_stream(&mut self, stream: u32) {
        for ws in [self.readers.remove(&stream), self.writers.remove(&stream)].into_iter().flatten() {
            ws.into_iter().for_each(Waker::wake);
        }
    }

    /// Waits for a packet (or the end) on `stream`.
    pub(crate) fn wait_readable(&mut self, stream: u32, cx: &Context<'_>) {
        register(self.readers.entry(stream).or_default(), cx);
    }

    /// The next event, or registers to be woken for one.
    pub(crate) fn poll_event(&mut self, cx: Option<&Context<'_>>) -> Poll<Option<Event>> {
        if let Some(e) = self.events.pop_front() {
            return Poll::Ready(Some(e));
        }
        if self.over.is_some() {
            return Poll::Ready(None);
        }
        if let Some(cx) = cx {
            register(&mut self.event_wakers, cx);
        }
        Poll::Pending
    }

    /// The next back-end spawn request, or registers to be woken for one; `None` once
    /// the network is over.
    pub(crate) fn poll_spawn_request(&mut self, cx: &Context<'_>) -> Poll<Option<SpawnRequest>> {
        if let Some(r) = self.spawn_requests.pop_front() {
            return Poll::Ready(Some(r));
        }
        if self.over.is_some() {
            return Poll::Ready(None);
        }
        self.spawn_waker = Some(cx.waker().clone());
        Poll::Pending
    }

    /// A receiver that sees each change of the lost ranks.
    pub(crate) fn lost_watch(&self) -> watch::Receiver<LostRanks> {
        self.lost.subscribe()
    }

    fn record_lost(&mut self, ranks: &RankSet, reason: &str) {
        self.lost.send_if_modified(|lost| lost.add(ranks, reason));
    }

    fn write_attach_file(&mut self, points: Vec<treecast_wire::AttachPoint>) {
        let Some(target) = self.attach.take() else { return };
        let info = AttachInfo {
            session: target.session,
            secret: target.secret,
            size: target.size,
            points: points.into_iter().map(|p| (p.rank, p.node_id, p.address)).collect(),
            base: 0,
            network: None,
        };
        match info.write(&target.path).and_then(|()| AttachFile::written(&target.path)) {
            Ok(file) => self.attach_written = Some(file),
            // Back-ends that cannot know where to connect would only be waited for in vain.
            Err(e) => self.finish_launch(Err(e.into())),
        }
    }
}

impl Tool for FeTool {
    fn event(&mut self, event: CoreEvent) {
        match event {
            CoreEvent::Ready { commnodes, missing, .. } => {
                for (ranks, reason) in &missing {
                    self.record_lost(ranks, reason);
                    self.push(Event::RanksLost { ranks: ranks.clone(), reason: reason.clone() });
                }
                self.finish_launch(Ok(Launched { commnodes }));
            }
            CoreEvent::StartupFailed { message } => {
                self.finish_launch(Err(ApiError::Startup(treecast_driver::NodeError::Startup { message })));
            }
            // The launch's points go to its attach file; later ones are for accepts.
            CoreEvent::AttachPoints(points) if self.attach.is_none() => {
                self.port_points.send_modify(|all| all.extend(points));
            }
            CoreEvent::AttachPoints(points) => self.write_attach_file(points),
            CoreEvent::Readable { stream: Some(id) } => {
                self.readers.remove(&id).into_iter().flatten().for_each(Waker::wake);
                ReadyHook::call(&self.stream_ready.get(&id).cloned());
                ReadyHook::call(&self.ready);
            }
            CoreEvent::Writable { stream } => {
                self.writers.remove(&stream).into_iter().flatten().for_each(Waker::wake);
            }
            CoreEvent::RanksLost { ranks, reason } => {
                self.record_lost(&ranks, &reason);
                self.push(Event::RanksLost { ranks, reason });
            }
            CoreEvent::RanksLeft { ranks, reason } => {
                self.left.union_with(&ranks);
                self.push(Event::RanksLeft { ranks, reason })
            }
            CoreEvent::RanksJoined { ranks } => {
                self.joined.send_modify(|all| all.union_with(&ranks));
                self.push(Event::RanksJoined { ranks });
            }
            CoreEvent::NodeLost { node, ranks, reason } => {
                self.orphaned.push((ranks.clone(), reason.clone()));
                self.push(Event::NodeLost { node, ranks, reason });
            }
            CoreEvent::RanksRejoined { ranks, parent } => {
                self.rejoined.send_modify(|(count, all)| {
                    *count += 1;
                    all.union_with(&ranks);
                });
                self.push(Event::RanksRejoined { ranks, parent })
            }
            CoreEvent::PeerUndeliverable { from, to } => self.push(Event::MessageUndeliverable { from, to }),
            CoreEvent::RemoteClosed { index, reason } => {
                self.remotes.give_back(index);
                self.push(Event::NetworkClosed { index, reason });
            }
            CoreEvent::SpawnRequested { id, rank, n, command } => {
                if self.spawn_requests.len() >= SPAWN_QUEUE {
                    tracing::warn!(
                        "{SPAWN_QUEUE} spawn requests wait already: the one of rank {rank} is dropped"
                    );
                    return;
                }
                self.spawn_requests.push_back(SpawnRequest { id, rank, n, command });
                if let Some(w) = self.spawn_waker.take() {
                    w.wake();
                }
            }
            CoreEvent::FilterError { stream, rank, message } => {
                self.push(Event::FilterError { stream, rank, message })
            }
            CoreEvent::StreamRefused { stream, node, message } => {
                self.refused.insert(stream, format!("{node}: {message}"));
                self.push(Event::StreamRefused { stream, node, message });
            }
            CoreEvent::Shutdown { reason } => {
                self.over = Some(reason);
                self.wake_all();
                self.stream_ready.values().for_each(|h| (h.0)());
                ReadyHook::call(&self.ready);
            }
            other => tracing::debug!("front-end: {other:?}"),
        }
    }
}

/// Waits for the launch's outcome.
///
/// Cancel safety: cancel safe.
pub(crate) async fn launched(shared: &Shared<FeTool>) -> Result<Launched, ApiError> {
    std::future::poll_fn(|cx| {
        let mut d = lock(shared);
        let tool = d.tool();
        match tool.launch.take() {
            Some(outcome) => Poll::Ready(outcome),
            None => {
                tool.launch_waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    })
    .await
}
