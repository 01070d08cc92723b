//! What [`crate::Node`] keeps for filter state across a recovery: the state, apart from the behaviour
//! (`handover.rs`) that changes it, so that the node's definition imports no behaviour.

use std::collections::BTreeMap;

use treecast_filters::Transform;
use treecast_wire::{ControlMsg, Frame, RankSet};

/// One stream's filter states on their way between a node, its parent and its children.
#[derive(Debug, Default)]
pub(crate) struct Handover {
    /// The last state this node sent its parent (none since a new parent took it).
    pub(super) reported: Option<Vec<u8>>,
    /// The last state each comm-node child reported, by child index.
    pub(super) from_children: BTreeMap<usize, Vec<u8>>,
    /// States of lost children, with the ranks that were below them: taken over
    /// when the first of those ranks rejoins this node.
    pub(super) orphaned: Vec<(RankSet, Vec<u8>)>,
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
        Ok(Some(crate::io::control_frame(&ControlMsg::FilterState { stream, state })))
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
