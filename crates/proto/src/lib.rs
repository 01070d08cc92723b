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
//!
//! What a module keeps on [`Node`] lives in a `state.rs` beside it (`startup/state.rs`,
//! `streams/state.rs`, …), which imports neither this file nor the module's
//! behaviour: this file's `Node` depends only on those, and the modules' `impl Node`
//! blocks on `Node`, so the files import one way (`tools/import-cycles` checks it).

mod clock;
mod collective;
mod handover;
mod io;
mod liveness;
mod monitoring;
mod peer;
mod recovery;
mod remote;
mod startup;
mod streams;
mod window;

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use treecast_filters::FilterRegistry;
use treecast_wire::{ControlMsg, Frame, FrameKind, RankSet, Window};

pub use clock::state::{ClockConfig, ClockSource, Distortion};
pub use clock::{clock_distortion, CLOCK_DISTORT, MAX_PROBES};
pub use collective::{COLLECTIVE_EXPIRY, MAX_ENTERED, MAX_OPEN_COLLECTIVES, MAX_RESULT};
pub use io::{
    control_frame, Command, CommandError, Delivery, Destination, EndReason, Event, LostRanks, Peer, Transmit,
};
pub use liveness::{heartbeat_frame, LivenessLimits, DEFAULT_DEAD_AFTER, DEFAULT_HEARTBEAT};
pub use peer::state::PEER_WINDOW;
pub use peer::PEER_CREDIT;
pub use recovery::DEFAULT_REJOIN_WITHIN;
pub use remote::state::{remote_base, RemoteError, RemoteSpec, MAX_REMOTES, REMOTE_BASE, REMOTE_SPAN};
pub use startup::state::ChildLaunch;
pub use startup::MAX_SPAWN;
pub use treecast_wire::{LinkId, LinkMap, LinkTable};

/// The layers below the core, as the core sees them: a simulated tree or a driver
/// needs nothing else to feed it.
pub use {
    treecast_filters as filters, treecast_monitor as monitor, treecast_topology as topology,
    treecast_wire as wire,
};

use liveness::Liveness;
use startup::state::{Child, ChildState, StartupState};
use streams::state::StreamState;

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

/// Where a node is in its life.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    /// No parent link yet (comm node, back-end), or no plan yet (front-end).
    Idle,
    /// Comm node or back-end: linked to the parent, waiting for its plan.
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
    /// Route choices of streams made or learnt here, and their ends
    /// ([`Node::poll_stream_route`]).
    routes: VecDeque<(u32, Option<treecast_wire::RouteChoice>)>,
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

/// Loads a plug-in filter into a registry (see [`Node::set_plugin_loader`]); the error
/// says why it could not.
pub type PluginLoader = dyn Fn(PluginSource<'_>, &mut FilterRegistry) -> Result<(), String> + Send + Sync;

/// How many refusals of shipped plug-ins the front-end keeps for the tool.
pub const MAX_REFUSALS: usize = 64;

/// A comm node could not load a plug-in shipped down the tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FilterRefusal {
    /// SHA-256 of the plug-in's bytes.
    pub sha256: [u8; 32],
    /// The node that refused it.
    pub node: String,
    /// Why.
    pub reason: String,
}

/// Where a plug-in filter comes from.
#[derive(Debug, Clone, Copy)]
pub enum PluginSource<'a> {
    /// A path on this host, from the launch plan.
    Path(&'a str),
    /// Its bytes, shipped down the tree: to load from a sealed memory file once the
    /// hash matches.
    Bytes {
        /// What names it in errors.
        label: &'a str,
        /// SHA-256 the front-end computed.
        sha256: &'a [u8; 32],
        /// The shared object.
        bytes: &'a [u8],
    },
}

/// One node's protocol state. See the module documentation.
pub struct Node {
    role: Role,
    node_id: u32,
    name: String,
    registry: FilterRegistry,
    /// Loads the plug-in filters a comm node's plan names (the driver's: loading is I/O).
    plugin_loader: Option<std::sync::Arc<PluginLoader>>,
    /// Front-end: comm nodes' refusals of shipped plug-ins, by the plug-in's hash,
    /// until the tool takes them (the last [`MAX_REFUSALS`]).
    refused_filters: VecDeque<FilterRefusal>,
    /// Depth in the tree (0: the front-end), from the plan; filters are told it.
    depth: u32,
    tool_window: Window,
    phase: Phase,
    links: LinkMap<LinkRole>,
    parent: Option<LinkId>,
    children: Vec<Child>,
    /// Start-up, and what is kept of it to start more children later.
    start: StartupState,
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
    clock: clock::state::ClockSync,
    monitor: monitoring::state::MonitorRequests,
    /// Orphans rejoining: this node's fallback, its search for a new parent, the
    /// ranks of lost children awaited back.
    recovery: recovery::state::Recovery,
    /// Frames for a stream's whole group wait until every member can take them (a
    /// multicasting route): those of at least this many payload bytes; see
    /// [`Node::send_together`].
    send_together: Option<usize>,
    /// Messages between back-ends: a back-end's window, a parent's unanswered ones.
    peer: peer::state::PeerState,
    collectives: collective::state::Collectives,
    /// Front-end: the other networks linked to this one.
    remotes: Vec<remote::state::RemoteNet>,
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
            plugin_loader: None,
            refused_filters: VecDeque::new(),
            depth: 0,
            tool_window: config.tool_window,
            phase: Phase::Idle,
            links: LinkMap::default(),
            parent: None,
            children: Vec::new(),
            start: StartupState::default(),
            recovery: recovery::state::Recovery::default(),
            streams: BTreeMap::new(),
            max_stream: 0,
            deliveries: VecDeque::new(),
            lost: LostRanks::default(),
            liveness: Liveness::default(),
            clock: clock::state::ClockSync::default(),
            monitor: monitoring::state::MonitorRequests::default(),
            send_together: None,
            peer: peer::state::PeerState::default(),
            collectives: collective::state::Collectives::default(),
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

    /// Links and children the timer's work visited so far (heartbeats, silence
    /// checks, clock rounds, the next-deadline query): what the node's wake-ups cost,
    /// shown per node by `treecast bench sim`.
    pub fn timer_visits(&self) -> u64 {
        self.liveness.visits() + self.clock_visits()
    }

    /// Lets a comm node load the plug-in filters its plan names
    /// ([`treecast_wire::LaunchPlan::filters`]) when the plan arrives, before it joins;
    /// one that fails to load fails the node's start-up with the reason. Without a
    /// loader, a plan that names plug-ins fails start-up the same way.
    pub fn set_plugin_loader(&mut self, loader: std::sync::Arc<PluginLoader>) {
        self.plugin_loader = Some(loader);
    }

    /// The filters this node can make, to register more (a tool's plug-ins).
    pub fn registry_mut(&mut self) -> &mut FilterRegistry {
        &mut self.registry
    }

    /// Sends a [`ControlMsg::LoadFilter`] to every linked comm-node child.
    fn pass_filter_down(&mut self, msg: &ControlMsg) {
        let links: Vec<LinkId> =
            self.children.iter().filter(|c| !c.is_backend).filter_map(|c| c.link).collect();
        for link in links {
            self.out.control(link, msg);
        }
    }

    /// A comm node: loads a plug-in shipped down the tree, then passes it on; one it
    /// cannot load is reported up, naming this node (streams using it are then refused
    /// here, naming this node too).
    fn load_shipped_filter(&mut self, msg: ControlMsg) {
        let ControlMsg::LoadFilter { label, sha256, bytes } = &msg else { return };
        let source = PluginSource::Bytes { label, sha256, bytes };
        let loaded = match &self.plugin_loader {
            Some(load) => load(source, &mut self.registry),
            None => Err("this node cannot load plug-in filters".to_owned()),
        };
        match loaded {
            Ok(()) => self.pass_filter_down(&msg),
            Err(why) => {
                let reason = format!("plug-in filter {label}: {why}");
                self.report_up(ControlMsg::FilterRefused {
                    sha256: *sha256,
                    node: self.name.clone(),
                    reason,
                });
            }
        }
    }

    /// Front-end: a comm node refused a shipped plug-in; kept for the tool, and
    /// reported as a filter error naming the node.
    fn filter_refused(&mut self, refusal: FilterRefusal) {
        let message = format!("{}: {}", refusal.node, refusal.reason);
        self.out.event(Event::FilterError { stream: 0, rank: u32::MAX, message });
        if self.refused_filters.len() == MAX_REFUSALS {
            self.refused_filters.pop_front();
        }
        self.refused_filters.push_back(refusal);
    }

    /// Front-end: takes the refusals of the plug-in whose bytes hash to `sha256`.
    pub fn take_filter_refusals(&mut self, sha256: &[u8; 32]) -> Vec<FilterRefusal> {
        let mine = self.refused_filters.iter().filter(|r| r.sha256 == *sha256).cloned().collect();
        self.refused_filters.retain(|r| r.sha256 != *sha256);
        mine
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
        self.start.announced = true;
    }

    /// The link to the child started as `node_id`, if it is up.
    pub fn child_link(&self, node_id: u32) -> Option<LinkId> {
        self.children
            .iter()
            .find(|c| c.node_id == node_id && c.state != ChildState::Gone)
            .and_then(|c| c.link)
    }

    /// How many back-ends the child on `link` reaches, as far as this node knows
    /// (what the plan gave it, or what it reported since, whichever is more);
    /// `None` when `link` is not a child's. The route sizes its control frames by it.
    pub fn child_reach(&self, link: LinkId) -> Option<u64> {
        match self.links.get(link)? {
            LinkRole::Child(c) => {
                let child = self.children.get(*c)?;
                Some(child.expected.len().max(child.ranks.len()))
            }
            LinkRole::Parent | LinkRole::Remote(_) => None,
        }
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
                    (LinkRole::Parent, ControlMsg::Fallback { address, further }) => {
                        self.on_fallback(address, further)
                    }
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
        self.release_reports_after_data(now);
    }

    /// `link` closed: `reason` is `None` for an orderly close, else what broke it.
    ///
    /// A child whose link closes while the tree runs usually closed it by ending: its
    /// ranks leave the streams at once, but the report of their loss waits (at most
    /// [`EXIT_WAIT`]) for the driver's [`Command::ChildExited`], so that it says how
    /// the process ended and what it last wrote to stderr.
    pub fn handle_link_closed(&mut self, link: LinkId, reason: Option<String>, now: Instant) {
        self.link_closed(link, reason, now, true);
        self.release_reports_after_data(now);
    }

    /// `link` closed, by its peer (`by_peer`) or by this node on a protocol error.
    fn link_closed(&mut self, link: LinkId, reason: Option<String>, now: Instant, by_peer: bool) {
        self.liveness.link_closed(link);
        let Some(role) = self.links.remove(link) else { return };
        match role {
            LinkRole::Parent => {
                self.parent = None;
                if self.recovery.rejoining.is_some() {
                    let why = reason.unwrap_or_else(|| "the new parent closed the link".into());
                    return self.rejoin_failed(why, now);
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

    /// [`Command::Send`]'s frame from the tool: the one command the core takes no time
    /// for, so that a driver hands the packets of a burst over without reading a clock.
    ///
    /// # Errors
    /// As [`Node::handle_command`] for [`Command::Send`].
    pub fn handle_send(&mut self, frame: Frame) -> Result<(), CommandError> {
        if self.phase == Phase::Over {
            return Err(CommandError::ShutDown);
        }
        if frame.header.kind != FrameKind::Peer {
            self.send_from_tool(frame)
        } else if frame.header.flags & treecast_wire::FLAG_PEER_COLL != 0 {
            self.send_collective(frame)
        } else {
            self.send_peer(frame)
        }
    }

    /// A command from the tool or the driver.
    ///
    /// # Errors
    /// A send without credit hands its frame back ([`CommandError::Blocked`]); stream
    /// commands name what is wrong with the stream.
    pub fn handle_command(&mut self, cmd: Command, now: Instant) -> Result<(), CommandError> {
        let done = self.run_command(cmd, now);
        self.release_reports_after_data(now);
        done
    }

    fn run_command(&mut self, cmd: Command, now: Instant) -> Result<(), CommandError> {
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
            Command::SetParams { stream, params, down } => {
                if self.role != Role::FrontEnd {
                    return Err(CommandError::NotNow("only the front-end changes a stream's parameters"));
                }
                self.set_stream_params(stream, params, down)
            }
            Command::ShipFilter { label, sha256, bytes } => {
                if self.role != Role::FrontEnd || !self.is_running() {
                    return Err(CommandError::NotNow("only a running front-end ships filters"));
                }
                self.pass_filter_down(&ControlMsg::LoadFilter { label, sha256, bytes });
                Ok(())
            }
            Command::CloseRemote { index } => self.close_remote(index, now),
            Command::RejoinFailed { reason } => {
                self.rejoin_failed(reason, now);
                Ok(())
            }
            Command::NewStream(spec) => self.open_stream(spec),
            Command::CloseStream(id) => self.close_stream_from_tool(id),
            Command::Send(frame) => self.handle_send(frame),
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
        self.release_reports_after_data(now);
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

    /// The route choice of a stream made or learnt since the last call, other than
    /// the network's (`None`: a stream that had one is gone here, its choice no
    /// longer applies), in the order they happened: take them all before the
    /// transmits, as a new stream's first frames may be among those.
    pub fn poll_stream_route(&mut self) -> Option<(u32, Option<treecast_wire::RouteChoice>)> {
        self.out.routes.pop_front()
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
        [
            self.start.child_deadline,
            self.start.loss_deadline,
            waves,
            liveness,
            clock,
            recovery,
            monitor,
            collectives,
        ]
        .into_iter()
        .flatten()
        .min()
    }

    /// The next event for the driver or the tool.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.out.events.pop_front()
    }

    /// Whether [`Node::poll_event`] has an event to give.
    pub fn has_event(&self) -> bool {
        !self.out.events.is_empty()
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
        self.start.current = None;
        self.start.child_deadline = None;
        self.start.loss_deadline = None;
        self.recovery.rejoining = None;
        self.recovery.awaiting.clear();
        self.out.event(Event::Shutdown { reason });
    }
}

#[cfg(test)]
mod tests;
