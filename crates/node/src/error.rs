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
    /// The tree could not be started; the message names the node that failed, its
    /// host and what its process said.
    #[error("{message}")]
    Startup {
        /// What failed.
        message: String,
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
