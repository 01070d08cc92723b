//! The frame-level seam between a node and its peers: a [`Route`] carries frames to
//! one link or to a set of links at once, brings frames in, and closes links; a
//! [`MonitoredRoute`] also stamps and records them for the node's monitoring.
//!
//! [`crate::StreamRoute`] is the one for TCP and Unix-socket links (one connection per
//! link); [`crate::UdpRoute`] wraps another route and reaches a set of children with
//! one multicast datagram. A new route (striped links) is one more type behind the
//! same traits: [`crate::striped::WithStriped`] carries striped links beside another route's.

use std::io;
use std::task::Context;
use std::time::Instant;

use treecast_wire::{Frame, LaunchPlan, RouteChoice};

use crate::recording::{LinkPlace, NodeClock, PeerClock};
use crate::{LinkId, Socket};

/// Who is at the other end of a link, as far as a route cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LinkPeer {
    /// This node's parent.
    Parent,
    /// A child of this node.
    Child {
        /// The child's node id.
        node_id: u32,
    },
    /// Another network's front-end: only messages between back-ends cross it.
    Remote,
}

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
pub trait Route: Send + std::fmt::Debug {
    /// Carries `link` over `socket` (authenticated already) to `peer`; `name` is the
    /// peer, for logs.
    ///
    /// # Errors
    /// The socket could not be registered with the reactor (call inside a tokio runtime).
    fn add_link(&mut self, link: LinkId, socket: Socket, peer: LinkPeer, name: String) -> io::Result<()>;

    /// Carries `link` over several connections to the same peer (a striped link,
    /// see `crate::striped`); one socket is [`Route::add_link`].
    ///
    /// # Errors
    /// As [`Route::add_link`]; a route that carries one connection per link refuses
    /// more ([`io::ErrorKind::Unsupported`]).
    fn add_links(
        &mut self,
        link: LinkId,
        mut sockets: Vec<Socket>,
        peer: LinkPeer,
        name: String,
    ) -> io::Result<()> {
        match (sockets.pop(), sockets.is_empty()) {
            (Some(socket), true) => self.add_link(link, socket, peer, name),
            _ => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "this route carries one connection per link; a striped link needs the striped route",
            )),
        }
    }

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

    /// Says how many back-ends the child on `link` reaches, which sizes the control
    /// frames it may send (a parent buffers no more for it; see docs/security.md).
    /// Links to other peers, and routes that cut no frames, ignore it.
    fn set_reach(&mut self, _link: LinkId, _backends: u64) {}

    /// Takes the route settings of the node's launch plan (its frame limit; the UDP
    /// route's settings, when it multicasts).
    fn apply_plan(&mut self, plan: &LaunchPlan);

    /// Sends payloads of at least `bytes` bytes to peers on this host as memory files
    /// (a back-end's member plan says so; a comm node's launch plan does it through
    /// [`Route::apply_plan`]). Routes with no such path ignore it.
    fn set_zero_copy_min(&mut self, _bytes: Option<usize>) {}

    /// Gives up a connection of a striped link that held bytes this long without
    /// delivering any while another one moved (a back-end's member plan says so; a
    /// comm node's launch plan does it through [`Route::apply_plan`]). Routes with no
    /// striped links ignore it.
    fn set_stripe_stall(&mut self, _limit: std::time::Duration) {}

    /// Bytes written that the peers have not acknowledged yet: a process must not
    /// exit before this is 0, or the kernel's reset may throw those bytes away.
    fn unacknowledged(&self) -> usize;

    /// From which payload size the core should hold a stream's frames until every
    /// child can take them, so that they go once to all (see
    /// `Node::send_together`); `None`: never.
    fn send_together(&self) -> Option<usize> {
        None
    }

    /// Keeps the frames of `stream` to part of the route (`None`: the stream is
    /// gone, its choice no longer applies): a route that multicasts sends a
    /// [`RouteChoice::Tcp`] or [`RouteChoice::Striped`] stream's frames over the links,
    /// one that stripes sends a [`RouteChoice::Tcp`] or [`RouteChoice::Udp`] stream's
    /// frames whole on one connection. Routes with neither ignore it.
    fn set_stream_route(&mut self, _stream: u32, _route: Option<RouteChoice>) {}

    /// True when what the route carries beside the links (multicast) is held by
    /// every member: closing a link then overtakes nothing sent before it.
    fn is_settled(&self) -> bool {
        true
    }
}

/// The streams that keep to part of a route ([`Route::set_stream_route`]), kept by
/// the routes that act on the choice.
#[derive(Debug, Default)]
pub(crate) struct StreamChoices(std::collections::BTreeMap<u32, RouteChoice>);

impl StreamChoices {
    /// Takes a stream's choice (`None`: the stream is gone).
    pub(crate) fn set(&mut self, stream: u32, route: Option<RouteChoice>) {
        match route {
            Some(r) => self.0.insert(stream, r),
            None => self.0.remove(&stream),
        };
    }

    /// What `stream`'s frames may take: the network's route unless it chose.
    pub(crate) fn of(&self, stream: u32) -> RouteChoice {
        self.0.get(&stream).copied().unwrap_or_default()
    }
}

/// A route that stamps the frames it carries and records their latency components
/// (`crate::recording`): the monitoring calls a node's driver makes on its route.
pub trait MonitoredRoute: Route {
    /// Sets the clock that stamps frames while monitoring (the node's global-clock
    /// time base); the wall clock as read when the route was made until then.
    fn set_clock(&mut self, clock: NodeClock);

    /// Says where `link` sits in the tree, which names its samples.
    fn place_link(&mut self, link: LinkId, place: LinkPlace);

    /// Sets the peer's clock against this node's, to correct the net component.
    fn set_peer_clock(&mut self, link: LinkId, clock: PeerClock);

    /// Starts recording every frame's latency components under program tag
    /// `program`; what was recorded before is kept.
    fn monitor_start(&mut self, program: u32);

    /// Stops recording; frames already queued are still stamped and recorded.
    fn monitor_stop(&mut self);

    /// Keeps the frames of `stream` under their own program tag (`None`: the stream
    /// is gone), so that workloads sharing the tree are told apart.
    fn set_stream_program(&mut self, stream: u32, program: Option<u32>);

    /// What was recorded so far.
    fn monitor_report(&mut self) -> treecast_monitor::Report;

    /// Forgets what was recorded.
    fn monitor_clear(&mut self);
}
