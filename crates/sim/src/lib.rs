//! The simulated tree: the protocol cores of every node of a tree wired together in
//! one process, with virtual time.
//!
//! * [`Sim`] builds the tree the way real processes do: the front-end's core gets a
//!   launch plan, every [`Event::StartChildren`] makes the children's cores, and
//!   their links come up after a launch delay. Each link has its own delay (drawn
//!   from [`SimConfig::delay`], fixed for the link, so frames stay in order).
//! * Nodes can be killed at chosen times ([`Sim::kill_at`]); their links close and
//!   their peers notice after the link's delay, as over a real socket; the parent's
//!   driver then hears how the process ended ([`EXIT_NEWS_DELAY`] later).
//! * Nodes can be stopped and continued ([`Sim::stop_at`], [`Sim::cont_at`]), as by
//!   SIGSTOP and SIGCONT: a stopped node handles nothing and sends nothing while its
//!   links stay open and what arrives for it waits. Only heartbeats and the silence
//!   limit ([`SimConfig::liveness`], off by default) let its peers notice it.
//! * Back-ends run a small tool ([`BackendTool`]) that answers requests by tag, and
//!   can be made slow (read one packet per period) or silent (never answer).
//! * The front-end's tool is the test itself: [`Sim::send`], [`Sim::read`] and
//!   [`Sim::run_until`].
//! * [`chaos`] runs reductions while random nodes are killed or stopped, and counts
//!   what went wrong (`treecast bench chaos --sim`).
//!
//! Everything is deterministic for a given seed. Per-node counters ([`NodeStats`])
//! say how many inputs and bytes each node handled, and the most payload bytes it
//! ever held, which flow control bounds.

pub mod chaos;

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, VecDeque};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use treecast_proto::filters::FilterRegistry;
use treecast_proto::topology::Topology;
use treecast_proto::wire::{
    decode_values, encode_values, AttachPoint, Frame, FrameHeader, LaunchPlan, Value, Window,
};
use treecast_proto::{
    ChildLaunch, ClockConfig, ClockSource, Command, CommandError, Delivery, Event, LinkId, LinkTable,
    LivenessLimits, Node, NodeConfig, Peer, Role,
};

/// The requests a simulated back-end answers, as the generic back-end (`treecast
/// backend`) does: one scenario runs in both.
pub use treecast_proto::wire::requests::{TAG_ADD_RANK, TAG_BURST, TAG_BURST_BYTES, TAG_RANK};

/// How long after a killed node's link to its parent closes the parent's driver
/// reports how its process ended (`Command::ChildExited`), as a real driver does once
/// it has reaped the process and read the end of its stderr.
pub const EXIT_NEWS_DELAY: Duration = Duration::from_millis(1);

/// How the simulated tree is built and run.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// The tree.
    pub topology: Topology,
    /// Seed of every random choice.
    pub seed: u64,
    /// Each link's delay is drawn from this range, once.
    pub delay: (Duration, Duration),
    /// Time from a parent's start request to the child's link being up.
    pub launch_delay: Duration,
    /// Each child's link comes up later by up to this much more, drawn per child:
    /// real processes connect one after another, so a parent's links do not share a
    /// phase. Zero (the default) draws nothing.
    pub launch_spread: Duration,
    /// Start-up time limit per level.
    pub startup_timeout: Duration,
    /// Start without children that fail.
    pub allow_missing: bool,
    /// Attach mode: back-ends are started "by someone else" once the front-end has
    /// their addresses, and have this long to connect.
    pub attach: Option<Duration>,
    /// The filters every node has.
    pub registry: FilterRegistry,
    /// What the front-end keeps per stream for the tool.
    pub tool_window: Window,
    /// Heartbeats and the silence limit on every node (`None`, the default: off, so
    /// that the events and bytes per wave of `treecast bench sim` stay comparable;
    /// killed nodes are still noticed, by their links closing, but stopped ones are not).
    pub liveness: Option<LivenessLimits>,
    /// How long the children of a lost comm node have to rejoin under its parent
    /// (`None`, the default: no recovery, a lost comm node's sub-tree is lost with it).
    pub rejoin: Option<Duration>,
    /// Each frame is delayed by up to this much more than its link's delay, drawn
    /// per frame (frames of one link still arrive in order): links whose two
    /// directions differ from moment to moment, as a real host's wake-ups make them.
    /// Zero (the default) draws nothing.
    pub jitter: Duration,
    /// Virtual clocks for the global clock (`None`, the default: the nodes measure
    /// no clocks).
    pub clocks: Option<SimClocks>,
}

/// Every node's clock in the simulated tree: virtual time read from a fixed epoch,
/// distorted per node as a `TREECAST_CLOCK_DISTORT` value says.
#[derive(Debug, Clone)]
pub struct SimClocks {
    /// The distortion knob (see `treecast_proto::clock_distortion`); the
    /// front-end's clock is the true one.
    pub knob: String,
    /// The probing schedule.
    pub config: ClockConfig,
}

/// The true clock reading at the simulation's start, nanoseconds (2027-01-15).
pub const SIM_EPOCH_NS: i64 = 1_800_000_000_000_000_000;

impl SimConfig {
    /// A configuration with small delays and generous limits.
    pub fn new(topology: Topology, seed: u64) -> Self {
        SimConfig {
            topology,
            seed,
            delay: (Duration::from_micros(5), Duration::from_micros(50)),
            launch_delay: Duration::from_millis(2),
            launch_spread: Duration::ZERO,
            startup_timeout: Duration::from_secs(30),
            allow_missing: false,
            attach: None,
            registry: FilterRegistry::builtin(),
            tool_window: Window { packets: 1 << 16, bytes: 64 << 20 },
            liveness: None,
            rejoin: None,
            jitter: Duration::ZERO,
            clocks: None,
        }
    }
}

/// How a simulated back-end's tool behaves.
#[derive(Debug, Clone, Default)]
pub struct BackendTool {
    /// Read one packet per this period (a slow consumer); zero reads at once.
    pub read_every: Duration,
    /// Never answer (a hung tool: its link stays up).
    pub silent: bool,
}

/// What one node did, for benchmarks and bounds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Inputs handled (frames, link events, commands, timeouts).
    pub inputs: u64,
    /// Frames received.
    pub frames_in: u64,
    /// Payload bytes received.
    pub bytes_in: u64,
    /// Frames sent (one per destination link).
    pub frames_out: u64,
    /// Payload bytes sent.
    pub bytes_out: u64,
    /// Most payload bytes held at once (what flow control bounds).
    pub max_held_bytes: u64,
    /// Times its timer fired (the node woke for a deadline: heartbeats, silence
    /// limits, clock rounds, wave time-outs).
    pub wakeups: u64,
    /// Links and children its timer work visited ([`Node::timer_visits`]).
    pub timer_visits: u64,
}

#[derive(Debug)]
struct SimLink {
    peer: usize,
    peer_link: Option<LinkId>,
    delay: Duration,
    open: bool,
    /// When the latest frame sent on it arrives.
    last_at: Instant,
}

struct SimNode {
    core: Node,
    links: LinkTable<SimLink>,
    alive: bool,
    /// Stopped (SIGSTOP): what arrives waits in `held` until it is continued.
    stopped: bool,
    /// What arrived for a stopped node, in order.
    held: Vec<Action>,
    over_handled: bool,
    timer_gen: u64,
    tool: BackendTool,
    /// The node it is linked under now (a rejoined orphan's new parent), once linked.
    parent: Option<usize>,
    /// The number of its current try at rejoining; each try that connects or times
    /// out moves it on, so the other outcome of that try is ignored.
    rejoin_attempt: u64,
    /// Back-end: answers refused for lack of credit, per stream, to retry when writable.
    outbox: BTreeMap<u32, VecDeque<Frame>>,
    /// Back-end: a slow reader's next read is scheduled.
    read_scheduled: bool,
    stats: NodeStats,
}

#[derive(Debug)]
enum Action {
    Deliver {
        node: usize,
        link: LinkId,
        frame: Frame,
    },
    Closed {
        node: usize,
        link: LinkId,
        reason: Option<String>,
    },
    Connect {
        parent: usize,
        child: usize,
    },
    /// An orphan connects to its fallback address to rejoin the tree (its try
    /// number `attempt`: a try that timed out meanwhile is stale).
    Rejoin {
        parent: usize,
        child: usize,
        attempt: u64,
    },
    /// The time the orphan's driver gives try `attempt` is up.
    RejoinTimeout {
        child: usize,
        attempt: u64,
    },
    Timer {
        node: usize,
        generation: u64,
    },
    Kill {
        node: usize,
    },
    Stop {
        node: usize,
    },
    Cont {
        node: usize,
    },
    Read {
        node: usize,
    },
    Exited {
        parent: usize,
        node_id: u32,
        detail: String,
    },
}

struct Scheduled {
    at: Instant,
    seq: u64,
    action: Action,
}

impl PartialEq for Scheduled {
    fn eq(&self, other: &Self) -> bool {
        (self.at, self.seq) == (other.at, other.seq)
    }
}
impl Eq for Scheduled {}
impl PartialOrd for Scheduled {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scheduled {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        (self.at, self.seq).cmp(&(other.at, other.seq))
    }
}

/// What the front-end reported while the simulation ran.
#[derive(Debug, Clone, Default)]
pub struct FrontEndLog {
    /// Launch outcome: `Ok(missing ranks)` or the failure.
    pub launched: Option<Result<Vec<(treecast_proto::wire::RankSet, String)>, String>>,
    /// Every other event, in order.
    pub events: Vec<Event>,
}

/// A simulated tree. See the crate documentation.
pub struct Sim {
    config: SimConfig,
    rng: StdRng,
    start: Instant,
    now: Instant,
    seq: u64,
    queue: BinaryHeap<Reverse<Scheduled>>,
    nodes: Vec<Option<SimNode>>,
    /// Back-end tools set before launch, by rank.
    tools: BTreeMap<u32, BackendTool>,
    /// Attach-mode back-ends waiting for the front-end's addresses.
    attach_waiting: Vec<(usize, usize)>,
    /// Back-ends adopted while the tree runs: their rank and parent.
    adopted: BTreeMap<usize, (u32, usize)>,
    /// Results of collective operations that reached back-ends, by rank, until taken.
    collective_results: BTreeMap<u32, Vec<Frame>>,
    log: FrontEndLog,
    /// Invariant violations seen (they fail the property tests).
    violations: Vec<String>,
    /// Every frame sent and every event of every node, in order, once asked for
    /// ([`Sim::record_trace`]).
    trace: Option<Vec<String>>,
}

/// Why a simulated call failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// The front-end refused a command.
    #[error("front-end: {0}")]
    Command(#[from] CommandError),
    /// Nothing happened any more before the condition held.
    #[error("the simulation went idle at {0:?} before the condition held")]
    Idle(Duration),
    /// Virtual time ran past the limit.
    #[error("virtual time limit {0:?} reached before the condition held")]
    Limit(Duration),
}

impl Sim {
    /// A simulated tree, not started yet.
    pub fn new(config: SimConfig) -> Sim {
        let n = config.topology.len();
        let start = Instant::now();
        Sim {
            rng: StdRng::seed_from_u64(config.seed),
            config,
            start,
            now: start,
            seq: 0,
            queue: BinaryHeap::new(),
            nodes: (0..n).map(|_| None).collect(),
            tools: BTreeMap::new(),
            attach_waiting: Vec::new(),
            adopted: BTreeMap::new(),
            collective_results: BTreeMap::new(),
            log: FrontEndLog::default(),
            violations: Vec::new(),
            trace: None,
        }
    }

    /// Records from now on every frame each node sends (virtual time, node, link,
    /// the whole frame) and every event it reports: two runs of one seed must give
    /// the same trace, byte for byte.
    pub fn record_trace(&mut self) {
        self.trace.get_or_insert_with(Vec::new);
    }

    /// What [`Sim::record_trace`] recorded so far, one line per frame or event.
    pub fn trace(&self) -> &[String] {
        self.trace.as_deref().unwrap_or_default()
    }

    /// Virtual time since the simulation started.
    pub fn elapsed(&self) -> Duration {
        self.now - self.start
    }

    /// The current virtual instant.
    pub fn now(&self) -> Instant {
        self.now
    }

    /// How back-end `rank` behaves (set before [`Sim::launch`] or at any time).
    pub fn set_tool(&mut self, rank: u32, tool: BackendTool) {
        if let Some(id) = self.backend_node(rank) {
            if let Some(n) = self.nodes[id].as_mut() {
                n.tool = tool.clone();
            }
        }
        self.tools.insert(rank, tool);
    }

    fn backend_node(&self, rank: u32) -> Option<usize> {
        self.config.topology.leaf_of_rank(rank)
    }

    /// Node id of the back-end with `rank`.
    pub fn node_of_rank(&self, rank: u32) -> Option<usize> {
        self.backend_node(rank)
    }

    /// A command to back-end `rank`'s core (one of the launch or one adopted since)
    /// at the current time.
    ///
    /// # Errors
    /// What the core refused; [`CommandError::ShutDown`] for a rank with no live process.
    pub fn backend_command(&mut self, rank: u32, cmd: Command) -> Result<(), CommandError> {
        let adopted = self.adopted.iter().find(|(_, &(r, _))| r == rank).map(|(&id, _)| id);
        let Some(id) = adopted.or_else(|| self.backend_node(rank)) else {
            return Err(CommandError::ShutDown);
        };
        let now = self.now;
        let Some(n) = self.nodes[id].as_mut().filter(|n| n.alive) else { return Err(CommandError::ShutDown) };
        n.stats.inputs += 1;
        let r = n.core.handle_command(cmd, now);
        self.drain(id);
        r
    }

    /// The results of collective operations that reached back-end `rank` since the
    /// last call, in order ([`Event::CollectiveDone`]'s frames).
    pub fn take_collective_results(&mut self, rank: u32) -> Vec<Frame> {
        self.collective_results.remove(&rank).unwrap_or_default()
    }

    /// What the front-end reported so far.
    pub fn log(&self) -> &FrontEndLog {
        &self.log
    }

    /// Invariant violations seen so far (empty when all is well).
    pub fn violations(&self) -> &[String] {
        &self.violations
    }

    /// Counters of node `id`, if it was ever started.
    pub fn stats(&self, id: usize) -> Option<NodeStats> {
        self.nodes.get(id)?.as_ref().map(|n| NodeStats { timer_visits: n.core.timer_visits(), ..n.stats })
    }

    /// The core of node `id`, if it was started.
    pub fn core(&self, id: usize) -> Option<&Node> {
        self.nodes.get(id)?.as_ref().map(|n| &n.core)
    }

    /// True while node `id` runs.
    pub fn alive(&self, id: usize) -> bool {
        self.nodes.get(id).and_then(Option::as_ref).is_some_and(|n| n.alive)
    }

    /// The node that started node `id`: its topology parent, or the node that
    /// adopted or spawned it.
    pub fn parent_of(&self, id: usize) -> Option<usize> {
        match self.adopted.get(&id) {
            Some(&(_, parent)) => Some(parent),
            None => self.config.topology.node(id).parent,
        }
    }

    /// Has node `parent` adopt a new back-end of rank `rank` while the tree runs;
    /// returns the new node's id.
    ///
    /// # Errors
    /// What the parent's core refused.
    pub fn adopt(&mut self, parent: usize, rank: u32) -> Result<usize, CommandError> {
        let id = self.nodes.len();
        self.adopted.insert(id, (rank, parent));
        let launch = ChildLaunch {
            node_id: id as u32,
            name: format!("back-end rank {rank} on sim (node {id})"),
            host: "sim".into(),
            is_backend: true,
            first_rank: rank,
            backends: 1,
            attach: false,
            spawned: None,
        };
        let now = self.now;
        let Some(p) = self.nodes.get_mut(parent).and_then(Option::as_mut).filter(|p| p.alive) else {
            return Err(CommandError::ShutDown);
        };
        p.stats.inputs += 1;
        let r = p.core.handle_command(Command::Adopt(launch), now);
        self.drain(parent);
        r.map(|()| id)
    }

    fn schedule(&mut self, at: Instant, action: Action) {
        self.seq += 1;
        self.queue.push(Reverse(Scheduled { at, seq: self.seq, action }));
    }

    fn plan(&self) -> LaunchPlan {
        let c = &self.config;
        let mut plan = LaunchPlan::local(
            format!("sim{:x}", c.seed),
            c.topology.to_mrnet(),
            c.topology.backends() as u32,
        );
        plan.startup_timeout_ms = c.startup_timeout.as_millis().min(u128::from(u32::MAX)) as u32;
        plan.attach_ms = c.attach.map_or(0, |a| a.as_millis().clamp(1, u128::from(u32::MAX)) as u32);
        plan.allow_missing = c.allow_missing;
        // Heartbeats are off unless asked for: `treecast bench sim` compares events and
        // bytes per wave, which a heartbeat per link and second would blur; killed
        // nodes close their links instead.
        (plan.heartbeat_ms, plan.dead_after_ms) = match c.liveness {
            Some(l) => (millis(l.heartbeat), millis(l.dead_after)),
            None => (0, 0),
        };
        plan.rejoin_ms = c.rejoin.map_or(0, millis);
        plan
    }

    fn make_node(&mut self, id: usize) {
        let topo = &self.config.topology;
        let size = topo.backends() as u32;
        let role =
            match (id, self.adopted.get(&id), (id < topo.len()).then(|| topo.backend_rank(id)).flatten()) {
                (0, ..) => Role::FrontEnd,
                (_, Some(&(rank, _)), _) | (_, None, Some(rank)) => Role::BackEnd { rank, size },
                (_, None, None) => Role::CommNode,
            };
        if self.nodes.len() <= id {
            self.nodes.resize_with(id + 1, || None);
        }
        let name = match role {
            Role::FrontEnd => "front-end".to_owned(),
            Role::CommNode => format!("comm node (node {id})"),
            Role::BackEnd { rank, .. } => format!("back-end rank {rank}"),
        };
        let mut core = Node::new(NodeConfig {
            role,
            node_id: id as u32,
            name,
            registry: self.config.registry.clone(),
            tool_window: self.config.tool_window,
        });
        if let Some(clocks) = &self.config.clocks {
            let mut source = ClockSource::new(self.start, SIM_EPOCH_NS);
            if let Ok(Some(d)) = treecast_proto::clock_distortion(&clocks.knob, id as u32, SIM_EPOCH_NS) {
                source.distortion = d;
            }
            core.set_clock(source, clocks.config);
        }
        if let Role::BackEnd { .. } = role {
            // Comm nodes take the limits from their plan; a back-end from its driver.
            core.set_liveness(self.config.liveness, self.now);
            core.set_rejoin(self.config.rejoin);
        }
        let tool = match role {
            Role::BackEnd { rank, .. } => self.tools.get(&rank).cloned().unwrap_or_default(),
            _ => BackendTool::default(),
        };
        self.nodes[id] = Some(SimNode {
            core,
            links: LinkTable::new(),
            alive: true,
            stopped: false,
            held: Vec::new(),
            over_handled: false,
            timer_gen: 0,
            tool,
            parent: None,
            rejoin_attempt: 0,
            outbox: BTreeMap::new(),
            read_scheduled: false,
            stats: NodeStats::default(),
        });
    }

    /// Starts the tree and runs until the front-end reports it up or failed.
    ///
    /// # Errors
    /// The start-up failed (the front-end's message), or the simulation stalled.
    pub fn launch(&mut self) -> Result<Vec<(treecast_proto::wire::RankSet, String)>, String> {
        self.begin_launch()?;
        self.finish_launch()
    }

    /// Hands the launch plan to the front-end and returns at once, so that a test can
    /// run the start-up step by step ([`Sim::run_until`]) and strike nodes during it.
    ///
    /// # Errors
    /// The front-end refused the plan.
    pub fn begin_launch(&mut self) -> Result<(), String> {
        self.make_node(0);
        let plan = self.plan();
        let now = self.now;
        if let Some(n) = self.nodes[0].as_mut() {
            n.stats.inputs += 1;
            if let Err(e) = n.core.handle_command(Command::Launch(Box::new(plan)), now) {
                return Err(e.to_string());
            }
        }
        self.drain(0);
        Ok(())
    }

    /// True once the front-end has reported the start-up up or failed.
    pub fn launch_ended(&self) -> bool {
        self.log.launched.is_some()
    }

    /// Runs a start-up begun with [`Sim::begin_launch`] until the front-end reports it
    /// up (the ranks that did not start, with why) or failed.
    ///
    /// # Errors
    /// The start-up failed (the front-end's message), or the simulation stalled.
    pub fn finish_launch(&mut self) -> Result<Vec<(treecast_proto::wire::RankSet, String)>, String> {
        // Two start-up limits per level at most (see the join limits of the core).
        let limit = self.config.startup_timeout * (2 * self.config.topology.depth() as u32 + 2);
        if let Err(e) = self.run_until(|s| s.log.launched.is_some(), limit) {
            return Err(e.to_string());
        }
        self.log.launched.clone().unwrap_or_else(|| Err("no launch outcome".into()))
    }

    /// A command to the front-end's core at the current time.
    ///
    /// # Errors
    /// What the core refused.
    pub fn command(&mut self, cmd: Command) -> Result<(), CommandError> {
        let now = self.now;
        let Some(n) = self.nodes[0].as_mut().filter(|n| n.alive) else { return Err(CommandError::ShutDown) };
        n.stats.inputs += 1;
        let r = n.core.handle_command(cmd, now);
        self.drain(0);
        r
    }

    /// Sends a frame down from the front-end, running the simulation while it waits for credit.
    ///
    /// # Errors
    /// What the core refused (other than a lack of credit), or a stall.
    pub fn send(&mut self, frame: Frame, limit: Duration) -> Result<(), SimError> {
        let deadline = self.elapsed() + limit;
        let mut frame = frame;
        loop {
            match self.command(Command::Send(frame)) {
                Ok(()) => return Ok(()),
                Err(CommandError::Blocked(back)) => frame = back,
                Err(e) => return Err(e.into()),
            }
            let stream = frame.header.stream;
            let mut writable = false;
            let seen = self.log.events.len();
            self.run_until(
                |s| {
                    writable = s.log.events[seen..]
                        .iter()
                        .any(|e| matches!(e, Event::Writable { stream: w } if *w == stream));
                    writable
                },
                deadline.saturating_sub(self.elapsed()),
            )?;
        }
    }

    /// The next thing the front-end's tool reads on `stream`, running the simulation
    /// until there is one.
    ///
    /// # Errors
    /// The simulation went idle or passed `limit` first.
    pub fn read(&mut self, stream: u32, limit: Duration) -> Result<Delivery, SimError> {
        let mut got = None;
        self.run_until(
            |s| {
                got = s.try_read(stream);
                got.is_some()
            },
            limit,
        )?;
        got.ok_or(SimError::Idle(self.elapsed()))
    }

    /// The next thing the front-end's tool reads on `stream`, if one is there now.
    pub fn try_read(&mut self, stream: u32) -> Option<Delivery> {
        let n = self.nodes[0].as_mut()?;
        let d = n.core.poll_delivery(Some(stream));
        if d.is_some() {
            self.drain(0);
        }
        d
    }

    /// Kills node `id` at virtual time `at` from now (its process dies; links close).
    pub fn kill_at(&mut self, id: usize, after: Duration) {
        let at = self.now + after;
        self.schedule(at, Action::Kill { node: id });
    }

    /// Stops node `id` once `after` of virtual time has passed, as SIGSTOP does: it
    /// handles no frame, link event or timeout and sends nothing until
    /// [`Sim::cont_at`]; its links stay open and what arrives for it waits. Peers
    /// notice only through the silence limit ([`SimConfig::liveness`]); a parent that
    /// cuts it off gives up on it, and its driver ends the process, as a real one
    /// does. The front-end (node 0) is the test's own process and is never stopped.
    pub fn stop_at(&mut self, id: usize, after: Duration) {
        let at = self.now + after;
        self.schedule(at, Action::Stop { node: id });
    }

    /// Continues node `id` once `after` of virtual time has passed, as SIGCONT does: it
    /// handles what arrived while it was stopped, in order, then its timer.
    pub fn cont_at(&mut self, id: usize, after: Duration) {
        let at = self.now + after;
        self.schedule(at, Action::Cont { node: id });
    }

    /// True while node `id` runs but is stopped.
    pub fn stopped(&self, id: usize) -> bool {
        self.nodes.get(id).and_then(Option::as_ref).is_some_and(|n| n.alive && n.stopped)
    }

    /// Runs until `done` holds, nothing is left to do, or `limit` of virtual time passes.
    ///
    /// # Errors
    /// [`SimError::Idle`] or [`SimError::Limit`] when `done` never held.
    pub fn run_until(
        &mut self,
        mut done: impl FnMut(&mut Sim) -> bool,
        limit: Duration,
    ) -> Result<(), SimError> {
        let end = self.now + limit;
        loop {
            if done(self) {
                return Ok(());
            }
            let Some(Reverse(next)) = self.queue.pop() else { return Err(SimError::Idle(self.elapsed())) };
            if next.at > end {
                self.queue.push(Reverse(next));
                self.now = end;
                return Err(SimError::Limit(limit));
            }
            self.now = self.now.max(next.at);
            self.act(next.action);
        }
    }

    /// Runs until nothing is left to do or `limit` passes.
    pub fn settle(&mut self, limit: Duration) {
        let _ = self.run_until(|_| false, limit);
    }

    fn act(&mut self, action: Action) {
        let now = self.now;
        let action = match self.hold_if_stopped(action) {
            Some(a) => a,
            None => return,
        };
        match action {
            Action::Deliver { node, link, frame } => {
                let Some(n) = self.nodes[node].as_mut().filter(|n| n.alive) else { return };
                if !n.links.get(link).is_some_and(|l| l.open) {
                    return;
                }
                n.stats.inputs += 1;
                n.stats.frames_in += 1;
                n.stats.bytes_in += frame.payload.len() as u64;
                n.core.handle_frame(link, frame, now);
                self.drain(node);
            }
            Action::Closed { node, link, reason } => {
                let Some(n) = self.nodes[node].as_mut().filter(|n| n.alive) else { return };
                match n.links.get_mut(link) {
                    Some(l) if l.open => l.open = false,
                    _ => return,
                }
                n.stats.inputs += 1;
                n.core.handle_link_closed(link, reason, now);
                self.drain(node);
            }
            Action::Connect { parent, child } => self.connect(parent, child),
            Action::Rejoin { parent, child, attempt } => self.rejoin(parent, child, attempt),
            Action::RejoinTimeout { child, attempt } => self.rejoin_timed_out(child, attempt),
            Action::Timer { node, generation } => {
                let Some(n) = self.nodes[node].as_mut().filter(|n| n.alive && n.timer_gen == generation)
                else {
                    return;
                };
                n.stats.inputs += 1;
                n.stats.wakeups += 1;
                n.core.handle_timeout(now);
                self.drain(node);
            }
            Action::Kill { node } => self.kill(node, "was killed"),
            Action::Stop { node } => {
                if let Some(n) = self.nodes.get_mut(node).and_then(Option::as_mut).filter(|n| n.alive) {
                    n.stopped = node != 0;
                }
            }
            Action::Cont { node } => self.cont(node),
            Action::Exited { parent, node_id, detail } => {
                let Some(p) = self.nodes[parent].as_mut().filter(|p| p.alive) else { return };
                p.stats.inputs += 1;
                let _ = p.core.handle_command(Command::ChildExited { node_id, detail }, now);
                self.drain(parent);
            }
            Action::Read { node } => {
                if let Some(n) = self.nodes[node].as_mut() {
                    n.read_scheduled = false;
                }
                self.backend_read(node, true);
                self.drain(node);
            }
        }
    }

    /// The node an action is for, if a stopped node would have to handle it.
    fn stopped_target(&self, action: &Action) -> Option<usize> {
        let stopped = |id: usize| self.nodes.get(id).and_then(Option::as_ref).is_some_and(|n| n.stopped);
        match *action {
            Action::Deliver { node, .. }
            | Action::Closed { node, .. }
            | Action::Timer { node, .. }
            | Action::Read { node }
            | Action::Exited { parent: node, .. } => Some(node).filter(|&n| stopped(n)),
            // Both ends take part in setting up a link.
            Action::Connect { parent, child } | Action::Rejoin { parent, child, .. } => {
                [parent, child].into_iter().find(|&n| stopped(n))
            }
            Action::RejoinTimeout { child, .. } => Some(child).filter(|&n| stopped(n)),
            Action::Kill { .. } | Action::Stop { .. } | Action::Cont { .. } => None,
        }
    }

    /// Keeps an action for a stopped node until it is continued; hands back the others.
    fn hold_if_stopped(&mut self, action: Action) -> Option<Action> {
        let Some(id) = self.stopped_target(&action) else { return Some(action) };
        // A stopped node's timer is re-armed when it continues.
        if !matches!(action, Action::Timer { .. }) {
            if let Some(n) = self.nodes[id].as_mut() {
                n.held.push(action);
            }
        }
        None
    }

    /// A stopped node continues: what arrived meanwhile is handled now, in order.
    fn cont(&mut self, id: usize) {
        let Some(n) = self.nodes.get_mut(id).and_then(Option::as_mut).filter(|n| n.alive && n.stopped) else {
            return;
        };
        n.stopped = false;
        let held = std::mem::take(&mut n.held);
        let now = self.now;
        for action in held {
            self.schedule(now, action);
        }
        self.drain(id);
    }

    /// Links a started child to its parent (both sides see the link up).
    fn connect(&mut self, parent: usize, child: usize) {
        let now = self.now;
        let (lo, hi) = self.config.delay;
        let delay = if hi > lo { self.rng.gen_range(lo..=hi) } else { lo };
        let parent_ok = self.nodes[parent].as_ref().is_some_and(|n| n.alive && !n.core.is_over());
        let child_ok = self.nodes[child].as_ref().is_some_and(|n| n.alive);
        if !child_ok {
            return;
        }
        if !parent_ok {
            // Nothing listens at the parent's address any more: a real child's connect
            // fails and its process exits with the error.
            return self.kill(child, "could not connect to its parent");
        }
        let Some(p) = self.nodes[parent].as_mut() else { return };
        let plink =
            p.links.insert(SimLink { peer: child, peer_link: None, delay, open: true, last_at: self.now });
        let Some(c) = self.nodes[child].as_mut() else { return };
        let clink = c.links.insert(SimLink {
            peer: parent,
            peer_link: Some(plink),
            delay,
            open: true,
            last_at: self.now,
        });
        c.parent = Some(parent);
        if matches!(c.core.role(), Role::CommNode) {
            // As a comm node's driver does: its children rejoin here if it is lost.
            c.core.set_parent_address(sim_address(parent));
        }
        c.stats.inputs += 1;
        c.core.handle_link_up(clink, Peer::Parent, now);
        if let Some(p) = self.nodes[parent].as_mut() {
            if let Some(l) = p.links.get_mut(plink) {
                l.peer_link = Some(clink);
            }
            p.stats.inputs += 1;
            p.core.handle_link_up(plink, Peer::Child { node_id: child as u32 }, now);
        }
        self.drain(child);
        self.drain(parent);
    }

    /// Orphan `child` reaches its fallback `parent`: linked as a new child there, or
    /// refused at once when nothing runs at that address any more.
    fn rejoin(&mut self, parent: usize, child: usize, attempt: u64) {
        match self.nodes[child].as_mut() {
            Some(c) if c.alive && c.rejoin_attempt == attempt => c.rejoin_attempt += 1,
            _ => return,
        }
        let open = self.nodes[parent].as_ref().is_some_and(|n| n.alive && !n.core.is_over());
        if open {
            return self.connect(parent, child);
        }
        let now = self.now;
        if let Some(c) = self.nodes[child].as_mut() {
            let reason = format!("connecting to {}: connection refused", sim_address(parent));
            let _ = c.core.handle_command(Command::RejoinFailed { reason }, now);
        }
        self.drain(child);
    }

    /// The orphan's driver gives up try `attempt` (its parent-to-be never answered:
    /// stopped), unless that try connected meanwhile.
    fn rejoin_timed_out(&mut self, child: usize, attempt: u64) {
        let now = self.now;
        let Some(c) = self.nodes[child].as_mut().filter(|c| c.alive && c.rejoin_attempt == attempt) else {
            return;
        };
        c.rejoin_attempt += 1;
        let reason = "the authentication got no answer in time".to_owned();
        let _ = c.core.handle_command(Command::RejoinFailed { reason }, now);
        self.drain(child);
    }

    /// Process `id` dies: every link closes, its peers notice after the link's delay.
    fn kill(&mut self, id: usize, how: &str) {
        let Some(n) = self.nodes[id].as_mut().filter(|n| n.alive) else { return };
        n.alive = false;
        // A dead node holds nothing back any more (SIGKILL ends a stopped process too).
        n.stopped = false;
        // A peer waiting to connect to this stopped node learns now that nothing listens.
        let held = std::mem::take(&mut n.held);
        let now = self.now;
        for action in held {
            if matches!(action, Action::Connect { .. } | Action::Rejoin { .. }) {
                self.schedule(now, action);
            }
        }
        let Some(n) = self.nodes[id].as_mut() else { return };
        if n.core.parent_link().is_none() && n.parent.is_none() && id != 0 {
            // Its process ended before it connected: the parent's driver would see the exit.
            if let Some(parent) = self.parent_of(id) {
                let now = self.now;
                if let Some(p) = self.nodes[parent].as_mut().filter(|p| p.alive) {
                    let exited = Command::ChildExited { node_id: id as u32, detail: how.to_owned() };
                    let _ = p.core.handle_command(exited, now);
                }
                self.drain(parent);
            }
            return;
        }
        let Some(n) = self.nodes[id].as_mut() else { return };
        let links: Vec<(usize, Option<LinkId>, Duration)> =
            n.links.iter().filter(|(_, l)| l.open).map(|(_, l)| (l.peer, l.peer_link, l.delay)).collect();
        let reason = format!("node {id} {how}");
        let parent = n.parent;
        for (peer, peer_link, delay) in links {
            if let Some(pl) = peer_link {
                let at = self.now + delay;
                self.schedule(at, Action::Closed { node: peer, link: pl, reason: Some(reason.clone()) });
                if Some(peer) == parent {
                    let news = Action::Exited { parent: peer, node_id: id as u32, detail: how.to_owned() };
                    self.schedule(at + EXIT_NEWS_DELAY, news);
                }
            }
        }
    }

    /// Sends what node `id` produced, handles its events, re-arms its timer.
    fn drain(&mut self, id: usize) {
        loop {
            let mut progressed = false;
            // The simulated links have one route: a stream's choice changes nothing here.
            while self.nodes[id].as_mut().and_then(|n| n.core.poll_stream_route()).is_some() {}
            while let Some(t) = self.nodes[id].as_mut().and_then(|n| n.core.poll_transmit()) {
                progressed = true;
                for &link in t.to.links() {
                    self.transmit(id, link, t.frame.clone());
                }
            }
            while let Some(e) = self.nodes[id].as_mut().and_then(|n| n.core.poll_event()) {
                progressed = true;
                if let Some(trace) = self.trace.as_mut() {
                    trace.push(format!("{:?} node {id} event {e:?}", self.now - self.start));
                }
                self.on_event(id, e);
            }
            if !progressed {
                break;
            }
        }
        let Some(n) = self.nodes[id].as_mut() else { return };
        let held = n.core.held_bytes();
        n.stats.max_held_bytes = n.stats.max_held_bytes.max(held);
        if n.core.is_over() && !n.over_handled && n.alive {
            n.over_handled = true;
            self.close_all(id);
            return;
        }
        if let Some(at) = n.core.poll_timeout() {
            n.timer_gen += 1;
            let generation = n.timer_gen;
            let at = at.max(self.now);
            self.schedule(at, Action::Timer { node: id, generation });
        }
    }

    fn transmit(&mut self, id: usize, link: LinkId, frame: Frame) {
        let jitter = self.config.jitter;
        let extra =
            if jitter.is_zero() { Duration::ZERO } else { self.rng.gen_range(Duration::ZERO..=jitter) };
        if let Some(trace) = self.trace.as_mut() {
            trace.push(format!("{:?} node {id} {link} {frame:?}", self.now - self.start));
        }
        let Some(n) = self.nodes[id].as_mut() else { return };
        let Some(l) = n.links.get_mut(link).filter(|l| l.open) else { return };
        let (peer, Some(peer_link), delay) = (l.peer, l.peer_link, l.delay) else { return };
        // In order on the link: never before the frame sent ahead of it.
        let at = (self.now + delay + extra).max(l.last_at);
        l.last_at = at;
        n.stats.frames_out += 1;
        n.stats.bytes_out += frame.payload.len() as u64;
        self.schedule(at, Action::Deliver { node: peer, link: peer_link, frame });
    }

    /// A node that is over closes its links once what it sent is on its way.
    fn close_all(&mut self, id: usize) {
        let Some(n) = self.nodes[id].as_mut() else { return };
        let links: Vec<(LinkId, usize, Option<LinkId>, Duration)> = n
            .links
            .iter()
            .filter(|(_, l)| l.open)
            .map(|(id, l)| (id, l.peer, l.peer_link, l.delay))
            .collect();
        for (own, ..) in &links {
            if let Some(l) = n.links.get_mut(*own) {
                l.open = false;
            }
        }
        n.alive = false;
        for (_, peer, peer_link, delay) in links {
            if let Some(pl) = peer_link {
                let at = self.now + delay;
                self.schedule(at, Action::Closed { node: peer, link: pl, reason: None });
            }
        }
    }

    fn on_event(&mut self, id: usize, e: Event) {
        match e {
            Event::StartChildren { children, .. } => self.start_children(id, children),
            Event::CloseLink { link, reason } => self.close_link(id, link, reason),
            Event::AbandonChild { node_id } => self.kill(node_id as usize, "was abandoned by its parent"),
            Event::RetireChild { node_id, link } => {
                // The shutdown queued before the close reaches the child first; the
                // driver's grace then ends a process that did not exit.
                self.close_link(id, link, "retired by its parent".into());
                self.kill_at(node_id as usize, self.config.delay.1 * 2 + Duration::from_millis(1));
            }
            Event::Rejoin { address, within } => match parse_sim_address(&address) {
                Some(parent) => {
                    let at = self.now + self.config.delay.1;
                    let attempt = self.nodes[id].as_ref().map_or(0, |n| n.rejoin_attempt);
                    self.schedule(at, Action::Rejoin { parent, child: id, attempt });
                    self.schedule(self.now + within, Action::RejoinTimeout { child: id, attempt });
                }
                None => {
                    let reason = format!("{address:?} is no address in the simulated tree");
                    let now = self.now;
                    if let Some(n) = self.nodes[id].as_mut() {
                        let _ = n.core.handle_command(Command::RejoinFailed { reason }, now);
                    }
                }
            },
            Event::CollectiveDone { frame, .. } if id != 0 => {
                if let Some(Role::BackEnd { rank, .. }) = self.nodes[id].as_ref().map(|n| n.core.role()) {
                    self.collective_results.entry(rank).or_default().push(frame);
                }
            }
            Event::Readable { .. } if id != 0 => self.backend_read(id, false),
            Event::Writable { .. } if id != 0 => self.backend_flush(id),
            Event::AttachPoints(_) if id == 0 => {
                for (parent, child) in std::mem::take(&mut self.attach_waiting) {
                    let at = self.now + self.config.launch_delay;
                    self.schedule(at, Action::Connect { parent, child });
                }
                self.log.events.push(Event::AttachPoints(Vec::new()));
            }
            Event::Ready { missing, .. } if id == 0 => self.log.launched = Some(Ok(missing)),
            Event::StartupFailed { message } if id == 0 => self.log.launched = Some(Err(message)),
            other if id == 0 => self.log.events.push(other),
            _ => {}
        }
    }

    fn close_link(&mut self, id: usize, link: LinkId, reason: String) {
        let Some(n) = self.nodes[id].as_mut() else { return };
        let Some(l) = n.links.get_mut(link) else { return };
        if !l.open {
            return;
        }
        l.open = false;
        let (peer, peer_link, delay) = (l.peer, l.peer_link, l.delay);
        if let Some(pl) = peer_link {
            let at = self.now + delay;
            self.schedule(at, Action::Closed { node: peer, link: pl, reason: Some(reason) });
        }
    }

    fn start_children(&mut self, parent: usize, children: Vec<ChildLaunch>) {
        let mut own = Vec::new();
        for c in children {
            let child = c.node_id as usize;
            if c.spawned.is_some() {
                self.adopted.insert(child, (c.first_rank, parent));
            }
            self.make_node(child);
            if c.attach {
                own.push(AttachPoint {
                    rank: c.first_rank,
                    node_id: c.node_id,
                    address: format!("sim:{parent}"),
                });
                self.attach_waiting.push((parent, child));
            } else {
                let mut at = self.now + self.config.launch_delay;
                if !self.config.launch_spread.is_zero() {
                    at += self.rng.gen_range(Duration::ZERO..=self.config.launch_spread);
                }
                self.schedule(at, Action::Connect { parent, child });
            }
        }
        if self.config.attach.is_some() {
            let now = self.now;
            if let Some(n) = self.nodes[parent].as_mut() {
                let _ = n.core.handle_command(Command::OwnAttachPoints(own), now);
            }
        }
    }

    /// A back-end's tool reads what it can and answers.
    fn backend_read(&mut self, id: usize, scheduled: bool) {
        let now = self.now;
        let Some(n) = self.nodes[id].as_mut().filter(|n| n.alive) else { return };
        let slow = n.tool.read_every > Duration::ZERO;
        if slow && n.read_scheduled {
            return;
        }
        if slow && !scheduled {
            n.read_scheduled = true;
            let at = now + n.tool.read_every;
            self.schedule(at, Action::Read { node: id });
            return;
        }
        let mut answers = Vec::new();
        let limit = if slow { 1 } else { usize::MAX };
        let mut read = 0;
        while read < limit {
            let Some(d) = n.core.poll_delivery(None) else { break };
            read += 1;
            if let (Delivery::Packet(f), false) = (d, n.tool.silent) {
                let Role::BackEnd { rank, .. } = n.core.role() else { break };
                answers.extend(answer(rank, &f));
            }
        }
        for a in answers {
            n.outbox.entry(a.header.stream).or_default().push_back(a);
        }
        let more = slow && n.core.has_delivery(None);
        self.backend_flush(id);
        if more {
            if let Some(n) = self.nodes[id].as_mut() {
                n.read_scheduled = true;
                let at = now + n.tool.read_every;
                self.schedule(at, Action::Read { node: id });
            }
        }
    }

    /// A back-end sends the answers it has, as far as credit allows.
    fn backend_flush(&mut self, id: usize) {
        let now = self.now;
        let Some(n) = self.nodes[id].as_mut() else { return };
        for queue in n.outbox.values_mut() {
            while let Some(f) = queue.pop_front() {
                match n.core.handle_command(Command::Send(f), now) {
                    Ok(()) => n.stats.inputs += 1,
                    Err(CommandError::Blocked(back)) => {
                        queue.push_front(back);
                        break;
                    }
                    Err(_) => {}
                }
            }
        }
        n.outbox.retain(|_, q| !q.is_empty());
    }
}

/// A duration in whole milliseconds as a launch plan carries it, at least 1.
/// The address node `id` is reached at in the simulated tree, as a fallback for rejoins.
fn sim_address(id: usize) -> String {
    format!("sim:{id}")
}

fn parse_sim_address(address: &str) -> Option<usize> {
    address.strip_prefix("sim:")?.parse().ok()
}

fn millis(d: Duration) -> u32 {
    d.as_millis().clamp(1, u128::from(u32::MAX)) as u32
}

/// A back-end's answer to a request, by tag.
fn answer(rank: u32, request: &Frame) -> Vec<Frame> {
    let values = decode_values(&request.payload).unwrap_or_default();
    let first = values.first().and_then(Value::as_i64).unwrap_or(0);
    let one = |v: Value| {
        let mut payload = Vec::new();
        encode_values(&[v], &mut payload);
        Frame::new(FrameHeader::data(request.header.stream, request.header.tag, rank), payload)
    };
    match request.header.tag {
        TAG_BURST_BYTES => {
            let size = values.get(1).and_then(Value::as_i64).unwrap_or(0).clamp(0, 1 << 24) as usize;
            (0..first.max(0)).map(|_| one(Value::Str("x".repeat(size)))).collect()
        }
        TAG_ADD_RANK => vec![one(Value::Int((first + i64::from(rank)) as i32))],
        TAG_RANK => {
            let mut payload = Vec::new();
            encode_values(&[Value::UIntArray(vec![rank]), Value::IntArray(vec![first as i32])], &mut payload);
            vec![Frame::new(FrameHeader::data(request.header.stream, request.header.tag, rank), payload)]
        }
        TAG_BURST => (0..first.max(0)).map(|_| one(Value::Int(1))).collect(),
        _ => vec![one(Value::Int(0))],
    }
}

/// A data frame from the front-end carrying one `%d`.
pub fn request(stream: u32, tag: i32, value: i32) -> Frame {
    requests(stream, tag, &[value])
}

/// A data frame from the front-end carrying `%d` values.
pub fn requests(stream: u32, tag: i32, values: &[i32]) -> Frame {
    let mut payload = Vec::new();
    let values: Vec<Value> = values.iter().map(|&v| Value::Int(v)).collect();
    encode_values(&values, &mut payload);
    Frame::new(FrameHeader::data(stream, tag, u32::MAX), payload)
}
