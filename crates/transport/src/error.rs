//! Errors of the transport layer.

use thiserror::Error;

/// Why a link could not be set up or failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TransportError {
    /// An operating-system call failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done, naming the peer where known.
        what: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The peer failed authentication or broke the handshake protocol.
    #[error("authentication with {peer} failed: {reason}")]
    Auth {
        /// The peer's address.
        peer: String,
        /// What went wrong.
        reason: String,
    },
    /// The parent turned the handshake away before finishing it: it had more
    /// connections under way than it takes at once (a flood). Trying again is right.
    #[error("{peer} turned the handshake away: too many connections under way at once; try again")]
    Busy {
        /// The peer's address.
        peer: String,
    },
    /// A step did not finish in time.
    #[error("{what} timed out after {secs:.1} s")]
    Timeout {
        /// What was being waited for.
        what: String,
        /// How long we waited.
        secs: f64,
    },
    /// The session secret is missing or malformed.
    #[error("bad session secret in {var}: {reason}; a treecast process must be started by its parent, which sets it")]
    Secret {
        /// The environment variable.
        var: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A rail of `TREECAST_RAILS` is malformed, or this host has no address on it.
    #[error("rail {rail:?}: {reason}")]
    Rail {
        /// The rail as given.
        rail: String,
        /// What is wrong, and what to do.
        reason: String,
    },
    /// A setting of the multicast route is out of its range.
    #[error("multicast route setting {0}")]
    Config(String),
}
