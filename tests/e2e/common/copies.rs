//! Files sent to back-ends that each run in a directory of their own (they share
//! this host's file system): every rank writes its own copy through
//! `/proc/self/cwd`, and what each node's multicast route did.

use std::path::PathBuf;
use std::time::Duration;

use treecast_api::Network;
use treecast_files::{bcast_files, FileEntry, FileOptions, FileReport};
use treecast_monitor::RouteReport;

use super::TestDir;

/// Makes `rank0` … under `dir`; returns the back-end command line that starts each
/// rank in its own, after `prelude` (shell, may be empty).
pub(crate) fn own_dirs(dir: &TestDir, ranks: usize, treecast: &str, prelude: &str) -> String {
    for rank in 0..ranks {
        std::fs::create_dir(dir.path(&format!("rank{rank}"))).unwrap();
    }
    format!("{prelude} cd {}/rank$TREECAST_RANK && exec {treecast} backend", dir.root().display())
}

/// Sends `data` as `name` to every rank in `chunk`-byte chunks, each writing its own copy.
pub(crate) async fn send_to_own_dirs(
    net: &mut Network,
    dir: &TestDir,
    name: &str,
    data: &[u8],
    chunk: usize,
    limit: Duration,
) -> FileReport {
    let src = dir.path(name);
    std::fs::write(&src, data).unwrap();
    let comm = net.broadcast_communicator();
    let entry = [FileEntry::file(&src, Some(PathBuf::from(format!("/proc/self/cwd/{name}"))))];
    let options = FileOptions { chunk, ..FileOptions::default() };
    let transfer = bcast_files(net, &comm, &entry, &options, |_| {});
    tokio::time::timeout(limit, transfer).await.unwrap().unwrap().pop().unwrap()
}

/// Every rank of `ranks` holds exactly `data` as `name`.
pub(crate) fn assert_copies(dir: &TestDir, ranks: impl IntoIterator<Item = u32>, name: &str, data: &[u8]) {
    for rank in ranks {
        let copy = std::fs::read(dir.path(&format!("rank{rank}/{name}"))).unwrap();
        assert!(copy == data, "rank {rank}: {name} differs ({} bytes, {} expected)", copy.len(), data.len());
    }
}

/// What every node's multicast route did, by node id; every node answers.
pub(crate) async fn route_reports(net: &Network) -> Vec<RouteReport> {
    let c = net.monitor_collect(true, Duration::from_secs(20)).await.unwrap();
    assert!(c.missing.is_empty(), "{:?}", c.missing);
    let mut routes: Vec<RouteReport> = c.reports.into_values().flat_map(|r| r.routes).collect();
    routes.sort_by_key(|r| r.node);
    routes
}
