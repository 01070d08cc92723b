//! The node layer of treecast: what every process of the tree does.
//!
//! * [`core::Node`]: the protocol core, one state machine without I/O for every
//!   role (front-end, comm node, back-end): membership and start-up, streams,
//!   waves and filters, flow control in both directions, failure reports and
//!   shutdown. Inputs go in through `handle_*`, outputs come out through `poll_*`.
//! * [`driver::Driver`]: the tokio driver around a core: its links (a
//!   [`treecast_transport::StreamRoute`]), its timer, and the task that starts its
//!   children through a [`treecast_launch::Launcher`].
//! * [`run_comm_node`] is `treecast node`: connect to the parent, then drive.
//! * [`mod@env`] names the few environment variables a parent sets for its children
//!   (identity, parent address, secret); everything else travels in the launch plan.

#![forbid(unsafe_code)]

mod commnode;
pub mod core;
pub mod driver;
pub mod env;
mod error;

pub use commnode::{
    connect_to, launcher_of, read_secret, run_comm_node, treecast_exe, COMM_NODE_ARG, DEFAULT_MAX_FRAME,
};
pub use error::NodeError;
