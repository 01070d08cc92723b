//! What [`crate::Node`] keeps for each stream: the state, apart from the behaviour
//! (`streams.rs`) that changes it, so that the node's definition imports no behaviour.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use treecast_filters::{Synchronizer, Transform, Wave};
use treecast_wire::{Frame, FrameKind, LinkId, StreamSpec};

use crate::handover::state::Handover;
use crate::startup::state::Child;
use crate::window::{Budget, Ledger};

/// One child's share of a stream.
#[derive(Debug)]
pub(super) struct ChildPart {
    /// What the child sent up and has not been given back.
    pub(super) up: Ledger,
    /// What this node may still send the child.
    pub(super) down: Budget,
    /// Frames waiting for the child's credit, with the sequence number of their input,
    /// and whether the frame is for the stream's whole group (see [`drain_together`]).
    pub(super) queue: VecDeque<(u64, Frame, bool)>,
    /// A close of the stream waits behind the queue.
    pub(super) close_pending: bool,
}

/// A stream at one node.
pub(crate) struct StreamState {
    pub(crate) spec: StreamSpec,
    pub(super) sync: Synchronizer,
    /// The reduction (none at a back-end).
    pub(crate) up_filter: Option<Box<dyn Transform>>,
    /// Its state, reported up and taken over from lost children (recovery).
    pub(crate) handover: Handover,
    /// The downstream filter (comm nodes only, and only a real one).
    pub(super) down_filter: Option<Box<dyn Transform>>,
    /// Child indices taking part, increasing.
    pub(super) members: Vec<usize>,
    /// Their links, in the same order.
    pub(super) targets: Arc<[LinkId]>,
    /// Per child index.
    pub(super) parts: Vec<Option<ChildPart>>,
    /// What may still go up (to the parent, or at the front-end into the tool's queue).
    pub(super) up_budget: Budget,
    /// Data frames this node has sent up (at the front-end: queued for the tool), and
    /// waves it took from `held` to reduce: where the upward queue stands, for a
    /// report held behind the data before it (see [`StreamState::passed`]).
    pub(crate) went_up: u64,
    pub(crate) waves_up: u64,
    /// Complete waves waiting for up credit.
    pub(super) held: VecDeque<Wave>,
    /// Frames a reduced wave produced that wait for up credit (a wave may yield
    /// several, one per child with the null filter; each needs a credit of its own).
    pub(super) pending_up: VecDeque<Frame>,
    /// What the source of downward frames (parent or tool) has outstanding here.
    pub(super) down_ledger: Ledger,
    pub(super) next_seq: u64,
    /// Inputs not yet handed to every child: sequence number and payload length.
    pub(super) in_node: VecDeque<(u64, usize)>,
    /// Front-end: reductions the tool has not read; `None` stands for a wave no rank
    /// answered (see `queue_waves`).
    pub(super) ready: VecDeque<Option<Frame>>,
    /// Front-end: waves numbered below this are queued for the tool, or were read.
    pub(super) queued_through: u64,
    /// Front-end: frames from the tool held while no member is linked but ranks of the
    /// stream may still rejoin; they go down, in order, to the first that does.
    pub(super) waiting_down: VecDeque<Frame>,
    /// A send from the tool was refused for lack of credit.
    pub(super) blocked: bool,
    /// Closed: upward frames are dropped, closes wait behind the children's queues.
    pub(super) closing: bool,
    /// Front-end: no more packets will come (no member left, or refused).
    pub(super) over: bool,
    /// Front-end: the tool has seen the end (or closed the stream itself).
    pub(super) tool_done: bool,
    /// Requests: data frames sent down to every member (not to one rank), counted
    /// where they enter this node. A request's number is the number of the wave that
    /// answers it, here and at the parent (see `member_joined`).
    pub(super) requests: u64,
    /// Back-end: packets the tool sent up, the number of the next one.
    pub(super) sent_up: u64,
    /// The first wave (back-end: the first packet) whose answer goes up: earlier ones
    /// answer requests sent before this node rejoined its parent, whose waves went on
    /// without it.
    pub(super) up_from: u64,
    /// Comm node: the first wave formed after every member left; from it on, nothing
    /// goes up until the parent takes this node back into the stream (its waves go on
    /// without this node meanwhile, see `remove_member`).
    pub(super) detached_from: Option<u64>,
    /// Do-not-wait waves (which carry no number) complete when this node was
    /// detached: they still go up; those formed after wait for the parent.
    pub(super) kept_after_detach: usize,
}

impl StreamState {
    /// True while reduced data waits here for up credit: a report of a loss must not
    /// go up before it (the parent would end the stream with data still on its way).
    pub(crate) fn data_waiting_up(&self) -> bool {
        !self.held.is_empty() || self.pending_up.iter().any(|f| f.header.kind != FrameKind::Control)
    }

    /// The mark a report held behind the data waiting here now takes: the waves to
    /// take from `held` before that data is gone (see [`StreamState::passed`]).
    pub(crate) fn up_mark(&self) -> u64 {
        self.waves_up + self.held.len() as u64
    }

    /// Whether the data that waited when `mark` was taken has gone up. A wave is
    /// taken only once `pending_up` has no frame left, so the data is gone once a
    /// wave past the mark was taken, or the mark's own wave was and its frames left.
    pub(crate) fn passed(&self, mark: u64) -> bool {
        self.waves_up > mark
            || (self.waves_up == mark && !self.pending_up.iter().any(|f| f.header.kind != FrameKind::Control))
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        if self.closing {
            return None;
        }
        self.sync.next_deadline()
    }

    pub(crate) fn held_packets(&self) -> usize {
        self.sync.queued()
            + self.held.iter().map(|w| w.frames.len()).sum::<usize>()
            + self.pending_up.len()
            + self.ready.len()
            + self.in_node.len()
            + self.waiting_down.len()
    }

    pub(crate) fn held_bytes(&self) -> u64 {
        let up: u64 = self.parts.iter().flatten().map(|p| p.up.held().1).sum();
        let out: u64 =
            self.ready.iter().flatten().chain(&self.pending_up).map(|f| f.payload.len() as u64).sum();
        up + out + self.down_ledger.held().1
    }

    /// Front-end: a packet or the stream's end waits for the tool.
    pub(crate) fn tool_has_something(&self) -> bool {
        !self.ready.is_empty() || (self.over && !self.tool_done)
    }

    pub(super) fn part(&mut self, c: usize) -> Option<&mut ChildPart> {
        self.parts.get_mut(c).and_then(Option::as_mut)
    }

    /// True once nothing is left to do for the tree: closes sent, or over at the front-end.
    pub(super) fn finished(&self) -> bool {
        let closes_sent = self.parts.iter().flatten().all(|p| !p.close_pending);
        self.closing && closes_sent && (self.tool_done || !self.over)
    }

    pub(super) fn rebuild_targets(&mut self, children: &[Child]) {
        self.targets = self.members.iter().filter_map(|&c| children[c].link).collect();
    }
}
