//! A tool as its own comm node: started as `<program> node`, it runs
//! [`run_comm_node`] instead of its own code, so that a tool ships one program and
//! needs no `treecast` binary beside it.

pub use treecast_driver::{
    run_comm_node, run_comm_node_with, run_comm_node_with_launchers, NodeError, COMM_NODE_ARG,
};

/// True when this process was started as a comm node: its first argument is
/// [`COMM_NODE_ARG`] (`<program> node`). It should then call [`run_comm_node`] and
/// exit, doing nothing of its own.
pub fn started_as_comm_node() -> bool {
    std::env::args_os().nth(1).is_some_and(|a| a == COMM_NODE_ARG)
}
