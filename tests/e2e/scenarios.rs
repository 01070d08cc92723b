//! One scenario, two trees: the requests of `treecast_wire::requests` answered by
//! the simulated tree's back-ends and by real generic back-ends (`treecast backend`)
//! reduce to the same results, so a scenario checked in the simulation holds on
//! real processes.
use std::time::Duration;

use treecast_api::{NetworkBuilder, StreamOptions, Topology, TransformKind, Value};
use treecast_proto::wire::{
    decode_values, FilterSpec, RankSet, StreamSpec, SyncMode, DEFAULT_DOWN_WINDOW, DEFAULT_UP_WINDOW,
};
use treecast_proto::{Command, Delivery};
use treecast_sim::{requests, Sim, SimConfig, TAG_ADD_RANK, TAG_BURST, TAG_RANK};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(20);
const SHAPE: &str = "balanced:2x3";

/// The scenario: requests (stream, tag, value) and the filter of each stream.
const STREAMS: [(u32, TransformKind); 3] =
    [(1, TransformKind::Sum), (2, TransformKind::Concat), (3, TransformKind::Sum)];
const REQUESTS: [(u32, i32, i32); 5] =
    [(1, TAG_ADD_RANK, 0), (1, TAG_ADD_RANK, 17), (2, TAG_RANK, 4), (3, TAG_BURST, 3), (1, TAG_ADD_RANK, -5)];

/// Each answer reduced, as text: its values in order, ranks sorted where a
/// concatenation gathered them (arrival order may differ between trees).
fn describe(values: &[Value]) -> String {
    let mut out = Vec::new();
    for v in values {
        match v {
            Value::UIntArray(ranks) => {
                let mut ranks = ranks.clone();
                ranks.sort_unstable();
                out.push(format!("ranks {ranks:?}"));
            }
            Value::IntArray(xs) => {
                let mut xs = xs.clone();
                xs.sort_unstable();
                out.push(format!("values {xs:?}"));
            }
            other => out.push(format!("{:?}", other.as_i64())),
        }
    }
    out.join(", ")
}

/// What each request's answers reduce to, stream by stream, in the simulated tree.
fn in_the_simulation() -> Vec<String> {
    let topo = Topology::from_spec(SHAPE, None).unwrap();
    let n = topo.backends() as u32;
    let mut sim = Sim::new(SimConfig::new(topo, 3));
    assert!(sim.launch().unwrap().is_empty());
    for (id, kind) in STREAMS {
        let spec = StreamSpec {
            id,
            ranks: RankSet::range(0, n),
            sync: SyncMode::WaitForAll,
            up: kind.spec(),
            down: FilterSpec::new("null", 1),
            up_window: DEFAULT_UP_WINDOW,
            down_window: DEFAULT_DOWN_WINDOW,
            program: 0,
            route: treecast_proto::wire::RouteChoice::Network,
        };
        sim.command(Command::NewStream(spec)).unwrap();
    }
    let mut seen = Vec::new();
    for (stream, tag, value) in REQUESTS {
        sim.send(requests(stream, tag, &[value]), LIMIT).unwrap();
        let waves = if tag == TAG_BURST { value } else { 1 };
        for _ in 0..waves {
            match sim.read(stream, LIMIT).unwrap() {
                Delivery::Packet(f) => seen.push(describe(&decode_values(&f.payload).unwrap())),
                other => panic!("stream {stream}: {other:?}"),
            }
        }
    }
    seen
}

/// The same on a real local tree of generic back-ends.
async fn on_real_processes() -> Vec<String> {
    let topo = Topology::from_spec(SHAPE, None).unwrap();
    let net =
        NetworkBuilder::new(topo).treecast_path(TREECAST).startup_timeout(LIMIT).launch().await.unwrap();
    let all = net.broadcast_communicator();
    let mut streams = Vec::new();
    for (_, kind) in STREAMS {
        streams.push(net.new_stream(&all, StreamOptions::reduce(kind)).await.unwrap());
    }
    let mut seen = Vec::new();
    for (stream, tag, value) in REQUESTS {
        let s = &mut streams[stream as usize - 1];
        s.send(tag, "%d", &[Value::Int(value)]).await.unwrap();
        let waves = if tag == TAG_BURST { value } else { 1 };
        for _ in 0..waves {
            let p = s.recv_timeout(LIMIT).await.unwrap();
            seen.push(describe(&p.values().unwrap()));
        }
    }
    crate::common::tree::finish(net).await;
    seen
}

#[tokio::test]
async fn a_scenario_gives_the_same_results_in_the_simulation_and_on_real_processes() {
    let simulated = in_the_simulation();
    assert_eq!(simulated.len(), 7, "{simulated:?}");
    assert_eq!(simulated[0], "Some(15)", "0 + the ranks 0..6");
    assert_eq!(on_real_processes().await, simulated);
}
