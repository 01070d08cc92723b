//! Monitoring from the front-end: start and stop recording on every node, and
//! collect what they recorded through the tree (see `docs/monitoring.md`).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use treecast_driver::lock;
use treecast_proto::Command;
use treecast_wire::CollectMode;

use crate::{ApiError, Network, MONITOR_ORDER_LIMIT};

/// How often a collection in progress is looked at.
const POLL: Duration = Duration::from_millis(5);

impl Network {
    /// Every node starts recording each frame's latency components (queue, send,
    /// net, deliver) on each of its links, kept under `program`, a tag that tells
    /// phases or tools sharing the tree apart. What was recorded before is kept.
    ///
    /// Returns once every node confirmed, so frames sent after it are recorded
    /// everywhere they go; the list names the nodes that did not confirm within
    /// [`MONITOR_ORDER_LIMIT`] (lost, or too slow), and is usually empty.
    ///
    /// # Errors
    /// The network is over, or no answer came at all.
    ///
    /// Cancel safety: cancel safe; recording starts anyway.
    pub async fn monitor_start(&self, program: u32) -> Result<Vec<String>, ApiError> {
        lock(&self.shared)
            .command(Command::MonitorStart { program })
            .map_err(|e| ApiError::from_command(0, e))?;
        self.confirmed().await
    }

    /// Every node stops recording. Returns once every node confirmed, so nothing
    /// sent after it is recorded; the list names the nodes that did not confirm.
    ///
    /// # Errors
    /// As [`Network::monitor_start`].
    pub async fn monitor_stop(&self) -> Result<Vec<String>, ApiError> {
        lock(&self.shared).command(Command::MonitorStop).map_err(|e| ApiError::from_command(0, e))?;
        self.confirmed().await
    }

    /// Waits until every node handled the orders sent before: a collection travels
    /// behind them on every link and each node handles its orders in turn.
    pub(crate) async fn confirmed(&self) -> Result<Vec<String>, ApiError> {
        Ok(self.collect(CollectMode::Confirm, MONITOR_ORDER_LIMIT).await?.missing)
    }

    /// Collects what every node recorded. Each comm node adds its children's reports
    /// to its own, so the front-end reads one report per sub-tree of its children,
    /// merged into one under node 0, or, with `per_node`, one per node. Nodes that do
    /// not answer within `limit` (lost, or too slow) are named in
    /// [`treecast_monitor::Collection::missing`].
    ///
    /// # Errors
    /// The network is over, or the tree gave no answer at all within `limit` plus a
    /// second.
    ///
    /// Cancel safety: cancelling leaves the answer with the front-end, which keeps the
    /// last 16 answers nobody took.
    pub async fn monitor_collect(
        &self,
        per_node: bool,
        limit: Duration,
    ) -> Result<treecast_monitor::Collection, ApiError> {
        let mode = if per_node { CollectMode::PerNode } else { CollectMode::Merged };
        self.collect(mode, limit).await
    }

    /// Runs one collection and waits for it.
    async fn collect(
        &self,
        mode: CollectMode,
        limit: Duration,
    ) -> Result<treecast_monitor::Collection, ApiError> {
        let id = self.next_collect.fetch_add(1, Ordering::Relaxed);
        lock(&self.shared)
            .command(Command::MonitorCollect { id, mode, limit })
            .map_err(|e| ApiError::from_command(0, e))?;
        // The core ends the collection at `limit` with what it has; the second is for
        // the driver to get there.
        let deadline = Instant::now() + limit + Duration::from_secs(1);
        loop {
            if let Some(c) = lock(&self.shared).take_monitor_collection(id) {
                return Ok(c);
            }
            if Instant::now() >= deadline {
                return Err(ApiError::Timeout(limit));
            }
            tokio::time::sleep(POLL).await;
        }
    }
}
