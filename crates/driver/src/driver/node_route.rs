//! The route every node runs, chosen once at start-up: TCP and Unix-socket links
//! ([`StreamRoute`]) inside the UDP multicast route ([`UdpRoute`]), which multicasts
//! only when the launch plan says so but joins any group its parent offers.
//! Striped links (several connections each) go beside them ([`WithStriped`]).

use std::sync::{Arc, Mutex};

use treecast_proto::Node;
use treecast_transport::mcast::McastKey;
use treecast_transport::striped::WithStriped;
use treecast_transport::{StreamRoute, UdpRoute};

use super::launching::Launching;
use super::{Driver, Tool};

/// The route of every node: striped links (the plan's `stripes`) beside the others.
pub type NodeRoute = WithStriped<UdpRoute<StreamRoute>>;

/// A driver shared with the tool (front-end, back-end).
pub type Shared<T> = Arc<Mutex<Driver<T, NodeRoute>>>;

impl<T: Tool> Driver<T, NodeRoute> {
    /// A driver for `core` over a [`NodeRoute`]; frames over `max_frame` bytes close
    /// their link.
    pub fn new(core: Node, tool: T, launching: Launching, max_frame: usize) -> Self {
        let links = StreamRoute::new(max_frame);
        let route = UdpRoute::new(links, McastKey::new(&launching.secret), core.node_id());
        Driver::with_route(core, tool, launching, WithStriped::new(route, max_frame))
    }
}
