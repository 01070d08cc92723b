//! End-to-end tests: real comm nodes and back-ends on loopback.
//!
//! Every test checks that no process of its network is left behind, by looking
//! for its session id (or a per-test tag) in the environment of every process.

#![allow(clippy::unwrap_used)]

mod common;

use common::tree::finish;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{assert_no_leftovers, commnode_pid, processes_with_env, TestDir};
use treecast::apps::protocol::*;
use treecast_api::{
    ApiError, Event, Network, NetworkBuilder, RankSet, StreamOptions, SyncMode, Topology, TransformKind,
    Value,
};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(20);

async fn launch(spec: &str, backends: usize) -> Network {
    let topo = Topology::from_spec(spec, Some(backends)).unwrap();
    builder(topo).launch().await.unwrap()
}

fn builder(topo: Topology) -> NetworkBuilder {
    NetworkBuilder::new(topo).treecast_path(TREECAST).startup_timeout(LIMIT)
}

/// A sum reduction over every rank.
async fn sum_stream(net: &Network) -> treecast_api::Stream {
    net.new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum)).await.unwrap()
}

fn int(p: &treecast_api::Packet) -> i64 {
    p.values().unwrap()[0].as_i64().unwrap()
}

async fn sum_waves(spec: &str, n: usize) {
    let net = launch(spec, n).await;
    assert_eq!(net.backends(), n as u32);
    let mut s = sum_stream(&net).await;
    let ranks: i64 = (0..n as i64).sum();
    for wave in 0..5 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(wave)]).await.unwrap();
    }
    for wave in 0..5 {
        let p = s.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(int(&p), wave * n as i64 + ranks, "wave {wave} on {spec}");
    }
    finish(net).await;
}

#[tokio::test]
async fn sums_are_correct_on_a_flat_tree_of_64() {
    sum_waves("flat", 64).await;
}

#[tokio::test]
async fn sums_are_correct_on_kary8_with_64() {
    sum_waves("kary:8", 64).await;
}

#[tokio::test]
async fn sums_are_correct_on_balanced_4x4x4() {
    sum_waves("balanced:4x4x4", 64).await;
}

#[tokio::test]
async fn sums_are_correct_over_tcp_links() {
    let topo = Topology::from_spec("balanced:2x3", None).unwrap();
    let net = builder(topo).unix_links(false).launch().await.unwrap();
    let mut s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(1)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 6 + 15);
    finish(net).await;
}

#[tokio::test]
async fn concurrent_streams_with_different_filters_and_communicators() {
    let net = launch("balanced:4x4", 16).await;
    let low = net.communicator(RankSet::range(0, 8)).unwrap();
    let high = net.communicator(RankSet::range(8, 8)).unwrap();
    let all = net.broadcast_communicator();
    let mut sum = net.new_stream(&low, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let mut max = net.new_stream(&high, StreamOptions::reduce(TransformKind::Max)).await.unwrap();
    let mut min = net.new_stream(&all, StreamOptions::reduce(TransformKind::Min)).await.unwrap();
    let mut cat = net.new_stream(&low, StreamOptions::reduce(TransformKind::Concat)).await.unwrap();
    let mut avg = net.new_stream(&all, StreamOptions::reduce(TransformKind::Avg)).await.unwrap();
    let mut eq = net.new_stream(&all, StreamOptions::reduce(TransformKind::EqClass)).await.unwrap();
    let mut raw = net
        .new_stream(&high, StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::default() })
        .await
        .unwrap();
    for s in [&sum, &max, &min, &cat, &avg, &raw] {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(100)]).await.unwrap();
    }
    eq.send(TAG_WHERE, "", &[]).await.unwrap();
    assert_eq!(int(&sum.recv_timeout(LIMIT).await.unwrap()), 800 + 28);
    assert_eq!(int(&max.recv_timeout(LIMIT).await.unwrap()), 115);
    assert_eq!(int(&min.recv_timeout(LIMIT).await.unwrap()), 100);
    assert_eq!(int(&avg.recv_timeout(LIMIT).await.unwrap()), (16 * 100 + 120) / 16);
    let cat_values = cat.recv_timeout(LIMIT).await.unwrap().unpack("%ad").unwrap();
    let Value::IntArray(mut got) = cat_values[0].clone() else { panic!("not %ad") };
    got.sort();
    assert_eq!(got, (100..108).collect::<Vec<_>>());
    let classes = eq.recv_timeout(LIMIT).await.unwrap().eq_classes().unwrap();
    let groups: Vec<String> = classes.iter().map(|c| c.ranks.to_string()).collect();
    assert_eq!(groups, ["0-3", "4-7", "8-11", "12-15"]);
    let mut seen = BTreeSet::new();
    for _ in 0..8 {
        let p = raw.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(int(&p), 100 + i64::from(p.rank()));
        seen.insert(p.rank());
    }
    assert_eq!(seen, (8..16).collect());
    finish(net).await;
}

#[tokio::test]
async fn a_stream_the_tool_does_not_read_holds_up_no_other_stream() {
    // Flow control regression: stream `unread` gets more waves than the front-end
    // buffers (ROOT_WINDOW), so the tree must hold them back per stream; stream
    // `read` must still complete, then every held wave must arrive intact.
    let topo = Topology::from_spec("balanced:2x4", Some(8)).unwrap();
    let window = treecast_api::Window { packets: 4096, bytes: 64 << 20 };
    let net = builder(topo).receive_window(window).launch().await.unwrap();
    let all = net.broadcast_communicator();
    let mut unread = net.new_stream(&all, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let mut read = net.new_stream(&all, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let many = window.packets as i32 + 1000;
    unread.send(TAG_BURST, "%d", &[Value::Int(many)]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    read.send(TAG_BURST, "%d", &[Value::Int(300)]).await.unwrap();
    for i in 0..300 {
        let p = read.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("wave {i} of the read stream: {e}"));
        assert_eq!(int(&p), 8);
    }
    for i in 0..many {
        let p = unread.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("held wave {i}: {e}"));
        assert_eq!(int(&p), 8, "held wave {i}");
    }
    assert!(unread.try_recv().is_none());
    finish(net).await;
}

#[tokio::test]
async fn the_tool_can_send_ten_thousand_packets_before_reading() {
    // Regression: a stream deadlocked for good when the front-end sent many packets
    // before reading (9 runs in 10 stopped after 256-512 waves): a back-end waited for
    // credits that came behind requests it had not read, and a comm node waited on one
    // child's full queue while its siblings starved.
    for (shape, n) in [("balanced:4x4", 16), ("flat", 4), ("balanced:2x2x2", 8)] {
        let net = launch(shape, n).await;
        let mut s = sum_stream(&net).await;
        let ranks: i64 = (0..n as i64).sum();
        for wave in 0..10_000 {
            tokio::time::timeout(LIMIT, s.send(TAG_ADD_RANK, "%d", &[Value::Int(wave % 7)]))
                .await
                .unwrap_or_else(|_| panic!("{shape}: send {wave} hung"))
                .unwrap();
        }
        for wave in 0..10_000 {
            let p = s.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("{shape}: wave {wave}: {e}"));
            assert_eq!(int(&p), i64::from(wave % 7) * n as i64 + ranks, "{shape}: wave {wave}");
        }
        finish(net).await;
    }
}

#[tokio::test]
async fn an_unread_stream_is_bounded_in_bytes_not_packets() {
    // Regression: an unread stream held up to 4,096 reduced packets at the front-end
    // whatever their size (1.2 GB with 16 back-ends sending 16 KiB strings).
    let topo = Topology::from_spec("balanced:4x4", None).unwrap();
    let window = treecast_api::Window { packets: 1 << 16, bytes: 4 << 20 };
    let net = builder(topo).receive_window(window).launch().await.unwrap();
    let options = StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::default() };
    let mut s = net.new_stream(&net.broadcast_communicator(), options).await.unwrap();
    let (count, size) = (200, 16 << 10);
    s.send(TAG_BURST_BYTES, "%d %d", &[Value::Int(count), Value::Int(size)]).await.unwrap();
    // The bound holds at every moment; give the tree time to push what it can.
    let mut most = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        most = most.max(net.held_bytes());
    }
    // The receive window, one frame over it, and one upward window per child (4 comm nodes).
    let bound = window.bytes + (16 << 10) + 4 * treecast_api::DEFAULT_UP_WINDOW.bytes;
    assert!(most > window.bytes / 2, "the tree did not fill the window ({most} bytes held)");
    assert!(most <= bound, "the front-end held {most} bytes, more than {bound}");
    for i in 0..16 * count {
        let p = s.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("packet {i}: {e}"));
        assert_eq!(p.unpack("%s").unwrap()[0].as_str().unwrap().len(), size as usize);
    }
    assert!(s.try_recv().is_none());
    finish(net).await;
}

#[tokio::test]
async fn a_child_that_stops_reading_holds_up_only_its_own_stream() {
    // Regression: while a comm node waited on one slow child's send queue, nothing
    // else moved through it. Rank 0 stops reading; a stream to it fills up and its
    // sender waits; a stream over rank 1, below the same comm node, goes on.
    let net = launch("balanced:2x2", 4).await;
    let stall = net
        .new_stream(&net.communicator(RankSet::single(0)).unwrap(), StreamOptions::default())
        .await
        .unwrap();
    stall.send(TAG_STALL, "%ad %d", &[Value::IntArray(vec![0]), Value::Int(15_000)]).await.unwrap();
    let flood = net
        .new_stream(
            &net.broadcast_communicator(),
            StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::default() },
        )
        .await
        .unwrap();
    let flooding = tokio::spawn(async move {
        for i in 0..2000 {
            flood.send(TAG_ADD_RANK, "%d", &[Value::Int(i)]).await.unwrap();
        }
        flood
    });
    let mut side = net
        .new_stream(&net.communicator(RankSet::single(1)).unwrap(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    for wave in 0..20 {
        side.send(TAG_ADD_RANK, "%d", &[Value::Int(wave)]).await.unwrap();
        let p =
            side.recv_timeout(Duration::from_secs(5)).await.unwrap_or_else(|e| panic!("wave {wave}: {e}"));
        assert_eq!(int(&p), i64::from(wave) + 1);
    }
    assert!(!flooding.is_finished(), "the flood went through a child that does not read");
    flooding.abort();
    finish(net).await;
}

#[tokio::test]
async fn a_filter_a_comm_node_lacks_refuses_the_stream_and_names_the_node() {
    let mut registry = treecast_api::FilterRegistry::builtin();
    registry.register("front-end-only", 1..=1, |_| Ok(treecast_filters_null()));
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let mut net = builder(topo).filters(registry).launch().await.unwrap();
    let options =
        StreamOptions { up: treecast_api::FilterSpec::new("front-end-only", 1), ..StreamOptions::default() };
    let mut s = net.new_stream(&net.broadcast_communicator(), options).await.unwrap();
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::StreamRefused { node, message, .. }) => {
            assert!(node.contains("comm node"), "{node}");
            assert!(message.contains("front-end-only"), "{message}");
        }
        other => panic!("expected StreamRefused, got {other:?}"),
    }
    let err = s.recv_timeout(LIMIT).await.unwrap_err().to_string();
    assert!(err.contains("refused") && err.contains("front-end-only"), "{err}");
    let unknown =
        StreamOptions { up: treecast_api::FilterSpec::new("median", 1), ..StreamOptions::default() };
    let err = net.new_stream(&net.broadcast_communicator(), unknown).await.unwrap_err().to_string();
    assert!(err.contains("front-end") && err.contains("median"), "{err}");
    finish(net).await;
}

fn treecast_filters_null() -> Box<dyn treecast_api::Transform> {
    struct PassThrough;
    impl treecast_api::Transform for PassThrough {
        fn apply(
            &mut self,
            wave: Vec<treecast_wire::Frame>,
            _ctx: &treecast_api::FilterContext,
        ) -> Result<Vec<treecast_wire::Frame>, treecast_api::FilterError> {
            Ok(wave)
        }
    }
    Box::new(PassThrough)
}

#[tokio::test]
async fn a_backend_dying_mid_wave_completes_it_with_the_survivors() {
    let mut net = launch("balanced:2x4", 8).await;
    let mut s = sum_stream(&net).await;
    s.send(TAG_DIE, "%ad", &[Value::IntArray(vec![5])]).await.unwrap();
    let p = s.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(int(&p), (0..8).sum::<i64>() - 5);
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::single(5));
            // Pre-order: 0 front-end, 1 comm node (ranks 0-3), 6 comm node (ranks 4-7, nodes 7-10).
            let name = "comm node localhost (node 6): link to back-end rank 5 on localhost (node 8)";
            assert!(reason.starts_with(name), "{reason}");
            // Regression: the reason was only "link … closed", without how the process ended.
            assert!(reason.ends_with("; the process exited with status 3"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    // Later waves go on without the lost rank.
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), (0..8).sum::<i64>() - 5);
    finish(net).await;
}

#[tokio::test]
async fn with_recovery_off_a_comm_node_killed_loses_its_subtree_and_the_rest_goes_on() {
    let topo = Topology::from_spec("balanced:2x3", Some(6)).unwrap();
    let mut net = builder(topo).rejoin_within(None).launch().await.unwrap();
    let mut s = sum_stream(&net).await;
    // Pre-order ids: 0 front-end, 1 first comm node (ranks 0-2), 5 second comm node (ranks 3-5).
    let pid = commnode_pid(net.session(), 5);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::range(3, 3));
            assert!(reason.starts_with("front-end: link to comm node localhost (node 5) "), "{reason}");
            assert!(reason.ends_with("; the process was killed by signal 9"), "{reason}");
            let shown = Event::RanksLost { ranks, reason }.to_string();
            assert!(shown.starts_with("lost ranks 3-5: front-end: link to comm node"), "{shown}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 30 + 3);
    finish(net).await;
}

/// Rejoin limit of the recovery tests.
const REJOIN: Duration = Duration::from_secs(10);

async fn launch_recovering(spec: &str, backends: usize) -> Network {
    let topo = Topology::from_spec(spec, Some(backends)).unwrap();
    builder(topo).rejoin_within(Some(REJOIN)).launch().await.unwrap()
}

/// Sum of `x + rank` over `ranks`.
fn sum_over(x: i32, ranks: std::ops::Range<i32>) -> i64 {
    ranks.map(|r| i64::from(x + r)).sum()
}

/// The next event that is not about the clock or a filter, within the limit.
async fn next_membership_event(net: &mut Network) -> Event {
    loop {
        match tokio::time::timeout(LIMIT, net.next_event()).await {
            Ok(Some(
                e @ (Event::NodeLost { .. } | Event::RanksRejoined { .. } | Event::RanksLost { .. }),
            )) => return e,
            Ok(Some(_)) => continue,
            other => panic!("no membership event within {LIMIT:?}: {other:?}"),
        }
    }
}

#[tokio::test]
async fn a_level_one_comm_node_killed_mid_stream_its_sub_tree_rejoins_and_sums_go_on() {
    // Pre-order ids of balanced:2x2x2: 0 front-end; 1 comm node (ranks 0-3) over comm
    // nodes 2 (ranks 0-1) and 5 (ranks 2-3); 8 comm node (ranks 4-7).
    let mut net = launch_recovering("balanced:2x2x2", 8).await;
    let mut s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(10, 0..8));
    let before = backend_pids(net.session());
    // Waves in flight when node 1 dies complete with all ranks or with the survivors.
    for x in 1..=20 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
    }
    let pid = commnode_pid(net.session(), 1);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    for x in 1..=20 {
        let sum = int(&s.recv_timeout(LIMIT).await.unwrap());
        assert!(sum == sum_over(x, 0..8) || sum == sum_over(x, 4..8), "wave {x}: {sum}");
    }
    match next_membership_event(&mut net).await {
        Event::NodeLost { node, ranks, reason } => {
            assert_eq!(node, "comm node localhost (node 1)");
            assert_eq!(ranks, RankSet::range(0, 4));
            assert!(reason.starts_with("front-end: link to comm node localhost (node 1)"), "{reason}");
        }
        other => panic!("expected NodeLost, got {other:?}"),
    }
    let mut back = RankSet::new();
    while back != RankSet::range(0, 4) {
        match next_membership_event(&mut net).await {
            Event::RanksRejoined { ranks, parent } => {
                assert_eq!(parent, "front-end");
                back.union_with(&ranks);
            }
            other => panic!("expected RanksRejoined, got {other:?}"),
        }
    }
    // The next waves include every rank again: the same processes, not new ones.
    for x in 30..40 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
        assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(x, 0..8), "wave {x}");
    }
    assert_eq!(backend_pids(net.session()), before);
    assert!(net.lost().ranks().is_empty(), "{:?}", net.lost());
    finish(net).await;
}

/// The front-end's only comm node killed: every rank of the stream is cut off at
/// once. Each request in flight gets its full answer or, when no rank is left to
/// answer it, `ApiError::NoAnswer` (never a wait past the limit); the stream goes on
/// and, once the orphans are back, every rank answers again.
#[tokio::test]
async fn when_every_rank_is_orphaned_at_once_waves_in_flight_end_and_the_stream_goes_on() {
    let text =
        "localhost:0 => localhost:1 ;\nlocalhost:1 => localhost:2 localhost:3 localhost:4 localhost:5 ;\n";
    let topo = Topology::parse(text).unwrap();
    let mut net = builder(topo).rejoin_within(Some(REJOIN)).launch().await.unwrap();
    let mut s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(0, 0..4));
    for x in 1..=20 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
    }
    let pid = commnode_pid(net.session(), 1);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    for x in 1..=20 {
        match s.recv_timeout(LIMIT).await {
            Ok(p) => assert_eq!(int(&p), sum_over(x, 0..4), "wave {x}"),
            Err(ApiError::NoAnswer(id)) => assert_eq!(id, s.id()),
            Err(e) => panic!("wave {x}: {e}"),
        }
    }
    let mut back = RankSet::new();
    while back != RankSet::range(0, 4) {
        match next_membership_event(&mut net).await {
            Event::NodeLost { ranks, .. } => assert_eq!(ranks, RankSet::range(0, 4)),
            Event::RanksRejoined { ranks, .. } => back.union_with(&ranks),
            other => panic!("expected NodeLost or RanksRejoined, got {other:?}"),
        }
    }
    for x in 30..40 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
        assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(x, 0..4), "wave {x}");
    }
    assert!(net.lost().ranks().is_empty(), "{:?}", net.lost());
    finish(net).await;
}

#[tokio::test]
async fn a_level_two_comm_node_killed_its_back_ends_rejoin_its_parent_and_a_new_stream_reaches_them() {
    let mut net = launch_recovering("balanced:2x2x2", 8).await;
    let mut s = sum_stream(&net).await;
    // Node 9 is the comm node of ranks 4-5, under node 8.
    let pid = commnode_pid(net.session(), 9);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    match next_membership_event(&mut net).await {
        Event::NodeLost { node, ranks, .. } => {
            assert_eq!((node.as_str(), ranks), ("comm node localhost (node 9)", RankSet::range(4, 2)));
        }
        other => panic!("expected NodeLost, got {other:?}"),
    }
    let mut back = RankSet::new();
    while back != RankSet::range(4, 2) {
        match next_membership_event(&mut net).await {
            Event::RanksRejoined { ranks, parent } => {
                assert_eq!(parent, "comm node localhost (node 8)");
                let shown = Event::RanksRejoined { ranks: ranks.clone(), parent }.to_string();
                assert!(shown.contains("rejoined under comm node localhost (node 8)"), "{shown}");
                back.union_with(&ranks);
            }
            other => panic!("expected RanksRejoined, got {other:?}"),
        }
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(1)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(1, 0..8));
    let mut fresh = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    fresh.send(TAG_ADD_RANK, "%d", &[Value::Int(2)]).await.unwrap();
    assert_eq!(int(&fresh.recv_timeout(LIMIT).await.unwrap()), sum_over(2, 0..8));
    finish(net).await;
}

#[tokio::test]
async fn a_stopped_comm_node_is_cut_off_and_its_back_ends_rejoin() {
    let topo = Topology::from_spec("balanced:2x3", Some(6)).unwrap();
    let builder = builder(topo).dead_after(Some(Duration::from_secs(2))).rejoin_within(Some(REJOIN));
    let mut net = builder.launch().await.unwrap();
    let mut s = sum_stream(&net).await;
    let pid = commnode_pid(net.session(), 5);
    Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(10, 0..3));
    match next_membership_event(&mut net).await {
        Event::NodeLost { ranks, reason, .. } => {
            assert_eq!(ranks, RankSet::range(3, 3));
            assert!(reason.contains("nothing arrived for"), "{reason}");
        }
        other => panic!("expected NodeLost, got {other:?}"),
    }
    let mut back = RankSet::new();
    while back != RankSet::range(3, 3) {
        match next_membership_event(&mut net).await {
            Event::RanksRejoined { ranks, .. } => back.union_with(&ranks),
            other => panic!("expected RanksRejoined, got {other:?}"),
        }
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(20)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(20, 0..6));
    // The stopped node was killed by its parent: nothing is left behind.
    finish(net).await;
}

/// Back-end pids of a session (the processes running `treecast backend`).
fn backend_pids(session: &str) -> Vec<u32> {
    processes_with_env(&format!("TREECAST_SESSION={session}"))
        .into_iter()
        .filter(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.ends_with(b"backend\0")))
        .collect()
}

#[tokio::test]
async fn with_recovery_off_a_stopped_comm_node_is_cut_off_after_the_silence_limit_and_the_rest_goes_on() {
    let topo = Topology::from_spec("balanced:2x3", Some(6)).unwrap();
    let builder = builder(topo).dead_after(Some(Duration::from_secs(2))).rejoin_within(None);
    let mut net = builder.launch().await.unwrap();
    let mut s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 60 + 15);
    // Comm node 5 (ranks 3-5) stops: it neither reads nor writes, its links stay open.
    let pid = commnode_pid(net.session(), 5);
    let below = backend_pids(net.session());
    Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    // The wave completes with the live ranks once the stopped node is cut off.
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 30 + 3);
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::range(3, 3));
            assert!(reason.contains("nothing arrived for"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 30 + 3);
    // Its back-ends lost their parent's heartbeats too and left on their own.
    let deadline = Instant::now() + LIMIT;
    while below.iter().filter(|p| !common::is_zombie(Path::new(&format!("/proc/{p}")))).count() > 3 {
        assert!(Instant::now() < deadline, "the stopped node's back-ends are still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Resumed, it finds its links closed and ends: nothing is left behind.
    Command::new("kill").args(["-CONT", &pid.to_string()]).status().unwrap();
    finish(net).await;
}

#[tokio::test]
async fn a_stopped_backend_is_cut_off_but_a_busy_one_is_not() {
    let topo = Topology::from_spec("flat", Some(3)).unwrap();
    let mut net = builder(topo).dead_after(Some(Duration::from_secs(2))).launch().await.unwrap();
    let mut s = sum_stream(&net).await;
    // Rank 1 stops reading for 3 s but its driver runs: its heartbeats keep it in.
    s.send(TAG_STALL, "%ad %d", &[Value::IntArray(vec![1]), Value::Int(3000)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 3);
    assert!(net.lost_ranks().is_empty(), "a busy tool is not a hung node");
    let pids = backend_pids(net.session());
    assert_eq!(pids.len(), 3);
    for pid in &pids {
        Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
    }
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { reason, .. }) => assert!(reason.contains("nothing arrived for"), "{reason}"),
        other => panic!("expected RanksLost, got {other:?}"),
    }
    for pid in &pids {
        Command::new("kill").args(["-CONT", &pid.to_string()]).status().unwrap();
    }
    finish(net).await;
}

#[test]
fn chaos_runs_kill_and_stop_nodes_without_hangs_wrong_answers_or_leftovers() {
    let t = tag();
    let out = treecast(
        &t,
        &[
            "bench",
            "chaos",
            "--local",
            "8",
            "--topology",
            "kary:2",
            "--runs",
            "10",
            "--waves",
            "15",
            "--faults",
            "2",
            "--stop-fraction",
            "0.4",
            "--dead-after",
            "1",
            "--seed",
            "7",
            "--during",
            "reduce",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let totals = &report["totals"];
    assert_eq!(totals["faults"], 20, "{totals}");
    // Recovery is on by default: the orphans of the faulted comm nodes rejoin (their
    // fallbacks are never faulted with this seed), and none is reported lost.
    for key in ["hangs", "wrong", "left", "panics", "live_ranks_lost", "orphaned_ranks"] {
        assert_eq!(totals[key], 0, "{key}: {report}");
    }
    assert!(totals["rejoined_ranks"].as_u64().unwrap() > 0, "{totals}");
    assert!(totals["waves"].as_u64().unwrap() > 100, "{totals}");
    assert!(out.status.success());
}

#[test]
fn a_chaos_run_counts_every_orphan_of_a_killed_comm_node_once_it_has_rejoined() {
    // Regression: the run was counted while the orphans were still on their way back,
    // so killing a comm node showed 0 orphaned and 0 (or some) rejoined ranks.
    let t = tag();
    let out = treecast(
        &t,
        &[
            "bench",
            "chaos",
            "--local",
            "16",
            "--topology",
            "balanced:4x4",
            "--runs",
            "3",
            "--waves",
            "1",
            "--faults",
            "1",
            "--stop-fraction",
            "0",
            "--during",
            "reduce",
            "--seed",
            "8",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let mut comm_node_kills = 0;
    for run in report["runs"].as_array().unwrap() {
        if run["faults"][0].as_str().unwrap().starts_with("SIGKILL comm node") {
            comm_node_kills += 1;
            // Each comm node of balanced:4x4 holds 4 back-ends; none was faulted itself.
            assert_eq!(run["rejoined_ranks"], 4, "{run}");
            assert_eq!(run["orphaned_ranks"], 0, "{run}");
        }
    }
    assert!(comm_node_kills > 0, "seed 8 no longer strikes a comm node: {report}");
    assert!(out.status.success());
}

#[test]
fn chaos_runs_strike_during_file_transfers_and_start_up_without_hangs_wrong_copies_or_leftovers() {
    let t = tag();
    let args: Vec<&str> = "bench chaos --local 8 --topology kary:2 --runs 6 --waves 5 --faults 2 \
         --dead-after 1 --file-size 1000000 --during bcast,startup --seed 7 --json"
        .split_whitespace()
        .collect();
    let out = treecast(&t, &args);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let totals = &report["totals"];
    for key in ["hangs", "wrong", "left", "panics", "live_ranks_lost"] {
        assert_eq!(totals[key], 0, "{key}: {report}");
    }
    let (bcast, startup) = (&totals["phases"]["bcast"], &totals["phases"]["startup"]);
    assert_eq!(bcast["runs"], 3, "{totals}");
    assert_eq!(startup["runs"], 3, "{totals}");
    // Every strike of a transfer lands (at a byte count it reaches); one of a start-up
    // lands unless the tree was up before its process was seen.
    assert_eq!(bcast["faults"], 6, "{totals}");
    assert!(startup["faults"].as_u64().unwrap() > 0, "{totals}");
    let runs = report["runs"].as_array().unwrap();
    assert!(runs.iter().all(|r| r["phase"] == "bcast" || r["phase"] == "startup"), "{report}");
    assert!(out.status.success());
}

#[test]
fn the_global_clock_recovers_injected_offsets_within_its_bounds() {
    let (k, v) = tag().split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).unwrap();
    let out = Command::new(TREECAST)
        .args(["clock", "--local", "8", "--topology", "kary:2", "--rounds", "1", "--json"])
        .env(&k, &v)
        .env("TREECAST_CLOCK_DISTORT", "seed:11,offset_us:900000,drift_ppm:0")
        .output()
        .unwrap();
    assert_no_leftovers(&format!("{k}={v}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let nodes = report["nodes"].as_array().unwrap();
    let topo = Topology::from_spec("kary:2", Some(8)).unwrap();
    assert_eq!(nodes.len(), topo.len() - 1, "every node but the front-end: {report}");
    let mut far = 0;
    for n in nodes {
        let injected = n["injected_ns"].as_i64().unwrap();
        let error = n["estimate_error_ns"].as_i64().unwrap().unsigned_abs();
        // A reply is stamped between the probe's sending and the answer's arrival, so
        // the estimate cannot be further off than half the round trip of each link.
        assert!(error <= n["error_bound_ns"].as_u64().unwrap(), "{n}");
        far += usize::from(injected.unsigned_abs() > 1_000);
    }
    assert!(far > nodes.len() / 2, "the knob distorted the clocks: {report}");
}

#[test]
fn the_cross_check_compares_the_estimates_with_the_truth_at_the_same_instant() {
    // Regression: with --cross-check the injected offsets were read after the
    // cross-check, so a drifting clock showed errors of its drift times 0.3 s.
    let (k, v) = tag().split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).unwrap();
    let out = Command::new(TREECAST)
        .args([
            "clock",
            "--local",
            "4",
            "--topology",
            "kary:2",
            "--rounds",
            "2",
            "--cross-check",
            "400",
            "--json",
        ])
        .env(&k, &v)
        .env("TREECAST_CLOCK_DISTORT", "seed:5,offset_us:900000,drift_ppm:2000")
        .output()
        .unwrap();
    assert_no_leftovers(&format!("{k}={v}"));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(report["cross_check"]["compared"].as_u64().unwrap() > 0, "{report}");
    for n in report["nodes"].as_array().unwrap() {
        let error = n["estimate_error_ns"].as_i64().unwrap().unsigned_abs();
        assert!(error <= n["error_bound_ns"].as_u64().unwrap(), "{n}");
    }
}

#[test]
fn chaos_runs_in_the_simulated_tree_from_the_command_line() {
    let t = tag();
    let args =
        ["bench", "chaos", "--sim", "--runs", "20", "--waves", "10", "--faults", "2", "--max-nodes", "60"];
    let out = treecast(&t, &[&args[..], &["--seed", "3", "--json"]].concat());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let totals = &report["totals"];
    assert_eq!(totals["simulated"], true, "{totals}");
    assert_eq!(totals["runs"], 20, "{totals}");
    // Reduce runs strike before waves, always; start-up runs only while the tree starts.
    let reduce = &totals["phases"]["reduce"];
    assert_eq!(reduce["faults"].as_u64(), reduce["runs"].as_u64().map(|r| 2 * r), "{totals}");
    assert_eq!(reduce["runs"].as_u64().unwrap() + totals["phases"]["startup"]["runs"].as_u64().unwrap(), 20);
    for key in ["hangs", "wrong", "left", "panics", "live_ranks_lost"] {
        assert_eq!(totals[key], 0, "{key}: {report}");
    }
    assert_eq!(report["runs"][5]["sim"]["seed"], 8, "run k has seed + k");
    assert!(report["runs"].as_array().unwrap().iter().all(|r| r["sim"]["nodes"].as_u64().unwrap() <= 60));
    assert!(out.status.success());
    // The text form prints each of these few runs, then the totals.
    let out = treecast(&t, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with("run ")).count(), 20, "{text}");
    assert!(text.lines().last().unwrap().starts_with("totals: "), "{text}");
}

#[tokio::test]
async fn a_stream_whose_members_are_all_lost_is_closed_not_hung() {
    let net = launch("flat", 3).await;
    let comm = net.communicator(RankSet::single(1)).unwrap();
    let mut s = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    s.send(TAG_DIE, "%ad", &[Value::IntArray(vec![1])]).await.unwrap();
    let err = s.recv_timeout(LIMIT).await.unwrap_err();
    assert!(matches!(err, ApiError::StreamClosed(_)), "{err}");
    finish(net).await;
}

#[tokio::test]
async fn mismatched_formats_are_reported_and_the_wave_goes_on() {
    let mut net = launch("flat", 4).await;
    let mut s = sum_stream(&net).await;
    for rank in 0..4u32 {
        if rank == 2 {
            s.send_to(rank, TAG_ECHO, "%lf", &[Value::Double(1.5)]).await.unwrap();
        } else {
            s.send_to(rank, TAG_ECHO, "%d", &[Value::Int(rank as i32 + 10)]).await.unwrap();
        }
    }
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 10 + 11 + 13);
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::FilterError { rank, message, .. }) => {
            assert_eq!(rank, 2);
            assert!(message.contains("%lf") && message.contains("%d"), "{message}");
        }
        other => panic!("expected FilterError, got {other:?}"),
    }
    finish(net).await;
}

#[tokio::test]
async fn time_out_filter_releases_a_partial_wave() {
    let net = launch("flat", 4).await;
    let options = StreamOptions { sync: SyncMode::TimeOut(300), ..StreamOptions::reduce(TransformKind::Sum) };
    let mut s = net.new_stream(&net.broadcast_communicator(), options).await.unwrap();
    for rank in 0..4u32 {
        let ms = if rank == 3 { 3000 } else { 0 };
        s.send_to(rank, TAG_SLEEP, "%d", &[Value::Int(ms)]).await.unwrap();
    }
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 1 + 2, "ranks 0, 1 and 2");
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 3);
    finish(net).await;
}

#[tokio::test]
async fn format_errors_are_caught_at_the_sender() {
    let net = launch("flat", 2).await;
    let s = net.new_stream(&net.broadcast_communicator(), StreamOptions::default()).await.unwrap();
    let err = s.send(TAG_ECHO, "%d %s", &[Value::Int(1), Value::Int(2)]).await.unwrap_err();
    assert!(err.to_string().contains("value 1"), "{err}");
    let err = s.send(TAG_ECHO, "%q", &[]).await.unwrap_err();
    assert!(err.to_string().contains("column"), "{err}");
    let err = s.send_to(7, TAG_ECHO, "", &[]).await.unwrap_err();
    assert!(matches!(err, ApiError::NoSuchRanks { .. }), "{err}");
    assert!(net.communicator(RankSet::range(1, 5)).is_err());
    finish(net).await;
}

#[tokio::test]
async fn a_backend_that_cannot_start_is_named_with_its_stderr() {
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let err = builder(topo)
        .backend_command(["/bin/sh", "-c", "echo boom on $TREECAST_RANK >&2; exit 7"])
        .launch()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("back-end rank"), "{err}");
    assert!(err.contains("exited with status 7"), "{err}");
    assert!(err.contains("boom on"), "{err}");

    let topo = Topology::from_spec("flat", Some(2)).unwrap();
    let err = builder(topo).backend_command(["/nonexistent/tool"]).launch().await.unwrap_err().to_string();
    assert!(err.contains("/nonexistent/tool") && err.contains("back-end rank 0"), "{err}");
}

/// Not a test on its own: a back-end that panics at once. Runs only when re-executed
/// by `a_start_up_error_is_printed_once_with_the_childs_panic_message`.
#[test]
fn panicking_backend_entry() {
    if std::env::var("TREECAST_PANIC_ENTRY").is_err() {
        return;
    }
    let rank = std::env::var("TREECAST_RANK").unwrap_or_default();
    panic!("rank {rank} cannot read its settings file /etc/tool-test.conf");
}

#[test]
fn a_start_up_error_is_printed_once_with_the_childs_panic_message() {
    // Regression: at depth 3 every comm node logged the error, its parent forwarded
    // the log, and the front-end printed it again (three times in all); with
    // RUST_BACKTRACE set the backtrace pushed the panic message out of the report.
    let dir = TestDir::new("printed-once");
    let script = dir.path("treecast-wrapper");
    let text = format!(
        "#!/bin/sh\nif [ \"$1\" = backend ] && [ \"$TREECAST_RANK\" = 5 ]; then exec {} panicking_backend_entry \
         --exact --nocapture --test-threads=1; fi\nexec {TREECAST} \"$@\"\n",
        std::env::current_exe().unwrap().display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tag = tag();
    let (k, v) = tag.split_once('=').unwrap();
    let out = Command::new(TREECAST)
        .args(["run", "--local", "8", "--topology", "balanced:2x2x2", "--", "true"])
        .env(k, v)
        .env("TREECAST_PATH", &script)
        .env("TREECAST_PANIC_ENTRY", "1")
        .env("RUST_BACKTRACE", "1")
        .env_remove("TREECAST_LOG")
        .output()
        .unwrap();
    assert_no_leftovers(&tag);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("exited with status 101").count(), 1, "{stderr}");
    assert!(!stderr.contains("ERROR"), "no comm node logs it on the way: {stderr}");
    let (_, error) = stderr.split_once("treecast: error: ").unwrap_or_default();
    assert!(!error.contains("treecast: error: "), "printed once: {stderr}");
    assert!(
        error.starts_with(
            "starting the network failed: back-end rank 5 on localhost (node 11) exited before connecting"
        ),
        "{error}"
    );
    assert!(error.contains("rank 5 cannot read its settings file /etc/tool-test.conf"), "{error}");
}

#[tokio::test]
async fn a_peer_with_the_wrong_secret_is_refused() {
    let topo = Topology::from_spec("flat", Some(2)).unwrap();
    let wrong = "00".repeat(32);
    let script = format!("TREECAST_SECRET={wrong} exec {TREECAST} backend");
    let err = builder(topo)
        .backend_command(["/bin/sh", "-c", &script])
        .startup_timeout(Duration::from_secs(5))
        .launch()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("refused our proof"), "{err}");
}

/// Not a test on its own: the body of a rogue back-end that authenticates, reports
/// ready, then sends bytes that are not a frame. Runs only when re-executed by
/// `a_malformed_frame_closes_only_that_link`.
#[tokio::test]
async fn rogue_backend_entry() {
    if std::env::var("TREECAST_ROGUE").is_err() {
        return;
    }
    use tokio::io::AsyncWriteExt;
    let parent = std::env::var("TREECAST_PARENT").unwrap();
    let node_id: u32 = std::env::var("TREECAST_NODE_ID").unwrap().parse().unwrap();
    let secret = treecast_driver::read_secret().unwrap();
    let mut stream = treecast_driver::connect_to(&parent, node_id, &secret, LIMIT).await.unwrap();
    let rank: u32 = std::env::var("TREECAST_RANK").unwrap().parse().unwrap();
    let join = treecast_wire::ControlMsg::Join { ranks: RankSet::single(rank), commnodes: 0 };
    let mut bytes = bytes::BytesMut::new();
    treecast_proto::control_frame(&join).encode(&mut bytes);
    stream.write_all(&bytes).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    if std::env::var("TREECAST_ROGUE").as_deref() == Ok("huge") {
        // A header announcing 200 MiB, then a trickle: the parent must refuse it, not buffer it.
        let mut header = bytes::BytesMut::new();
        treecast_wire::FrameHeader::data(1, 0, rank).encode(200 << 20, &mut header);
        // The parent may close the link as soon as it reads the header: a failed
        // write is the expected end of this rogue, not an error of the test.
        let _ = stream.write_all(&header).await;
        let _ = stream.write_all(&[0u8; 4096]).await;
    } else {
        let _ = stream.write_all(&[0xEE; 64]).await;
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
}

/// Launches balanced:2x2 where rank 1 is the rogue back-end in `mode`.
async fn with_rogue_rank_1(mode: &str) -> Network {
    let test_bin = std::env::current_exe().unwrap();
    let script = format!(
        "if [ \"$TREECAST_RANK\" = 1 ]; then exec {} rogue_backend_entry --exact --nocapture --test-threads=1; else exec {TREECAST} backend; fi",
        test_bin.display()
    );
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    builder(topo)
        .backend_command(["/bin/sh", "-c", &script])
        .env("TREECAST_ROGUE", mode)
        .launch()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_frame_over_the_size_limit_is_refused_before_it_is_buffered() {
    // Regression: one header announcing 256 MiB from an authenticated child cost its
    // comm node 230 MB at once. Now it closes that link and nothing else.
    let mut net = with_rogue_rank_1("huge").await;
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::single(1));
            assert!(reason.contains("over this node's limit"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    let mut s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 2 + 3);
    finish(net).await;
}

#[tokio::test]
async fn a_malformed_frame_closes_only_that_link() {
    let mut net = with_rogue_rank_1("malformed").await;
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::single(1));
            assert!(reason.contains("malformed frame"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    let mut s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 2 + 3);
    finish(net).await;
}

/// Not a test on its own: a back-end that answers the first request (`%d n`) with `n`
/// packets of its rank and returns at once, dropping its `BackEnd` without `close()`
/// as a tool's `main` would. Runs only when re-executed by
/// `a_backend_that_returns_right_after_sending_loses_nothing`.
#[tokio::test]
async fn send_and_return_backend_entry() {
    if std::env::var("TREECAST_SEND_AND_RETURN").is_err() {
        return;
    }
    let mut be = treecast_api::BackEnd::connect().await.unwrap();
    let p = be.recv().await.unwrap();
    for _ in 0..int(&p) {
        be.send(p.stream(), p.tag(), "%d", &[Value::Int(be.rank() as i32)]).await.unwrap();
    }
}

/// Regression: `send` only queued, so a back-end that returned right after sending
/// lost its last packets (a 32-rank sum came out short, with no error anywhere).
#[tokio::test]
async fn a_backend_that_returns_right_after_sending_loses_nothing() {
    // Its harness's report goes to /dev/null, not into this test's output.
    let script = format!(
        "exec {} send_and_return_backend_entry --exact --test-threads=1 >/dev/null",
        std::env::current_exe().unwrap().display()
    );
    let command = ["/bin/sh".to_owned(), "-c".to_owned(), script];
    const PACKETS: i32 = 200;
    for unix in [true, false] {
        let topo = Topology::from_spec("balanced:4x8", None).unwrap();
        let net = builder(topo)
            .unix_links(unix)
            .backend_command(command.clone())
            .env("TREECAST_SEND_AND_RETURN", "1")
            .launch()
            .await
            .unwrap();
        let n = i64::from(net.backends());
        let mut s = sum_stream(&net).await;
        s.send(TAG_ECHO, "%d", &[Value::Int(PACKETS)]).await.unwrap();
        for wave in 0..PACKETS {
            let p = s.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("wave {wave} (unix {unix}): {e}"));
            assert_eq!(int(&p), n * (n - 1) / 2, "wave {wave} (unix {unix}): a rank's packet was lost");
        }
        finish(net).await;
    }
}

#[tokio::test]
async fn once_the_tree_is_up_no_process_shows_the_secret_in_proc() {
    // Regression: `treecast run` kept the secret out of a command's environment, but
    // the command could read it in its back-end's /proc/PID/environ.
    let dir = TestDir::new("secret");
    // Each back-end's shell saves the secret it was given, then becomes the back-end.
    let script = format!(
        "printf %s \"$TREECAST_SECRET\" > {}/secret.$TREECAST_RANK; exec {TREECAST} backend",
        dir.root().display()
    );
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let net = builder(topo).backend_command(["/bin/sh", "-c", &script]).launch().await.unwrap();
    let secret = std::fs::read_to_string(dir.path("secret.0")).unwrap();
    assert_eq!(secret.len(), 64, "{secret:?}");
    let session = processes_with_env(&format!("TREECAST_SESSION={}", net.session()));
    assert_eq!(session.len(), 2 + 4, "every comm node and back-end is readable here: {session:?}");
    for pid in session {
        for what in ["environ", "cmdline"] {
            let bytes = std::fs::read(format!("/proc/{pid}/{what}")).unwrap();
            let shown = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!shown, "process {pid} shows the secret in /proc/{pid}/{what}");
        }
    }
    // And the tree still works: the secret is gone from the environment only.
    let mut s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 6);
    finish(net).await;
}

// ---- the command line ----

/// A unique tag put in the environment of a CLI run, inherited by its whole tree.
fn tag() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("TREECAST_TEST_TAG={}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn treecast(tag: &str, args: &[&str]) -> std::process::Output {
    let (k, v) = tag.split_once('=').unwrap();
    let out = Command::new(TREECAST).args(args).env(k, v).output().unwrap();
    assert_no_leftovers(tag);
    out
}

/// The write end of a pipe whose reader has already gone: a process writing to it
/// gets EPIPE at once, whatever it writes and whenever.
fn closed_pipe() -> std::process::Stdio {
    let mut reader = Command::new("true").stdin(std::process::Stdio::piped()).spawn().unwrap();
    let writer = reader.stdin.take().unwrap();
    reader.wait().unwrap();
    writer.into()
}

#[test]
fn every_subcommand_exits_quietly_with_status_0_on_a_closed_stdout() {
    // Regression: `treecast bcast ... --json | head -c 400` panicked with a backtrace
    // (print! on a broken pipe); `run` already returned the write error quietly.
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let dir = TestDir::new("closed-stdout");
    std::fs::write(dir.path("src"), b"data").unwrap();
    let (src, dst) = (dir.path("src").display().to_string(), dir.path("dst").display().to_string());
    for args in [
        &["topo", "kary:4", "--backends", "64"][..],
        &["hosts", "-e", "n[1-100]"],
        &["bcast", &src, &dst, "--local", "2", "--json"],
        &["bcast", &src, &dst, "--local", "2", "--mode", "overwrite"],
        &["run", "--local", "2", "--", "echo", "hi"],
    ] {
        let out = Command::new(TREECAST).args(args).env(k, v).stdout(closed_pipe()).output().unwrap();
        assert_no_leftovers(&t);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(0), "{args:?}: {stderr}");
        assert!(stderr.is_empty(), "{args:?}: {stderr}");
    }
}

#[test]
fn pdsh_and_clush_flags_work_and_unknown_ones_get_a_tip_naming_the_treecast_flag() {
    // Regression: `-w` got clap's tip "to pass '-w' as a value, use '-- -w'".
    let t = tag();
    let out = treecast(
        &t,
        &[
            "run",
            "-w",
            "localhost",
            "--per-host",
            "2",
            "-f",
            "4",
            "-t",
            "20",
            "-u",
            "20",
            "-b",
            "-S",
            "-L",
            "--",
        ]
        .into_iter()
        .chain(["sh", "-c", "echo out; echo err >&2; exit $((3 + TREECAST_RANK))"])
        .collect::<Vec<_>>(),
    );
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(stdout, "localhost#0: out\nlocalhost#1: out\n", "{stderr}");
    assert!(stderr.contains("localhost#1: err\ntreecast: localhost#1: exit 4\n"), "{stderr}");
    assert_eq!(out.status.code(), Some(4), "the largest status, as pdsh -S");
    let out = treecast(&t, &["run", "-R", "ssh", "-w", "localhost", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("tip: treecast starts processes with --launcher"), "{stderr}");
    assert!(!stderr.contains("use '-- -R'"), "{stderr}");
}

#[test]
fn bad_input_from_the_environment_flags_and_files_gets_a_clear_error_and_no_panic() {
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let dir = TestDir::new("bad-input");
    let with_env = |var: &str, value: &str, args: &[&str]| {
        let out = Command::new(TREECAST).args(args).env(k, v).env(var, value).output().unwrap();
        assert_no_leftovers(&t);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    };
    let run = ["run", "--local", "2", "--", "true"];
    for (var, value, says) in [
        (
            "TREECAST_STARTUP_TIMEOUT",
            "1e20",
            "TREECAST_STARTUP_TIMEOUT=\"1e20\" is not a number of seconds from 0.1",
        ),
        (
            "TREECAST_DEAD_AFTER",
            "1e-300",
            "TREECAST_DEAD_AFTER=\"1e-300\" is not 0 (off) or a number of seconds from 0.1",
        ),
        ("TREECAST_REJOIN_WITHIN", "nan", "TREECAST_REJOIN_WITHIN=\"nan\" is not 0 (off)"),
        ("TREECAST_MAX_FRAME", "1", "TREECAST_MAX_FRAME=\"1\" is not a number of bytes from 1114112"),
    ] {
        let (code, stderr) = with_env(var, value, &run);
        assert_eq!(code, Some(2), "{var}={value}: {stderr}");
        assert!(stderr.contains(says) && !stderr.contains("panicked"), "{var}={value}: {stderr}");
    }
    // The flag replaces the variable.
    let (code, stderr) = with_env(
        "TREECAST_DEAD_AFTER",
        "1e-300",
        &["run", "--local", "1", "--dead-after", "5", "--", "true"],
    );
    assert_eq!(code, Some(0), "{stderr}");

    let attach = dir.path("a.attach");
    let attach = attach.to_str().unwrap();
    let out = treecast(&t, &["run", "--local", "1", "--attach", attach, "--attach-timeout=-1", "--", "true"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stderr.contains("--attach-timeout -1 is not a number of seconds")
            && !stderr.contains("waiting up to"),
        "{stderr}"
    );

    // Files are read up to 64 MiB, as host files are.
    for (args, says) in [
        (&["topo", "/dev/zero"][..], "larger than 64 MiB, the limit of topology files"),
        (&["monitor", "/dev/zero"], "larger than 64 MiB, the limit of monitor reports"),
        (&["topo", "karry:4", "--backends", "16"], "did you mean `kary`?"),
    ] {
        let out = treecast(&t, args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }

    // A long cycle is named by its first nodes and its length, on a short line.
    let mut cycle = String::from("fe:0 => x:0 ;\n");
    for i in 0..100_000 {
        cycle.push_str(&format!("n{i}:0 => n{}:0 ;\n", (i + 1) % 100_000));
    }
    let top = dir.path("cycle.top");
    std::fs::write(&top, cycle).unwrap();
    let out = treecast(&t, &["topo", top.to_str().unwrap()]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("(100000 nodes in the cycle)") && stderr.len() < 1000,
        "{}",
        &stderr[..stderr.len().min(2000)]
    );

    // A damaged report: its own parse error, and a sum no recording makes.
    let mut rec = treecast_monitor::Recorder::default();
    let key = treecast_monitor::Key { link: 1, up: true, tag: 1, program: 0 };
    rec.record(key, treecast_monitor::Component::Net, 10, 1_000);
    let good: serde_json::Value = serde_json::from_str(&rec.report().to_json()).unwrap();
    for (field, value, says) in [
        ("count", serde_json::json!(-1), "invalid value: integer `-1`"),
        ("sum_ns", serde_json::json!(u64::MAX), "more than the 1"),
    ] {
        let mut bad = good.clone();
        bad["cells"][0][field] = value;
        let path = dir.path("bad.json");
        std::fs::write(&path, bad.to_string()).unwrap();
        let out = treecast(&t, &["monitor", path.to_str().unwrap()]);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{field}: {stderr}");
        assert!(stderr.contains(says), "{field}: {stderr}");
    }
}

#[test]
fn run_groups_outputs_by_equivalence_class() {
    let t = tag();
    let out = treecast(
        &t,
        &[
            "run",
            "--local",
            "8",
            "--topology",
            "kary:4",
            "--",
            "sh",
            "-c",
            "echo $((TREECAST_RANK % 2)) of $TREECAST_SIZE",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("---- [0,2,4,6] (4 ranks) ----\n0 of 8\n"), "{stdout}");
    assert!(stdout.contains("---- [1,3,5,7] (4 ranks) ----\n1 of 8\n"), "{stdout}");
    assert!(stdout.contains("8 back-ends; exit 0: 8 [0-7]"), "{stdout}");
}

#[test]
fn run_reports_failures_in_json_and_exit_status() {
    let t = tag();
    let out = treecast(&t, &["run", "--local", "4", "--json", "--", "sh", "-c", "[ $TREECAST_RANK != 2 ]"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let classes = report["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2);
    assert_eq!(classes[0]["ranks"], "0-1,3");
    assert_eq!(classes[1]["ranks"], "2");
    assert_eq!(classes[1]["exit_code"], 1);
}

#[test]
fn run_groups_by_exact_bytes_and_json_keeps_them() {
    let t = tag();
    // Ranks 0 and 1 differ only in one invalid UTF-8 byte; rank 2 writes what rank 0 does.
    let script = r#"case $TREECAST_RANK in 1) printf 'a\376b' ;; *) printf 'a\377b' ;; esac"#;
    let out = treecast(&t, &["run", "--local", "3", "--json", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let classes = report["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2, "{report}");
    assert_eq!(classes[0]["ranks"], "0,2");
    assert_eq!(classes[1]["ranks"], "1");
    use base64::Engine;
    let decode = |v: &serde_json::Value| {
        assert_eq!(v["stdout_encoding"], "base64", "{v}");
        base64::engine::general_purpose::STANDARD.decode(v["stdout"].as_str().unwrap()).unwrap()
    };
    assert_eq!(decode(&classes[0]), b"a\xffb");
    assert_eq!(decode(&classes[1]), b"a\xfeb");
    // Text output is written as the ranks wrote it, byte for byte.
    let out = treecast(&t, &["run", "--local", "3", "--", "sh", "-c", script]);
    let stdout = out.stdout;
    assert!(stdout.windows(4).any(|w| w == b"a\xffb\n"), "{}", String::from_utf8_lossy(&stdout));
    assert!(stdout.windows(4).any(|w| w == b"a\xfeb\n"), "{}", String::from_utf8_lossy(&stdout));
}

#[test]
fn run_groups_outputs_that_differ_past_the_output_limit_apart() {
    let t = tag();
    // 2 MiB of `x`, then a last line that differs by rank parity: the part shown is equal.
    let script = "head -c 2097152 /dev/zero | tr '\\0' x; echo; echo $((TREECAST_RANK % 2))";
    let out = treecast(&t, &["run", "--local", "4", "--json", "--", "sh", "-c", script]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let classes = report["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2, "ranks that differ after the first MiB are two groups");
    assert_eq!((classes[0]["ranks"].as_str(), classes[1]["ranks"].as_str()), (Some("0,2"), Some("1,3")));
    for c in classes {
        assert_eq!(c["stdout"].as_str().unwrap().len(), 1 << 20, "the default limit is 1 MiB");
        assert_eq!(c["stdout_bytes"], (2 << 20) + 3);
    }
    // The limit is a flag, and the text report says how much was cut.
    let out = treecast(&t, &["run", "--local", "2", "--output-limit", "10", "--", "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout
            .contains("---- [0] (1 rank) ----\nxxxxxxxxxx\n[treecast: stdout cut: 10 of 2097155 bytes shown"),
        "{stdout}"
    );
    assert!(stdout.contains("---- [1] (1 rank) ----\n"), "{stdout}");
}

#[test]
fn run_exits_with_the_largest_status_and_names_signals() {
    let t = tag();
    let script = "case $TREECAST_RANK in 0) exit 0 ;; 1) exit 3 ;; 2) exit 137 ;; *) kill -KILL $$ ;; esac";
    let out = treecast(&t, &["run", "--local", "4", "--", "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    // exit 137 and SIGKILL are different outcomes, though a shell would print 137 for both.
    assert!(stdout.contains("---- [2] (1 rank) exit 137 ----"), "{stdout}");
    assert!(stdout.contains("---- [3] (1 rank) killed by SIGKILL ----"), "{stdout}");
    assert!(
        stdout.contains("exit 0: 1 [0], exit 3: 1 [1], exit 137: 1 [2], killed by SIGKILL: 1 [3]"),
        "{stdout}"
    );
    assert_eq!(out.status.code(), Some(137), "the largest status");
    let out = treecast(
        &t,
        &["run", "--local", "2", "--json", "--", "sh", "-c", "[ $TREECAST_RANK = 0 ] || kill -TERM $$"],
    );
    assert_eq!(out.status.code(), Some(128 + 15), "128 + the signal");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["classes"][1]["signal"], "SIGTERM", "{report}");
    assert_eq!(report["classes"][1]["status"], "killed by SIGTERM", "{report}");
    assert_eq!(report["exit_status"], 143, "{report}");
    let out = treecast(&t, &["run", "--local", "2", "--", "sh", "-c", "exit $((TREECAST_RANK + 4))"]);
    assert_eq!(out.status.code(), Some(5));
}

#[test]
fn log_lines_carry_no_colour_codes_when_stderr_is_not_a_terminal() {
    let (k, v) = tag().split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).unwrap();
    let out = Command::new(TREECAST)
        .args(["run", "--local", "4", "--topology", "kary:2", "--", "true"])
        .env(&k, &v)
        .env("TREECAST_LOG", "debug")
        .output()
        .unwrap();
    assert_no_leftovers(&format!("{k}={v}"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("DEBUG"), "the comm nodes' log lines reach the user: {stderr}");
    assert!(!stderr.contains('\x1b'), "colour codes in a pipe: {stderr:?}");
}

/// A directory with an `ssh` that logs its arguments to `ssh.log` and fails, to put
/// first on `PATH`: any use of ssh shows.
fn fake_ssh(dir: &TestDir) -> (String, std::path::PathBuf) {
    let log = dir.path("ssh.log");
    let script = dir.path("ssh");
    std::fs::write(&script, format!("#!/bin/sh\necho \"$@\" >> {}\nexit 255\n", log.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", dir.root().display(), std::env::var("PATH").unwrap_or_default());
    (path, log)
}

#[test]
fn a_topology_file_alone_starts_its_tree_and_every_name_of_this_host_is_local() {
    let dir = TestDir::new("localnames");
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_owned();
    // MRNet files name the front-end and comm nodes by any name of the machine: every
    // one of them is started with fork/exec, at every level, with ssh the launcher.
    let file = dir.path("mixed.top");
    std::fs::write(
        &file,
        format!(
            "localhost:0 => 127.0.0.1:1 {host}:2 ;\n127.0.0.1:1 => localhost:3 127.0.0.2:4 ;\n\
             {host}:2 => {host}:5 127.0.0.1:6 localhost:7 ;\n"
        ),
    )
    .unwrap();
    let (path, log) = fake_ssh(&dir);
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let run = |extra: &[&str]| {
        let out = Command::new(TREECAST)
            .args(["run", "--topology", file.to_str().unwrap()])
            .args(extra)
            .args(["--", "sh", "-c", "echo $TREECAST_RANK/$TREECAST_SIZE"])
            .env(k, v)
            .env("PATH", &path)
            .output()
            .unwrap();
        assert_no_leftovers(&t);
        out
    };
    for extra in [&[][..], &["--launcher", "ssh"], &["--launcher", "local"], &["--local", "5"]] {
        let out = run(extra);
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{extra:?}: {stdout}\n{}", String::from_utf8_lossy(&out.stderr));
        for rank in 0..5 {
            assert!(stdout.contains(&format!("\n{rank}/5\n")), "{extra:?}: rank {rank} missing: {stdout}");
        }
        assert!(stdout.contains("5 back-ends; exit 0: 5 [0-4]"), "{stdout}");
    }
    assert!(!log.exists(), "ssh was used: {}", std::fs::read_to_string(&log).unwrap_or_default());
    // --local N with a file is only a check.
    let out = run(&["--local", "4"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("has 5 back-ends but 4 were asked for"), "{stderr}");
    // --hosts and a file that names the hosts contradict each other.
    let out = run(&["--hosts", "a,b"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--hosts and the topology file"), "{stderr}");
    // `bench microbench` takes the file alone too.
    let out = Command::new(TREECAST)
        .args([
            "bench",
            "microbench",
            "--topology",
            file.to_str().unwrap(),
            "--rt",
            "5",
            "--tp",
            "5",
            "--json",
        ])
        .env(k, v)
        .env("PATH", &path)
        .output()
        .unwrap();
    assert_no_leftovers(&t);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let result: serde_json::Value =
        serde_json::from_slice(out.stdout.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(result["backends"], 5, "{result}");
}

#[test]
fn a_shape_without_a_count_says_what_is_missing() {
    let t = tag();
    let out = treecast(&t, &["run", "--topology", "kary:4", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("kary:4 is a shape, not a topology file"), "{stderr}");
    let out = treecast(&t, &["run", "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --local N, --hosts LIST or --topology FILE"));
}

#[test]
fn run_with_a_timeout_cuts_off_a_stopped_comm_node_and_shows_the_ranks_that_answered() {
    let t = tag();
    // Rank 0's command stops its back-end's comm node (the back-end is the guard's parent).
    // Parents read from /proc with shell builtins only: no `ps` on a bare machine.
    let script = "[ $TREECAST_RANK = 0 ] && { read -r _ _ _ be _ < /proc/$PPID/stat; \
                  read -r _ _ _ cn _ < /proc/$be/stat; kill -STOP $cn; }; echo hi";
    let out = treecast(
        &t,
        &[
            "run",
            "--local",
            "4",
            "--topology",
            "kary:2",
            "--timeout",
            "1",
            "--dead-after",
            "5",
            // Without recovery the cut-off ranks are lost; with it they rejoin and are asked
            // again (run_asks_the_orphans_of_a_killed_comm_node_again_once_they_rejoined).
            "--rejoin-within",
            "0",
            "--",
            "sh",
            "-c",
            script,
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("---- [2-3] (2 ranks) ----\nhi\n"), "{stdout}");
    assert!(stdout.contains("lost [0-1]: ") && stdout.contains("nothing arrived for 5.0 s"), "{stdout}");
    assert_eq!(out.status.code(), Some(255), "{stdout}");
}

#[test]
fn run_asks_the_orphans_of_a_killed_comm_node_again_once_they_rejoined() {
    // Regression: after a comm node was killed, its orphans rejoined and their commands
    // finished, yet `run` reported them lost (exit 255): the answers the node held went
    // with it. Rank 0 kills its comm node once rank 1 (same node) has answered.
    let t = tag();
    let script = "if [ $TREECAST_RANK = 0 ]; then read -r _ _ _ be _ < /proc/$PPID/stat; \
                  read -r _ _ _ cn _ < /proc/$be/stat; sleep 0.5; kill -9 $cn; fi; echo hi";
    let out = treecast(&t, &["run", "--local", "4", "--topology", "kary:2", "--", "sh", "-c", script]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("---- [0-3] (4 ranks) ----\nhi\n"), "{stdout}");
    assert!(!stdout.contains("lost"), "{stdout}");
    assert_eq!(out.status.code(), Some(0), "{stdout}");
}

#[test]
fn bad_values_of_the_new_flags_are_refused_before_anything_starts() {
    let t = tag();
    for (args, says) in [
        (
            &["run", "--local", "1", "--output-limit", "99999999", "--", "true"][..],
            "--output-limit 99999999 is not between",
        ),
        (&["run", "--local", "1", "--output-limit", "0", "--", "true"], "--output-limit 0 is not between"),
        (
            &["run", "--local", "1", "--dead-after", "0.001", "--", "true"],
            "--dead-after 0.001 is not 0 (off)",
        ),
        (&["run", "--local", "1", "--dead-after", "nan", "--", "true"], "--dead-after NaN is not 0 (off)"),
        (&["run", "--local", "1", "--rejoin-within=-1", "--", "true"], "--rejoin-within -1 is not 0 (off)"),
        (
            &["run", "--local", "1", "--rejoin-within", "nan", "--", "true"],
            "--rejoin-within NaN is not 0 (off)",
        ),
        (&["bench", "chaos", "--local", "2", "--stop-fraction", "nan"], "--stop-fraction NaN is not a share"),
        (&["bench", "chaos", "--local", "2", "--dead-after", "nan"], "--dead-after NaN must be a number"),
        (&["bench", "chaos", "--local", "2", "--kill-rate", "1.5"], "--kill-rate 1.5 is not a probability"),
        (&["bench", "chaos", "--local", "2", "--kill-rate", "0.1", "--faults", "2"], "cannot be used with"),
        (&["bench", "chaos", "--sim", "--during", "bcast"], "--during bcast needs real processes"),
        (&["bench", "chaos", "--sim", "--faults", "200000"], "--faults 200000 is over 100,000"),
        (
            &["bench", "chaos", "--local", "2", "--file-size", "2000000000"],
            "--file-size 2000000000 is not 1 byte to 1 GiB",
        ),
        (&["clock", "--local", "1", "--rounds", "0"], "--rounds needs at least 1"),
    ] {
        let out = treecast(&t, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{args:?}: {stderr}");
    }
    let (k, v) = t.split_once('=').unwrap();
    let out = Command::new(TREECAST)
        .args(["clock", "--local", "1"])
        .env(k, v)
        .env("TREECAST_CLOCK_DISTORT", "garbage")
        .output()
        .unwrap();
    assert_no_leftovers(&t);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("TREECAST_CLOCK_DISTORT: write OFFSET_US,DRIFT_PPM")
    );
}

#[test]
fn run_does_not_leak_the_secret_to_commands() {
    let t = tag();
    let out =
        treecast(&t, &["run", "--local", "2", "--", "sh", "-c", "echo secret=${TREECAST_SECRET:-none}"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("secret=none"), "{stdout}");
}

#[test]
fn killing_the_front_end_takes_the_whole_tree_down() {
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let mut child = Command::new(TREECAST)
        .args(["run", "--local", "8", "--topology", "balanced:2x4", "--", "sleep", "60"])
        .env(k, v)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    // front-end + 2 comm nodes + 8 back-ends + 8 guards + 8 sleeps
    while processes_with_env(&t).len() < 27 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(processes_with_env(&t).len(), 27);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&t);
}

/// Processes carrying `needle` in their environment whose program is `name`.
fn processes_named(needle: &str, name: &str) -> Vec<u32> {
    let named = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim_end() == name)
    };
    processes_with_env(needle).into_iter().filter(named).collect()
}

/// Waits until `n` processes carrying `needle` run `name`.
fn wait_for_processes(needle: &str, name: &str, n: usize) {
    let deadline = Instant::now() + LIMIT;
    while processes_named(needle, name).len() < n {
        assert!(Instant::now() < deadline, "never saw {n} {name} processes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command whose shell starts a grandchild (`; true` keeps the shell from exec'ing it).
const FORKING: [&str; 3] = ["sh", "-c", "sleep 60; true"];

#[test]
fn every_treecast_process_is_named_treecast_with_its_role() {
    // Regression: guards showed in `ps` as `exe` / `/proc/self/exe guard -- CMD`.
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let mut child = Command::new(TREECAST)
        .args(["run", "--local", "4", "--topology", "kary:2", "--", "sleep", "60"])
        .env(k, v)
        .spawn()
        .unwrap();
    wait_for_processes(&t, "sleep", 4);
    let mut roles = Vec::new();
    for pid in processes_with_env(&t) {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        if comm.trim_end() == "sleep" {
            continue;
        }
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let args: Vec<String> =
            cmdline.split(|b| *b == 0).map(|a| String::from_utf8_lossy(a).into_owned()).collect();
        assert_eq!(comm.trim_end(), "treecast", "{args:?}");
        assert!(args[0].ends_with("treecast"), "{args:?}");
        roles.push(args[1].clone());
    }
    roles.sort();
    let count = |role: &str| roles.iter().filter(|r| *r == role).count();
    assert_eq!((count("run"), count("node"), count("backend"), count("guard")), (1, 2, 4, 4), "{roles:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&t);
}

#[test]
fn processes_started_by_commands_die_when_the_front_end_is_killed() {
    // Regression: only a command's direct child had the die-with-parent signal, so
    // the shell died with its back-end and its `sleep` ran on.
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let mut child = Command::new(TREECAST)
        .args(["run", "--local", "4", "--topology", "kary:2", "--"])
        .args(FORKING)
        .env(k, v)
        .spawn()
        .unwrap();
    wait_for_processes(&t, "sleep", 4);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&t);
}

#[test]
fn a_command_cut_off_by_its_time_limit_takes_the_processes_it_started_along() {
    let t = tag();
    let out = treecast(&t, &[&["run", "--local", "2", "--timeout", "1", "--"][..], &FORKING[..]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(124), "the status timeout(1) gives: {stdout}");
    assert!(stdout.contains("did not finish within 1.0 s and was killed"), "{stdout}");
    // `treecast` checked that no `sleep` (which carries the tag) was left behind.
}

#[tokio::test]
async fn processes_started_by_commands_die_when_the_network_shuts_down_under_them() {
    let net = launch("kary:2", 4).await;
    let needle = format!("TREECAST_SESSION={}", net.session());
    let s = net.new_stream(&net.broadcast_communicator(), StreamOptions::default()).await.unwrap();
    let argv: Vec<String> = FORKING.iter().map(|a| a.to_string()).collect();
    s.send(
        TAG_RUN,
        treecast::apps::protocol::RUN_REQUEST,
        &[argv.into(), Value::ULong(0), Value::ULong(1 << 20)],
    )
    .await
    .unwrap();
    let found = needle.clone();
    tokio::task::spawn_blocking(move || wait_for_processes(&found, "sleep", 4)).await.unwrap();
    // The back-ends leave while the commands run: each kills its command's group.
    finish(net).await;
}

#[tokio::test]
async fn a_command_cut_off_is_answered_even_if_a_process_that_left_its_group_holds_its_output() {
    let dir = TestDir::new("escaped");
    let mut net = launch("flat", 1).await;
    // `setsid` takes the sleep out of the command's process group; it keeps stdout open.
    let pidfile = dir.path("pid");
    let script = format!("setsid sleep 30 & echo $! > {}; sleep 60; true", pidfile.display());
    let argv = ["sh".to_owned(), "-c".to_owned(), script];
    let started = Instant::now();
    let report = treecast::apps::run::run_command(&mut net, &argv, Some(Duration::from_secs(1))).await;
    let escaped = std::fs::read_to_string(&pidfile).unwrap();
    Command::new("kill").args(["-9", escaped.trim()]).status().unwrap();
    let report = report.unwrap();
    assert!(started.elapsed() < Duration::from_secs(8), "waited {:?}: {report:?}", started.elapsed());
    assert_eq!(report.classes.len(), 1, "{report:?}");
    assert!(report.classes[0].stderr_text().contains("was killed"), "{report:?}");
    finish(net).await;
}

/// Opens `count` hostile connections to `addr` (`unix:@name`) from four threads, a
/// quarter each of: silence, random bytes, a huge length prefix, and a well-formed
/// handshake answer without the secret. Each thread keeps its latest 100 open.
fn flood(addr: &str, count: usize) -> usize {
    use std::io::{Read, Write};
    use std::os::linux::net::SocketAddrExt;
    let name = addr.strip_prefix("unix:@").expect("a Unix listener").to_owned();
    let threads: Vec<_> = (0..4u8)
        .map(|kind| {
            let name = name.clone();
            std::thread::spawn(move || {
                let sa = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
                let mut held = std::collections::VecDeque::new();
                let mut opened = 0;
                for i in 0..count / 4 {
                    let Ok(mut c) = std::os::unix::net::UnixStream::connect_addr(&sa) else { continue };
                    opened += 1;
                    c.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
                    let noise: Vec<u8> = (0..64).map(|j| (i * 31 + j * 7) as u8).collect();
                    let _ = match kind {
                        0 => Ok(()),
                        1 => c.write_all(&noise),
                        2 => c.write_all(&[0xff, 0xff, 0xff, 0x7f]),
                        _ => {
                            let mut hello = [0u8; 37];
                            let _ = c.read_exact(&mut hello);
                            let mut answer = b"TCST\x01\x01\x00\x00\x00".to_vec();
                            answer.extend_from_slice(&noise);
                            c.write_all(&answer)
                        }
                    };
                    held.push_back(c);
                    if held.len() > 100 {
                        held.pop_front();
                    }
                }
                opened
            })
        })
        .collect();
    threads.into_iter().map(|t| t.join().unwrap()).sum()
}

#[test]
fn a_flood_of_bad_connections_neither_stops_start_up_nor_floods_the_terminal() {
    let dir = TestDir::new("flood");
    let (addr_file, go) = (dir.path("parent"), dir.path("go"));
    // Back-ends that say where they connect, then wait for the flood to be under way.
    let wrapper = dir.path("treecast");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\necho \"$TREECAST_PARENT\" >> {a}\nwhile [ ! -e {g} ]; do sleep 0.01; done\nexec {t} \"$@\"\n",
            a = addr_file.display(),
            g = go.display(),
            t = TREECAST
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let child = Command::new(TREECAST)
        .args(["run", "--local", "8", "--topology", "flat", "--", "echo", "ok"])
        .env(k, v)
        .env("TREECAST_PATH", &wrapper)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    let addr = loop {
        let text = std::fs::read_to_string(&addr_file).unwrap_or_default();
        if let Some(line) = text.lines().next() {
            break line.to_owned();
        }
        assert!(Instant::now() < deadline, "no back-end started");
        std::thread::sleep(Duration::from_millis(10));
    };
    // The real back-ends connect while the flood goes on.
    let flooding = {
        let addr = addr.clone();
        std::thread::spawn(move || flood(&addr, 1000))
    };
    std::fs::write(&go, b"").unwrap();
    let opened = flooding.join().unwrap();
    let out = child.wait_with_output().unwrap();
    assert_no_leftovers(&t);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "start-up failed under the flood: {stdout}\n{stderr}");
    assert!(stdout.contains("---- [0-7] (8 ranks) ----\nok\n"), "{stdout}");
    assert!(opened > 0, "the flood reached the listener");
    let warnings = stderr.lines().filter(|l| l.contains("refused")).count();
    assert!(warnings <= 4, "{opened} bad connections gave {warnings} warning lines: {stderr}");
}

#[test]
fn topo_prints_trees_and_names_line_and_column_of_errors() {
    let t = tag();
    let out = treecast(&t, &["topo", "balanced:2x2", "--format", "mrnet"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("=>"), "{text}");

    let dir = std::env::temp_dir().join(format!("treecast-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.top");
    std::fs::write(&bad, "fe.example.org:0 => n1.example.org:1 n2:2 ;\nn1.example.org:1 => n2:2 ;\n")
        .unwrap();
    let out = treecast(&t, &["topo", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("line 2, column"), "{err}");
    let out = treecast(&t, &["run", "--local", "2", "--topology", bad.to_str().unwrap(), "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn demo_runs_and_explains_itself() {
    let t = tag();
    let out = treecast(&t, &["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("(expected 16120)") && text.contains("16120"), "{text}");
    assert!(text.contains("[0-15]"), "{text}");
}

// ---- attach mode ----

/// Launches a network in attach mode, starts its back-ends with `start` once the
/// attach file exists, and checks a sum over them; leaves nothing behind.
async fn attach_and_sum(spec: &str, n: usize, start: impl FnOnce(&Path, &str) -> std::process::Child) {
    let dir = std::env::temp_dir().join(format!("treecast-attach-test-{}-{spec}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("attach");
    let topo = Topology::from_spec(spec, Some(n)).unwrap();
    let launching = tokio::spawn(builder(topo).attach(&file, LIMIT).launch());
    let deadline = Instant::now() + LIMIT;
    while !file.exists() {
        assert!(Instant::now() < deadline, "no attach file");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = tag();
    let mut launcher = start(&file, &t);
    let net = launching.await.unwrap().unwrap();
    let mut s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(1)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), n as i64 + (0..n as i64).sum::<i64>());
    finish(net).await;
    assert!(!file.exists(), "the attach file outlived the network");
    let _ = tokio::task::spawn_blocking(move || launcher.wait()).await;
    assert_no_leftovers(&t);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn backends_started_by_a_shell_loop_attach() {
    attach_and_sum("balanced:2x3", 6, |file, tag| {
        let (k, v) = tag.split_once('=').unwrap();
        let script = format!(
            "for r in 0 1 2 3 4 5; do TREECAST_RANK=$r {TREECAST} backend --attach {} & done; wait",
            file.display()
        );
        Command::new("/bin/sh").arg("-c").arg(script).env(k, v).spawn().unwrap()
    })
    .await;
}

#[tokio::test]
#[cfg_attr(not(has_mpirun), ignore = "needs mpirun (Debian: openmpi-bin)")]
async fn backends_started_by_mpirun_attach() {
    attach_and_sum("kary:2", 4, |file, tag| {
        let (k, v) = tag.split_once('=').unwrap();
        Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-n", "4", "-x", k])
            .args([TREECAST, "backend", "--attach"])
            .arg(file)
            .env(k, v)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    })
    .await;
}

#[test]
fn a_backend_without_a_place_in_the_attach_file_says_so() {
    let dir = std::env::temp_dir().join(format!("treecast-attach-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("attach");
    std::fs::write(
        &file,
        format!("version 1\nsession s\nsecret {}\nsize 1\nrank 0 1 unix:/nonexistent/s\n", "ab".repeat(32)),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(TREECAST)
        .args(["backend", "--attach"])
        .arg(&file)
        .args(["--rank", "3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("rank 3 has no place in the attach file"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_front_end_stops_at_once_when_it_cannot_write_the_attach_file() {
    // Regression: the front-end logged the error and still waited the whole attach
    // time for back-ends that had no file to find it by.
    let dir = TestDir::new("attach-unwritable");
    // A directory with something in it where the file should go: the rename fails.
    let file = dir.path("attach");
    std::fs::create_dir(&file).unwrap();
    std::fs::write(file.join("x"), b"").unwrap();
    let t = tag();
    let started = Instant::now();
    let path = file.to_str().unwrap();
    let args = ["run", "--local", "4", "--topology", "kary:2", "--attach-timeout", "300", "--attach", path];
    let out = treecast(&t, &[&args[..], &["--", "true"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot write the attach file"), "{err}");
    assert!(started.elapsed() < LIMIT, "waited {:?} for back-ends", started.elapsed());
    let names: Vec<_> = std::fs::read_dir(dir.root()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["attach"], "the temporary file with the secret survived the failure");
}

#[test]
fn a_backend_refuses_an_attach_file_others_can_read_or_another_user_owns() {
    let dir = TestDir::new("attach-untrusted");
    let file = dir.path("attach");
    let text =
        format!("version 1\nsession s\nsecret {}\nsize 1\nrank 0 1 unix:/nonexistent/s\n", "ab".repeat(32));
    std::fs::write(&file, text).unwrap();
    let attach = |what: &str| {
        let out =
            Command::new(TREECAST).args(["backend", "--rank", "0", "--attach"]).arg(&file).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        err
    };
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = attach("mode 0644");
    assert!(err.contains("has mode 0644") && err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Trusted now: it gets as far as connecting to the (missing) parent.
    let err = attach("private");
    assert!(err.contains("/nonexistent/s"), "{err}");
    if !is_root() {
        eprintln!("skipped the other-owner case: changing a file's owner needs root");
        return;
    }
    std::os::unix::fs::chown(&file, Some(1), None).unwrap();
    let err = attach("owned by uid 1");
    assert!(err.contains("owned by uid 1"), "{err}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap()
}

// ---- host lists, topology files and hostile host names (a fake ssh and srun on PATH) ----

/// A directory holding a stand-in for `program` (ssh or srun) that records each call's
/// arguments, one per line, in a file `call.*` of its own. As ssh it answers `-G` with
/// `hostname localhost`, then runs the remote command here, so a whole tree over
/// made-up hosts starts on this machine; as srun it fails.
struct FakeLauncher {
    dir: TestDir,
}

impl FakeLauncher {
    fn new(program: &str) -> FakeLauncher {
        let dir = TestDir::new(&format!("fake-{program}"));
        let bin = dir.path("bin");
        std::fs::create_dir(&bin).unwrap();
        let calls = dir.path("calls");
        std::fs::create_dir(&calls).unwrap();
        let log = format!(
            "f=$(mktemp {}/call.XXXXXX)\nfor a in \"$@\"; do printf '%s\\n' \"$a\"; done > \"$f\"\n",
            calls.display()
        );
        let body = match program {
            "ssh" => concat!(
                "for a in \"$@\"; do\n",
                "  [ \"$a\" = -- ] && break\n",
                "  [ \"$a\" = -G ] && { echo 'hostname localhost'; exit 0; }\n",
                "done\n",
                "for last; do :; done\n",
                "exec sh -c \"$last\"\n"
            ),
            _ => "echo 'fake srun: no Slurm here' >&2\nexit 1\n",
        };
        let script = bin.join(program);
        std::fs::write(&script, format!("#!/bin/sh\n{log}{body}")).unwrap();
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        FakeLauncher { dir }
    }

    /// `PATH` with the fake first.
    fn path(&self) -> String {
        format!("{}:{}", self.dir.path("bin").display(), std::env::var("PATH").unwrap_or_default())
    }

    /// The arguments of every call so far.
    fn calls(&self) -> Vec<Vec<String>> {
        let mut calls: Vec<Vec<String>> = std::fs::read_dir(self.dir.path("calls"))
            .unwrap()
            .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap().lines().map(String::from).collect())
            .collect();
        calls.sort();
        calls
    }

    /// Runs treecast with the fake on `PATH` and no extra launcher arguments.
    fn treecast(&self, tag: &str, args: &[&str]) -> std::process::Output {
        let (k, v) = tag.split_once('=').unwrap();
        let out = Command::new(TREECAST)
            .args(args)
            .env(k, v)
            .env("PATH", self.path())
            .env_remove("TREECAST_SSH_ARGS")
            .env_remove("TREECAST_SRUN_ARGS")
            .env_remove("TREECAST_LISTEN")
            .output()
            .unwrap();
        assert_no_leftovers(tag);
        out
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[test]
fn a_topology_file_may_list_a_parents_children_over_several_statements() {
    let dir = TestDir::new("split-statements");
    let file = dir.path("tree.top");
    std::fs::write(
        &file,
        "localhost:0 => localhost:1 ;\nlocalhost:1 => localhost:2 ;\n\
         localhost:0 => localhost:3 ;   # the root again\nlocalhost:1 => localhost:4 ;\n",
    )
    .unwrap();
    let path = file.to_str().unwrap();
    let out = Command::new(TREECAST).args(["topo", "--format", "mrnet", path]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "localhost:0 => localhost:1 localhost:3 ;\nlocalhost:1 => localhost:2 localhost:4 ;\n"
    );
    // The tree runs: three back-ends, in the pre-order of the combined statements.
    let t = tag();
    let out = treecast(
        &t,
        &["run", "--local", "3", "--topology", path, "--json", "--", "sh", "-c", "echo $TREECAST_RANK"],
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["backends"], 3);
    assert_eq!(report["classes"].as_array().unwrap().len(), 3, "{report}");

    // MRNet's lexer refuses a host name that does not start with a letter or a digit.
    std::fs::write(&file, "localhost:0 => localhost:1\n   -oProxyCommand:1 ;\n").unwrap();
    let out = Command::new(TREECAST).args(["topo", path]).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = text(&out.stderr);
    assert!(
        err.contains("topology line 2, column 4: host name in `-oProxyCommand:1` starts with `-`"),
        "{err}"
    );
}

#[test]
fn hostile_host_names_never_reach_ssh() {
    let ssh = FakeLauncher::new("ssh");
    let dir = TestDir::new("hostile-hosts");
    let top = dir.path("evil.top");
    std::fs::write(&top, "localhost:0 => n1:0\n  -Fevil.conf:0 ;\n").unwrap();
    let hosts = dir.path("hosts");
    std::fs::write(&hosts, "n1\n-Fevil.conf\n").unwrap();
    let top_arg = top.to_str().unwrap();
    let file_list = format!("n2,^{}", hosts.display());
    let cases: [(&[&str], &str); 4] = [
        (
            &["--local", "2", "--topology", top_arg],
            "topology line 2, column 3: host name in `-Fevil.conf:0` starts with `-`",
        ),
        (&["--hosts=--Fevil.conf"], "column 2: `-Fevil.conf`: a host name starts with a letter or a digit"),
        (&["--hosts", &file_list], "line 2: host list `-Fevil.conf`, column 1"),
        (&["--hosts", "n1", "--exclude=-n2"], "`-` in an exclusion list"),
    ];
    for (flags, want) in cases {
        let t = tag();
        let args =
            [&["run", "--launcher", "ssh", "--remote-path", TREECAST][..], flags, &["--", "true"]].concat();
        let out = ssh.treecast(&t, &args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{flags:?}: {err}");
        assert!(err.contains(want), "{flags:?}: {err}");
    }
    assert_eq!(ssh.calls(), Vec::<Vec<String>>::new(), "ssh was run");
}

#[test]
fn a_tree_over_a_host_list_reaches_each_host_after_every_ssh_option() {
    // pdsh's `-HOST` and `^FILE`, ClusterShell's steps, repeats dropped, --exclude and
    // `user@host`: made-up hosts, each reached through the fake ssh, which runs the
    // process here.
    let ssh = FakeLauncher::new("ssh");
    let dir = TestDir::new("host-list-tree");
    let hosts = dir.path("more-hosts");
    std::fs::write(&hosts, "# more hosts\nn11 n3\n\n").unwrap();
    let list = format!("bob@n[1-9/2] -n5,^{}", hosts.display());
    let t = tag();
    let out = ssh.treecast(
        &t,
        &[
            "run",
            "--launcher",
            "ssh",
            "--remote-path",
            TREECAST,
            "--hosts",
            &list,
            "--exclude",
            "n9",
            "--fanout",
            "2",
            "--json",
            "--",
            "sh",
            "-c",
            "echo rank $TREECAST_RANK",
        ],
    );
    let err = text(&out.stderr);
    assert!(out.status.success(), "{}\n{err}", text(&out.stdout));
    assert!(err.contains("treecast: warning: n3 listed more than once"), "{err}");
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let on: Vec<(String, String)> = report["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["stdout"].as_str().unwrap().trim().to_owned(), c["hosts"].as_str().unwrap().to_owned()))
        .collect();
    let want = [("rank 0", "n1"), ("rank 1", "n3"), ("rank 2", "n7"), ("rank 3", "n11")];
    assert_eq!(on, want.map(|(r, h)| (r.to_owned(), h.to_owned())), "{report}");

    // Every call puts the host right after `--`, after every option; a start adds only
    // the remote command after it.
    let mut started = BTreeSet::new();
    for call in ssh.calls() {
        let dash = call.iter().position(|a| a == "--").unwrap_or_else(|| panic!("no `--`: {call:?}"));
        let host = &call[dash + 1];
        assert!(call[..dash].iter().all(|a| !a.contains("n1") && !a.contains("bob")), "{call:?}");
        match &call[dash + 2..] {
            [] => assert!(call[..dash].contains(&"-G".to_owned()), "{call:?}"),
            [command] => {
                assert!(command.starts_with("exec env "), "{call:?}");
                started.insert(host.clone());
            }
            _ => panic!("more than the host and the command after `--`: {call:?}"),
        }
    }
    // The comm nodes run on bob@n1 and bob@n7 and start the back-end on their own host
    // by fork; n5 and n9 are excluded.
    let want: BTreeSet<String> = ["bob@n1", "bob@n3", "bob@n7", "n11"].map(String::from).into();
    assert_eq!(started, want);
}

#[test]
fn the_host_reaches_srun_inside_its_nodelist_argument() {
    let srun = FakeLauncher::new("srun");
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let out = Command::new(TREECAST)
        .args(["run", "--launcher", "slurm", "--hosts", "node1", "--", "true"])
        .env(k, v)
        .env("PATH", srun.path())
        .env("TREECAST_LISTEN", "127.0.0.1")
        .env_remove("TREECAST_SRUN_ARGS")
        .output()
        .unwrap();
    assert_no_leftovers(&t);
    assert!(!out.status.success());
    let calls = srun.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    let call = &calls[0];
    let dash = call.iter().position(|a| a == "--").unwrap();
    assert!(call[..dash].contains(&"--nodelist=node1".to_owned()), "{call:?}");
    assert!(!call.contains(&"node1".to_owned()), "{call:?}");

    // srun cannot log in as another user, and hostile names never reach it.
    for (hosts, want) in
        [("bob@node1", "`user@` cannot be honoured"), ("--jobid", "starts with a letter or a digit")]
    {
        let t = tag();
        let out =
            srun.treecast(&t, &["run", "--launcher", "slurm", &format!("--hosts={hosts}"), "--", "true"]);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{hosts}: {err}");
        assert!(err.contains(want), "{hosts}: {err}");
    }
    assert_eq!(srun.calls().len(), 1);
}

#[test]
fn exclude_applies_to_host_lists_only() {
    let t = tag();
    let out = treecast(&t, &["run", "--local", "2", "--exclude", "n1", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("--exclude leaves hosts out of --hosts"), "{}", text(&out.stderr));
    let out =
        treecast(&t, &["run", "--launcher", "local", "--hosts", "n[1-2]", "-x", "n[1-2]", "--", "true"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out.stderr).contains("no host left"), "{}", text(&out.stderr));
}

#[test]
fn treecast_hosts_expands_folds_and_counts_like_nodeset() {
    let dir = TestDir::new("hosts-cmd");
    let file = dir.path("hosts");
    std::fs::write(&file, "n[10-11]  # two more\nlogin1\n").unwrap();
    let hosts = |args: &[&str]| {
        let out = Command::new(TREECAST).arg("hosts").args(args).output().unwrap();
        (out.status.code(), text(&out.stdout), text(&out.stderr))
    };
    assert_eq!(hosts(&["n[1-4],n[6-7]"]), (Some(0), "n[1-4,6-7]\n".into(), String::new()));
    assert_eq!(hosts(&["-f", "n[1-3]", "n4"]), (Some(0), "n[1-4]\n".into(), String::new()));
    assert_eq!(hosts(&["-e", "n[01-10/3]"]), (Some(0), "n01 n04 n07 n10\n".into(), String::new()));
    assert_eq!(
        hosts(&["-c", "n[1-100]", "m[1-5]", "-x", "n[50-200]"]),
        (Some(0), "54\n".into(), String::new())
    );
    assert_eq!(hosts(&["-e", "bob@n[1-3],-n2"]), (Some(0), "bob@n1 bob@n3\n".into(), String::new()));
    assert_eq!(hosts(&["-c", "n1", "-x", "n1"]), (Some(0), "0\n".into(), String::new()));
    let list = format!("n[1-3] ^{}", file.display());
    assert_eq!(hosts(&["-e", &list]), (Some(0), "n1 n2 n3 n10 n11 login1\n".into(), String::new()));
    let (code, out, err) = hosts(&["--", "n[1-4]", "n2", "-n4"]);
    assert_eq!((code, out.as_str()), (Some(0), "n[1-3]\n"));
    assert_eq!(err, "treecast: warning: n2 listed more than once; each host is kept once, where it first appears (1 repeat dropped)\n");
    let (code, out, err) = hosts(&["n[1-3", "x"]);
    assert_eq!((code, out.as_str()), (Some(2), ""));
    assert!(err.contains("host list `n[1-3`, column 2: unbalanced brackets"), "{err}");
    let (code, _, err) = hosts(&["-e", "-c", "n1"]);
    assert_eq!(code, Some(2), "{err}");
    let out = Command::new(TREECAST).args(["hosts", "--help"]).output().unwrap();
    assert!(text(&out.stdout).contains("ClusterShell's `nodeset`"), "{}", text(&out.stdout));
}
