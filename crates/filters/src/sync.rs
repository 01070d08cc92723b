//! Synchronization: grouping the packets that arrive from a node's children into waves.
//!
//! [`Synchronizer`] is a pure state machine: packets and failures come in through
//! [`Synchronizer::push`] and [`Synchronizer::child_lost`], the passing of time through
//! [`Synchronizer::poll`], and every call returns the waves it completed. It never
//! reads a clock; the caller arms a timer at [`Synchronizer::next_deadline`].

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use treecast_wire::{Frame, SyncMode};

#[cfg(test)]
mod model;

/// Packets released together, with the children they came from.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Wave {
    /// The packets, in increasing child index.
    pub frames: Vec<Frame>,
    /// The child each packet came from, in the same order (so a parent can give
    /// flow-control credits back to the right children).
    pub children: Vec<usize>,
    /// Its number: waves are counted from 0 in the order they are released, and the
    /// count jumps past waves that can no longer form (see
    /// [`Synchronizer::add_child_from`]). Always 0 with [`SyncMode::DoNotWait`].
    pub index: u64,
}

/// Groups packets from children into waves according to a [`SyncMode`].
///
/// * [`SyncMode::WaitForAll`]: one FIFO per child; a wave is ready when every live
///   expected child has at least one queued packet, and takes the head of every
///   non-empty queue.
/// * [`SyncMode::TimeOut`]`(ms)`: the same, but a packet waits at most `ms` for the
///   rest of its wave: the pending wave's deadline is the arrival time of its oldest
///   head packet plus `ms`. When [`Synchronizer::poll`] sees that deadline pass, the
///   heads of the non-empty queues form a wave. After such a release the next heads
///   may already be older than `ms` (a backlog behind a silent child); they are
///   released in the same call, so a silent child never throttles the others.
/// * [`SyncMode::DoNotWait`]: every packet is a wave of one, at once.
///
/// Membership:
///
/// * A packet from a child that is not expected (a node may learn of a new child
///   after its first packet) is accepted, and the child is expected from then on.
/// * [`Synchronizer::child_lost`] removes a child from every future wave. Packets it
///   had already queued were accepted and are not dropped: they are delivered, one
///   per wave, with the next waves. A packet arriving later from a lost child (a race
///   with the failure report) is handled the same way, without making the child
///   expected again; [`Synchronizer::add_child`] does that explicitly.
///
/// Every wave lists its packets in increasing child index.
#[derive(Debug, Clone)]
pub struct Synchronizer {
    mode: SyncMode,
    /// Each child's packets and membership, by index: a packet's path looks its
    /// child up by position instead of searching ordered sets (with the rest of
    /// the wave's bookkeeping, about 15 % of a comm node's CPU per packet). Indices
    /// are the caller's positions, so the list is as long as the largest index seen.
    slots: Vec<Slot>,
    /// The children a wave visits, in increasing index: those expected, and those
    /// holding packets though not expected (lost children whose packets are still queued).
    present: Vec<usize>,
    /// Number of live children expected in every wave.
    expected: usize,
    /// Number of expected children whose queue is not empty.
    ready_children: usize,
    /// Total queued packets.
    queued: usize,
    /// Waves released so far: the index of the next wave.
    released: u64,
    /// Children that take part from a later wave on (see [`Synchronizer::add_child_from`]),
    /// with that wave's index and the packets they sent meanwhile.
    deferred: BTreeMap<usize, (u64, VecDeque<(Frame, Instant)>)>,
}

/// One child's place in a [`Synchronizer`].
#[derive(Debug, Clone, Default)]
struct Slot {
    /// Queued packets with their arrival time.
    queue: VecDeque<(Frame, Instant)>,
    /// Expected in every wave.
    expected: bool,
    /// Reported lost and not added again.
    lost: bool,
}

impl Synchronizer {
    /// A synchronizer in `mode` expecting a packet from each of `children` (indices
    /// chosen by the caller, e.g. the position of the child link) in every wave.
    /// Indices are small positions: a slot is kept for every index up to the
    /// largest one given to any call.
    pub fn new(mode: SyncMode, children: impl IntoIterator<Item = usize>) -> Self {
        let mut s = Synchronizer {
            mode,
            slots: Vec::new(),
            present: Vec::new(),
            expected: 0,
            ready_children: 0,
            queued: 0,
            released: 0,
            deferred: BTreeMap::new(),
        };
        for child in children {
            s.expect(child);
        }
        s
    }

    /// The synchronization mode.
    pub fn mode(&self) -> SyncMode {
        self.mode
    }

    /// Accepts `frame` from `child` at time `now` and returns the waves now
    /// complete, oldest first (usually none or one).
    ///
    /// Time-out waves whose deadline passed before `now` are released first, without
    /// this packet.
    pub fn push(&mut self, child: usize, frame: Frame, now: Instant) -> Vec<Wave> {
        if matches!(self.mode, SyncMode::DoNotWait) {
            if !self.slot(child).lost {
                self.expect(child);
            }
            return vec![Wave { frames: vec![frame], children: vec![child], index: 0 }];
        }
        if let Some((_, waiting)) = self.deferred.get_mut(&child) {
            waiting.push_back((frame, now));
            return self.release_expired(now);
        }
        let mut waves = self.release_expired(now);
        let slot = self.slot(child);
        let (expected, lost, had_packets) = (slot.expected, slot.lost, !slot.queue.is_empty());
        if !expected && !lost {
            // A newly learnt child: its queue (if any) now counts toward readiness.
            self.expect(child);
            self.ready_children += usize::from(had_packets);
        }
        self.slots[child].queue.push_back((frame, now));
        if !had_packets {
            if lost {
                self.enter(child);
            } else {
                self.ready_children += 1;
            }
        }
        self.queued += 1;
        append(&mut waves, self.release_complete());
        append(&mut waves, self.release_expired(now));
        waves
    }

    /// `child` is gone: it leaves every future wave. Returns the waves this completes
    /// (those that were waiting only for it). Its queued packets are still delivered.
    pub fn child_lost(&mut self, child: usize, now: Instant) -> Vec<Wave> {
        self.deferred.remove(&child);
        let slot = self.slot(child);
        slot.lost = true;
        if std::mem::take(&mut slot.expected) {
            self.expected -= 1;
            if self.slots[child].queue.is_empty() {
                self.leave(child);
            } else {
                self.ready_children -= 1;
            }
        }
        let mut waves = self.release_complete();
        waves.extend(self.release_expired(now));
        self.activate_deferred();
        waves.extend(self.release_complete());
        waves
    }

    /// Makes `child` expected in every future wave, also after it was lost (a child
    /// that reconnected, or one announced before its first packet). Returns nothing
    /// because adding a member never completes a wave.
    pub fn add_child(&mut self, child: usize) {
        self.slot(child).lost = false;
        if self.expect(child) && !self.slots[child].queue.is_empty() {
            self.ready_children += 1;
        }
    }

    /// Makes `child` expected from wave `first` on (waves are counted from 0 in the
    /// order they are released), for a child that joins after the requests of the
    /// waves before it went out: it never got them, so those waves must not wait for
    /// it, and its packets must not fill them. Its packets wait until wave `first`
    /// is the next one. When no other child is expected, waves before `first` will
    /// never form: the count jumps to `first` and the child takes part at once.
    /// Only [`SyncMode::WaitForAll`] waves are numbered so; in the other modes the
    /// child takes part at once.
    pub fn add_child_from(&mut self, child: usize, first: u64) {
        if self.mode != SyncMode::WaitForAll {
            // Time-out waves and single packets answer no one request: nothing to skip.
            return self.add_child(child);
        }
        if self.expected == 0 && self.queued == 0 {
            self.released = self.released.max(first);
        }
        if first <= self.released || self.expected == 0 {
            return self.add_child(child);
        }
        self.slot(child).lost = false;
        self.deferred.insert(child, (first, VecDeque::new()));
    }

    /// Waves before `first` will never form: nobody is left to answer them. The count
    /// jumps to `first` (only while no child is expected and nothing is queued).
    pub fn skip_to(&mut self, first: u64) {
        if self.expected == 0 && self.queued == 0 && self.deferred.is_empty() {
            self.released = self.released.max(first);
        }
    }

    /// Index of the next wave to be released.
    pub fn next_wave(&self) -> u64 {
        self.released
    }

    /// `child`'s slot, made if need be.
    fn slot(&mut self, child: usize) -> &mut Slot {
        if child >= self.slots.len() {
            self.slots.resize_with(child + 1, Slot::default);
        }
        &mut self.slots[child]
    }

    /// Makes `child` expected; true when it was not.
    fn expect(&mut self, child: usize) -> bool {
        let slot = self.slot(child);
        if slot.expected {
            return false;
        }
        slot.expected = true;
        let idle = slot.queue.is_empty();
        self.expected += 1;
        if idle {
            self.enter(child);
        }
        true
    }

    /// `child` is visited by the waves from now on.
    fn enter(&mut self, child: usize) {
        if let Err(at) = self.present.binary_search(&child) {
            self.present.insert(at, child);
        }
    }

    /// `child` is neither expected nor holds packets: the waves no longer visit it.
    fn leave(&mut self, child: usize) {
        if let Ok(at) = self.present.binary_search(&child) {
            self.present.remove(at);
        }
    }

    /// Deferred children whose first wave is next (or that no one else can hold
    /// back any longer) become expected, with the packets they sent meanwhile.
    fn activate_deferred(&mut self) {
        let due: Vec<usize> = self
            .deferred
            .iter()
            .filter(|(_, (first, _))| *first <= self.released || self.expected == 0)
            .map(|(&c, _)| c)
            .collect();
        for c in due {
            let Some((first, waiting)) = self.deferred.remove(&c) else { continue };
            if self.expected == 0 && self.queued == 0 {
                // Nobody is left to answer the waves before `first`: they never form.
                self.released = self.released.max(first);
            }
            self.add_child(c);
            if waiting.is_empty() {
                continue;
            }
            self.queued += waiting.len();
            let slot = &mut self.slots[c];
            let was_empty = slot.queue.is_empty();
            slot.queue.extend(waiting);
            // add_child made it expected, and so present.
            if was_empty {
                self.ready_children += 1;
            }
        }
    }

    /// Releases the time-out waves whose deadline is at or before `now`.
    pub fn poll(&mut self, now: Instant) -> Vec<Wave> {
        let mut waves = self.release_complete();
        waves.extend(self.release_expired(now));
        waves
    }

    /// When [`Synchronizer::poll`] must next be called: the deadline of the pending
    /// time-out wave, if any. Always `None` outside [`SyncMode::TimeOut`].
    pub fn next_deadline(&self) -> Option<Instant> {
        let SyncMode::TimeOut(ms) = self.mode else { return None };
        let oldest =
            self.present.iter().filter_map(|&c| self.slots[c].queue.front().map(|(_, t)| *t)).min()?;
        Some(oldest + Duration::from_millis(u64::from(ms)))
    }

    /// Number of live children expected in every wave.
    pub fn expected(&self) -> usize {
        self.expected
    }

    /// The live expected children, in increasing index.
    pub fn children(&self) -> impl Iterator<Item = usize> + '_ {
        self.present.iter().copied().filter(|&c| self.slots[c].expected)
    }

    /// Number of packets held, waiting for their wave.
    pub fn queued(&self) -> usize {
        self.queued + self.deferred.values().map(|(_, w)| w.len()).sum::<usize>()
    }

    fn wave_ready(&self) -> bool {
        self.queued > 0 && self.ready_children == self.expected
    }

    /// Releases complete waves; more than one only after membership changed.
    fn release_complete(&mut self) -> Vec<Wave> {
        let mut waves = Vec::new();
        while self.wave_ready() {
            waves.push(self.take_wave());
        }
        if !self.deferred.is_empty() {
            self.activate_deferred();
            if self.wave_ready() {
                waves.extend(self.release_complete());
            }
        }
        waves
    }

    /// Releases time-out waves whose deadline passed.
    #[inline]
    fn release_expired(&mut self, now: Instant) -> Vec<Wave> {
        if !matches!(self.mode, SyncMode::TimeOut(_)) {
            // Called twice for every packet: the other modes leave at once.
            return Vec::new();
        }
        let mut waves = Vec::new();
        while self.next_deadline().is_some_and(|d| d <= now) {
            waves.push(self.take_wave());
            // The invariant "no complete wave is held" still holds: an expected child
            // whose queue was empty still has an empty queue.
        }
        waves
    }

    /// Takes the head of every non-empty queue.
    fn take_wave(&mut self) -> Wave {
        let n = self.present.len();
        let mut wave =
            Wave { frames: Vec::with_capacity(n), children: Vec::with_capacity(n), index: self.released };
        let mut emptied_gone = false;
        for &child in &self.present {
            let slot = &mut self.slots[child];
            let Some((frame, _)) = slot.queue.pop_front() else { continue };
            wave.frames.push(frame);
            wave.children.push(child);
            self.queued -= 1;
            if slot.queue.is_empty() {
                if slot.expected {
                    self.ready_children -= 1;
                } else {
                    emptied_gone = true;
                }
            }
        }
        // A wave is taken only with a packet held: an empty one would be released for ever.
        debug_assert!(!wave.frames.is_empty(), "a wave with no packet");
        if emptied_gone {
            let slots = &self.slots;
            self.present.retain(|&c| slots[c].expected || !slots[c].queue.is_empty());
        }
        self.released += 1;
        if !self.deferred.is_empty() {
            self.activate_deferred();
        }
        wave
    }
}

/// Adds `more` to `waves`, taking it whole when `waves` is empty (usually): a
/// packet's one wave is not copied into a second list.
fn append(waves: &mut Vec<Wave>, more: Vec<Wave>) {
    if waves.is_empty() {
        *waves = more;
    } else {
        waves.extend(more);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use treecast_wire::FrameHeader;

    fn f(rank: u32, n: u8) -> Frame {
        Frame::new(FrameHeader::data(1, 0, rank), vec![n])
    }

    fn ids(wave: &Wave) -> Vec<(u32, u8)> {
        assert_eq!(wave.frames.len(), wave.children.len(), "one child per packet");
        wave.frames.iter().map(|f| (f.header.rank, f.payload[0])).collect()
    }

    #[test]
    fn wait_for_all_with_interleaved_arrivals() {
        let t = Instant::now();
        let mut s = Synchronizer::new(SyncMode::WaitForAll, [0, 1, 2]);
        assert!(s.push(0, f(0, 1), t).is_empty());
        assert!(s.push(0, f(0, 2), t).is_empty());
        assert!(s.push(2, f(2, 1), t).is_empty());
        assert!(s.push(2, f(2, 2), t).is_empty());
        assert_eq!(s.queued(), 4);
        let w = s.push(1, f(1, 1), t);
        assert_eq!(w.len(), 1);
        assert_eq!(ids(&w[0]), vec![(0, 1), (1, 1), (2, 1)]);
        assert_eq!(w[0].children, vec![0, 1, 2]);
        assert!(s.push(0, f(0, 3), t).is_empty());
        let w = s.push(1, f(1, 2), t);
        assert_eq!(ids(&w[0]), vec![(0, 2), (1, 2), (2, 2)]);
        assert_eq!(s.queued(), 1);
        assert_eq!(s.next_deadline(), None);
        assert!(s.poll(t + Duration::from_secs(100)).is_empty());
    }

    #[test]
    fn a_child_added_from_a_later_wave_neither_holds_up_nor_fills_the_waves_before() {
        let t = Instant::now();
        let mut s = Synchronizer::new(SyncMode::WaitForAll, [0, 1]);
        // Wave 0 is under way (child 0 answered); requests for waves 0 and 1 went out
        // before child 2 joined: it takes part from wave 2.
        assert!(s.push(0, f(0, 1), t).is_empty());
        s.add_child_from(2, 2);
        // Child 2 answers the first request it got (wave 2) before the others finish wave 0.
        assert!(s.push(2, f(2, 3), t).is_empty());
        let w = s.push(1, f(1, 1), t);
        assert_eq!(ids(&w[0]), vec![(0, 1), (1, 1)], "wave 0 does not wait for child 2");
        assert!(s.push(0, f(0, 2), t).is_empty());
        let w = s.push(1, f(1, 2), t);
        assert_eq!(ids(&w[0]), vec![(0, 2), (1, 2)], "nor does wave 1, and child 2's packet waits");
        assert_eq!(s.queued(), 1);
        assert!(s.push(0, f(0, 3), t).is_empty());
        let w = s.push(1, f(1, 3), t);
        assert_eq!(ids(&w[0]), vec![(0, 3), (1, 3), (2, 3)], "wave 2 includes it");
        assert_eq!(w[0].index, 2);
        assert_eq!(s.expected(), 3);
        assert_eq!(s.next_wave(), 3);
    }

    #[test]
    fn a_deferred_child_takes_part_at_once_when_no_one_else_is_left() {
        let t = Instant::now();
        let mut s = Synchronizer::new(SyncMode::WaitForAll, [0]);
        s.add_child_from(1, 5);
        assert!(s.push(1, f(1, 5), t).is_empty());
        // The only other child is lost: waves 0..5 will never form.
        let w = s.child_lost(0, t);
        assert_eq!(ids(&w[0]), vec![(1, 5)]);
        assert_eq!(w[0].index, 5, "waves 0 to 4 never formed");
        s.add_child_from(2, 9);
        assert_eq!(s.expected(), 1, "with child 1 expected, child 2 waits for wave 9");
        let mut d = Synchronizer::new(SyncMode::WaitForAll, []);
        d.add_child_from(0, 3);
        assert_eq!(ids(&d.push(0, f(0, 1), t)[0]), vec![(0, 1)], "nobody else: at once");
    }

    #[test]
    fn child_lost_mid_wave_completes_with_survivors() {
        let t = Instant::now();
        let mut s = Synchronizer::new(SyncMode::WaitForAll, [0, 1, 2]);
        assert!(s.push(0, f(0, 1), t).is_empty());
        assert!(s.push(2, f(2, 1), t).is_empty());
        let w = s.child_lost(1, t);
        assert_eq!(w.len(), 1);
        assert_eq!(ids(&w[0]), vec![(0, 1), (2, 1)]);
        assert_eq!(s.expected(), 2);
        // A late packet from the lost child does not make it expected again.
        assert!(s.push(1, f(1, 9), t).is_empty());
        assert_eq!(s.expected(), 2);
        assert!(s.push(0, f(0, 2), t).is_empty());
        let w = s.push(2, f(2, 2), t);
        assert_eq!(ids(&w[0]), vec![(0, 2), (1, 9), (2, 2)]);
        assert_eq!(s.queued(), 0);
    }

    #[test]
    fn lost_child_queued_packets_are_delivered_in_later_waves() {
        let t = Instant::now();
        let mut s = Synchronizer::new(SyncMode::WaitForAll, [0, 1]);
        for n in 1..=3 {
            assert!(s.push(0, f(0, n), t).is_empty());
        }
        // Child 0 dies with three packets queued: child 1 alone drives the waves.
        assert!(s.child_lost(0, t).is_empty());
        assert_eq!(s.queued(), 3);
        let w = s.push(1, f(1, 1), t);
        assert_eq!(ids(&w[0]), vec![(0, 1), (1, 1)]);
        // Degenerate case: the last expected child is lost, the backlog drains at once.
        let w = s.child_lost(1, t);
        assert_eq!(w.len(), 2);
        assert_eq!(ids(&w[0]), vec![(0, 2)]);
        assert_eq!(ids(&w[1]), vec![(0, 3)]);
        assert_eq!(s.queued(), 0);
        assert_eq!(s.expected(), 0);
    }

    #[test]
    fn unknown_child_becomes_expected() {
        let t = Instant::now();
        let mut s = Synchronizer::new(SyncMode::WaitForAll, [0]);
        assert!(s.push(5, f(5, 1), t).is_empty());
        assert_eq!(s.expected(), 2);
        let w = s.push(0, f(0, 1), t);
        assert_eq!(ids(&w[0]), vec![(0, 1), (5, 1)]);
        s.add_child(7);
        assert!(s.push(0, f(0, 2), t).is_empty());
        assert!(s.push(5, f(5, 2), t).is_empty());
        assert_eq!(s.push(7, f(7, 2), t).len(), 1);
    }

    #[test]
    fn timeout_releases_at_the_deadline_and_not_before() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut s = Synchronizer::new(SyncMode::TimeOut(100), [0, 1, 2]);
        assert_eq!(s.next_deadline(), None);
        assert!(s.push(1, f(1, 1), ms(10)).is_empty());
        assert_eq!(s.next_deadline(), Some(ms(110)));
        assert!(s.push(0, f(0, 1), ms(50)).is_empty());
        assert_eq!(s.next_deadline(), Some(ms(110)));
        assert!(s.poll(ms(109)).is_empty());
        let w = s.poll(ms(110));
        assert_eq!(w.len(), 1);
        assert_eq!(ids(&w[0]), vec![(0, 1), (1, 1)]);
        assert_eq!(s.next_deadline(), None);
        // A complete wave is released before its deadline.
        assert!(s.push(0, f(0, 2), ms(200)).is_empty());
        assert!(s.push(1, f(1, 2), ms(210)).is_empty());
        let w = s.push(2, f(2, 2), ms(220));
        assert_eq!(ids(&w[0]), vec![(0, 2), (1, 2), (2, 2)]);
        assert_eq!(s.next_deadline(), None);
    }

    #[test]
    fn timeout_packet_after_deadline_starts_a_new_wave() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut s = Synchronizer::new(SyncMode::TimeOut(100), [0, 1]);
        assert!(s.push(0, f(0, 1), ms(0)).is_empty());
        // The poll came late; the expired wave goes out alone, then child 1's packet
        // starts the next wave.
        let w = s.push(1, f(1, 1), ms(150));
        assert_eq!(w.len(), 1);
        assert_eq!(ids(&w[0]), vec![(0, 1)]);
        assert_eq!(s.next_deadline(), Some(ms(250)));
    }

    #[test]
    fn timeout_backlog_behind_a_silent_child_drains() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let mut s = Synchronizer::new(SyncMode::TimeOut(100), [0, 1]);
        assert!(s.push(0, f(0, 1), ms(0)).is_empty());
        assert!(s.push(0, f(0, 2), ms(10)).is_empty());
        assert!(s.push(0, f(0, 3), ms(20)).is_empty());
        // The push comes after two deadlines passed: both expired waves go out first.
        let w = s.push(0, f(0, 4), ms(115));
        assert_eq!(w.iter().map(ids).collect::<Vec<_>>(), vec![vec![(0, 1)], vec![(0, 2)]]);
        assert_eq!(s.next_deadline(), Some(ms(120)));
        assert!(s.poll(ms(119)).is_empty());
        let w = s.poll(ms(300));
        assert_eq!(w.iter().map(ids).collect::<Vec<_>>(), vec![vec![(0, 3)], vec![(0, 4)]]);
        assert_eq!(s.queued(), 0);
    }

    #[test]
    fn do_not_wait_releases_every_packet() {
        let t = Instant::now();
        let mut s = Synchronizer::new(SyncMode::DoNotWait, [0, 1]);
        let w = s.push(1, f(1, 1), t);
        assert_eq!(w.len(), 1);
        assert_eq!(ids(&w[0]), vec![(1, 1)]);
        assert_eq!(s.queued(), 0);
        assert_eq!(s.next_deadline(), None);
        assert!(s.child_lost(0, t).is_empty());
        assert_eq!(s.expected(), 1);
    }

    mod against_the_model {
        use super::super::model::Model;
        use super::*;
        use proptest::prelude::*;

        /// One call on a synchronizer, with the time that passed before it.
        #[derive(Debug, Clone)]
        enum Op {
            Push { child: usize, ms: u64 },
            Lost { child: usize, ms: u64 },
            Add { child: usize },
            AddFrom { child: usize, ahead: u64 },
            SkipTo { ahead: u64 },
            Poll { ms: u64 },
            LoseAll { ms: u64 },
        }

        fn op() -> impl Strategy<Value = Op> {
            let child = 0..5usize;
            prop_oneof![
                6 => (child.clone(), 0..4u64).prop_map(|(child, ms)| Op::Push { child, ms }),
                1 => (child.clone(), 0..4u64).prop_map(|(child, ms)| Op::Lost { child, ms }),
                1 => child.clone().prop_map(|child| Op::Add { child }),
                1 => (child, 0..4u64).prop_map(|(child, ahead)| Op::AddFrom { child, ahead }),
                1 => (0..4u64).prop_map(|ahead| Op::SkipTo { ahead }),
                1 => (0..8u64).prop_map(|ms| Op::Poll { ms }),
                1 => (0..4u64).prop_map(|ms| Op::LoseAll { ms }),
            ]
        }

        fn mode() -> impl Strategy<Value = SyncMode> {
            prop_oneof![
                3 => Just(SyncMode::WaitForAll),
                1 => Just(SyncMode::TimeOut(0)),
                2 => Just(SyncMode::TimeOut(5)),
                1 => Just(SyncMode::DoNotWait)
            ]
        }

        fn state(s: &Synchronizer) -> (usize, usize, Vec<usize>, u64, Option<Instant>) {
            (s.queued(), s.expected(), s.children().collect(), s.next_wave(), s.next_deadline())
        }

        fn check(s: &Synchronizer) {
            assert!(s.present.windows(2).all(|w| w[0] < w[1]), "present sorted {:?}", s.present);
            for (c, slot) in s.slots.iter().enumerate() {
                if slot.expected || !slot.queue.is_empty() {
                    assert!(s.present.contains(&c), "child {c} missing from present");
                }
                assert!(!(slot.expected && slot.lost));
            }
            assert_eq!(s.expected, s.slots.iter().filter(|x| x.expected).count());
            assert_eq!(
                s.ready_children,
                s.slots.iter().filter(|x| x.expected && !x.queue.is_empty()).count()
            );
            assert_eq!(s.queued, s.slots.iter().map(|x| x.queue.len()).sum::<usize>());
            if s.expected == 0 {
                assert!(s.deferred.is_empty() && s.queued == 0, "nobody expected: nothing held");
            }
            for &c in &s.present {
                assert!(s.slots[c].expected || !s.slots[c].queue.is_empty(), "stale {c} in present");
            }
        }

        fn model_state(m: &Model) -> (usize, usize, Vec<usize>, u64, Option<Instant>) {
            (m.queued(), m.expected(), m.children().collect(), m.next_wave(), m.next_deadline())
        }

        proptest! {
            /// Every call gives the waves and leaves the state that the first, ordered
            /// sets and maps version gives: membership changes, lost children's
            /// packets, deferred children and time-outs included.
            #[test]
            fn the_dense_synchronizer_behaves_as_the_model(
                mode in mode(),
                initial in proptest::collection::btree_set(0..7usize, 0..5),
                ops in proptest::collection::vec(op(), 1..120),
            ) {
                let mut now = Instant::now();
                let mut s = Synchronizer::new(mode, initial.iter().copied());
                let mut m = Model::new(mode, initial.iter().copied());
                for (n, op) in ops.into_iter().enumerate() {
                    let payload = [n as u8];
                    let (waves, model_waves) = match op {
                        Op::Push { child, ms } => {
                            now += Duration::from_millis(ms);
                            let frame = Frame::new(FrameHeader::data(1, 0, child as u32), payload.to_vec());
                            (s.push(child, frame.clone(), now), m.push(child, frame, now))
                        }
                        Op::Lost { child, ms } => {
                            now += Duration::from_millis(ms);
                            (s.child_lost(child, now), m.child_lost(child, now))
                        }
                        Op::Add { child } => {
                            s.add_child(child);
                            m.add_child(child);
                            (Vec::new(), Vec::new())
                        }
                        Op::AddFrom { child, ahead } => {
                            s.add_child_from(child, s.next_wave() + ahead);
                            m.add_child_from(child, m.next_wave() + ahead);
                            (Vec::new(), Vec::new())
                        }
                        Op::SkipTo { ahead } => {
                            s.skip_to(s.next_wave() + ahead);
                            m.skip_to(m.next_wave() + ahead);
                            (Vec::new(), Vec::new())
                        }
                        Op::LoseAll { ms } => {
                            now += Duration::from_millis(ms);
                            let all: Vec<usize> = m.children().collect();
                            let (mut a, mut b) = (Vec::new(), Vec::new());
                            for c in all {
                                a.extend(s.child_lost(c, now));
                                b.extend(m.child_lost(c, now));
                            }
                            (a, b)
                        }
                        Op::Poll { ms } => {
                            now += Duration::from_millis(ms);
                            (s.poll(now), m.poll(now))
                        }
                    };
                    prop_assert_eq!(waves, model_waves, "waves after call {}", n);
                    prop_assert_eq!(state(&s), model_state(&m), "state after call {}", n);
                    check(&s);
                }
            }
        }
    }
}
