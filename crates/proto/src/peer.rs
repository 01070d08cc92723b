//! Messages from one back-end to others, outside any stream
//! ([`treecast_wire::FrameKind::Peer`]).
//!
//! A message goes up from its sender until it reaches the lowest common ancestor of
//! the sender and its destinations (the first node with children that reach them),
//! then down; two back-ends under one comm node talk through it alone, never
//! through the front-end. A message for several ranks ([`FLAG_PEER_MULTI`]) is
//! copied once per link it must take, each copy naming only the destinations
//! behind that link.
//!
//! Each destination acknowledges a message once its tool has read it; a sender may
//! have at most [`PEER_WINDOW`] unread in the tree (a message for n ranks counts n
//! times), so what the comm nodes hold for peer messages is bounded by the windows
//! of the back-ends below them. A node that finds no way on for a message
//! acknowledges it itself, and the parent of a back-end that goes (stopped, left or
//! lost) acknowledges what it had passed to it unanswered; what a comm node held
//! when it was lost is not acknowledged by anyone.

pub(crate) mod state;

use std::collections::VecDeque;
use std::time::Instant;

use treecast_wire::{
    decode_ack, decode_multi, encode_ack, encode_multi, Frame, FrameHeader, Grant, RankSet, FLAG_PEER_ACK,
    FLAG_PEER_COLL, FLAG_PEER_MULTI,
};

use super::{ChildState, CommandError, Delivery, Event, LinkId, LinkRole, Node, Role};
use state::PEER_WINDOW;

/// The stream id that [`Event::Writable`] names when a back-end may send peer
/// messages again (no stream has it: stream ids are allocated from 1 up).
pub const PEER_CREDIT: u32 = u32::MAX;

/// An acknowledgement to `to` from `from` of `messages` messages and `bytes` bytes.
pub(super) fn ack(to: u32, from: u32, messages: u32, bytes: u64) -> Frame {
    let mut header = FrameHeader::peer(to, 0, from);
    header.flags = FLAG_PEER_ACK;
    Frame::new(header, encode_ack(messages, bytes))
}

/// Drops the first `messages` entries `owed` holds for `sender` (sender, reader,
/// bytes), as an acknowledgement to it says they were read.
fn settle(owed: &mut VecDeque<(u32, u32, u64)>, sender: u32, messages: u32) {
    for _ in 0..messages {
        match owed.iter().position(|&(from, _, _)| from == sender) {
            Some(i) => drop(owed.remove(i)),
            None => break,
        }
    }
}

/// A copy of a message for several ranks that names only `targets`.
fn narrowed(frame: &Frame, targets: &RankSet, body: &[u8]) -> Frame {
    Frame::new(frame.header, encode_multi(targets, body))
}

impl Node {
    /// Back-end: the tool sends a message to another rank, or to several.
    pub(super) fn send_peer(&mut self, mut frame: Frame) -> Result<(), CommandError> {
        let Role::BackEnd { rank, .. } = self.role else {
            return Err(CommandError::NotNow("only back-ends send messages to other ranks"));
        };
        // While this back-end rejoins (it has no parent until it reaches the new
        // one), messages wait as if for credit.
        if self.recovery.rejoining.is_some() || !self.peer.budget.open() {
            return Err(CommandError::Blocked(frame));
        }
        let Some(parent) = self.parent else { return Err(CommandError::ShutDown) };
        let copies = match frame.header.flags & FLAG_PEER_MULTI {
            0 => (1, frame.payload.len()),
            _ => match decode_multi(&frame.payload) {
                Ok((targets, at)) => {
                    let body_len = frame.payload.len() - at;
                    // A sender is not among the receivers of its own message.
                    let others = targets.difference(&RankSet::single(rank));
                    if others.is_empty() {
                        return Ok(());
                    }
                    if others != targets {
                        frame.payload = encode_multi(&others, &frame.payload[at..]).into();
                    }
                    (u32::try_from(others.len()).unwrap_or(u32::MAX), body_len)
                }
                Err(_) => {
                    return Err(CommandError::NotNow("a message for several ranks needs its rank set first"))
                }
            },
        };
        self.peer.budget.spend_many(copies.0, u64::from(copies.0) * copies.1 as u64);
        frame.header.rank = rank;
        frame.header.flags &= FLAG_PEER_MULTI;
        self.out.send(parent, frame);
        Ok(())
    }

    /// A peer frame arrived on `link`.
    pub(super) fn on_peer(&mut self, link: LinkId, role: LinkRole, frame: Frame, now: Instant) {
        if frame.header.flags & FLAG_PEER_COLL != 0 {
            return self.on_collective(link, role, frame, now);
        }
        if let Role::BackEnd { rank, .. } = self.role {
            return self.peer_at_backend(link, role, rank, frame, now);
        }
        let from_child = match role {
            LinkRole::Child(c) => Some(c),
            LinkRole::Parent | LinkRole::Remote(_) => None,
        };
        let from_remote = match role {
            LinkRole::Remote(r) => Some(r),
            _ => None,
        };
        if let Some(c) = from_child {
            if frame.header.flags & FLAG_PEER_ACK != 0 {
                self.answered(c, &frame);
            } else if !self.children[c].ranks.contains(frame.header.rank) {
                // Messages come up from their senders' sub-trees only.
                let why = format!(
                    "a message from rank {} came from {}, which does not reach it",
                    frame.header.rank, self.children[c].name
                );
                return self.drop_link(link, why, now);
            }
        }
        if frame.header.flags & FLAG_PEER_MULTI != 0 {
            return match decode_multi(&frame.payload) {
                Ok((targets, at)) => self.route_multi(&frame, targets, at, role),
                Err(e) => self.drop_link(link, format!("malformed message for several ranks: {e}"), now),
            };
        }
        let to = frame.header.stream;
        let below = self.child_reaching(to);
        match (below, self.parent) {
            (Some(c), _) if Some(c) != from_child => {
                let len = frame.payload.len();
                self.pass_down(c, frame, len)
            }
            // Not below here: up towards the common ancestor, unless it came from there.
            (None, Some(parent)) if from_child.is_some() => self.out.send(parent, frame),
            // At the front-end: another network's rank, unless it came from one.
            _ => match self.remote_reaching(to).filter(|_| from_remote.is_none()) {
                Some(r) => {
                    let len = frame.payload.len();
                    self.pass_to_remote(r, frame, len)
                }
                None => self.undeliverable(&frame, &RankSet::single(to), frame.payload.len()),
            },
        }
    }

    /// A message for several ranks: a copy down each child's link for the ranks
    /// behind it, one up for those not below this node (at the front-end, one to
    /// each other network with some of them), the rest undeliverable.
    fn route_multi(&mut self, frame: &Frame, targets: RankSet, at: usize, role: LinkRole) {
        let from_child = match role {
            LinkRole::Child(c) => Some(c),
            _ => None,
        };
        let body = &frame.payload[at..];
        let mut left = targets.clone();
        // Ranks behind the link it came from were that child's to reach; any still
        // listed are gone below it (their loss is on its way up).
        if let Some(c) = from_child {
            let back = left.intersection(&self.children[c].ranks);
            if !back.is_empty() {
                left = left.difference(&back);
                self.undeliverable(frame, &back, body.len());
            }
        }
        for c in 0..self.children.len() {
            let child = &self.children[c];
            if child.state != ChildState::Joined || Some(c) == from_child {
                continue;
            }
            let theirs = left.intersection(&child.ranks);
            if theirs.is_empty() {
                continue;
            }
            left = left.difference(&theirs);
            let copy = narrowed(frame, &theirs, body);
            self.pass_down(c, copy, body.len());
        }
        if left.is_empty() {
            return;
        }
        match (self.parent, from_child) {
            (Some(parent), Some(_)) => self.out.send(parent, narrowed(frame, &left, body)),
            (None, _) if !matches!(role, LinkRole::Remote(_)) => {
                for (r, theirs) in self.remote_shares(&left) {
                    left = left.difference(&theirs);
                    self.pass_to_remote(r, narrowed(frame, &theirs, body), body.len());
                }
                self.undeliverable(frame, &left, body.len())
            }
            _ => self.undeliverable(frame, &left, body.len()),
        }
    }

    /// Sends a message (`len` bytes of values) down to child `c`; a back-end child
    /// owes its acknowledgement.
    fn pass_down(&mut self, c: usize, frame: Frame, len: usize) {
        let child = &self.children[c];
        let Some(link) = child.link else { return };
        if let (true, 0, Some(rank)) =
            (child.is_backend, frame.header.flags & FLAG_PEER_ACK, child.ranks.first())
        {
            let owed = self.peer.unanswered.entry(child.node_id).or_default();
            owed.push_back((frame.header.rank, rank, len as u64));
        }
        self.out.send(link, frame);
    }

    /// Back-end child `c` acknowledged messages: it owes fewer.
    fn answered(&mut self, c: usize, ack: &Frame) {
        let child = &self.children[c];
        if !child.is_backend {
            return;
        }
        let Some(owed) = self.peer.unanswered.get_mut(&child.node_id) else { return };
        let (messages, _) = decode_ack(&ack.payload).unwrap_or((0, 0));
        settle(owed, ack.header.stream, messages);
    }

    /// Back-end child `c` is gone: what it never acknowledged is acknowledged for it.
    pub(super) fn peer_child_gone(&mut self, c: usize) {
        let Some(owed) = self.peer.unanswered.remove(&self.children[c].node_id) else { return };
        for (from, rank, bytes) in owed {
            self.route_ack(ack(from, rank, 1, bytes));
        }
    }

    /// A peer frame at a back-end: a message for it, or an acknowledgement.
    fn peer_at_backend(&mut self, link: LinkId, role: LinkRole, rank: u32, frame: Frame, now: Instant) {
        let flags = frame.header.flags;
        if role != LinkRole::Parent {
            return self.drop_link(link, "a peer frame from a child of a back-end".into(), now);
        }
        if flags & FLAG_PEER_ACK != 0 {
            if frame.header.stream != rank {
                return self.drop_link(
                    link,
                    format!("an acknowledgement for rank {} reached rank {rank}", frame.header.stream),
                    now,
                );
            }
            let (messages, bytes) = match decode_ack(&frame.payload) {
                Ok(a) => a,
                Err(e) => return self.drop_link(link, format!("malformed acknowledgement: {e}"), now),
            };
            // More than was ever spent (an acknowledgement counted twice) cannot
            // widen the window.
            if self.peer.budget.grant_within(Grant { packets: messages, bytes }, PEER_WINDOW) {
                self.out.event(Event::Writable { stream: PEER_CREDIT });
            }
            return;
        }
        let mut frame = frame;
        if flags & FLAG_PEER_MULTI != 0 {
            match decode_multi(&frame.payload) {
                Ok((targets, at)) if targets.contains(rank) => {
                    // The tool sees it as a message for this rank alone.
                    frame.payload = frame.payload.slice(at..);
                    frame.header.flags = 0;
                    frame.header.stream = rank;
                }
                Ok(_) => {
                    return self.drop_link(
                        link,
                        format!("a message for other ranks reached rank {rank}"),
                        now,
                    )
                }
                Err(e) => {
                    return self.drop_link(link, format!("malformed message for several ranks: {e}"), now)
                }
            }
        } else if frame.header.stream != rank {
            return self.drop_link(
                link,
                format!("a message for rank {} reached rank {rank}", frame.header.stream),
                now,
            );
        }
        self.push_delivery(Delivery::Packet(frame));
    }

    /// A message with nowhere to go for `missing` (they left or never were): dropped
    /// for them, and acknowledged on their behalf so its sender may go on.
    pub(super) fn undeliverable(&mut self, frame: &Frame, missing: &RankSet, len: usize) {
        let h = frame.header;
        if h.flags & FLAG_PEER_ACK != 0 || missing.is_empty() {
            return;
        }
        tracing::debug!(node = %self.name, "no way to ranks {missing} for a message from rank {}: dropped", h.rank);
        let n = missing.len();
        let Some(first) = missing.first() else { return };
        let messages = u32::try_from(n).unwrap_or(u32::MAX);
        self.route_ack(ack(h.rank, first, messages, n.saturating_mul(len as u64)));
        if self.role == Role::FrontEnd {
            self.out.event(Event::PeerUndeliverable { from: h.rank, to: missing.clone() });
        }
    }

    /// Sends an acknowledgement made here towards its destination.
    pub(super) fn route_ack(&mut self, frame: Frame) {
        let to = frame.header.stream;
        match (self.child_reaching(to).and_then(|c| self.children[c].link), self.parent) {
            (Some(l), _) => self.out.send(l, frame),
            (None, Some(parent)) => self.out.send(parent, frame),
            (None, None) => {
                if let Some(r) = self.remote_reaching(to) {
                    self.pass_to_remote(r, frame, 0);
                }
            }
        }
    }

    /// Back-end: the tool read a message: its sender may send one more. Read while
    /// this back-end has no parent (it rejoins), the acknowledgement waits for one.
    pub(super) fn peer_read(&mut self, frame: &Frame) {
        let Role::BackEnd { rank, .. } = self.role else { return };
        let a = ack(frame.header.rank, rank, 1, frame.payload.len() as u64);
        match self.parent.filter(|_| self.recovery.rejoining.is_none()) {
            Some(parent) => self.out.send(parent, a),
            None => self.peer.held_acks.push(a),
        }
    }

    /// Back-end: linked to a parent again: held acknowledgements go, and messages may.
    pub(super) fn peer_parent_back(&mut self) {
        let Some(parent) = self.parent else { return };
        for a in std::mem::take(&mut self.peer.held_acks) {
            self.out.send(parent, a);
        }
        if self.peer.budget.open() {
            self.out.event(Event::Writable { stream: PEER_CREDIT });
        }
        self.collectives_parent_back();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_acknowledgement_settles_its_senders_oldest_messages() {
        let mut owed: VecDeque<(u32, u32, u64)> = [(1, 9, 4), (2, 9, 4), (1, 8, 4)].into_iter().collect();
        settle(&mut owed, 1, 1);
        assert_eq!(owed, VecDeque::from([(2, 9, 4), (1, 8, 4)]));
        settle(&mut owed, 1, 5);
        assert_eq!(owed, VecDeque::from([(2, 9, 4)]));
    }
}
