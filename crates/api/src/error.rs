//! Errors of the API.

use std::time::Duration;

use thiserror::Error;
use treecast_wire::RankSet;

/// Why an API call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The network could not be started.
    #[error("starting the network failed: {0}")]
    Startup(#[from] treecast_node::NodeError),
    /// The topology is unusable.
    #[error(transparent)]
    Topology(#[from] treecast_topology::TopologyError),
    /// A format string is malformed or does not match its values.
    #[error(transparent)]
    Format(#[from] treecast_wire::FormatError),
    /// The stream's filter cannot take packets of this format.
    #[error("stream {stream}: {source}")]
    Filter {
        /// The stream.
        stream: u32,
        /// What the filter refuses.
        #[source]
        source: treecast_filters::FilterError,
    },
    /// A packet's payload does not decode.
    #[error("malformed packet payload: {0}")]
    Decode(#[from] treecast_wire::DecodeError),
    /// The `treecast` binary for comm nodes could not be found.
    #[error("cannot find the treecast binary for comm nodes ({0}); set TREECAST_PATH to its full path")]
    NoBinary(String),
    /// Ranks asked for are not back-ends of this network.
    #[error("ranks {ranks} are not back-ends of this network (it has ranks 0-{last})")]
    NoSuchRanks {
        /// The ranks that do not exist.
        ranks: RankSet,
        /// The highest rank.
        last: u32,
    },
    /// The stream was never created here or was closed.
    #[error("stream {0} is not open")]
    UnknownStream(u32),
    /// Every member of the stream is gone; nothing more will arrive on it.
    #[error("stream {0} is closed: every back-end of it was lost or the network shut down")]
    StreamClosed(u32),
    /// The network or the link to the parent is gone.
    #[error("the network is shut down ({0})")]
    Closed(String),
    /// A receive did not complete in time.
    #[error("nothing arrived within {0:?}")]
    Timeout(Duration),
    /// A file to send cannot be used (see [`crate::bcast_file`]); nothing was sent for it.
    #[error(transparent)]
    Source(#[from] crate::SourceError),
    /// The environment set by the launcher is missing or wrong.
    #[error("{0}")]
    Env(String),
}
