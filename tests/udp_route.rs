//! End-to-end tests of the multicast route over UDP (`--route udp`) on loopback:
//! every node multicasts its large downstream frames to its children through the
//! loopback interface, and the links carry placeholders in their place.
//!
//! All back-ends share this host's file system, so each runs in a directory of its
//! own and writes through `/proc/self/cwd`: every rank writes its own copy.

#![allow(clippy::unwrap_used)]

mod common;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::copies::{assert_copies, own_dirs, route_reports, send_to_own_dirs};
use common::{assert_no_leftovers, random_bytes, TestDir};
use treecast::apps::protocol::TAG_DIE;
use treecast_api::{
    bcast_files, FileEntry, FileOptions, FileReport, Network, NetworkBuilder, Outcome, Progress, RankSet,
    StreamOptions, Topology, TransformKind, Value,
};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(60);

/// A network of `backends` ranks shaped by `spec`, each rank in its own directory
/// under `dir`, multicasting with these UDP settings.
async fn launch(dir: &TestDir, spec: &str, backends: usize, settings: &[(&str, &str)]) -> Network {
    launch_with(dir, spec, backends, settings, "").await
}

/// [`launch`], each back-end's shell running `prelude` first.
async fn launch_with(
    dir: &TestDir,
    spec: &str,
    backends: usize,
    settings: &[(&str, &str)],
    prelude: &str,
) -> Network {
    let script = own_dirs(dir, backends, TREECAST, prelude);
    let topo = Topology::from_spec(spec, Some(backends)).unwrap();
    let mut builder = NetworkBuilder::new(topo)
        .treecast_path(TREECAST)
        .startup_timeout(LIMIT)
        .backend_command(["/bin/sh", "-c", &script])
        .udp_route(true);
    for (k, v) in settings {
        builder = builder.udp_setting(*k, *v);
    }
    builder.launch().await.unwrap()
}

async fn finish(net: Network) {
    let needle = format!("TREECAST_SESSION={}", net.session());
    net.shutdown().await;
    assert_no_leftovers(&needle);
}

async fn send(net: &mut Network, dir: &TestDir, name: &str, data: &[u8], chunk: usize) -> FileReport {
    send_to_own_dirs(net, dir, name, data, chunk, LIMIT).await
}

#[tokio::test]
async fn every_size_arrives_byte_identical_through_each_nodes_group() {
    let dir = TestDir::new("udp-sizes");
    // Chunks of any size go by multicast, so the small ones do too; fragments of
    // Ethernet's size, whatever loopback's MTU, so that the sizes below sit at a
    // fragment's edges.
    let settings = [("TREECAST_UDP_MIN_FRAME", "0"), ("TREECAST_UDP_FRAGMENT", "1432")];
    let mut net = launch(&dir, "kary:2", 4, &settings).await;
    // Chunk frames of 1 B, one fragment's payload, one more byte, and several fragments.
    for (i, size) in [0usize, 1, 1432 - 28, 1432 - 27, 3_000_017].into_iter().enumerate() {
        let data = random_bytes(size);
        let name = format!("file{i}");
        let report = send(&mut net, &dir, &name, &data, 64 << 10).await;
        assert!(report.ok(), "{report:?}");
        assert_eq!(report.ranks_with(Outcome::Written), RankSet::range(0, 4), "{report:?}");
        assert_copies(&dir, 0..4, &name, &data);
    }
    let routes = route_reports(&net).await;
    // kary:2 over 4 back-ends: the front-end (0) feeds comm nodes 1 and 4, which feed
    // back-ends 2, 3 and 5, 6.
    let groups: Vec<(u32, Vec<u32>, Vec<u32>)> =
        routes.iter().map(|r| (r.node, r.udp_children.clone(), r.tcp_children.clone())).collect();
    assert_eq!(groups, [(0, vec![1, 4], vec![]), (1, vec![2, 3], vec![]), (4, vec![5, 6], vec![])]);
    for r in &routes {
        assert!(r.frames > 0 && r.fragments >= r.frames && r.messages > 0, "{r:?}");
        // Each node's own group in 239.255.0.0/16.
        assert!(r.group.starts_with("239.255."), "{r:?}");
    }
    finish(net).await;
}

#[tokio::test]
async fn at_one_five_and_twenty_percent_loss_every_byte_arrives() {
    for (loss, seed) in [("0.01", "1"), ("0.05", "2"), ("0.2", "3")] {
        let dir = TestDir::new("udp-loss");
        let drop = format!("{loss},{seed}");
        // Ethernet-sized fragments (loopback's MTU would make 46 of them): enough
        // datagrams for 1 % to drop some.
        let settings = [("TREECAST_UDP_DROP", drop.as_str()), ("TREECAST_UDP_FRAGMENT", "1432")];
        let mut net = launch(&dir, "flat", 4, &settings).await;
        let data = random_bytes(2 << 20);
        let report = send(&mut net, &dir, "copy", &data, 256 << 10).await;
        assert!(report.ok(), "loss {loss}: {report:?}");
        assert_copies(&dir, 0..4, "copy", &data);
        let routes = route_reports(&net).await;
        assert_eq!(routes.len(), 1, "{routes:?}");
        let r = &routes[0];
        assert_eq!(r.udp_children, [1, 2, 3, 4]);
        assert!(r.frames > 0, "loss {loss}: {r:?}");
        assert!(r.not_sent > 0 && r.retransmitted > 0, "loss {loss}: the knob dropped nothing: {r:?}");
        finish(net).await;
    }
}

#[tokio::test]
async fn a_rank_killed_mid_transfer_is_lost_and_the_others_complete() {
    let dir = TestDir::new("udp-killed");
    let mut net = launch(&dir, "flat", 4, &[]).await;
    let src = dir.path("big");
    let data = random_bytes(24 << 20);
    std::fs::write(&src, &data).unwrap();
    let comm = net.broadcast_communicator();
    let killer = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let seen = sent.clone();
    let entry = [FileEntry::file(&src, Some(PathBuf::from("/proc/self/cwd/copy")))];
    let options = FileOptions { chunk: 256 << 10, ..FileOptions::default() };
    let transfer = bcast_files(&mut net, &comm, &entry, &options, |p| {
        if let Progress::Sent { sent, .. } = p {
            seen.store(sent, Ordering::Relaxed)
        }
    });
    let kill = async {
        while sent.load(Ordering::Relaxed) < (2 << 20) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        killer.send(TAG_DIE, "%ad", &[Value::IntArray(vec![2])]).await.unwrap();
    };
    let (reports, ()) = tokio::time::timeout(LIMIT, async { tokio::join!(transfer, kill) }).await.unwrap();
    let report = reports.unwrap().pop().unwrap();
    assert_eq!(report.lost_ranks(), RankSet::single(2), "{report:?}");
    let others = RankSet::range(0, 4).difference(&RankSet::single(2));
    assert_eq!(report.ranks_with(Outcome::Written), others, "{report:?}");
    assert_copies(&dir, [0, 1, 3], "copy", &data);
    let routes = route_reports(&net).await;
    assert!(routes[0].frames > 0, "nothing went by multicast: {routes:?}");
    finish(net).await;
}

/// A member that never answers (the drop knob at 100 % in its own environment) is
/// given up by the sender after the silent limit and reported lost; its siblings,
/// which wait longer for their placeholders while the sender lives, complete.
#[tokio::test]
async fn a_member_that_never_answers_is_lost_and_its_siblings_complete() {
    let dir = TestDir::new("udp-silent");
    let deaf = r#"if [ "$TREECAST_RANK" = 1 ]; then export TREECAST_UDP_DROP=1; fi;"#;
    let settings = [("TREECAST_UDP_SILENT_LIMIT_MS", "1000")];
    let mut net = launch_with(&dir, "flat", 3, &settings, deaf).await;
    let data = random_bytes(8 << 20);
    let report = send(&mut net, &dir, "copy", &data, 256 << 10).await;
    assert_eq!(report.lost_ranks(), RankSet::single(1), "{report:?}");
    assert!(report.lost[0].1.contains("silent for 1.0 s"), "lost for its silence: {report:?}");
    let others = RankSet::range(0, 3).difference(&RankSet::single(1));
    assert_eq!(report.ranks_with(Outcome::Written), others, "{report:?}");
    assert_copies(&dir, [0, 2], "copy", &data);
    finish(net).await;
}
