//! Control messages: how nodes build the tree, create streams and report membership.
//!
//! A control frame's payload is one tag byte followed by the message's fields,
//! little-endian, strings as `u32` length + UTF-8.

use crate::codec::{put_string, put_strings, strings, Reader};
use crate::{DecodeError, LaunchPlan, MemberPlan, RankSet};

/// How a node groups packets arriving from its children into waves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SyncMode {
    /// One packet from every live child that reaches a stream member (the default).
    WaitForAll,
    /// Wait for all, but release what has arrived after this many milliseconds.
    TimeOut(u32),
    /// Every packet is a wave of its own.
    DoNotWait,
}

impl SyncMode {
    fn encode(self, out: &mut Vec<u8>) {
        let (code, param) = match self {
            SyncMode::WaitForAll => (0u8, 0u32),
            SyncMode::TimeOut(ms) => (1, ms),
            SyncMode::DoNotWait => (2, 0),
        };
        out.push(code);
        out.extend_from_slice(&param.to_le_bytes());
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let code = r.u8("sync mode")?;
        let param = r.u32("sync mode")?;
        match code {
            0 => Ok(SyncMode::WaitForAll),
            1 => Ok(SyncMode::TimeOut(param)),
            2 => Ok(SyncMode::DoNotWait),
            other => Err(DecodeError::Invalid { what: "sync mode", detail: format!("unknown mode {other}") }),
        }
    }
}

/// Which of the network's routes carry a stream's frames: the network's route is
/// chosen when it starts (`--route`), and each stream may keep to part of it, as
/// CoR picks a route per message class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RouteChoice {
    /// Whatever the network's route does (multicast, striping): the default.
    #[default]
    Network,
    /// Each frame whole, on one connection of each link: no multicast, no striping
    /// (small-message latency).
    Tcp,
    /// Large frames by multicast where the network has UDP groups; never striped.
    Udp,
    /// Large frames cut over the connections of striped links; never multicast.
    Striped,
}

impl RouteChoice {
    fn code(self) -> u8 {
        match self {
            RouteChoice::Network => 0,
            RouteChoice::Tcp => 1,
            RouteChoice::Udp => 2,
            RouteChoice::Striped => 3,
        }
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        match r.u8("stream route")? {
            0 => Ok(RouteChoice::Network),
            1 => Ok(RouteChoice::Tcp),
            2 => Ok(RouteChoice::Udp),
            3 => Ok(RouteChoice::Striped),
            other => {
                Err(DecodeError::Invalid { what: "stream route", detail: format!("unknown route {other}") })
            }
        }
    }

    /// True when the stream's frames may go by multicast.
    pub fn multicasts(self) -> bool {
        matches!(self, RouteChoice::Network | RouteChoice::Udp)
    }

    /// True when the stream's large frames may be cut over several connections.
    pub fn stripes(self) -> bool {
        matches!(self, RouteChoice::Network | RouteChoice::Striped)
    }

    /// The name a user gives it (`tcp`, `udp`, `striped`; `network` for the default).
    pub fn name(self) -> &'static str {
        match self {
            RouteChoice::Network => "network",
            RouteChoice::Tcp => "tcp",
            RouteChoice::Udp => "udp",
            RouteChoice::Striped => "striped",
        }
    }
}

impl std::fmt::Display for RouteChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl std::str::FromStr for RouteChoice {
    type Err = String;

    /// `tcp` (or `unix`: one connection per link, whatever its socket), `udp`,
    /// `striped`, `network`; the socket kind and connection count are the network's.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "network" | "default" => Ok(RouteChoice::Network),
            "tcp" | "unix" => Ok(RouteChoice::Tcp),
            "udp" => Ok(RouteChoice::Udp),
            "striped" => Ok(RouteChoice::Striped),
            other if other == "mptcp" || other.starts_with("striped:") => Err(format!(
                "a stream cannot choose '{other}': the socket kind and the connections per link are the \
                 network's (--route, NetworkBuilder::mptcp/stripes); a stream chooses tcp, udp, striped or network"
            )),
            other => Err(format!("unknown stream route '{other}': tcp, udp, striped or network")),
        }
    }
}

/// What a [`ControlMsg::MonitorCollect`] brings back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CollectMode {
    /// One report per sub-tree, merged on the way up.
    Merged,
    /// One report per node.
    PerNode,
    /// No report: each node answers once it handled the orders sent before, which
    /// confirms them.
    Confirm,
}

impl CollectMode {
    fn code(self) -> u8 {
        match self {
            CollectMode::Merged => 0,
            CollectMode::PerNode => 1,
            CollectMode::Confirm => 2,
        }
    }

    fn from_code(code: u8) -> Result<Self, DecodeError> {
        match code {
            0 => Ok(CollectMode::Merged),
            1 => Ok(CollectMode::PerNode),
            2 => Ok(CollectMode::Confirm),
            other => {
                Err(DecodeError::Invalid { what: "collect mode", detail: format!("unknown mode {other}") })
            }
        }
    }
}

/// A transformation filter as the wire names it: what every node looks up in its
/// filter registry when a stream is created.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct FilterSpec {
    /// The registered name, e.g. `sum` (built-ins) or a plug-in's name.
    pub name: String,
    /// The version of the filter's behaviour the stream was made for.
    pub version: u16,
    /// Parameters in the typed-value encoding (see `encode_values`); empty for none.
    pub params: Vec<u8>,
}

/// Longest filter name accepted.
pub const MAX_FILTER_NAME: usize = 256;

/// Most addresses one [`ControlMsg::Fallback`] names, the nearest included: an orphan
/// tries this many ancestors before it gives up (trees this deep are rare).
pub const MAX_FALLBACKS: usize = 8;

impl FilterSpec {
    /// A filter by name and version, without parameters.
    pub fn new(name: impl Into<String>, version: u16) -> Self {
        FilterSpec { name: name.into(), version, params: Vec::new() }
    }

    fn encode(&self, out: &mut Vec<u8>) {
        put_string(out, &self.name);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(self.params.len() as u32).to_le_bytes());
        out.extend_from_slice(&self.params);
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let name = r.string("filter name")?;
        if name.is_empty() || name.len() > MAX_FILTER_NAME {
            return Err(DecodeError::Invalid {
                what: "filter name",
                detail: format!("{} bytes long; names have 1 to {MAX_FILTER_NAME}", name.len()),
            });
        }
        let version = r.u16("filter version")?;
        let n = r.len_u32("filter parameters", r.remaining())?;
        let params = r.take(n, "filter parameters")?.to_vec();
        Ok(FilterSpec { name, version, params })
    }
}

/// A flow-control window: how much a sender may have outstanding on one stream of
/// one link before the receiver grants more. A sender may send while it has at
/// least one packet and one byte of credit left, so one frame may overshoot the
/// byte budget (a frame larger than the whole window still goes, alone).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Window {
    /// Data frames.
    pub packets: u32,
    /// Payload bytes.
    pub bytes: u64,
}

impl Window {
    fn encode(self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.packets.to_le_bytes());
        out.extend_from_slice(&self.bytes.to_le_bytes());
    }

    fn decode(r: &mut Reader<'_>, what: &'static str) -> Result<Self, DecodeError> {
        let w = Window { packets: r.u32(what)?, bytes: r.u64(what)? };
        if w.packets == 0 || w.bytes == 0 {
            return Err(DecodeError::Invalid {
                what,
                detail: "a window must allow at least one packet and byte".into(),
            });
        }
        Ok(w)
    }
}

/// Everything a node needs to know about a stream, as the front-end made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// Stream id (1 and up).
    pub id: u32,
    /// The communicator: back-end ranks of the stream.
    pub ranks: RankSet,
    /// Upstream synchronisation.
    pub sync: SyncMode,
    /// Upstream transformation.
    pub up: FilterSpec,
    /// Downstream transformation, applied at each comm node on the way down.
    pub down: FilterSpec,
    /// What a child may send up on this stream before its parent grants more.
    pub up_window: Window,
    /// What a parent may send down on this stream before the child grants more.
    pub down_window: Window,
    /// Program tag its frames are recorded under while monitoring (0: the tag of
    /// the recording), so that tools or phases sharing a tree are kept apart.
    pub program: u32,
    /// Which of the network's routes carry its frames.
    pub route: RouteChoice,
}

impl StreamSpec {
    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.id.to_le_bytes());
        self.ranks.encode(out);
        self.sync.encode(out);
        self.up.encode(out);
        self.down.encode(out);
        self.up_window.encode(out);
        self.down_window.encode(out);
        out.extend_from_slice(&self.program.to_le_bytes());
        out.push(self.route.code());
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        Ok(StreamSpec {
            id: r.u32("new stream")?,
            ranks: RankSet::decode(r)?,
            sync: SyncMode::decode(r)?,
            up: FilterSpec::decode(r)?,
            down: FilterSpec::decode(r)?,
            up_window: Window::decode(r, "upward window")?,
            down_window: Window::decode(r, "downward window")?,
            program: r.u32("stream program tag")?,
            route: RouteChoice::decode(r)?,
        })
    }
}

/// Where a back-end started by someone else connects (attach mode).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AttachPoint {
    /// The back-end's rank.
    pub rank: u32,
    /// The node id it authenticates as.
    pub node_id: u32,
    /// Its parent's address.
    pub address: String,
}

/// One node's clock against its parent's, as the parent measured it (Cristian's
/// method: the probe with the shortest round trip of a round).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSample {
    /// The node measured.
    pub node_id: u32,
    /// Its clock minus its parent's, nanoseconds.
    pub offset_ns: i64,
    /// Bound on the offset's error: half the round trip of the probe used.
    pub error_ns: u64,
    /// That round trip, nanoseconds.
    pub rtt_ns: u64,
    /// How fast its clock runs against its parent's, parts per billion (0 until two
    /// rounds were measured).
    pub drift_ppb: i64,
    /// Bound on the drift's error, parts per billion: the two rounds' error bounds over
    /// the time between them (0 before a second round).
    pub drift_error_ppb: u64,
    /// When the probe was answered, on the parent's clock, nanoseconds.
    pub measured_ns: i64,
}

/// Back-ends to start while the tree runs, under one node: the front-end's decision,
/// carried down to the node that starts them (see [`ControlMsg::Spawn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SpawnOrder {
    /// The node that starts them, as a parent (0: the front-end itself).
    pub target: u32,
    /// Node id of the first; the others follow in order.
    pub first_node_id: u32,
    /// Rank of the first; the others follow in order.
    pub first_rank: u32,
    /// How many.
    pub count: u32,
    /// Ranks in the network once the spawn is done (each back-end's `TREECAST_SIZE`).
    pub size: u32,
    /// The group the spawn makes: its id, first rank and size (a process's rank in
    /// its group is its rank minus the first).
    pub group: u32,
    /// First rank of the group.
    pub group_first: u32,
    /// Ranks in the group (across every node that starts part of it).
    pub group_size: u32,
    /// What each runs, program first (empty: the plan's back-end command).
    pub command: Vec<String>,
    /// Started by someone else (`Network::accept`): the node opens where they
    /// connect and reports it up ([`ControlMsg::AttachPoints`]) instead of starting
    /// processes.
    pub attach: bool,
    /// The host they run on, started through the target's launcher (ssh, Slurm)
    /// when it is not the target's own; empty: the target's own host.
    pub host: String,
    /// Light join: each process announces itself with one datagram to the target
    /// and counts as joined from then on, its link connecting after (only where the
    /// target starts it on its own host; elsewhere it joins by connecting).
    pub light: bool,
}

impl SpawnOrder {
    fn encode(&self, out: &mut Vec<u8>) {
        for v in [
            self.target,
            self.first_node_id,
            self.first_rank,
            self.count,
            self.size,
            self.group,
            self.group_first,
            self.group_size,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(self.command.len() as u32).to_le_bytes());
        for arg in &self.command {
            put_string(out, arg);
        }
        out.push(u8::from(self.attach));
        put_string(out, &self.host);
        out.push(u8::from(self.light));
    }

    fn decode(r: &mut Reader<'_>) -> Result<Self, DecodeError> {
        let mut order = SpawnOrder {
            target: r.u32("spawn target")?,
            first_node_id: r.u32("spawn node id")?,
            first_rank: r.u32("spawn rank")?,
            count: r.u32("spawn count")?,
            size: r.u32("spawn size")?,
            group: r.u32("spawn group")?,
            group_first: r.u32("spawn group")?,
            group_size: r.u32("spawn group")?,
            command: Vec::new(),
            attach: false,
            host: String::new(),
            light: false,
        };
        let n = r.len_u32("spawn command", r.remaining() / 4)?;
        order.command = (0..n).map(|_| r.string("spawn command")).collect::<Result<_, _>>()?;
        order.attach = decode_bool(r, "spawn attach")?;
        order.host = r.string("spawn host")?;
        order.light = decode_bool(r, "spawn light join")?;
        Ok(order)
    }
}

/// A message between nodes, carried in a [`crate::FrameKind::Control`] frame.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum ControlMsg {
    /// Parent to a new comm node: everything it needs to start its sub-tree.
    Plan(Box<LaunchPlan>),
    /// Parent to a new back-end: who it is and the network's limits; it joins then.
    MemberPlan(Box<MemberPlan>),
    /// Child to parent: these ranks are reachable through the sender (its
    /// sub-tree is up, or it joined while the tree runs).
    Join {
        /// Back-end ranks reached through the sender.
        ranks: RankSet,
        /// Comm nodes in the sender's sub-tree, the sender included.
        commnodes: u32,
    },
    /// Child to parent: the sub-tree could not be started.
    LaunchFailed {
        /// What failed, naming the node, its host and its output.
        message: String,
    },
    /// Front-end to the tree: a new stream.
    NewStream(StreamSpec),
    /// Front-end to the tree: a stream is closed.
    CloseStream {
        /// Stream id.
        id: u32,
    },
    /// Upstream: back-ends are no longer reachable.
    Leave {
        /// The ranks that left.
        ranks: RankSet,
        /// Why, naming the node that noticed.
        reason: String,
        /// True when they left on purpose (not a failure).
        graceful: bool,
    },
    /// Upstream: a filter refused a packet.
    FilterError {
        /// Stream of the packet.
        stream: u32,
        /// Source rank of the refused packet.
        rank: u32,
        /// What did not match.
        message: String,
    },
    /// Upstream, in attach mode: where the back-ends of a sub-tree must connect.
    AttachPoints {
        /// One entry per back-end slot of the sub-tree.
        points: Vec<AttachPoint>,
    },
    /// Downstream: exit now, taking every descendant down.
    Shutdown,
    /// Parent to child: what time is it on your clock? `sent_ns` is the parent's clock.
    ClockProbe {
        /// Probe number within the round.
        seq: u32,
        /// The parent's clock when it sent the probe, nanoseconds.
        sent_ns: i64,
    },
    /// Child to parent: the answer to a probe, with the child's clock when it answered.
    ClockReply {
        /// The probe's number.
        seq: u32,
        /// The parent's clock from the probe, sent back.
        sent_ns: i64,
        /// The child's clock when it answered, nanoseconds.
        child_ns: i64,
    },
    /// Upstream: clock measurements of nodes of the sender's sub-tree, each against its
    /// own parent; the front-end composes them along the tree.
    ClockReport {
        /// One entry per node measured.
        samples: Vec<ClockSample>,
    },
    /// Parent to child: where the child's own children rejoin the tree if the child
    /// is lost (the parent's parent address; empty: nowhere), and the addresses above
    /// that, tried in turn when the nearer ones do not take them. Sent when a child
    /// joins or rejoins, and again when the parent itself moved.
    Fallback {
        /// The address, as a child connects to it (`unix:@…` or `host:port`).
        address: String,
        /// The ancestors above it, nearest first (at most [`MAX_FALLBACKS`] in all).
        further: Vec<String>,
    },
    /// Orphan to its new parent, instead of [`ControlMsg::Join`]: these ranks, lost
    /// with the sender's old parent, are reachable again through the sender.
    Rejoin {
        /// Back-end ranks reached through the sender.
        ranks: RankSet,
        /// Comm nodes in the sender's sub-tree, the sender included (0 for a back-end).
        commnodes: u32,
        /// The sender's name in messages.
        name: String,
        /// The streams open at the sender, so the new parent can close those that
        /// ended while it was away.
        streams: Vec<u32>,
    },
    /// Upstream: a comm node was lost; the ranks below it left the waves and may rejoin
    /// under the node that sends this within its rejoin limit, else a
    /// [`ControlMsg::Leave`] follows for those that did not.
    Orphaned {
        /// The lost node's name.
        node: String,
        /// The ranks below it.
        ranks: RankSet,
        /// Why it was lost, naming the node that noticed.
        reason: String,
    },
    /// Parent to child, after each clock round: the child's clock minus the parent's,
    /// as the parent measured it, so the child can compare the parent's frame stamps
    /// with its own clock (the net component of monitoring).
    LinkClock {
        /// The child's clock minus the parent's, nanoseconds, at `measured_ns`.
        offset_ns: i64,
        /// How fast that difference moves, parts per billion (0 before a second round).
        drift_ppb: i64,
        /// When it was measured, on the parent's clock, nanoseconds.
        measured_ns: i64,
    },
    /// Downstream, to every node: record every frame's latency components under
    /// this program tag, from now on.
    MonitorStart {
        /// The program tag the samples are kept under.
        program: u32,
    },
    /// Downstream, to every node: stop recording.
    MonitorStop,
    /// Downstream, to every node: send up what you recorded, with your sub-tree's.
    MonitorCollect {
        /// Names the collection in the answers.
        id: u32,
        /// What to bring back.
        mode: CollectMode,
        /// How long the receiver waits for its children's answers, milliseconds.
        limit_ms: u32,
    },
    /// Upstream: the answer to [`ControlMsg::MonitorCollect`] for the sender's
    /// sub-tree.
    MonitorReport {
        /// The collection's id.
        id: u32,
        /// The reports, JSON (`treecast_monitor::Collection`); the wire layer does
        /// not read it.
        json: String,
    },
    /// Upstream: orphaned ranks rejoined the tree under `parent`.
    Rejoined {
        /// The ranks.
        ranks: RankSet,
        /// Comm nodes that came back with them.
        commnodes: u32,
        /// The name of the node they rejoined under.
        parent: String,
    },
    /// Upstream: a node could not create a stream's filters.
    StreamRefused {
        /// The stream.
        stream: u32,
        /// The node that refused it.
        node: String,
        /// Why (unknown filter, bad parameter).
        message: String,
    },
    /// Downstream, towards `order.target`: start these back-ends; their ranks join
    /// like any adopted child's ([`ControlMsg::Join`] up, or [`ControlMsg::Leave`]
    /// naming each that failed).
    Spawn(SpawnOrder),
    /// Upstream, from a back-end to the front-end: start `n` back-ends running
    /// `command` (empty: the launch's back-end command) for the requesting rank.
    SpawnRequest {
        /// The request's number at the requesting back-end.
        id: u32,
        /// The requesting back-end.
        rank: u32,
        /// How many.
        n: u32,
        /// What they run, program first.
        command: Vec<String>,
    },
    /// Downstream, from the front-end to the requesting back-end: how its
    /// [`ControlMsg::SpawnRequest`] ended.
    SpawnReply {
        /// The request's number.
        id: u32,
        /// The requesting back-end.
        rank: u32,
        /// The group made (0 when the spawn failed).
        group: u32,
        /// The new ranks, in group order (empty when the spawn failed).
        ranks: RankSet,
        /// Why the spawn failed (empty when it did not).
        error: String,
    },
    /// Downstream, towards the parents of `ranks`: stop these back-ends' processes;
    /// each parent reports them gone with a graceful [`ControlMsg::Leave`].
    Stop {
        /// The back-ends.
        ranks: RankSet,
        /// Why, for their Leave.
        reason: String,
    },
    /// Downstream, from the front-end to every comm node: a plug-in filter's shared
    /// object, which each loads from a sealed memory file and registers (after checking
    /// the hash) before it passes it on (docs/filter-abi.md).
    LoadFilter {
        /// What names it in errors (the file name at the front-end).
        label: String,
        /// SHA-256 of `bytes`.
        sha256: [u8; 32],
        /// The shared object.
        bytes: Vec<u8>,
    },
    /// Downstream, along a stream's comm nodes: new parameters for its upward
    /// filter, which each node hands its instance before it passes them on.
    SetParams {
        /// The stream.
        stream: u32,
        /// The parameters, typed values as at the stream's creation.
        params: Vec<u8>,
    },
    /// Upstream, from a comm node to its parent, ahead of a wave it reduced: its
    /// upward filter's state after that wave, which the parent's instance takes over
    /// if this node is lost and its children rejoin the parent (docs/filter-abi.md).
    FilterState {
        /// The stream.
        stream: u32,
        /// What the filter's `get_state` reported.
        state: Vec<u8>,
    },
    /// Downstream, along a stream's comm nodes: new parameters for its downstream
    /// filter, which each node hands its instance before it passes them on.
    SetDownParams {
        /// The stream.
        stream: u32,
        /// The parameters, typed values as at the stream's creation.
        params: Vec<u8>,
    },
    /// Upstream, passed on to the front-end: a comm node could not load a plug-in
    /// shipped down the tree ([`ControlMsg::LoadFilter`]).
    FilterRefused {
        /// SHA-256 of the plug-in's bytes: which load this answers.
        sha256: [u8; 32],
        /// The node that refused it.
        node: String,
        /// Why.
        reason: String,
    },
}

const PLAN: u8 = 1;
const JOIN: u8 = 2;
const LAUNCH_FAILED: u8 = 3;
const NEW_STREAM: u8 = 4;
const CLOSE_STREAM: u8 = 5;
const LEAVE: u8 = 6;
const FILTER_ERROR: u8 = 7;
const SHUTDOWN: u8 = 8;
const ATTACH_POINTS: u8 = 9;
const STREAM_REFUSED: u8 = 10;
const CLOCK_PROBE: u8 = 11;
const CLOCK_REPLY: u8 = 12;
const CLOCK_REPORT: u8 = 13;
const FALLBACK: u8 = 14;
const REJOIN: u8 = 15;
const ORPHANED: u8 = 16;
const REJOINED: u8 = 17;
const LINK_CLOCK: u8 = 18;
const MONITOR_START: u8 = 19;
const MONITOR_STOP: u8 = 20;
const MONITOR_COLLECT: u8 = 21;
const MONITOR_REPORT: u8 = 22;
const SPAWN: u8 = 23;
const STOP: u8 = 24;
const SPAWN_REQUEST: u8 = 25;
const SPAWN_REPLY: u8 = 26;
const LOAD_FILTER: u8 = 27;
const SET_PARAMS: u8 = 28;
const FILTER_STATE: u8 = 29;
const FILTER_REFUSED: u8 = 30;
const SET_DOWN_PARAMS: u8 = 31;
const MEMBER_PLAN: u8 = 32;
/// Bytes of one [`ClockSample`] on the wire.
const CLOCK_SAMPLE_LEN: usize = 52;

impl ControlMsg {
    /// The payload bytes of a control frame.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        match self {
            ControlMsg::Plan(plan) => {
                out.push(PLAN);
                plan.encode(&mut out);
            }
            ControlMsg::MemberPlan(plan) => {
                out.push(MEMBER_PLAN);
                plan.encode(&mut out);
            }
            ControlMsg::Join { ranks, commnodes } => {
                out.push(JOIN);
                ranks.encode(&mut out);
                out.extend_from_slice(&commnodes.to_le_bytes());
            }
            ControlMsg::LaunchFailed { message } => {
                out.push(LAUNCH_FAILED);
                put_string(&mut out, message);
            }
            ControlMsg::NewStream(spec) => {
                out.push(NEW_STREAM);
                spec.encode(&mut out);
            }
            ControlMsg::CloseStream { id } => {
                out.push(CLOSE_STREAM);
                out.extend_from_slice(&id.to_le_bytes());
            }
            ControlMsg::Leave { ranks, reason, graceful } => {
                out.push(LEAVE);
                ranks.encode(&mut out);
                put_string(&mut out, reason);
                out.push(u8::from(*graceful));
            }
            ControlMsg::FilterError { stream, rank, message } => {
                out.push(FILTER_ERROR);
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&rank.to_le_bytes());
                put_string(&mut out, message);
            }
            ControlMsg::Shutdown => out.push(SHUTDOWN),
            ControlMsg::AttachPoints { points } => {
                out.push(ATTACH_POINTS);
                out.extend_from_slice(&(points.len() as u32).to_le_bytes());
                for p in points {
                    out.extend_from_slice(&p.rank.to_le_bytes());
                    out.extend_from_slice(&p.node_id.to_le_bytes());
                    put_string(&mut out, &p.address);
                }
            }
            ControlMsg::ClockProbe { seq, sent_ns } => {
                out.push(CLOCK_PROBE);
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&sent_ns.to_le_bytes());
            }
            ControlMsg::MonitorStart { program } => {
                out.push(MONITOR_START);
                out.extend_from_slice(&program.to_le_bytes());
            }
            ControlMsg::MonitorStop => out.push(MONITOR_STOP),
            ControlMsg::MonitorCollect { id, mode, limit_ms } => {
                out.push(MONITOR_COLLECT);
                out.extend_from_slice(&id.to_le_bytes());
                out.push(mode.code());
                out.extend_from_slice(&limit_ms.to_le_bytes());
            }
            ControlMsg::Spawn(order) => {
                out.push(SPAWN);
                order.encode(&mut out);
            }
            ControlMsg::SpawnRequest { id, rank, n, command } => {
                out.push(SPAWN_REQUEST);
                for v in [id, rank, n] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                out.extend_from_slice(&(command.len() as u32).to_le_bytes());
                for arg in command {
                    put_string(&mut out, arg);
                }
            }
            ControlMsg::SpawnReply { id, rank, group, ranks, error } => {
                out.push(SPAWN_REPLY);
                for v in [id, rank, group] {
                    out.extend_from_slice(&v.to_le_bytes());
                }
                ranks.encode(&mut out);
                put_string(&mut out, error);
            }
            ControlMsg::Stop { ranks, reason } => {
                out.push(STOP);
                ranks.encode(&mut out);
                put_string(&mut out, reason);
            }
            ControlMsg::SetParams { stream, params } | ControlMsg::SetDownParams { stream, params } => {
                let down = matches!(self, ControlMsg::SetDownParams { .. });
                out.push(if down { SET_DOWN_PARAMS } else { SET_PARAMS });
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&(params.len() as u32).to_le_bytes());
                out.extend_from_slice(params);
            }
            ControlMsg::FilterState { stream, state } => {
                out.push(FILTER_STATE);
                out.extend_from_slice(&stream.to_le_bytes());
                out.extend_from_slice(&(state.len() as u32).to_le_bytes());
                out.extend_from_slice(state);
            }
            ControlMsg::FilterRefused { sha256, node, reason } => {
                out.push(FILTER_REFUSED);
                out.extend_from_slice(sha256);
                put_string(&mut out, node);
                put_string(&mut out, reason);
            }
            ControlMsg::LoadFilter { label, sha256, bytes } => {
                out.push(LOAD_FILTER);
                put_string(&mut out, label);
                out.extend_from_slice(sha256);
                out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
                out.extend_from_slice(bytes);
            }
            ControlMsg::MonitorReport { id, json } => {
                out.push(MONITOR_REPORT);
                out.extend_from_slice(&id.to_le_bytes());
                put_string(&mut out, json);
            }
            ControlMsg::LinkClock { offset_ns, drift_ppb, measured_ns } => {
                out.push(LINK_CLOCK);
                out.extend_from_slice(&offset_ns.to_le_bytes());
                out.extend_from_slice(&drift_ppb.to_le_bytes());
                out.extend_from_slice(&measured_ns.to_le_bytes());
            }
            ControlMsg::ClockReply { seq, sent_ns, child_ns } => {
                out.push(CLOCK_REPLY);
                out.extend_from_slice(&seq.to_le_bytes());
                out.extend_from_slice(&sent_ns.to_le_bytes());
                out.extend_from_slice(&child_ns.to_le_bytes());
            }
            ControlMsg::ClockReport { samples } => {
                out.push(CLOCK_REPORT);
                out.extend_from_slice(&(samples.len() as u32).to_le_bytes());
                for s in samples {
                    out.extend_from_slice(&s.node_id.to_le_bytes());
                    out.extend_from_slice(&s.offset_ns.to_le_bytes());
                    out.extend_from_slice(&s.error_ns.to_le_bytes());
                    out.extend_from_slice(&s.rtt_ns.to_le_bytes());
                    out.extend_from_slice(&s.drift_ppb.to_le_bytes());
                    out.extend_from_slice(&s.drift_error_ppb.to_le_bytes());
                    out.extend_from_slice(&s.measured_ns.to_le_bytes());
                }
            }
            ControlMsg::Fallback { address, further } => {
                out.push(FALLBACK);
                put_string(&mut out, address);
                put_strings(&mut out, further);
            }
            ControlMsg::Rejoin { ranks, commnodes, name, streams } => {
                out.push(REJOIN);
                ranks.encode(&mut out);
                out.extend_from_slice(&commnodes.to_le_bytes());
                put_string(&mut out, name);
                out.extend_from_slice(&(streams.len() as u32).to_le_bytes());
                for id in streams {
                    out.extend_from_slice(&id.to_le_bytes());
                }
            }
            ControlMsg::Orphaned { node, ranks, reason } => {
                out.push(ORPHANED);
                put_string(&mut out, node);
                ranks.encode(&mut out);
                put_string(&mut out, reason);
            }
            ControlMsg::Rejoined { ranks, commnodes, parent } => {
                out.push(REJOINED);
                ranks.encode(&mut out);
                out.extend_from_slice(&commnodes.to_le_bytes());
                put_string(&mut out, parent);
            }
            ControlMsg::StreamRefused { stream, node, message } => {
                out.push(STREAM_REFUSED);
                out.extend_from_slice(&stream.to_le_bytes());
                put_string(&mut out, node);
                put_string(&mut out, message);
            }
        }
        out
    }

    /// Decodes a control frame's payload.
    ///
    /// # Errors
    /// A [`DecodeError`] naming the malformed field; trailing bytes are an error.
    pub fn decode(buf: &[u8]) -> Result<ControlMsg, DecodeError> {
        let mut r = Reader::new(buf);
        let msg = match r.u8("control tag")? {
            PLAN => ControlMsg::Plan(Box::new(LaunchPlan::decode(&mut r)?)),
            MEMBER_PLAN => ControlMsg::MemberPlan(Box::new(MemberPlan::decode(&mut r)?)),
            JOIN => ControlMsg::Join { ranks: RankSet::decode(&mut r)?, commnodes: r.u32("join")? },
            LAUNCH_FAILED => ControlMsg::LaunchFailed { message: r.string("launch failure")? },
            NEW_STREAM => ControlMsg::NewStream(StreamSpec::decode(&mut r)?),
            CLOSE_STREAM => ControlMsg::CloseStream { id: r.u32("close stream")? },
            LEAVE => ControlMsg::Leave {
                ranks: RankSet::decode(&mut r)?,
                reason: r.string("leave reason")?,
                graceful: decode_bool(&mut r, "leave")?,
            },
            FILTER_ERROR => ControlMsg::FilterError {
                stream: r.u32("filter error")?,
                rank: r.u32("filter error")?,
                message: r.string("filter error")?,
            },
            SHUTDOWN => ControlMsg::Shutdown,
            ATTACH_POINTS => {
                let n = r.len_u32("attach points", r.remaining() / 12)?;
                let points = (0..n)
                    .map(|_| {
                        Ok(AttachPoint {
                            rank: r.u32("attach point")?,
                            node_id: r.u32("attach point")?,
                            address: r.string("attach address")?,
                        })
                    })
                    .collect::<Result<_, DecodeError>>()?;
                ControlMsg::AttachPoints { points }
            }
            STREAM_REFUSED => ControlMsg::StreamRefused {
                stream: r.u32("stream refused")?,
                node: r.string("stream refused")?,
                message: r.string("stream refused")?,
            },
            CLOCK_PROBE => {
                ControlMsg::ClockProbe { seq: r.u32("clock probe")?, sent_ns: r.i64("clock probe")? }
            }
            MONITOR_START => ControlMsg::MonitorStart { program: r.u32("monitor start")? },
            MONITOR_STOP => ControlMsg::MonitorStop,
            MONITOR_COLLECT => ControlMsg::MonitorCollect {
                id: r.u32("monitor collect")?,
                mode: CollectMode::from_code(r.u8("monitor collect")?)?,
                limit_ms: r.u32("monitor collect")?,
            },
            SPAWN => ControlMsg::Spawn(SpawnOrder::decode(&mut r)?),
            STOP => ControlMsg::Stop { ranks: RankSet::decode(&mut r)?, reason: r.string("stop reason")? },
            SET_PARAMS => {
                let stream = r.u32("filter parameters")?;
                let n = r.len_u32("filter parameters", r.remaining())?;
                ControlMsg::SetParams { stream, params: r.take(n, "filter parameters")?.to_vec() }
            }
            SET_DOWN_PARAMS => {
                let stream = r.u32("downstream filter parameters")?;
                let n = r.len_u32("downstream filter parameters", r.remaining())?;
                ControlMsg::SetDownParams {
                    stream,
                    params: r.take(n, "downstream filter parameters")?.to_vec(),
                }
            }
            FILTER_STATE => {
                let stream = r.u32("filter state")?;
                let n = r.len_u32("filter state", r.remaining())?;
                ControlMsg::FilterState { stream, state: r.take(n, "filter state")?.to_vec() }
            }
            FILTER_REFUSED => {
                let mut sha256 = [0u8; 32];
                sha256.copy_from_slice(r.take(32, "refused plug-in hash")?);
                ControlMsg::FilterRefused {
                    sha256,
                    node: r.string("refused plug-in node")?,
                    reason: r.string("refused plug-in reason")?,
                }
            }
            LOAD_FILTER => {
                let label = r.string("plug-in label")?;
                let mut sha256 = [0u8; 32];
                sha256.copy_from_slice(r.take(32, "plug-in hash")?);
                let n = r.len_u32("plug-in bytes", r.remaining())?;
                ControlMsg::LoadFilter { label, sha256, bytes: r.take(n, "plug-in bytes")?.to_vec() }
            }
            SPAWN_REQUEST => {
                let (id, rank, n) =
                    (r.u32("spawn request")?, r.u32("spawn request")?, r.u32("spawn request")?);
                let count = r.len_u32("spawn request command", r.remaining() / 4)?;
                let command =
                    (0..count).map(|_| r.string("spawn request command")).collect::<Result<_, _>>()?;
                ControlMsg::SpawnRequest { id, rank, n, command }
            }
            SPAWN_REPLY => ControlMsg::SpawnReply {
                id: r.u32("spawn reply")?,
                rank: r.u32("spawn reply")?,
                group: r.u32("spawn reply")?,
                ranks: RankSet::decode(&mut r)?,
                error: r.string("spawn reply")?,
            },
            MONITOR_REPORT => {
                ControlMsg::MonitorReport { id: r.u32("monitor report")?, json: r.string("monitor report")? }
            }
            LINK_CLOCK => ControlMsg::LinkClock {
                offset_ns: r.i64("link clock")?,
                drift_ppb: r.i64("link clock")?,
                measured_ns: r.i64("link clock")?,
            },
            CLOCK_REPLY => ControlMsg::ClockReply {
                seq: r.u32("clock reply")?,
                sent_ns: r.i64("clock reply")?,
                child_ns: r.i64("clock reply")?,
            },
            CLOCK_REPORT => {
                let n = r.len_u32("clock report", r.remaining() / CLOCK_SAMPLE_LEN)?;
                let samples = (0..n)
                    .map(|_| {
                        Ok(ClockSample {
                            node_id: r.u32("clock sample")?,
                            offset_ns: r.i64("clock sample")?,
                            error_ns: r.u64("clock sample")?,
                            rtt_ns: r.u64("clock sample")?,
                            drift_ppb: r.i64("clock sample")?,
                            drift_error_ppb: r.u64("clock sample")?,
                            measured_ns: r.i64("clock sample")?,
                        })
                    })
                    .collect::<Result<_, DecodeError>>()?;
                ControlMsg::ClockReport { samples }
            }
            FALLBACK => ControlMsg::Fallback {
                address: r.string("fallback address")?,
                further: strings(&mut r, "further fallback addresses")?,
            },
            REJOIN => {
                let ranks = RankSet::decode(&mut r)?;
                let commnodes = r.u32("rejoin")?;
                let name = r.string("rejoin name")?;
                let n = r.len_u32("rejoin streams", r.remaining() / 4)?;
                let streams = (0..n).map(|_| r.u32("rejoin stream")).collect::<Result<_, _>>()?;
                ControlMsg::Rejoin { ranks, commnodes, name, streams }
            }
            ORPHANED => ControlMsg::Orphaned {
                node: r.string("orphaned node")?,
                ranks: RankSet::decode(&mut r)?,
                reason: r.string("orphaned reason")?,
            },
            REJOINED => ControlMsg::Rejoined {
                ranks: RankSet::decode(&mut r)?,
                commnodes: r.u32("rejoined")?,
                parent: r.string("rejoined parent")?,
            },
            other => return Err(DecodeError::UnknownControl(other)),
        };
        r.finish("control message")?;
        Ok(msg)
    }
}

/// Reads a `u8` that must be 0 or 1.
pub(crate) fn decode_bool(r: &mut Reader<'_>, what: &'static str) -> Result<bool, DecodeError> {
    match r.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        other => Err(DecodeError::Invalid { what, detail: format!("flag {other} is neither 0 nor 1") }),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::plan::{sample_member_plan, sample_plan};

    pub(crate) fn stream_spec() -> StreamSpec {
        StreamSpec {
            id: 3,
            ranks: RankSet::range(4, 4),
            sync: SyncMode::TimeOut(50),
            up: FilterSpec { name: "sum".into(), version: 1, params: vec![5, 1, 0, 0, 0] },
            down: FilterSpec::new("null", 1),
            up_window: Window { packets: 256, bytes: 4 << 20 },
            down_window: Window { packets: 64, bytes: 8 << 20 },
            program: 0,
            route: RouteChoice::Tcp,
        }
    }

    fn samples() -> Vec<ControlMsg> {
        vec![
            ControlMsg::Plan(Box::new(sample_plan())),
            ControlMsg::MemberPlan(Box::new(sample_member_plan())),
            ControlMsg::Join { ranks: RankSet::range(0, 16), commnodes: 5 },
            ControlMsg::LaunchFailed { message: "node 3 on localhost: exited".into() },
            ControlMsg::NewStream(stream_spec()),
            ControlMsg::CloseStream { id: 3 },
            ControlMsg::Leave { ranks: RankSet::single(7), reason: "link closed".into(), graceful: false },
            ControlMsg::FilterError { stream: 2, rank: 1, message: "bad".into() },
            ControlMsg::Shutdown,
            ControlMsg::AttachPoints {
                points: vec![
                    AttachPoint { rank: 0, node_id: 3, address: "unix:@x".into() },
                    AttachPoint { rank: 1, node_id: 3, address: "10.0.0.1:4000".into() },
                ],
            },
            ControlMsg::StreamRefused {
                stream: 4,
                node: "comm node h:2".into(),
                message: "no filter".into(),
            },
            ControlMsg::ClockProbe { seq: 3, sent_ns: -5 },
            ControlMsg::Fallback {
                address: "unix:@treecast-1".into(),
                further: vec!["10.0.0.1:7000".into()],
            },
            ControlMsg::Fallback { address: String::new(), further: Vec::new() },
            ControlMsg::Rejoin {
                ranks: RankSet::range(4, 4),
                commnodes: 1,
                name: "comm node h (node 3)".into(),
                streams: vec![1, 7],
            },
            ControlMsg::Orphaned {
                node: "comm node h (node 2)".into(),
                ranks: RankSet::single(3),
                reason: "x".into(),
            },
            ControlMsg::Rejoined { ranks: RankSet::range(0, 2), commnodes: 0, parent: "front-end".into() },
            ControlMsg::ClockReply { seq: 3, sent_ns: 1_700_000_000_000_000_000, child_ns: i64::MIN },
            ControlMsg::LinkClock { offset_ns: -2_000_000_000, drift_ppb: 100_000, measured_ns: i64::MAX },
            ControlMsg::MonitorStart { program: 7 },
            ControlMsg::MonitorStop,
            ControlMsg::MonitorCollect { id: 3, mode: CollectMode::PerNode, limit_ms: 10_000 },
            ControlMsg::MonitorCollect { id: 4, mode: CollectMode::Confirm, limit_ms: 1 },
            ControlMsg::MonitorReport { id: 3, json: "{}".into() },
            ControlMsg::Spawn(SpawnOrder {
                target: 2,
                first_node_id: 40,
                first_rank: 16,
                count: 4,
                size: 20,
                group: 1,
                group_first: 16,
                group_size: 4,
                command: vec!["worker".into(), "--fast".into()],
                attach: false,
                host: "n7".into(),
                light: true,
            }),
            ControlMsg::Stop { ranks: RankSet::range(16, 4), reason: "spawn failed".into() },
            ControlMsg::LoadFilter {
                label: "libtopk.so".into(),
                sha256: [7; 32],
                bytes: b"\x7fELF".to_vec(),
            },
            ControlMsg::SetParams { stream: 3, params: vec![6, 2, 0, 0, 0] },
            ControlMsg::FilterState { stream: 3, state: vec![7, 5, 0, 0, 0, 0, 0, 0, 0] },
            ControlMsg::SetDownParams { stream: 4, params: vec![5, 3, 0, 0, 0] },
            ControlMsg::FilterRefused {
                sha256: [9; 32],
                node: "comm node h (node 5)".into(),
                reason: "no table".into(),
            },
            ControlMsg::SpawnRequest { id: 3, rank: 7, n: 2, command: vec!["helper".into()] },
            ControlMsg::SpawnReply {
                id: 3,
                rank: 7,
                group: 2,
                ranks: RankSet::range(20, 2),
                error: String::new(),
            },
            ControlMsg::ClockReport {
                samples: vec![ClockSample {
                    node_id: 9,
                    offset_ns: -1_000_000,
                    error_ns: 1500,
                    rtt_ns: 3000,
                    drift_ppb: 42_000,
                    drift_error_ppb: 300,
                    measured_ns: 77,
                }],
            },
        ]
    }

    #[test]
    fn every_message_round_trips() {
        for m in samples() {
            assert_eq!(ControlMsg::decode(&m.encode()).unwrap(), m);
        }
    }

    #[test]
    fn truncation_anywhere_is_an_error_not_a_panic() {
        for m in samples() {
            let bytes = m.encode();
            for cut in 0..bytes.len() {
                assert!(ControlMsg::decode(&bytes[..cut]).is_err(), "{m:?} cut at {cut}");
            }
            let mut longer = bytes.clone();
            longer.push(0);
            assert!(ControlMsg::decode(&longer).is_err());
        }
    }

    #[test]
    fn empty_windows_and_filter_names_are_refused() {
        let mut spec = stream_spec();
        spec.up_window.packets = 0;
        let err = ControlMsg::decode(&ControlMsg::NewStream(spec).encode()).unwrap_err();
        assert!(err.to_string().contains("upward window"), "{err}");
        let mut spec = stream_spec();
        spec.down.name.clear();
        let err = ControlMsg::decode(&ControlMsg::NewStream(spec).encode()).unwrap_err();
        assert!(err.to_string().contains("filter name"), "{err}");
    }
}
