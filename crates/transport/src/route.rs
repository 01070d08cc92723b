//! The frame-level seam between a node and its peers: a [`Route`] carries frames to
//! one link or to a set of links at once, brings frames in, and closes links.
//!
//! [`crate::StreamRoute`] is the one for TCP and Unix-socket links (one connection per
//! link); a multicast route reaching a set of children with one datagram plugs in
//! behind the same trait.

use std::task::Context;
use std::time::Instant;

use treecast_wire::Frame;

use crate::LinkId;

/// What a route reports about a link.
#[derive(Debug)]
pub enum RouteEvent {
    /// A frame arrived, in order.
    Frame(Frame),
    /// A frame marked [`treecast_wire::FLAG_TIMED`] arrived, in order, with the
    /// instant the read that completed it ended.
    Timed(Frame, Instant),
    /// The link is gone: `None` for an orderly close, else the reason (I/O error,
    /// malformed or oversized frame).
    Closed(Option<String>),
}

/// How to close a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Close {
    /// Deliver what is queued first, then close (an orderly end).
    Flush,
    /// Close at once, dropping what is queued (a peer that broke the protocol).
    Now,
}

/// Carries frames between this node and its peers.
///
/// Nothing here blocks or waits: sends are queued and written as far as the kernel
/// takes them; what a peer may have queued is bounded by the flow-control windows
/// of the protocol core, not by the route.
pub trait Route: Send {
    /// Queues `frame` for each of `links` (links this route does not carry are skipped).
    fn send(&mut self, links: &[LinkId], frame: &Frame);

    /// Writes what is queued, as far as the kernel takes it now; links that would
    /// block are watched and show up as ready when they can take more.
    fn flush(&mut self);

    /// Reads what arrived on links that are ready, handing each frame and each closed
    /// link to `sink`; returns true when anything was handed over. Registers `cx`'s
    /// waker to be woken when a link is ready again.
    fn poll_recv(&mut self, cx: &mut Context<'_>, sink: &mut dyn FnMut(LinkId, RouteEvent)) -> bool;

    /// Closes a link; no event is reported for it afterwards.
    fn close(&mut self, link: LinkId, how: Close);

    /// True when nothing is queued for any link.
    fn is_flushed(&self) -> bool;

    /// Writes everything still queued, waiting up to `limit` per link (a last flush
    /// before the process exits, when no event loop will run again).
    fn flush_blocking(&mut self, limit: std::time::Duration);
}
