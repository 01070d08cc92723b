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
//! the senders. When the link closes, the front-end acknowledges what crossed
//! unanswered, so no sender waits for it.

use std::collections::VecDeque;
use std::time::Instant;
use treecast_wire::{
    decode_ack, decode_multi, encode_multi, Frame, FrameKind, RankSet, FLAG_PEER_ACK, FLAG_PEER_MULTI,
};

use super::{CommandError, Event, LinkId, LinkRole, Node, Role};

/// The first rank number given to remote networks' ranks; a network's own ranks stay below.
pub const REMOTE_BASE: u32 = 0x8000_0000;
/// How many rank numbers each remote network has: its ranks must stay below this.
pub const REMOTE_SPAN: u32 = 1 << 24;
/// How many remote networks one front-end may link to at once.
pub const MAX_REMOTES: u32 = 127;

/// Where the ranks of remote network `index` start in this network's numbering.
pub fn remote_base(index: u32) -> u32 {
    REMOTE_BASE.saturating_add(index.saturating_mul(REMOTE_SPAN))
}

/// A remote network linked to this front-end, as its driver hands the link over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteSpec {
    /// This front-end's number for it: its rank r is `remote_base(index) + r` here.
    pub index: u32,
    /// Its ranks, 0 to `size - 1`, when the link was made.
    pub size: u32,
    /// The other front-end's number for this network: this network's rank r is
    /// `remote_base(their_index) + r` there.
    pub their_index: u32,
}

impl RemoteSpec {
    /// Its ranks in this network's numbering.
    pub fn ranks(&self) -> RankSet {
        RankSet::range(remote_base(self.index), self.size)
    }

    /// Why it cannot be linked, if it cannot.
    ///
    /// # Errors
    /// An index past [`MAX_REMOTES`], or more ranks than [`REMOTE_SPAN`].
    pub fn check(&self) -> Result<(), String> {
        if self.index >= MAX_REMOTES || self.their_index >= MAX_REMOTES {
            return Err(format!("a front-end links to at most {MAX_REMOTES} networks at once"));
        }
        if self.size > REMOTE_SPAN {
            return Err(format!("a linked network has at most {REMOTE_SPAN} ranks, not {}", self.size));
        }
        Ok(())
    }
}

/// A linked remote network at the front-end.
#[derive(Debug)]
pub(super) struct RemoteNet {
    spec: RemoteSpec,
    link: Option<LinkId>,
    /// Messages that crossed and are not yet acknowledged: (sender, destination
    /// in this numbering, bytes), in order.
    unanswered: VecDeque<(u32, u32, u64)>,
}

/// Drops the first `messages` entries `owed` holds for `sender`, as an
/// acknowledgement to it says they were read.
pub(super) fn settle(owed: &mut VecDeque<(u32, u32, u64)>, sender: u32, messages: u32) {
    for _ in 0..messages {
        match owed.iter().position(|&(from, _, _)| from == sender) {
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

impl Node {
    /// Front-end: a link to another network's front-end is up.
    pub(super) fn remote_up(&mut self, link: LinkId, spec: RemoteSpec) {
        let refusal = match (self.role, spec.check()) {
            (Role::FrontEnd, Ok(()))
                if self.remotes.iter().any(|r| r.link.is_some() && r.spec.index == spec.index) =>
            {
                Some(format!("remote network {} is linked already", spec.index))
            }
            (Role::FrontEnd, Ok(())) => None,
            (Role::FrontEnd, Err(why)) => Some(why),
            _ => Some("only a front-end links to another network".to_owned()),
        };
        if let Some(why) = refusal {
            self.out.event(Event::CloseLink { link, reason: why });
            self.liveness.link_closed(link);
            return;
        }
        let entry = RemoteNet { spec, link: Some(link), unanswered: VecDeque::new() };
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

    /// A frame from another network's front-end: only peer messages (and heartbeats) cross.
    pub(super) fn on_remote_frame(&mut self, link: LinkId, role: LinkRole, frame: Frame, now: Instant) {
        match frame.header.kind {
            FrameKind::Peer => match role {
                LinkRole::Remote(r) => match self.check_from_remote(r, &frame) {
                    Ok(()) => self.on_peer(link, role, frame, now),
                    Err(why) => self.drop_link(link, why, now),
                },
                _ => self.on_peer(link, role, frame, now),
            },
            // A heartbeat.
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
        self.remotes.iter().position(|r| r.link.is_some() && r.spec.ranks().contains(rank))
    }

    /// The remote ranks among `ranks`, by linked network.
    pub(super) fn remote_shares(&self, ranks: &RankSet) -> Vec<(usize, RankSet)> {
        (0..self.remotes.len())
            .filter(|&r| self.remotes[r].link.is_some())
            .map(|r| (r, ranks.intersection(&self.remotes[r].spec.ranks())))
            .filter(|(_, s)| !s.is_empty())
            .collect()
    }

    /// Checks a peer frame that arrived from remote network `r`: it must name a
    /// sender of that network, and may not be a collective's. An acknowledgement
    /// settles what crossed to that network.
    pub(super) fn check_from_remote(&mut self, r: usize, frame: &Frame) -> Result<(), String> {
        let remote = &mut self.remotes[r];
        let h = &frame.header;
        if !remote.spec.ranks().contains(h.rank) {
            return Err(format!(
                "a message from rank {} came from remote network {}, which does not have it",
                h.rank, remote.spec.index
            ));
        }
        if h.flags & !(FLAG_PEER_ACK | FLAG_PEER_MULTI) != 0 {
            return Err("only messages between back-ends cross between networks".to_owned());
        }
        // What crosses is for this network's own ranks: never passed on to a third.
        let foreign = match h.flags & FLAG_PEER_MULTI {
            0 => h.stream >= REMOTE_BASE,
            _ => match decode_multi(&frame.payload) {
                Ok((targets, _)) => targets.intersects(&RankSet::range(REMOTE_BASE, u32::MAX - REMOTE_BASE)),
                Err(e) => return Err(format!("malformed message for several ranks: {e}")),
            },
        };
        if foreign {
            return Err(format!(
                "remote network {} sent a message for ranks that are not this network's",
                remote.spec.index
            ));
        }
        if h.flags & FLAG_PEER_ACK != 0 {
            let (messages, _) =
                decode_ack(&frame.payload).map_err(|e| format!("malformed acknowledgement: {e}"))?;
            settle(&mut remote.unanswered, h.stream, messages);
        }
        Ok(())
    }

    /// Sends a peer frame (`len` bytes of values) to remote network `r`, in its
    /// numbering; a message is held unanswered until the reader acknowledges it.
    /// A sender this numbering cannot give the other side is undeliverable.
    pub(super) fn pass_to_remote(&mut self, r: usize, frame: Frame, len: usize) {
        let remote = &self.remotes[r];
        let Some(link) = remote.link else { return };
        let (base, their_base) = (remote_base(remote.spec.index), remote_base(remote.spec.their_index));
        let h = frame.header;
        let targets = match h.flags & FLAG_PEER_MULTI {
            0 => RankSet::single(h.stream),
            _ => match decode_multi(&frame.payload) {
                Ok((targets, _)) => targets,
                Err(_) => return,
            },
        };
        if h.rank >= REMOTE_SPAN {
            // A rank past what the other side can number.
            return self.undeliverable(&frame, &targets, len);
        }
        let mut out = frame.clone();
        out.header.rank = their_base + h.rank;
        if (base..base.saturating_add(REMOTE_SPAN)).contains(&h.stream) {
            out.header.stream = h.stream - base;
        }
        if h.flags & FLAG_PEER_MULTI != 0 {
            let Ok((_, at)) = decode_multi(&frame.payload) else { return };
            out.payload = encode_multi(&moved(&targets, base, 0), &frame.payload[at..]).into();
        }
        if h.flags & FLAG_PEER_ACK == 0 {
            let owed = &mut self.remotes[r].unanswered;
            owed.extend(targets.iter().map(|t| (h.rank, t, len as u64)));
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
        assert!(RemoteSpec { index: 0, size: 4, their_index: 0 }.check().is_ok());
        assert!(RemoteSpec { index: MAX_REMOTES, size: 4, their_index: 0 }.check().is_err());
        assert!(RemoteSpec { index: 0, size: REMOTE_SPAN + 1, their_index: 0 }.check().is_err());
        assert_eq!(remote_base(MAX_REMOTES - 1) + (REMOTE_SPAN - 1), 0xFEFF_FFFF);
    }

    #[test]
    fn an_acknowledgement_settles_its_senders_oldest_messages() {
        let mut owed: VecDeque<(u32, u32, u64)> = [(1, 9, 4), (2, 9, 4), (1, 8, 4)].into_iter().collect();
        settle(&mut owed, 1, 1);
        assert_eq!(owed, VecDeque::from([(2, 9, 4), (1, 8, 4)]));
        settle(&mut owed, 1, 5);
        assert_eq!(owed, VecDeque::from([(2, 9, 4)]));
    }
}
