//! Striped links end to end (`--route striped:N`): trees whose every link runs
//! over 2 or 4 connections compute sums and deliver 64 MiB byte-identical, also
//! when one connection of each back-end's link is cut mid-transfer
//! (`TREECAST_STRIPE_CUT` in the back-ends); and Multipath TCP links (`mptcp`).
//!
//! All back-ends share this host's file system, so each runs in a directory of its
//! own and writes through `/proc/self/cwd`: every rank writes its own copy.

use std::time::Duration;

use crate::common::copies::{assert_copies, own_dirs, send_to_own_dirs};
use crate::common::{assert_no_leftovers, random_bytes, TestDir};
use treecast::apps::protocol::TAG_ADD_RANK;
use treecast_api::{Network, NetworkBuilder, RankSet, StreamOptions, Topology, TransformKind, Value};
use treecast_files::Outcome;

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(120);

async fn launch(dir: &TestDir, backends: usize, stripes: u8, mptcp: bool, prelude: &str) -> Network {
    let script = own_dirs(dir, backends, TREECAST, prelude);
    let topo = Topology::from_spec("kary:2", Some(backends)).unwrap();
    NetworkBuilder::new(topo)
        .treecast_path(TREECAST)
        .startup_timeout(LIMIT)
        .backend_command(["/bin/sh", "-c", &script])
        // TCP on loopback, as between hosts.
        .unix_links(false)
        .stripes(stripes)
        .mptcp(mptcp)
        .launch()
        .await
        .unwrap()
}

async fn sums_and_64_mib(stripes: u8, mptcp: bool, prelude: &str) -> TestDir {
    let dir = TestDir::new(&format!("striped-{stripes}"));
    let prelude = prelude.replace("DIR", &dir.root().display().to_string());
    let backends = 4;
    let mut net = launch(&dir, backends, stripes, mptcp, &prelude).await;
    let s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    for round in 0..3i32 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(round)]).await.unwrap();
        let p = s.recv_timeout(LIMIT).await.unwrap();
        // Each rank answers round + its rank: 4 * round + (0 + 1 + 2 + 3).
        assert_eq!(p.values().unwrap()[0].as_i64(), Some(i64::from(4 * round + 6)), "round {round}");
    }
    let data = random_bytes(64 << 20);
    let report = send_to_own_dirs(&mut net, &dir, "big", &data, 16 << 20, LIMIT).await;
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.ranks_with(Outcome::Written), RankSet::range(0, backends as u32), "{report:?}");
    assert_copies(&dir, 0..backends as u32, "big", &data);
    // And the tree still sums afterwards.
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(s.recv_timeout(LIMIT).await.unwrap().values().unwrap()[0].as_i64(), Some(46));
    let needle = format!("TREECAST_SESSION={}", net.session());
    net.shutdown().await;
    assert_no_leftovers(&needle);
    dir
}

#[tokio::test]
async fn two_connections_per_link_sum_and_deliver_64_mib_byte_identical() {
    sums_and_64_mib(2, false, "").await;
}

#[tokio::test]
async fn four_connections_per_link_sum_and_deliver_64_mib_byte_identical() {
    sums_and_64_mib(4, false, "").await;
}

#[tokio::test]
async fn a_connection_cut_mid_transfer_loses_and_duplicates_nothing() {
    // Each back-end cuts connection 1 of its link once 60 pieces (15 MiB of the
    // file) arrived in order: what the kernel held for it is thrown away, and its
    // parent sends it again on the others. A copy or a gap would fail the bytes.
    let dir =
        sums_and_64_mib(3, false, "export TREECAST_STRIPE_CUT=60; exec 2>>DIR/stderr$TREECAST_RANK;").await;
    let cuts = (0..4)
        .filter(|r| {
            std::fs::read_to_string(dir.path(&format!("stderr{r}")))
                .is_ok_and(|log| log.contains("cutting connection 1"))
        })
        .count();
    let log0 = std::fs::read_to_string(dir.path("stderr0")).unwrap_or_default();
    assert_eq!(cuts, 4, "every back-end cut a connection of its link; rank 0 said: {log0}");
}

#[tokio::test]
async fn mptcp_links_sum_and_deliver_64_mib_byte_identical() {
    // Multipath TCP where the kernel has it, plain TCP where it refuses: both carry.
    sums_and_64_mib(0, true, "").await;
}
