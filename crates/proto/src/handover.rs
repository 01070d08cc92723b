//! Filter state across a recovery: a comm node's upward filter reports its state
//! to the parent ahead of each wave it sends up (only when it changed), the parent
//! keeps the last one per child, and when that child is lost and its orphans rejoin
//! the parent, the parent's own instance takes the state over
//! (`Transform::adopt_state`), so a running reduction stays correct.
//!
//! The state goes up in order with the waves (it waits in the same queue, without
//! taking a credit), so the parent has the state after wave *n* once it has wave *n*.

pub(crate) mod state;

use treecast_wire::{ControlMsg, RankSet};

use super::Node;

impl Node {
    /// Child `c` reports its filter's state on stream `stream`.
    pub(super) fn child_filter_state(&mut self, c: usize, stream: u32, state: Vec<u8>) {
        if let Some(s) = self.streams.get_mut(&stream) {
            s.handover.from_children.insert(c, state);
        }
    }

    /// Child `c`, a comm node, is lost with `ranks` below it, which may rejoin: its
    /// last states wait for them.
    pub(super) fn stash_orphan_states(&mut self, c: usize, ranks: &RankSet) {
        for s in self.streams.values_mut() {
            if let Some(state) = s.handover.from_children.remove(&c) {
                s.handover.orphaned.push((ranks.clone(), state));
            }
        }
    }

    /// `ranks` rejoined this node: each stream's filter takes over the states of the
    /// lost nodes they were below. A filter that cannot is reported, naming this node.
    pub(super) fn adopt_orphan_states(&mut self, ranks: &RankSet) {
        let mut failures = Vec::new();
        for (&id, s) in &mut self.streams {
            let (due, keep) =
                std::mem::take(&mut s.handover.orphaned).into_iter().partition(|(r, _)| r.intersects(ranks));
            s.handover.orphaned = keep;
            let Some(filter) = s.up_filter.as_mut() else { continue };
            for (_, state) in due {
                if let Err(detail) = filter.adopt_state(&state) {
                    let message = format!(
                        "{}: the {} filter of stream {id} could not take over the state of the lost node \
                         its rejoined ranks {ranks} were below, so its results leave out what that node \
                         had reduced: {detail}",
                        self.name, s.spec.up.name
                    );
                    failures.push(ControlMsg::FilterError { stream: id, rank: u32::MAX, message });
                }
            }
        }
        for msg in failures {
            self.report_up(msg);
        }
    }

    /// `ranks` are reported lost: the states waiting for them are forgotten.
    pub(super) fn drop_orphan_states(&mut self, ranks: &RankSet) {
        for s in self.streams.values_mut() {
            s.handover.orphaned.retain(|(r, _)| !r.difference(ranks).is_empty());
        }
    }
}
