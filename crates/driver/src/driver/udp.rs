//! The driver's side of the multicast route over UDP (docs/multicast.md): which
//! children join this node's group, which frames go by multicast, and, at a child,
//! the parent's group joined and its frames put back in the link's order.
//!
//! A node multicasts when its launch plan says so (`--route udp`). It opens one
//! group per interface its children are reached through: a child over TCP joins the
//! group of its link's interface when it shares that interface's subnet; a child on
//! this host (a Unix-socket link) joins a group on another interface if there is one
//! (multicast loops back to local members), else one on the loopback interface.
//! Other children get everything over their links. Any node joins the group its
//! parent offers.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::task::Context;
use std::time::Instant;

use treecast_transport::mcast::{
    route_frame, shares_subnet, GroupMember, GroupSender, McastConfig, McastKey,
};
use treecast_transport::{LinkId, Route, StreamRoute};
use treecast_wire::{Frame, FrameKind, RouteMsg};

use treecast_proto::Peer;

/// Where a link's ends are: `None` for a Unix socket (this host), else this end's
/// and the peer's IP addresses.
pub(crate) type LinkEnds = Option<(IpAddr, IpAddr)>;

/// The interface a link to a peer on this host uses.
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The multicast route's state in one node's driver.
pub(crate) struct UdpRoute {
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
    /// Route frames to send (offers, answers to offers).
    pub(crate) outbox: Vec<(LinkId, Frame)>,
    /// Links to give up, with why.
    pub(crate) broken: Vec<(LinkId, String)>,
}

impl UdpRoute {
    pub(crate) fn new(key: McastKey, node_id: u32) -> UdpRoute {
        UdpRoute {
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
        }
    }

    /// The launch plan's UDP route settings (`None`: this node does not multicast).
    pub(crate) fn configure(&mut self, settings: Option<&[(String, String)]>) {
        let Some(settings) = settings else { return };
        let lookup = |name: &str| settings.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone());
        match McastConfig::from_env(lookup) {
            Ok(config) => self.config = Some(config),
            // The front-end checked them; a node of another build may read them otherwise.
            Err(e) => tracing::warn!("UDP route off at node {}: {e}", self.node_id),
        }
    }

    /// A link came up: a child in reach is offered a place in the group.
    pub(crate) fn link_up(&mut self, link: LinkId, peer: Peer, ends: LinkEnds) {
        match peer {
            Peer::Parent => {
                self.parent = Some((link, ends));
                self.up = None;
            }
            Peer::Child { node_id } => {
                self.children.insert(link, (node_id, ends));
                self.offer(link, node_id, ends);
            }
            // Only messages between back-ends cross to another network, never multicast.
            Peer::Remote(_) => {}
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
    pub(crate) fn link_down(&mut self, link: LinkId, now: Instant) {
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

    /// From which payload size the core should hold a stream's frames until every
    /// child can take them (see `Node::send_together`): when a group multicasts.
    pub(crate) fn together(&self) -> Option<usize> {
        self.down.iter().filter_map(GroupSender::multicasts_from).min()
    }

    /// Every group is idle: its members hold everything multicast so far.
    pub(crate) fn is_idle(&self) -> bool {
        self.down.iter().all(GroupSender::is_idle)
    }

    /// Sends `frame` to `links`: by multicast with a placeholder on each member's
    /// link when that pays, else over every link.
    pub(crate) fn send(&mut self, route: &mut StreamRoute, links: &[LinkId], frame: &Frame) {
        // Most trees multicast nothing: no clock read and no allocation per frame then.
        if self.down.is_empty() {
            route.send(links, frame);
            return;
        }
        let mut carried_to: Vec<LinkId> = Vec::new();
        let now = Instant::now();
        for g in &mut self.down {
            // Groups have disjoint members: each takes its own among `links`.
            if let Some((members, placeholder)) = g.carry(frame, links, now) {
                route.send(&members, &placeholder);
                carried_to.extend(members);
            }
        }
        if carried_to.is_empty() {
            route.send(links, frame);
            return;
        }
        let rest: Vec<LinkId> = links.iter().copied().filter(|l| !carried_to.contains(l)).collect();
        if !rest.is_empty() {
            route.send(&rest, frame);
        }
    }

    /// A frame arrived on `link`: route frames are handled here; the others go to
    /// `deliver` in the link's order (behind a placeholder whose message is not in).
    pub(crate) fn on_frame(&mut self, link: LinkId, frame: Frame, deliver: &mut dyn FnMut(LinkId, Frame)) {
        if self.given_up == Some(link) {
            return;
        }
        let from_parent = self.parent.is_some_and(|(l, _)| l == link);
        if from_parent {
            if let Some(up) = self.up.as_mut() {
                if let Err(reason) = up.arrived(frame, &mut |f| deliver(link, f)) {
                    self.give_up_parent(reason);
                }
                return;
            }
        }
        if frame.header.kind != FrameKind::Route {
            deliver(link, frame);
            return;
        }
        match RouteMsg::decode(&frame.payload) {
            Ok(RouteMsg::Offer(offer)) if from_parent => self.join(link, &offer),
            Ok(RouteMsg::Joined { answers_from }) if self.children.contains_key(&link) => {
                let member = self.down.iter_mut().find_map(|g| g.joined(link, answers_from));
                if let Some(msg) = member {
                    // Sent before any placeholder for this link: see `drain`.
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

    fn join(&mut self, link: LinkId, offer: &treecast_wire::McastOffer) {
        let interface = match self.parent {
            Some((_, Some((local, _)))) => local,
            // On the parent's host: join on the interface the parent sends from.
            _ => offer.sender.ip(),
        };
        let local = McastConfig::from_env(|k| std::env::var(k).ok()).unwrap_or_default();
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

    /// Reads the group's sockets and runs its timers; frames from the parent that can
    /// go on now go to `deliver`. True when anything happened.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, deliver: &mut dyn FnMut(LinkId, Frame)) -> bool {
        let mut any = false;
        let broken = &mut self.broken;
        for g in &mut self.down {
            any |= g.poll(cx, &mut |link, reason| broken.push((link, reason)));
        }
        if let (Some(up), Some((link, _))) = (self.up.as_mut(), self.parent) {
            match up.poll(cx, &mut |f| deliver(link, f)) {
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
    pub(crate) fn report(&self) -> Vec<treecast_monitor::RouteReport> {
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
