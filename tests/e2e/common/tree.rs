//! A local tree launched with this build's binary, and its end with a check that
//! nothing of it is left running.

use std::time::Duration;

use treecast_api::{Network, NetworkBuilder, Topology};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
/// How long a test tree may take to start.
const STARTUP_LIMIT: Duration = Duration::from_secs(20);

/// Launches `spec` with `backends` back-ends on this host.
pub(crate) async fn launch(spec: &str, backends: usize) -> Network {
    let topo = Topology::from_spec(spec, Some(backends)).unwrap();
    NetworkBuilder::new(topo).treecast_path(TREECAST).startup_timeout(STARTUP_LIMIT).launch().await.unwrap()
}

/// Shuts `net` down and checks that none of its processes is left.
pub(crate) async fn finish(net: Network) {
    let needle = format!("TREECAST_SESSION={}", net.session());
    net.shutdown().await;
    super::assert_no_leftovers(&needle);
}
