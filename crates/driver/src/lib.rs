//! The driver of treecast's nodes: the tokio task around a protocol core.
//!
//! * [`Driver`]: drives one [`treecast_proto::Node`]: its links (a
//!   [`treecast_transport::MonitoredRoute`], [`NodeRoute`] in every node), its timer,
//!   and the task that starts its
//!   children through a [`treecast_launch::Launcher`]. The front-end, the comm node
//!   and the back-end are the same core in three roles under this one driver.
//! * [`run_comm_node`] is `treecast node`: connect to the parent, then drive.
//! * [`mod@env`] names the environment variables: what a parent sets for its
//!   children (identity, parent address, session, secret; rank, size and group for
//!   back-ends), and the settings comm nodes and back-ends still read there (time
//!   limits, clock, route, log filter). A comm node's launch plan carries the rest.

#![forbid(unsafe_code)]

mod commnode;
mod driver;
pub mod env;
mod error;
mod join;

pub use commnode::{
    join_parent, read_secret, run_comm_node, run_comm_node_as, run_comm_node_with,
    run_comm_node_with_launchers, DEFAULT_MAX_FRAME,
};
pub use driver::node_route::{NodeRoute, Shared};
pub use driver::{
    drive, lock, Driver, Launching, NoTool, Tool, LAST_FLUSH, MAX_AWAITING_BYTES, SHUTDOWN_GRACE,
};
pub use error::NodeError;
pub use join::{child_parent_address, connect_to, parse_striped, striped_address, COMM_NODE_ARG};
