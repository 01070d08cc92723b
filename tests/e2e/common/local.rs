//! What most areas share: a tree on this host started with this build's binary, a
//! sum stream over it, and CLI runs tagged so that their whole tree can be found.

use std::process::Command;
use std::time::Duration;

use treecast_api::{Network, NetworkBuilder, StreamOptions, Topology, TransformKind};

use super::assert_no_leftovers;

/// This build's `treecast` binary.
pub(crate) const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
/// Back-ends that misbehave on purpose (`tests/helpers/backend.rs`), started in
/// place of `treecast backend`: `panicking`, `rogue`, `send-and-return`.
pub(crate) const TEST_BACKEND: &str = env!("CARGO_BIN_EXE_treecast-test-backend");
/// How long a test tree may take to start, and a test to wait for an answer.
pub(crate) const LIMIT: Duration = Duration::from_secs(20);

/// Launches `spec` with `backends` back-ends on this host.
pub(crate) async fn launch(spec: &str, backends: usize) -> Network {
    let topo = Topology::from_spec(spec, Some(backends)).unwrap();
    builder(topo).launch().await.unwrap()
}

/// A builder for `topo` that runs this build's binary.
pub(crate) fn builder(topo: Topology) -> NetworkBuilder {
    NetworkBuilder::new(topo).treecast_path(TREECAST).startup_timeout(LIMIT)
}

/// A sum reduction over every rank.
pub(crate) async fn sum_stream(net: &Network) -> treecast_api::Stream {
    net.new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum)).await.unwrap()
}

/// The first value of `p`, as an integer.
pub(crate) fn int(p: &treecast_api::Packet) -> i64 {
    p.values().unwrap()[0].as_i64().unwrap()
}

/// A unique tag put in the environment of a CLI run, inherited by its whole tree.
pub(crate) fn tag() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("TREECAST_TEST_TAG={}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

/// Runs `treecast ARGS` with `tag` in its environment and checks that nothing of its
/// tree is left running.
pub(crate) fn treecast(tag: &str, args: &[&str]) -> std::process::Output {
    let (k, v) = tag.split_once('=').unwrap();
    let out = Command::new(TREECAST).args(args).env(k, v).output().unwrap();
    assert_no_leftovers(tag);
    out
}
