//! The front-end: launch a network, make streams, send down, receive reductions.

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore;
use tokio::sync::{mpsc, watch};
use treecast_filters::check_format;
use treecast_launch::{Remote, SrunOptions, SshOptions};
use treecast_node::{
    control_frame, send_credit, sleep_until_opt, start_children, unix_links_from_env, AttachSink, ChildLink,
    ChildSet, Downstream, LaunchPlan, NodeError, StreamSpec, UpOutput, Upstream,
};
use treecast_topology::Topology;
use treecast_transport::{Inbound, LinkEvent, LinkSender, Secret};
use treecast_wire::{
    encode_values, ControlMsg, Format, Frame, FrameHeader, RankSet, SyncMode, TransformKind, Value,
    CREDIT_BATCH, FLAG_DIRECT,
};

use crate::attach::AttachFile;
use crate::{ApiError, AttachError, AttachInfo, Packet};

/// Rank put in downstream frames sent by the front-end.
pub const FRONT_END_RANK: u32 = u32::MAX;
/// Events buffered for the tool; past this, events are logged and dropped.
const EVENT_QUEUE: usize = 65536;
/// Default time each level of the tree may take to start.
const DEFAULT_STARTUP: Duration = Duration::from_secs(30);

/// Something that happened in the network, apart from data.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// Back-ends can no longer be reached; waves complete without them.
    RanksLost {
        /// The lost ranks.
        ranks: RankSet,
        /// Which node noticed, and why.
        reason: String,
    },
    /// A filter refused a packet; the rest of its wave went on.
    FilterError {
        /// The stream.
        stream: u32,
        /// The rank whose packet was refused (`u32::MAX` when unknown).
        rank: u32,
        /// What did not match.
        message: String,
    },
}

/// Every rank lost so far, with the reason given for each (the first reported).
///
/// Kept by the front-end's root task, so it is complete whoever reads the
/// [`Event::RanksLost`] events (ranks missing at launch are in it from the start).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LostRanks {
    all: RankSet,
    by_reason: Vec<(RankSet, String)>,
}

impl LostRanks {
    /// Records `ranks` as lost for `reason`; returns false when every one was known.
    pub(crate) fn add(&mut self, ranks: &RankSet, reason: &str) -> bool {
        let new = ranks.difference(&self.all);
        if new.is_empty() {
            return false;
        }
        self.all.union_with(&new);
        self.by_reason.push((new, reason.to_owned()));
        true
    }

    /// Every lost rank.
    pub fn ranks(&self) -> &RankSet {
        &self.all
    }

    /// The lost ranks, grouped by the reason they were lost for, in the order reported.
    pub fn by_reason(&self) -> &[(RankSet, String)] {
        &self.by_reason
    }

    /// The lost ranks among `ranks`, grouped by reason.
    pub fn among(&self, ranks: &RankSet) -> Vec<(RankSet, String)> {
        let mut out = Vec::new();
        for (lost, reason) in &self.by_reason {
            let mine = lost.intersection(ranks);
            if !mine.is_empty() {
                out.push((mine, reason.clone()));
            }
        }
        out
    }
}

/// A set of back-end ranks that streams are created over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Communicator {
    ranks: RankSet,
}

impl Communicator {
    /// The ranks of the communicator.
    pub fn ranks(&self) -> &RankSet {
        &self.ranks
    }
}

/// How a stream's packets are filtered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamOptions {
    /// How packets coming up are grouped into waves.
    pub sync: SyncMode,
    /// How a wave is reduced on the way up.
    pub up: TransformKind,
    /// The filter applied at each comm node on the way down.
    pub down: TransformKind,
}

impl StreamOptions {
    /// Wait for all, reduce with `up`, nothing on the way down.
    pub fn reduce(up: TransformKind) -> Self {
        StreamOptions { sync: SyncMode::WaitForAll, up, down: TransformKind::Null }
    }
}

impl Default for StreamOptions {
    /// Wait for all and pass packets through.
    fn default() -> Self {
        StreamOptions::reduce(TransformKind::Null)
    }
}

/// Configures and launches a [`Network`].
#[derive(Debug, Clone)]
pub struct NetworkBuilder {
    topology: Topology,
    backend: Vec<String>,
    env: Vec<(String, String)>,
    startup_timeout: Duration,
    treecast_path: Option<PathBuf>,
    listen: IpAddr,
    unix_links: bool,
    remote: Option<Remote>,
    remote_listen: Option<IpAddr>,
    allow_missing: bool,
    attach: Option<(PathBuf, Duration)>,
}

impl NetworkBuilder {
    /// A network of the given shape whose back-ends run `treecast backend`.
    pub fn new(topology: Topology) -> Self {
        let startup_timeout = std::env::var("TREECAST_STARTUP_TIMEOUT")
            .ok()
            .and_then(|s| s.parse::<f64>().ok())
            .filter(|s| *s > 0.0)
            .map(Duration::from_secs_f64)
            .unwrap_or(DEFAULT_STARTUP);
        NetworkBuilder {
            topology,
            backend: Vec::new(),
            env: Vec::new(),
            startup_timeout,
            treecast_path: None,
            listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
            unix_links: unix_links_from_env(),
            remote: None,
            remote_listen: std::env::var("TREECAST_LISTEN").ok().and_then(|s| s.parse().ok()),
            allow_missing: false,
            attach: None,
        }
    }

    /// Attach mode: start the comm nodes only, write `file` (mode 0600) with where
    /// each rank connects and the session secret, and wait up to `limit` for
    /// back-ends started by someone else (`BackEnd::attach`, `treecast backend --attach`).
    ///
    /// Put `file` in a directory only this user can write (`$XDG_RUNTIME_DIR`, one made
    /// by `mktemp -d`): a file another user planted there first is never used, but the
    /// launch then fails. The file is removed when the network ends.
    pub fn attach(mut self, file: impl Into<PathBuf>, limit: Duration) -> Self {
        self.attach = Some((file.into(), limit));
        self
    }

    /// Starts processes on other hosts of the topology with ssh.
    pub fn ssh(mut self, options: SshOptions) -> Self {
        self.remote = Some(Remote::Ssh(options));
        self
    }

    /// Starts every comm node and back-end as a Slurm job step (`srun`); the
    /// front-end must run inside the allocation.
    pub fn slurm(mut self, options: SrunOptions) -> Self {
        self.remote = Some(Remote::Slurm(options));
        self
    }

    /// The address processes on other hosts connect back to (default: found from the route to them,
    /// or `TREECAST_LISTEN`).
    pub fn remote_listen(mut self, addr: IpAddr) -> Self {
        self.remote_listen = Some(addr);
        self
    }

    /// Starts without the nodes that fail to start; their ranks are reported as
    /// [`Event::RanksLost`] right away instead of failing the launch.
    pub fn allow_missing(mut self, yes: bool) -> Self {
        self.allow_missing = yes;
        self
    }

    /// Runs this program (with arguments) as the back-end instead of `treecast backend`.
    pub fn backend_command(mut self, command: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.backend = command.into_iter().map(Into::into).collect();
        self
    }

    /// Adds an environment variable for the back-ends.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// How long each level of the tree may take to start (default 30 s, or `TREECAST_STARTUP_TIMEOUT` seconds).
    pub fn startup_timeout(mut self, limit: Duration) -> Self {
        self.startup_timeout = limit;
        self
    }

    /// The `treecast` binary comm nodes run (default: `TREECAST_PATH`, this program, or `treecast` on `PATH`).
    pub fn treecast_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.treecast_path = Some(path.into());
        self
    }

    /// Address the front-end and comm nodes listen on (default 127.0.0.1).
    pub fn listen(mut self, addr: IpAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Links processes of this host through Unix sockets (`true`, the default unless
    /// `TREECAST_ROUTE=tcp`) or through TCP on the listen address.
    pub fn unix_links(mut self, yes: bool) -> Self {
        self.unix_links = yes;
        self
    }

    /// Starts every comm node and back-end and waits until all have reported.
    ///
    /// # Errors
    /// An empty topology, a missing `treecast` binary, or a node that failed
    /// to start (named, with its host and stderr). Nothing is left running.
    ///
    /// Cancel safety: not cancel safe; processes already started are killed when dropped.
    pub async fn launch(self) -> Result<Network, ApiError> {
        let backends = self.topology.backends();
        if backends == 0 {
            return Err(ApiError::Env(
                "the topology has no back-ends: give a tree with at least one leaf".into(),
            ));
        }
        let exe = resolve_treecast(self.treecast_path.as_deref())?;
        let mut session = [0u8; 8];
        rand::rngs::OsRng.fill_bytes(&mut session);
        let plan = LaunchPlan {
            topology: self.topology.clone(),
            first_id: 0,
            first_rank: 0,
            total_backends: backends as u32,
            backend: self.backend,
            env: self.env,
            startup_timeout: self.startup_timeout,
            treecast_exe: exe,
            secret: Secret::generate(),
            session: hex::encode(session),
            listen: self.listen,
            unix_links: self.unix_links,
            remote: self.remote,
            remote_listen: self.remote_listen,
            allow_missing: self.allow_missing,
            attach: self.attach.as_ref().map(|(_, limit)| *limit),
        };
        let started = Instant::now();
        // The outcome of writing the attach file, once the places to attach are known.
        let written: Mutex<Option<Result<AttachFile, AttachError>>> = Mutex::new(None);
        let write_file = |points: Vec<(u32, u32, String)>| {
            let Some((path, _)) = &self.attach else { return Ok(()) };
            let info = AttachInfo {
                session: plan.session.clone(),
                secret: plan.secret.clone(),
                size: plan.total_backends,
                points,
            };
            let outcome = info.write(path).and_then(|()| AttachFile::written(path));
            let failed = outcome.is_err();
            if let Ok(mut slot) = written.lock() {
                *slot = Some(outcome);
            }
            if failed {
                // Stops the start-up; the typed error above is what `launch` returns.
                return Err(NodeError::Startup(format!("cannot write the attach file {}", path.display())));
            }
            Ok(())
        };
        let sink: Option<AttachSink<'_>> = if self.attach.is_some() { Some(&write_file) } else { None };
        let children = start_children(&plan, sink).await;
        // Dropped on an error below: the file is removed.
        let attach_file = match written.lock().ok().and_then(|mut slot| slot.take()) {
            Some(Err(e)) => return Err(e.into()),
            Some(Ok(file)) => Some(file),
            None => None,
        };
        let children = children?;
        Ok(Network::from_children(self.topology, plan.session, children, started.elapsed(), attach_file))
    }
}

fn resolve_treecast(explicit: Option<&Path>) -> Result<PathBuf, ApiError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    if let Ok(p) = std::env::var("TREECAST_PATH") {
        return Ok(PathBuf::from(p));
    }
    let me = std::env::current_exe().map_err(|e| ApiError::NoBinary(e.to_string()))?;
    if me.file_name().is_some_and(|n| n == "treecast") {
        return Ok(me);
    }
    // An example or test binary of this workspace: target/<profile>/{examples,deps}/x.
    for dir in me.ancestors().skip(1).take(2) {
        let candidate = dir.join("treecast");
        if candidate.is_file() {
            return Ok(candidate);
        }
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            let candidate = dir.join("treecast");
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    Err(ApiError::NoBinary("not next to this program and not on PATH".into()))
}

enum RootCtl {
    Add(StreamSpec, mpsc::UnboundedSender<Packet>),
    Remove(u32),
    /// The tool read this many packets of a stream (flow control, see [`treecast_node::ROOT_WINDOW`]).
    Credit(u32, u32),
}

struct Shared {
    senders: Vec<LinkSender>,
    down: Mutex<Downstream>,
    ctl: mpsc::Sender<RootCtl>,
    next_stream: AtomicU32,
    backends: u32,
    /// Written by the root task only (on every `RanksLost`), so no lock is held across an await.
    lost: watch::Receiver<LostRanks>,
}

impl Shared {
    async fn send_frame(&self, frame: Frame) -> Result<(), ApiError> {
        let routes = match self.down.lock() {
            Ok(mut d) => d.route(frame),
            Err(_) => return Err(ApiError::Closed("routing table poisoned".into())),
        };
        let routes = routes.map_err(ApiError::Closed)?;
        for (child, f) in routes {
            // A closed child link is reported as a RanksLost event; its ranks leave the waves.
            let _ = self.senders[child].send(f).await;
        }
        Ok(())
    }

    async fn send_control(&self, targets: &[usize], msg: &ControlMsg) {
        let frame = control_frame(msg);
        for &c in targets {
            let _ = self.senders[c].send(frame.clone()).await;
        }
    }
}

/// A running tree, seen from the front-end that launched it.
///
/// Dropping it kills every process of the tree; [`Network::shutdown`] stops
/// them in order.
pub struct Network {
    shared: Arc<Shared>,
    topology: Topology,
    session: String,
    startup: Duration,
    commnodes: u32,
    children: Vec<ChildLink>,
    events: mpsc::Receiver<Event>,
    /// Attach mode: the attach file, removed when the network is shut down or dropped.
    _attach_file: Option<AttachFile>,
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network")
            .field("session", &self.session)
            .field("backends", &self.shared.backends)
            .finish()
    }
}

impl Network {
    fn from_children(
        topology: Topology,
        session: String,
        set: ChildSet,
        startup: Duration,
        attach_file: Option<AttachFile>,
    ) -> Network {
        let commnodes = set.commnodes();
        let ChildSet { children, inbound, missing } = set;
        let ranks: Vec<(String, RankSet)> =
            children.iter().map(|c| (c.name.clone(), c.ranks.clone())).collect();
        let (ctl_tx, ctl_rx) = mpsc::channel(64);
        let (ev_tx, events) = mpsc::channel(EVENT_QUEUE);
        let mut lost_at_start = LostRanks::default();
        for (ranks, reason) in missing {
            lost_at_start.add(&ranks, &reason);
            let _ = ev_tx.try_send(Event::RanksLost { ranks, reason });
        }
        let (lost_tx, lost) = watch::channel(lost_at_start);
        let up = Upstream::new("front-end".into(), true, ranks.clone());
        let senders: Vec<LinkSender> = children.iter().map(|c| c.sender.clone()).collect();
        let root_events = RootEvents { events: ev_tx, lost: lost_tx };
        tokio::spawn(root_loop(up, inbound, ctl_rx, root_events, senders.clone()));
        let shared = Arc::new(Shared {
            senders,
            down: Mutex::new(Downstream::new(ranks.into_iter().map(|(_, r)| r).collect())),
            ctl: ctl_tx,
            next_stream: AtomicU32::new(1),
            backends: topology.backends() as u32,
            lost,
        });
        Network { shared, topology, session, startup, commnodes, children, events, _attach_file: attach_file }
    }

    /// Number of back-ends (ranks `0..backends()`).
    pub fn backends(&self) -> u32 {
        self.shared.backends
    }

    /// Number of comm nodes (the front-end not included).
    pub fn commnodes(&self) -> u32 {
        self.commnodes
    }

    /// The tree this network was launched from.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Session id, also in every process's `TREECAST_SESSION`.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Time from launch until every back-end had reported.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// The communicator of every back-end.
    pub fn broadcast_communicator(&self) -> Communicator {
        Communicator { ranks: RankSet::range(0, self.shared.backends) }
    }

    /// A communicator over some back-ends.
    ///
    /// # Errors
    /// [`ApiError::NoSuchRanks`] for ranks outside `0..backends()` or an empty set.
    pub fn communicator(&self, ranks: RankSet) -> Result<Communicator, ApiError> {
        let outside = ranks.difference(&RankSet::range(0, self.shared.backends));
        if !outside.is_empty() || ranks.is_empty() {
            return Err(ApiError::NoSuchRanks {
                ranks: outside,
                last: self.shared.backends.saturating_sub(1),
            });
        }
        Ok(Communicator { ranks })
    }

    /// Creates a stream over `comm` with the given filters.
    ///
    /// # Errors
    /// [`ApiError::Closed`] when the network is gone.
    ///
    /// Cancel safety: not cancel safe; a cancelled call may leave the stream half made.
    pub async fn new_stream(&self, comm: &Communicator, options: StreamOptions) -> Result<Stream, ApiError> {
        let id = self.shared.next_stream.fetch_add(1, Ordering::Relaxed);
        let spec = StreamSpec {
            id,
            ranks: comm.ranks.clone(),
            sync: options.sync,
            up: options.up,
            down: options.down,
        };
        // Unbounded, but the root hands over at most ROOT_WINDOW packets the tool has not read.
        let (tx, rx) = mpsc::unbounded_channel();
        self.shared
            .ctl
            .send(RootCtl::Add(spec.clone(), tx))
            .await
            .map_err(|_| ApiError::Closed("front-end task ended".into()))?;
        let targets = match self.shared.down.lock() {
            Ok(mut d) => d.add_stream(&spec, false),
            Err(_) => return Err(ApiError::Closed("routing table poisoned".into())),
        };
        let msg =
            ControlMsg::NewStream { id, ranks: spec.ranks, sync: spec.sync, up: spec.up, down: spec.down };
        self.shared.send_control(&targets, &msg).await;
        Ok(Stream { id, shared: self.shared.clone(), rx, comm: comm.clone(), options, unreturned: 0 })
    }

    /// Every rank lost so far (including ranks missing at launch), whoever read the events.
    pub fn lost_ranks(&self) -> RankSet {
        self.shared.lost.borrow().ranks().clone()
    }

    /// Every rank lost so far, with the reasons; see [`Network::lost_ranks`].
    pub fn lost(&self) -> LostRanks {
        self.shared.lost.borrow().clone()
    }

    /// A receiver that sees each change of the lost ranks (for waits that must end
    /// when a rank is lost without reading the events).
    pub(crate) fn lost_watch(&self) -> watch::Receiver<LostRanks> {
        self.shared.lost.clone()
    }

    /// Waits for the next event.
    ///
    /// Cancel safety: cancel safe.
    pub async fn next_event(&mut self) -> Option<Event> {
        self.events.recv().await
    }

    /// Returns the next event if one is queued.
    pub fn try_event(&mut self) -> Option<Event> {
        self.events.try_recv().ok()
    }

    /// Tells every node to exit, waits up to `grace` for the processes, then kills what is left.
    ///
    /// Cancel safety: not cancel safe; processes left are killed when dropped.
    pub async fn shutdown_with(self, grace: Duration) {
        // A child that stopped reading must not hold the shutdown up: it is killed after `grace`.
        let frame = control_frame(&ControlMsg::Shutdown);
        let deadline = tokio::time::Instant::now() + grace;
        for sender in &self.shared.senders {
            let _ = tokio::time::timeout_at(deadline, sender.send(frame.clone())).await;
        }
        let set = ChildSet { children: self.children, inbound: mpsc::channel(1).1, missing: Vec::new() };
        drop(self.shared);
        set.shut_down(grace).await;
    }

    /// [`Network::shutdown_with`] a grace of 5 s.
    ///
    /// Cancel safety: not cancel safe.
    pub async fn shutdown(self) {
        self.shutdown_with(Duration::from_secs(5)).await;
    }
}

/// A stream: a communicator bound to filters, with its own receive queue.
#[derive(Debug)]
pub struct Stream {
    id: u32,
    shared: Arc<Shared>,
    rx: mpsc::UnboundedReceiver<Packet>,
    comm: Communicator,
    options: StreamOptions,
    /// Packets read whose credit has not yet gone back to the root.
    unreturned: u32,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Shared")
    }
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
    /// The stream id.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The back-ends of the stream.
    pub fn communicator(&self) -> &Communicator {
        &self.comm
    }

    /// The filters of the stream.
    pub fn options(&self) -> StreamOptions {
        self.options
    }

    /// Multicasts values to every back-end of the stream.
    ///
    /// # Errors
    /// A malformed format or values that do not match it (naming the first).
    ///
    /// Cancel safety: not cancel safe; some children may have been sent the packet.
    pub async fn send(&self, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        let (_, payload) = encode_checked(format, values)?;
        let frame = Frame::new(FrameHeader::data(self.id, tag, FRONT_END_RANK), payload);
        self.shared.send_frame(frame).await
    }

    /// Multicasts a payload that is already encoded (by the wire crate's encoders, as
    /// [`Stream::send`] would), so a large payload is not copied once more.
    ///
    /// # Errors
    /// [`ApiError::Closed`] when the network is gone.
    ///
    /// Cancel safety: not cancel safe; some children may have been sent the packet.
    pub(crate) async fn send_encoded(&self, tag: i32, payload: Vec<u8>) -> Result<(), ApiError> {
        let frame = Frame::new(FrameHeader::data(self.id, tag, FRONT_END_RANK), payload);
        self.shared.send_frame(frame).await
    }

    /// Sends values to one back-end of the stream (point to point).
    ///
    /// # Errors
    /// A rank outside the stream, or a format error.
    ///
    /// Cancel safety: cancel safe.
    pub async fn send_to(&self, rank: u32, tag: i32, format: &str, values: &[Value]) -> Result<(), ApiError> {
        if !self.comm.ranks.contains(rank) {
            return Err(ApiError::NoSuchRanks {
                ranks: RankSet::single(rank),
                last: self.shared.backends.saturating_sub(1),
            });
        }
        let (_, payload) = encode_checked(format, values)?;
        let mut header = FrameHeader::data(self.id, tag, rank);
        header.flags |= FLAG_DIRECT;
        self.shared.send_frame(Frame::new(header, payload)).await
    }

    /// Waits for the next packet (a reduction result, or a back-end's packet with the null filter).
    ///
    /// # Errors
    /// [`ApiError::StreamClosed`] once every member is lost and nothing is left.
    ///
    /// Cancel safety: cancel safe.
    pub async fn recv(&mut self) -> Result<Packet, ApiError> {
        if let Some(packet) = self.try_recv() {
            return Ok(packet);
        }
        if self.unreturned >= CREDIT_BATCH {
            // An earlier try_send found the control queue full; the root may be
            // holding packets until it hears from us, so wait for room this time.
            if self.shared.ctl.send(RootCtl::Credit(self.id, self.unreturned)).await.is_ok() {
                self.unreturned = 0;
            }
        }
        let packet = self.rx.recv().await.ok_or(ApiError::StreamClosed(self.id))?;
        self.count_read();
        Ok(packet)
    }

    /// Counts a packet read and gives the root its credits back in batches.
    fn count_read(&mut self) {
        self.unreturned += 1;
        if self.unreturned >= CREDIT_BATCH
            && self.shared.ctl.try_send(RootCtl::Credit(self.id, self.unreturned)).is_ok()
        {
            self.unreturned = 0;
        }
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
        let packet = self.rx.try_recv().ok()?;
        self.count_read();
        Some(packet)
    }

    /// Closes the stream in the whole tree.
    ///
    /// Cancel safety: cancel safe.
    pub async fn close(self) {
        let targets = match self.shared.down.lock() {
            Ok(mut d) => d.remove_stream(self.id),
            Err(_) => Vec::new(),
        };
        let _ = self.shared.ctl.send(RootCtl::Remove(self.id)).await;
        self.shared.send_control(&targets, &ControlMsg::CloseStream { id: self.id }).await;
    }
}

/// Checks that a stream's upstream filter can reduce packets of `format` (used by back-ends).
pub(crate) fn check_filter(stream: u32, up: TransformKind, format: &Format) -> Result<(), ApiError> {
    check_format(up, format).map_err(|source| ApiError::Filter { stream, source })
}

/// Where the root task reports what happened: the tool's event queue, and the lost
/// ranks kept for [`Network::lost_ranks`].
struct RootEvents {
    events: mpsc::Sender<Event>,
    lost: watch::Sender<LostRanks>,
}

async fn root_loop(
    mut up: Upstream,
    mut inbound: mpsc::Receiver<Inbound>,
    mut ctl: mpsc::Receiver<RootCtl>,
    events: RootEvents,
    children: Vec<LinkSender>,
) {
    let mut streams: HashMap<u32, mpsc::UnboundedSender<Packet>> = HashMap::new();
    loop {
        let deadline = up.next_deadline();
        let out = tokio::select! {
            biased;
            c = ctl.recv() => match c {
                Some(RootCtl::Add(spec, tx)) => { up.add_stream(&spec); streams.insert(spec.id, tx); continue; }
                Some(RootCtl::Remove(id)) => { up.remove_stream(id); streams.remove(&id); continue; }
                Some(RootCtl::Credit(id, packets)) => up.on_credit(id, packets),
                None => return,
            },
            ev = inbound.recv() => match ev {
                Some(Inbound { link, event: LinkEvent::Frames(frames) }) => {
                    let now = Instant::now();
                    frames.into_iter().flat_map(|f| up.on_frame(link, f, now)).collect::<Vec<_>>()
                }
                Some(Inbound { link, event: LinkEvent::Closed(reason) }) => up.on_child_closed(link, reason.as_deref(), Instant::now()),
                None => return,
            },
            _ = sleep_until_opt(deadline) => up.poll(Instant::now()),
        };
        for o in out {
            match o {
                UpOutput::Data(frame) => {
                    let id = frame.header.stream;
                    if let Some(tx) = streams.get(&id) {
                        if tx.send(Packet::from_frame(frame)).is_err() {
                            streams.remove(&id);
                        }
                    }
                }
                UpOutput::Control(msg) => {
                    let event = match msg {
                        ControlMsg::RanksLost { ranks, reason } => {
                            events.lost.send_if_modified(|lost| lost.add(&ranks, &reason));
                            Event::RanksLost { ranks, reason }
                        }
                        ControlMsg::FilterError { stream, rank, message } => {
                            Event::FilterError { stream, rank, message }
                        }
                        _ => continue,
                    };
                    if events.events.try_send(event).is_err() {
                        tracing::warn!("event queue full: an event was dropped; read Network::next_event");
                    }
                }
                UpOutput::StreamDone(id) => {
                    streams.remove(&id);
                }
                UpOutput::Credit { child, stream, packets } => {
                    if let Some(link) = children.get(child) {
                        send_credit(link, stream, packets);
                    }
                }
            }
        }
    }
}
