//! What [`crate::Node`] keeps for peer messages, and the window they are held to: the state, apart from the behaviour
//! (`peer.rs`) that changes it, so that the node's definition imports no behaviour.

use std::collections::VecDeque;

use treecast_wire::{Frame, Window};

use crate::window::Budget;

/// What a back-end may have sent to other back-ends and not yet seen read.
pub const PEER_WINDOW: Window = Window { packets: 64, bytes: 16 << 20 };

/// A node's side of peer messages.
#[derive(Debug)]
pub(crate) struct PeerState {
    /// Back-end: what its messages may still take.
    pub(super) budget: Budget,
    /// Back-end: acknowledgements of messages read while it had no parent.
    pub(super) held_acks: Vec<Frame>,
    /// Messages passed to each back-end child and not yet acknowledged by it, by
    /// node id: (sender, the child's rank, bytes), in order.
    pub(super) unanswered: std::collections::BTreeMap<u32, VecDeque<(u32, u32, u64)>>,
}

impl Default for PeerState {
    fn default() -> Self {
        PeerState {
            budget: Budget::new(PEER_WINDOW),
            held_acks: Vec::new(),
            unanswered: std::collections::BTreeMap::new(),
        }
    }
}
