//! What [`crate::Node`] keeps for collective operations: the state, apart from the behaviour
//! (`collective.rs`) that changes it, so that the node's definition imports no behaviour.

use std::collections::BTreeMap;
use std::time::Instant;

use bytes::Bytes;
use treecast_wire::{CollectiveHead, Frame, RankSet};

/// Where a result being routed came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Origin {
    /// Computed here (this node is the members' common ancestor).
    Here,
    /// Down from the parent.
    Parent,
    /// Up from this child (on its way to a root elsewhere).
    Child(usize),
}

/// An operation this node has contributions for and has not passed on yet.
#[derive(Debug)]
pub(super) struct Open {
    /// The head of the first contribution (its contributors and error are this
    /// node's running ones).
    pub(super) head: CollectiveHead,
    /// The body in parts, shared with the frames they came in: one part, folded
    /// so far (reductions), or each child's entries (gathers), joined once sent.
    pub(super) parts: Vec<Bytes>,
    /// The members below this node it waited for at its last check.
    pub(super) awaited: RankSet,
    /// Members not waited for any more: they dropped out from below meanwhile.
    pub(super) excused: RankSet,
    /// When it ends with an error if still open.
    pub(super) expires: Instant,
}

/// A node's open collective operations, by (context, number).
#[derive(Debug, Default)]
pub(crate) struct Collectives {
    pub(super) open: BTreeMap<(u64, u32), Open>,
    /// Back-end: its contributions not yet answered, sent again after a rejoin (a
    /// lost comm node may have held them).
    pub(super) unanswered: BTreeMap<(u64, u32), Frame>,
    /// Comm node: partials sent up whose result has not come down through here,
    /// sent again to a new parent after a rejoin; forgotten at expiry.
    pub(super) sent_up: BTreeMap<(u64, u32), SentUp>,
}

/// A partial sent up, kept until its result passes on the way down.
#[derive(Debug)]
pub(super) struct SentUp {
    /// Every partial of it sent up (more than one when ranks joined below late).
    pub(super) partials: Vec<Frame>,
    /// The ranks in it.
    pub(super) contributors: RankSet,
    /// When it is forgotten.
    pub(super) expires: Instant,
}
