//! What [`crate::Node`] keeps for linked networks, and how their ranks are numbered:
//! the state, apart from the behaviour (`remote.rs`) that changes it, so that the
//! node's definition imports no behaviour.

use std::collections::{BTreeMap, VecDeque};

use treecast_wire::{LinkId, RankSet};

/// The first rank number given to remote networks' ranks; a network's own ranks stay below.
pub const REMOTE_BASE: u32 = 0x8000_0000;

/// How many rank numbers each remote network has: its ranks must stay below this.
pub const REMOTE_SPAN: u32 = 1 << 24;

/// How many remote networks one front-end may link to at once.
pub const MAX_REMOTES: u32 = 127;

/// Where the ranks of remote network `index` start in this network's numbering.
pub fn remote_base(index: u32) -> u32 {
    REMOTE_BASE.saturating_add(index.saturating_mul(REMOTE_SPAN))
}

/// A remote network linked to this front-end, as its driver hands the link over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteSpec {
    /// This front-end's number for it: its rank r is `remote_base(index) + r` here.
    pub index: u32,
    /// Its ranks, 0 to `size - 1`, when the link was made.
    pub size: u32,
    /// The other front-end's number for this network: this network's rank r is
    /// `remote_base(their_index) + r` there.
    pub their_index: u32,
    /// This network's ranks, 0 to `own_size - 1`, as it told the other: only
    /// those can send across (the other side knows no others).
    pub own_size: u32,
}

/// Why a link to another network cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// A network number past [`MAX_REMOTES`].
    #[error("network number {0} is out of range: a front-end links to at most {MAX_REMOTES} networks")]
    Number(u32),
    /// More ranks than a remote network may have.
    #[error("a linked network has at most {REMOTE_SPAN} ranks, not {0}")]
    TooManyRanks(u32),
}

impl RemoteSpec {
    /// Its ranks in this network's numbering.
    pub fn ranks(&self) -> RankSet {
        RankSet::range(remote_base(self.index), self.size)
    }

    /// Whether `rank` (in this network's numbering) is one of its ranks.
    pub fn has(&self, rank: u32) -> bool {
        rank.checked_sub(remote_base(self.index)).is_some_and(|r| r < self.size)
    }

    /// Why it cannot be linked, if it cannot.
    ///
    /// # Errors
    /// A network number past [`MAX_REMOTES`], or more ranks than [`REMOTE_SPAN`]
    /// on either side.
    pub fn check(&self) -> Result<(), RemoteError> {
        for index in [self.index, self.their_index] {
            if index >= MAX_REMOTES {
                return Err(RemoteError::Number(index));
            }
        }
        for size in [self.size, self.own_size] {
            if size > REMOTE_SPAN {
                return Err(RemoteError::TooManyRanks(size));
            }
        }
        Ok(())
    }
}

/// A linked remote network at the front-end.
#[derive(Debug)]
pub(crate) struct RemoteNet {
    pub(super) spec: RemoteSpec,
    pub(super) link: Option<LinkId>,
    /// Messages that crossed and are not yet acknowledged: (sender, destination
    /// in this numbering, bytes), in order.
    pub(super) unanswered: VecDeque<(u32, u32, u64)>,
    /// What each of its senders has passed in and this network has not yet
    /// acknowledged (messages, bytes): held to the senders' window, so that what
    /// it sends in is bounded even if its front-end is not.
    pub(super) inbound: BTreeMap<u32, (u32, u64)>,
}
