//! Orphan recovery: when a comm node is lost, its children rejoin the tree under
//! the lost node's parent, with their ranks, and streams go on.
//!
//! Three roles, one per side of the loss:
//!
//! * **The parent that noticed** (the lost node's parent) takes the lost node's
//!   ranks out of the waves at once, reports them [`ControlMsg::Orphaned`] (the
//!   front-end's tool sees [`Event::NodeLost`]) and awaits them for the rejoin
//!   limit. An orphan that connects and proves a node id it does not know sends
//!   [`ControlMsg::Rejoin`]; ranks it awaits are taken back (streams announced,
//!   streams that ended meanwhile closed, `Rejoined` reported up: the tool sees
//!   [`Event::RanksRejoined`]). Ranks still awaited at the limit are reported lost.
//! * **Every orphan** (each child of the lost node) keeps its streams, drops what
//!   it would send up meanwhile, and asks its driver to connect to its fallback
//!   address ([`Event::Rejoin`]): the address its parent gave in
//!   [`ControlMsg::Fallback`], which is the parent's own parent. Past the rejoin
//!   limit, or refused, it shuts down, so nothing is left running.
//! * **Every node above** moves the ranks out of the child that reported them and
//!   back, passing the reports up.
//!
//! Waves stay right across a rejoin because a rejoined member takes part from the
//! wave that answers the first request it gets (`Synchronizer::add_child_from`),
//! and drops its answers to the requests it got before (`up_from` in streams.rs).

pub(crate) mod state;

use std::time::{Duration, Instant};

use treecast_wire::{ControlMsg, RankSet, MAX_FALLBACKS};

use super::{EndReason, Event, LinkId, LinkRole, Node, Phase, Role};
use crate::startup::state::{Child, ChildState};
use state::Awaited;

/// How long the children of a lost comm node have to rejoin, by default.
pub const DEFAULT_REJOIN_WITHIN: Duration = Duration::from_secs(10);

/// How long an orphan that connected has to say which ranks it brings back.
const REJOIN_HELLO: Duration = Duration::from_secs(5);

/// How long an orphan waits after trying every fallback in vain before it tries
/// them again: a fallback that refused at once (it did not await the orphan yet, or
/// turned its handshake away while busy) may take it a moment later.
const ROUND_PAUSE: Duration = Duration::from_millis(200);

impl Node {
    /// How long the children of a lost comm node have to rejoin (`None`: no
    /// recovery; a lost comm node's sub-tree is lost with it). Comm nodes and the
    /// front-end take it from their plan; a back-end is told by its driver.
    pub fn set_rejoin(&mut self, limit: Option<Duration>) {
        self.recovery.rejoin = limit.filter(|d| !d.is_zero());
    }

    /// The rejoin limit in force, if recovery is on.
    pub fn rejoin_limit(&self) -> Option<Duration> {
        self.recovery.rejoin
    }

    /// The address this node reached its parent at: its children rejoin there if
    /// it is lost. Set by the driver of a comm node before the parent link is up.
    pub fn set_parent_address(&mut self, address: String) {
        self.recovery.parent_address = Some(address);
    }

    /// True while this node lost its parent and looks for a new one.
    pub fn is_rejoining(&self) -> bool {
        self.recovery.rejoining.is_some()
    }

    /// The parent link is gone: returns true when this node goes looking for a new
    /// parent (recovery on, a fallback known, the tree running); false to shut down.
    pub(super) fn try_rejoin(&mut self, why: &str, now: Instant) -> bool {
        let Some(limit) = self.recovery.rejoin else { return false };
        if self.recovery.fallback.is_empty()
            || self.phase != Phase::Running
            || self.recovery.rejoining.is_some()
        {
            return false;
        }
        tracing::info!(node = %self.name, "lost the parent ({why}); rejoining at {}", self.recovery.fallback[0]);
        self.recovery.rejoining = Some(now + limit);
        self.recovery.untried = self.recovery.fallback.clone();
        self.streams_orphaned();
        self.rejoin_at_next(now);
        true
    }

    /// Asks the driver to connect to `address`, with a share of the time left: when
    /// the nearest ancestor is stopped (or lost too) a connection to it never ends,
    /// and the ones above must still get their turn.
    fn rejoin_at(&mut self, address: String, now: Instant) {
        let left = self.recovery.rejoining.map_or(Duration::ZERO, |d| d.saturating_duration_since(now));
        let within = left / (1 + self.recovery.untried.len() as u32);
        self.recovery.trying = Some(address.clone());
        self.out.event(Event::Rejoin { address, within });
    }

    /// Tries the next address left in this round (there is one).
    fn rejoin_at_next(&mut self, now: Instant) {
        if !self.recovery.untried.is_empty() {
            let next = self.recovery.untried.remove(0);
            self.rejoin_at(next, now);
        }
    }

    /// The driver could not reach the address tried (or its share of the time ran
    /// out): the next ancestor is tried; after the last one, the round begins again
    /// after a pause; past the deadline this node shuts down.
    pub(super) fn rejoin_failed(&mut self, reason: String, now: Instant) {
        let Some(deadline) = self.recovery.rejoining else { return };
        let tried = self.recovery.trying.take().unwrap_or_default();
        if deadline > now && !self.recovery.untried.is_empty() {
            tracing::info!(node = %self.name, "could not rejoin at {tried} ({reason}); trying the next fallback");
            return self.rejoin_at_next(now);
        }
        if deadline > now + ROUND_PAUSE && !self.recovery.fallback.is_empty() {
            tracing::info!(node = %self.name, "could not rejoin at {tried} ({reason}); trying every fallback again");
            self.recovery.untried = self.recovery.fallback.clone();
            self.recovery.next_round = Some(now + ROUND_PAUSE);
            return;
        }
        self.recovery.rejoining = None;
        self.recovery.untried.clear();
        self.recovery.next_round = None;
        let error = format!("the parent was lost and this node could not rejoin at {tried}: {reason}");
        self.shut_down(EndReason::ParentFailed { error });
    }

    /// Orphan: the link to the new parent is up; say what comes back with this node.
    pub(super) fn rejoin_parent_up(&mut self, link: LinkId) {
        self.links.insert(link, LinkRole::Parent);
        self.parent = Some(link);
        let (ranks, commnodes) = match self.role {
            Role::BackEnd { rank, .. } => (RankSet::single(rank), 0),
            _ => (self.live_ranks(), self.commnodes_below() + 1),
        };
        let mut streams: Vec<u32> = self.streams.keys().copied().collect();
        streams.sort_unstable();
        let name = self.name.clone();
        self.out.control(link, &ControlMsg::Rejoin { ranks, commnodes, name, streams });
        self.recovery.parent_address = self.recovery.trying.clone();
    }

    /// The parent says where this node's children rejoin if this node is lost (and
    /// the ancestors above that). While rejoining, it is also the new parent's welcome.
    pub(super) fn on_fallback(&mut self, address: String, further: Vec<String>) {
        let fallback: Vec<String> =
            std::iter::once(address).chain(further).filter(|a| !a.is_empty()).take(MAX_FALLBACKS).collect();
        let changed = fallback != self.recovery.fallback;
        self.recovery.fallback = fallback;
        if self.recovery.rejoining.is_none() && changed {
            // Children that joined before this node heard its own fallbacks would
            // otherwise know only this node's parent.
            self.send_fallback_to_children();
        }
        if self.recovery.rejoining.take().is_some() {
            self.recovery.trying = None;
            self.recovery.untried.clear();
            self.recovery.next_round = None;
            let parent = self.recovery.parent_address.clone().unwrap_or_default();
            tracing::info!(node = %self.name, "rejoined the tree at {parent}");
            // Until the new parent announces the streams it keeps (next), nothing of
            // theirs that answers an earlier request may go up.
            self.streams_welcomed();
            self.out.event(Event::ParentChanged { parent });
            self.peer_parent_back();
            // This node's children rejoin where it now is.
            self.send_fallback_to_children();
        }
    }

    /// Tells every joined child where to rejoin if this node is lost.
    pub(super) fn send_fallback_to_children(&mut self) {
        let links: Vec<LinkId> =
            self.children.iter().filter(|c| c.state == ChildState::Joined).filter_map(|c| c.link).collect();
        let msg = self.fallback_for_children();
        self.control_to(links, &msg);
    }

    /// Tells child `c` where to rejoin if this node is lost.
    pub(super) fn send_fallback(&mut self, c: usize) {
        if let Some(link) = self.children[c].link {
            let msg = self.fallback_for_children();
            self.out.control(link, &msg);
        }
    }

    /// This node's parent, then this node's own fallbacks: its children's ancestors
    /// above it, nearest first.
    fn fallback_for_children(&self) -> ControlMsg {
        let address = self.recovery.parent_address.clone().unwrap_or_default();
        let further = self.recovery.fallback.iter().take(MAX_FALLBACKS - 1).cloned().collect();
        ControlMsg::Fallback { address, further }
    }

    /// A link proved a node id this node did not start: an orphan of a lost comm
    /// node below, come to rejoin. Returns false when no rejoin is possible now.
    pub(super) fn orphan_connected(&mut self, link: LinkId, node_id: u32, now: Instant) -> bool {
        let linked = self.children.iter().any(|c| c.node_id == node_id && c.alive() && c.link.is_some());
        if self.recovery.rejoin.is_none() || self.phase != Phase::Running || linked {
            return false;
        }
        let c = self.children.len();
        let mut child = Child::rejoining(node_id, now + REJOIN_HELLO, REJOIN_HELLO);
        child.link = Some(link);
        self.children.push(child);
        self.links.insert(link, LinkRole::Child(c));
        self.refresh_deadline();
        true
    }

    /// Child `c`, an orphan that connected, says which ranks it brings back.
    pub(super) fn on_rejoin(
        &mut self,
        c: usize,
        ranks: RankSet,
        commnodes: u32,
        name: String,
        streams: Vec<u32>,
        now: Instant,
    ) {
        let Some(link) = self.children[c].link else { return };
        let awaited = self.awaited_ranks();
        if !self.children[c].rejoiner || self.children[c].state != ChildState::Connected {
            return self.drop_link(link, format!("{name} sent a second rejoin"), now);
        }
        let unheard = ranks.difference(&awaited);
        let still_below =
            self.children.iter().any(|ch| ch.state == ChildState::Joined && ch.ranks.intersects(&unheard));
        if !ranks.is_empty() && !unheard.is_empty() && still_below {
            // The orphan noticed its parent's loss before this node did: its rejoin
            // waits (within its hello deadline) for the loss to be noticed here.
            self.children[c].early_rejoin =
                Some(Box::new(ControlMsg::Rejoin { ranks, commnodes, name, streams }));
            return;
        }
        if ranks.is_empty() || !unheard.is_empty() {
            let why = format!(
                "{name} asked to rejoin with ranks {ranks}, which {} does not await (awaited: {awaited}); \
                 they were reported lost already, or were never below it",
                self.name
            );
            tracing::debug!(node = %self.name, "{why}");
            return self.drop_link(link, why, now);
        }
        let child = &mut self.children[c];
        child.name = name;
        child.is_backend = commnodes == 0;
        child.expected = ranks.clone();
        child.ranks = ranks.clone();
        child.commnodes = commnodes;
        child.state = ChildState::Joined;
        child.deadline = None;
        for a in &mut self.recovery.awaiting {
            a.ranks = a.ranks.difference(&ranks);
        }
        self.recovery.awaiting.retain(|a| !a.ranks.is_empty());
        self.refresh_deadline();
        // The welcome goes first: the requests that follow the streams' announcements
        // (some held while no member was linked) are answered by the orphan.
        self.send_fallback(c);
        let announced = self.member_joined(c);
        self.adopt_orphan_states(&ranks);
        for id in streams.into_iter().filter(|id| !announced.contains(id)) {
            // It ended while the orphan was away (or does not reach it any more).
            self.out.control(link, &ControlMsg::CloseStream { id });
        }
        let parent = self.name.clone();
        self.report_up(ControlMsg::Rejoined { ranks: ranks.clone(), commnodes, parent });
        self.clock_child_joined(c, now);
        self.release_stops(&ranks, now);
    }

    /// Keeps a stop of `ranks` for those of them awaited back; returns those.
    pub(super) fn hold_stop(&mut self, ranks: &RankSet, reason: &str) -> RankSet {
        let orphaned = ranks.intersection(&self.awaited_ranks());
        if !orphaned.is_empty() {
            self.recovery.pending_stops.push((orphaned.clone(), reason.to_owned()));
        }
        orphaned
    }

    /// Ranks rejoined: the stops held for them go on; those for ranks no longer
    /// awaited (reported lost) are forgotten.
    fn release_stops(&mut self, rejoined: &RankSet, now: Instant) {
        let awaited = self.awaited_ranks();
        let mut due = Vec::new();
        for (ranks, reason) in std::mem::take(&mut self.recovery.pending_stops) {
            let now_back = ranks.intersection(rejoined);
            if !now_back.is_empty() {
                due.push((now_back, reason.clone()));
            }
            let still = ranks.intersection(&awaited);
            if !still.is_empty() {
                self.recovery.pending_stops.push((still, reason));
            }
        }
        for (ranks, reason) in due {
            self.stop_ranks(&ranks, &reason, now);
        }
    }

    /// Every rank this node awaits back.
    fn awaited_ranks(&self) -> RankSet {
        let mut all = RankSet::new();
        for a in &self.recovery.awaiting {
            all.union_with(&a.ranks);
        }
        all
    }

    /// Child `c`, a comm node, is lost with `ranks` below it: they leave the waves now
    /// and are awaited back. Returns false when recovery is off (they are lost).
    pub(super) fn await_orphans(&mut self, c: usize, ranks: &RankSet, why: &str, now: Instant) -> bool {
        let Some(limit) = self.recovery.rejoin else { return false };
        if self.children[c].is_backend || ranks.is_empty() || self.phase != Phase::Running {
            return false;
        }
        let node = self.children[c].name.clone();
        self.stash_orphan_states(c, ranks);
        self.recovery.awaiting.push(Awaited {
            ranks: ranks.clone(),
            why: why.to_owned(),
            until: now + limit,
        });
        self.report_up(ControlMsg::Orphaned { node, ranks: ranks.clone(), reason: why.to_owned() });
        // Orphans that were quicker than this node get their answer now.
        for r in 0..self.children.len() {
            let Some(msg) = self.children[r].early_rejoin.take() else { continue };
            if let ControlMsg::Rejoin { ranks, commnodes, name, streams } = *msg {
                self.on_rejoin(r, ranks, commnodes, name, streams, now);
            }
        }
        true
    }

    /// A child reports ranks orphaned below it: they are no longer reached through it
    /// for now. It keeps its streams for them (it is not told it left them).
    pub(super) fn child_orphaned(
        &mut self,
        c: usize,
        node: String,
        ranks: RankSet,
        reason: String,
        now: Instant,
    ) {
        let child = &mut self.children[c];
        let ranks = ranks.intersection(&child.ranks);
        if ranks.is_empty() {
            return;
        }
        child.ranks = child.ranks.difference(&ranks);
        child.expected = child.expected.difference(&ranks);
        if self.role == Role::FrontEnd {
            // Streams must know these ranks may come back before they see them go.
            self.recovery.orphaned.union_with(&ranks);
        }
        self.members_left_telling(c, now, false);
        self.report_up(ControlMsg::Orphaned { node, ranks, reason });
    }

    /// A child reports ranks rejoined below it: they are reached through it again.
    pub(super) fn child_rejoined(&mut self, c: usize, ranks: RankSet, commnodes: u32, parent: String) {
        let child = &mut self.children[c];
        if child.state != ChildState::Joined {
            return;
        }
        child.ranks.union_with(&ranks);
        child.expected.union_with(&ranks);
        child.commnodes += commnodes;
        self.member_joined(c);
        self.report_up(ControlMsg::Rejoined { ranks, commnodes, parent });
    }

    /// Reports lost the awaited ranks whose time is up, and gives up rejoining when
    /// this node's own time is up.
    pub(super) fn recovery_timeout(&mut self, now: Instant) {
        if self.recovery.rejoining.is_some_and(|d| d <= now) {
            let secs = self.recovery.rejoin.map_or(0.0, |d| d.as_secs_f64());
            self.rejoin_failed(format!("no new parent within {secs:.1} s"), now);
            return;
        }
        if self.recovery.next_round.is_some_and(|t| t <= now) {
            self.recovery.next_round = None;
            self.rejoin_at_next(now);
        }
        let due: Vec<Awaited> = {
            let (due, keep) =
                std::mem::take(&mut self.recovery.awaiting).into_iter().partition(|a| a.until <= now);
            self.recovery.awaiting = keep;
            due
        };
        let secs = self.recovery.rejoin.map_or(0.0, |d| d.as_secs_f64());
        for a in due {
            self.drop_orphan_states(&a.ranks);
            let reason = format!("{}; its children did not rejoin within {secs:.1} s", a.why);
            self.report_up(ControlMsg::Leave { ranks: a.ranks, reason, graceful: false });
        }
    }

    /// When [`Node::recovery_timeout`] must run next.
    pub(super) fn recovery_deadline(&self) -> Option<Instant> {
        self.recovery
            .awaiting
            .iter()
            .map(|a| a.until)
            .chain(self.recovery.rejoining)
            .chain(self.recovery.next_round)
            .chain(self.recovery.reports_held_until)
            .min()
    }
}
