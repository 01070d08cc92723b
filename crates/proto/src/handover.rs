//! Filter state across a recovery: a comm node's upward filter reports its state
//! to the parent ahead of each wave it sends up (only when it changed), the parent
//! keeps the last one per child, and when that child is lost and its orphans rejoin
//! the parent, the parent's own instance takes the state over
//! (`Transform::adopt_state`), so a running reduction stays correct.
//!
//! The state goes up in order with the waves (it waits in the same queue, without
//! taking a credit), so the parent has the state after wave *n* once it has wave *n*.

use std::collections::BTreeMap;

use treecast_filters::Transform;
use treecast_wire::{ControlMsg, Frame, RankSet};

use super::Node;

/// One stream's filter states on their way between a node, its parent and its children.
#[derive(Debug, Default)]
pub(crate) struct Handover {
    /// The last state this node sent its parent (none since a new parent took it).
    reported: Option<Vec<u8>>,
    /// The last state each comm-node child reported, by child index.
    from_children: BTreeMap<usize, Vec<u8>>,
    /// States of lost children, with the ranks that were below them: taken over
    /// when the first of those ranks rejoins this node.
    orphaned: Vec<(RankSet, Vec<u8>)>,
}

impl Handover {
    /// The frame reporting `filter`'s state after a wave, when it has one and it
    /// changed since the last report; the filter's failure otherwise.
    pub(crate) fn report(
        &mut self,
        filter: &mut dyn Transform,
        stream: u32,
    ) -> Result<Option<Frame>, String> {
        let Some(state) = filter.state().map_err(|e| e.to_string())? else { return Ok(None) };
        if self.reported.as_ref() == Some(&state) {
            return Ok(None);
        }
        self.reported = Some(state.clone());
        Ok(Some(super::control_frame(&ControlMsg::FilterState { stream, state })))
    }

    /// The parent changed (or what was queued for it was dropped): report afresh.
    pub(crate) fn parent_changed(&mut self) {
        self.reported = None;
    }

    /// Child `c` no longer takes part in the stream.
    pub(crate) fn child_left(&mut self, c: usize) {
        self.from_children.remove(&c);
    }
}

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
