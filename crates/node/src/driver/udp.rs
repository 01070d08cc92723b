//! The driver's side of the multicast route over UDP (docs/multicast.md): which
//! children join this node's group, which frames go by multicast, and, at a child,
//! the parent's group joined and its frames put back in the link's order.
//!
//! A node multicasts when its launch plan says so (`--route udp`), to the children
//! that share the subnet of the first such child's link (children on this host,
//! over Unix sockets, count as on the loopback interface). Other children get
//! everything over their links. Any node joins the group its parent offers.

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::task::Context;
use std::time::Instant;

use treecast_transport::mcast::{
    route_frame, shares_subnet, GroupMember, GroupSender, McastConfig, McastKey,
};
use treecast_transport::{LinkId, Route, StreamRoute};
use treecast_wire::{Frame, FrameKind, RouteMsg};

use crate::core::Peer;

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
    down: Option<GroupSender>,
    /// This node's children: node id and where their links are.
    children: BTreeMap<LinkId, (u32, LinkEnds)>,
    /// The link to the parent and its ends, and the parent's group once joined.
    parent: Option<(LinkId, LinkEnds)>,
    up: Option<GroupMember>,
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
            down: None,
            children: BTreeMap::new(),
            parent: None,
            up: None,
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
        }
    }

    fn offer(&mut self, link: LinkId, node_id: u32, ends: LinkEnds) {
        let Some(config) = self.config else { return };
        let interface = match ends {
            None => LOOPBACK,
            Some((local, peer)) if shares_subnet(local, peer) => local,
            Some((local, peer)) => {
                tracing::debug!(
                    "child {node_id} at {peer} is not on the subnet of {local}: its link carries everything"
                );
                return;
            }
        };
        if self.down.is_none() {
            match GroupSender::bind(interface, self.node_id, self.key.clone(), config) {
                Ok(g) => self.down = Some(g),
                Err(e) => {
                    tracing::warn!(
                        "node {}: no multicast group on {interface} ({e}); links carry everything",
                        self.node_id
                    );
                    self.config = None;
                    return;
                }
            }
        }
        let Some(down) = self.down.as_mut() else { return };
        if down.interface() != interface {
            tracing::debug!(
                "child {node_id} is reached through {interface}, not the group's {}",
                down.interface()
            );
            return;
        }
        let offer = down.offer(node_id, link);
        self.outbox.push((link, route_frame(&offer)));
    }

    /// A link is gone.
    pub(crate) fn link_down(&mut self, link: LinkId, now: Instant) {
        if self.children.remove(&link).is_some() {
            if let Some(down) = self.down.as_mut() {
                down.leave(link, now);
            }
        }
        if self.parent.is_some_and(|(l, _)| l == link) {
            self.parent = None;
            self.up = None;
        }
    }

    /// Sends `frame` to `links`: by multicast with a placeholder on each member's
    /// link when that pays, else over every link.
    pub(crate) fn send(&mut self, route: &mut StreamRoute, links: &[LinkId], frame: &Frame) {
        let carried = self.down.as_mut().and_then(|d| d.carry(frame, links, Instant::now()));
        let Some((members, placeholder)) = carried else {
            route.send(links, frame);
            return;
        };
        let rest: Vec<LinkId> = links.iter().copied().filter(|l| !members.contains(l)).collect();
        route.send(&members, &placeholder);
        if !rest.is_empty() {
            route.send(&rest, frame);
        }
    }

    /// A frame arrived on `link`: route frames are handled here; the others go to
    /// `deliver` in the link's order (behind a placeholder whose message is not in).
    pub(crate) fn on_frame(&mut self, link: LinkId, frame: Frame, deliver: &mut dyn FnMut(LinkId, Frame)) {
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
                if let Some(down) = self.down.as_mut() {
                    down.joined(link, answers_from);
                }
            }
            Ok(RouteMsg::Declined { reason }) if self.children.contains_key(&link) => {
                let child = self.children.get(&link).map_or(0, |c| c.0);
                tracing::info!("child {child} declined the multicast group: {reason}");
                if let Some(down) = self.down.as_mut() {
                    down.leave(link, Instant::now());
                }
            }
            Ok(other) => self.broken.push((link, format!("route message out of place: {other:?}"))),
            Err(e) => self.broken.push((link, format!("malformed route frame: {e}"))),
        }
    }

    fn join(&mut self, link: LinkId, offer: &treecast_wire::McastOffer) {
        let interface = match self.parent {
            Some((_, Some((local, _)))) => local,
            _ => LOOPBACK,
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
        }
        self.up = None;
    }

    /// Reads the group's sockets and runs its timers; frames from the parent that can
    /// go on now go to `deliver`. True when anything happened.
    pub(crate) fn poll(&mut self, cx: &mut Context<'_>, deliver: &mut dyn FnMut(LinkId, Frame)) -> bool {
        let mut any = false;
        if let Some(down) = self.down.as_mut() {
            let broken = &mut self.broken;
            any |= down.poll(cx, &mut |link, reason| broken.push((link, reason)));
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

    /// What this node's multicast did, with the children its group does not reach.
    pub(crate) fn report(&self) -> Option<treecast_monitor::RouteReport> {
        let down = self.down.as_ref()?;
        let mut report = down.report();
        report.tcp_children =
            self.children.values().map(|c| c.0).filter(|n| !report.udp_children.contains(n)).collect();
        Some(report)
    }
}
