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
//! * [`Stream::recv_matching`] takes only packets of a tag or source rank
//!   ([`Match`]) and keeps what it skips for later receives; [`Stream::isend`] and
//!   [`Stream::irecv`] start a send or a receive as a [`Request`] (test, wait,
//!   `wait_any`, `wait_all`, cancel; a future too), as MPI's requests are.
//!
//! Back-end side: [`BackEnd::connect`] joins the tree using the environment the
//! launcher set; [`BackEnd::recv`] returns packets of any stream
//! ([`BackEnd::recv_matching`]: of one stream, tag or source rank); [`BackEnd::send`]
//! sends up.
//!
//! Values: a format string such as `"%d %as"` names the types of a packet's values,
//! one [`Value`] variant per specifier (each variant's documentation names its own;
//! the wire layout is in `docs/wire-format.md`). Read them with [`Packet::unpack`],
//! then [`Value::as_i64`], [`Value::as_str`], [`Value::as_array`] and their kin.
//!
//! Comm nodes run the `treecast` binary (`treecast node`): the one
//! [`NetworkBuilder::treecast_path`] names, else one found beside this program or
//! on `PATH` (the library reads no `TREECAST_*` variable; the `treecast` command does). A tool can instead be its own comm node, and
//! ship one program. A whole tool, front-end, comm node and back-end in one program
//! (`examples/integer_addition.rs` is the same, with more comments):
//!
//! ```no_run
//! use std::time::Duration;
//! use treecast_api::{ApiError, BackEnd, NetworkBuilder, StreamOptions, Topology, TransformKind, Value};
//!
//! const TAG_ADD: i32 = 100; // a tool's own tag (treecast's are FIRST_RESERVED_TAG and up)
//!
//! #[tokio::main]
//! async fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     if treecast_api::started_as_comm_node() {
//!         // Started by a parent as `<this program> node`.
//!         return Ok(treecast_api::run_comm_node().await?);
//!     }
//!     if std::env::var("TREECAST_RANK").is_ok() {
//!         // Started as a back-end (the launcher sets the rank): answer until the end.
//!         let mut be = BackEnd::connect().await?;
//!         loop {
//!             let packet = match be.recv().await {
//!                 Ok(p) => p,
//!                 Err(ApiError::Closed(_)) => return Ok(()), // the front-end shut down
//!                 Err(e) => return Err(e.into()),
//!             };
//!             let x = packet.unpack("%d")?[0].as_i64().unwrap_or_default() as i32;
//!             be.send(packet.stream(), TAG_ADD, "%d", &[Value::Int(x + be.rank() as i32)]).await?;
//!         }
//!     }
//!     let me = std::env::current_exe()?;
//!     let net = NetworkBuilder::new(Topology::from_spec("kary:8", Some(64))?)
//!         .treecast_path(&me) // comm nodes run `<this program> node`
//!         .backend_command([me.to_string_lossy().into_owned()]) // back-ends run this program too
//!         .launch()
//!         .await?;
//!     let sum = net.new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum)).await?;
//!     sum.send(TAG_ADD, "%d", &[Value::Int(1)]).await?;
//!     // One packet per wave: the sum over every back-end, added up at the comm nodes.
//!     let total = sum.recv_timeout(Duration::from_secs(30)).await?.unpack("%d")?[0].as_i64();
//!     println!("{total:?}"); // Some(64 + (0 + 1 + ... + 63)) = Some(2080)
//!     while let Some(event) = net.try_event() {
//!         println!("{event}"); // lost ranks, filter errors: waves complete without them
//!     }
//!     net.shutdown().await;
//!     Ok(())
//! }
//! ```
//!
//! Every call that waits either has a `_timeout` variant or ends with an error
//! when the network goes away.
//!
//! Runtime: a network or back-end runs its I/O on a task of the tokio runtime it is
//! made on. On a current-thread runtime, run the tool's own loop as a task too
//! (`rt.block_on(async { tokio::spawn(tool()).await })`) rather than as `block_on`'s
//! future: tokio looks at the reactor once more (a zero-timeout `epoll_wait`) each
//! time a task wakes `block_on`'s own future, and a back-end is woken once per
//! packet (docs/benchmarks.md). The `treecast` binary does so; the examples keep the
//! plain `#[tokio::main]` for brevity, which works the same, a system call per packet
//! slower.

#![forbid(unsafe_code)]

mod attach;
mod backend;
mod betool;
mod builder;
mod clock;
mod collective;
mod collective_run;
mod commnode;
mod communicator;
pub mod encoding;
mod error;
mod event;
mod frontend;
mod monitor;
mod network;
mod network_spawn;
mod packet;
mod remote;
mod remote_numbers;
mod request;
mod spawn;
mod stream;

pub use attach::{rank_from_env, AttachInfo, RANK_VARS};
pub use backend::{BackEnd, BackEndEvent, BackEndSender, JoinOptions, Unsent};
pub use builder::{NetworkBuilder, DEFAULT_RECEIVE_WINDOW};
pub use clock::{compose as compose_clock, NodeClock};
pub use collective::{Collected, ReduceOp, DEFAULT_COLLECTIVE_LIMIT};
pub use commnode::{
    run_comm_node, run_comm_node_with, run_comm_node_with_launchers, started_as_comm_node, NodeError,
    COMM_NODE_ARG,
};
pub use communicator::{Communicator, FRONT_END_RANK};
pub use error::{
    file_kind, ApiError, AttachError, SourceError, DEFAULT_CHUNK, DEFAULT_TIMEOUT, MAX_CHUNK, MAX_TIMEOUT,
};
pub use event::Event;
pub use network::{Network, MONITOR_ORDER_LIMIT};
pub use packet::{EqClass, Packet};
pub use remote::{NetworkPort, RemoteNetwork, DEFAULT_NETWORK_LIMIT};
pub use request::{Match, Request, HELD_LIMIT};
pub use spawn::{Group, JoinMode, Placement, SpawnOptions, DEFAULT_SPAWN_LIMIT, LIGHT_JOIN_UP_TO};
pub use stream::{Stream, StreamOptions, StreamSender};
pub use treecast_filters::{
    FilterContext, FilterError, FilterPlace, FilterRegistry, PlaceRole, RegistryError, Transform,
    TransformKind,
};
pub use treecast_launch::{
    AddressLookup, LaunchError, Launched, Launcher, LauncherRegistry, LocalLauncher, MakeLauncher,
    ProcessSpec, RouteError, SrunOptions, SshOptions,
};
pub use treecast_monitor::{
    Collection, Component as LatencyComponent, Key as MonitorKey, Report as MonitorReport,
};
pub use treecast_plugin::{Plugin, PluginError};
pub use treecast_proto::{CommandError, EndReason, LostRanks};
pub use treecast_topology::{Topology, TopologyError};
pub use treecast_transport::striped::rails::{check_rails, Rail};
pub use treecast_wire::requests::FIRST_RESERVED_TAG;
pub use treecast_wire::LauncherSpec;
pub use treecast_wire::{
    encode_values, ArrayElement, ClockPlan, DecodeError, FilterSpec, Format, FormatError, Frame, FrameHeader,
    GroupPlace, RankSet, RouteChoice, ScalarType, SyncMode, Value, ValueType, Window, DEFAULT_DOWN_WINDOW,
    DEFAULT_UP_WINDOW, MAX_RAILS, MAX_STRIPES,
};
