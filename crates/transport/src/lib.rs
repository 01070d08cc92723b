//! The transport layer of treecast: links between a parent and a child node.
//!
//! * [`Secret`]: the per-session key every process receives through the
//!   environment (`TREECAST_SECRET`), never on a command line.
//! * [`handshake`]: the HMAC challenge–response that starts every link; a peer
//!   that cannot prove it holds the secret is dropped before it can send a frame.
//! * [`Stream`] and [`Listener`]: how connections are made, TCP between hosts and
//!   abstract Unix sockets within one.
//! * [`Route`]: the frame-level seam a node's driver talks to: send a frame to one
//!   link or a set of links, receive frames and closures, close links; and
//!   [`MonitoredRoute`], the monitoring calls on it (clocks, places, recording).
//!   [`StreamRoute`] carries TCP and Unix-socket links behind it, all driven from
//!   one task (per-link wakers, no reader or writer tasks, batched writes);
//!   [`UdpRoute`] wraps it and multicasts to children what pays to.
//! * [`striped`]: one link over several connections to the same peer (rails),
//!   [`StripedRoute`], with pieces numbered, acknowledged and sent again on the
//!   others when a connection fails.
//! * [`mcast`]: the reliable UDP multicast protocol (sender and receiver state
//!   machines with no I/O, datagram authentication).
//! * [`announce`]: the one authenticated datagram a spawned process may announce
//!   itself with before its link connects (light joins).
//! * [`LinkId`]: how a node names its links (from `treecast_wire`; a generational slab, [`LinkTable`]).

#![deny(unsafe_code)]

mod alloc;
pub mod announce;
mod error;
pub mod handshake;
pub mod mcast;
mod net;
pub mod recording;
mod route;
mod secret;
mod shared_payload;
mod socket;
mod stream_route;
pub mod striped;
pub mod testing;
mod udp_route;

pub use alloc::keep_large_buffers;

pub use error::TransportError;
pub use net::{is_mptcp, Listener, Stream, MPTCP_PREFIX};
pub use route::{Close, LinkPeer, MonitoredRoute, Route, RouteEvent};
pub use secret::{Secret, SECRET_ENV};
pub use socket::Socket;
pub use stream_route::StreamRoute;
pub use striped::StripedRoute;
pub use treecast_wire::{LinkId, LinkMap, LinkTable};
pub use udp_route::UdpRoute;

/// Sets the socket options every treecast TCP link uses (no Nagle delay).
///
/// # Errors
/// The OS refused the option.
pub fn tune_tcp(stream: &tokio::net::TcpStream) -> Result<(), TransportError> {
    stream.set_nodelay(true).map_err(|e| TransportError::Io { what: "setting TCP_NODELAY".into(), source: e })
}
