//! Downward routing: which children a frame goes to, as a state machine without I/O.

use std::collections::HashMap;

use treecast_filters::{builtin, FilterContext, Transform};
use treecast_wire::{Frame, RankSet, TransformKind, FLAG_DIRECT};

use crate::StreamSpec;

struct DownStream {
    targets: Vec<usize>,
    filter: Option<Box<dyn Transform>>,
}

/// Per-node downward state: the children each stream reaches.
pub struct Downstream {
    children: Vec<RankSet>,
    streams: HashMap<u32, DownStream>,
}

impl Downstream {
    /// State for a node whose children reach the given ranks, in child order.
    pub fn new(children: Vec<RankSet>) -> Self {
        Downstream { children, streams: HashMap::new() }
    }

    /// Starts routing a stream; returns the children that take part in it.
    pub fn add_stream(&mut self, spec: &StreamSpec, apply_filter: bool) -> Vec<usize> {
        let targets: Vec<usize> =
            (0..self.children.len()).filter(|&i| self.children[i].intersects(&spec.ranks)).collect();
        let filter = (apply_filter && spec.down != TransformKind::Null).then(|| builtin(spec.down));
        self.streams.insert(spec.id, DownStream { targets: targets.clone(), filter });
        targets
    }

    /// Stops routing a stream; returns the children that took part in it.
    pub fn remove_stream(&mut self, id: u32) -> Vec<usize> {
        self.streams.remove(&id).map(|s| s.targets).unwrap_or_default()
    }

    /// The children a stream reaches (empty for an unknown stream).
    pub fn targets(&self, id: u32) -> &[usize] {
        self.streams.get(&id).map(|s| s.targets.as_slice()).unwrap_or(&[])
    }

    /// The child whose sub-tree holds `rank`.
    pub fn child_of_rank(&self, rank: u32) -> Option<usize> {
        self.children.iter().position(|r| r.contains(rank))
    }

    /// Routes a data frame: the frames to send and the child each goes to.
    ///
    /// # Errors
    /// A description when the stream is unknown, the destination rank is not
    /// below this node, or the downstream filter refuses the frame.
    pub fn route(&mut self, frame: Frame) -> Result<Vec<(usize, Frame)>, String> {
        let id = frame.header.stream;
        if frame.header.flags & FLAG_DIRECT != 0 {
            let rank = frame.header.rank;
            let child =
                self.child_of_rank(rank).ok_or_else(|| format!("rank {rank} is not below this node"))?;
            return Ok(vec![(child, frame)]);
        }
        let stream = self.streams.get_mut(&id).ok_or_else(|| format!("unknown stream {id}"))?;
        let frames = match stream.filter.as_mut() {
            // Each packet is reduced alone, as at the root, so an average stays a plain value.
            Some(f) => f
                .apply(vec![frame], &FilterContext { stream: id, is_root: true })
                .map_err(|e| e.to_string())?,
            None => vec![frame],
        };
        Ok(stream.targets.iter().flat_map(|&c| frames.iter().map(move |f| (c, f.clone()))).collect())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use treecast_wire::{FrameHeader, SyncMode};

    fn spec(id: u32, ranks: RankSet) -> StreamSpec {
        StreamSpec {
            id,
            ranks,
            sync: SyncMode::WaitForAll,
            up: TransformKind::Sum,
            down: TransformKind::Null,
        }
    }

    #[test]
    fn streams_reach_only_children_with_members_and_share_payloads() {
        let mut d = Downstream::new(vec![RankSet::range(0, 4), RankSet::range(4, 4), RankSet::range(8, 4)]);
        assert_eq!(d.add_stream(&spec(1, RankSet::range(3, 2)), true), [0, 1]);
        let frame = Frame::new(FrameHeader::data(1, 0, 0), vec![1u8; 100]);
        let out = d.route(frame.clone()).unwrap();
        assert_eq!(out.iter().map(|(c, _)| *c).collect::<Vec<_>>(), [0, 1]);
        assert!(out.iter().all(|(_, f)| f.payload.as_ptr() == frame.payload.as_ptr()), "shared, not copied");
    }

    #[test]
    fn direct_frames_go_to_the_child_holding_the_rank() {
        let mut d = Downstream::new(vec![RankSet::range(0, 4), RankSet::range(4, 4)]);
        let mut h = FrameHeader::data(7, 0, 5);
        h.flags |= FLAG_DIRECT;
        assert_eq!(d.route(Frame::new(h, vec![])).unwrap()[0].0, 1);
        h.rank = 99;
        assert!(d.route(Frame::new(h, vec![])).unwrap_err().contains("rank 99"));
        assert!(d
            .route(Frame::new(FrameHeader::data(8, 0, 0), vec![]))
            .unwrap_err()
            .contains("unknown stream 8"));
    }
}
