//! Messages from one back-end to another, outside any stream
//! ([`treecast_wire::FrameKind::Peer`]).
//!
//! A message goes up from its sender until it reaches the lowest common ancestor of
//! the two ranks (the first node with a child that reaches the destination), then
//! down to the destination; two back-ends under one comm node talk through it
//! alone, never through the front-end. The destination acknowledges each message
//! once its tool has read it; a sender may have at most [`PEER_WINDOW`] unread in
//! the tree, so what the comm nodes hold for peer messages is bounded by the
//! windows of the back-ends below them. A message whose destination is gone is
//! acknowledged by the node that finds no way on, so its sender's window is not lost.

use std::time::Instant;

use treecast_wire::{Frame, FrameHeader, Grant, Window, FLAG_PEER_ACK};

use super::window::Budget;
use super::{ChildState, CommandError, Delivery, Event, LinkId, LinkRole, Node, Role};

/// What a back-end may have sent to other back-ends and not yet seen read.
pub const PEER_WINDOW: Window = Window { packets: 64, bytes: 16 << 20 };
/// The stream id that [`Event::Writable`] names when a back-end may send peer
/// messages again (no stream has it: stream ids are allocated from 1 up).
pub const PEER_CREDIT: u32 = u32::MAX;

/// A back-end's side of its peer messages.
#[derive(Debug)]
pub(super) struct PeerWindow {
    budget: Budget,
}

impl Default for PeerWindow {
    fn default() -> Self {
        PeerWindow { budget: Budget::new(PEER_WINDOW) }
    }
}

/// An acknowledgement to `to` from `from` of one message of `len` bytes.
fn ack(to: u32, from: u32, len: usize) -> Frame {
    let mut header = FrameHeader::peer(to, 0, from);
    header.flags = FLAG_PEER_ACK;
    Frame::new(header, (len as u64).to_le_bytes().to_vec())
}

impl Node {
    /// Back-end: the tool sends a message to another rank.
    pub(super) fn send_peer(&mut self, mut frame: Frame) -> Result<(), CommandError> {
        let Role::BackEnd { rank, .. } = self.role else {
            return Err(CommandError::NotNow("only back-ends send messages to other ranks"));
        };
        let Some(parent) = self.parent.filter(|_| self.rejoining.is_none()) else {
            return Err(CommandError::ShutDown);
        };
        if !self.peer.budget.open() {
            return Err(CommandError::Blocked(frame));
        }
        self.peer.budget.spend(frame.payload.len());
        frame.header.rank = rank;
        frame.header.flags = 0;
        self.out.send(parent, frame);
        Ok(())
    }

    /// A peer frame arrived on `link`.
    pub(super) fn on_peer(&mut self, link: LinkId, role: LinkRole, frame: Frame, now: Instant) {
        let to = frame.header.stream;
        if let Role::BackEnd { rank, .. } = self.role {
            if role != LinkRole::Parent || to != rank {
                let why = format!("a message for rank {to} reached rank {rank}");
                return self.drop_link(link, why, now);
            }
            if frame.header.flags & FLAG_PEER_ACK == 0 {
                return self.push_delivery(Delivery::Packet(frame));
            }
            let len = frame.payload.get(..8).and_then(|b| b.try_into().ok()).map_or(0, u64::from_le_bytes);
            if self.peer.budget.grant(Grant { packets: 1, bytes: len }) {
                self.out.event(Event::Writable { stream: PEER_CREDIT });
            }
            return;
        }
        let from_child = match role {
            LinkRole::Child(c) => Some(c),
            LinkRole::Parent => None,
        };
        let below = self.children.iter().position(|c| c.state == ChildState::Joined && c.ranks.contains(to));
        match (below, self.parent) {
            (Some(c), _) if Some(c) != from_child => {
                if let Some(l) = self.children[c].link {
                    self.out.send(l, frame);
                }
            }
            // Not below here: up towards the common ancestor, unless it came from there.
            (None, Some(parent)) if from_child.is_some() => self.out.send(parent, frame),
            _ => self.undeliverable(frame),
        }
    }

    /// A message with nowhere to go (its destination left or never was): dropped,
    /// and acknowledged on its destination's behalf so its sender may go on.
    fn undeliverable(&mut self, frame: Frame) {
        let h = frame.header;
        if h.flags & FLAG_PEER_ACK != 0 {
            return;
        }
        tracing::debug!(node = %self.name, "no way to rank {} for a message from rank {}: dropped", h.stream, h.rank);
        let back = ack(h.rank, h.stream, frame.payload.len());
        let (to, from) = (h.stream, h.rank);
        self.route_ack(back);
        if self.role == Role::FrontEnd {
            self.out.event(Event::PeerUndeliverable { from, to });
        }
    }

    /// Sends an acknowledgement made here towards its destination.
    fn route_ack(&mut self, frame: Frame) {
        let to = frame.header.stream;
        let below = self.children.iter().find(|c| c.state == ChildState::Joined && c.ranks.contains(to));
        match (below.and_then(|c| c.link), self.parent) {
            (Some(l), _) => self.out.send(l, frame),
            (None, Some(parent)) => self.out.send(parent, frame),
            (None, None) => {}
        }
    }

    /// Back-end: the tool read a message: its sender may send one more.
    pub(super) fn peer_read(&mut self, frame: &Frame) {
        let (Role::BackEnd { rank, .. }, Some(parent)) = (self.role, self.parent) else { return };
        self.out.send(parent, ack(frame.header.rank, rank, frame.payload.len()));
    }
}
