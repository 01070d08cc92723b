//! Property tests of the protocol core on simulated trees: random shapes (depth 1 to
//! 5, fan-out 1 to 32), random link delays, random kills, silent and slow back-ends.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::time::Duration;

use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::SeedableRng;
use treecast_proto::filters::TransformKind;
use treecast_proto::topology::Topology;
use treecast_proto::wire::{
    decode_values, FilterSpec, RankSet, StreamSpec, SyncMode, Value, Window, DEFAULT_DOWN_WINDOW,
    DEFAULT_UP_WINDOW,
};
use treecast_proto::{Command, Delivery};
use treecast_sim::{request, requests, BackendTool, Sim, SimConfig, TAG_ADD_RANK, TAG_BURST_BYTES, TAG_RANK};

const LIMIT: Duration = Duration::from_secs(120);
/// Largest tree drawn, in nodes, so a case stays quick in a debug build.
const MAX_NODES: usize = 400;

/// A random tree: every node above `depth` gets 1 to `fanout` children until
/// `MAX_NODES` is reached.
fn random_tree(seed: u64, depth: usize, fanout: usize) -> Topology {
    treecast_sim::chaos::tree_of_shape(&mut StdRng::seed_from_u64(seed), depth, fanout, MAX_NODES).unwrap()
}

fn tree() -> impl Strategy<Value = (u64, usize, usize)> {
    (any::<u64>(), 1usize..=5, 1usize..=32)
}

fn stream(id: u32, n: u32, sync: SyncMode, up: TransformKind) -> StreamSpec {
    StreamSpec {
        id,
        ranks: RankSet::range(0, n),
        sync,
        up: up.spec(),
        down: FilterSpec::new("null", 1),
        up_window: DEFAULT_UP_WINDOW,
        down_window: DEFAULT_DOWN_WINDOW,
        program: 0,
        route: treecast_proto::wire::RouteChoice::Network,
    }
}

fn config(topo: Topology, seed: u64, max_delay_us: u64) -> SimConfig {
    let mut c = SimConfig::new(topo, seed);
    c.delay = (Duration::from_micros(1), Duration::from_micros(max_delay_us.max(1)));
    c
}

fn packet(d: Delivery) -> treecast_proto::wire::Frame {
    match d {
        Delivery::Packet(f) => f,
        other => panic!("expected a packet, got {other:?}"),
    }
}

fn ranks_in(f: &treecast_proto::wire::Frame) -> Vec<u32> {
    match &decode_values(&f.payload).unwrap()[0] {
        Value::UIntArray(v) => v.clone(),
        other => panic!("not %aud: {other:?}"),
    }
}

/// The requests a concatenation of `TAG_RANK` answers answered.
fn waves_in(f: &treecast_proto::wire::Frame) -> BTreeSet<i32> {
    match &decode_values(&f.payload).unwrap()[1] {
        Value::IntArray(v) => v.iter().copied().collect(),
        other => panic!("not %ad: {other:?}"),
    }
}

/// Every node's ancestors, the node itself included.
fn path_to_root(topo: &Topology, mut id: usize) -> Vec<usize> {
    let mut path = vec![id];
    while let Some(p) = topo.node(id).parent {
        path.push(p);
        id = p;
    }
    path
}

/// Ranks below (or at) node `id`.
fn ranks_below(topo: &Topology, id: usize) -> RankSet {
    let r = topo.rank_range(id);
    RankSet::range(r.start, r.end - r.start)
}

/// After a shutdown, every node ends.
fn shuts_down(sim: &mut Sim, nodes: usize) -> Result<(), TestCaseError> {
    sim.command(Command::Shutdown).unwrap();
    sim.settle(Duration::from_secs(10));
    for id in 0..nodes {
        prop_assert!(!sim.alive(id), "node {} still runs after the shutdown", id);
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Without failures every wave's sum is exact, whatever the shape, delays and sync mode.
    #[test]
    fn sums_are_exact((seed, depth, fanout) in tree(), delay in 1u64..200, timeout in any::<bool>()) {
        let topo = random_tree(seed, depth, fanout);
        let n = topo.backends() as u32;
        let nodes = topo.len();
        let mut sim = Sim::new(config(topo, seed, delay));
        prop_assert!(sim.launch().unwrap().is_empty());
        let sync = if timeout { SyncMode::TimeOut(60_000) } else { SyncMode::WaitForAll };
        sim.command(Command::NewStream(stream(1, n, sync, TransformKind::Sum))).unwrap();
        for wave in 0..20 {
            sim.send(request(1, TAG_ADD_RANK, wave), LIMIT).unwrap();
        }
        let ranks: i64 = (0..i64::from(n)).sum();
        for wave in 0..20 {
            let f = packet(sim.read(1, LIMIT).unwrap());
            let sum = decode_values(&f.payload).unwrap()[0].as_i64().unwrap();
            prop_assert_eq!(sum, i64::from(wave) * i64::from(n) + ranks);
        }
        shuts_down(&mut sim, nodes)?;
    }

    /// With nodes killed at random times, every wave completes; it holds every rank
    /// that was never cut off, each once, and no rank already reported lost when it
    /// was sent; the front-end learns of exactly the ranks that were cut off.
    #[test]
    fn waves_complete_with_exactly_the_surviving_ranks(
        (seed, depth, fanout) in tree(),
        kills in prop::collection::vec((any::<u64>(), 0u64..20_000), 0..4),
    ) {
        let topo = random_tree(seed, depth, fanout);
        let n = topo.backends() as u32;
        let nodes = topo.len();
        let victims: Vec<(usize, u64)> =
            kills.iter().map(|(pick, at)| (1 + (*pick as usize) % (nodes - 1), *at)).collect();
        let cut: BTreeSet<usize> = (0..nodes)
            .filter(|&id| path_to_root(&topo, id).iter().any(|a| victims.iter().any(|(v, _)| v == a)))
            .collect();
        let mut doomed = RankSet::new();
        for &(v, _) in &victims {
            doomed.union_with(&ranks_below(&topo, v));
        }
        let survivors = RankSet::range(0, n).difference(&doomed);
        let mut sim = Sim::new(config(topo.clone(), seed, 50));
        prop_assert!(sim.launch().unwrap().is_empty());
        sim.command(Command::NewStream(stream(1, n, SyncMode::WaitForAll, TransformKind::Concat))).unwrap();
        for &(v, at) in &victims {
            sim.kill_at(v, Duration::from_micros(at));
        }
        let mut lost_before = Vec::new();
        for wave in 0..20 {
            lost_before.push(sim.core(0).unwrap().lost().ranks().clone());
            sim.send(request(1, TAG_RANK, wave), LIMIT).unwrap();
            sim.settle(Duration::from_micros(1000));
        }
        for (wave, lost) in lost_before.iter().enumerate() {
            let got = match sim.read(1, LIMIT).unwrap() {
                Delivery::Packet(f) => {
                    prop_assert_eq!(waves_in(&f), BTreeSet::from([wave as i32]), "answers of several waves mixed");
                    ranks_in(&f)
                }
                // Every rank was cut off: the stream ends instead.
                Delivery::StreamClosed(_) => {
                    prop_assert!(survivors.is_empty(), "the stream closed with survivors {}", survivors);
                    break;
                }
                // Only with recovery on, which these runs leave off.
                Delivery::NoAnswer(_) => {
                    prop_assert!(false, "wave {} answered by no rank with recovery off", wave);
                    break;
                }
            };
            let set: BTreeSet<u32> = got.iter().copied().collect();
            prop_assert_eq!(set.len(), got.len(), "wave {} holds a rank twice", wave);
            prop_assert!(got.iter().all(|&r| r < n));
            for r in survivors.iter() {
                prop_assert!(set.contains(&r), "wave {} lacks surviving rank {}", wave, r);
            }
            for r in lost.iter() {
                prop_assert!(!set.contains(&r), "wave {} holds rank {}, lost before it was sent", wave, r);
            }
        }
        sim.settle(Duration::from_millis(100));
        prop_assert_eq!(sim.core(0).unwrap().lost().ranks(), &doomed);
        prop_assert!(cut.iter().all(|&id| !sim.alive(id)));
        shuts_down(&mut sim, nodes)?;
    }

    /// With silent back-ends in a time-out stream, no part of a wave waits longer
    /// than its levels' time-outs and link delays.
    #[test]
    fn no_wave_waits_past_its_time_out(
        (seed, depth, fanout) in tree(),
        silent in prop::collection::vec(any::<u32>(), 1..4),
        timeout_ms in 5u32..50,
    ) {
        let topo = random_tree(seed, depth, fanout);
        let n = topo.backends() as u32;
        let nodes = topo.len();
        let silent: BTreeSet<u32> = silent.iter().map(|r| r % n).collect();
        let mut sim = Sim::new(config(topo.clone(), seed, 50));
        for &r in &silent {
            sim.set_tool(r, BackendTool { silent: true, ..BackendTool::default() });
        }
        prop_assert!(sim.launch().unwrap().is_empty());
        sim.command(Command::NewStream(stream(1, n, SyncMode::TimeOut(timeout_ms), TransformKind::Concat))).unwrap();
        let expected = n as usize - silent.len();
        let levels = topo.depth() as u32;
        let bound = (Duration::from_millis(u64::from(timeout_ms)) + Duration::from_micros(2 * 50 + 1)) * levels;
        for wave in 0..5 {
            let sent = sim.elapsed();
            sim.send(request(1, TAG_RANK, wave), LIMIT).unwrap();
            let mut got = BTreeSet::new();
            while got.len() < expected {
                let f = packet(sim.read(1, LIMIT).unwrap());
                prop_assert_eq!(waves_in(&f), BTreeSet::from([wave]), "a part of another wave");
                got.extend(ranks_in(&f));
                let waited = sim.elapsed() - sent;
                prop_assert!(waited <= bound, "part of wave {} came after {:?} (bound {:?})", wave, waited, bound);
            }
            prop_assert!(got.iter().all(|r| !silent.contains(r)));
        }
        shuts_down(&mut sim, nodes)?;
    }

    /// Bursts of large packets through slow back-ends and a front-end that reads
    /// slowly: no node ever holds more than its windows allow, and nothing is lost.
    #[test]
    fn memory_stays_within_the_windows(
        (seed, depth, fanout) in tree(),
        slow in prop::collection::vec(any::<u32>(), 0..4),
        size in 100i32..2000,
        waves in any::<bool>(),
    ) {
        let topo = random_tree(seed, depth, fanout);
        let n = topo.backends() as u32;
        let nodes = topo.len();
        let mut c = config(topo.clone(), seed, 50);
        let tool = Window { packets: 64, bytes: 16 << 10 };
        c.tool_window = tool;
        let mut sim = Sim::new(c);
        for r in slow {
            sim.set_tool(r % n, BackendTool { read_every: Duration::from_micros(300), ..BackendTool::default() });
        }
        prop_assert!(sim.launch().unwrap().is_empty());
        let up = Window { packets: 16, bytes: 4 << 10 };
        let down = Window { packets: 16, bytes: 8 << 10 };
        // Time-out waves hold a frame from every child that has one, each needing a
        // credit of its own with the null filter; after 5 ms the rest go as they are, so
        // subtrees of different sizes still deliver everything.
        let sync = if waves { SyncMode::TimeOut(5) } else { SyncMode::DoNotWait };
        let mut spec = stream(1, n, sync, TransformKind::Null);
        spec.up_window = up;
        spec.down_window = down;
        sim.command(Command::NewStream(spec)).unwrap();
        let bursts = 3;
        let per_burst = 20;
        for _ in 0..bursts {
            sim.send(requests(1, TAG_BURST_BYTES, &[per_burst, size]), LIMIT).unwrap();
        }
        let total = n as usize * (bursts * per_burst) as usize;
        for i in 0..total {
            let f = packet(sim.read(1, LIMIT).unwrap_or_else(|e| panic!("packet {i} of {total}: {e}")));
            prop_assert_eq!(f.payload.len(), 5 + size as usize);
            if i % 7 == 0 {
                sim.settle(Duration::from_micros(200));
            }
        }
        let frame = 5 + size as u64;
        for id in 0..nodes {
            let children = topo.node(id).children.len() as u64;
            let own_up = if id == 0 { tool.bytes + frame } else { 0 };
            // A window per child (each may overshoot by a frame), one reduced wave waiting
            // for credit (a frame per child), a downward window.
            let bound = children * (up.bytes + 2 * frame) + down.bytes + frame + own_up;
            let held = sim.stats(id).unwrap().max_held_bytes;
            prop_assert!(held <= bound, "node {} held {} bytes, over its bound of {}", id, held, bound);
        }
        shuts_down(&mut sim, nodes)?;
    }
}
