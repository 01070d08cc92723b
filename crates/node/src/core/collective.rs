//! Collective operations among back-ends, computed in the tree
//! ([`treecast_wire::FLAG_PEER_COLL`]): reduce (to a root that may be in another
//! group), all-reduce, all-gather, reduce-scatter and barrier over any set of ranks.
//!
//! Every member sends one contribution up. A comm node folds what comes from its
//! children (the same element-wise sum, min and max as the stream filters) and sends
//! one partial up once every member below it has contributed, unless all members are
//! below it: then it is their lowest common ancestor, and it sends the result down,
//! one copy per link: the same frame, shared, on every link (each node finds the
//! members behind each of its links itself), so a large result is encoded once and
//! never copied on its way down. A member that
//! is lost or leaves is no longer waited for (the result's contributors say who took
//! part), so an operation never hangs on a dead rank; one whose members disagree on
//! what they compute, or whose values a filter refuses, ends with an error every
//! member receives.
//!
//! What a node holds is one partial per open operation; at most
//! [`MAX_OPEN_COLLECTIVES`] may be open at a node, and a child that opens more is
//! dropped.

use std::collections::HashMap;
use std::time::Instant;

use bytes::Bytes;

use treecast_filters::{builtin, FilterContext, TransformKind};
use treecast_wire::{
    decode_collective, decode_entries, encode_collective, CollectiveHead, CollectiveOp, Combine, Frame,
    FrameHeader, RankSet, FLAG_PEER_COLL,
};

use super::{ChildState, CommandError, Event, LinkId, LinkRole, Node, Role};

/// Most collective operations open at one node at once.
pub const MAX_OPEN_COLLECTIVES: usize = 4096;

/// Where a result being routed came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Origin {
    /// Computed here (this node is the members' common ancestor).
    Here,
    /// Down from the parent.
    Parent,
    /// Up from this child (on its way to a root elsewhere).
    Child(usize),
}

/// An operation this node has contributions for and has not passed on yet.
#[derive(Debug)]
struct Open {
    /// The head of the first contribution (its contributors and error are this
    /// node's running ones).
    head: CollectiveHead,
    /// The body in parts, shared with the frames they came in: one part, folded
    /// so far (reductions), or each child's entries (gathers), joined once sent.
    parts: Vec<Bytes>,
}

/// A node's open collective operations, by (context, number).
#[derive(Debug, Default)]
pub(super) struct Collectives {
    open: HashMap<(u64, u32), Open>,
}

/// A collective frame from `rank` with `head` and the body in `parts`.
fn frame(rank: u32, head: &CollectiveHead, parts: &[Bytes]) -> Frame {
    let mut h = FrameHeader::peer(u32::MAX, 0, rank);
    h.flags = FLAG_PEER_COLL;
    let mut payload = encode_collective(head, &[]);
    payload.reserve(parts.iter().map(Bytes::len).sum());
    for part in parts {
        payload.extend_from_slice(part);
    }
    Frame::new(h, payload)
}

/// Folds `more` into `acc` (both encoded values) with `combine`.
fn fold(acc: Bytes, more: Bytes, combine: Combine, ranks: (u32, u32)) -> Result<Bytes, String> {
    let kind = match combine {
        Combine::Sum => TransformKind::Sum,
        Combine::Min => TransformKind::Min,
        Combine::Max => TransformKind::Max,
        Combine::None => return Err("a reduction needs sum, min or max".into()),
    };
    let wave = vec![
        Frame::new(FrameHeader::data(0, 0, ranks.0), acc),
        Frame::new(FrameHeader::data(0, 0, ranks.1), more),
    ];
    let out = builtin(kind).apply(wave, &FilterContext::default()).map_err(|e| e.to_string())?;
    out.into_iter().next().map(|f| f.payload).ok_or_else(|| "the filter returned nothing".into())
}

/// Why two contributions to one operation cannot be combined, if they cannot.
fn disagreement(a: &CollectiveHead, b: &CollectiveHead) -> Option<String> {
    let same = (a.op, a.combine, a.root, &a.members) == (b.op, b.combine, b.root, &b.members);
    if same {
        return None;
    }
    Some(format!(
        "members disagree on collective {} of series {:#x}: {:?}/{:?} to root {} over {} against {:?}/{:?} to root {} over {}",
        a.seq, a.context, a.op, a.combine, a.root, a.members, b.op, b.combine, b.root, b.members
    ))
}

impl Node {
    /// Back-end: the tool enters a collective operation with its contribution.
    pub(super) fn send_collective(&mut self, mut frame: Frame) -> Result<(), CommandError> {
        let Role::BackEnd { rank, .. } = self.role else {
            return Err(CommandError::NotNow("only back-ends take part in collective operations"));
        };
        let head = match decode_collective(&frame.payload) {
            Ok((head, _)) => head,
            Err(_) => return Err(CommandError::NotNow("a collective contribution needs its head first")),
        };
        if head.down || head.contributors != RankSet::single(rank) || !head.members.contains(rank) {
            return Err(CommandError::NotNow(
                "a back-end contributes once, as itself, to an operation it is a member of",
            ));
        }
        if self.rejoining.is_some() {
            return Err(CommandError::Blocked(frame));
        }
        let Some(parent) = self.parent else { return Err(CommandError::ShutDown) };
        frame.header.rank = rank;
        self.out.send(parent, frame);
        Ok(())
    }

    /// A collective frame reached this node on `link`.
    pub(super) fn on_collective(&mut self, link: LinkId, role: LinkRole, frame: Frame, now: Instant) {
        let (head, at) = match decode_collective(&frame.payload) {
            Ok(h) => h,
            Err(e) => return self.drop_link(link, format!("malformed collective operation: {e}"), now),
        };
        if let Role::BackEnd { rank, .. } = self.role {
            if role != LinkRole::Parent || !head.down || !head.members.contains(rank) {
                let why = format!("a collective frame for ranks {} reached rank {rank}", head.members);
                return self.drop_link(link, why, now);
            }
            let (context, seq) = head.key();
            return self.out.event(Event::CollectiveDone { context, seq, frame });
        }
        let from = match role {
            LinkRole::Child(c) => Some(c),
            LinkRole::Parent => None,
        };
        if head.down {
            return self.route_result(&head, frame, from.map_or(Origin::Parent, Origin::Child));
        }
        let Some(c) = from else {
            return self.drop_link(link, "a collective contribution came down from the parent".into(), now);
        };
        let behind = &self.children[c].ranks;
        if head.contributors.is_empty() || !head.contributors.difference(behind).is_empty() {
            let why = format!(
                "contributions of ranks {} came from {}, which reaches {behind}",
                head.contributors, self.children[c].name
            );
            return self.drop_link(link, why, now);
        }
        let body = frame.payload.slice(at..);
        if let Err(why) = check_entries(&head, &body) {
            return self.drop_link(link, why, now);
        }
        let key = head.key();
        if let Err(why) = self.contribute(head, body) {
            return self.drop_link(link, why, now);
        }
        self.collective_check(key);
    }

    /// Adds one child's contribution to its operation.
    fn contribute(&mut self, head: CollectiveHead, body: Bytes) -> Result<(), String> {
        let key = head.key();
        let open = self.collectives.open.len();
        let Some(entry) = self.collectives.open.get_mut(&key) else {
            if open >= MAX_OPEN_COLLECTIVES {
                return Err(format!("more than {MAX_OPEN_COLLECTIVES} collective operations open at once"));
            }
            self.collectives.open.insert(key, Open { head, parts: vec![body] });
            return Ok(());
        };
        let twice = entry.head.contributors.intersection(&head.contributors);
        if !twice.is_empty() {
            return Err(format!(
                "ranks {twice} contributed twice to collective {} of series {:#x}",
                key.1, key.0
            ));
        }
        entry.head.contributors.union_with(&head.contributors);
        if !entry.head.error.is_empty() {
            return Ok(());
        }
        if let Some(why) = disagreement(&entry.head, &head) {
            entry.head.error = why;
        } else if !head.error.is_empty() {
            entry.head.error = head.error;
        } else {
            merge_body(entry, &head, body);
        }
        Ok(())
    }

    /// Sends an operation on once every member below this node has contributed: up
    /// as a partial, or, at the members' common ancestor, down as the result.
    fn collective_check(&mut self, key: (u64, u32)) {
        let below = self.ranks_below();
        let Some(entry) = self.collectives.open.get(&key) else { return };
        let awaited = entry.head.members.intersection(&below);
        if !awaited.difference(&entry.head.contributors).is_empty() {
            return;
        }
        let Some(Open { mut head, parts }) = self.collectives.open.remove(&key) else { return };
        let from = head.contributors.first().unwrap_or(0);
        let all_below = head.members.difference(&below).is_empty();
        let parts = if head.error.is_empty() { parts } else { Vec::new() };
        match self.parent {
            Some(parent) if !all_below => self.out.send(parent, frame(from, &head, &parts)),
            _ => {
                head.down = true;
                self.send_result(head, &parts, from);
            }
        }
    }

    /// Ranks behind this node's joined children.
    fn ranks_below(&self) -> RankSet {
        let mut all = RankSet::new();
        for c in self.children.iter().filter(|c| c.state == ChildState::Joined) {
            all.union_with(&c.ranks);
        }
        all
    }

    /// At the common ancestor: the result goes down (a reduction's values to its
    /// root only, word that it is done to the other members).
    fn send_result(&mut self, head: CollectiveHead, parts: &[Bytes], from: u32) {
        if head.op != CollectiveOp::Reduce {
            let result = frame(from, &head, parts);
            return self.route_result(&head, result, Origin::Here);
        }
        let root = RankSet::single(head.root);
        let others = head.members.difference(&root);
        if !others.is_empty() {
            let done = CollectiveHead { members: others, ..head.clone() };
            let result = frame(from, &done, &[]);
            self.route_result(&done, result, Origin::Here);
        }
        let to_root = CollectiveHead { members: root, ..head };
        let result = frame(from, &to_root, parts);
        self.route_result(&to_root, result, Origin::Here);
    }

    /// Sends a result down each child's link behind which some of its members are,
    /// the same frame on each. A result for one rank not below this node (a
    /// reduction's root elsewhere) goes up, unless it came down; any other member
    /// not below is gone.
    fn route_result(&mut self, head: &CollectiveHead, result: Frame, origin: Origin) {
        let mut reached = RankSet::new();
        for c in 0..self.children.len() {
            let child = &self.children[c];
            let usable = child.state == ChildState::Joined && origin != Origin::Child(c);
            let Some(link) = child.link.filter(|_| usable) else { continue };
            if child.ranks.intersects(&head.members) {
                reached.union_with(&child.ranks);
                self.out.send(link, result.clone());
            }
        }
        let left = head.members.difference(&reached);
        if left.is_empty() {
            return;
        }
        let to_root = head.op == CollectiveOp::Reduce && head.members == RankSet::single(head.root);
        let up = self.parent.filter(|_| origin != Origin::Parent && to_root);
        match up {
            Some(parent) => self.out.send(parent, result),
            _ => tracing::debug!(
                node = %self.name,
                "the result of collective {} of series {:#x} is for ranks {left}, which are gone: dropped",
                head.seq,
                head.context
            ),
        }
    }

    /// Members left below this node: operations waiting for them go on without them.
    pub(super) fn collectives_recheck(&mut self) {
        let keys: Vec<(u64, u32)> = self.collectives.open.keys().copied().collect();
        for key in keys {
            self.collective_check(key);
        }
    }
}

/// A gather's partial holds one entry for each of its contributors, no other.
fn check_entries(head: &CollectiveHead, body: &[u8]) -> Result<(), String> {
    if head.op != CollectiveOp::AllGather || !head.error.is_empty() {
        return Ok(());
    }
    let entries = decode_entries(body).map_err(|e| format!("malformed gather entries: {e}"))?;
    let ranks: RankSet = entries.iter().map(|&(rank, _)| rank).collect();
    if ranks != head.contributors || entries.len() as u64 != ranks.len() {
        return Err(format!(
            "gather entries for ranks {ranks} do not match contributors {}",
            head.contributors
        ));
    }
    Ok(())
}

/// Adds a later contribution to an open operation's body.
fn merge_body(entry: &mut Open, head: &CollectiveHead, body: Bytes) {
    match entry.head.op {
        CollectiveOp::AllGather => entry.parts.push(body),
        CollectiveOp::Barrier => {}
        _ => {
            let ranks =
                (entry.head.contributors.first().unwrap_or(0), head.contributors.first().unwrap_or(0));
            let acc = entry.parts.pop().unwrap_or_default();
            match fold(acc, body, entry.head.combine, ranks) {
                Ok(folded) => entry.parts.push(folded),
                Err(why) => entry.head.error = why,
            }
        }
    }
}
