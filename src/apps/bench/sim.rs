//! `treecast bench sim`: the protocol cores of a whole tree in one process, with
//! virtual time, to see what each level of a large tree does per wave.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde::Serialize;
use treecast_api::{TransformKind, DEFAULT_DOWN_WINDOW, DEFAULT_UP_WINDOW};
use treecast_proto::{ClockConfig, Command, Delivery, LivenessLimits};
use treecast_sim::{request, NodeStats, Sim, SimClocks, SimConfig, TAG_ADD_RANK};
use treecast_topology::Topology;
use treecast_wire::{decode_values, FilterSpec, RankSet, StreamSpec, SyncMode};

use crate::apps::cli::SimArgs;

/// Longest a wave may take in virtual time.
const WAVE_LIMIT: Duration = Duration::from_secs(600);

/// What the nodes of one level did, per node and per wave.
#[derive(Debug, Clone, Serialize)]
pub struct LevelFigures {
    /// Depth (0: the front-end).
    pub level: usize,
    /// Nodes at this depth.
    pub nodes: usize,
    /// Of them, back-ends.
    pub backends: usize,
    /// Inputs handled (frames, link events, timeouts, commands).
    pub inputs: f64,
    /// Frames received.
    pub frames_in: f64,
    /// Frames sent (one per destination link).
    pub frames_out: f64,
    /// Payload bytes received.
    pub bytes_in: f64,
    /// Payload bytes sent.
    pub bytes_out: f64,
    /// Idle tree with heartbeats and the global clock on (`--idle`): timer wake-ups
    /// per node per second of virtual time.
    pub wakeups_per_s: f64,
    /// Idle tree: links and children its timer work visited per node per second.
    pub visits_per_s: f64,
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct SimFigures {
    /// The topology spec.
    pub topology: String,
    /// Back-ends.
    pub backends: usize,
    /// Nodes, front-end included.
    pub nodes: usize,
    /// Depth of the tree.
    pub depth: usize,
    /// Wall time to build the tree (every core started and joined), seconds.
    pub launch_wall_s: f64,
    /// Virtual time the launch took, seconds.
    pub launch_virtual_s: f64,
    /// Wall time per wave, milliseconds: mean and median.
    pub wave_wall_ms_mean: f64,
    /// Median wall time per wave, milliseconds.
    pub wave_wall_ms_median: f64,
    /// Virtual time per wave (link delays of 5-50 µs), microseconds, mean.
    pub wave_virtual_us_mean: f64,
    /// Virtual seconds the idle tree was watched for its wake-ups (0: not measured).
    pub idle_s: u64,
    /// Per level, per node, per wave.
    pub levels: Vec<LevelFigures>,
}

/// Runs `treecast bench sim`.
pub fn main(args: SimArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.backends > 0 && args.waves > 0, "--backends and --waves need at least 1");
    let topo = crate::apps::run::topology_from_spec(&args.topology, Some(args.backends))?;
    let mut figures = run(&args.topology, topo.clone(), args.waves)?;
    if args.idle > 0 {
        idle(&mut figures, topo, args.idle)?;
    }
    if args.json {
        println!("{}", serde_json::to_string(&figures)?);
    } else {
        print!("{}", render(&figures));
    }
    Ok(ExitCode::SUCCESS)
}

fn run(spec: &str, topo: Topology, waves: usize) -> anyhow::Result<SimFigures> {
    let n = topo.backends();
    let nodes = topo.len();
    let depths: Vec<usize> = (0..nodes).map(|id| topo.node_depth(id)).collect();
    let leaves: Vec<bool> = (0..nodes).map(|id| topo.is_leaf(id)).collect();
    let depth = topo.depth();
    let mut sim = Sim::new(SimConfig::new(topo, 1));
    let started = Instant::now();
    let missing = sim.launch().map_err(anyhow::Error::msg).context("building the simulated tree")?;
    ensure!(missing.is_empty(), "ranks missing at launch: {missing:?}");
    let launch_wall_s = started.elapsed().as_secs_f64();
    let launch_virtual_s = sim.elapsed().as_secs_f64();
    let spec_msg = StreamSpec {
        id: 1,
        ranks: RankSet::range(0, n as u32),
        sync: SyncMode::WaitForAll,
        up: TransformKind::Sum.spec(),
        down: FilterSpec::new("null", 1),
        up_window: DEFAULT_UP_WINDOW,
        down_window: DEFAULT_DOWN_WINDOW,
        program: 0,
        route: treecast_wire::RouteChoice::Network,
    };
    sim.command(Command::NewStream(spec_msg)).context("opening the stream")?;
    // Count the waves only: let the stream's announcement reach every node first.
    sim.settle(Duration::from_secs(1));
    let before: Vec<NodeStats> = (0..nodes).map(|id| sim.stats(id).unwrap_or_default()).collect();
    // `%d` sums wrap around, as they do in the filters.
    let expected = i64::from((0..n as u32).fold(0i32, |acc, r| acc.wrapping_add(r as i32)));
    let mut walls = Vec::with_capacity(waves);
    let virtual_start = sim.elapsed();
    for wave in 0..waves {
        let t = Instant::now();
        sim.send(request(1, TAG_ADD_RANK, 0), WAVE_LIMIT).with_context(|| format!("wave {wave}"))?;
        let got = match sim.read(1, WAVE_LIMIT).with_context(|| format!("wave {wave}"))? {
            Delivery::Packet(f) => decode_values(&f.payload)?.first().and_then(|v| v.as_i64()).unwrap_or(-1),
            Delivery::StreamClosed(_) | Delivery::NoAnswer(_) => -1,
        };
        walls.push(t.elapsed().as_secs_f64() * 1e3);
        ensure!(got == expected, "wave {wave}: the sum is {got}, expected {expected}");
    }
    let wave_virtual_us_mean = (sim.elapsed() - virtual_start).as_secs_f64() * 1e6 / waves as f64;
    let mut levels: Vec<LevelFigures> = (0..=depth)
        .map(|level| LevelFigures {
            level,
            nodes: 0,
            backends: 0,
            inputs: 0.0,
            frames_in: 0.0,
            frames_out: 0.0,
            bytes_in: 0.0,
            bytes_out: 0.0,
            wakeups_per_s: 0.0,
            visits_per_s: 0.0,
        })
        .collect();
    for id in 0..nodes {
        let (a, b) = (before[id], sim.stats(id).unwrap_or_default());
        let l = &mut levels[depths[id]];
        l.nodes += 1;
        l.backends += usize::from(leaves[id]);
        l.inputs += (b.inputs - a.inputs) as f64;
        l.frames_in += (b.frames_in - a.frames_in) as f64;
        l.frames_out += (b.frames_out - a.frames_out) as f64;
        l.bytes_in += (b.bytes_in - a.bytes_in) as f64;
        l.bytes_out += (b.bytes_out - a.bytes_out) as f64;
    }
    for l in &mut levels {
        let per = (l.nodes * waves).max(1) as f64;
        for v in [&mut l.inputs, &mut l.frames_in, &mut l.frames_out, &mut l.bytes_in, &mut l.bytes_out] {
            *v /= per;
        }
    }
    let mut sorted = walls.clone();
    sorted.sort_by(f64::total_cmp);
    Ok(SimFigures {
        topology: spec.to_owned(),
        backends: n,
        nodes,
        depth,
        launch_wall_s,
        launch_virtual_s,
        wave_wall_ms_mean: walls.iter().sum::<f64>() / walls.len() as f64,
        wave_wall_ms_median: sorted[sorted.len() / 2],
        wave_virtual_us_mean,
        idle_s: 0,
        levels,
    })
}

/// What a node's timers cost while nothing else happens: the same tree launched
/// apart, with heartbeats (the defaults: 1 s, cut off after 30 s) and the global clock
/// on, its children connecting over a second, as a real tree runs; its first clock
/// rounds are let pass, then `secs` virtual seconds are watched. The waves' figures are measured without them.
fn idle(figures: &mut SimFigures, topo: Topology, secs: u64) -> anyhow::Result<()> {
    let nodes = topo.len();
    let depths: Vec<usize> = (0..nodes).map(|id| topo.node_depth(id)).collect();
    let mut config = SimConfig::new(topo, 1);
    config.liveness = Some(LivenessLimits::default());
    config.clocks = Some(SimClocks { knob: String::new(), config: ClockConfig::default() });
    // Children connect over a second, as real processes do: their links' phases differ.
    config.launch_spread = Duration::from_secs(1);
    let mut sim = Sim::new(config);
    let missing = sim.launch().map_err(anyhow::Error::msg).context("building the idle tree")?;
    ensure!(missing.is_empty(), "ranks missing at launch of the idle tree: {missing:?}");
    // The first two clock rounds (drift measured after 2 s) are over by then.
    sim.settle(Duration::from_secs(6));
    let before: Vec<NodeStats> = (0..nodes).map(|id| sim.stats(id).unwrap_or_default()).collect();
    sim.settle(Duration::from_secs(secs));
    for l in &mut figures.levels {
        (l.wakeups_per_s, l.visits_per_s) = (0.0, 0.0);
    }
    for id in 0..nodes {
        let (a, b) = (before[id], sim.stats(id).unwrap_or_default());
        if let Some(l) = figures.levels.get_mut(depths[id]) {
            l.wakeups_per_s += (b.wakeups - a.wakeups) as f64;
            l.visits_per_s += (b.timer_visits - a.timer_visits) as f64;
        }
    }
    for l in &mut figures.levels {
        let per = (l.nodes as f64 * secs as f64).max(1.0);
        l.wakeups_per_s /= per;
        l.visits_per_s /= per;
    }
    figures.idle_s = secs;
    Ok(())
}

fn render(f: &SimFigures) -> String {
    let mut out = format!(
        "bench sim {}: {} back-ends, {} nodes, depth {}\n  \
         launch          {:.3} s wall, {:.3} s virtual\n  \
         per wave        {:.2} ms wall (median {:.2} ms), {:.0} us virtual (broadcast + sum)\n  \
         per node per wave, by level:\n  \
         level    nodes  back-ends   inputs  frames in  frames out   bytes in  bytes out  wake-ups/s  visits/s\n",
        f.topology,
        f.backends,
        f.nodes,
        f.depth,
        f.launch_wall_s,
        f.launch_virtual_s,
        f.wave_wall_ms_mean,
        f.wave_wall_ms_median,
        f.wave_virtual_us_mean,
    );
    for l in &f.levels {
        let idle = match f.idle_s {
            0 => format!("{:>11} {:>9}", "-", "-"),
            _ => format!("{:>11.1} {:>9.1}", l.wakeups_per_s, l.visits_per_s),
        };
        out.push_str(&format!(
            "  {:>5} {:>8} {:>10} {:>8.1} {:>10.1} {:>11.1} {:>10.1} {:>10.1} {idle}\n",
            l.level, l.nodes, l.backends, l.inputs, l.frames_in, l.frames_out, l.bytes_in, l.bytes_out
        ));
    }
    if f.idle_s > 0 {
        out.push_str(&format!(
            "  wake-ups/s, visits/s: per node per virtual second of an idle tree (heartbeats, \
             global clock) over {} s\n",
            f.idle_s
        ));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_small_tree_counts_one_frame_each_way_per_back_end_and_wave() {
        let topo = Topology::from_spec("kary:4", Some(64)).unwrap();
        let f = run("kary:4", topo, 3).unwrap();
        assert_eq!(f.backends, 64);
        let leaves = f.levels.last().unwrap();
        assert_eq!(leaves.backends, leaves.nodes);
        assert_eq!((leaves.frames_in, leaves.frames_out), (1.0, 1.0), "{leaves:?}");
        let root = &f.levels[0];
        assert_eq!((root.frames_in, root.frames_out), (4.0, 4.0), "{root:?}");
        assert!(render(&f).contains("per node per wave"));
    }

    #[test]
    fn an_idle_tree_counts_its_timer_wake_ups_per_node() {
        let topo = Topology::from_spec("balanced:2x8", None).unwrap();
        let mut f = run("balanced:2x8", topo.clone(), 1).unwrap();
        idle(&mut f, topo, 3).unwrap();
        assert_eq!(f.idle_s, 3);
        // Every node with links sends heartbeats, so its timer fires.
        for l in &f.levels {
            assert!(l.wakeups_per_s > 0.0, "{l:?}");
            assert!(l.visits_per_s > 0.0, "{l:?}");
        }
        assert!(render(&f).contains("wake-ups/s"));
    }
}
