//! What the front-end is told about its network besides data: [`Event`].

use treecast_wire::RankSet;

/// Something that happened in the network, apart from data.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum Event {
    /// Back-ends can no longer be reached; waves complete without them.
    RanksLost {
        /// The lost ranks.
        ranks: RankSet,
        /// Which node noticed, and why.
        reason: String,
    },
    /// A comm node was lost. The ranks below it left the waves at once and are
    /// awaited back: their nodes rejoin the tree under the lost node's parent
    /// ([`Event::RanksRejoined`]), or are reported lost ([`Event::RanksLost`]) when
    /// they do not within the rejoin limit (see `NetworkBuilder::rejoin_within`).
    NodeLost {
        /// The lost node, e.g. `comm node n3 (node 2)`.
        node: String,
        /// The ranks below it.
        ranks: RankSet,
        /// Which node noticed, and why.
        reason: String,
    },
    /// Ranks orphaned by a lost comm node rejoined; streams take them in again from
    /// the next wave.
    RanksRejoined {
        /// The ranks.
        ranks: RankSet,
        /// The node they rejoined under.
        parent: String,
    },
    /// A message from one back-end to another found no way to its destination (the
    /// rank left, was lost or never was) and was dropped.
    MessageUndeliverable {
        /// The sender.
        from: u32,
        /// The destinations it could not reach.
        to: RankSet,
    },
    /// The link to another network closed (it ended, or either front-end
    /// disconnected); messages to its ranks are undeliverable from now on.
    NetworkClosed {
        /// This front-end's number for it ([`crate::RemoteNetwork::index`]).
        index: u32,
        /// Why.
        reason: String,
    },
    /// Back-ends joined while the network runs; streams whose communicator names them
    /// take them in from the next wave.
    RanksJoined {
        /// The ranks that joined.
        ranks: RankSet,
    },
    /// Back-ends left the network on purpose (they closed); waves complete without them.
    RanksLeft {
        /// The ranks that left.
        ranks: RankSet,
        /// Which node noticed.
        reason: String,
    },
    /// A filter refused a packet: at a comm node (the rest of its wave went on), or at
    /// the back-end's own `send`, which failed (the wave waits for that rank's next packet).
    FilterError {
        /// The stream.
        stream: u32,
        /// The rank whose packet was refused (`u32::MAX` when unknown).
        rank: u32,
        /// What did not match.
        message: String,
    },
    /// A node could not make a stream's filters; the stream is closed.
    StreamRefused {
        /// The stream.
        stream: u32,
        /// The node that refused it.
        node: String,
        /// Why.
        message: String,
    },
}

impl std::fmt::Display for Event {
    /// One line for a log or a terminal, e.g. `lost rank 5: comm node n3 (node 2): …`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Event::RanksLost { ranks, reason } => write!(f, "lost {}: {reason}", Ranks(ranks)),
            Event::RanksJoined { ranks } => write!(f, "{} joined", Ranks(ranks)),
            Event::NetworkClosed { index, reason } => {
                write!(f, "the link to network {index} closed: {reason}")
            }
            Event::MessageUndeliverable { from, to } => {
                write!(f, "a message from rank {from} to {} was dropped: not in the tree", Ranks(to))
            }
            Event::NodeLost { node, ranks, reason } => {
                write!(f, "lost {node}; {} below it may rejoin: {reason}", Ranks(ranks))
            }
            Event::RanksRejoined { ranks, parent } => write!(f, "{} rejoined under {parent}", Ranks(ranks)),
            Event::RanksLeft { ranks, reason } => write!(f, "{} left: {reason}", Ranks(ranks)),
            Event::FilterError { stream, rank: u32::MAX, message } => {
                write!(f, "stream {stream}: a filter failed: {message}")
            }
            Event::FilterError { stream, rank, message } => {
                write!(f, "stream {stream}: the packet of rank {rank} was refused: {message}")
            }
            Event::StreamRefused { stream, node, message } => {
                write!(f, "stream {stream} was refused by {node}: {message}")
            }
        }
    }
}

/// A rank set with its noun: `rank 5`, `ranks 3-5,9`.
struct Ranks<'a>(&'a RankSet);

impl std::fmt::Display for Ranks<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.len() {
            1 => write!(f, "rank {}", self.0),
            _ => write!(f, "ranks {}", self.0),
        }
    }
}
