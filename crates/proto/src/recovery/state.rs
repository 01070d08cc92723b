//! What [`crate::Node`] keeps for orphans rejoining: the state, apart from the behaviour
//! (`recovery.rs`) that changes it, so that the node's definition imports no behaviour.

use std::time::{Duration, Instant};

use std::collections::VecDeque;

use treecast_wire::{ControlMsg, RankSet};

/// A node's part in orphans rejoining the tree: where it and its children go when a
/// parent is lost, and what it awaits back from its own lost children.
#[derive(Debug, Default)]
pub(crate) struct Recovery {
    /// How long orphans have to rejoin (`None`: no recovery).
    pub(crate) rejoin: Option<Duration>,
    /// Where this node reached its parent (its children's fallback).
    pub(crate) parent_address: Option<String>,
    /// Where this node rejoins if its parent is lost (from the parent): its
    /// grandparent first, then the ancestors above, each tried in turn.
    pub(crate) fallback: Vec<String>,
    /// Looking for a new parent until then.
    pub(crate) rejoining: Option<Instant>,
    /// While rejoining: the address being tried, and those left to try after it in
    /// this round.
    pub(crate) trying: Option<String>,
    pub(crate) untried: Vec<String>,
    /// While rejoining, every fallback tried in vain: when the next round begins.
    pub(crate) next_round: Option<Instant>,
    /// Ranks of lost comm-node children awaited back.
    pub(crate) awaiting: Vec<Awaited>,
    /// Stops for ranks awaited back (their comm node was lost), with why: they
    /// are passed on once the ranks have rejoined.
    pub(crate) pending_stops: Vec<(RankSet, String)>,
    /// Front-end: every rank awaited back anywhere in the tree.
    pub(crate) orphaned: RankSet,
    /// Reports for the parent held, in order, until the data reduced before them has
    /// gone up: a rank's departure or loss must not overtake what it sent before.
    pub(crate) reports_after_data: VecDeque<ControlMsg>,
    /// The streams that hold data ahead of those reports, each with its mark
    /// (`StreamState::up_mark`): that data has gone once the stream passed it.
    pub(crate) reports_wait_for: Vec<(u32, u64)>,
    /// What those streams had sent up when last looked at, and when the reports go
    /// anyway unless more of it goes up by then.
    pub(crate) reports_seen_up: u64,
    pub(crate) reports_held_until: Option<Instant>,
}

/// Ranks of a lost comm node's sub-tree, awaited back for a while.
#[derive(Debug)]
pub(crate) struct Awaited {
    /// Those not back yet.
    pub(super) ranks: RankSet,
    /// Why they were orphaned, naming the lost node.
    pub(super) why: String,
    /// When those still missing are reported lost.
    pub(super) until: Instant,
}
