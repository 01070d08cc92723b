//! The node layer of treecast: what every process of the tree does.
//!
//! * [`start_children`] launches the children of a node from its sub-tree,
//!   authenticates their links, hands each comm node its own sub-tree and
//!   waits until every child reports ready (recursive parallel instantiation).
//!   The front-end and the comm nodes both use it.
//! * [`Downstream`] decides which children a downward frame goes to.
//! * [`Upstream`] groups upward frames into waves per stream
//!   ([`treecast_filters::Synchronizer`]), reduces them with the stream's
//!   transformation, and turns lost children into `RanksLost` reports. It is
//!   also where upward flow control lives: a child may have at most
//!   [`treecast_wire::UP_WINDOW`] packets per stream that its parent has not yet
//!   reduced and passed on, so a node holds a bounded number of packets per
//!   child and stream however far one child runs ahead, and a stream that is
//!   held up (a slow member, a tool that does not read) holds up no other.
//!   Both are plain state machines without I/O.
//! * [`run_comm_node`] is `treecast node`: connect to the parent, start the
//!   sub-tree, then route in both directions until the parent goes away.
//! * [`env`] names the environment variables a parent sets for its children.

#![forbid(unsafe_code)]

mod children;
mod commnode;
mod downstream;
pub mod env;
mod error;
mod upstream;

pub use children::{start_children, AttachSink, ChildLink, ChildSet, LaunchPlan};
pub use commnode::{
    connect_parent, connect_to, remote_from_env, run_comm_node, send_credit, sleep_until_opt,
    unix_links_from_env,
};
pub use downstream::Downstream;
pub use error::NodeError;
pub use upstream::{StreamSpec, UpOutput, Upstream, ROOT_WINDOW};

/// Encodes a control message as a frame.
pub fn control_frame(msg: &treecast_wire::ControlMsg) -> treecast_wire::Frame {
    treecast_wire::Frame::new(treecast_wire::FrameHeader::control(), msg.encode())
}
