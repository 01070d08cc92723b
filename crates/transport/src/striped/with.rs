//! A node's route with striped links beside plain ones: links of one connection
//! go to the route it wraps (TCP, Unix, UDP multicast), links of several to a
//! [`StripedRoute`]. A call that names links goes to both; each skips the links it
//! does not carry.

use std::io;
use std::task::Context;
use std::time::Duration;

use treecast_wire::{Frame, LaunchPlan, RouteChoice};

use super::StripedRoute;
use crate::recording::{LinkPlace, NodeClock, PeerClock};
use crate::route::{Close, LinkPeer, MonitoredRoute, Route, RouteEvent};
use crate::{LinkId, Socket};

/// `R` for links of one connection, a [`StripedRoute`] for links of several.
#[derive(Debug)]
pub struct WithStriped<R> {
    plain: R,
    striped: StripedRoute,
}

impl<R: MonitoredRoute> WithStriped<R> {
    /// Wraps `plain`; striped links refuse frames over `max_frame` bytes until a plan says otherwise.
    pub fn new(plain: R, max_frame: usize) -> Self {
        WithStriped { plain, striped: StripedRoute::new(max_frame) }
    }

    /// The route of plain links.
    pub fn plain(&self) -> &R {
        &self.plain
    }

    /// The route of striped links.
    pub fn striped(&mut self) -> &mut StripedRoute {
        &mut self.striped
    }
}

impl<R: MonitoredRoute> Route for WithStriped<R> {
    fn add_link(&mut self, link: LinkId, socket: Socket, peer: LinkPeer, name: String) -> io::Result<()> {
        self.plain.add_link(link, socket, peer, name)
    }

    fn add_links(
        &mut self,
        link: LinkId,
        sockets: Vec<Socket>,
        peer: LinkPeer,
        name: String,
    ) -> io::Result<()> {
        match sockets.len() {
            1 => self.plain.add_links(link, sockets, peer, name),
            _ => self.striped.add_striped(link, sockets, name),
        }
    }

    fn send(&mut self, links: &[LinkId], frame: &Frame) {
        self.plain.send(links, frame);
        self.striped.send(links, frame);
    }

    fn flush(&mut self) {
        self.plain.flush();
    }

    fn poll_recv(&mut self, cx: &mut Context<'_>, sink: &mut dyn FnMut(LinkId, RouteEvent)) -> bool {
        let plain = self.plain.poll_recv(cx, sink);
        self.striped.poll_recv(cx, sink) || plain
    }

    fn close(&mut self, link: LinkId, how: Close) {
        self.plain.close(link, how);
        self.striped.close(link, how);
    }

    fn is_flushed(&self) -> bool {
        self.plain.is_flushed() && self.striped.is_flushed()
    }

    fn flush_blocking(&mut self, limit: Duration) {
        self.plain.flush_blocking(limit);
        self.striped.flush_blocking(limit);
    }

    fn set_reach(&mut self, link: LinkId, backends: u64) {
        self.plain.set_reach(link, backends);
    }

    fn set_stream_route(&mut self, stream: u32, route: Option<RouteChoice>) {
        self.plain.set_stream_route(stream, route);
        self.striped.set_stream_route(stream, route);
    }

    fn apply_plan(&mut self, plan: &LaunchPlan) {
        self.plain.apply_plan(plan);
        self.striped.apply_plan(plan);
    }

    fn set_zero_copy_min(&mut self, bytes: Option<usize>) {
        self.plain.set_zero_copy_min(bytes);
    }

    fn set_stripe_stall(&mut self, limit: std::time::Duration) {
        self.striped.set_stall_limit(limit);
    }

    fn unacknowledged(&self) -> usize {
        self.plain.unacknowledged() + self.striped.unacknowledged()
    }

    fn send_together(&self) -> Option<usize> {
        self.plain.send_together()
    }

    fn is_settled(&self) -> bool {
        self.plain.is_settled()
    }
}

impl<R: MonitoredRoute> MonitoredRoute for WithStriped<R> {
    fn set_clock(&mut self, clock: NodeClock) {
        self.plain.set_clock(clock);
        self.striped.set_clock(clock);
    }
    fn place_link(&mut self, link: LinkId, place: LinkPlace) {
        self.plain.place_link(link, place);
        self.striped.place_link(link, place);
    }
    fn set_peer_clock(&mut self, link: LinkId, clock: PeerClock) {
        self.plain.set_peer_clock(link, clock);
        self.striped.set_peer_clock(link, clock);
    }
    fn monitor_start(&mut self, program: u32) {
        self.plain.monitor_start(program);
        self.striped.monitor_start(program);
    }
    fn monitor_stop(&mut self) {
        self.plain.monitor_stop();
        self.striped.monitor_stop();
    }
    fn set_stream_program(&mut self, stream: u32, program: Option<u32>) {
        self.plain.set_stream_program(stream, program);
        self.striped.set_stream_program(stream, program);
    }
    fn monitor_report(&mut self) -> treecast_monitor::Report {
        let plain = self.plain.monitor_report();
        let striped = self.striped.monitor_report();
        if striped.cells.is_empty() {
            return plain;
        }
        // Both count under the same keys and size classes, so they merge as a comm
        // node merges its children's reports.
        treecast_monitor::Report::merged([&plain, &striped]).unwrap_or_else(|e| {
            tracing::warn!("the striped links' samples were left out of the report: {e}");
            plain
        })
    }
    fn monitor_clear(&mut self) {
        self.plain.monitor_clear();
        self.striped.monitor_clear();
    }
}
