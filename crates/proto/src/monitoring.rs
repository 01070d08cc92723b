//! Monitoring orders and collections: the front-end tells every node to start or
//! stop recording, and collects what they recorded through the tree. Each node adds
//! its children's reports to its own (merged, or kept per node) and sends one answer
//! up, so the front-end receives one report per sub-tree of its own children, not one
//! per node. The recording itself happens in the driver's route (`treecast_transport::recording`).

pub(crate) mod state;

use std::time::{Duration, Instant};

use treecast_monitor::{Collection, Report};
use treecast_wire::{CollectMode, ControlMsg};

use super::{ChildState, Event, Node, Role};
use state::PendingCollect;

/// Finished collections the front-end keeps for their callers, oldest dropped first.
const MAX_UNTAKEN: usize = 16;

/// How much of its own limit a node gives its children, so that their answers (or
/// their own time-outs) come before it gives up on them.
fn child_limit(limit: Duration) -> Duration {
    limit.mul_f64(0.75)
}

impl Node {
    /// Start or stop recording here and in every joined child.
    pub(super) fn monitor_order(&mut self, msg: ControlMsg) {
        let event = match &msg {
            ControlMsg::MonitorStart { program } => Event::MonitorStart { program: *program },
            _ => Event::MonitorStop,
        };
        self.send_to_joined_children(&msg);
        self.out.event(event);
    }

    /// Starts collection `id`: asks every joined child and the driver for reports.
    pub(super) fn monitor_collect(&mut self, id: u32, mode: CollectMode, limit: Duration, now: Instant) {
        let limit_ms = u32::try_from(child_limit(limit).as_millis()).unwrap_or(u32::MAX);
        self.send_to_joined_children(&ControlMsg::MonitorCollect { id, mode, limit_ms });
        let waiting = self.joined_children();
        // A confirmation carries no report: the orders before it are handled (the
        // driver acts on their events before it reads another frame).
        let own = mode == CollectMode::Confirm;
        let gathered = Collection::default();
        self.monitor.pending.push(PendingCollect {
            id,
            mode,
            waiting,
            own,
            gathered,
            deadline: now + limit,
            limit,
        });
        if own {
            self.monitor_finish(now, false);
        } else {
            self.out.event(Event::MonitorCollectLocal { id });
        }
    }

    /// The driver's own report for collection `id`.
    pub(super) fn monitor_local(&mut self, id: u32, report: Report, now: Instant) {
        let node = self.node_id;
        let Some(p) = self.monitor.pending.iter_mut().find(|p| p.id == id) else { return };
        p.own = true;
        let own = Collection::of(node, report);
        let child_part = std::mem::replace(&mut p.gathered, own);
        if let Err(e) = p.gathered.absorb(child_part, (p.mode == CollectMode::Merged).then_some(node)) {
            p.gathered.missing.push(format!("{}: a report did not merge: {e}", self.name));
        }
        self.monitor_finish(now, false);
    }

    /// Child `c` answered collection `id`.
    pub(super) fn monitor_answer(&mut self, c: usize, id: u32, json: &str, now: Instant) {
        let node = self.node_id;
        let child_name = self.children[c].name.clone();
        let Some(p) = self.monitor.pending.iter_mut().find(|p| p.id == id) else { return };
        if !p.waiting.contains(&c) {
            return;
        }
        p.waiting.retain(|&w| w != c);
        let merge_into = (p.mode == CollectMode::Merged && p.own).then_some(node);
        let absorbed = Collection::from_json(json).and_then(|child| p.gathered.absorb(child, merge_into));
        if let Err(e) = absorbed {
            p.gathered.missing.push(format!("{child_name}: its report was refused: {e}"));
        }
        self.monitor_finish(now, false);
    }

    /// Child `c` is gone: no collection waits for it any more.
    pub(super) fn monitor_child_gone(&mut self, c: usize, now: Instant) {
        let name = self.children[c].name.clone();
        let mut any = false;
        for p in &mut self.monitor.pending {
            if p.waiting.contains(&c) {
                p.waiting.retain(|&w| w != c);
                p.gathered.missing.push(format!("{name}: lost before it answered, with any node below it"));
                any = true;
            }
        }
        if any {
            self.monitor_finish(now, false);
        }
    }

    /// Collections past their limit end with what they have.
    pub(super) fn monitor_timeout(&mut self, now: Instant) {
        if self.monitor.pending.iter().any(|p| p.deadline <= now) {
            self.monitor_finish(now, true);
        }
    }

    /// When the next collection gives up waiting.
    pub(super) fn monitor_deadline(&self) -> Option<Instant> {
        self.monitor.pending.iter().map(|p| p.deadline).min()
    }

    /// Front-end: takes a finished collection.
    pub fn take_monitor_collection(&mut self, id: u32) -> Option<Collection> {
        let i = self.monitor.done.iter().position(|(done, _)| *done == id)?;
        Some(self.monitor.done.swap_remove(i).1)
    }

    /// Sends up (or keeps, at the front-end) every collection that is complete, or
    /// past its deadline when `timed_out`.
    fn monitor_finish(&mut self, now: Instant, timed_out: bool) {
        let (ready, pending): (Vec<_>, Vec<_>) = std::mem::take(&mut self.monitor.pending)
            .into_iter()
            .partition(|p| (p.own && p.waiting.is_empty()) || (timed_out && p.deadline <= now));
        self.monitor.pending = pending;
        for mut p in ready {
            for &c in &p.waiting {
                let limit = child_limit(p.limit).as_secs_f64();
                p.gathered.missing.push(format!("{}: no report within {limit:.1} s", self.children[c].name));
            }
            if !p.own {
                p.gathered.missing.push(format!("{}: its own report was not ready in time", self.name));
            }
            match (self.role, self.parent) {
                (Role::FrontEnd, _) => {
                    // A collection nobody takes (its caller gave up) goes in time.
                    if self.monitor.done.len() >= MAX_UNTAKEN {
                        self.monitor.done.remove(0);
                    }
                    self.monitor.done.push((p.id, p.gathered));
                    self.out.event(Event::MonitorCollected { id: p.id });
                }
                (_, Some(parent)) => {
                    let msg = ControlMsg::MonitorReport { id: p.id, json: p.gathered.to_json() };
                    self.out.control(parent, &msg);
                }
                (_, None) => {}
            }
        }
    }

    /// Indexes of the children that joined.
    fn joined_children(&self) -> Vec<usize> {
        (0..self.children.len()).filter(|&c| self.children[c].state == ChildState::Joined).collect()
    }

    /// Sends `msg` to every joined child.
    fn send_to_joined_children(&mut self, msg: &ControlMsg) {
        for c in self.joined_children() {
            if let Some(link) = self.children[c].link {
                self.out.control(link, msg);
            }
        }
    }
}
