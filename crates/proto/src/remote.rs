//! Links between the front-ends of two running networks: each front-end sees the
//! other network's ranks as a remote group, numbered from [`remote_base`] of the
//! link's index, and passes messages between back-ends of the two networks over it.
//!
//! Only peer messages and their acknowledgements cross. A front-end moves a
//! message's ranks into the other network's numbering as it sends it (the sender's
//! rank to where the other side numbers this network's ranks, the destinations back
//! to the other side's own), so what arrives is routed as if it came from a sub-tree
//! of the receiving front-end that reaches those ranks. A message crosses at most one
//! such link: a remote rank is never reached through a third network.
//!
//! The sender's window holds a crossing message until the reader in the other
//! network acknowledges it, so what waits on the link is bounded by the windows of
//! the senders; a front-end also holds each sender of the other network to its
//! window itself, so that this holds whatever the other front-end does. When the
//! link closes, the front-end acknowledges what crossed unanswered, so no sender
//! waits for it.

pub(crate) mod state;

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;
use treecast_wire::{
    decode_ack, decode_multi, encode_multi, Frame, FrameKind, RankSet, FLAG_PEER_ACK, FLAG_PEER_COLL,
    FLAG_PEER_MULTI,
};

use super::{CommandError, Event, LinkId, LinkRole, Node, Phase, Role};
use crate::peer::state::PEER_WINDOW;
use state::{remote_base, RemoteNet, RemoteSpec, REMOTE_BASE, REMOTE_SPAN};

/// As `peer::settle`, for messages to several readers in one list: the oldest entry of
/// `sender` to `reader` first (so that each entry's bytes are given back to the
/// right message), else `sender`'s oldest (an acknowledgement made for several
/// missing readers names only the first).
fn settle_read(owed: &mut VecDeque<(u32, u32, u64)>, sender: u32, reader: u32, messages: u32) {
    for _ in 0..messages {
        let exact = owed.iter().position(|&(from, to, _)| (from, to) == (sender, reader));
        match exact.or_else(|| owed.iter().position(|&(from, _, _)| from == sender)) {
            Some(i) => drop(owed.remove(i)),
            None => break,
        }
    }
}

/// `ranks` moved from numbering at `from` to numbering at `to`; those not in
/// `from..from + REMOTE_SPAN` are left out.
fn moved(ranks: &RankSet, from: u32, to: u32) -> RankSet {
    let window = RankSet::range(from, REMOTE_SPAN);
    let mut out = RankSet::new();
    for &(lo, hi) in ranks.intersection(&window).ranges() {
        out.insert_range(lo - from + to, hi - from + to);
    }
    out
}

/// The flags of a peer frame that say what it is; the others are the routes' own
/// (stamped, timed, payload in a file), set and cleared at every hop.
const PEER_KIND_FLAGS: u16 = FLAG_PEER_ACK | FLAG_PEER_MULTI | FLAG_PEER_COLL;

impl Node {
    /// Front-end: a link to another network's front-end is up. The two networks'
    /// heartbeat settings may differ, so the link is left out of the silence check.
    pub(super) fn remote_up(&mut self, link: LinkId, spec: RemoteSpec) {
        self.liveness.link_closed(link);
        let linked = |r: &RemoteNet| r.link.is_some() && r.spec.index == spec.index;
        let refusal = match (self.role, spec.check()) {
            _ if self.phase == Phase::Over => Some("this network is over".to_owned()),
            (Role::FrontEnd, Ok(())) if self.remotes.iter().any(linked) => {
                Some(format!("remote network {} is linked already", spec.index))
            }
            (Role::FrontEnd, Ok(())) => None,
            (Role::FrontEnd, Err(why)) => Some(why.to_string()),
            _ => Some("only a front-end links to another network".to_owned()),
        };
        if let Some(why) = refusal {
            self.out.event(Event::CloseLink { link, reason: why });
            return;
        }
        let entry =
            RemoteNet { spec, link: Some(link), unanswered: VecDeque::new(), inbound: BTreeMap::new() };
        // A closed link's place is taken again: link roles hold places, so they never move.
        let at = match self.remotes.iter().position(|r| r.link.is_none()) {
            Some(at) => {
                self.remotes[at] = entry;
                at
            }
            None => {
                self.remotes.push(entry);
                self.remotes.len() - 1
            }
        };
        self.links.insert(link, LinkRole::Remote(at));
        tracing::debug!(node = %self.name, "remote network {} linked on {link} ({} ranks)", spec.index, spec.size);
    }

    /// A frame from remote network `r`'s front-end: only messages between back-ends
    /// and their acknowledgements cross (and heartbeats, which are ignored).
    pub(super) fn on_remote_frame(&mut self, link: LinkId, r: usize, frame: Frame, now: Instant) {
        match frame.header.kind {
            FrameKind::Peer => match self.check_from_remote(r, &frame) {
                Ok(()) => self.on_peer(link, LinkRole::Remote(r), frame, now),
                Err(why) => self.drop_link(link, why, now),
            },
            FrameKind::Credit if frame.header.stream == 0 => {}
            kind => self.drop_link(
                link,
                format!("a {kind:?} frame came from another network: only messages between back-ends cross"),
                now,
            ),
        }
    }

    /// The linked remote network that has `rank`.
    pub(super) fn remote_reaching(&self, rank: u32) -> Option<usize> {
        if rank < REMOTE_BASE {
            return None;
        }
        self.remotes.iter().position(|r| r.link.is_some() && r.spec.has(rank))
    }

    /// The remote ranks among `ranks`, by linked network.
    pub(super) fn remote_shares(&self, ranks: &RankSet) -> Vec<(usize, RankSet)> {
        (0..self.remotes.len())
            .filter(|&r| self.remotes[r].link.is_some())
            .map(|r| (r, ranks.intersection(&self.remotes[r].spec.ranks())))
            .filter(|(_, s)| !s.is_empty())
            .collect()
    }

    /// Checks a peer frame that arrived from remote network `r`: a message or an
    /// acknowledgement, from a sender of that network, for this network's own
    /// ranks, within its sender's window. An acknowledgement settles what crossed
    /// to that network.
    pub(super) fn check_from_remote(&mut self, r: usize, frame: &Frame) -> Result<(), String> {
        let remote = &mut self.remotes[r];
        let h = &frame.header;
        let index = remote.spec.index;
        if !remote.spec.has(h.rank) {
            return Err(format!(
                "a message from rank {} came from remote network {index}, which does not have it",
                h.rank
            ));
        }
        let kind = h.flags & PEER_KIND_FLAGS;
        if kind != 0 && kind != FLAG_PEER_ACK && kind != FLAG_PEER_MULTI {
            return Err(format!("remote network {index} sent a peer frame with flags {kind:#x}: only messages and their acknowledgements cross"));
        }
        // What crosses is for this network's own ranks: never passed on to a third.
        let (targets, body) = match kind {
            FLAG_PEER_MULTI => match decode_multi(&frame.payload) {
                Ok((targets, at)) => (targets, frame.payload.len() - at),
                Err(e) => return Err(format!("malformed message for several ranks: {e}")),
            },
            _ => (RankSet::single(h.stream), frame.payload.len()),
        };
        if targets.intersects(&RankSet::range(REMOTE_BASE, u32::MAX - REMOTE_BASE)) {
            return Err(format!(
                "remote network {index} sent a message for ranks that are not this network's"
            ));
        }
        if kind == FLAG_PEER_ACK {
            let (messages, _) =
                decode_ack(&frame.payload).map_err(|e| format!("malformed acknowledgement: {e}"))?;
            settle_read(&mut remote.unanswered, h.stream, h.rank, messages);
            return Ok(());
        }
        let copies = u32::try_from(targets.len()).unwrap_or(u32::MAX);
        let held = remote.inbound.entry(h.rank).or_default();
        held.0 = held.0.saturating_add(copies);
        held.1 = held.1.saturating_add(u64::from(copies).saturating_mul(body as u64));
        if held.0 > PEER_WINDOW.packets || held.1 > PEER_WINDOW.bytes {
            return Err(format!(
                "rank {} of remote network {index} sent beyond its window ({} messages, {} bytes unread)",
                h.rank, held.0, held.1
            ));
        }
        Ok(())
    }

    /// Sends a peer frame (`len` bytes of values) to remote network `r`, in its
    /// numbering. A message is held unanswered until the reader acknowledges it; an
    /// acknowledgement gives its sender's window back. A message from a rank the
    /// other side does not know (spawned since the link was made) is undeliverable.
    pub(super) fn pass_to_remote(&mut self, r: usize, frame: Frame, len: usize) {
        let remote = &mut self.remotes[r];
        let Some(link) = remote.link else { return };
        let (base, their_base) = (remote_base(remote.spec.index), remote_base(remote.spec.their_index));
        let h = frame.header;
        let (targets, at) = match h.flags & FLAG_PEER_MULTI {
            0 => (RankSet::single(h.stream), 0),
            _ => match decode_multi(&frame.payload) {
                Ok(decoded) => decoded,
                Err(_) => return self.undeliverable(&frame, &RankSet::single(h.stream), len),
            },
        };
        let ack = h.flags & FLAG_PEER_ACK != 0;
        if h.rank >= remote.spec.own_size {
            return self.undeliverable(&frame, &targets, len);
        }
        let mut out = frame.clone();
        out.header.rank = their_base + h.rank;
        if (base..base.saturating_add(REMOTE_SPAN)).contains(&h.stream) {
            out.header.stream = h.stream - base;
        }
        if h.flags & FLAG_PEER_MULTI != 0 {
            out.payload = encode_multi(&moved(&targets, base, 0), &frame.payload[at..]).into();
        }
        if ack {
            let (messages, bytes) = decode_ack(&frame.payload).unwrap_or((0, 0));
            if let Some(held) = remote.inbound.get_mut(&h.stream) {
                held.0 = held.0.saturating_sub(messages);
                held.1 = held.1.saturating_sub(bytes);
                if *held == (0, 0) {
                    remote.inbound.remove(&h.stream);
                }
            }
        } else {
            remote.unanswered.extend(targets.iter().map(|t| (h.rank, t, len as u64)));
        }
        self.out.send(link, out);
    }

    /// The tool closes the link to remote network `index`.
    pub(super) fn close_remote(&mut self, index: u32, now: Instant) -> Result<(), CommandError> {
        let link = self.remotes.iter().find(|r| r.spec.index == index).and_then(|r| r.link);
        let Some(link) = link else {
            return Err(CommandError::NotNow("no network is linked with that number"));
        };
        self.drop_link(link, "disconnected by this front-end".to_owned(), now);
        Ok(())
    }

    /// Remote network `r`'s link closed: what crossed unanswered is acknowledged
    /// for its readers, and the tool is told.
    pub(super) fn remote_gone(&mut self, r: usize, reason: String) {
        let remote = &mut self.remotes[r];
        remote.link = None;
        remote.inbound.clear();
        let index = remote.spec.index;
        let owed = std::mem::take(&mut remote.unanswered);
        for (from, to, bytes) in owed {
            self.route_ack(super::peer::ack(from, to, 1, bytes));
        }
        self.out.event(Event::RemoteClosed { index, reason });
    }
}

#[cfg(test)]
mod tests {
    use super::state::{RemoteError, MAX_REMOTES};
    use super::*;

    #[test]
    fn ranks_move_between_numberings_within_the_span() {
        let base = remote_base(2);
        let mut ranks = RankSet::range(base, 3);
        ranks.insert(5);
        ranks.insert(base + REMOTE_SPAN);
        assert_eq!(moved(&ranks, base, 0), RankSet::range(0, 3));
        assert_eq!(moved(&RankSet::range(0, 2), 0, base), RankSet::range(base, 2));
    }

    #[test]
    fn specs_past_the_limits_are_refused() {
        let spec = RemoteSpec { index: 0, size: 4, their_index: 0, own_size: 2 };
        assert!(spec.check().is_ok());
        assert_eq!(RemoteSpec { index: MAX_REMOTES, ..spec }.check(), Err(RemoteError::Number(MAX_REMOTES)));
        assert_eq!(
            RemoteSpec { their_index: MAX_REMOTES, ..spec }.check(),
            Err(RemoteError::Number(MAX_REMOTES))
        );
        let many = REMOTE_SPAN + 1;
        assert_eq!(RemoteSpec { size: many, ..spec }.check(), Err(RemoteError::TooManyRanks(many)));
        assert_eq!(RemoteSpec { own_size: many, ..spec }.check(), Err(RemoteError::TooManyRanks(many)));
        assert_eq!(remote_base(MAX_REMOTES - 1) + (REMOTE_SPAN - 1), 0xFEFF_FFFF);
    }

    #[test]
    fn an_acknowledgement_from_another_network_settles_the_message_its_reader_read() {
        // 1000 bytes to reader 9, then 1 byte to reader 8, which reads first.
        let mut owed: VecDeque<(u32, u32, u64)> = [(1, 9, 1000), (1, 8, 1)].into_iter().collect();
        settle_read(&mut owed, 1, 8, 1);
        assert_eq!(owed, VecDeque::from([(1, 9, 1000)]));
        // Made for several readers that are gone: it names only the first.
        owed.push_back((1, 7, 5));
        settle_read(&mut owed, 1, 6, 2);
        assert!(owed.is_empty());
    }

    #[test]
    fn a_spec_has_exactly_its_ranks() {
        let spec = RemoteSpec { index: 1, size: 3, their_index: 0, own_size: 1 };
        let base = remote_base(1);
        assert!(spec.has(base) && spec.has(base + 2));
        assert!(!spec.has(base + 3) && !spec.has(base - 1) && !spec.has(2));
        assert_eq!(spec.ranks(), (base..base + 3).collect());
    }
}
