//! Streams at one node: routing down with per-child windows, waves and reductions
//! up with per-child windows, and what the tool reads.
//!
//! Down: a frame from the parent (at the front-end, from the tool) goes to every
//! child that reaches a member of the stream, at once to those with credit and into
//! a per-child queue for the others. The frame counts against the window this node
//! gave its source until every child has it, so a slow child holds up its own
//! stream, within a window, and nothing else: no queue ever makes the node stop
//! reading a link.
//!
//! Up: frames from the children go through the stream's synchronizer into waves;
//! complete waves are reduced by the stream's filter and sent up while the parent
//! (at the front-end, the tool's reading) gives credit. A child's frames count
//! against its window until their wave is reduced and sent on.

pub(crate) mod state;

use std::collections::VecDeque;
use std::time::Instant;

use treecast_filters::{apply_dropping_bad, FilterContext, FilterPlace, PlaceRole, Synchronizer, Wave};
use treecast_wire::{
    ControlMsg, Frame, FrameKind, Grant, RankSet, RouteChoice, StreamSpec, SyncMode, FLAG_DIRECT,
};

use super::window::{Budget, Ledger};
use super::{CommandError, Delivery, Destination, Event, LinkId, LinkRole, Node, Outputs, Role, Transmit};
use crate::handover::state::Handover;
use crate::startup::state::{Child, ChildState};
use state::{ChildPart, StreamState};

/// The [`Ctx`] of a node, borrowing only the fields it names (so the node's streams
/// and outputs stay free to borrow mutably beside it).
macro_rules! ctx {
    ($node:expr) => {
        Ctx {
            role: $node.role,
            name: &$node.name,
            // Until the new parent's welcome, a rejoining node sends nothing up: what
            // it would send answers waves that went on without it, and the new parent
            // may already count its answers from a later wave.
            parent: $node.parent.filter(|_| $node.recovery.rejoining.is_none()),
            children: &$node.children,
            awaited: &$node.recovery.orphaned,
            together: $node.send_together,
        }
    };
}

/// What stream code needs of the node besides the stream itself.
struct Ctx<'a> {
    role: Role,
    name: &'a str,
    parent: Option<LinkId>,
    children: &'a [Child],
    /// Front-end: ranks of lost comm nodes' sub-trees that may still rejoin.
    awaited: &'a RankSet,
    /// Frames for a stream's whole group wait until every member can take them
    /// ([`drain_together`]), from this many payload bytes.
    together: Option<usize>,
}

impl Ctx<'_> {
    fn is_root(&self) -> bool {
        self.role == Role::FrontEnd
    }

    fn link_of(&self, c: usize) -> Option<LinkId> {
        self.children.get(c).and_then(|ch| ch.link)
    }

    /// From which payload size `s`'s frames wait to go to its whole group at once:
    /// never for a stream kept off multicast (its [`treecast_wire::RouteChoice`]).
    fn together(&self, s: &StreamState) -> Option<usize> {
        self.together.filter(|_| s.spec.route.multicasts())
    }

    /// A report for the parent, or at the front-end an event.
    fn report(&self, out: &mut Outputs, msg: ControlMsg) {
        match (self.role, self.parent) {
            (Role::FrontEnd, _) => {
                if let ControlMsg::FilterError { stream, rank, message } = msg {
                    out.event(Event::FilterError { stream, rank, message });
                }
            }
            (_, Some(p)) => out.control(p, &msg),
            (_, None) => {}
        }
    }
}

/// Gives back what the downward source is owed: to the parent in batches, to the
/// tool at once (waking a refused send).
fn return_down_credit(s: &mut StreamState, ctx: &Ctx<'_>, out: &mut Outputs) {
    let id = s.spec.id;
    match (ctx.role, ctx.parent) {
        (Role::FrontEnd, _) => {
            if s.down_ledger.take_all().is_some() && s.blocked && s.down_ledger.open() {
                s.blocked = false;
                out.event(Event::Writable { stream: id });
            }
        }
        (_, Some(parent)) => {
            if let Some(g) = s.down_ledger.take_grant() {
                out.credit(parent, id, g);
            }
        }
        (_, None) => {}
    }
}

/// Inputs handed to every child since the last call count as consumed.
fn settle_down(s: &mut StreamState, ctx: &Ctx<'_>, out: &mut Outputs) {
    let first_queued = s.parts.iter().flatten().filter_map(|p| p.queue.front().map(|(seq, _, _)| *seq)).min();
    let mut any = false;
    while let Some(&(seq, len)) = s.in_node.front() {
        if first_queued.is_some_and(|q| q <= seq) {
            break;
        }
        s.in_node.pop_front();
        s.down_ledger.consume(len);
        any = true;
    }
    if any {
        return_down_credit(s, ctx, out);
    }
}

/// Sends child `c` what its credit allows from its queue, then a pending close.
fn drain_child(s: &mut StreamState, c: usize, ctx: &Ctx<'_>, out: &mut Outputs) {
    let id = s.spec.id;
    let Some(link) = ctx.link_of(c) else { return };
    let Some(part) = s.part(c) else { return };
    while part.down.open() {
        let Some((_, frame, _)) = part.queue.pop_front() else { break };
        part.down.spend(frame.payload.len());
        out.send(link, frame);
    }
    if part.queue.is_empty() && part.close_pending {
        part.close_pending = false;
        out.control(link, &ControlMsg::CloseStream { id });
    }
}

/// The front of a queue, to compare across children: the same frame queued for
/// several children shares its payload.
fn same_entry(a: &(u64, Frame, bool), b: &(u64, Frame, bool)) -> bool {
    a.0 == b.0 && a.2 == b.2 && a.1.header == b.1.header && a.1.payload.as_ptr() == b.1.payload.as_ptr()
}

/// A node whose route multicasts ([`crate::Node::send_together`]) sends a frame
/// for the whole group once every linked member can take it, as one send to all of
/// them, rather than to the open ones now and to each late one on its own, which
/// would cost a multicast per straggler. Frames for one child go as soon as it can
/// take them once they reach the front of its queue. Each child's frames still go
/// in its queue's order.
fn drain_together(s: &mut StreamState, ctx: &Ctx<'_>, out: &mut Outputs) {
    let id = s.spec.id;
    let linked: Vec<(usize, LinkId)> =
        s.members.iter().filter_map(|&c| ctx.link_of(c).map(|l| (c, l))).collect();
    loop {
        let mut progressed = false;
        for &(c, link) in &linked {
            let Some(p) = s.parts.get_mut(c).and_then(Option::as_mut) else { continue };
            while p.down.open() && p.queue.front().is_some_and(|e| !e.2) {
                let Some((_, frame, _)) = p.queue.pop_front() else { break };
                p.down.spend(frame.payload.len());
                out.send(link, frame);
                progressed = true;
            }
        }
        let parts: Vec<&ChildPart> =
            linked.iter().filter_map(|&(c, _)| s.parts.get(c).and_then(Option::as_ref)).collect();
        let fronts: Vec<&(u64, Frame, bool)> = parts.iter().filter_map(|p| p.queue.front()).collect();
        let aligned = fronts.len() == parts.len()
            && fronts.first().is_some_and(|f0| f0.2 && fronts.iter().all(|f| same_entry(f0, f)));
        if aligned && parts.iter().all(|p| p.down.open()) {
            let mut frame = None;
            for &(c, _) in &linked {
                if let Some(p) = s.parts.get_mut(c).and_then(Option::as_mut) {
                    if let Some((_, f, _)) = p.queue.pop_front() {
                        p.down.spend(f.payload.len());
                        frame.get_or_insert(f);
                    }
                }
            }
            if let Some(frame) = frame {
                let links: Vec<LinkId> = linked.iter().map(|&(_, l)| l).collect();
                out.transmits.push_back(Transmit { to: Destination::Links(links.into()), frame });
                progressed = true;
            }
        } else if !aligned {
            // The queues went apart (a child drained on its own, or one that joined
            // late): the open children furthest behind catch up, together where they
            // are at the same frame.
            let behind = fronts.iter().filter(|f| f.2).min_by_key(|f| f.0).map(|f| (*f).clone());
            if let Some(behind) = behind {
                let mut links = Vec::new();
                for &(c, link) in &linked {
                    let Some(p) = s.parts.get_mut(c).and_then(Option::as_mut) else { continue };
                    if p.down.open() && p.queue.front().is_some_and(|e| same_entry(e, &behind)) {
                        p.queue.pop_front();
                        p.down.spend(behind.1.payload.len());
                        links.push(link);
                    }
                }
                if !links.is_empty() {
                    out.transmits
                        .push_back(Transmit { to: Destination::Links(links.into()), frame: behind.1 });
                    progressed = true;
                }
            }
        }
        if !progressed {
            break;
        }
    }
    for &(c, link) in &linked {
        if let Some(p) = s.parts.get_mut(c).and_then(Option::as_mut) {
            if p.queue.is_empty() && p.close_pending {
                p.close_pending = false;
                out.control(link, &ControlMsg::CloseStream { id });
            }
        }
    }
}

/// Hands one output frame of input `seq` to the stream's children.
fn fan_out(
    s: &mut StreamState,
    seq: u64,
    frame: Frame,
    direct: Option<usize>,
    ctx: &Ctx<'_>,
    out: &mut Outputs,
) {
    if let Some(c) = direct {
        let Some(link) = ctx.link_of(c) else { return };
        let Some(part) = s.part(c) else { return };
        if part.queue.is_empty() && part.down.open() {
            part.down.spend(frame.payload.len());
            out.send(link, frame);
        } else {
            part.queue.push_back((seq, frame, false));
        }
        return;
    }
    let len = frame.payload.len();
    let all_open = s.members.iter().all(|&c| {
        s.parts.get(c).and_then(Option::as_ref).is_some_and(|p| p.queue.is_empty() && p.down.open())
    });
    if all_open {
        for &c in &s.members {
            if let Some(p) = s.parts.get_mut(c).and_then(Option::as_mut) {
                p.down.spend(len);
            }
        }
        if !s.targets.is_empty() {
            out.transmits.push_back(Transmit { to: Destination::Links(s.targets.clone()), frame });
        }
        return;
    }
    if ctx.together(s).is_some_and(|min| len >= min) {
        for &c in &s.members {
            if let (Some(_), Some(p)) = (ctx.link_of(c), s.parts.get_mut(c).and_then(Option::as_mut)) {
                p.queue.push_back((seq, frame.clone(), true));
            }
        }
        drain_together(s, ctx, out);
        return;
    }
    let mut now_links = Vec::new();
    for &c in &s.members {
        let (Some(link), Some(p)) = (ctx.link_of(c), s.parts.get_mut(c).and_then(Option::as_mut)) else {
            continue;
        };
        if p.queue.is_empty() && p.down.open() {
            p.down.spend(len);
            now_links.push(link);
        } else {
            p.queue.push_back((seq, frame.clone(), false));
        }
    }
    if !now_links.is_empty() {
        out.transmits.push_back(Transmit { to: Destination::Links(now_links.into()), frame });
    }
}

/// Sends reduced frames while there is up credit (one credit each), reducing held
/// waves as the frames of the last one go out, and returns credit to the children
/// whose packets were reduced.
fn reduce(s: &mut StreamState, ctx: &Ctx<'_>, out: &mut Outputs) {
    let id = s.spec.id;
    let fctx = FilterContext { stream: id, is_root: ctx.is_root() };
    // A comm node looking for a new parent: what it reduces answers requests of
    // waves that go on without it, and is dropped (what was waiting to go up was
    // dropped when the parent was lost, see `streams_orphaned`).
    let orphan = ctx.role == Role::CommNode && ctx.parent.is_none();
    loop {
        while s.up_budget.open() {
            let Some(f) = s.pending_up.pop_front() else { break };
            if f.header.kind == FrameKind::Control {
                // A filter state (see handover.rs): in order with the waves, no credit.
                if let Some(parent) = ctx.parent {
                    out.send(parent, f);
                }
                continue;
            }
            s.up_budget.spend(f.payload.len());
            s.went_up = s.went_up.wrapping_add(1);
            match (ctx.role, ctx.parent) {
                (Role::FrontEnd, _) => {
                    if s.ready.is_empty() {
                        out.event(Event::Readable { stream: Some(id) });
                    }
                    s.ready.push_back(Some(f));
                }
                (_, Some(parent)) => out.send(parent, f),
                (_, None) => {}
            }
        }
        if !orphan && (!s.up_budget.open() || !s.pending_up.is_empty()) {
            return;
        }
        let Some(wave) = s.held.pop_front() else { return };
        s.waves_up = s.waves_up.wrapping_add(1);
        if wave.frames.is_empty() {
            // Front-end: a wave nobody is left to answer (see `queue_waves`).
            if s.ready.is_empty() {
                out.event(Event::Readable { stream: Some(id) });
            }
            s.ready.push_back(None);
            continue;
        }
        // Do-not-wait waves carry no number (each is index 0): those complete when
        // this node's last member left still go up, the later ones do not.
        let kept = s.kept_after_detach > 0;
        s.kept_after_detach -= usize::from(kept);
        let detached = !kept && s.detached_from.is_some_and(|d| wave.index >= d);
        let earlier = numbered(s) && wave.index < s.up_from;
        let stale = orphan || (ctx.role == Role::CommNode && (earlier || detached));
        for (&c, f) in wave.children.iter().zip(&wave.frames) {
            let Some(part) = s.parts.get_mut(c).and_then(Option::as_mut) else { continue };
            part.up.consume(f.payload.len());
            if let (Some(g), Some(link)) = (part.up.take_grant(), ctx.link_of(c)) {
                out.credit(link, id, g);
            }
        }
        let Some(filter) = s.up_filter.as_mut() else { continue };
        let (frames, errors) = apply_dropping_bad(filter.as_mut(), wave.frames, &fctx);
        // Packets the filter sends back down (MRNet's packets_out_reverse) go to this
        // node's children in the stream as a packet from the parent would, waiting for
        // each child's credit; they take no credit from the parent.
        let down = filter.take_down();
        if !stale {
            for f in down {
                let seq = s.next_seq;
                s.next_seq += 1;
                fan_out(s, seq, f, None, ctx, out);
            }
        }
        for e in errors {
            let message = format!("{}: {e}", ctx.name);
            ctx.report(
                out,
                ControlMsg::FilterError { stream: id, rank: e.rank().unwrap_or(u32::MAX), message },
            );
        }
        if !stale {
            if ctx.role == Role::CommNode {
                report_state(s, ctx, out);
            }
            s.pending_up.extend(frames);
        }
    }
}

/// Queues the upward filter's state after a wave for the parent, ahead of the
/// wave's frames; a filter that cannot say it is reported.
fn report_state(s: &mut StreamState, ctx: &Ctx<'_>, out: &mut Outputs) {
    let Some(filter) = s.up_filter.as_mut() else { return };
    match s.handover.report(filter.as_mut(), s.spec.id) {
        Ok(Some(frame)) => s.pending_up.push_back(frame),
        Ok(None) => {}
        Err(e) => {
            let message = format!("{}: cannot report the filter's state for recovery: {e}", ctx.name);
            ctx.report(out, ControlMsg::FilterError { stream: s.spec.id, rank: u32::MAX, message });
        }
    }
}

/// Takes child `c` out of a stream: it no longer reaches a member (or is gone, or
/// refused the stream). Its packets already queued still count in the next waves;
/// what was queued for it is dropped, and a child still linked is told the stream is
/// closed for it, behind what it was already sent.
fn remove_member(s: &mut StreamState, c: usize, ctx: &Ctx<'_>, out: &mut Outputs, now: Instant, tell: bool) {
    s.members.retain(|&m| m != c);
    s.handover.child_left(c);
    s.rebuild_targets(ctx.children);
    let part = s.parts.get_mut(c).and_then(Option::take);
    if let (true, Some(_), Some(link)) = (tell, part, ctx.link_of(c)) {
        out.control(link, &ControlMsg::CloseStream { id: s.spec.id });
    }
    let waves = s.sync.child_lost(c, now);
    queue_waves(s, waves, ctx);
    if ctx.together(s).is_some() {
        // The lost child no longer holds the others back.
        drain_together(s, ctx, out);
    }
    if ctx.role == Role::CommNode && s.members.is_empty() && s.detached_from.is_none() {
        // The parent takes this node out of the stream too (it reaches none of its
        // ranks now) and counts its next waves without it; if orphans rejoin here,
        // their answers go up only once the parent takes this node back.
        s.detached_from = Some(s.sync.next_wave());
        s.kept_after_detach = if s.spec.sync == SyncMode::DoNotWait { s.held.len() } else { 0 };
    }
    settle_down(s, ctx, out);
    if !s.closing {
        reduce(s, ctx, out);
        check_over(s, ctx, out);
    }
}

/// Front-end: the stream is over once no member is left and nothing is held. While
/// ranks of it may still rejoin it goes on: requests no member is left to answer get
/// an answer from no rank, and new ones wait for the rejoin (see `send_from_tool`).
/// Removes a stream; one with a program tag of its own tells the driver its tag no
/// longer applies, so the route's table holds only live streams.
fn forget_stream(
    streams: &mut std::collections::BTreeMap<u32, StreamState>,
    out: &mut Outputs,
    id: u32,
) -> Option<StreamState> {
    let s = streams.remove(&id)?;
    if s.spec.program != 0 {
        out.event(Event::StreamProgram { stream: id, program: None });
    }
    if s.spec.route != RouteChoice::Network {
        out.routes.push_back((id, None));
    }
    Some(s)
}

fn check_over(s: &mut StreamState, ctx: &Ctx<'_>, out: &mut Outputs) {
    let drained = s.sync.queued() == 0 && s.held.is_empty() && s.pending_up.is_empty();
    if !ctx.is_root() || s.over || !s.members.is_empty() || !drained {
        return;
    }
    if s.spec.ranks.intersects(ctx.awaited) {
        // Whoever got the requests not answered yet is cut off, and a rejoined node
        // answers only requests sent after its return: their waves never form.
        s.sync.skip_to(s.requests);
        queue_waves(s, Vec::new(), ctx);
        return reduce(s, ctx, out);
    }
    s.over = true;
    drop_waiting_down(s);
    return_down_credit(s, ctx, out);
    out.event(Event::Readable { stream: Some(s.spec.id) });
}

/// Front-end: the frames held for a rejoin will not go down (the stream ended or
/// closed); their credit goes back to the tool.
fn drop_waiting_down(s: &mut StreamState) {
    for f in std::mem::take(&mut s.waiting_down) {
        s.down_ledger.consume(f.payload.len());
    }
}

/// Waves of a wait-for-all stream answer its requests one for one, so they are
/// numbered by request across a rejoin; on other streams an answer is taken as it
/// comes (a time-out wave or a packet need not answer any one request).
fn numbered(s: &StreamState) -> bool {
    s.spec.sync == SyncMode::WaitForAll
}

/// Queues complete waves for reduction. At the front-end, on a wait-for-all stream
/// (whose waves answer requests one for one), the waves the synchronizer skipped are
/// queued too, empty: nobody is left to answer their requests (every member that got
/// them was cut off), and the tool reads that no rank did, instead of waiting forever.
fn queue_waves(s: &mut StreamState, waves: Vec<Wave>, ctx: &Ctx<'_>) {
    let fill_gaps = ctx.is_root() && numbered(s);
    for wave in waves {
        if fill_gaps {
            queue_skipped(s, wave.index);
            s.queued_through = s.queued_through.max(wave.index + 1);
        }
        s.held.push_back(wave);
    }
    if fill_gaps {
        queue_skipped(s, s.sync.next_wave());
    }
}

/// Queues an empty wave for each one numbered from `queued_through` to `upto`.
fn queue_skipped(s: &mut StreamState, upto: u64) {
    while s.queued_through < upto {
        s.held.push_back(Wave { index: s.queued_through, ..Wave::default() });
        s.queued_through += 1;
    }
}

impl Node {
    /// Children that reach a member of `ranks`.
    fn members_for(&self, ranks: &RankSet) -> Vec<usize> {
        (0..self.children.len())
            .filter(|&c| {
                let ch = &self.children[c];
                ch.state == ChildState::Joined && ch.link.is_some() && ch.ranks.intersects(ranks)
            })
            .collect()
    }

    /// A fresh stream state; `reduce_here` makes the filters (not at a back-end).
    fn make_stream(
        &self,
        spec: StreamSpec,
        reduce_here: bool,
    ) -> Result<StreamState, treecast_filters::RegistryError> {
        let members = self.members_for(&spec.ranks);
        let (up_filter, down_filter) = if reduce_here {
            let place = FilterPlace {
                stream: spec.id,
                rank: self.node_id,
                role: match self.role {
                    Role::FrontEnd => PlaceRole::FrontEnd,
                    Role::CommNode => PlaceRole::CommNode,
                    Role::BackEnd { .. } => PlaceRole::BackEnd,
                },
                children: members.len() as u32,
                depth: self.depth,
                leaves: members
                    .iter()
                    .map(|&c| self.children[c].ranks.intersection(&spec.ranks).len())
                    .sum::<u64>()
                    .min(u64::from(u32::MAX)) as u32,
            };
            let up = self.registry.make_at(&spec.up, &place)?;
            let down = self.registry.make_at(&spec.down, &place)?;
            let apply_down = self.role == Role::CommNode && spec.down.name != "null";
            (Some(up), apply_down.then_some(down))
        } else {
            (None, None)
        };
        let mut parts: Vec<Option<ChildPart>> = Vec::new();
        parts.resize_with(self.children.len(), || None);
        for &c in &members {
            parts[c] = Some(ChildPart {
                up: Ledger::new(spec.up_window),
                down: Budget::new(spec.down_window),
                queue: VecDeque::new(),
                close_pending: false,
            });
        }
        let up_window = if self.role == Role::FrontEnd { self.tool_window } else { spec.up_window };
        let targets = members.iter().filter_map(|&c| self.children[c].link).collect();
        Ok(StreamState {
            sync: Synchronizer::new(spec.sync, members.iter().copied()),
            up_filter,
            handover: Handover::default(),
            down_filter,
            members,
            targets,
            parts,
            up_budget: Budget::new(up_window),
            went_up: 0,
            waves_up: 0,
            held: VecDeque::new(),
            pending_up: VecDeque::new(),
            down_ledger: Ledger::new(spec.down_window),
            next_seq: 0,
            in_node: VecDeque::new(),
            ready: VecDeque::new(),
            waiting_down: VecDeque::new(),
            queued_through: 0,
            blocked: false,
            closing: false,
            over: false,
            tool_done: false,
            requests: 0,
            sent_up: 0,
            up_from: 0,
            detached_from: None,
            kept_after_detach: 0,
            spec,
        })
    }

    /// Front-end: the tool opens a stream.
    pub(super) fn open_stream(&mut self, spec: StreamSpec) -> Result<(), CommandError> {
        if self.role != Role::FrontEnd {
            return Err(CommandError::NotNow("only the front-end opens streams"));
        }
        if self.phase != super::Phase::Running {
            return Err(CommandError::NotNow("the tree is not running"));
        }
        let id = spec.id;
        if id <= self.max_stream || self.streams.contains_key(&id) {
            return Err(CommandError::StreamExists(id));
        }
        let mut s = self.make_stream(spec, true).map_err(|source| CommandError::Filter {
            stream: id,
            node: self.name.clone(),
            source,
        })?;
        self.max_stream = id;
        let targets = s.targets.to_vec();
        let msg = ControlMsg::NewStream(s.spec.clone());
        let (ctx, out) = (
            Ctx {
                role: self.role,
                name: &self.name,
                parent: None,
                children: &self.children,
                awaited: &self.recovery.orphaned,
                together: self.send_together,
            },
            &mut self.out,
        );
        check_over(&mut s, &ctx, out);
        self.adopt_stream(s);
        self.control_to(targets, &msg);
        Ok(())
    }

    /// Keeps a stream made here; one with a program tag of its own has its frames
    /// recorded under it, one that chose a route of its own has its frames carried
    /// so (the driver tells the route).
    fn adopt_stream(&mut self, s: StreamState) {
        if s.spec.program != 0 {
            self.out.event(Event::StreamProgram { stream: s.spec.id, program: Some(s.spec.program) });
        }
        if s.spec.route != RouteChoice::Network {
            self.out.routes.push_back((s.spec.id, Some(s.spec.route)));
        }
        self.streams.insert(s.spec.id, s);
    }

    /// A comm node or back-end learns of a stream from its parent.
    pub(super) fn stream_from_parent(&mut self, spec: StreamSpec) {
        let id = spec.id;
        if self.streams.contains_key(&id) {
            // The parent took this node (back) into the stream after it rejoined.
            return self.readded_to_stream(id);
        }
        // An id seen before comes back when this node rejoins a stream it left.
        self.max_stream = self.max_stream.max(id);
        let reduce_here = self.role == Role::CommNode;
        match self.make_stream(spec, reduce_here) {
            Ok(s) => {
                let targets = s.targets.to_vec();
                let msg = ControlMsg::NewStream(s.spec.clone());
                self.adopt_stream(s);
                self.control_to(targets, &msg);
            }
            Err(e) => {
                let refused =
                    ControlMsg::StreamRefused { stream: id, node: self.name.clone(), message: e.to_string() };
                self.report_up(refused);
            }
        }
    }

    /// A node below (through child `c`) could not make a stream's filters: that child
    /// leaves the stream here, and the refusal goes up.
    pub(super) fn stream_refused(
        &mut self,
        c: usize,
        stream: u32,
        node: String,
        message: String,
        now: Instant,
    ) {
        let ctx = ctx!(self);
        if let Some(s) = self.streams.get_mut(&stream) {
            if s.members.contains(&c) {
                remove_member(s, c, &ctx, &mut self.out, now, false);
            }
        }
        if self.role != Role::FrontEnd {
            return self.report_up(ControlMsg::StreamRefused { stream, node, message });
        }
        self.out.event(Event::StreamRefused { stream, node, message });
        if let Some(s) = self.streams.get_mut(&stream) {
            // Over before the close, so the stream stays until the tool has seen its end.
            s.over = true;
            s.ready.clear();
            s.held.clear();
            self.out.event(Event::Readable { stream: Some(stream) });
        }
        self.begin_close(stream);
    }

    /// Front-end: the tool closes a stream.
    /// New parameters for stream `id`'s upward (or, with `down`, downstream) filter on
    /// this node, passed on to the stream's comm-node children once taken. The
    /// front-end's refusal is the tool's error; a comm node's is reported up, naming it.
    pub(super) fn set_stream_params(
        &mut self,
        id: u32,
        params: Vec<u8>,
        down: bool,
    ) -> Result<(), CommandError> {
        let Some(s) = self.streams.get_mut(&id) else { return Err(CommandError::UnknownStream(id)) };
        let (name, filter) = if down {
            (&s.spec.down.name, s.down_filter.as_mut())
        } else {
            (&s.spec.up.name, s.up_filter.as_mut())
        };
        // Only comm nodes run a downstream filter, and only a real one: the null
        // filter takes no parameters anywhere.
        let refused = match filter {
            Some(filter) => filter.set_params(&params).err(),
            None if down && name == "null" => Some("the stream has no downstream filter".to_owned()),
            None => None,
        };
        if let Some(detail) = refused {
            let source = treecast_filters::RegistryError::Params { name: name.clone(), detail };
            return Err(CommandError::Filter { stream: id, node: self.name.clone(), source });
        }
        let links: Vec<LinkId> = s
            .members
            .iter()
            .filter(|&&c| !self.children[c].is_backend)
            .filter_map(|&c| self.children[c].link)
            .collect();
        let msg = if down {
            ControlMsg::SetDownParams { stream: id, params }
        } else {
            ControlMsg::SetParams { stream: id, params }
        };
        for link in links {
            self.out.control(link, &msg);
        }
        Ok(())
    }

    /// [`ControlMsg::SetParams`] or [`ControlMsg::SetDownParams`] from the parent.
    pub(super) fn params_from_parent(&mut self, id: u32, params: Vec<u8>, down: bool) {
        if let Err(e) = self.set_stream_params(id, params, down) {
            // A filter's refusal names this node already.
            let message = match e {
                CommandError::Filter { .. } => e.to_string(),
                other => format!("{}: {other}", self.name),
            };
            self.report_up(ControlMsg::FilterError { stream: id, rank: u32::MAX, message });
        }
    }

    pub(super) fn close_stream_from_tool(&mut self, id: u32) -> Result<(), CommandError> {
        let Some(s) = self.streams.get_mut(&id) else { return Err(CommandError::UnknownStream(id)) };
        s.tool_done = true;
        self.begin_close(id);
        Ok(())
    }

    /// The parent closed a stream.
    pub(super) fn close_stream_from_parent(&mut self, id: u32) {
        if let Role::BackEnd { .. } = self.role {
            if let Some(s) = forget_stream(&mut self.streams, &mut self.out, id) {
                if s.blocked {
                    // A send waiting for credit learns the stream is gone.
                    self.out.event(Event::Writable { stream: id });
                }
                self.push_delivery(Delivery::StreamClosed(id));
            }
            return;
        }
        self.begin_close(id);
    }

    /// Stops a stream here and passes the close down behind what each child still has queued.
    fn begin_close(&mut self, id: u32) {
        let ctx = ctx!(self);
        let Some(s) = self.streams.get_mut(&id) else { return };
        if !s.closing {
            s.closing = true;
            s.held.clear();
            s.pending_up.clear();
            drop_waiting_down(s);
            if std::mem::take(&mut s.blocked) {
                // A send waiting for credit learns the stream is gone.
                self.out.event(Event::Writable { stream: id });
            }
            for c in s.members.clone() {
                if let Some(p) = s.part(c) {
                    p.close_pending = true;
                }
                drain_child(s, c, &ctx, &mut self.out);
            }
        }
        if s.finished() {
            forget_stream(&mut self.streams, &mut self.out, id);
        }
    }

    /// A data frame from the parent.
    pub(super) fn on_down_data(&mut self, frame: Frame, now: Instant) {
        let id = frame.header.stream;
        let direct = frame.header.flags & FLAG_DIRECT != 0;
        let Some(s) = self.streams.get_mut(&id) else {
            if id > self.max_stream {
                tracing::warn!(node = %self.name, "dropping a frame from the parent on unknown stream {id}");
            }
            return;
        };
        if let Err(over) = s.down_ledger.receive(frame.payload.len()) {
            let Some(parent) = self.parent else { return };
            let why = format!(
                "the parent sent beyond its window on stream {id} ({} frames, {} bytes outstanding)",
                over.packets, over.bytes
            );
            return self.drop_link(parent, why, now);
        }
        if !direct {
            s.requests += 1;
        }
        if let Role::BackEnd { .. } = self.role {
            return self.push_delivery(Delivery::Packet(frame));
        }
        self.route_down(frame);
    }

    /// Front-end: the tool sends a frame; back-end: the tool sends a frame up.
    pub(super) fn send_from_tool(&mut self, frame: Frame) -> Result<(), CommandError> {
        let id = frame.header.stream;
        match self.role {
            Role::CommNode => Err(CommandError::NotNow("a comm node has no tool")),
            Role::BackEnd { .. } => {
                // Until the new parent's welcome nothing goes up (see `ctx!`).
                let rejoining = self.recovery.rejoining.is_some();
                let parent = match self.parent {
                    _ if rejoining => None,
                    Some(p) => Some(p),
                    None => return Err(CommandError::ShutDown),
                };
                let Some(s) = self.streams.get_mut(&id) else { return Err(CommandError::UnknownStream(id)) };
                let stale = numbered(s) && s.sent_up < s.up_from;
                let Some(parent) = parent.filter(|_| !stale) else {
                    // The answer to a request whose wave went on without this back-end
                    // (it was sent before, or while, it rejoined a new parent).
                    s.sent_up += 1;
                    return Ok(());
                };
                if !s.up_budget.open() {
                    s.blocked = true;
                    return Err(CommandError::Blocked(frame));
                }
                s.up_budget.spend(frame.payload.len());
                s.sent_up += 1;
                self.out.send(parent, frame);
                Ok(())
            }
            Role::FrontEnd => {
                let direct = frame.header.flags & FLAG_DIRECT != 0;
                let rank = frame.header.rank;
                let Some(s) = self.streams.get_mut(&id) else { return Err(CommandError::UnknownStream(id)) };
                if s.closing {
                    return Err(CommandError::UnknownStream(id));
                }
                if direct && !s.spec.ranks.contains(rank) {
                    return Err(CommandError::NotAMember { stream: id, rank });
                }
                if s.down_ledger.receive(frame.payload.len()).is_err() {
                    s.blocked = true;
                    return Err(CommandError::Blocked(frame));
                }
                let none_linked = s.members.is_empty() && s.spec.ranks.intersects(&self.recovery.orphaned);
                if none_linked || !s.waiting_down.is_empty() {
                    // Counted as a request when it goes down (see `member_joined`).
                    s.waiting_down.push_back(frame);
                    return Ok(());
                }
                if !direct {
                    s.requests += 1;
                }
                self.route_down(frame);
                Ok(())
            }
        }
    }

    /// Applies the downstream filter and hands the frames to the children.
    fn route_down(&mut self, frame: Frame) {
        let id = frame.header.stream;
        let direct = (frame.header.flags & FLAG_DIRECT != 0).then_some(frame.header.rank);
        let ctx = ctx!(self);
        let Some(s) = self.streams.get_mut(&id) else { return };
        let seq = s.next_seq;
        s.next_seq += 1;
        let len = frame.payload.len();
        let target = match direct {
            Some(rank) => match s.members.iter().copied().find(|&c| ctx.children[c].ranks.contains(rank)) {
                Some(c) => Some(c),
                None => {
                    tracing::warn!(node = %ctx.name, "stream {id}: rank {rank} is not below this node; frame dropped");
                    s.down_ledger.consume(len);
                    return return_down_credit(s, &ctx, &mut self.out);
                }
            },
            None => None,
        };
        let frames = match (s.down_filter.as_mut(), direct) {
            (Some(f), None) => {
                // Each packet is reduced alone, as at the root, so an average stays a plain value.
                match f.apply(vec![frame], &FilterContext { stream: id, is_root: true }) {
                    Ok(frames) => frames,
                    Err(e) => {
                        let message = format!("{}: downstream filter: {e}", ctx.name);
                        ctx.report(
                            &mut self.out,
                            ControlMsg::FilterError { stream: id, rank: u32::MAX, message },
                        );
                        Vec::new()
                    }
                }
            }
            _ => vec![frame],
        };
        for f in frames {
            fan_out(s, seq, f, target, &ctx, &mut self.out);
        }
        s.in_node.push_back((seq, len));
        settle_down(s, &ctx, &mut self.out);
    }

    /// A data frame from child `c`.
    pub(super) fn on_up_data(&mut self, c: usize, frame: Frame, now: Instant) {
        let id = frame.header.stream;
        let rank = frame.header.rank;
        let ctx = ctx!(self);
        let Some(s) = self.streams.get_mut(&id) else {
            if id > self.max_stream {
                let message = format!("{}: packet from rank {rank} on unknown stream {id}", self.name);
                self.report_up(ControlMsg::FilterError { stream: id, rank, message });
            }
            return;
        };
        if s.closing {
            return;
        }
        let Some(part) = s.part(c) else {
            let message =
                format!("{}: rank {rank} sent on stream {id}, which it is not a member of", ctx.name);
            return ctx.report(&mut self.out, ControlMsg::FilterError { stream: id, rank, message });
        };
        if let Err(over) = part.up.receive(frame.payload.len()) {
            let Some(link) = ctx.link_of(c) else { return };
            let why = format!(
                "{} sent beyond its window on stream {id} ({} frames, {} bytes outstanding)",
                ctx.children[c].name, over.packets, over.bytes
            );
            return self.drop_link(link, why, now);
        }
        let waves = s.sync.push(c, frame, now);
        queue_waves(s, waves, &ctx);
        reduce(s, &ctx, &mut self.out);
    }

    /// Credit from a peer on `stream`.
    pub(super) fn on_credit(&mut self, from: LinkRole, stream: u32, grant: Grant) {
        let ctx = ctx!(self);
        let Some(s) = self.streams.get_mut(&stream) else { return };
        match from {
            LinkRole::Parent => {
                let reopened = s.up_budget.grant(grant);
                if let Role::BackEnd { .. } = ctx.role {
                    if reopened && s.blocked {
                        s.blocked = false;
                        self.out.event(Event::Writable { stream });
                    }
                } else {
                    reduce(s, &ctx, &mut self.out);
                }
            }
            LinkRole::Child(c) => {
                let Some(part) = s.part(c) else { return };
                part.down.grant(grant);
                if ctx.together(s).is_some() {
                    drain_together(s, &ctx, &mut self.out);
                } else {
                    drain_child(s, c, &ctx, &mut self.out);
                }
                settle_down(s, &ctx, &mut self.out);
                if s.finished() {
                    forget_stream(&mut self.streams, &mut self.out, stream);
                }
            }
            // Streams never cross between networks.
            LinkRole::Remote(_) => {}
        }
    }

    /// Releases time-out waves whose deadline passed.
    pub(super) fn streams_timeout(&mut self, now: Instant) {
        let ctx = ctx!(self);
        for s in self.streams.values_mut() {
            if s.next_deadline().is_some_and(|d| d <= now) {
                let waves = s.sync.poll(now);
                queue_waves(s, waves, &ctx);
                reduce(s, &ctx, &mut self.out);
            }
        }
    }

    /// Back-end: queues something for the tool.
    pub(super) fn push_delivery(&mut self, d: Delivery) {
        if self.deliveries.is_empty() {
            self.out.event(Event::Readable { stream: None });
        }
        self.deliveries.push_back(d);
    }

    /// Back-end: the tool read a packet of `stream`: the parent may send more.
    pub(super) fn delivered_at_backend(&mut self, stream: u32, len: usize) {
        let Some(parent) = self.parent else { return };
        let Some(s) = self.streams.get_mut(&stream) else { return };
        s.down_ledger.consume(len);
        if let Some(g) = s.down_ledger.take_grant() {
            self.out.credit(parent, stream, g);
        }
    }

    /// Front-end: the tool reads stream `id`.
    pub(super) fn deliver_to_tool(&mut self, id: u32) -> Option<Delivery> {
        let ctx = ctx!(self);
        let s = self.streams.get_mut(&id)?;
        if let Some(ready) = s.ready.pop_front() {
            let Some(f) = ready else { return Some(Delivery::NoAnswer(id)) };
            s.up_budget.grant(Grant { packets: 1, bytes: f.payload.len() as u64 });
            reduce(s, &ctx, &mut self.out);
            check_over(s, &ctx, &mut self.out);
            return Some(Delivery::Packet(f));
        }
        if s.over && !s.tool_done {
            s.tool_done = true;
            if s.finished() || !s.closing {
                forget_stream(&mut self.streams, &mut self.out, id);
            }
            return Some(Delivery::StreamClosed(id));
        }
        None
    }

    /// Child `c` joined while streams run: it takes part in those that reach its ranks,
    /// from the wave that answers the first request it will get; returns their ids.
    pub(super) fn member_joined(&mut self, c: usize) -> Vec<u32> {
        let ctx = ctx!(self);
        let Some(link) = self.children[c].link else { return Vec::new() };
        let ranks = self.children[c].ranks.clone();
        let mut announce = Vec::new();
        for s in self.streams.values_mut() {
            if s.closing || !s.spec.ranks.intersects(&ranks) || s.members.contains(&c) {
                continue;
            }
            let pos = s.members.partition_point(|&m| m < c);
            s.members.insert(pos, c);
            if s.parts.len() <= c {
                s.parts.resize_with(c + 1, || None);
            }
            s.parts[c] = Some(ChildPart {
                up: Ledger::new(s.spec.up_window),
                down: Budget::new(s.spec.down_window),
                queue: VecDeque::new(),
                close_pending: false,
            });
            s.sync.add_child_from(c, s.requests);
            // Waves of requests no member got, now never to form.
            queue_waves(s, Vec::new(), &ctx);
            reduce(s, &ctx, &mut self.out);
            s.rebuild_targets(&self.children);
            announce.push(ControlMsg::NewStream(s.spec.clone()));
        }
        announce.sort_by_key(|m| match m {
            ControlMsg::NewStream(spec) => spec.id,
            _ => 0,
        });
        let mut ids = Vec::new();
        for msg in announce {
            if let ControlMsg::NewStream(spec) = &msg {
                ids.push(spec.id);
            }
            self.out.control(link, &msg);
        }
        for &id in &ids {
            self.send_waiting_down(id);
        }
        ids
    }

    /// Front-end: a stream has a member again; what the tool sent while none was
    /// linked goes down now, behind the stream's announcement.
    fn send_waiting_down(&mut self, id: u32) {
        while let Some(s) = self.streams.get_mut(&id) {
            let Some(frame) = s.waiting_down.pop_front() else { return };
            if frame.header.flags & FLAG_DIRECT == 0 {
                s.requests += 1;
            }
            self.route_down(frame);
        }
    }

    /// The parent took this node back into stream `id` (after it rejoined, or after
    /// the sub-tree it lost came back): the windows toward the parent start afresh,
    /// and what answers requests sent before is dropped, since those waves went on
    /// without this node.
    fn readded_to_stream(&mut self, id: u32) {
        let ctx = ctx!(self);
        let Some(s) = self.streams.get_mut(&id) else { return };
        s.up_budget = Budget::new(s.spec.up_window);
        s.down_ledger = Ledger::new(s.spec.down_window);
        s.in_node.clear();
        s.pending_up.clear();
        s.handover.parent_changed();
        s.up_from = s.requests;
        s.detached_from = None;
        s.kept_after_detach = 0;
        if std::mem::take(&mut s.blocked) {
            self.out.event(Event::Writable { stream: id });
        }
        if ctx.role == Role::CommNode {
            reduce(s, &ctx, &mut self.out);
        }
    }

    /// This node was welcomed by its new parent: every stream starts afresh toward it
    /// (again for those the parent announces next).
    pub(super) fn streams_welcomed(&mut self) {
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            self.readded_to_stream(id);
        }
        // Collective operations held while there was no parent go on up now.
        self.collectives_welcomed();
    }

    /// This node lost its parent and looks for a new one: nothing goes up meanwhile.
    pub(super) fn streams_orphaned(&mut self) {
        for s in self.streams.values_mut() {
            s.pending_up.clear();
            s.handover.parent_changed();
        }
    }

    /// Front-end: streams whose every member is gone end once no lost rank of
    /// theirs may rejoin any more.
    pub(super) fn recheck_streams_over(&mut self) {
        let ctx = ctx!(self);
        for s in self.streams.values_mut() {
            check_over(s, &ctx, &mut self.out);
        }
    }

    /// Child `c` is gone or lost ranks: it leaves the streams it no longer reaches.
    pub(super) fn members_left(&mut self, c: usize, now: Instant) {
        if self.children[c].is_backend {
            self.peer_child_gone(c);
        }
        self.members_left_telling(c, now, true);
    }

    /// As [`Node::members_left`]; a child still linked is told it left a stream only
    /// with `tell` (not when its ranks are awaited back: it keeps the stream for them).
    pub(super) fn members_left_telling(&mut self, c: usize, now: Instant, tell: bool) {
        let ctx = ctx!(self);
        let child = &self.children[c];
        let gone = child.state == ChildState::Gone || child.link.is_none();
        let mut finished = Vec::new();
        for (&id, s) in self.streams.iter_mut() {
            if !s.members.contains(&c) || (!gone && child.ranks.intersects(&s.spec.ranks)) {
                continue;
            }
            remove_member(s, c, &ctx, &mut self.out, now, tell && !gone);
            if s.finished() {
                finished.push(id);
            }
        }
        for id in finished {
            forget_stream(&mut self.streams, &mut self.out, id);
        }
        self.collectives_recheck();
    }
}
