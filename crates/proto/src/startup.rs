//! Membership: the plan a node starts its children from, their joins, leaves and
//! failures, and the report a node makes to its parent when its sub-tree is up.
//!
//! Start-up, per child: *launching* (the driver starts its process, or waits for a
//! back-end started by someone else) → *connected* (its link is up; a comm node is
//! sent its own plan) → *joined* (it reported the ranks it reaches). A child that
//! exits, misses its deadline, or reports a failure is given up on: the whole
//! start-up fails, or with missing children allowed its ranks are reported lost. Once
//! every child has joined or been given up on, the node joins its parent (the
//! front-end reports the tree ready). The same join and leave messages keep
//! membership up to date while streams run.

pub(crate) mod state;

use std::sync::Arc;
use std::time::{Duration, Instant};

use treecast_topology::Topology;
use treecast_wire::{AttachPoint, ControlMsg, GroupPlace, LaunchPlan, MemberPlan, RankSet, SpawnOrder};

use super::{
    control_frame, Destination, Event, LinkId, LinkRole, LivenessLimits, Node, Phase, Role, Transmit,
};
use state::{Child, ChildLaunch, ChildState, HeldLoss, Startup};

/// Longest a report of departed or lost ranks waits for the data held for up credit
/// on their streams while none of that data goes up (see [`Node::report_up`]).
pub(crate) const REPORT_HOLD: Duration = Duration::from_secs(1);

/// Most back-ends one node starts for one spawn order.
pub const MAX_SPAWN: u32 = 65_536;

/// A comm node's name in messages: `comm node n3 (node 5)` (host, then node id).
pub(crate) fn commnode_name(host: &str, node_id: u32) -> String {
    format!("comm node {host} (node {node_id})")
}

/// A back-end's name in messages: `back-end rank 7 on n3 (node 12)`.
pub(crate) fn backend_name(rank: u32, host: &str, node_id: u32) -> String {
    format!("back-end rank {rank} on {host} (node {node_id})")
}

fn ms(v: u32) -> Duration {
    Duration::from_millis(u64::from(v))
}

/// Depth of the sub-tree rooted at `id` (0 for a leaf).
fn subtree_depth(topo: &Topology, id: usize) -> usize {
    let base = topo.node_depth(id);
    (id..id + topo.subtree_len(id)).map(|n| topo.node_depth(n) - base).max().unwrap_or(0)
}

/// The plan of a comm-node child: the parent's, for its own sub-tree.
fn child_plan(plan: &LaunchPlan, topo: &Topology, c: usize) -> ControlMsg {
    let mut sub = plan.clone();
    sub.node_id = plan.node_id + c as u32;
    sub.first_rank = plan.first_rank + topo.first_rank(c);
    sub.topology = topo.subtree(c).to_mrnet();
    sub.depth = plan.depth + 1;
    ControlMsg::Plan(Box::new(sub))
}

/// The plan of a back-end child: its rank and group, and the limits of `plan`.
fn member_plan(plan: &LaunchPlan, launch: &ChildLaunch) -> ControlMsg {
    let spawned = launch.spawned.as_deref();
    ControlMsg::MemberPlan(Box::new(MemberPlan {
        node_id: launch.node_id,
        rank: launch.first_rank,
        size: spawned.map_or(plan.total_backends, |o| o.size),
        group: spawned.map(|o| GroupPlace {
            group: o.group,
            rank: launch.first_rank.saturating_sub(o.group_first),
            size: o.group_size,
        }),
        heartbeat_ms: plan.heartbeat_ms,
        dead_after_ms: if plan.heartbeat_ms == 0 { 0 } else { plan.dead_after_ms },
        rejoin_ms: plan.rejoin_ms,
        clock: plan.clock.clone(),
        zero_copy_min: plan.zero_copy_min,
        stripe_stall_ms: plan.stripe_stall_ms,
    }))
}

impl Node {
    /// Back-end: the size from which its member plan has it send frames to a peer on
    /// its host as memory files (`None`: never, or no plan yet). The driver hands it
    /// to its route when [`crate::Event::Placed`] comes out.
    pub fn zero_copy_min(&self) -> Option<usize> {
        self.start.zero_copy_min
    }

    /// Back-end: the stall limit of its striped links, from its member plan (`None`:
    /// the route's default, or no plan yet). The driver hands it to its route when
    /// [`crate::Event::Placed`] comes out.
    pub fn stripe_stall(&self) -> Option<std::time::Duration> {
        self.start.stripe_stall
    }

    /// The parent link is up: the node waits for its plan (a comm node's launch plan,
    /// a back-end's member plan), which its parent sends first.
    pub(super) fn parent_up(&mut self, link: LinkId) {
        if self.recovery.rejoining.is_some() && self.parent.is_none() {
            return self.rejoin_parent_up(link);
        }
        if self.parent.is_some() || self.phase != Phase::Idle || self.role == Role::FrontEnd {
            self.out.event(Event::CloseLink { link, reason: "this node already has a parent".into() });
            return;
        }
        self.links.insert(link, LinkRole::Parent);
        self.parent = Some(link);
        self.phase = Phase::AwaitingPlan;
    }

    /// A back-end's plan arrived: it takes its rank, size and limits from it and
    /// joins (unless its announcement joined it already).
    fn member_start(&mut self, link: LinkId, plan: MemberPlan, now: Instant) {
        if plan.node_id != self.node_id {
            let why = format!("the member plan is for node {}, this is node {}", plan.node_id, self.node_id);
            return self.drop_link(link, why, now);
        }
        self.role = Role::BackEnd { rank: plan.rank, size: plan.size };
        self.name = format!("back-end rank {}", plan.rank);
        self.liveness.configure(LivenessLimits::from_ms(plan.heartbeat_ms, plan.dead_after_ms), now);
        self.set_rejoin(Some(ms(plan.rejoin_ms)));
        self.apply_clock_plan(&plan.clock);
        self.start.zero_copy_min = plan.zero_copy_min();
        self.start.stripe_stall = plan.stripe_stall();
        if !self.start.announced {
            self.out.control(link, &ControlMsg::Join { ranks: RankSet::single(plan.rank), commnodes: 0 });
        }
        self.phase = Phase::Running;
        self.out.event(Event::Placed { rank: plan.rank, size: plan.size, group: plan.group });
    }

    /// Starts the sub-tree `plan` describes: the children to launch go to the driver.
    pub(super) fn start(&mut self, plan: LaunchPlan, now: Instant) {
        let topo = match Topology::parse(&plan.topology) {
            Ok(t) => t,
            Err(e) => return self.startup_failed(format!("{}: bad sub-tree in the plan: {e}", self.name)),
        };
        let own_host = topo.node(topo.root()).host.clone();
        self.liveness.configure(LivenessLimits::from_ms(plan.heartbeat_ms, plan.dead_after_ms), now);
        self.set_rejoin(Some(ms(plan.rejoin_ms)));
        self.apply_clock_plan(&plan.clock);
        if self.role == Role::CommNode {
            self.name = commnode_name(&own_host, self.node_id);
            self.depth = plan.depth;
            // The front-end's tool loaded its own plug-ins; a comm node loads them now,
            // before any stream can name them.
            for path in &plan.filters {
                let loaded = match &self.plugin_loader {
                    Some(load) => load(super::PluginSource::Path(path), &mut self.registry),
                    None => Err("this node cannot load plug-in filters".to_owned()),
                };
                if let Err(why) = loaded {
                    return self.startup_failed(format!("{}: plug-in filter {path}: {why}", self.name));
                }
            }
        }
        let limit = ms(plan.startup_timeout_ms);
        let attach = (plan.attach_ms > 0).then(|| ms(plan.attach_ms));
        let mut launches = Vec::new();
        for &c in &topo.node(topo.root()).children {
            let node = topo.node(c);
            let is_backend = topo.is_leaf(c);
            let first_rank = plan.first_rank + topo.first_rank(c);
            let backends = topo.subtree_backends(c) as u32;
            let node_id = plan.node_id + c as u32;
            let name = if is_backend {
                backend_name(first_rank, &node.host, node_id)
            } else {
                commnode_name(&node.host, node_id)
            };
            let attach_slot = is_backend && attach.is_some();
            let depth = subtree_depth(&topo, c).max(1) as u32;
            let launch = ChildLaunch {
                node_id,
                name: name.clone(),
                host: node.host.clone(),
                is_backend,
                first_rank,
                backends,
                attach: attach_slot,
                spawned: None,
            };
            self.children.push(super::startup::Child {
                node_id: launch.node_id,
                name,
                is_backend,
                expected: RankSet::range(first_rank, backends),
                ranks: RankSet::new(),
                commnodes: 0,
                link: None,
                state: ChildState::Launching,
                attach: attach_slot,
                plan: Some(match is_backend {
                    true => member_plan(&plan, &launch),
                    false => child_plan(&plan, &topo, c),
                }),
                detail: None,
                deadline: (!attach_slot).then_some(now + limit),
                late: "did not connect",
                // Each level below a comm node may take `limit` to connect and then its
                // own join limit: with two limits per level, a node's own limit for a
                // child that does not start ends before its parent's limit for it, so
                // only that child is given up on, not the whole sub-tree around it. A
                // back-end joins as it connects.
                join_limit: if is_backend { limit } else { limit * (2 * depth) } + attach.unwrap_or_default(),
                points: None,
                held: None,
                rejoiner: false,
                early_rejoin: None,
            });
            launches.push(launch);
        }
        let plan = Arc::new(plan);
        self.start.plan = Some(plan.clone());
        self.start.own_host = own_host.clone();
        self.start.current =
            Some(Startup { missing: Vec::new(), attach, own_points: None, points_sent: false });
        self.phase = Phase::Starting;
        self.refresh_deadline();
        self.out.event(Event::StartChildren { plan, own_host, children: launches });
        if self.children.is_empty() {
            self.maybe_ready(now);
        }
    }

    /// A child proved its node id: it is linked.
    pub(super) fn child_up(&mut self, link: LinkId, node_id: u32, now: Instant) {
        let found = self
            .children
            .iter()
            .position(|c| c.node_id == node_id && c.state == ChildState::Launching && c.link.is_none());
        if found.is_none() && self.orphan_connected(link, node_id, now) {
            return;
        }
        let Some(c) = found.filter(|_| matches!(self.phase, Phase::Starting | Phase::Running)) else {
            let reason =
                format!("a link claims node id {node_id}: not an expected child, or already connected");
            tracing::warn!(node = %self.name, "{reason}");
            self.out.event(Event::CloseLink { link, reason });
            return;
        };
        self.links.insert(link, LinkRole::Child(c));
        let child = &mut self.children[c];
        child.link = Some(link);
        child.state = ChildState::Connected;
        child.deadline = Some(now + child.join_limit);
        child.late = "did not report ready in time";
        if let Some(plan) = child.plan.take() {
            self.out.control(link, &plan);
        }
        self.refresh_deadline();
    }

    /// The driver says how a child's process ended (or why it could not start).
    pub(super) fn child_exited(&mut self, node_id: u32, detail: String, now: Instant) {
        let Some(c) = self.children.iter().position(|c| c.node_id == node_id) else { return };
        self.children[c].detail = Some(detail);
        if self.children[c].state == ChildState::Launching {
            let reason = self.children[c].failure("exited before connecting");
            self.fail_child(c, reason, now);
        } else if self.children[c].held.is_some() {
            self.release_loss(c, now);
        }
    }

    /// Reports the loss held for child `c`, with its process news if it came.
    fn release_loss(&mut self, c: usize, now: Instant) {
        let Some(held) = self.children[c].held.take() else { return };
        self.refresh_loss_deadline();
        if held.startup {
            let reason = self.children[c].failure(&format!("failed during start-up: {}", held.why));
            return self.fail_child(c, reason, now);
        }
        let child = &self.children[c];
        let reason = child.with_detail(held.why);
        self.out.event(Event::AbandonChild { node_id: child.node_id });
        if self.phase != Phase::Over {
            self.report_up(ControlMsg::Leave { ranks: held.ranks, reason, graceful: false });
        }
    }

    /// Reports the held losses whose process news did not come in time.
    pub(super) fn losses_timeout(&mut self, now: Instant) {
        if self.start.loss_deadline.map_or(true, |d| d > now) {
            return;
        }
        for c in 0..self.children.len() {
            if self.children[c].held.as_ref().is_some_and(|h| h.until <= now) {
                self.release_loss(c, now);
            }
        }
    }

    fn refresh_loss_deadline(&mut self) {
        self.start.loss_deadline =
            self.children.iter().filter_map(|c| c.held.as_ref().map(|h| h.until)).min();
    }

    /// The driver could not start a child at all.
    pub(super) fn child_not_started(&mut self, node_id: u32, reason: &str, now: Instant) {
        let Some(c) = self.children.iter().position(|c| c.node_id == node_id) else { return };
        if self.children[c].state == ChildState::Launching {
            let reason = self.children[c].failure(&format!("could not be started: {reason}"));
            self.fail_child(c, reason, now);
        }
    }

    /// Attach mode: the driver's addresses for this node's own back-end slots.
    pub(super) fn own_attach_points(&mut self, points: Vec<AttachPoint>, now: Instant) {
        if let Some(s) = self.start.current.as_mut() {
            s.own_points = Some(points);
            self.maybe_send_points(now);
        } else if self.phase == Phase::Running {
            self.points_up(points);
        }
    }

    /// Where back-ends adopted while the tree runs connect (`Network::accept`): up
    /// to the front-end, whose tool writes them where the processes look.
    fn points_up(&mut self, points: Vec<AttachPoint>) {
        match self.parent {
            Some(parent) => self.out.control(parent, &ControlMsg::AttachPoints { points }),
            None => self.out.event(Event::AttachPoints(points)),
        }
    }

    /// A control message from the parent.
    pub(super) fn on_parent_control(&mut self, link: LinkId, msg: ControlMsg, now: Instant) {
        match msg {
            ControlMsg::Plan(plan) if self.phase == Phase::AwaitingPlan && self.role == Role::CommNode => {
                if plan.node_id != self.node_id {
                    let why = format!("the plan is for node {}, this is node {}", plan.node_id, self.node_id);
                    return self.drop_link(link, why, now);
                }
                self.start(*plan, now);
            }
            ControlMsg::MemberPlan(plan)
                if self.phase == Phase::AwaitingPlan && matches!(self.role, Role::BackEnd { .. }) =>
            {
                self.member_start(link, *plan, now)
            }
            ControlMsg::NewStream(spec) => self.stream_from_parent(spec),
            ControlMsg::SetParams { stream, params } if self.role == Role::CommNode => {
                self.params_from_parent(stream, params, false)
            }
            ControlMsg::SetDownParams { stream, params } if self.role == Role::CommNode => {
                self.params_from_parent(stream, params, true)
            }
            msg @ ControlMsg::LoadFilter { .. } if self.role == Role::CommNode => {
                self.load_shipped_filter(msg)
            }
            ControlMsg::CloseStream { id } => self.close_stream_from_parent(id),
            ControlMsg::Shutdown => self.shut_down(super::EndReason::ShutDown),
            ControlMsg::Spawn(order) if self.phase == Phase::Running => self.spawn_order(order, now),
            ControlMsg::Stop { ranks, reason } if self.phase == Phase::Running => {
                self.stop_ranks(&ranks, &reason, now)
            }
            msg @ ControlMsg::SpawnReply { .. } => self.spawn_reply(msg),
            msg @ (ControlMsg::MonitorStart { .. } | ControlMsg::MonitorStop) => self.monitor_order(msg),
            ControlMsg::MonitorCollect { id, mode, limit_ms } => {
                self.monitor_collect(id, mode, Duration::from_millis(u64::from(limit_ms)), now)
            }
            other => {
                tracing::warn!(node = %self.name, "ignoring unexpected control message from the parent: {other:?}")
            }
        }
    }

    /// A control message from child `c`.
    pub(super) fn on_child_control(&mut self, c: usize, msg: ControlMsg, now: Instant) {
        match msg {
            ControlMsg::Join { ranks, commnodes } => self.child_joined(c, ranks, commnodes, now),
            ControlMsg::Leave { ranks, reason, graceful } => {
                self.child_left(c, &ranks, reason, graceful, now)
            }
            ControlMsg::LaunchFailed { message } if self.phase == Phase::Starting => {
                self.fail_child(c, message, now)
            }
            ControlMsg::AttachPoints { points } if self.phase == Phase::Starting => {
                self.children[c].points = Some(points);
                self.maybe_send_points(now);
            }
            ControlMsg::AttachPoints { points } if self.phase == Phase::Running => self.points_up(points),
            ControlMsg::FilterError { stream, rank, message } => {
                self.report_up(ControlMsg::FilterError { stream, rank, message });
            }
            ControlMsg::StreamRefused { stream, node, message } => {
                self.stream_refused(c, stream, node, message, now)
            }
            ControlMsg::FilterState { stream, state } => self.child_filter_state(c, stream, state),
            msg @ ControlMsg::FilterRefused { .. } => self.report_up(msg),
            ControlMsg::MonitorReport { id, json } => self.monitor_answer(c, id, &json, now),
            ControlMsg::SpawnRequest { id, rank, n, command } => {
                // A child asks only for the ranks behind it.
                if !self.children[c].ranks.contains(rank) {
                    let why = format!(
                        "{} asked for a spawn as rank {rank}, which is not behind it",
                        self.children[c].name
                    );
                    tracing::warn!(node = %self.name, "{why}");
                    return;
                }
                match self.parent {
                    Some(parent) => {
                        self.out.control(parent, &ControlMsg::SpawnRequest { id, rank, n, command })
                    }
                    None => self.out.event(Event::SpawnRequested { id, rank, n, command }),
                }
            }
            other => {
                tracing::warn!(node = %self.name, "ignoring unexpected control message from below: {other:?}")
            }
        }
    }

    /// Sends a report to the parent; the front-end turns it into an event.
    pub(super) fn report_up(&mut self, msg: ControlMsg) {
        match (self.role, self.parent) {
            (Role::FrontEnd, _) => match msg {
                ControlMsg::FilterError { stream, rank, message } => {
                    self.out.event(Event::FilterError { stream, rank, message })
                }
                ControlMsg::Leave { ranks, reason, graceful } => {
                    if ranks.intersects(&self.recovery.orphaned) {
                        self.recovery.orphaned = self.recovery.orphaned.difference(&ranks);
                        self.recheck_streams_over();
                    }
                    let new = if graceful { ranks.clone() } else { self.lost_new(&ranks, &reason) };
                    if new.is_empty() {
                        return;
                    }
                    let e = if graceful {
                        Event::RanksLeft { ranks: new, reason }
                    } else {
                        Event::RanksLost { ranks: new, reason }
                    };
                    self.out.event(e);
                }
                ControlMsg::Orphaned { node, ranks, reason } => {
                    self.recovery.orphaned.union_with(&ranks);
                    self.out.event(Event::NodeLost { node, ranks, reason });
                }
                ControlMsg::Rejoined { ranks, parent, .. } => {
                    let back = ranks.intersection(&self.recovery.orphaned);
                    self.recovery.orphaned = self.recovery.orphaned.difference(&ranks);
                    if !back.is_empty() {
                        self.out.event(Event::RanksRejoined { ranks: back, parent });
                    }
                }
                ControlMsg::FilterRefused { sha256, node, reason } => {
                    self.filter_refused(super::FilterRefusal { sha256, node, reason })
                }
                other => tracing::debug!("front-end: nothing to report for {other:?}"),
            },
            (_, Some(parent)) => {
                // A departure or loss waits for the data its ranks' streams hold here
                // for up credit (while that data moves, see REPORT_HOLD): behind it,
                // that data would reach a parent that may have ended the stream.
                // Reports stay in order.
                let ranks = match &msg {
                    ControlMsg::Leave { ranks, .. } | ControlMsg::Orphaned { ranks, .. } => {
                        Some(ranks.clone())
                    }
                    _ => None,
                };
                let waits = ranks.as_ref().is_some_and(|r| self.data_waiting_up(r));
                if !self.recovery.reports_after_data.is_empty() || waits {
                    if let Some(r) = &ranks {
                        self.hold_report_behind_data(r);
                    }
                    self.recovery.reports_after_data.push_back(msg);
                } else {
                    self.out.control(parent, &msg);
                }
            }
            (_, None) => {}
        }
    }

    /// True while a stream of one of `ranks` holds reduced data for up credit.
    fn data_waiting_up(&self, ranks: &RankSet) -> bool {
        self.streams.values().any(|s| s.spec.ranks.intersects(ranks) && s.data_waiting_up())
    }

    /// Notes, for each stream of `ranks` holding data for up credit, how far it must
    /// have sent up for that data to be gone: the held reports wait for it.
    fn hold_report_behind_data(&mut self, ranks: &RankSet) {
        for s in self.streams.values().filter(|s| s.spec.ranks.intersects(ranks) && s.data_waiting_up()) {
            let (id, until) = (s.spec.id, s.up_mark());
            let marks = &mut self.recovery.reports_wait_for;
            match marks.iter_mut().find(|(stream, _)| *stream == id) {
                Some(mark) => mark.1 = mark.1.max(until),
                None => marks.push((id, until)),
            }
        }
    }

    /// Sends the reports held back by [`Node::report_up`] once the data before them
    /// has gone up, or once none of it went up for [`REPORT_HOLD`]: a tool that stops
    /// reading one stream must not keep another waiting for a loss for ever, while one
    /// that reads slowly still gets every packet before the loss.
    pub(super) fn release_reports_after_data(&mut self, now: Instant) {
        if self.recovery.reports_after_data.is_empty() {
            return;
        }
        // Only the streams whose data before the reports still waits: one that went
        // past its mark may keep moving without holding them any longer.
        let marks = &self.recovery.reports_wait_for;
        let ahead = marks.iter().filter_map(|(id, mark)| self.streams.get(id).filter(|s| !s.passed(*mark)));
        // Called on every frame while reports wait: one pass, nothing allocated.
        let (waiting, seen) = ahead
            .filter(|s| s.data_waiting_up())
            .fold((false, 0u64), |(_, sum), s| (true, sum.wrapping_add(s.went_up).wrapping_add(s.waves_up)));
        if waiting {
            let r = &mut self.recovery;
            if r.reports_held_until.is_none() || seen != r.reports_seen_up {
                r.reports_seen_up = seen;
                r.reports_held_until = Some(now + REPORT_HOLD);
            }
            if r.reports_held_until.is_some_and(|until| now < until) {
                return;
            }
        }
        let Some(parent) = self.parent.filter(|_| self.recovery.rejoining.is_none()) else { return };
        while let Some(msg) = self.recovery.reports_after_data.pop_front() {
            self.out.control(parent, &msg);
        }
        self.recovery.reports_wait_for.clear();
        self.recovery.reports_held_until = None;
    }

    /// Records lost ranks at the front-end; returns those not known before.
    fn lost_new(&mut self, ranks: &RankSet, reason: &str) -> RankSet {
        let new = ranks.difference(self.lost.ranks());
        self.lost.add(ranks, reason);
        new
    }

    fn child_joined(&mut self, c: usize, ranks: RankSet, commnodes: u32, now: Instant) {
        let allow_missing = self.allow_missing();
        let child = &self.children[c];
        if child.state == ChildState::Joined && self.phase == Phase::Running {
            return self.child_grew(c, ranks, commnodes);
        }
        if child.state != ChildState::Connected {
            tracing::warn!(node = %self.name, "{} joined in state {:?}; ignored", child.name, child.state);
            return;
        }
        let extra = ranks.difference(&child.expected);
        if !extra.is_empty() || (ranks != child.expected && !allow_missing) {
            let why = format!("{} reported ranks {ranks} but was given {}", child.name, child.expected);
            return self.fail_child(c, why, now);
        }
        let silent = child.expected.difference(&ranks);
        let name = child.name.clone();
        if let (false, Some(s)) = (silent.is_empty(), self.start.current.as_mut()) {
            s.missing.push((silent, format!("{name} did not start them")));
        }
        let child = &mut self.children[c];
        child.ranks = ranks;
        child.commnodes = commnodes;
        child.state = ChildState::Joined;
        child.deadline = None;
        if self.phase == Phase::Running {
            // A child adopted while the tree runs: its ranks take part from now on.
            self.member_joined(c);
            let ranks = self.children[c].ranks.clone();
            self.report_joined(ranks, commnodes);
        }
        if self.recovery.rejoin.is_some() {
            self.send_fallback(c);
        }
        self.clock_child_joined(c, now);
        self.refresh_deadline();
        self.maybe_ready(now);
    }

    /// A joined child reaches more ranks (a node below it adopted a child).
    fn child_grew(&mut self, c: usize, ranks: RankSet, commnodes: u32) {
        let child = &mut self.children[c];
        let new = ranks.difference(&child.ranks);
        if new.is_empty() {
            return;
        }
        child.ranks.union_with(&new);
        child.expected.union_with(&new);
        child.commnodes += commnodes;
        self.member_joined(c);
        self.report_joined(new, commnodes);
    }

    /// Ranks joined while the tree runs: the parent is told, the front-end's tool too.
    fn report_joined(&mut self, ranks: RankSet, commnodes: u32) {
        match self.parent {
            Some(parent) => self.out.control(parent, &ControlMsg::Join { ranks, commnodes }),
            None if self.role == Role::FrontEnd => self.out.event(Event::RanksJoined { ranks }),
            None => {}
        }
    }

    /// Takes new children while the tree runs: the driver starts them like the others.
    pub(super) fn adopt(
        &mut self,
        launches: Vec<ChildLaunch>,
        now: Instant,
    ) -> Result<(), super::CommandError> {
        if self.phase != Phase::Running || matches!(self.role, Role::BackEnd { .. }) {
            return Err(super::CommandError::NotNow("only a running front-end or comm node adopts children"));
        }
        if launches.iter().any(|l| !l.is_backend) {
            return Err(super::CommandError::NotNow("only back-ends are adopted while the tree runs"));
        }
        if launches.iter().any(|l| self.children.iter().any(|c| c.node_id == l.node_id && c.alive())) {
            return Err(super::CommandError::NotNow("a child with this node id exists"));
        }
        let Some(plan) = self.start.plan.clone() else {
            return Err(super::CommandError::NotNow("this node has no plan to start children with"));
        };
        let limit = ms(plan.startup_timeout_ms);
        for launch in &launches {
            self.children.push(Child {
                node_id: launch.node_id,
                name: launch.name.clone(),
                is_backend: true,
                expected: RankSet::range(launch.first_rank, launch.backends),
                ranks: RankSet::new(),
                commnodes: 0,
                link: None,
                state: ChildState::Launching,
                attach: launch.attach,
                plan: Some(member_plan(&plan, launch)),
                detail: None,
                deadline: Some(now + limit),
                late: "did not connect",
                join_limit: limit,
                points: None,
                held: None,
                rejoiner: false,
                early_rejoin: None,
            });
        }
        self.refresh_deadline();
        let own_host = self.start.own_host.clone();
        self.out.event(Event::StartChildren { plan, own_host, children: launches });
        Ok(())
    }

    /// A spawn order: started here when this node is its target, else passed on to
    /// the child whose sub-tree holds the target (node ids are pre-order, so that is
    /// the comm-node child with the highest id not above it).
    pub(super) fn spawn_order(&mut self, order: SpawnOrder, now: Instant) {
        let ranks = RankSet::range(order.first_rank, order.count);
        let fits = order.count <= MAX_SPAWN
            && order.first_rank.checked_add(order.count).is_some()
            && order.first_node_id.checked_add(order.count).is_some();
        if !fits {
            let reason = format!(
                "{}: a spawn of {} from rank {} and node id {} does not fit (at most {MAX_SPAWN} per node)",
                self.name, order.count, order.first_rank, order.first_node_id
            );
            return self.report_up(ControlMsg::Leave { ranks, reason, graceful: false });
        }
        if order.target == self.node_id {
            let order = Arc::new(order);
            // Another host's processes go through this node's launcher (ssh, Slurm).
            let host = if order.host.is_empty() { self.start.own_host.clone() } else { order.host.clone() };
            let launches = (0..order.count)
                .map(|i| {
                    let (node_id, rank) = (order.first_node_id + i, order.first_rank + i);
                    ChildLaunch {
                        node_id,
                        name: backend_name(rank, &host, node_id),
                        host: host.clone(),
                        is_backend: true,
                        first_rank: rank,
                        backends: 1,
                        attach: order.attach,
                        spawned: Some(order.clone()),
                    }
                })
                .collect();
            if let Err(e) = self.adopt(launches, now) {
                let reason = format!("{}: cannot start spawned back-ends: {e}", self.name);
                self.report_up(ControlMsg::Leave { ranks, reason, graceful: false });
            }
            return;
        }
        let via = self
            .children
            .iter()
            .filter(|c| !c.is_backend && c.state == ChildState::Joined && c.node_id <= order.target)
            .max_by_key(|c| c.node_id)
            .and_then(|c| c.link);
        match via {
            Some(link) => self.out.control(link, &ControlMsg::Spawn(order)),
            None => {
                let reason = format!("{}: node {} is not reachable from here", self.name, order.target);
                self.report_up(ControlMsg::Leave { ranks, reason, graceful: false });
            }
        }
    }

    /// The joined child whose sub-tree holds `rank`.
    pub(super) fn child_reaching(&self, rank: u32) -> Option<usize> {
        self.children.iter().position(|c| c.state == ChildState::Joined && c.ranks.contains(rank))
    }

    /// The answer to a back-end's spawn request: down towards its rank, or, at that
    /// back-end, to its tool.
    pub(super) fn spawn_reply(&mut self, msg: ControlMsg) {
        let ControlMsg::SpawnReply { id, rank, group, ranks, error } = msg else { return };
        if let Role::BackEnd { rank: own, .. } = self.role {
            if own == rank {
                self.out.event(Event::SpawnReplied { id, group, ranks, error });
            }
            return;
        }
        match self.child_reaching(rank).and_then(|c| self.children[c].link) {
            Some(link) => self.out.control(link, &ControlMsg::SpawnReply { id, rank, group, ranks, error }),
            None => {
                tracing::debug!(node = %self.name, "a spawn reply for rank {rank}, which is gone: dropped")
            }
        }
    }

    /// Stops the back-ends among `ranks` that are children here and passes the
    /// others on towards theirs; each stopped one leaves gracefully.
    pub(super) fn stop_ranks(&mut self, ranks: &RankSet, reason: &str, now: Instant) {
        tracing::debug!(node = %self.name, "stopping ranks {ranks}: {reason}");
        // Ranks awaited back reach no one now: they are stopped once they rejoin.
        let orphaned = self.hold_stop(ranks, reason);
        // Ranks no child claims yet (spawned below, not joined): every comm-node
        // child is asked, and the one that started them stops them.
        let mut unclaimed = ranks.difference(&orphaned);
        for child in self.children.iter().filter(|c| c.state != ChildState::Gone) {
            unclaimed = unclaimed.difference(&child.expected).difference(&child.ranks);
        }
        for c in 0..self.children.len() {
            let child = &self.children[c];
            if child.state == ChildState::Gone {
                continue;
            }
            let mut theirs = child.expected.clone();
            theirs.union_with(&child.ranks);
            let mut mine = ranks.intersection(&theirs);
            if child.is_backend {
                if !mine.is_empty() {
                    self.retire(c, now);
                    self.members_left(c, now);
                    self.report_up(ControlMsg::Leave {
                        ranks: mine,
                        reason: reason.to_owned(),
                        graceful: true,
                    });
                }
                continue;
            }
            mine.union_with(&unclaimed);
            if let (false, Some(link)) = (mine.is_empty(), child.link) {
                self.out.control(link, &ControlMsg::Stop { ranks: mine, reason: reason.to_owned() });
            }
        }
        self.refresh_deadline();
    }

    fn allow_missing(&self) -> bool {
        self.start.plan.as_ref().is_some_and(|p| p.allow_missing)
    }

    fn child_left(&mut self, c: usize, ranks: &RankSet, reason: String, graceful: bool, now: Instant) {
        let child = &mut self.children[c];
        let unknown = ranks.difference(&child.expected);
        if !unknown.is_empty() && self.phase == Phase::Running {
            // Ranks adopted below that never joined: whoever asked for them hears of it.
            self.report_up(ControlMsg::Leave { ranks: unknown, reason: reason.clone(), graceful });
        }
        let child = &mut self.children[c];
        let ranks = ranks.intersection(&child.expected.clone());
        if ranks.is_empty() {
            return;
        }
        if child.state != ChildState::Joined {
            // A comm node reports what it could not start before it joins.
            child.expected = child.expected.difference(&ranks);
            if let Some(s) = self.start.current.as_mut() {
                s.missing.push((ranks, reason));
            }
            return;
        }
        child.ranks = child.ranks.difference(&ranks);
        child.expected = child.expected.difference(&ranks);
        // Waves it completes go up before the Leave that may take this node out of them.
        self.members_left(c, now);
        self.report_up(ControlMsg::Leave { ranks, reason, graceful });
    }

    /// A child's link closed (`by_peer`), or this node dropped it.
    pub(super) fn child_gone(&mut self, c: usize, why: String, now: Instant, by_peer: bool) {
        self.monitor_child_gone(c, now);
        match (self.phase.clone(), self.children[c].state) {
            (_, ChildState::Gone) | (Phase::Over, _) => {}
            (Phase::Starting, _) => {
                let child = &mut self.children[c];
                if by_peer && !child.attach && child.detail.is_none() {
                    // As below: the failure waits for how the process ended (a panic
                    // message, an error on stderr). Not joined any more, the child holds
                    // up the start until then.
                    child.state = ChildState::Connected;
                    child.deadline = None;
                    let until = now + super::EXIT_WAIT;
                    child.held = Some(HeldLoss { ranks: RankSet::new(), why, until, startup: true });
                    self.refresh_deadline();
                    return self.refresh_loss_deadline();
                }
                if self.children[c].attach {
                    // Any process that can read the attach file may take a slot: one
                    // that breaks the protocol (a frame over its limit) is refused on
                    // its own, its rank reported missing, and the launch goes on.
                    let reason = self.children[c].failure(&format!("was refused during start-up: {why}"));
                    return self.go_on_without(c, reason, now);
                }
                let reason = self.children[c].failure(&format!("failed during start-up: {why}"));
                self.fail_child(c, reason, now);
            }
            (Phase::Running, ChildState::Launching | ChildState::Connected) => {
                // Adopted while the tree runs, gone before it joined.
                let reason = self.children[c].failure(&format!("failed before it joined: {why}"));
                self.fail_child(c, reason, now);
            }
            _ => {
                let child = &mut self.children[c];
                child.state = ChildState::Gone;
                child.deadline = None;
                let ranks = std::mem::take(&mut child.ranks);
                if self.await_orphans(c, &ranks, &why, now) {
                    // Its children rejoin this node; it is stopped if it still runs.
                    let node_id = self.children[c].node_id;
                    self.out.event(Event::AbandonChild { node_id });
                    return self.members_left(c, now);
                }
                let child = &mut self.children[c];
                // A process that ended closed its link: the report waits for how it
                // ended (its process is stopped only then). One started by someone
                // else (attach mode) brings no news.
                let news_may_come = !child.attach && !child.rejoiner;
                let wait = by_peer && news_may_come && child.detail.is_none() && !ranks.is_empty();
                if wait {
                    let until = now + super::EXIT_WAIT;
                    child.held = Some(HeldLoss { ranks, why, until, startup: false });
                    self.refresh_loss_deadline();
                    // Its ranks leave the streams now; waves go on without them.
                    return self.members_left(c, now);
                }
                let node_id = child.node_id;
                let reason = child.with_detail(why);
                self.out.event(Event::AbandonChild { node_id });
                // Waves it completes go up before the Leave that may take this node out of them.
                self.members_left(c, now);
                if !ranks.is_empty() {
                    self.report_up(ControlMsg::Leave { ranks, reason, graceful: false });
                }
            }
        }
    }

    /// Gives up on child `c` during start-up: the start-up fails, or with missing
    /// children allowed, its ranks are reported lost.
    fn fail_child(&mut self, c: usize, reason: String, now: Instant) {
        let allow_missing = self.allow_missing();
        if self.children[c].state == ChildState::Gone {
            return;
        }
        if self.phase == Phase::Running {
            // An adopted child that never joined: its ranks are reported lost (and logged
            // where the report ends, not at every level on its way).
            tracing::debug!(node = %self.name, "{reason}");
            let ranks = self.children[c].expected.clone();
            self.abandon(c);
            self.refresh_deadline();
            if ranks.is_empty() {
                return; // an orphan that never said what it brings back
            }
            return self.report_up(ControlMsg::Leave { ranks, reason, graceful: false });
        }
        if self.phase != Phase::Starting {
            return;
        }
        if !allow_missing {
            return self.startup_failed(reason);
        }
        self.go_on_without(c, reason, now);
    }

    /// Starts without child `c`: its ranks are reported missing with `reason`.
    fn go_on_without(&mut self, c: usize, reason: String, now: Instant) {
        // Reported with the missing ranks; the front-end's tool tells the user once.
        tracing::debug!(node = %self.name, "{reason}; going on without it");
        self.abandon(c);
        let ranks = std::mem::take(&mut self.children[c].expected);
        if let Some(s) = self.start.current.as_mut() {
            s.missing.push((ranks, reason));
        }
        self.refresh_deadline();
        self.maybe_send_points(now);
        self.maybe_ready(now);
    }

    /// Stops child `c`: its link closes, its process is stopped.
    fn abandon(&mut self, c: usize) {
        let child = &mut self.children[c];
        child.state = ChildState::Gone;
        child.deadline = None;
        child.ranks = RankSet::new();
        if let Some(link) = child.link.take() {
            self.links.remove(link);
            self.out.event(Event::CloseLink { link, reason: format!("{} was given up on", child.name) });
        }
        self.out.event(Event::AbandonChild { node_id: child.node_id });
    }

    /// Ends a back-end child on purpose: a linked one is told to shut down and gets
    /// its driver's grace to exit before it is killed; one not linked yet is stopped.
    fn retire(&mut self, c: usize, now: Instant) {
        let child = &mut self.children[c];
        let Some(link) = child.link.take() else { return self.abandon(c) };
        child.state = ChildState::Gone;
        child.deadline = None;
        child.ranks = RankSet::new();
        let node_id = child.node_id;
        self.links.remove(link);
        self.liveness.link_closed(link);
        self.monitor_child_gone(c, now);
        self.out.control(link, &ControlMsg::Shutdown);
        self.out.event(Event::RetireChild { node_id, link });
    }

    /// Start-up failed: the parent is told, every child is stopped, the node ends.
    pub(super) fn startup_failed(&mut self, message: String) {
        tracing::debug!(node = %self.name, "start-up failed: {message}");
        if let Some(parent) = self.parent {
            self.out.control(parent, &ControlMsg::LaunchFailed { message: message.clone() });
        }
        for c in 0..self.children.len() {
            if self.children[c].alive() {
                self.abandon(c);
            }
        }
        self.start.current = None;
        self.phase = Phase::Over;
        self.out.event(Event::StartupFailed { message });
    }

    /// Gives up on children past their deadline.
    pub(super) fn startup_timeout(&mut self, now: Instant) {
        if self.start.child_deadline.map_or(true, |d| d > now) {
            return;
        }
        let late: Vec<usize> = (0..self.children.len())
            .filter(|&c| self.children[c].alive() && self.children[c].deadline.is_some_and(|d| d <= now))
            .collect();
        for c in late {
            let child = &self.children[c];
            let secs = child.deadline.map_or(0.0, |_| {
                if child.state == ChildState::Launching {
                    self.limit_for(child).as_secs_f64()
                } else {
                    child.join_limit.as_secs_f64()
                }
            });
            let reason = child.failure(&format!("{} within {secs:.1} s", child.late));
            self.fail_child(c, reason, now);
            if self.phase == Phase::Over {
                return;
            }
        }
        self.refresh_deadline();
    }

    pub(super) fn refresh_deadline(&mut self) {
        self.start.child_deadline =
            self.children.iter().filter(|c| c.alive()).filter_map(|c| c.deadline).min();
    }

    /// How long a launching child had to connect.
    fn limit_for(&self, child: &Child) -> Duration {
        match (&self.start.current, &self.start.plan) {
            (Some(s), _) if child.attach => s.attach.unwrap_or_default(),
            (_, Some(plan)) => ms(plan.startup_timeout_ms),
            _ => Duration::ZERO,
        }
    }

    /// Attach mode: once this node's slots and every comm-node child's are known,
    /// the addresses go up and the back-ends' clock starts.
    fn maybe_send_points(&mut self, now: Instant) {
        let Some(s) = self.start.current.as_ref() else { return };
        let Some(limit) = s.attach else { return };
        if s.points_sent || s.own_points.is_none() && self.children.iter().any(|c| c.attach) {
            return;
        }
        let waiting = self.children.iter().any(|c| !c.is_backend && c.alive() && c.points.is_none());
        if waiting {
            return;
        }
        let mut points: Vec<AttachPoint> = s.own_points.clone().unwrap_or_default();
        for c in self.children.iter_mut() {
            points.extend(c.points.take().unwrap_or_default());
            if c.attach && c.state == ChildState::Launching {
                c.deadline = Some(now + limit);
            }
        }
        points.sort();
        if let Some(s) = self.start.current.as_mut() {
            s.points_sent = true;
        }
        match self.parent {
            Some(parent) => self.out.control(parent, &ControlMsg::AttachPoints { points }),
            None => self.out.event(Event::AttachPoints(points)),
        }
        self.refresh_deadline();
    }

    /// Once every child joined or was given up on, the node joins its parent.
    fn maybe_ready(&mut self, now: Instant) {
        if self.phase != Phase::Starting {
            return;
        }
        if self.children.iter().any(|c| matches!(c.state, ChildState::Launching | ChildState::Connected)) {
            return;
        }
        let Some(startup) = self.start.current.take() else { return };
        let ranks = self.live_ranks();
        if ranks.is_empty() && !self.children.is_empty()
            || self.children.is_empty() && self.role == Role::FrontEnd
        {
            let why: Vec<String> = startup.missing.iter().map(|(_, r)| r.clone()).collect();
            let message = if why.is_empty() {
                format!("{}: the tree has no back-end", self.name)
            } else {
                format!("no child of {} started: {}", self.name, why.join("; "))
            };
            return self.startup_failed(message);
        }
        self.phase = Phase::Running;
        if self.role == Role::FrontEnd {
            // Every child's first round was due at once; spread out instead.
            self.clock_children_begin(now);
        }
        let commnodes = self.commnodes_below() + u32::from(self.role == Role::CommNode);
        match self.parent {
            Some(parent) => {
                for (lost, reason) in &startup.missing {
                    let leave =
                        ControlMsg::Leave { ranks: lost.clone(), reason: reason.clone(), graceful: false };
                    self.out.control(parent, &leave);
                }
                self.out.control(parent, &ControlMsg::Join { ranks: ranks.clone(), commnodes });
            }
            None => {
                for (lost, reason) in &startup.missing {
                    self.lost.add(lost, reason);
                }
            }
        }
        self.out.event(Event::Ready { ranks, commnodes, missing: startup.missing });
    }

    /// Multicasts a control message to some children.
    pub(super) fn control_to(&mut self, links: Vec<LinkId>, msg: &ControlMsg) {
        if !links.is_empty() {
            self.out
                .transmits
                .push_back(Transmit { to: Destination::Links(links.into()), frame: control_frame(msg) });
        }
    }
}
