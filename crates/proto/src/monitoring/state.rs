//! What [`crate::Node`] keeps for monitoring requests: the state, apart from the behaviour
//! (`monitoring.rs`) that changes it, so that the node's definition imports no behaviour.

use std::time::{Duration, Instant};

use treecast_monitor::Collection;
use treecast_wire::CollectMode;

/// A collection this node takes part in, waiting for its answers.
#[derive(Debug)]
pub(crate) struct PendingCollect {
    pub(super) id: u32,
    pub(super) mode: CollectMode,
    /// Children (by index) whose answer has not come.
    pub(super) waiting: Vec<usize>,
    /// Its own report is in.
    pub(super) own: bool,
    pub(super) gathered: Collection,
    pub(super) deadline: Instant,
    pub(super) limit: Duration,
}

/// A node's monitoring requests under way, and at the front-end, those finished.
#[derive(Debug, Default)]
pub(crate) struct MonitorRequests {
    pub(super) pending: Vec<PendingCollect>,
    pub(super) done: Vec<(u32, Collection)>,
}
