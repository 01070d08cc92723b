//! Errors of the node layer.

use thiserror::Error;

/// Why a node could not start or run its sub-tree.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum NodeError {
    /// The environment set by the parent is missing or wrong.
    #[error("environment variable {var}: {reason}; treecast nodes are started by their parent, not by hand")]
    Env {
        /// The variable.
        var: &'static str,
        /// What is wrong.
        reason: String,
    },
    /// A link failed.
    #[error(transparent)]
    Transport(#[from] treecast_transport::TransportError),
    /// A process could not be started.
    #[error(transparent)]
    Launch(#[from] treecast_launch::LaunchError),
    /// The sub-tree received from the parent does not parse.
    #[error("bad sub-tree from parent: {0}")]
    Topology(#[from] treecast_topology::TopologyError),
    /// A child (or a node below it) failed to start.
    #[error("{0}")]
    Startup(String),
    /// The parent broke the protocol.
    #[error("protocol error with {peer}: {reason}")]
    Protocol {
        /// The peer.
        peer: String,
        /// What it did wrong.
        reason: String,
    },
    /// An OS call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}
