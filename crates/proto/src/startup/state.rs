//! What a node keeps of its start-up and of its children: the state [`crate::Node`]
//! holds, apart from the behaviour (`startup.rs`) that changes it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use treecast_wire::{AttachPoint, ControlMsg, LaunchPlan, LinkId, RankSet, SpawnOrder};

/// A child the driver must start (or, in attach mode, wait for).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChildLaunch {
    /// Its node id (it authenticates as this).
    pub node_id: u32,
    /// Its name in messages, e.g. `comm node n3 (node 5)` or `back-end rank 7 on n3 (node 12)`.
    pub name: String,
    /// The host it runs on, as the topology names it.
    pub host: String,
    /// True for a back-end, false for a comm node.
    pub is_backend: bool,
    /// Its first back-end rank (a back-end's own rank).
    pub first_rank: u32,
    /// Back-ends in its sub-tree.
    pub backends: u32,
    /// Attach mode: someone else starts it; it connects to the address this node reports.
    pub attach: bool,
    /// Started while the tree runs by a spawn: what it runs and its group (`None`:
    /// one of the tree's own, started from the plan).
    pub spawned: Option<Arc<SpawnOrder>>,
}

/// Where a child is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ChildState {
    /// Its process is starting (or, attach mode, awaited); no link yet.
    Launching,
    /// Linked, not yet joined.
    Connected,
    /// Reachable: its ranks take part in streams.
    Joined,
    /// Given up on, lost or left.
    Gone,
}

/// A child of this node.
#[derive(Debug)]
pub(crate) struct Child {
    pub(crate) node_id: u32,
    pub(crate) name: String,
    pub(crate) is_backend: bool,
    /// The ranks the plan gives it, less those it reported lost before joining.
    pub(crate) expected: RankSet,
    /// The ranks reachable through it now.
    pub(crate) ranks: RankSet,
    /// Comm nodes in its sub-tree, itself included.
    pub(crate) commnodes: u32,
    pub(crate) link: Option<LinkId>,
    pub(crate) state: ChildState,
    pub(super) attach: bool,
    /// Its plan (a comm node's [`ControlMsg::Plan`], a back-end's
    /// [`ControlMsg::MemberPlan`]), sent when it connects.
    pub(super) plan: Option<ControlMsg>,
    /// How its process ended, from the driver.
    pub(super) detail: Option<String>,
    /// When it is given up on if it has not reached the next state.
    pub(crate) deadline: Option<Instant>,
    /// What it has to do by the deadline, for the message.
    pub(super) late: &'static str,
    /// Time from connecting to joining.
    pub(super) join_limit: Duration,
    /// Attach mode: the back-end slots of its sub-tree, once it reported them.
    pub(super) points: Option<Vec<AttachPoint>>,
    /// Its link closed while the tree ran: the loss report waiting for its process
    /// news (see [`crate::EXIT_WAIT`]).
    pub(super) held: Option<HeldLoss>,
    /// An orphan of a lost comm node that came to rejoin (not started by this node,
    /// so no news of its process ever comes).
    pub(crate) rejoiner: bool,
    /// Its rejoin, held until this node notices the loss that orphaned it (the
    /// orphan may notice first).
    pub(crate) early_rejoin: Option<Box<ControlMsg>>,
}

/// A loss report held until the lost child's process news arrives, or until a deadline.
#[derive(Debug)]
pub(crate) struct HeldLoss {
    /// The ranks lost with the child (none during start-up, which fails the child instead).
    pub(super) ranks: RankSet,
    /// Why, so far: which node noticed, and that the link closed.
    pub(super) why: String,
    /// When it goes up without the process news.
    pub(super) until: Instant,
    /// Lost during start-up: the child fails the start-up (or goes missing) then.
    pub(super) startup: bool,
}

impl Child {
    /// An orphan that connected to rejoin, before it said what it brings back.
    pub(crate) fn rejoining(node_id: u32, deadline: Instant, limit: Duration) -> Child {
        Child {
            node_id,
            name: format!("node {node_id} (rejoining)"),
            is_backend: false,
            expected: RankSet::new(),
            ranks: RankSet::new(),
            commnodes: 0,
            link: None,
            state: ChildState::Connected,
            attach: false,
            plan: None,
            detail: None,
            deadline: Some(deadline),
            late: "did not say which ranks it brings back",
            join_limit: limit,
            points: None,
            held: None,
            rejoiner: true,
            early_rejoin: None,
        }
    }

    /// Whether it still counts (not given up on).
    pub(crate) fn alive(&self) -> bool {
        self.state != ChildState::Gone
    }

    /// `what` happened to it, with how its process ended when known. Its name says
    /// its host and node id.
    pub(super) fn failure(&self, what: &str) -> String {
        self.with_detail(format!("{} {what}", self.name))
    }

    /// `msg`, followed by how the child's process ended when the driver said so.
    pub(super) fn with_detail(&self, mut msg: String) -> String {
        if let Some(d) = &self.detail {
            msg.push_str(&format!("; the process {d}"));
        }
        msg
    }
}

/// What a node keeps of its start-up: the start-up under way, the plan it started
/// its children from (kept to start more later) and the deadlines of children not
/// heard from yet.
#[derive(Debug, Default)]
pub(crate) struct StartupState {
    /// Start-up bookkeeping, dropped once the node runs.
    pub(crate) current: Option<Startup>,
    /// The plan this node started its children from (kept to start more later).
    pub(crate) plan: Option<Arc<LaunchPlan>>,
    /// The host this node runs on, from its plan.
    pub(crate) own_host: String,
    /// Earliest deadline of a child not yet joined.
    pub(crate) child_deadline: Option<Instant>,
    /// Earliest time a held loss report goes up without its process news.
    pub(crate) loss_deadline: Option<Instant>,
    /// Back-end: its join went ahead of its link as an announcement (a light
    /// join), so its first link does not send it again.
    pub(crate) announced: bool,
    /// Back-end: its member plan's zero-copy threshold, for the driver's route.
    pub(crate) zero_copy_min: Option<usize>,
    /// Back-end: its member plan's stall limit of striped links, for the driver's route.
    pub(crate) stripe_stall: Option<std::time::Duration>,
}

/// Start-up bookkeeping, dropped once the node runs.
#[derive(Debug)]
pub(crate) struct Startup {
    /// Ranks that did not start, and why.
    pub(super) missing: Vec<(RankSet, String)>,
    /// Attach mode: how long back-ends have to connect once their addresses are out.
    pub(super) attach: Option<Duration>,
    /// Attach mode: this node's own back-end slots, from the driver.
    pub(super) own_points: Option<Vec<AttachPoint>>,
    /// Attach mode: the addresses went up (or, at the front-end, out).
    pub(super) points_sent: bool,
}
