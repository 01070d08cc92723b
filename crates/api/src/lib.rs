//! The treecast API: what a tool links against.
//!
//! Front-end side:
//! * [`NetworkBuilder`] launches a tree from a [`treecast_topology::Topology`]
//!   and a back-end command, and returns a [`Network`].
//! * [`Network::broadcast_communicator`] and [`Network::communicator`] give
//!   [`Communicator`]s (sets of back-end ranks); [`Network::new_stream`] binds
//!   one to filters ([`StreamOptions`]) and returns a [`Stream`].
//! * [`Stream::send`] multicasts typed values (`"%d %s"`) down;
//!   [`Stream::recv`] returns reductions ([`Packet`]) coming up.
//! * [`Network::next_event`] reports lost ranks and filter errors ([`Event`]).
//!
//! Back-end side: [`BackEnd::connect`] joins the tree using the environment the
//! launcher set; [`BackEnd::recv`] returns packets of any stream; [`BackEnd::send`]
//! sends up.
//!
//! Every call that waits either has a `_timeout` variant or ends with an error
//! when the network goes away.

#![forbid(unsafe_code)]

mod attach;
mod backend;
mod builder;
mod error;
mod files;
mod frontend;
mod network;
mod packet;
mod stream;

pub use attach::{rank_from_env, AttachInfo, RANK_VARS};
pub use backend::{BackEnd, BackEndEvent, BackEndSender};
pub use builder::{NetworkBuilder, DEFAULT_RECEIVE_WINDOW};
pub use error::{ApiError, AttachError, SourceError};
pub use files::{
    bcast_file, bcast_files, Decision, EntryKind, FileAnswer, FileEntry, FileMessage, FileMessageError,
    FileOptions, FileReceiver, FileReceivers, FileReport, FileStatus, FileWorker, Outcome, Progress,
    RankOutcome, WriteMode, DEFAULT_CHUNK, DEFAULT_TIMEOUT, FILE_CHUNK, FILE_END, FILE_OPEN, FILE_STATUS,
    MAX_CHUNK, MAX_TIMEOUT,
};
pub use network::{Communicator, Event, Network, FRONT_END_RANK};
pub use packet::{EqClass, Packet};
pub use stream::{Stream, StreamOptions};
pub use treecast_filters::{
    FilterContext, FilterError, FilterRegistry, RegistryError, Transform, TransformKind,
};
pub use treecast_launch::{SrunOptions, SshOptions};
pub use treecast_node::core::LostRanks;
pub use treecast_topology::Topology;
pub use treecast_wire::{
    FilterSpec, RankSet, SyncMode, Value, Window, DEFAULT_DOWN_WINDOW, DEFAULT_UP_WINDOW,
};
