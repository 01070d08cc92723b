//! What goes into a core and what comes out of it: the driver's and the tool's
//! commands ([`Command`]), links coming up ([`Peer`]), frames to send ([`Transmit`]
//! to a [`Destination`]), events for the driver or the tool ([`Event`]), packets
//! for the tool ([`Delivery`]), and why a command was refused or a node ended
//! ([`CommandError`], [`EndReason`]).

use std::sync::Arc;
use std::time::Duration;

use treecast_filters::RegistryError;
use treecast_wire::{AttachPoint, ControlMsg, Frame, FrameHeader, LaunchPlan, LinkId, RankSet, StreamSpec};

use crate::{ChildLaunch, RemoteSpec};

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
    /// [`Node::handle_link_up`](crate::Node::handle_link_up), and each exit with [`Command::ChildExited`].
    StartChildren {
        /// The plan of this node (launcher, routes, time limits).
        plan: Arc<LaunchPlan>,
        /// The host this node runs on, as the topology names it.
        own_host: String,
        /// The children, in topology order.
        children: Vec<ChildLaunch>,
    },
    /// The plan distorted this node's clock (a test knob): the driver's route, which
    /// stamps frames with a copy of it, takes [`crate::Node::clock_source`] again.
    ClockChanged,
    /// Back-end: its member plan arrived and it joined as this rank.
    Placed {
        /// Its rank.
        rank: u32,
        /// Number of back-ends in the network.
        size: u32,
        /// Its spawned group, if it was spawned.
        group: Option<treecast_wire::GroupPlace>,
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
    /// and report the link with [`Node::handle_link_up`](crate::Node::handle_link_up) as the parent, or report
    /// failure with [`Command::RejoinFailed`].
    Rejoin {
        /// Where the new parent listens.
        address: String,
        /// How long this try may take before it counts as failed (the core's share
        /// of the rejoin limit: further ancestors are tried after it).
        within: Duration,
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
    /// [`Node::take_monitor_collection`](crate::Node::take_monitor_collection).
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
    /// Front-end: send a plug-in filter's shared object to every comm node
    /// ([`ControlMsg::LoadFilter`](treecast_wire::ControlMsg::LoadFilter)); the tool
    /// registered it here first. A node that cannot load it reports an
    /// [`Event::FilterError`] naming itself, and refuses streams that use it.
    ShipFilter {
        /// What names it in errors.
        label: String,
        /// SHA-256 of `bytes`.
        sha256: [u8; 32],
        /// The shared object.
        bytes: Vec<u8>,
    },
    /// Front-end: new parameters for a stream's upward filter, here and at every comm
    /// node of the stream (in order with the frames sent down before and after it),
    /// or, with `down`, for its downstream filter at every comm node.
    /// The front-end's own instance refusing them is the command's error; a comm node
    /// that refuses them reports an [`Event::FilterError`] naming itself.
    SetParams {
        /// The stream.
        stream: u32,
        /// Typed values, as at the stream's creation.
        params: Vec<u8>,
        /// For the downstream filter (which only comm nodes run).
        down: bool,
    },
    /// Front-end: create a stream (the id is the tool's, increasing).
    NewStream(StreamSpec),
    /// Front-end: close a stream everywhere.
    CloseStream(u32),
    /// Send a data frame: down the stream from the front-end (to one rank with
    /// `FLAG_DIRECT`), up from a back-end; or, from a back-end, a peer frame to
    /// another rank (refused with [`CommandError::Blocked`] while [`PEER_WINDOW`](crate::PEER_WINDOW)
    /// is used up; [`Event::Writable`] for [`PEER_CREDIT`](crate::PEER_CREDIT) says when to retry).
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

/// Encodes a control message as a frame.
pub fn control_frame(msg: &ControlMsg) -> Frame {
    Frame::new(FrameHeader::control(), msg.encode())
}
