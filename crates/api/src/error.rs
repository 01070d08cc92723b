//! Errors of the API.

use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use treecast_wire::RankSet;

use crate::{DEFAULT_CHUNK, DEFAULT_TIMEOUT, MAX_CHUNK, MAX_TIMEOUT};

/// Why an API call failed.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The network could not be started.
    #[error("starting the network failed: {0}")]
    Startup(#[from] treecast_node::NodeError),
    /// A back-end could not join its parent.
    #[error("joining the tree failed: {0}")]
    Join(treecast_node::NodeError),
    /// The topology has no leaf to run a back-end on.
    #[error("the topology has no back-ends: give a tree with at least one leaf")]
    NoBackends,
    /// A filter name is empty or too long.
    #[error("filter name {name:?} is {len} bytes long; names have 1 to {max} bytes")]
    FilterName {
        /// The name.
        name: String,
        /// Its length.
        len: usize,
        /// The longest name accepted.
        max: usize,
    },
    /// A stream window allows nothing.
    #[error("the {which} window of a stream must allow at least one packet and one byte")]
    EmptyWindow {
        /// `upward` or `downward`.
        which: &'static str,
    },
    /// A node cannot make a stream's filter.
    #[error("stream {stream}: {node}: {source}")]
    StreamFilter {
        /// The stream.
        stream: u32,
        /// The node (here, the front-end, or a back-end checking what it sends).
        node: String,
        /// What the filter registry said.
        #[source]
        source: treecast_filters::RegistryError,
    },
    /// A node of the tree could not make the stream's filters; the stream is closed.
    #[error("stream {stream} was refused by {reason}")]
    StreamRefused {
        /// The stream.
        stream: u32,
        /// The node and its reason.
        reason: String,
    },
    /// A variable a launched back-end needs is missing: the program was not started by treecast.
    #[error(
        "{var} is not set: this program must be started by treecast as a back-end (or use BackEnd::attach)"
    )]
    NotLaunched {
        /// The variable.
        var: &'static str,
    },
    /// A variable holds something that is not what it should be.
    #[error("{var}={value:?} is not a number")]
    BadEnv {
        /// The variable.
        var: &'static str,
        /// Its value.
        value: String,
    },
    /// Attach mode without an attach file.
    #[error("no attach file given: pass one or set {var}")]
    NoAttachFile {
        /// The variable that names it.
        var: &'static str,
    },
    /// A link could not be set up.
    #[error("{what}: {source}")]
    Link {
        /// What was being done.
        what: &'static str,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
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
    #[error("the network is shut down: {0}")]
    Closed(treecast_node::core::EndReason),
    /// The core refused a command (a bug in the caller's use of the API, or a race with the end).
    #[error(transparent)]
    Refused(Box<treecast_node::core::CommandError>),
    /// A back-end's file-writing thread is gone.
    #[error("the file-writing thread of this back-end has ended; no more transfers can be received")]
    FileWorkerGone,
    /// A receive did not complete in time.
    #[error("nothing arrived within {0:?}")]
    Timeout(Duration),
    /// A file to send cannot be used (see [`crate::bcast_file`]); nothing was sent for it.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// The environment set by the launcher is missing or wrong.
    #[error("{0}")]
    Env(String),
}

impl ApiError {
    /// The error for a command the core refused on `stream`.
    pub(crate) fn from_command(stream: u32, e: treecast_node::core::CommandError) -> ApiError {
        use treecast_node::core::CommandError;
        match e {
            CommandError::Filter { source, node, .. } => ApiError::StreamFilter { stream, node, source },
            CommandError::UnknownStream(id) | CommandError::StreamExists(id) => ApiError::UnknownStream(id),
            CommandError::NotAMember { rank, .. } => {
                ApiError::NoSuchRanks { ranks: RankSet::single(rank), last: u32::MAX }
            }
            CommandError::ShutDown => ApiError::Closed(treecast_node::core::EndReason::ShutDown),
            other => ApiError::Refused(Box::new(other)),
        }
    }
}

/// Why a file cannot be sent: every cause is found on the front-end before anything
/// is sent for that file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The chunk size is 0 or over [`MAX_CHUNK`].
    #[error("chunk size {0} is not between 1 and {MAX_CHUNK} bytes: pick a size in that range (default {DEFAULT_CHUNK})")]
    ChunkSize(usize),
    /// A source is not what its [`crate::EntryKind`] says (a link that is not a link …).
    #[error("source {path} is {kind}, not {expected}: send it as what it is, or pick another path")]
    WrongKind {
        /// The source.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
        /// What it was sent as.
        expected: &'static str,
    },
    /// The time limit is zero or longer than [`MAX_TIMEOUT`].
    #[error("time limit {0:?} is not between 1 ms and {MAX_TIMEOUT:?}: pick a limit in that range (default {DEFAULT_TIMEOUT:?})")]
    Timeout(std::time::Duration),
    /// A path could not be made absolute (the working directory is gone).
    #[error("cannot make {path} absolute: {source}; give an absolute path")]
    Absolute {
        /// The path as given.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The source could not be opened.
    #[error("cannot open source {path}: {source}; check that it exists and is readable")]
    Open {
        /// The source.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The target of a source link could not be read.
    #[error(
        "cannot read the link {path}: {source}; check that it still exists and its directory is readable"
    )]
    ReadLink {
        /// The link.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The source's metadata (size, mtime, mode) could not be read.
    #[error("cannot stat source {path}: {source}; check the permissions of its directories")]
    Stat {
        /// The source.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The source is not a regular file (a directory, a device …).
    #[error("source {path} is not a regular file ({kind}); send directories with `treecast bcast -r`")]
    NotAFile {
        /// The source.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A source or destination path, or a link target, is not valid UTF-8, which the status packet needs.
    #[error("path {0} is not valid UTF-8: rename it, or send it under a UTF-8 destination name")]
    NotUtf8(PathBuf),
}
