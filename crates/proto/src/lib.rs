//! The protocol core of every node: one state machine without I/O and without a
//! clock of its own, driven the same way in the front-end, the comm nodes and the
//! back-ends (and, wired together with virtual time, in the simulated tree).
//!
//! Inputs come in through `handle_*`: [`Node::handle_link_up`],
//! [`Node::handle_frame`], [`Node::handle_link_closed`], [`Node::handle_command`]
//! (the tool's calls and the driver's reports) and [`Node::handle_timeout`]; each
//! takes the current time. Outputs go out through `poll_*`: [`Node::poll_transmit`]
//! (a frame and the link, or set of links, it goes to), [`Node::poll_timeout`] (when
//! to call `handle_timeout` next), [`Node::poll_event`] (what the driver or the
//! tool must know) and [`Node::poll_delivery`] (packets for the tool, with the flow
//! control that their reading gives back).
//!
//! Everything a node decides lives here, once: membership and start-up
//! (`startup.rs`), streams, waves, filters and flow control in both directions
//! (`streams.rs`), failure reports and shutdown, cutting off peers that hang
//! (`liveness.rs`), and orphans rejoining the tree when a comm node is lost
//! (`recovery.rs`).

mod clock;
mod collective;
mod liveness;
mod monitoring;
mod peer;
mod recovery;
mod remote;
mod startup;
mod streams;
mod window;

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use treecast_filters::{FilterRegistry, RegistryError};
use treecast_wire::{
    AttachPoint, ControlMsg, Frame, FrameHeader, FrameKind, LaunchPlan, RankSet, StreamSpec, Window,
};

pub use clock::{clock_distortion, ClockConfig, ClockSource, Distortion, CLOCK_DISTORT};
pub use collective::{COLLECTIVE_EXPIRY, MAX_ENTERED, MAX_OPEN_COLLECTIVES, MAX_RESULT};
pub use liveness::{heartbeat_frame, LivenessLimits, DEFAULT_DEAD_AFTER, DEFAULT_HEARTBEAT};
pub use peer::{PEER_CREDIT, PEER_WINDOW};
pub use recovery::DEFAULT_REJOIN_WITHIN;
pub use remote::{remote_base, RemoteError, RemoteSpec, MAX_REMOTES, REMOTE_BASE, REMOTE_SPAN};
pub use startup::{ChildLaunch, MAX_SPAWN};
pub use treecast_wire::{LinkId, LinkMap, LinkTable};

/// The layers below the core, as the core sees them: a simulated tree or a driver
/// needs nothing else to feed it.
pub use {
    treecast_filters as filters, treecast_monitor as monitor, treecast_topology as topology,
    treecast_wire as wire,
};

use liveness::Liveness;
use startup::{Child, ChildState, Startup};
use streams::StreamState;

/// How long a node holds the report of a child whose link closed while the tree
/// runs, waiting for the driver's [`Command::ChildExited`], so that the report says
/// how the process ended (exit status or signal, the end of its stderr). A process
/// that ends closes its link first; its exit news follows within milliseconds. The
/// child's ranks leave the streams at once; only the report waits.
pub const EXIT_WAIT: Duration = Duration::from_millis(500);

/// What a node is in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// The root: the tool's front-end. Packets coming up end here, in the tool's hands.
    FrontEnd,
    /// An interior node: routes down, reduces up.
    CommNode,
    /// A leaf: the tool's back-end, one rank.
    BackEnd {
        /// Its rank.
        rank: u32,
        /// Number of back-ends in the network.
        size: u32,
    },
}

/// What a node is told when it is made.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// Its role.
    pub role: Role,
    /// Its node id in the whole tree (pre-order; 0 is the front-end).
    pub node_id: u32,
    /// Name in messages, e.g. `comm node n3 (node 5)`; a comm node's is refined when its plan arrives.
    pub name: String,
    /// The filters this node can make.
    pub registry: FilterRegistry,
    /// Front-end only: packets and bytes of reduced packets kept per stream for the
    /// tool before the tree is held back.
    pub tool_window: Window,
}

/// Who is at the other end of a new link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Peer {
    /// This node's parent.
    Parent,
    /// A child, which proved it is the node with this id.
    Child {
        /// Its node id.
        node_id: u32,
    },
    /// Front-end: the front-end of another network, which proved it holds the
    /// secret of this network's port for networks.
    Remote(RemoteSpec),
}

/// Where a frame goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Destination {
    /// One link.
    Link(LinkId),
    /// Several links at once (a multicast route may reach them all with one send).
    Links(Arc<[LinkId]>),
}

impl Destination {
    /// The links, one by one.
    pub fn links(&self) -> &[LinkId] {
        match self {
            Destination::Link(l) => std::slice::from_ref(l),
            Destination::Links(ls) => ls,
        }
    }
}

/// A frame to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Transmit {
    /// Where to.
    pub to: Destination,
    /// What; payloads are shared, not copied, between the links of a multicast.
    pub frame: Frame,
}

/// What a driver must do, or tell its tool.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// Start these children: launch their processes (or, in attach mode, open the
    /// listeners they connect to), accept their links, and report each with
    /// [`Node::handle_link_up`], and each exit with [`Command::ChildExited`].
    StartChildren {
        /// The plan of this node (launcher, routes, time limits).
        plan: Arc<LaunchPlan>,
        /// The host this node runs on, as the topology names it.
        own_host: String,
        /// The children, in topology order.
        children: Vec<ChildLaunch>,
    },
    /// The sub-tree is up; at the front-end, the launch is complete.
    Ready {
        /// Ranks reachable.
        ranks: RankSet,
        /// Comm nodes below this node.
        commnodes: u32,
        /// Ranks that did not start, and why (only when missing children are allowed).
        missing: Vec<(RankSet, String)>,
    },
    /// Start-up failed (already reported to the parent, if any): stop everything.
    StartupFailed {
        /// What failed, naming the node, its host and what it said.
        message: String,
    },
    /// Front-end, attach mode: where every back-end must connect; write the attach file.
    AttachPoints(Vec<AttachPoint>),
    /// Close this link and forget it (a peer broke the protocol or was given up on).
    CloseLink {
        /// The link.
        link: LinkId,
        /// Why, for the log.
        reason: String,
    },
    /// A child that failed during start-up is given up on: stop its process.
    AbandonChild {
        /// Its node id.
        node_id: u32,
    },
    /// A back-end child is ended on purpose: close its link once the shutdown queued
    /// on it is written, and stop its process if it has not exited within a grace.
    RetireChild {
        /// Its node id.
        node_id: u32,
        /// Its link, which the core has forgotten.
        link: LinkId,
    },
    /// Packets (or a stream's end) wait for the tool: on this stream at the front-end,
    /// on any stream at a back-end (`None`).
    Readable {
        /// The stream, at the front-end.
        stream: Option<u32>,
    },
    /// A send that was refused for lack of credit on this stream may be tried again.
    Writable {
        /// The stream.
        stream: u32,
    },
    /// Front-end: back-ends can no longer be reached; waves complete without them.
    RanksLost {
        /// The ranks.
        ranks: RankSet,
        /// Which node noticed, and why.
        reason: String,
    },
    /// Front-end: a comm node was lost; the ranks below it left the waves and are
    /// awaited back (their nodes rejoin under its parent): [`Event::RanksRejoined`]
    /// follows for those that come back, [`Event::RanksLost`] for the others.
    NodeLost {
        /// The lost node's name.
        node: String,
        /// The ranks below it.
        ranks: RankSet,
        /// Why it was lost, naming the node that noticed.
        reason: String,
    },
    /// Front-end: ranks orphaned by a lost comm node rejoined; streams take them in
    /// again from the next wave.
    RanksRejoined {
        /// The ranks.
        ranks: RankSet,
        /// The node they rejoined under.
        parent: String,
    },
    /// This node lost its parent: connect to `address` (authenticating as this node)
    /// and report the link with [`Node::handle_link_up`] as the parent, or report
    /// failure with [`Command::RejoinFailed`].
    Rejoin {
        /// Where the new parent listens.
        address: String,
    },
    /// The global clock measured a link's peer: its clock against this node's, for
    /// the route to correct the net latency of the peer's frames.
    LinkClock {
        /// The link to the peer.
        link: LinkId,
        /// The peer's clock minus this node's.
        clock: treecast_monitor::clock::PeerClock,
    },
    /// Driver: start recording every frame's latency components under this program tag.
    MonitorStart {
        /// The program tag.
        program: u32,
    },
    /// Driver: stop recording.
    MonitorStop,
    /// Driver: the frames of `stream` are recorded under the stream's own program
    /// tag (`None`: the stream is gone here, the tag no longer applies).
    StreamProgram {
        /// The stream.
        stream: u32,
        /// Its program tag.
        program: Option<u32>,
    },
    /// Driver: hand this node's own report for collection `id` back with
    /// [`Command::MonitorLocal`].
    MonitorCollectLocal {
        /// The collection.
        id: u32,
    },
    /// Front-end: collection `id` is complete (or timed out); take it with
    /// [`Node::take_monitor_collection`].
    MonitorCollected {
        /// The collection.
        id: u32,
    },
    /// This node rejoined the tree under a new parent.
    ParentChanged {
        /// The new parent's address.
        parent: String,
    },
    /// Front-end: back-ends joined while the tree runs.
    RanksJoined {
        /// The ranks.
        ranks: RankSet,
    },
    /// Front-end: back-ends left on purpose.
    RanksLeft {
        /// The ranks.
        ranks: RankSet,
        /// Which node noticed, and why.
        reason: String,
    },
    /// Front-end: the link to another network closed; messages to its ranks are
    /// undeliverable from now on.
    RemoteClosed {
        /// This front-end's number for that network.
        index: u32,
        /// Why.
        reason: String,
    },
    /// Front-end: a message from one back-end to another found no way to its
    /// destination (the rank left, was lost or never was); it was dropped.
    PeerUndeliverable {
        /// The sender.
        from: u32,
        /// The destinations it could not reach.
        to: RankSet,
    },
    /// Front-end: a back-end asks for back-ends to be started; answer with
    /// [`Command::SpawnReply`].
    SpawnRequested {
        /// The request's number at that back-end.
        id: u32,
        /// The requesting back-end.
        rank: u32,
        /// How many.
        n: u32,
        /// What they run, program first.
        command: Vec<String>,
    },
    /// Back-end: the result of a collective operation this back-end entered
    /// (a peer frame with `FLAG_PEER_COLL` whose head says which).
    CollectiveDone {
        /// The operation's series.
        context: u64,
        /// Its number in the series.
        seq: u32,
        /// The result as it arrived.
        frame: Frame,
    },
    /// Back-end: the front-end answered this back-end's spawn request.
    SpawnReplied {
        /// The request's number.
        id: u32,
        /// The group made (0 on failure).
        group: u32,
        /// The new ranks in group order (empty on failure).
        ranks: RankSet,
        /// Why it failed (empty when it did not).
        error: String,
    },
    /// Front-end: a filter refused a packet; the rest of its wave went on.
    FilterError {
        /// The stream.
        stream: u32,
        /// The rank whose packet was refused (`u32::MAX` when unknown).
        rank: u32,
        /// What did not match.
        message: String,
    },
    /// Front-end: a node could not make a stream's filters; the stream is closed.
    StreamRefused {
        /// The stream.
        stream: u32,
        /// The node.
        node: String,
        /// Why.
        message: String,
    },
    /// The node is done: flush what is queued, stop the children, exit (a back-end's
    /// tool sees the network closed).
    Shutdown {
        /// Why.
        reason: EndReason,
    },
}

/// Why a node's life ended.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum EndReason {
    /// The front-end's tool shut the network down.
    ShutDown,
    /// The parent closed its link in order.
    ParentClosed,
    /// The link to the parent failed.
    ParentFailed {
        /// What broke it.
        error: String,
    },
    /// This back-end left on its own.
    Left,
    /// This node's own code failed (a bug): the tool must not wait for it.
    Internal {
        /// What failed.
        error: String,
    },
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            EndReason::ShutDown => f.write_str("the front-end shut the network down"),
            EndReason::ParentClosed => f.write_str("the parent closed the link"),
            EndReason::ParentFailed { error } => write!(f, "the link to the parent failed: {error}"),
            EndReason::Left => f.write_str("this back-end left the network"),
            EndReason::Internal { error } => write!(f, "this node failed: {error}"),
        }
    }
}

/// What the tool reads, in order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delivery {
    /// A packet: a reduction at the front-end, a packet sent down at a back-end.
    Packet(Frame),
    /// The stream is over: closed by the front-end (back-end), or every member is
    /// gone or a node refused it (front-end).
    StreamClosed(u32),
    /// Front-end: the wave answering one request of this stream formed with no
    /// packet: every rank that got the request was cut off with its comm node before
    /// answering (they may rejoin and answer later requests).
    NoAnswer(u32),
}

/// An input from the tool or from the driver.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Command {
    /// Front-end: start the tree this plan describes.
    Launch(Box<LaunchPlan>),
    /// Driver: a child's process ended, or could not be started; `detail` says how
    /// (exit status, the end of its stderr, the launcher's error).
    ChildExited {
        /// The child's node id.
        node_id: u32,
        /// How it ended.
        detail: String,
    },
    /// Driver: a child could not be started at all (no launcher, no listener, the
    /// launcher's own error).
    ChildNotStarted {
        /// The child's node id.
        node_id: u32,
        /// Why.
        reason: String,
    },
    /// Driver, attach mode: where this node's own back-end slots connect.
    OwnAttachPoints(Vec<AttachPoint>),
    /// Take a new child (a back-end) while the tree runs: the driver is asked to start
    /// it, and its ranks join the streams that reach them once it joins.
    Adopt(ChildLaunch),
    /// Front-end: start back-ends while the tree runs, under the order's target node
    /// (this one for target 0); [`Event::RanksJoined`] follows for each that joins,
    /// [`Event::RanksLost`] naming each that failed.
    Spawn(treecast_wire::SpawnOrder),
    /// Back-end: ask the front-end to start `n` back-ends running `command`;
    /// [`Event::SpawnReplied`] with this `id` says how it ended.
    RequestSpawn {
        /// The request's number, this back-end's to choose.
        id: u32,
        /// How many.
        n: u32,
        /// What they run, program first (empty: the launch's back-end command).
        command: Vec<String>,
    },
    /// Front-end: the answer to an [`Event::SpawnRequested`], sent to its rank.
    SpawnReply {
        /// The request's number.
        id: u32,
        /// The requesting back-end.
        rank: u32,
        /// The group made (0 on failure).
        group: u32,
        /// The new ranks in group order (empty on failure).
        ranks: RankSet,
        /// Why it failed (empty when it did not).
        error: String,
    },
    /// Front-end: close the link to remote network `index` (see
    /// [`Peer::Remote`]); [`Event::RemoteClosed`] follows.
    CloseRemote {
        /// This front-end's number for that network.
        index: u32,
    },
    /// Front-end: stop these back-ends' processes; [`Event::RanksLeft`] follows.
    Stop {
        /// The back-ends.
        ranks: RankSet,
        /// Why, for the event.
        reason: String,
    },
    /// Front-end: create a stream (the id is the tool's, increasing).
    NewStream(StreamSpec),
    /// Front-end: close a stream everywhere.
    CloseStream(u32),
    /// Send a data frame: down the stream from the front-end (to one rank with
    /// `FLAG_DIRECT`), up from a back-end; or, from a back-end, a peer frame to
    /// another rank (refused with [`CommandError::Blocked`] while [`PEER_WINDOW`]
    /// is used up; [`Event::Writable`] for [`PEER_CREDIT`] says when to retry).
    Send(Frame),
    /// Back-end: the tool's packet for `stream` was refused before it was sent (its
    /// format does not suit the stream's filter); the front-end gets an
    /// [`Event::FilterError`] naming this rank, as if a comm node had refused it.
    ReportFilterError {
        /// The stream.
        stream: u32,
        /// What did not match, naming this back-end.
        message: String,
    },
    /// Driver: the new parent asked for by [`Event::Rejoin`] could not be reached.
    RejoinFailed {
        /// Why.
        reason: String,
    },
    /// Front-end: take the tree down. Back-end: leave.
    Shutdown,
    /// Front-end: every node starts recording under this program tag.
    MonitorStart {
        /// The program tag.
        program: u32,
    },
    /// Front-end: every node stops recording.
    MonitorStop,
    /// Front-end: collect every node's report; [`Event::MonitorCollected`] says when
    /// it is in.
    MonitorCollect {
        /// Names the collection; not in use by another.
        id: u32,
        /// What to bring back.
        mode: treecast_wire::CollectMode,
        /// How long to wait for answers; later ones are named missing.
        limit: Duration,
    },
    /// Driver: this node's own report for collection `id` (see [`Event::MonitorCollectLocal`]).
    MonitorLocal {
        /// The collection.
        id: u32,
        /// What the route recorded.
        report: treecast_monitor::Report,
    },
}

/// Why a command was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CommandError {
    /// No credit on the frame's stream now: the frame is handed back; try again after
    /// [`Event::Writable`] for its stream.
    #[error("stream {}: no credit to send now; wait until the stream is writable", .0.header.stream)]
    Blocked(Frame),
    /// The stream is not open here.
    #[error("stream {0} is not open")]
    UnknownStream(u32),
    /// A stream's filters cannot be made.
    #[error("stream {stream}: {node}: {source}")]
    Filter {
        /// The stream.
        stream: u32,
        /// The node that could not make them.
        node: String,
        /// What the registry said.
        #[source]
        source: RegistryError,
    },
    /// The stream id was used before.
    #[error("stream {0} already exists; stream ids must be new")]
    StreamExists(u32),
    /// A direct send names a rank outside the stream.
    #[error("rank {rank} is not a member of stream {stream}")]
    NotAMember {
        /// The stream.
        stream: u32,
        /// The rank.
        rank: u32,
    },
    /// This command does not apply to this role or phase.
    #[error("{0}")]
    NotNow(&'static str),
    /// The node has shut down.
    #[error("the node has shut down")]
    ShutDown,
}

/// Where a node is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// No parent link yet (comm node, back-end), or no plan yet (front-end).
    Idle,
    /// Comm node: linked to the parent, waiting for its plan.
    AwaitingPlan,
    /// Starting the children.
    Starting,
    /// Routing.
    Running,
    /// Done: shut down or failed.
    Over,
}

/// What each link of the node leads to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum LinkRole {
    Parent,
    Child(usize),
    /// Another network's front-end (an index into `remotes`).
    Remote(usize),
}

/// Frames, credits and events produced, waiting to be polled.
#[derive(Debug, Default)]
struct Outputs {
    transmits: VecDeque<Transmit>,
    /// Credit frames go first: they never need to wait behind data.
    credits: VecDeque<Transmit>,
    events: VecDeque<Event>,
}

impl Outputs {
    fn send(&mut self, link: LinkId, frame: Frame) {
        self.transmits.push_back(Transmit { to: Destination::Link(link), frame });
    }

    fn control(&mut self, link: LinkId, msg: &ControlMsg) {
        self.send(link, control_frame(msg));
    }

    /// A clock probe or its answer: the route stamps it at its write and reports
    /// the end of its read ([`treecast_wire::FLAG_TIMED`]).
    fn control_timed(&mut self, link: LinkId, msg: &ControlMsg) {
        let mut frame = control_frame(msg);
        frame.header.flags |= treecast_wire::FLAG_TIMED;
        self.send(link, frame);
    }

    fn credit(&mut self, link: LinkId, stream: u32, grant: treecast_wire::Grant) {
        self.credits.push_back(Transmit { to: Destination::Link(link), frame: Frame::credit(stream, grant) });
    }

    fn event(&mut self, e: Event) {
        self.events.push_back(e);
    }
}

/// The sender's clock when the write that took `frame` started, if its route
/// stamped it.
fn write_stamp(frame: &Frame) -> Option<i64> {
    frame.header.stamp().and_then(|ns| i64::try_from(ns).ok())
}

/// Encodes a control message as a frame.
pub fn control_frame(msg: &ControlMsg) -> Frame {
    Frame::new(FrameHeader::control(), msg.encode())
}

/// Every rank lost so far, with the reason given for each (the first reported).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LostRanks {
    all: RankSet,
    by_reason: Vec<(RankSet, String)>,
}

impl LostRanks {
    /// Records `ranks` as lost for `reason`; returns false when every one was known.
    pub fn add(&mut self, ranks: &RankSet, reason: &str) -> bool {
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

/// One node's protocol state. See the module documentation.
pub struct Node {
    role: Role,
    node_id: u32,
    name: String,
    registry: FilterRegistry,
    tool_window: Window,
    phase: Phase,
    links: LinkMap<LinkRole>,
    parent: Option<LinkId>,
    children: Vec<Child>,
    startup: Option<Startup>,
    /// The plan this node started its children from (kept to start more later).
    plan: Option<Arc<LaunchPlan>>,
    /// The host this node runs on, from its plan.
    own_host: String,
    /// Earliest deadline of a child not yet joined.
    child_deadline: Option<Instant>,
    /// Earliest time a held loss report goes up without its process news.
    loss_deadline: Option<Instant>,
    streams: BTreeMap<u32, StreamState>,
    /// Highest stream id seen: an unknown id at or below it is a closed stream.
    max_stream: u32,
    /// Back-end: what the tool reads, in order.
    deliveries: VecDeque<Delivery>,
    /// Front-end: every rank lost so far.
    lost: LostRanks,
    /// Heartbeats sent and heard on every link.
    liveness: Liveness,
    /// The global clock: probes of the children, samples going up.
    clock: clock::ClockSync,
    monitor: monitoring::MonitorRequests,
    /// How long orphans have to rejoin (`None`: no recovery).
    rejoin: Option<std::time::Duration>,
    /// Where this node reached its parent (its children's fallback).
    parent_address: Option<String>,
    /// Where this node rejoins if its parent is lost (from the parent).
    fallback: Option<String>,
    /// Looking for a new parent until then.
    rejoining: Option<Instant>,
    /// Ranks of lost comm-node children awaited back.
    awaiting: Vec<recovery::Awaited>,
    /// Stops for ranks awaited back (their comm node was lost), with why: they
    /// are passed on once the ranks have rejoined.
    pending_stops: Vec<(RankSet, String)>,
    /// Front-end: every rank awaited back anywhere in the tree.
    orphaned: RankSet,
    /// Frames for a stream's whole group wait until every member can take them (a
    /// multicasting route): those of at least this many payload bytes; see
    /// [`Node::send_together`].
    send_together: Option<usize>,
    /// Messages between back-ends: a back-end's window, a parent's unanswered ones.
    peer: peer::PeerState,
    collectives: collective::Collectives,
    /// Back-end: its join went ahead of its link as an announcement (a light
    /// join), so its first link does not send it again.
    announced: bool,
    /// Front-end: the other networks linked to this one.
    remotes: Vec<remote::RemoteNet>,
    out: Outputs,
}

impl std::fmt::Debug for Node {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Node").field("name", &self.name).field("phase", &self.phase).finish()
    }
}

impl Node {
    /// A node before any link or plan.
    pub fn new(config: NodeConfig) -> Node {
        Node {
            role: config.role,
            node_id: config.node_id,
            name: config.name,
            registry: config.registry,
            tool_window: config.tool_window,
            phase: Phase::Idle,
            links: LinkMap::default(),
            parent: None,
            children: Vec::new(),
            startup: None,
            plan: None,
            own_host: String::new(),
            child_deadline: None,
            loss_deadline: None,
            streams: BTreeMap::new(),
            max_stream: 0,
            deliveries: VecDeque::new(),
            lost: LostRanks::default(),
            liveness: Liveness::default(),
            clock: clock::ClockSync::default(),
            monitor: monitoring::MonitorRequests::default(),
            rejoin: None,
            parent_address: None,
            fallback: None,
            rejoining: None,
            awaiting: Vec::new(),
            pending_stops: Vec::new(),
            orphaned: RankSet::new(),
            send_together: None,
            peer: peer::PeerState::default(),
            collectives: collective::Collectives::default(),
            announced: false,
            remotes: Vec::new(),
            out: Outputs::default(),
        }
    }

    /// Sends heartbeats and cuts off links silent past the limit (`None`: off, the
    /// default). Comm nodes and the front-end take the limits from their plan; a
    /// back-end is told by its driver.
    pub fn set_liveness(&mut self, limits: Option<LivenessLimits>, now: Instant) {
        self.liveness.configure(limits, now);
    }

    /// The heartbeat and silence limits in force, if any.
    pub fn liveness(&self) -> Option<LivenessLimits> {
        self.liveness.limits()
    }

    /// The node's role.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The node's name in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Set by a driver whose route multicasts to the children: a frame for a stream's
    /// whole group of at least `min_payload` bytes (what the route multicasts) waits
    /// until every member has credit for it and goes to all in one send, instead of
    /// going to the open ones now and to each late one alone (one multicast per
    /// straggler). Other frames go as before. `None`: no frame waits.
    pub fn send_together(&mut self, min_payload: Option<usize>) {
        self.send_together = min_payload;
    }

    /// The node's id.
    pub fn node_id(&self) -> u32 {
        self.node_id
    }

    /// True once the node has shut down or failed: the driver can stop after flushing.
    pub fn is_over(&self) -> bool {
        self.phase == Phase::Over
    }

    /// True while the sub-tree is up and routing.
    pub fn is_running(&self) -> bool {
        self.phase == Phase::Running
    }

    /// Front-end: every rank lost so far (including ranks missing at launch).
    pub fn lost(&self) -> &LostRanks {
        &self.lost
    }

    /// Back-end: its parent already counts it as joined (it announced itself, a
    /// light join), so its link sends no join of its own.
    pub fn set_announced(&mut self) {
        self.announced = true;
    }

    /// The link to the child started as `node_id`, if it is up.
    pub fn child_link(&self, node_id: u32) -> Option<LinkId> {
        self.children
            .iter()
            .find(|c| c.node_id == node_id && c.state != ChildState::Gone)
            .and_then(|c| c.link)
    }

    /// The link to the parent, if it is up.
    pub fn parent_link(&self) -> Option<LinkId> {
        self.parent
    }

    /// Ranks reachable through the live children.
    pub fn live_ranks(&self) -> RankSet {
        let mut all = RankSet::new();
        for c in self.children.iter().filter(|c| c.state == ChildState::Joined) {
            all.union_with(&c.ranks);
        }
        all
    }

    /// Comm nodes below this node, as their sub-trees reported.
    pub fn commnodes_below(&self) -> u32 {
        self.children.iter().filter(|c| c.state == ChildState::Joined).map(|c| c.commnodes).sum()
    }

    /// A new link is up (authenticated) to `peer`.
    pub fn handle_link_up(&mut self, link: LinkId, peer: Peer, now: Instant) {
        self.liveness.link_up(link, now);
        match peer {
            Peer::Parent => self.parent_up(link),
            Peer::Child { node_id } => self.child_up(link, node_id, now),
            Peer::Remote(spec) => self.remote_up(link, spec),
        }
    }

    /// A frame arrived on `link`.
    pub fn handle_frame(&mut self, link: LinkId, frame: Frame, now: Instant) {
        self.liveness.heard(link, &frame, now);
        let Some(&role) = self.links.get(link) else { return };
        if let LinkRole::Remote(r) = role {
            return self.on_remote_frame(link, r, frame, now);
        }
        match (frame.header.kind, role) {
            (FrameKind::Credit, _) => match frame.grant() {
                Ok(grant) => self.on_credit(role, frame.header.stream, grant),
                Err(e) => self.drop_link(link, format!("malformed credit frame: {e}"), now),
            },
            (FrameKind::Control, _) => match ControlMsg::decode(&frame.payload) {
                Ok(msg) => match (role, msg) {
                    (LinkRole::Parent, ControlMsg::ClockProbe { seq, sent_ns }) => {
                        let sent_ns = write_stamp(&frame).unwrap_or(sent_ns);
                        self.on_clock_probe(link, seq, sent_ns, now)
                    }
                    (LinkRole::Parent, ControlMsg::LinkClock { offset_ns, drift_ppb, measured_ns }) => {
                        self.on_link_clock(link, offset_ns, drift_ppb, measured_ns)
                    }
                    (LinkRole::Child(c), ControlMsg::ClockReply { seq, sent_ns, child_ns }) => {
                        let answered_ns = write_stamp(&frame).unwrap_or(child_ns);
                        self.on_clock_reply(c, seq, (sent_ns, child_ns, answered_ns), now)
                    }
                    (LinkRole::Child(_), ControlMsg::ClockReport { samples }) => self.clock_report(samples),
                    (LinkRole::Parent, ControlMsg::Fallback { address }) => self.on_fallback(address),
                    (LinkRole::Child(c), ControlMsg::Rejoin { ranks, commnodes, name, streams }) => {
                        self.on_rejoin(c, ranks, commnodes, name, streams, now)
                    }
                    (LinkRole::Child(c), ControlMsg::Orphaned { node, ranks, reason }) => {
                        self.child_orphaned(c, node, ranks, reason, now)
                    }
                    (LinkRole::Child(c), ControlMsg::Rejoined { ranks, commnodes, parent }) => {
                        self.child_rejoined(c, ranks, commnodes, parent)
                    }
                    (LinkRole::Parent, msg) => self.on_parent_control(link, msg, now),
                    (LinkRole::Child(c), msg) => self.on_child_control(c, msg, now),
                    (LinkRole::Remote(_), _) => {}
                },
                Err(e) => self.drop_link(link, format!("malformed control message: {e}"), now),
            },
            (FrameKind::Data, LinkRole::Parent) => self.on_down_data(frame, now),
            (FrameKind::Data, LinkRole::Child(c)) => self.on_up_data(c, frame, now),
            (FrameKind::Data, LinkRole::Remote(_)) => {}
            // The drivers' own business (the route between them); a driver that hands
            // one over has no route to set up, and the frame means nothing here.
            (FrameKind::Peer, role) => self.on_peer(link, role, frame, now),
            (FrameKind::Route, _) => tracing::debug!(node = %self.name, "route frame on {link} ignored"),
        }
    }

    /// `link` closed: `reason` is `None` for an orderly close, else what broke it.
    ///
    /// A child whose link closes while the tree runs usually closed it by ending: its
    /// ranks leave the streams at once, but the report of their loss waits (at most
    /// [`EXIT_WAIT`]) for the driver's [`Command::ChildExited`], so that it says how
    /// the process ended and what it last wrote to stderr.
    pub fn handle_link_closed(&mut self, link: LinkId, reason: Option<String>, now: Instant) {
        self.link_closed(link, reason, now, true);
    }

    /// `link` closed, by its peer (`by_peer`) or by this node on a protocol error.
    fn link_closed(&mut self, link: LinkId, reason: Option<String>, now: Instant, by_peer: bool) {
        self.liveness.link_closed(link);
        let Some(role) = self.links.remove(link) else { return };
        match role {
            LinkRole::Parent => {
                self.parent = None;
                if self.rejoining.is_some() {
                    let why = reason.unwrap_or_else(|| "the new parent closed the link".into());
                    return self.rejoin_failed(why);
                }
                let why = reason.as_deref().unwrap_or("the parent closed the link");
                if self.try_rejoin(why, now) {
                    return;
                }
                self.shut_down(match reason {
                    Some(error) => EndReason::ParentFailed { error },
                    None => EndReason::ParentClosed,
                });
            }
            LinkRole::Remote(r) => {
                let why = reason.unwrap_or_else(|| "the other front-end closed the link".to_owned());
                self.remote_gone(r, why);
            }
            LinkRole::Child(c) => {
                self.children[c].link = None;
                let why = match reason {
                    Some(r) => format!("{}: link to {} failed: {r}", self.name, self.children[c].name),
                    None => format!("{}: link to {} closed", self.name, self.children[c].name),
                };
                self.child_gone(c, why, now, by_peer);
            }
        }
    }

    /// A command from the tool or the driver.
    ///
    /// # Errors
    /// A send without credit hands its frame back ([`CommandError::Blocked`]); stream
    /// commands name what is wrong with the stream.
    pub fn handle_command(&mut self, cmd: Command, now: Instant) -> Result<(), CommandError> {
        if self.phase == Phase::Over
            && !matches!(cmd, Command::ChildExited { .. } | Command::ChildNotStarted { .. })
        {
            return Err(CommandError::ShutDown);
        }
        match cmd {
            Command::Launch(plan) => {
                if self.role != Role::FrontEnd || self.phase != Phase::Idle {
                    return Err(CommandError::NotNow("only a new front-end is launched"));
                }
                self.start(*plan, now);
                Ok(())
            }
            Command::ChildExited { node_id, detail } => {
                self.child_exited(node_id, detail, now);
                Ok(())
            }
            Command::ChildNotStarted { node_id, reason } => {
                self.child_not_started(node_id, &reason, now);
                Ok(())
            }
            Command::OwnAttachPoints(points) => {
                self.own_attach_points(points, now);
                Ok(())
            }
            Command::Adopt(launch) => self.adopt(vec![launch], now),
            Command::Spawn(_) | Command::Stop { .. } if self.role != Role::FrontEnd || !self.is_running() => {
                Err(CommandError::NotNow("only a running front-end spawns and stops back-ends"))
            }
            Command::Spawn(order) => {
                self.spawn_order(order, now);
                Ok(())
            }
            Command::SpawnReply { id, rank, group, ranks, error } => {
                if self.role != Role::FrontEnd {
                    return Err(CommandError::NotNow("only the front-end answers spawn requests"));
                }
                self.spawn_reply(ControlMsg::SpawnReply { id, rank, group, ranks, error });
                Ok(())
            }
            Command::RequestSpawn { id, n, command } => {
                let (Role::BackEnd { rank, .. }, Some(parent)) = (self.role, self.parent) else {
                    return Err(CommandError::NotNow("only a linked back-end asks for a spawn"));
                };
                self.out.control(parent, &ControlMsg::SpawnRequest { id, rank, n, command });
                Ok(())
            }
            Command::Stop { ranks, reason } => {
                self.stop_ranks(&ranks, &reason, now);
                Ok(())
            }
            Command::CloseRemote { index } => self.close_remote(index, now),
            Command::RejoinFailed { reason } => {
                self.rejoin_failed(reason);
                Ok(())
            }
            Command::NewStream(spec) => self.open_stream(spec),
            Command::CloseStream(id) => self.close_stream_from_tool(id),
            Command::Send(frame)
                if frame.header.kind == FrameKind::Peer
                    && frame.header.flags & treecast_wire::FLAG_PEER_COLL != 0 =>
            {
                self.send_collective(frame)
            }
            Command::Send(frame) if frame.header.kind == FrameKind::Peer => self.send_peer(frame),
            Command::Send(frame) => self.send_from_tool(frame),
            Command::ReportFilterError { stream, message } => {
                let Role::BackEnd { rank, .. } = self.role else {
                    return Err(CommandError::NotNow("only a back-end reports its own refused packets"));
                };
                let parent = self.parent.ok_or(CommandError::ShutDown)?;
                self.out.control(parent, &ControlMsg::FilterError { stream, rank, message });
                Ok(())
            }
            Command::MonitorStart { .. } | Command::MonitorStop | Command::MonitorCollect { .. }
                if self.role != Role::FrontEnd =>
            {
                Err(CommandError::NotNow("monitoring is ordered by the front-end"))
            }
            Command::MonitorStart { program } => {
                self.monitor_order(ControlMsg::MonitorStart { program });
                Ok(())
            }
            Command::MonitorStop => {
                self.monitor_order(ControlMsg::MonitorStop);
                Ok(())
            }
            Command::MonitorCollect { id, mode, limit } => {
                self.monitor_collect(id, mode, limit, now);
                Ok(())
            }
            Command::MonitorLocal { id, report } => {
                self.monitor_local(id, report, now);
                Ok(())
            }
            Command::Shutdown => {
                let why = match self.role {
                    Role::BackEnd { rank, .. } => {
                        if let Some(parent) = self.parent {
                            let leave = ControlMsg::Leave {
                                ranks: RankSet::single(rank),
                                reason: format!("{} left", self.name),
                                graceful: true,
                            };
                            self.out.control(parent, &leave);
                        }
                        EndReason::Left
                    }
                    _ => EndReason::ShutDown,
                };
                self.shut_down(why);
                Ok(())
            }
        }
    }

    /// Time passed: releases time-out waves, gives up on children that are late,
    /// reports losses whose process news did not come within [`EXIT_WAIT`], sends
    /// heartbeats and cuts off links that stayed silent too long.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.startup_timeout(now);
        self.losses_timeout(now);
        self.streams_timeout(now);
        self.liveness_timeout(now);
        self.clock_timeout(now);
        self.monitor_timeout(now);
        self.collectives_timeout(now);
        if self.phase != Phase::Over {
            self.recovery_timeout(now);
        }
    }

    fn liveness_timeout(&mut self, now: Instant) {
        if self.phase == Phase::Over {
            return;
        }
        for (link, silent) in self.liveness.silent(now) {
            self.liveness.link_closed(link);
            if self.links.get(link).is_some() {
                let reason = format!(
                    "nothing arrived for {:.1} s, not even a heartbeat: the peer is stopped, hung or unreachable",
                    silent.as_secs_f64()
                );
                self.drop_link(link, reason, now);
            }
        }
        for link in self.liveness.beats_due(now) {
            self.out.credits.push_back(Transmit { to: Destination::Link(link), frame: heartbeat_frame() });
        }
    }

    /// The next frame to send.
    pub fn poll_transmit(&mut self) -> Option<Transmit> {
        self.out.credits.pop_front().or_else(|| self.out.transmits.pop_front())
    }

    /// When [`Node::handle_timeout`] must be called next.
    pub fn poll_timeout(&self) -> Option<Instant> {
        let waves = self.streams.values().filter_map(StreamState::next_deadline).min();
        let liveness = if self.phase == Phase::Over { None } else { self.liveness.next_deadline() };
        let clock = self.clock_deadline();
        let recovery = if self.phase == Phase::Over { None } else { self.recovery_deadline() };
        let monitor = self.monitor_deadline();
        let collectives = self.collectives_deadline();
        [self.child_deadline, self.loss_deadline, waves, liveness, clock, recovery, monitor, collectives]
            .into_iter()
            .flatten()
            .min()
    }

    /// The next event for the driver or the tool.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.out.events.pop_front()
    }

    /// The next thing for the tool to read: on `stream` at the front-end, on any
    /// stream (`None`) at a back-end. Reading gives the flow-control credit back.
    pub fn poll_delivery(&mut self, stream: Option<u32>) -> Option<Delivery> {
        match (self.role, stream) {
            (Role::BackEnd { .. }, _) => {
                let d = self.deliveries.pop_front()?;
                match &d {
                    Delivery::Packet(f) if f.header.kind == FrameKind::Peer => self.peer_read(f),
                    Delivery::Packet(f) => self.delivered_at_backend(f.header.stream, f.payload.len()),
                    _ => {}
                }
                Some(d)
            }
            (_, Some(id)) => self.deliver_to_tool(id),
            (_, None) => None,
        }
    }

    /// True when [`Node::poll_delivery`] has something for the tool on `stream`
    /// (front-end) or on any stream (back-end, `None`).
    pub fn has_delivery(&self, stream: Option<u32>) -> bool {
        match (self.role, stream) {
            (Role::BackEnd { .. }, _) => !self.deliveries.is_empty(),
            (_, Some(id)) => self.streams.get(&id).is_some_and(StreamState::tool_has_something),
            (_, None) => false,
        }
    }

    /// True while stream `id` is open here.
    pub fn has_stream(&self, id: u32) -> bool {
        self.streams.contains_key(&id)
    }

    /// The upward filter of a stream open here (a back-end checks formats against it).
    pub fn stream_filter(&self, stream: u32) -> Option<&treecast_wire::FilterSpec> {
        self.streams.get(&stream).map(|s| &s.spec.up)
    }

    /// The filter registry of this node.
    pub fn registry(&self) -> &FilterRegistry {
        &self.registry
    }

    /// Packets held at this node on `stream` for its children and parent: in wait
    /// queues, in reduced waves waiting for credit, and in downward queues.
    pub fn held_packets(&self, stream: u32) -> usize {
        self.streams.get(&stream).map_or(0, StreamState::held_packets)
    }

    /// Bytes of payload held at this node, over every stream (what flow control bounds).
    pub fn held_bytes(&self) -> u64 {
        self.streams.values().map(StreamState::held_bytes).sum::<u64>()
            + self
                .deliveries
                .iter()
                .map(|d| match d {
                    Delivery::Packet(f) => f.payload.len() as u64,
                    Delivery::StreamClosed(_) | Delivery::NoAnswer(_) => 0,
                })
                .sum::<u64>()
    }

    /// Closes `link` on a protocol error: the driver closes it, the node treats it as closed.
    fn drop_link(&mut self, link: LinkId, reason: String, now: Instant) {
        // A child's loss is reported up with this reason; only the parent link's end is this node's own to log.
        if self.parent == Some(link) {
            tracing::warn!(node = %self.name, "closing {link}: {reason}");
        } else {
            tracing::debug!(node = %self.name, "closing {link}: {reason}");
        }
        self.out.event(Event::CloseLink { link, reason: reason.clone() });
        self.link_closed(link, Some(reason), now, false);
    }

    /// Sends a shutdown down and ends the node.
    fn shut_down(&mut self, reason: EndReason) {
        if self.phase == Phase::Over {
            return;
        }
        let links: Vec<LinkId> = self.children.iter().filter_map(|c| c.link).collect();
        if !links.is_empty() {
            self.out.transmits.push_back(Transmit {
                to: Destination::Links(links.into()),
                frame: control_frame(&ControlMsg::Shutdown),
            });
        }
        self.phase = Phase::Over;
        self.startup = None;
        self.child_deadline = None;
        self.loss_deadline = None;
        self.rejoining = None;
        self.awaiting.clear();
        self.out.event(Event::Shutdown { reason });
    }
}

#[cfg(test)]
mod tests;
