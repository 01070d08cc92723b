//! Upward routing: waves, reductions and loss reports, as a state machine without I/O.

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use treecast_filters::{apply_dropping_bad, builtin, FilterContext, Synchronizer, Transform, Wave};
use treecast_wire::{
    ControlMsg, Frame, FrameKind, RankSet, SyncMode, TransformKind, CREDIT_BATCH, UP_WINDOW,
};

/// Reduced packets the front-end buffers per stream for the tool; the tool's reads
/// give the credits back (the root's parent is the tool).
pub const ROOT_WINDOW: u32 = 4096;

/// What a stream needs at a node on the way up.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamSpec {
    /// Stream id.
    pub id: u32,
    /// Back-end ranks of the stream's communicator.
    pub ranks: RankSet,
    /// How packets are grouped into waves.
    pub sync: SyncMode,
    /// How a wave is reduced.
    pub up: TransformKind,
    /// The filter applied on the way down.
    pub down: TransformKind,
}

/// What the node must send on after an input.
#[derive(Debug, Clone, PartialEq)]
pub enum UpOutput {
    /// A data frame for the parent (or, at the root, for the tool).
    Data(Frame),
    /// A control message for the parent (or, at the root, an event).
    Control(ControlMsg),
    /// At the root: no live member is left in this stream; nothing more will arrive.
    StreamDone(u32),
    /// Flow control for child `child`: it may send `packets` more data frames on `stream`.
    Credit {
        /// Index of the child link.
        child: usize,
        /// Stream id.
        stream: u32,
        /// Credits returned.
        packets: u32,
    },
}

struct UpStream {
    ranks: RankSet,
    sync: Synchronizer,
    transform: Box<dyn Transform>,
    /// Data frames this node may still send to its parent (at the root: hand to the
    /// tool) on this stream; negative after a filter made several frames of one wave.
    credit: i64,
    /// Complete waves waiting for credit from the parent, oldest first. Their
    /// children get no credit back until they are reduced and sent.
    held: VecDeque<Wave>,
    /// Credits owed to each child (by index), returned in batches of [`CREDIT_BATCH`].
    owed: Vec<u32>,
}

impl UpStream {
    /// Queues complete waves, then applies the transformation to as many as the
    /// parent's (at the root, the tool's) credit allows. A packet the filter refuses
    /// is reported and left out; the rest of its wave goes on.
    fn reduce(&mut self, id: u32, waves: Vec<Wave>, node: &str, is_root: bool) -> Vec<UpOutput> {
        let mut out = Vec::new();
        let ctx = FilterContext { stream: id, is_root };
        self.held.extend(waves);
        while self.credit > 0 {
            let Some(wave) = self.held.pop_front() else { break };
            for child in wave.children {
                self.owe(id, child, &mut out);
            }
            let (frames, errors) = apply_dropping_bad(self.transform.as_mut(), wave.frames, &ctx);
            self.credit -= frames.len() as i64;
            for e in errors {
                out.push(UpOutput::Control(ControlMsg::FilterError {
                    stream: id,
                    rank: e.rank().unwrap_or(u32::MAX),
                    message: format!("{node}: {e}"),
                }));
            }
            out.extend(frames.into_iter().map(UpOutput::Data));
        }
        out
    }

    /// Counts one packet of `child` as consumed; returns a batch of credits when due.
    fn owe(&mut self, id: u32, child: usize, out: &mut Vec<UpOutput>) {
        if self.owed.len() <= child {
            self.owed.resize(child + 1, 0);
        }
        self.owed[child] += 1;
        if self.owed[child] >= CREDIT_BATCH {
            out.push(UpOutput::Credit { child, stream: id, packets: self.owed[child] });
            self.owed[child] = 0;
        }
    }
}

struct UpChild {
    name: String,
    ranks: RankSet,
    alive: bool,
}

/// Per-node upward state: one synchroniser and one transformation per stream.
pub struct Upstream {
    node: String,
    is_root: bool,
    children: Vec<UpChild>,
    streams: HashMap<u32, UpStream>,
    /// Streams closed here; packets still on their way up for them are dropped quietly.
    closed: std::collections::HashSet<u32>,
}

impl Upstream {
    /// State for a node named `node` whose children reach the given ranks.
    pub fn new(node: String, is_root: bool, children: Vec<(String, RankSet)>) -> Self {
        let children =
            children.into_iter().map(|(name, ranks)| UpChild { name, ranks, alive: true }).collect();
        Upstream { node, is_root, children, streams: HashMap::new(), closed: Default::default() }
    }

    /// Live ranks reached through the children.
    pub fn live_ranks(&self) -> RankSet {
        let mut all = RankSet::new();
        for c in self.children.iter().filter(|c| c.alive) {
            all.union_with(&c.ranks);
        }
        all
    }

    /// Starts tracking a stream.
    pub fn add_stream(&mut self, spec: &StreamSpec) {
        let members = self.members(&spec.ranks);
        let stream = UpStream {
            ranks: spec.ranks.clone(),
            sync: Synchronizer::new(spec.sync, members),
            transform: builtin(spec.up),
            credit: i64::from(if self.is_root { ROOT_WINDOW } else { UP_WINDOW }),
            held: VecDeque::new(),
            owed: vec![0; self.children.len()],
        };
        self.streams.insert(spec.id, stream);
    }

    /// Forgets a stream; frames still queued for it are discarded with it.
    pub fn remove_stream(&mut self, id: u32) {
        if self.streams.remove(&id).is_some() {
            self.closed.insert(id);
        }
    }

    /// The parent (at the root, the tool) granted `packets` more data frames on
    /// `stream`: sends what was held.
    pub fn on_credit(&mut self, stream: u32, packets: u32) -> Vec<UpOutput> {
        let Some(s) = self.streams.get_mut(&stream) else { return Vec::new() };
        s.credit = s.credit.saturating_add(i64::from(packets));
        s.reduce(stream, Vec::new(), &self.node, self.is_root)
    }

    /// Packets waiting at this node on `stream` (in wait queues or held waves).
    pub fn waiting(&self, stream: u32) -> usize {
        self.streams
            .get(&stream)
            .map_or(0, |s| s.sync.queued() + s.held.iter().map(|w| w.frames.len()).sum::<usize>())
    }

    fn members(&self, ranks: &RankSet) -> Vec<usize> {
        (0..self.children.len())
            .filter(|&i| self.children[i].alive && self.children[i].ranks.intersects(ranks))
            .collect()
    }

    /// Handles a frame from child `child`.
    pub fn on_frame(&mut self, child: usize, frame: Frame, now: Instant) -> Vec<UpOutput> {
        match frame.header.kind {
            FrameKind::Control => self.on_control(child, &frame, now),
            FrameKind::Credit => {
                tracing::warn!(node = %self.node, child, "ignoring a credit frame from below");
                Vec::new()
            }
            FrameKind::Data => {
                let stream_id = frame.header.stream;
                let rank = frame.header.rank;
                let Some(stream) = self.streams.get_mut(&stream_id) else {
                    if self.closed.contains(&stream_id) {
                        return Vec::new();
                    }
                    return vec![UpOutput::Control(ControlMsg::FilterError {
                        stream: stream_id,
                        rank,
                        message: format!(
                            "{}: packet from rank {rank} on unknown stream {stream_id}",
                            self.node
                        ),
                    })];
                };
                // A frame waiting for its wave must not pin its link's read chunk: with the
                // link's chunks all pinned by waves that wait on another link, both stall.
                // Frames of any stream may also wait for credit from the parent (held waves).
                let mut frame = frame;
                frame.payload = bytes::Bytes::copy_from_slice(&frame.payload);
                let waves = stream.sync.push(child, frame, now);
                stream.reduce(stream_id, waves, &self.node, self.is_root)
            }
        }
    }

    fn on_control(&mut self, child: usize, frame: &Frame, now: Instant) -> Vec<UpOutput> {
        match ControlMsg::decode(&frame.payload) {
            Ok(ControlMsg::RanksLost { ranks, reason }) => {
                let mut out = self.lose_ranks(child, &ranks, now);
                out.insert(0, UpOutput::Control(ControlMsg::RanksLost { ranks, reason }));
                out
            }
            Ok(msg @ ControlMsg::FilterError { .. }) => vec![UpOutput::Control(msg)],
            Ok(other) => {
                tracing::warn!(node = %self.node, "ignoring unexpected control message from below: {other:?}");
                Vec::new()
            }
            Err(e) => {
                tracing::warn!(node = %self.node, "ignoring undecodable control message from below: {e}");
                Vec::new()
            }
        }
    }

    /// Handles the loss of a whole child: its ranks leave every stream.
    pub fn on_child_closed(&mut self, child: usize, reason: Option<&str>, now: Instant) -> Vec<UpOutput> {
        let Some(c) = self.children.get_mut(child) else { return Vec::new() };
        if !c.alive {
            return Vec::new();
        }
        c.alive = false;
        let ranks = c.ranks.clone();
        let why = match reason {
            Some(r) => format!("{}: link to {} failed: {r}", self.node, c.name),
            None => format!("{}: link to {} closed", self.node, c.name),
        };
        let mut out = Vec::new();
        if !ranks.is_empty() {
            out.push(UpOutput::Control(ControlMsg::RanksLost { ranks: ranks.clone(), reason: why }));
        }
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(s) = self.streams.get_mut(&id) {
                let waves = s.sync.child_lost(child, now);
                out.extend(self.reduce(id, waves));
            }
        }
        out.extend(self.finished_streams());
        out
    }

    fn lose_ranks(&mut self, child: usize, lost: &RankSet, now: Instant) -> Vec<UpOutput> {
        let Some(c) = self.children.get_mut(child) else { return Vec::new() };
        c.ranks = c.ranks.difference(lost);
        let remaining = c.ranks.clone();
        let mut out = Vec::new();
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            let Some(s) = self.streams.get_mut(&id) else { continue };
            if !remaining.intersects(&s.ranks) {
                let waves = s.sync.child_lost(child, now);
                out.extend(self.reduce(id, waves));
            }
        }
        out.extend(self.finished_streams());
        out
    }

    fn finished_streams(&mut self) -> Vec<UpOutput> {
        if !self.is_root {
            return Vec::new();
        }
        let done: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.sync.expected() == 0 && s.sync.queued() == 0 && s.held.is_empty())
            .map(|(id, _)| *id)
            .collect();
        done.into_iter()
            .map(|id| {
                self.streams.remove(&id);
                UpOutput::StreamDone(id)
            })
            .collect()
    }

    /// Releases time-out waves whose deadline passed.
    pub fn poll(&mut self, now: Instant) -> Vec<UpOutput> {
        let due: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| s.sync.next_deadline().is_some_and(|d| d <= now))
            .map(|(id, _)| *id)
            .collect();
        let mut out = Vec::new();
        for id in due {
            if let Some(s) = self.streams.get_mut(&id) {
                let waves = s.sync.poll(now);
                out.extend(self.reduce(id, waves));
            }
        }
        out
    }

    /// The earliest time-out deadline of any stream.
    pub fn next_deadline(&self) -> Option<Instant> {
        self.streams.values().filter_map(|s| s.sync.next_deadline()).min()
    }

    /// Reduces and sends what stream `stream_id` can now (see [`UpStream::reduce`]).
    fn reduce(&mut self, stream_id: u32, waves: Vec<Wave>) -> Vec<UpOutput> {
        match self.streams.get_mut(&stream_id) {
            Some(stream) => stream.reduce(stream_id, waves, &self.node, self.is_root),
            None => Vec::new(),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    //! A simulated node: frames in, outputs checked, no sockets.

    use super::*;
    use treecast_wire::{decode_values, encode_values, FrameHeader, Value};

    fn int_frame(stream: u32, rank: u32, v: i32) -> Frame {
        let mut payload = Vec::new();
        encode_values(&[Value::Int(v)], &mut payload);
        Frame::new(FrameHeader::data(stream, 0, rank), payload)
    }

    fn ints(out: &[UpOutput]) -> Vec<i64> {
        out.iter()
            .filter_map(|o| match o {
                UpOutput::Data(f) => Some(decode_values(&f.payload).unwrap()[0].as_i64().unwrap()),
                _ => None,
            })
            .collect()
    }

    fn node(is_root: bool) -> Upstream {
        let children = vec![("a".into(), RankSet::range(0, 2)), ("b".into(), RankSet::range(2, 2))];
        let mut up = Upstream::new("test node".into(), is_root, children);
        up.add_stream(&StreamSpec {
            id: 1,
            ranks: RankSet::range(0, 4),
            sync: SyncMode::WaitForAll,
            up: TransformKind::Sum,
            down: TransformKind::Null,
        });
        up
    }

    #[test]
    fn a_wave_waits_for_every_child_then_is_summed() {
        let mut up = node(false);
        let now = Instant::now();
        assert!(up.on_frame(0, int_frame(1, 0, 5), now).is_empty());
        assert!(up.on_frame(0, int_frame(1, 0, 6), now).is_empty());
        assert_eq!(ints(&up.on_frame(1, int_frame(1, 2, 10), now)), [15]);
        assert_eq!(ints(&up.on_frame(1, int_frame(1, 2, 20), now)), [26]);
    }

    #[test]
    fn a_lost_child_is_reported_and_releases_the_wave() {
        let mut up = node(true);
        let now = Instant::now();
        assert!(up.on_frame(0, int_frame(1, 0, 5), now).is_empty());
        let out = up.on_child_closed(1, Some("reset"), now);
        assert!(matches!(&out[0], UpOutput::Control(ControlMsg::RanksLost { ranks, reason })
            if *ranks == RankSet::range(2, 2) && reason.contains("reset")));
        assert_eq!(ints(&out), [5]);
        assert_eq!(up.live_ranks(), RankSet::range(0, 2));
    }

    #[test]
    fn ranks_lost_below_a_comm_node_leave_streams_they_emptied() {
        let mut up = node(true);
        let now = Instant::now();
        assert!(up.on_frame(0, int_frame(1, 0, 1), now).is_empty());
        let lost = ControlMsg::RanksLost { ranks: RankSet::range(2, 2), reason: "below".into() };
        let out = up.on_frame(1, Frame::new(FrameHeader::control(), lost.encode()), now);
        assert!(matches!(&out[0], UpOutput::Control(ControlMsg::RanksLost { .. })));
        assert_eq!(ints(&out), [1]);
    }

    #[test]
    fn the_root_closes_a_stream_with_no_member_left() {
        let mut up = node(true);
        let now = Instant::now();
        up.on_child_closed(0, None, now);
        let out = up.on_child_closed(1, None, now);
        assert!(out.contains(&UpOutput::StreamDone(1)));
    }

    #[test]
    fn a_mismatched_packet_is_reported_and_left_out() {
        let mut up = node(false);
        let now = Instant::now();
        let mut payload = Vec::new();
        encode_values(&[Value::Double(1.0)], &mut payload);
        up.on_frame(0, int_frame(1, 0, 5), now);
        let out = up.on_frame(1, Frame::new(FrameHeader::data(1, 0, 3), payload), now);
        assert!(out.iter().any(|o| matches!(o, UpOutput::Control(ControlMsg::FilterError { rank: 3, .. }))));
        assert_eq!(ints(&out), [5]);
    }

    #[test]
    fn frames_waiting_for_a_wave_do_not_pin_the_read_buffer() {
        // Regression: held frames pinned their link's read chunks, so two links whose
        // chunks were all held by waves waiting on the other stalled each other.
        let mut up = node(false);
        let chunk = int_frame(1, 0, 5).payload;
        let frame = Frame::new(FrameHeader::data(1, 0, 0), chunk.clone());
        assert!(up.on_frame(0, frame, Instant::now()).is_empty(), "the wave waits for child 1");
        assert!(chunk.is_unique(), "the queued frame holds a copy, not the chunk");
    }

    fn credits_for(out: &[UpOutput], to: usize) -> u32 {
        out.iter()
            .map(|o| match o {
                UpOutput::Credit { child, stream: 1, packets } if *child == to => *packets,
                _ => 0,
            })
            .sum()
    }

    #[test]
    fn without_credit_from_the_parent_waves_are_held_and_children_get_none_back() {
        let mut up = node(false);
        let now = Instant::now();
        let mut sums = Vec::new();
        let mut returned = 0;
        for i in 0..UP_WINDOW + 10 {
            up.on_frame(0, int_frame(1, 0, 1), now);
            let out = up.on_frame(1, int_frame(1, 2, i as i32), now);
            sums.extend(ints(&out));
            returned += credits_for(&out, 0);
        }
        assert_eq!(sums.len(), UP_WINDOW as usize, "only a window's worth goes up");
        assert_eq!(returned, UP_WINDOW, "children get back what was sent up, in batches");
        assert_eq!(up.waiting(1), 20, "ten waves of two packets are held");
        let out = up.on_credit(1, 4);
        assert_eq!(
            ints(&out),
            [1 + UP_WINDOW as i64, 2 + UP_WINDOW as i64, 3 + UP_WINDOW as i64, 4 + UP_WINDOW as i64]
        );
        assert_eq!(up.waiting(1), 12);
    }

    #[test]
    fn a_child_that_runs_ahead_is_held_to_its_window() {
        // Child 0 sends whenever it has credit; child 1 sends one packet in ten steps.
        // The node never holds more than a window per child, and every wave is right.
        let mut up = node(true);
        let now = Instant::now();
        let (mut credit0, mut sent0, mut sent1) = (UP_WINDOW, 0i64, 0i64);
        let mut sums = Vec::new();
        for step in 0..10 * UP_WINDOW {
            let mut out = Vec::new();
            if credit0 > 0 {
                credit0 -= 1;
                out.extend(up.on_frame(0, int_frame(1, 0, sent0 as i32), now));
                sent0 += 1;
            }
            if step % 10 == 0 {
                out.extend(up.on_frame(1, int_frame(1, 2, 1000), now));
                sent1 += 1;
            }
            credit0 += credits_for(&out, 0);
            sums.extend(ints(&out));
            assert!(up.waiting(1) <= UP_WINDOW as usize, "{} packets wait", up.waiting(1));
        }
        assert_eq!(sums.len() as i64, sent1);
        assert!(sums.iter().enumerate().all(|(i, &s)| s == i as i64 + 1000));
        assert!(sent0 < 2 * sent1 + i64::from(UP_WINDOW), "child 0 ran {sent0} packets ahead of {sent1}");
    }

    #[test]
    fn packets_still_in_flight_for_a_closed_stream_are_dropped_quietly() {
        let mut up = node(false);
        up.remove_stream(1);
        assert!(up.on_frame(0, int_frame(1, 0, 5), Instant::now()).is_empty());
    }

    #[test]
    fn packets_on_unknown_streams_are_reported() {
        let mut up = node(false);
        let out = up.on_frame(0, int_frame(9, 1, 5), Instant::now());
        assert!(matches!(&out[0], UpOutput::Control(ControlMsg::FilterError { stream: 9, rank: 1, .. })));
    }
}
