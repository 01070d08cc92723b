//! The ranks streams are created over, and the rank the front-end sends as.

use treecast_wire::RankSet;

/// Rank put in downstream frames sent by the front-end.
pub const FRONT_END_RANK: u32 = u32::MAX;

/// A set of back-end ranks that streams are created over.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Communicator {
    ranks: RankSet,
}

impl Communicator {
    /// A communicator over `ranks`, known to be back-ends of the network.
    pub(crate) fn over(ranks: RankSet) -> Communicator {
        Communicator { ranks }
    }

    /// The ranks of the communicator.
    pub fn ranks(&self) -> &RankSet {
        &self.ranks
    }
}
