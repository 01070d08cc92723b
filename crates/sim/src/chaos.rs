//! Chaos runs in the simulated tree: reductions while random comm nodes and back-ends
//! are killed or stopped, with heartbeats and the silence limit on, in virtual time.
//! `treecast bench chaos --sim` prints what [`run`] finds; the tests assert on it.
//!
//! * [`ChaosConfig`] says which trees ([`ChaosTrees`]: one given tree, or a new random
//!   one per run), how many waves and faults, and the silence limit.
//! * [`run`] launches one tree and runs its waves; [`ChaosRun`] counts what went
//!   wrong, the same things the real-process harness counts.
//!
//! Every wave asks each rank for `x + rank` through the equivalence-class filter, so
//! each rank's answer is checked, not only a sum. Everything is deterministic for a
//! given seed: a run that found something is repeated by running its seed alone.

use std::fmt;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use treecast_proto::filters::{decode_eq_classes, TransformKind};
use treecast_proto::topology::{Topology, TopologyError};
use treecast_proto::wire::{
    decode_values, FilterSpec, RankSet, StreamSpec, SyncMode, Value, DEFAULT_DOWN_WINDOW, DEFAULT_UP_WINDOW,
};
use treecast_proto::{Command, CommandError, Delivery, Event};

use crate::{request, Sim, SimConfig, SimError, TAG_ADD_RANK};

/// Largest random tree of `treecast bench chaos --sim`, in nodes, by default.
pub const DEFAULT_MAX_NODES: usize = 400;
/// A fault lands up to this long after it is scheduled, just before a wave is sent:
/// with link delays of 5 to 50 µs, some land before the wave, some while it is under way.
pub const FAULT_SPREAD: Duration = Duration::from_micros(200);

/// Start-up faults land up to this long after the launch begins, per level of the
/// tree: each level takes the launch delay (2 ms) plus a few link delays to come up,
/// so most land while some node is still starting.
pub const STARTUP_SPREAD_PER_LEVEL: Duration = Duration::from_millis(3);

/// The stream every run reduces on.
const STREAM: u32 = 1;

/// When the faults of a run strike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FaultPhase {
    /// Just before random waves of reductions.
    #[default]
    Reduce,
    /// While the tree starts: the launch goes on without what failed
    /// (`allow_missing`), and the waves after it check the tree that came up.
    Startup,
}

impl FaultPhase {
    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            FaultPhase::Reduce => "reduce",
            FaultPhase::Startup => "startup",
        }
    }
}

/// How many processes a run strikes: `faults`, or with a kill rate each of the
/// `processes` (comm nodes and back-ends) with that probability.
pub fn fault_count(faults: usize, kill_rate: Option<f64>, processes: usize, rng: &mut StdRng) -> usize {
    match kill_rate {
        // `gen_bool` panics outside 0..=1, NaN included; a NaN rate strikes nothing.
        Some(p) => {
            let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
            (0..processes).filter(|_| rng.gen_bool(p)).count()
        }
        None => faults,
    }
}

/// Which trees the runs use.
#[derive(Debug, Clone)]
pub enum ChaosTrees {
    /// The same tree every run.
    Fixed(Topology),
    /// A new random tree every run: depth 1 to `max_depth`, every interior node with
    /// 1 to `fanout` children (the bound drawn once per tree from 1 to `max_fanout`),
    /// at most `max_nodes` nodes.
    Random {
        /// Deepest tree drawn.
        max_depth: usize,
        /// Largest fan-out drawn.
        max_fanout: usize,
        /// Largest tree drawn, in nodes (the front-end included).
        max_nodes: usize,
    },
}

impl ChaosTrees {
    /// Random trees of depth 1 to 5 and fan-out 1 to 32, of at most `max_nodes` nodes.
    pub fn random(max_nodes: usize) -> ChaosTrees {
        ChaosTrees::Random { max_depth: 5, max_fanout: 32, max_nodes }
    }
}

/// How chaos runs are made.
#[derive(Debug, Clone)]
pub struct ChaosConfig {
    /// The trees.
    pub trees: ChaosTrees,
    /// Reductions per run.
    pub waves: usize,
    /// Nodes killed or stopped per run, each just before a random wave (or during
    /// start-up).
    pub faults: usize,
    /// Instead of `faults`: each comm node and back-end is struck with this probability.
    pub kill_rate: Option<f64>,
    /// When the faults strike; a run with seed `s` takes `during[s % len]`, so a seed
    /// alone repeats its run (empty: reductions only).
    pub during: Vec<FaultPhase>,
    /// Share of the faults that stop a node (SIGSTOP) rather than kill it (SIGKILL).
    pub stop_fraction: f64,
    /// Silence limit of every node (heartbeats go four times per limit, at most once a
    /// second), in virtual time.
    pub dead_after: Duration,
    /// How long the orphans of a lost comm node have to rejoin (`None`: recovery off).
    pub rejoin: Option<Duration>,
}

impl ChaosConfig {
    /// Random trees of at most [`DEFAULT_MAX_NODES`] nodes, 20 waves, 2 faults of which
    /// 30 % are stops, a silence limit of 2 s, recovery on with the default rejoin
    /// limit of real trees.
    pub fn new(trees: ChaosTrees) -> ChaosConfig {
        ChaosConfig {
            trees,
            waves: 20,
            faults: 2,
            kill_rate: None,
            during: vec![FaultPhase::Reduce],
            stop_fraction: 0.3,
            dead_after: Duration::from_secs(2),
            rejoin: Some(treecast_proto::DEFAULT_REJOIN_WITHIN),
        }
    }

    /// How long one wave may take, in virtual time, before it counts as a hang: a
    /// stopped node may hold it up for the silence limit before it is cut off.
    pub fn wave_limit(&self) -> Duration {
        self.dead_after * 3 + Duration::from_secs(10)
    }

    /// The phase of the run with `seed`.
    pub fn phase_of(&self, seed: u64) -> FaultPhase {
        match self.during.len() {
            0 => FaultPhase::Reduce,
            n => self.during[(seed % n as u64) as usize],
        }
    }
}

/// Why a chaos run could not be made (what it found is in [`ChaosRun`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChaosError {
    /// The configuration asks for nothing or for something impossible.
    #[error("chaos runs: {0}")]
    Config(&'static str),
    /// The random tree of a run does not build.
    #[error(
        "chaos run with seed {seed}: the random tree does not build: {source}; report this with the seed"
    )]
    Tree {
        /// The run's seed.
        seed: u64,
        /// What the topology parser said.
        #[source]
        source: TopologyError,
    },
    /// The tree did not start (no fault happens before the start, so this is a bug).
    #[error("chaos run with seed {seed}: the simulated tree did not start: {message}; repeat the run alone with this seed to look at it")]
    Launch {
        /// The run's seed.
        seed: u64,
        /// What the front-end reported.
        message: String,
    },
    /// The front-end refused the stream of the run.
    #[error("chaos run with seed {seed}: the front-end refused the stream: {source}")]
    Stream {
        /// The run's seed.
        seed: u64,
        /// What it said (boxed: a refused command may carry a whole frame).
        #[source]
        source: Box<CommandError>,
    },
}

/// A node of the tree that was killed or stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fault {
    /// Its node id.
    pub node: usize,
    /// `comm node N` or `back-end rank R`.
    pub what: String,
    /// Stopped (SIGSTOP) rather than killed (SIGKILL).
    pub stop: bool,
    /// When, in virtual time since the run started.
    pub at: Duration,
    /// Struck while the tree was starting.
    pub during_startup: bool,
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SIG{} {}", if self.stop { "STOP" } else { "KILL" }, self.what)?;
        if self.during_startup {
            write!(f, " during start-up")?;
        }
        Ok(())
    }
}

/// What one chaos run found.
#[derive(Debug, Clone, Default)]
pub struct ChaosRun {
    /// The run's seed: running it alone with this seed repeats it.
    pub seed: u64,
    /// Nodes of its tree, the front-end included.
    pub nodes: usize,
    /// Back-ends of its tree.
    pub backends: usize,
    /// Depth of its tree.
    pub depth: usize,
    /// When its faults struck.
    pub phase: FaultPhase,
    /// The start-up failed (start-up faults only): the front-end's message. A failed
    /// start-up that names what failed is a correct outcome, not a finding.
    pub startup_failed: Option<String>,
    /// Waves completed.
    pub waves: usize,
    /// Nodes killed or stopped.
    pub faults: Vec<Fault>,
    /// Sends or reads that passed their limit in virtual time (the run stops there).
    pub hangs: usize,
    /// Answers with a value other than `x + rank`, or from a rank already reported
    /// lost when the wave was sent; ranks missing from a wave that were never reported
    /// lost; the stream ending while ranks it reaches were never reported lost.
    pub wrong: u64,
    /// Ranks reported lost whose back-end was neither killed nor stopped, nor under a
    /// killed or stopped comm node.
    pub live_ranks_lost: u64,
    /// Ranks under a killed or stopped comm node whose own back-end was not faulted,
    /// reported lost: with recovery off, all of them; with it on, those that could not
    /// rejoin (their fallback was faulted too, or they were stopped meanwhile).
    pub orphaned_ranks: u64,
    /// Ranks reported back after their comm node was lost.
    pub rejoined_ranks: u64,
    /// From each fault to the end of the next wave that completed, virtual time.
    pub recovery: Vec<Duration>,
    /// Nodes still running after the front-end shut down and stopped nodes were
    /// continued.
    pub left: usize,
    /// The run panicked: the panic's message.
    pub panic: Option<String>,
}

impl ChaosRun {
    /// True when the run found nothing wrong: no hang, wrong answer, live rank
    /// reported lost, node left behind or panic.
    pub fn is_clean(&self) -> bool {
        self.hangs == 0
            && self.wrong == 0
            && self.live_ranks_lost == 0
            && self.left == 0
            && self.panic.is_none()
    }
}

/// A random tree: depth 1 to `max_depth`; every node above that depth gets 1 to `k`
/// children (`k` drawn once from 1 to `max_fanout`) until `max_nodes` is reached.
///
/// # Errors
/// The generated text does not parse (a bug of this function).
pub fn random_tree(
    rng: &mut StdRng,
    max_depth: usize,
    max_fanout: usize,
    max_nodes: usize,
) -> Result<Topology, TopologyError> {
    let depth = rng.gen_range(1..=max_depth.max(1));
    let fanout = rng.gen_range(1..=max_fanout.max(1));
    tree_of_shape(rng, depth, fanout, max_nodes)
}

/// A random tree `depth` levels deep: every node above that depth gets 1 to `fanout`
/// children until `max_nodes` is reached.
///
/// # Errors
/// The generated text does not parse (a bug of this function).
pub fn tree_of_shape(
    rng: &mut StdRng,
    depth: usize,
    fanout: usize,
    max_nodes: usize,
) -> Result<Topology, TopologyError> {
    let fanout = fanout.max(1);
    let mut next = 1usize;
    let mut text = String::new();
    let mut level = vec![0usize];
    for _ in 0..depth {
        let mut below = Vec::new();
        for &parent in &level {
            let room = max_nodes.max(2).saturating_sub(next);
            if room == 0 {
                break;
            }
            let k = rng.gen_range(1..=fanout).min(room);
            text.push_str(&format!("h:{parent} =>"));
            for _ in 0..k {
                text.push_str(&format!(" h:{next}"));
                below.push(next);
                next += 1;
            }
            text.push_str(" ;\n");
        }
        level = below;
    }
    Topology::parse(&text)
}

/// One chaos run with `seed`: launches the tree, runs the waves while faults happen,
/// shuts down, and counts. A panic inside is caught and reported in
/// [`ChaosRun::panic`].
///
/// # Errors
/// The configuration is empty, the tree does not build or start, or the stream is
/// refused: see [`ChaosError`].
pub fn run(config: &ChaosConfig, seed: u64) -> Result<ChaosRun, ChaosError> {
    if config.waves == 0 {
        return Err(ChaosError::Config("at least one wave per run is needed"));
    }
    if config.dead_after.is_zero() {
        return Err(ChaosError::Config(
            "the silence limit must be above zero, or stopped nodes hang every run",
        ));
    }
    match catch_unwind(AssertUnwindSafe(|| run_inner(config, seed))) {
        Ok(r) => r,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| (*s).to_owned())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "a panic without a message".to_owned());
            Ok(ChaosRun { seed, panic: Some(message), ..ChaosRun::default() })
        }
    }
}

fn run_inner(config: &ChaosConfig, seed: u64) -> Result<ChaosRun, ChaosError> {
    let mut rng = StdRng::seed_from_u64(seed);
    let topo = match &config.trees {
        ChaosTrees::Fixed(t) => t.clone(),
        ChaosTrees::Random { max_depth, max_fanout, max_nodes } => {
            random_tree(&mut rng, *max_depth, *max_fanout, *max_nodes)
                .map_err(|source| ChaosError::Tree { seed, source })?
        }
    };
    let all = RankSet::range(0, topo.backends() as u32);
    let phase = config.phase_of(seed);
    let mut out = ChaosRun {
        seed,
        nodes: topo.len(),
        backends: topo.backends(),
        depth: topo.depth(),
        phase,
        ..ChaosRun::default()
    };
    let count = fault_count(config.faults, config.kill_rate, topo.len() - 1, &mut rng);
    let mut sim_config = SimConfig::new(topo.clone(), seed);
    sim_config.liveness = Some(treecast_proto::LivenessLimits::for_dead_after(config.dead_after));
    sim_config.rejoin = config.rejoin;
    // A tool that starts under fire goes on without what failed, as `--allow-missing` does.
    sim_config.allow_missing = phase == FaultPhase::Startup;
    let mut sim = Sim::new(sim_config);
    match phase {
        FaultPhase::Reduce => {
            sim.launch().map(drop).map_err(|message| ChaosError::Launch { seed, message })?
        }
        FaultPhase::Startup => {
            if let Err(message) = launch_under_fire(&mut sim, config, &topo, count, &mut rng, &mut out) {
                out.startup_failed = Some(message);
                shut_down(&mut sim, config, &topo, &mut out);
                return Ok(out);
            }
        }
    }
    let spec = StreamSpec {
        id: STREAM,
        ranks: all.clone(),
        sync: SyncMode::WaitForAll,
        up: TransformKind::EqClass.spec(),
        down: FilterSpec::new("null", 1),
        up_window: DEFAULT_UP_WINDOW,
        down_window: DEFAULT_DOWN_WINDOW,
        program: 0,
        route: treecast_proto::wire::RouteChoice::Network,
    };
    sim.command(Command::NewStream(spec)).map_err(|e| ChaosError::Stream { seed, source: Box::new(e) })?;

    let limit = config.wave_limit();
    let before_waves = if phase == FaultPhase::Reduce { count } else { 0 };
    let mut fault_at: Vec<usize> = (0..before_waves).map(|_| rng.gen_range(0..config.waves)).collect();
    fault_at.sort_unstable();
    let mut pending: Vec<Duration> = Vec::new();
    // Per completed wave, the ranks that did not answer: each must be reported lost
    // (or, with recovery, orphaned with its comm node) by the end.
    let mut absent: Vec<RankSet> = Vec::new();
    let mut stream_ended = false;
    for wave in 0..config.waves {
        while fault_at.first() == Some(&wave) {
            fault_at.remove(0);
            let Some(at) = strike(&mut sim, config, &topo, &mut rng, &mut out, FAULT_SPREAD, false) else {
                // This wave's other faults have no victim either; later waves keep theirs.
                fault_at.retain(|&w| w > wave);
                break;
            };
            pending.push(at);
        }
        let x: i32 = rng.gen_range(0..1_000_000);
        let sent_lost = sim.core(0).map(|c| c.lost().ranks().clone()).unwrap_or_default();
        match sim.send(request(STREAM, TAG_ADD_RANK, x), limit) {
            Ok(()) => {}
            Err(SimError::Command(_)) => {
                // The stream is gone: every rank it reached was cut off (checked below).
                stream_ended = true;
                break;
            }
            Err(_) => {
                out.hangs += 1;
                break;
            }
        }
        match sim.read(STREAM, limit) {
            Ok(Delivery::Packet(frame)) => {
                out.waves += 1;
                let mut answered = RankSet::new();
                match decode_eq_classes(&frame) {
                    Ok(classes) => {
                        for (key, ranks) in classes {
                            let value =
                                decode_values(&key).ok().and_then(|v| v.first().and_then(Value::as_i64));
                            for r in ranks.iter() {
                                if value != Some(i64::from(x) + i64::from(r)) || sent_lost.contains(r) {
                                    out.wrong += 1;
                                }
                            }
                            answered.union_with(&ranks);
                        }
                    }
                    // An answer that does not decode is wrong for every rank it should hold.
                    Err(_) => out.wrong += all.len(),
                }
                absent.push(all.difference(&answered));
                let now = sim.elapsed();
                pending.retain(|&t| {
                    let done = t <= now;
                    if done {
                        out.recovery.push(now - t);
                    }
                    !done
                });
            }
            Ok(Delivery::NoAnswer(_)) => {
                // Every rank the request reached was cut off with its comm node: each
                // must have been reported with that node's loss (checked below).
                out.waves += 1;
                absent.push(all.clone());
            }
            Ok(Delivery::StreamClosed(_)) => {
                stream_ended = true;
                break;
            }
            Err(_) => {
                out.hangs += 1;
                break;
            }
        }
    }
    // Reports of losses may wait for their process news (at most the core's EXIT_WAIT).
    sim.settle(Duration::from_secs(1));
    let lost = sim.core(0).map(|c| c.lost().ranks().clone()).unwrap_or_default();
    let mut excused = lost.clone();
    for event in &sim.log().events {
        match event {
            Event::NodeLost { ranks, .. } => excused.union_with(ranks),
            Event::RanksRejoined { ranks, .. } => out.rejoined_ranks += ranks.len(),
            _ => {}
        }
    }
    for a in &absent {
        out.wrong += a.difference(&excused).len();
    }
    if stream_ended {
        out.wrong += all.difference(&lost).len();
    }
    let mut faulted_backends = RankSet::new();
    let mut under_faulted_node = RankSet::new();
    for f in &out.faults {
        let range = topo.rank_range(f.node);
        let ranks = RankSet::range(range.start, range.end - range.start);
        if topo.backend_rank(f.node).is_some() {
            faulted_backends.union_with(&ranks);
        } else {
            under_faulted_node.union_with(&ranks);
        }
    }
    let collateral = lost.difference(&faulted_backends);
    out.orphaned_ranks = collateral.intersection(&under_faulted_node).len();
    out.live_ranks_lost = collateral.difference(&under_faulted_node).len();

    let _ = sim.command(Command::CloseStream(STREAM));
    shut_down(&mut sim, config, &topo, &mut out);
    Ok(out)
}

/// Shuts the tree down, continues what is still stopped (it finds its links closed
/// and ends), and counts what still runs.
fn shut_down(sim: &mut Sim, config: &ChaosConfig, topo: &Topology, out: &mut ChaosRun) {
    let _ = sim.command(Command::Shutdown);
    sim.settle(Duration::from_secs(1));
    for id in 1..topo.len() {
        if sim.stopped(id) {
            sim.cont_at(id, Duration::ZERO);
        }
    }
    sim.settle(config.dead_after * 2 + config.rejoin.unwrap_or_default() + Duration::from_secs(10));
    out.left = (0..topo.len()).filter(|&id| sim.alive(id)).count();
}

/// Kills or stops a random node that runs and was not struck yet, up to `spread`
/// from now; returns when, or `None` when no node is left to strike.
fn strike(
    sim: &mut Sim,
    config: &ChaosConfig,
    topo: &Topology,
    rng: &mut StdRng,
    out: &mut ChaosRun,
    spread: Duration,
    during_startup: bool,
) -> Option<Duration> {
    let candidates: Vec<usize> = (1..topo.len())
        .filter(|&id| sim.alive(id) && !sim.stopped(id) && !out.faults.iter().any(|f| f.node == id))
        .collect();
    if candidates.is_empty() {
        return None;
    }
    let node = candidates[rng.gen_range(0..candidates.len())];
    // `gen_bool` panics outside 0..=1, NaN included; a NaN share stops nothing.
    let share = if config.stop_fraction.is_nan() { 0.0 } else { config.stop_fraction.clamp(0.0, 1.0) };
    let stop = rng.gen_bool(share);
    let after = rng.gen_range(Duration::ZERO..=spread);
    if stop {
        sim.stop_at(node, after);
    } else {
        sim.kill_at(node, after);
    }
    let what = match topo.backend_rank(node) {
        Some(r) => format!("back-end rank {r}"),
        None => format!("comm node {node}"),
    };
    let at = sim.elapsed() + after;
    out.faults.push(Fault { node, what, stop, at, during_startup });
    Some(at)
}

/// Starts the tree and strikes `count` nodes at random times while it comes up (a
/// strike due after the start-up ended is not made).
///
/// # Errors
/// The start-up failed: the front-end's message.
fn launch_under_fire(
    sim: &mut Sim,
    config: &ChaosConfig,
    topo: &Topology,
    count: usize,
    rng: &mut StdRng,
    out: &mut ChaosRun,
) -> Result<(), String> {
    sim.begin_launch()?;
    let spread = STARTUP_SPREAD_PER_LEVEL * (topo.depth() as u32 + 1);
    let mut times: Vec<Duration> = (0..count).map(|_| rng.gen_range(Duration::ZERO..=spread)).collect();
    times.sort_unstable();
    for t in times {
        let wait = t.saturating_sub(sim.elapsed());
        let _ = sim.run_until(|s| s.launch_ended(), wait);
        if sim.launch_ended() {
            break;
        }
        if strike(sim, config, topo, rng, out, Duration::ZERO, true).is_none() {
            break;
        }
    }
    sim.finish_launch().map(drop)
}
