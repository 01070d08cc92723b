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
//! never copied on its way down, except a reduce-scatter's, which each node cuts to
//! the blocks of the members behind each link. A member that
//! is lost or leaves is no longer waited for (the result's contributors say who took
//! part), so an operation never hangs on a dead rank; one whose members disagree on
//! what they compute, or whose values a filter refuses, ends with an error every
//! member receives.
//!
//! With recovery on, what a lost comm node held is sent again: each back-end keeps
//! its contributions until their result arrives and each comm node the partials it
//! sent up until their result passes it on the way down, and both send them to
//! their new parent once they have rejoined (a node ignores what it already has).
//! A comm node looking for a new parent finishes nothing: without a parent it is
//! no root. Ranks that drop out from below a node while an operation is open there
//! are not waited for in it, even once they rejoin.
//!
//! What a node holds is one partial per open operation, of at most
//! [`MAX_RESULT`] bytes; at most [`MAX_OPEN_COLLECTIVES`] may be open at a node
//! (a contribution past that gets an error back), and an operation open for
//! [`COLLECTIVE_EXPIRY`] (members that never entered) ends with an error to the
//! members below.

pub(crate) mod state;

use std::time::{Duration, Instant};

use bytes::Bytes;

use treecast_filters::{builtin, FilterContext, TransformKind};
use treecast_wire::{
    decode_collective, decode_entries, decode_values, encode_collective, encode_values, order_set,
    CollectiveHead, CollectiveOp, Combine, Frame, FrameHeader, RankSet, Value, FLAG_PARTIAL_AVG,
    FLAG_PEER_COLL,
};

use super::{ChildState, CommandError, Event, LinkId, LinkRole, Node, Role};
use state::{Open, Origin, SentUp};

/// Most collective operations open at one node at once.
pub const MAX_OPEN_COLLECTIVES: usize = 4096;
/// Largest partial or result, bytes: the frame size every node takes by default.
pub const MAX_RESULT: usize = 64 << 20;
/// How long a node keeps an operation open for members that have not entered.
pub const COLLECTIVE_EXPIRY: Duration = Duration::from_secs(900);

/// Most operations a back-end may be in at once.
pub const MAX_ENTERED: usize = 64;

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

/// Folds `more` into `acc` (both encoded values; an average's both partials) with
/// `combine`.
fn fold(acc: Bytes, more: Bytes, combine: Combine, ranks: (u32, u32)) -> Result<Bytes, String> {
    let (kind, flags) = match combine {
        Combine::Sum => (TransformKind::Sum, 0),
        Combine::Min => (TransformKind::Min, 0),
        Combine::Max => (TransformKind::Max, 0),
        Combine::Avg => (TransformKind::Avg, FLAG_PARTIAL_AVG),
        Combine::None => return Err("a reduction needs sum, min, max or avg".into()),
    };
    let wave = vec![filter_input(ranks.0, acc, flags), filter_input(ranks.1, more, flags)];
    apply(kind, wave, false)
}

/// A body as the filters take it, from `rank`, with header `flags`.
fn filter_input(rank: u32, body: Bytes, flags: u16) -> Frame {
    let mut header = FrameHeader::data(0, 0, rank);
    header.flags |= flags;
    Frame::new(header, body)
}

/// Runs the built-in filter `kind` over `wave`: the one body it gives.
fn apply(kind: TransformKind, wave: Vec<Frame>, is_root: bool) -> Result<Bytes, String> {
    let ctx = FilterContext { is_root, ..FilterContext::default() };
    let out = builtin(kind).apply(wave, &ctx).map_err(|e| e.to_string())?;
    out.into_iter().next().map(|f| f.payload).ok_or_else(|| "the filter returned nothing".into())
}

/// True for an average not failed yet: its body is values or partials to fold.
fn averages(head: &CollectiveHead) -> bool {
    head.combine == Combine::Avg && head.op.folds() && head.error.is_empty()
}

/// A member's values, as they enter the tree, made a partial average of weight
/// one: what every node folds, so that each member weighs one however the tree
/// is shaped.
fn avg_partial(body: Bytes, rank: u32) -> Result<Bytes, String> {
    apply(TransformKind::Avg, vec![filter_input(rank, body, 0)], false)
}

/// At the members' common ancestor: an average's partial turned into the average,
/// in the members' types; an error is kept in `head`.
fn finish_avg(head: &mut CollectiveHead, parts: Vec<Bytes>) -> Vec<Bytes> {
    if !averages(head) {
        return parts;
    }
    let rank = head.contributors.first().unwrap_or(0);
    let partial = parts.into_iter().next().unwrap_or_default();
    match apply(TransformKind::Avg, vec![filter_input(rank, partial, FLAG_PARTIAL_AVG)], true) {
        Ok(average) => vec![average],
        Err(why) => {
            head.error = why;
            Vec::new()
        }
    }
}

/// A reduce-scatter's result values, to be narrowed on each link to the blocks of
/// the members behind it; `None` for the other results (sent whole), a failed one,
/// or one whose values do not read (sent whole too: each member finds its block by
/// the order).
fn scattered(head: &CollectiveHead, result: &Frame) -> Option<Vec<Value>> {
    if head.op != CollectiveOp::ReduceScatter || !head.error.is_empty() || head.order.is_empty() {
        return None;
    }
    // Cut only when every member the result is for has its block in it.
    let named = order_set(&head.order).ok()?;
    if !head.members.difference(&named).is_empty() {
        return None;
    }
    let (_, at) = decode_collective(&result.payload).ok()?;
    decode_values(&result.payload[at..]).ok().filter(|v| !v.is_empty())
}

/// The result `values` of reduce-scatter `head` cut to the blocks of the members
/// among `ranks`, in the group's order, as a frame from `rank`.
fn narrowed_scatter(head: &CollectiveHead, values: &[Value], ranks: &RankSet, rank: u32) -> Option<Frame> {
    let keep: Vec<usize> = (0..head.order.len()).filter(|&i| ranks.contains(head.order[i])).collect();
    if keep.len() == head.order.len() {
        return None;
    }
    let cut: Vec<Value> = values.iter().map(|v| v.blocks(head.order.len(), &keep)).collect::<Option<_>>()?;
    let order: Vec<u32> = keep.iter().map(|&i| head.order[i]).collect();
    let members = order_set(&order).ok()?.intersection(&head.members);
    let narrowed = CollectiveHead { members, order, ..head.clone() };
    let mut body = Vec::new();
    encode_values(&cut, &mut body);
    Some(frame(rank, &narrowed, &[Bytes::from(body)]))
}

/// Why two contributions to one operation cannot be combined, if they cannot.
fn disagreement(a: &CollectiveHead, b: &CollectiveHead) -> Option<String> {
    let same = (a.op, a.combine, a.root, &a.members) == (b.op, b.combine, b.root, &b.members);
    if same && a.order != b.order {
        return Some(format!(
            "members disagree on the order of reduce-scatter {} of series {:#x}: {:?} against {:?}",
            a.seq, a.context, a.order, b.order
        ));
    }
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
        if self.collectives.unanswered.len() >= MAX_ENTERED {
            return Err(CommandError::NotNow("a back-end is in at most 64 collective operations at once"));
        }
        if self.recovery.rejoining.is_some() {
            return Err(CommandError::Blocked(frame));
        }
        let Some(parent) = self.parent else { return Err(CommandError::ShutDown) };
        frame.header.rank = rank;
        self.collectives.unanswered.insert(head.key(), frame.clone());
        self.out.send(parent, frame);
        Ok(())
    }

    /// Back-end: linked to a new parent after losing one: the contributions not yet
    /// answered go again (a node above ignores one it already has).
    pub(super) fn collectives_parent_back(&mut self) {
        let Some(parent) = self.parent else { return };
        for frame in self.collectives.unanswered.values() {
            self.out.send(parent, frame.clone());
        }
    }

    /// A collective frame reached this node on `link`.
    pub(super) fn on_collective(&mut self, link: LinkId, role: LinkRole, frame: Frame, now: Instant) {
        let (mut head, at) = match decode_collective(&frame.payload) {
            Ok(h) => h,
            Err(e) => return self.drop_link(link, format!("malformed collective operation: {e}"), now),
        };
        if let Role::BackEnd { rank, .. } = self.role {
            if role != LinkRole::Parent || !head.down || !head.members.contains(rank) {
                let why = format!("a collective frame for ranks {} reached rank {rank}", head.members);
                return self.drop_link(link, why, now);
            }
            let (context, seq) = head.key();
            self.collectives.unanswered.remove(&(context, seq));
            return self.out.event(Event::CollectiveDone { context, seq, frame });
        }
        let from = match role {
            LinkRole::Child(c) => Some(c),
            // Collectives never cross between networks (see remote.rs).
            LinkRole::Parent | LinkRole::Remote(_) => None,
        };
        if head.down {
            self.collectives.sent_up.remove(&head.key());
            // From below, only a reduction's result on its way to a root elsewhere.
            if let Some(c) = from {
                let to_root = head.op == CollectiveOp::Reduce && head.members == RankSet::single(head.root);
                if !to_root || self.children[c].is_backend {
                    let why = format!("a collective result for ranks {} came up from below", head.members);
                    return self.drop_link(link, why, now);
                }
                if self.children[c].ranks.contains(head.root) {
                    // The root left that sub-tree and its leaving is on its way up.
                    return tracing::debug!(node = %self.name, "a result for gone root {}: dropped", head.root);
                }
            }
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
        let mut body = frame.payload.slice(at..);
        if let Err(why) = check_entries(&head, &body) {
            return self.drop_link(link, why, now);
        }
        if averages(&head) && self.children[c].is_backend {
            match avg_partial(body, head.contributors.first().unwrap_or(0)) {
                Ok(partial) => body = partial,
                // Refused values still enter, so that every member learns why.
                Err(why) => (head.error, body) = (why, Bytes::new()),
            }
        }
        let key = head.key();
        if let Err(NoRoom(head)) = self.contribute(head, body, now) {
            return self.refuse(*head);
        }
        let below = self.ranks_below();
        self.collective_check(key, &below);
    }

    /// A contribution that found no room: its contributors get an error back.
    fn refuse(&mut self, head: CollectiveHead) {
        let error = format!(
            "{}: {MAX_OPEN_COLLECTIVES} collective operations are open here already; collective {} of series {:#x} was refused",
            self.name, head.seq, head.context
        );
        let members = head.contributors.clone();
        let failed = CollectiveHead { down: true, members, error, ..head };
        let result = frame(failed.contributors.first().unwrap_or(0), &failed, &[]);
        self.route_result(&failed, result, Origin::Parent);
    }

    /// Adds one child's contribution to its operation.
    fn contribute(&mut self, head: CollectiveHead, body: Bytes, now: Instant) -> Result<(), NoRoom> {
        let key = head.key();
        let open = self.collectives.open.len();
        let Some(entry) = self.collectives.open.get_mut(&key) else {
            // Ranks already passed up need not come again: a repeat is dropped, and a
            // latecomer (one that joined below since) opens a part of its own.
            let passed =
                self.collectives.sent_up.get(&key).map(|s| s.contributors.clone()).unwrap_or_default();
            if !passed.is_empty() && head.contributors.difference(&passed).is_empty() {
                return Ok(());
            }
            if open >= MAX_OPEN_COLLECTIVES {
                return Err(NoRoom(Box::new(head)));
            }
            let (awaited, excused) = (RankSet::new(), passed);
            let mut entry =
                Open { head, parts: Vec::new(), awaited, excused, expires: now + COLLECTIVE_EXPIRY };
            entry.parts.push(body);
            check_size(&mut entry);
            self.collectives.open.insert(key, entry);
            return Ok(());
        };
        let twice = entry.head.contributors.intersection(&head.contributors);
        if twice == head.contributors {
            // Sent again after a rejoin, and the first did arrive.
            return Ok(());
        }
        if !twice.is_empty() && entry.head.error.is_empty() {
            // Folded values cannot be taken apart again: the operation fails.
            entry.head.error = format!(
                "ranks {twice} reached {} twice in collective {} of series {:#x} (a rejoin cut their partials apart); enter the next one",
                "a comm node", key.1, key.0
            );
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
            check_size(entry);
        }
        Ok(())
    }

    /// Sends an operation on once every member below this node has contributed: up
    /// as a partial, or, at the members' common ancestor, down as the result.
    fn collective_check(&mut self, key: (u64, u32), below: &RankSet) {
        let Some(entry) = self.collectives.open.get_mut(&key) else { return };
        // Those that dropped out from below since the last check are excused.
        let gone = entry.awaited.difference(below);
        entry.excused.union_with(&gone);
        entry.awaited = entry.head.members.intersection(below).difference(&entry.excused);
        if !entry.awaited.difference(&entry.head.contributors).is_empty() {
            return;
        }
        let all_below = entry.head.members.difference(below).is_empty();
        // A comm node looking for a new parent is no root: it waits until welcomed.
        if !all_below
            && (self.parent.is_none() || self.recovery.rejoining.is_some())
            && self.role != Role::FrontEnd
        {
            return;
        }
        let Some(Open { mut head, parts, expires, .. }) = self.collectives.open.remove(&key) else { return };
        let from = head.contributors.first().unwrap_or(0);
        let parts = if head.error.is_empty() { parts } else { Vec::new() };
        match self.parent {
            Some(parent) if !all_below => {
                let partial = frame(from, &head, &parts);
                let kept = self.collectives.sent_up.entry(key).or_insert_with(|| SentUp {
                    partials: Vec::new(),
                    contributors: RankSet::new(),
                    expires,
                });
                kept.partials.push(partial.clone());
                kept.contributors.union_with(&head.contributors);
                self.out.send(parent, partial);
            }
            _ => {
                head.down = true;
                let parts = finish_avg(&mut head, parts);
                // A failure reaches every contributor too: one that named other
                // members is told why its operation failed.
                if !head.error.is_empty() {
                    let contributors = head.contributors.clone();
                    head.members.union_with(&contributors);
                }
                self.send_result(head, &parts, from);
            }
        }
    }

    /// Comm node: linked to a new parent after losing one: partials the lost one
    /// may have held go again, and operations held meanwhile go on up.
    pub(super) fn collectives_welcomed(&mut self) {
        if let Some(parent) = self.parent {
            for partial in self.collectives.sent_up.values().flat_map(|s| &s.partials) {
                self.out.send(parent, partial.clone());
            }
        }
        self.collectives_recheck();
    }

    /// Ends the operations open past [`COLLECTIVE_EXPIRY`] with an error to the
    /// members below.
    pub(super) fn collectives_timeout(&mut self, now: Instant) {
        self.collectives.sent_up.retain(|_, sent| sent.expires > now);
        let expired: Vec<(u64, u32)> =
            self.collectives.open.iter().filter(|(_, e)| e.expires <= now).map(|(k, _)| *k).collect();
        for key in expired {
            let Some(Open { head, .. }) = self.collectives.open.remove(&key) else { continue };
            let missing = head.members.difference(&head.contributors);
            let error = format!(
                "{}: collective {} of series {:#x} was open for {} s; ranks {missing} never entered it",
                self.name,
                head.seq,
                head.context,
                COLLECTIVE_EXPIRY.as_secs()
            );
            let failed = CollectiveHead { down: true, error, ..head };
            let result = frame(failed.contributors.first().unwrap_or(0), &failed, &[]);
            self.route_result(&failed, result, Origin::Parent);
        }
    }

    /// When the first open operation expires.
    pub(super) fn collectives_deadline(&self) -> Option<Instant> {
        let sent = self.collectives.sent_up.values().map(|s| s.expires);
        self.collectives.open.values().map(|e| e.expires).chain(sent).min()
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
    /// the same frame on each (a reduce-scatter's cut to their blocks). A result for one rank not below this node (a
    /// reduction's root elsewhere) goes up, unless it came down; any other member
    /// not below is gone.
    fn route_result(&mut self, head: &CollectiveHead, result: Frame, origin: Origin) {
        let mut reached = RankSet::new();
        let scatter = scattered(head, &result);
        for c in 0..self.children.len() {
            let child = &self.children[c];
            let usable = child.state == ChildState::Joined && origin != Origin::Child(c);
            let Some(link) = child.link.filter(|_| usable) else { continue };
            if child.ranks.intersects(&head.members) {
                reached.union_with(&child.ranks);
                let copy = scatter.as_ref().and_then(|values| {
                    let rank = result.header.rank;
                    narrowed_scatter(head, values, &child.ranks, rank)
                });
                self.out.send(link, copy.unwrap_or_else(|| result.clone()));
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
        // Checks only send frames: what is below does not change between them.
        let below = self.ranks_below();
        for key in keys {
            self.collective_check(key, &below);
        }
    }
}

/// A contribution to a new operation found no room: its contributors get an error.
struct NoRoom(Box<CollectiveHead>);

/// An operation whose body grew past [`MAX_RESULT`] fails: no node could pass it on.
fn check_size(entry: &mut Open) {
    let bytes: usize = entry.parts.iter().map(Bytes::len).sum();
    if bytes > MAX_RESULT && entry.head.error.is_empty() {
        entry.head.error = format!(
            "collective {} of series {:#x} came to {bytes} bytes, over the {MAX_RESULT} a frame carries: contribute less",
            entry.head.seq, entry.head.context
        );
        entry.parts.clear();
    }
}

/// A gather's partial holds one entry for each of its contributors, no other.
fn check_entries(head: &CollectiveHead, body: &[u8]) -> Result<(), String> {
    if head.op != CollectiveOp::AllGather || !head.error.is_empty() {
        return Ok(());
    }
    let entries = decode_entries(body).map_err(|e| format!("malformed gather entries: {e}"))?;
    if entries.len() as u64 != head.contributors.len() {
        return Err(format!("{} gather entries for {} contributors", entries.len(), head.contributors.len()));
    }
    // Sorted first, the set is built in one pass.
    let mut sorted: Vec<u32> = entries.iter().map(|&(rank, _)| rank).collect();
    sorted.sort_unstable();
    let ranks: RankSet = sorted.into_iter().collect();
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
