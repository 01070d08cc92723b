//! Errors of the API.

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use thiserror::Error;
use treecast_wire::RankSet;

/// Why an API call failed.
///
/// Its `Debug` form is its message with its causes, the same as `Display` shows
/// them, so that a tool whose `main` returns `Result<_, Box<dyn Error>>` prints what
/// failed and what to do, not the variant's fields.
#[derive(Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The network could not be started.
    #[error("starting the network failed: {0}")]
    Startup(#[from] treecast_driver::NodeError),
    /// The launcher the builder names cannot be made (no launcher of that name is
    /// registered, or it refused its options); nothing was started.
    #[error("starting the network failed: {0}")]
    Launcher(#[from] treecast_launch::LaunchError),
    /// A back-end could not join its parent.
    #[error("joining the tree failed: {0}")]
    Join(treecast_driver::NodeError),
    /// A back-end reached its parent but got no plan (who it is, the network's limits).
    #[error(
        "joining the tree failed: the parent at {parent} sent this back-end no plan ({why}); \
         check that the back-end and the tree run the same treecast version"
    )]
    NoPlan {
        /// The parent's address.
        parent: String,
        /// Why not: the link's end, or the time waited.
        why: String,
    },
    /// A plug-in filter given to the builder could not be loaded.
    #[error("loading a plug-in filter failed: {0}")]
    Plugin(#[from] treecast_plugin::PluginError),
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
    /// A comm node could not load a plug-in shipped down the tree.
    #[error(
        "plug-in filter {filter} was refused by {node} ({reason}){more}; streams using it would be refused \
         there: build the plug-in for that node and load it again",
        more = if *others == 0 { String::new() } else { format!(" and by {others} more node(s)") }
    )]
    FilterRefused {
        /// The plug-in (its file name).
        filter: String,
        /// The first node that refused it.
        node: String,
        /// Its reason.
        reason: String,
        /// How many more nodes refused it.
        others: usize,
    },
    /// Nodes did not confirm, in time, that they handled a plug-in shipped down the tree.
    #[error(
        "plug-in filter {filter}: no confirmation within {limit:?} from {nodes}: they may not have loaded \
         it (lost, or too slow); load it again before using it on streams that reach them"
    )]
    FilterUnconfirmed {
        /// The plug-in (its file name).
        filter: String,
        /// The nodes that did not answer.
        nodes: String,
        /// How long they were awaited.
        limit: std::time::Duration,
    },
    /// A stream chose a route the network's links do not carry.
    #[error("a stream cannot take the {route} route: {why}")]
    RouteNotCarried {
        /// The route asked for.
        route: treecast_wire::RouteChoice,
        /// What the network lacks, and how to launch one that has it.
        why: &'static str,
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
    /// A back-end's packet does not suit its stream's filter (`%s` on a `sum` stream):
    /// it was not sent, and the front-end gets an `Event::FilterError` naming this rank.
    #[error(
        "stream {stream}: {source}; nothing was sent (the front-end sees a filter error naming this \
         rank): send values of types the stream's {filter} filter takes"
    )]
    WrongFormat {
        /// The stream.
        stream: u32,
        /// The stream's upward filter, e.g. `sum`.
        filter: String,
        /// What the filter refuses.
        #[source]
        source: treecast_filters::FilterError,
    },
    /// `unpack` on a packet of the equivalence-class filter, which holds a table of
    /// classes, not the values its back-ends sent.
    #[error(
        "stream {stream}: this packet is an equivalence-class table (the eqclass filter's output), \
         not the values the back-ends sent: read it with Packet::eq_classes()"
    )]
    EqClassPacket {
        /// The stream.
        stream: u32,
    },
    /// A packet's payload does not decode.
    #[error("malformed packet payload: {0}")]
    Decode(#[from] treecast_wire::DecodeError),
    /// The `treecast` binary for comm nodes could not be found; the text says where
    /// it was looked for.
    #[error(
        "cannot find the treecast binary that comm nodes run: {0}; name its full path with \
         NetworkBuilder::treecast_path (a tool may take it from TREECAST_PATH, as the treecast command \
         does), or make this program its own comm node (see treecast_api::run_comm_node)"
    )]
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
    /// The wave answering one request of the stream formed with no packet: every rank
    /// that got the request was cut off with its comm node before answering. The
    /// stream goes on; ranks that rejoin answer later requests.
    #[error("stream {0}: no rank answered this request: every back-end that got it was cut off with its comm node (orphans that rejoin answer the next requests); call recv again for the next answer")]
    NoAnswer(u32),
    /// The network or the link to the parent is gone.
    #[error("the network is shut down: {0}")]
    Closed(treecast_proto::EndReason),
    /// The core refused a command (a bug in the caller's use of the API, or a race with the end).
    #[error(transparent)]
    Refused(Box<treecast_proto::CommandError>),
    /// A back-end's file-writing thread is gone.
    #[error("the file-writing thread of this back-end has ended; no more transfers can be received")]
    FileWorkerGone,
    /// A receive did not complete in time.
    #[error(
        "nothing arrived within {0:?}; the network's events say whether a rank was lost or its packet \
         refused by a filter (next_event)"
    )]
    Timeout(Duration),
    /// A request ([`crate::Request`]) was cancelled before it completed.
    #[error("the request was cancelled before it completed")]
    Cancelled,
    /// A request's task panicked (a bug in treecast: please report it with this message).
    #[error("the request's task ended in a panic ({0}); this is a bug in treecast, please report it")]
    RequestPanicked(String),
    /// A matched receive found nothing it takes among the packets held for later
    /// receives, and may hold no more.
    #[error("stream {stream}: {held} packets that no receive matched are held; receive them (recv, or a wider match) before waiting for others")]
    Unmatched {
        /// The stream.
        stream: u32,
        /// How many packets are held.
        held: usize,
    },
    /// [`crate::Network::wait_clock`] ran out of time.
    #[error("the global clock measured {missing} nodes fewer than {rounds} times within {secs:.1} s; wait longer, or check that every node runs this treecast version")]
    ClockTimeout {
        /// Rounds asked for.
        rounds: u32,
        /// Nodes with fewer rounds.
        missing: usize,
        /// The limit, seconds.
        secs: f64,
    },
    /// A file to send cannot be used (see `treecast_files::bcast_file`); nothing was sent for it.
    #[error(transparent)]
    Source(#[from] SourceError),
    /// An attach file could not be written (front-end) or used (back-end).
    #[error(transparent)]
    Attach(#[from] AttachError),
    /// A setting is missing or wrong: one of the builder's (a frame limit, a stall
    /// limit, a log filter, a UDP setting), or of the environment a launcher set.
    #[error("{0}")]
    Env(String),
    /// Another network's front-end proved the port's secret but cannot be linked.
    #[error("cannot link to the network at {peer}: {why}")]
    RemoteRefused {
        /// Where it connected from, or to.
        peer: String,
        /// Why.
        why: String,
    },
    /// A spawn cannot be placed as asked; nothing was started.
    #[error("cannot place the spawn: {0}")]
    Placement(String),
    /// The front-end could not do the spawn a back-end asked for.
    #[error("the front-end could not spawn for this back-end: {0}")]
    SpawnRefused(String),
    /// A collective operation among back-ends could not be done (misuse, members
    /// that disagree, values a filter refused, or a member that never entered).
    #[error("collective operation: {0}")]
    Collective(String),
    /// Processes of a spawn did not join; the others of that spawn were stopped.
    #[error("spawn of {n} back-ends failed, the others of it were stopped: {}", failures_text(.failures))]
    SpawnFailed {
        /// Processes asked for.
        n: u32,
        /// The ranks that did not join, grouped by why (each names its process).
        failures: Vec<(RankSet, String)>,
    },
}

/// `rank 5: why; ranks 6-7: why`.
fn failures_text(failures: &[(RankSet, String)]) -> String {
    let parts: Vec<String> = failures
        .iter()
        .map(|(ranks, why)| match ranks.len() {
            1 => format!("rank {ranks}: {why}"),
            _ => format!("ranks {ranks}: {why}"),
        })
        .collect();
    parts.join("; ")
}

impl fmt::Debug for ApiError {
    /// The message, then each cause its text does not already quote.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut text = self.to_string();
        let mut cause = std::error::Error::source(self);
        while let Some(c) = cause {
            let part = c.to_string();
            if !text.contains(&part) {
                text.push_str(": ");
                text.push_str(&part);
            }
            cause = c.source();
        }
        f.write_str(&text)
    }
}

impl ApiError {
    /// The error for a command the core refused on `stream`.
    pub(crate) fn from_command(stream: u32, e: treecast_proto::CommandError) -> ApiError {
        use treecast_proto::CommandError;
        match e {
            CommandError::Filter { source, node, .. } => ApiError::StreamFilter { stream, node, source },
            CommandError::UnknownStream(id) | CommandError::StreamExists(id) => ApiError::UnknownStream(id),
            CommandError::NotAMember { rank, .. } => {
                ApiError::NoSuchRanks { ranks: RankSet::single(rank), last: u32::MAX }
            }
            CommandError::ShutDown => ApiError::Closed(treecast_proto::EndReason::ShutDown),
            other => ApiError::Refused(Box::new(other)),
        }
    }
}

// File distribution (`treecast_files`) lives above this crate; its limits are here
// because [`SourceError`] names them and the largest frame must carry a chunk.
/// Default chunk size: 1 MiB.
pub const DEFAULT_CHUNK: usize = 1 << 20;
/// Largest chunk size accepted (frames carry at most 256 MiB).
pub const MAX_CHUNK: usize = 64 << 20;
/// Default of `FileOptions::timeout` (`treecast_files`).
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Longest `FileOptions::timeout` (`treecast_files`) accepted: one day. The limit is per step without
/// progress, so more is never needed, and deadlines computed from it cannot overflow.
pub const MAX_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Why a file cannot be sent: every cause is found on the front-end before anything
/// is sent for that file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The chunk size is 0 or over [`MAX_CHUNK`].
    #[error("chunk size {0} is not between 1 and {MAX_CHUNK} bytes: pick a size in that range (default {DEFAULT_CHUNK})")]
    ChunkSize(usize),
    /// A source is not what its `EntryKind` (`treecast_files`) says (a link that is not a link …).
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

/// Why an attach file could not be written by the front-end or used by a back-end
/// (see [`crate::AttachInfo`]).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AttachError {
    /// The front-end could not create, write or rename the attach file; the network
    /// is not started.
    #[error(
        "cannot write the attach file {path}: {source}; give a path in a directory only you can write \
         ($XDG_RUNTIME_DIR, or one made by `mktemp -d`)"
    )]
    Write {
        /// The attach file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The attach file could not be opened or read.
    #[error("cannot read the attach file {path}: {source}; give the path the front-end printed")]
    Read {
        /// The attach file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The path is not a regular file (a fifo, a directory …).
    #[error("attach file {path} is {kind}, not a regular file: give the file the front-end wrote")]
    NotAFile {
        /// The attach file.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// The file belongs to another user: whoever wrote it chose where this back-end
    /// connects and what it runs.
    #[error(
        "attach file {path} is owned by uid {owner}, not by this user (uid {uid}) or root: refusing it, \
         since whoever wrote it decides where this back-end connects and what it runs; use the file \
         your own front-end wrote, in a directory only you can write"
    )]
    NotOwned {
        /// The attach file.
        path: PathBuf,
        /// Its owner.
        owner: u32,
        /// This process's effective uid.
        uid: u32,
    },
    /// Group or others may read or write the file: they could read the session secret
    /// or redirect the back-ends.
    #[error(
        "attach file {path} has mode {mode:04o}: group or others can read or write it (the session \
         secret, where back-ends connect); refusing it: make it private (chmod 600) or start the front-end again"
    )]
    Exposed {
        /// The attach file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// A line does not parse.
    #[error("attach file {path} line {line}: {what}")]
    Line {
        /// The attach file.
        path: PathBuf,
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        what: String,
    },
    /// A line the file must have is missing.
    #[error("attach file {path} has no {what} line")]
    Missing {
        /// The attach file.
        path: PathBuf,
        /// The missing line's keyword.
        what: &'static str,
    },
    /// A back-end was given a network's port for other networks.
    #[error(
        "{path} is a network's port for other networks (Network::connect_network), not one for \
         back-ends: give the attach file or the port file Network::accept wrote"
    )]
    NetworkPort {
        /// The file.
        path: PathBuf,
    },
    /// A network was given a file that is not a network's port.
    #[error(
        "{path} is not a network's port for other networks: give the file \
         Network::open_network_port wrote in the other network"
    )]
    NotNetworkPort {
        /// The file.
        path: PathBuf,
    },
    /// The rank asked for has no place in the file.
    #[error("rank {rank} has no place in the attach file (size {size})")]
    NoPlace {
        /// The rank.
        rank: u32,
        /// The number of ranks in the file.
        size: u32,
    },
}

/// How an error names the kind of a file that is not what was expected: "a directory",
/// "a fifo", …
pub fn file_kind(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_file() {
        "a regular file"
    } else if t.is_fifo() {
        "a fifo"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}
