//! The transport layer of treecast: links between a parent and a child node.
//!
//! * [`Secret`]: the per-session key every process receives through the
//!   environment (`TREECAST_SECRET`), never on a command line.
//! * [`handshake`]: the HMAC challenge–response that starts every link; a peer
//!   that cannot prove it holds the secret is dropped before it can send a frame.
//! * [`spawn_link`]: runs a link as two tasks, a reader that decodes frames in
//!   batches and a writer that batches queued frames into few syscalls. Queues
//!   are bounded; a full queue makes the sender wait, it never drops a frame.
//! * [`SendCredits`]: a back-end's per-stream upward credits, granted by its
//!   parent's credit frames (which the link's reader applies at once).
//!
//! * [`Stream`] and [`Listener`]: the routes, TCP between hosts and Unix
//!   sockets within one; the link code is generic over the byte stream, so
//!   striped links can be added behind the same seam.

#![deny(unsafe_code)]

mod credit;
mod error;
pub mod handshake;
mod link;
mod route;
mod secret;
mod socket;

pub use credit::{Credit, SendCredits};
pub use error::TransportError;
pub use link::{
    spawn_link, spawn_socket_link, spawn_socket_link_with_credits, Inbound, LinkEvent, LinkSender,
    LEAVE_LIMIT, LINK_CHUNKS_IN_FLIGHT, LINK_QUEUE_BYTES, LINK_QUEUE_FRAMES,
};
pub use route::{Listener, ReadHalf, Stream, WriteHalf};
pub use secret::{Secret, SECRET_ENV};
pub use socket::Socket;

/// Sets the socket options every treecast TCP link uses (no Nagle delay).
///
/// # Errors
/// The OS refused the option.
pub fn tune_tcp(stream: &tokio::net::TcpStream) -> Result<(), TransportError> {
    stream.set_nodelay(true).map_err(|e| TransportError::Io { what: "setting TCP_NODELAY".into(), source: e })
}
