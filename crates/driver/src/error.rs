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
    /// A child on another host, but no launcher for other hosts.
    #[error("host {host} is not this host and no launcher for other hosts was chosen (use --launcher ssh or slurm)")]
    NoLauncher {
        /// The host.
        host: String,
    },
    /// No address of this host that the other hosts can reach was found.
    #[error("cannot tell which address the other hosts can reach this host on ({}); set TREECAST_LISTEN", list(.tried))]
    NoAddress {
        /// What was tried, one error per host.
        tried: Vec<treecast_launch::RouteError>,
    },
    /// No listener was opened for a child (an address for other hosts could not be found).
    #[error("no listener for this child: {reason}")]
    NoListener {
        /// Why.
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

fn list(errors: &[treecast_launch::RouteError]) -> String {
    errors.iter().map(ToString::to_string).collect::<Vec<_>>().join("; ")
}
