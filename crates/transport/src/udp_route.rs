//! The multicast route over UDP (docs/multicast.md), wrapped around the route that
//! carries the links: which children join this node's group, which frames go by
//! multicast, and, at a child, the parent's group joined and its frames put back
//! in the link's order.
//!
//! A node multicasts when its launch plan says so (`--route udp`). It opens one
//! group per interface its children are reached through: a child over TCP joins the
//! group of its link's interface when it shares that interface's subnet; a child on
//! this host (a Unix-socket link) joins a group on another interface if there is one
//! (multicast loops back to local members), else one on the loopback interface.
//! Other children get everything over their links. Any node joins the group its
//! parent offers, so every node runs this route, multicasting or not: with no group
//! open, a frame costs one test more than on the links alone.

use std::collections::BTreeMap;
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::task::Context;
use std::time::{Duration, Instant};

use treecast_wire::{Frame, FrameKind, LaunchPlan, McastOffer, RouteChoice, RouteMsg};

use crate::mcast::{route_frame, shares_subnet, GroupMember, GroupSender, McastConfig, McastKey};
use crate::recording::{LinkPlace, NodeClock, PeerClock};
use crate::route::{Close, LinkPeer, MonitoredRoute, Route, RouteEvent, StreamChoices};
use crate::{LinkId, Socket};

/// Where a link's ends are: `None` for a Unix socket (this host), else this end's
/// and the peer's IP addresses.
type LinkEnds = Option<(IpAddr, IpAddr)>;

/// The interface a link to a peer on this host uses.
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// A route that multicasts over UDP what pays to, wrapped around `R`, which carries
/// every link (and a placeholder for each frame multicast, so that it keeps its
/// place among the link's frames).
pub struct UdpRoute<R> {
    links: R,
    groups: Groups,
    /// Streams that keep to part of the route: some never multicast ([`RouteChoice::multicasts`]).
    choices: StreamChoices,
}

/// The multicast state of one node: its groups, and its parent's.
struct Groups {
    key: McastKey,
    node_id: u32,
    /// Set from the launch plan: this node multicasts to its children.
    config: Option<McastConfig>,
    /// This node's groups, one per interface.
    down: Vec<GroupSender>,
    /// This node's children: node id and where their links are.
    children: BTreeMap<LinkId, (u32, LinkEnds)>,
    /// The link to the parent and its ends, and the parent's group once joined.
    parent: Option<(LinkId, LinkEnds)>,
    up: Option<GroupMember>,
    /// A parent link given up, closing: what it still brings is dropped, so that
    /// nothing overtakes the frames that were parked behind a placeholder.
    given_up: Option<LinkId>,
    /// Route frames to send (offers, answers to offers), found while the links
    /// were being read; sent once the read is over.
    outbox: Vec<(LinkId, Frame)>,
    /// Links to give up, with why.
    broken: Vec<(LinkId, String)>,
}

impl<R> std::fmt::Debug for UdpRoute<R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UdpRoute")
            .field("node_id", &self.groups.node_id)
            .field("groups", &self.groups.down.len())
            .field("joined_parent", &self.groups.up.is_some())
            .finish_non_exhaustive()
    }
}

impl<R: MonitoredRoute> UdpRoute<R> {
    /// Node `node_id`'s multicast route over `links`, its datagrams signed with `key`;
    /// it multicasts once a launch plan says so ([`Route::apply_plan`]).
    pub fn new(links: R, key: McastKey, node_id: u32) -> Self {
        let groups = Groups {
            key,
            node_id,
            config: None,
            down: Vec::new(),
            children: BTreeMap::new(),
            parent: None,
            up: None,
            given_up: None,
            outbox: Vec::new(),
            broken: Vec::new(),
        };
        UdpRoute { links, groups, choices: StreamChoices::default() }
    }

    /// The route that carries the links.
    pub fn links(&self) -> &R {
        &self.links
    }

    /// Sends the route frames found while the links were read; true when any.
    fn send_outbox(&mut self) -> bool {
        if self.groups.outbox.is_empty() {
            return false;
        }
        for (link, frame) in std::mem::take(&mut self.groups.outbox) {
            self.links.send(&[link], &frame);
        }
        true
    }

    /// Closes the links found broken and reports them to `sink`; true when any.
    fn close_broken(&mut self, sink: &mut dyn FnMut(LinkId, RouteEvent)) -> bool {
        if self.groups.broken.is_empty() {
            return false;
        }
        for (link, reason) in std::mem::take(&mut self.groups.broken) {
            tracing::warn!(node = self.groups.node_id, "giving up {link}: {reason}");
            self.links.close(link, Close::Now);
            self.groups.link_down(link, Instant::now());
            sink(link, RouteEvent::Closed(Some(reason)));
        }
        true
    }
}

impl Groups {
    /// The launch plan's UDP route settings (`None`: this node does not multicast).
    fn configure(&mut self, settings: Option<&[(String, String)]>) {
        let Some(settings) = settings else { return };
        let lookup = |name: &str| settings.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        match McastConfig::from_env(lookup) {
            Ok(config) => self.config = Some(config),
            // The front-end checked them; a node of another build may read them otherwise.
            Err(e) => tracing::warn!("UDP route off at node {}: {e}", self.node_id),
        }
    }

    /// A link came up: a child in reach is offered a place in the group.
    fn link_up(&mut self, link: LinkId, peer: LinkPeer, ends: LinkEnds) {
        match peer {
            LinkPeer::Parent => {
                self.parent = Some((link, ends));
                self.up = None;
            }
            LinkPeer::Child { node_id } => {
                self.children.insert(link, (node_id, ends));
                self.offer(link, node_id, ends);
            }
            // Only messages between back-ends cross to another network, never multicast.
            LinkPeer::Remote => {}
        }
    }

    fn offer(&mut self, link: LinkId, node_id: u32, ends: LinkEnds) {
        let Some(config) = self.config else { return };
        let at = match ends {
            // On this host: any group's datagrams loop back to it; the loopback
            // interface's only when there is no other.
            None => match self.down.iter().position(|g| !g.interface().is_loopback()) {
                Some(i) => i,
                None => match self.group_on(LOOPBACK, config) {
                    Some(i) => i,
                    None => return,
                },
            },
            Some((local, peer)) if shares_subnet(local, peer) => match self.group_on(local, config) {
                Some(i) => i,
                None => return,
            },
            Some((local, peer)) => {
                tracing::debug!(
                    "child {node_id} at {peer} is not on the subnet of {local}: its link carries everything"
                );
                return;
            }
        };
        let offer = self.down[at].offer(node_id, link);
        self.outbox.push((link, route_frame(&offer)));
    }

    /// The index of this node's group on `interface`, opened if need be; `None` when
    /// it cannot be opened (logged: those children get everything over their links).
    fn group_on(&mut self, interface: IpAddr, config: McastConfig) -> Option<usize> {
        if let Some(i) = self.down.iter().position(|g| g.interface() == interface) {
            return Some(i);
        }
        match GroupSender::bind(interface, self.node_id, self.key.clone(), config) {
            Ok(g) => {
                self.down.push(g);
                Some(self.down.len() - 1)
            }
            Err(e) => {
                tracing::warn!(
                    "node {}: no multicast group on {interface} ({e}); links carry everything",
                    self.node_id
                );
                None
            }
        }
    }

    /// A link is gone.
    fn link_down(&mut self, link: LinkId, now: Instant) {
        if self.children.remove(&link).is_some() {
            for g in &mut self.down {
                g.leave(link, now);
            }
        }
        if self.parent.is_some_and(|(l, _)| l == link) {
            self.parent = None;
            self.up = None;
        }
        if self.given_up == Some(link) {
            self.given_up = None;
        }
    }

    /// A frame arrived on `link` (`at`: a timed frame's read, see
    /// [`RouteEvent::Timed`]): route frames are handled here; the others go to `sink`
    /// in the link's order (behind a placeholder whose message is not in).
    #[inline]
    fn on_frame(
        &mut self,
        link: LinkId,
        frame: Frame,
        at: Option<Instant>,
        sink: &mut dyn FnMut(LinkId, RouteEvent),
    ) {
        if self.given_up == Some(link) {
            return;
        }
        // Frames parked behind a placeholder may come out with it: only a timed one
        // is reported as such.
        let event = |f: Frame| match at {
            Some(at) if f.header.is_timed() => RouteEvent::Timed(f, at),
            _ => RouteEvent::Frame(f),
        };
        let from_parent = self.parent.is_some_and(|(l, _)| l == link);
        if from_parent {
            if let Some(up) = self.up.as_mut() {
                if let Err(reason) = up.arrived(frame, &mut |f| sink(link, event(f))) {
                    self.give_up_parent(reason);
                }
                return;
            }
        }
        if frame.header.kind != FrameKind::Route {
            return sink(link, event(frame));
        }
        self.on_route_frame(link, &frame, from_parent);
    }

    /// A route frame arrived on `link`.
    fn on_route_frame(&mut self, link: LinkId, frame: &Frame, from_parent: bool) {
        match RouteMsg::decode(&frame.payload) {
            Ok(RouteMsg::Offer(offer)) if from_parent => self.join(link, &offer),
            Ok(RouteMsg::Joined { answers_from }) if self.children.contains_key(&link) => {
                let member = self.down.iter_mut().find_map(|g| g.joined(link, answers_from));
                if let Some(msg) = member {
                    // Sent before any placeholder for this link: the outbox goes out
                    // at the end of this read, before the node sends anything.
                    self.outbox.push((link, route_frame(&msg)));
                }
            }
            Ok(RouteMsg::Declined { reason }) if self.children.contains_key(&link) => {
                let child = self.children.get(&link).map_or(0, |c| c.0);
                tracing::info!("child {child} declined the multicast group: {reason}");
                for g in &mut self.down {
                    g.leave(link, Instant::now());
                }
            }
            Ok(other) => self.broken.push((link, format!("route message out of place: {other:?}"))),
            Err(e) => self.broken.push((link, format!("malformed route frame: {e}"))),
        }
    }

    fn join(&mut self, link: LinkId, offer: &McastOffer) {
        let interface = match self.parent {
            Some((_, Some((local, _)))) => local,
            // On the parent's host: join on the interface the parent sends from.
            _ => offer.sender.ip(),
        };
        // Everything but the drop knob comes with the offer (the parent's settings,
        // from its plan); the knob is this process's own test hook.
        let local = match crate::testing::udp_drop() {
            Ok(drop) => {
                let (drop, drop_seed) = drop.unwrap_or((0.0, 0));
                McastConfig { drop, drop_seed, ..McastConfig::default() }
            }
            Err(e) => return self.give_up_parent(format!("node {}: {e}", self.node_id)),
        };
        let answer = match GroupMember::join(offer, interface, self.node_id, self.key.clone(), &local) {
            Ok((member, answers_from)) => {
                self.up = Some(member);
                RouteMsg::Joined { answers_from }
            }
            Err(e) => {
                tracing::info!(
                    "node {}: not joining the parent's multicast group {}: {e}",
                    self.node_id,
                    offer.group
                );
                RouteMsg::Declined { reason: e.to_string() }
            }
        };
        self.outbox.push((link, route_frame(&answer)));
    }

    fn give_up_parent(&mut self, reason: String) {
        if let Some((link, _)) = self.parent {
            self.broken.push((link, reason));
            self.given_up = Some(link);
        }
        self.up = None;
    }

    /// Reads the groups' sockets and runs their timers; frames from the parent that
    /// can go on now go to `sink`. True when anything happened.
    fn poll(&mut self, cx: &mut Context<'_>, sink: &mut dyn FnMut(LinkId, RouteEvent)) -> bool {
        let mut any = false;
        let broken = &mut self.broken;
        for g in &mut self.down {
            any |= g.poll(cx, &mut |link, reason| broken.push((link, reason)));
        }
        if let (Some(up), Some((link, _))) = (self.up.as_mut(), self.parent) {
            match up.poll(cx, &mut |f| sink(link, RouteEvent::Frame(f))) {
                Ok(progressed) => any |= progressed,
                Err(reason) => {
                    self.give_up_parent(reason);
                    any = true;
                }
            }
        }
        any
    }

    /// What each of this node's groups did, each with the children no group reaches.
    fn report(&self) -> Vec<treecast_monitor::RouteReport> {
        let mut reports: Vec<_> = self.down.iter().map(GroupSender::report).collect();
        let mut outside: Vec<u32> = self
            .children
            .values()
            .map(|c| c.0)
            .filter(|n| !reports.iter().any(|r| r.udp_children.contains(n)))
            .collect();
        outside.sort_unstable();
        for r in &mut reports {
            r.tcp_children.clone_from(&outside);
        }
        reports
    }
}

impl<R: MonitoredRoute> Route for UdpRoute<R> {
    fn add_link(&mut self, link: LinkId, socket: Socket, peer: LinkPeer, name: String) -> io::Result<()> {
        // A TCP link whose ends cannot be read reaches no group.
        let nowhere = IpAddr::from([0, 0, 0, 0]);
        let ends = socket.ip_ends().unwrap_or(Some((nowhere, nowhere)));
        self.links.add_link(link, socket, peer, name)?;
        // Before the node's first frames, so that an offer is the link's first frame.
        self.groups.link_up(link, peer, ends);
        self.send_outbox();
        Ok(())
    }

    /// Sends `frame` to `links`: by multicast with a placeholder on each member's
    /// link when that pays, else over every link.
    fn send(&mut self, links: &[LinkId], frame: &Frame) {
        // Most trees multicast nothing: no clock read and no allocation per frame then.
        if self.groups.down.is_empty() || !self.choices.of(frame.header.stream).multicasts() {
            return self.links.send(links, frame);
        }
        let mut carried_to: Vec<LinkId> = Vec::new();
        let now = Instant::now();
        for g in &mut self.groups.down {
            // Groups have disjoint members: each takes its own among `links`.
            if let Some((members, placeholder)) = g.carry(frame, links, now) {
                self.links.send(&members, &placeholder);
                carried_to.extend(members);
            }
        }
        if carried_to.is_empty() {
            return self.links.send(links, frame);
        }
        let rest: Vec<LinkId> = links.iter().copied().filter(|l| !carried_to.contains(l)).collect();
        if !rest.is_empty() {
            self.links.send(&rest, frame);
        }
    }

    fn flush(&mut self) {
        self.links.flush();
    }

    /// Reads the links, then the groups; sends the route frames that came of it and
    /// reports the links it gave up.
    fn poll_recv(&mut self, cx: &mut Context<'_>, sink: &mut dyn FnMut(LinkId, RouteEvent)) -> bool {
        let groups = &mut self.groups;
        let mut any = self.links.poll_recv(cx, &mut |link, event| match event {
            RouteEvent::Frame(frame) => groups.on_frame(link, frame, None, sink),
            RouteEvent::Timed(frame, at) => groups.on_frame(link, frame, Some(at), sink),
            RouteEvent::Closed(reason) => {
                groups.link_down(link, Instant::now());
                sink(link, RouteEvent::Closed(reason));
            }
        });
        any |= self.groups.poll(cx, sink);
        any |= self.send_outbox();
        any |= self.close_broken(sink);
        any
    }

    /// Closes `link`; it leaves this node's groups (or, to the parent, the parent's).
    fn close(&mut self, link: LinkId, how: Close) {
        self.links.close(link, how);
        self.groups.link_down(link, Instant::now());
    }

    fn is_flushed(&self) -> bool {
        self.links.is_flushed()
    }

    fn flush_blocking(&mut self, limit: Duration) {
        self.links.flush_blocking(limit);
    }

    fn set_reach(&mut self, link: LinkId, backends: u64) {
        self.links.set_reach(link, backends);
    }

    fn apply_plan(&mut self, plan: &LaunchPlan) {
        self.groups.configure(plan.udp.as_deref());
        self.links.apply_plan(plan);
    }

    fn set_zero_copy_min(&mut self, bytes: Option<usize>) {
        self.links.set_zero_copy_min(bytes);
    }

    fn unacknowledged(&self) -> usize {
        self.links.unacknowledged()
    }

    fn send_together(&self) -> Option<usize> {
        self.groups.down.iter().filter_map(GroupSender::multicasts_from).min()
    }

    fn set_stream_route(&mut self, stream: u32, route: Option<RouteChoice>) {
        self.choices.set(stream, route);
        self.links.set_stream_route(stream, route);
    }

    fn is_settled(&self) -> bool {
        self.groups.down.iter().all(GroupSender::is_idle)
    }
}

impl<R: MonitoredRoute> MonitoredRoute for UdpRoute<R> {
    fn set_clock(&mut self, clock: NodeClock) {
        self.links.set_clock(clock);
    }

    fn place_link(&mut self, link: LinkId, place: LinkPlace) {
        self.links.place_link(link, place);
    }

    fn set_peer_clock(&mut self, link: LinkId, clock: PeerClock) {
        self.links.set_peer_clock(link, clock);
    }

    fn monitor_start(&mut self, program: u32) {
        self.links.monitor_start(program);
    }

    fn monitor_stop(&mut self) {
        self.links.monitor_stop();
    }

    fn set_stream_program(&mut self, stream: u32, program: Option<u32>) {
        self.links.set_stream_program(stream, program);
    }

    /// What the links recorded, with what each of this node's groups did.
    fn monitor_report(&mut self) -> treecast_monitor::Report {
        let mut report = self.links.monitor_report();
        report.routes.extend(self.groups.report());
        report
    }

    fn monitor_clear(&mut self) {
        self.links.monitor_clear();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::task::Poll;

    use treecast_wire::{FrameHeader, MAX_PAYLOAD_LEN};

    use super::*;
    use crate::{LinkTable, Secret, StreamRoute};

    /// A parent's route and its child's over one Unix link, neither multicasting:
    /// (parent, its link, child, its link).
    fn linked() -> (UdpRoute<StreamRoute>, LinkId, UdpRoute<StreamRoute>, LinkId) {
        let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        b.set_nonblocking(true).unwrap();
        let mut ids = LinkTable::new();
        let (lp, lc) = (ids.insert(()), ids.insert(()));
        let key = McastKey::new(&Secret::generate());
        let route = |node_id| UdpRoute::new(StreamRoute::new(MAX_PAYLOAD_LEN), key.clone(), node_id);
        let (mut parent, mut child) = (route(0), route(4));
        parent.add_link(lp, Socket::Unix(a), LinkPeer::Child { node_id: 4 }, "child 4".into()).unwrap();
        child.add_link(lc, Socket::Unix(b), LinkPeer::Parent, "parent".into()).unwrap();
        (parent, lp, child, lc)
    }

    /// Runs `poll_recv` until `n` events came.
    async fn recv(route: &mut UdpRoute<StreamRoute>, n: usize) -> Vec<(LinkId, RouteEvent)> {
        let mut got = Vec::new();
        let wait = std::future::poll_fn(|cx| {
            route.poll_recv(cx, &mut |l, e| got.push((l, e)));
            if got.len() >= n {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        });
        tokio::time::timeout(Duration::from_secs(10), wait).await.unwrap();
        got
    }

    /// With no group open, frames pass through to the links unchanged; a route frame
    /// that does not decode closes its link with the reason, reported like any
    /// other closed link.
    #[tokio::test]
    async fn without_a_group_frames_pass_through_and_a_malformed_route_frame_closes_the_link() {
        let (mut parent, lp, mut child, lc) = linked();
        assert_eq!(parent.send_together(), None);
        assert!(parent.is_settled());
        let data = Frame::new(FrameHeader::data(1, 7, 0), vec![1; 10]);
        let route =
            FrameHeader { kind: FrameKind::Route, flags: 0, stream: 0, tag: 0, rank: 0, timestamp_ns: 0 };
        let bad = Frame::new(route, vec![0xEE; 3]);
        child.send(&[lc], &data);
        child.send(&[lc], &bad);
        child.flush();
        let got = recv(&mut parent, 2).await;
        assert!(matches!(&got[0], (l, RouteEvent::Frame(f)) if *l == lp && *f == data), "{got:?}");
        match &got[1] {
            (l, RouteEvent::Closed(Some(reason))) if *l == lp => {
                assert!(reason.contains("malformed route frame"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}
