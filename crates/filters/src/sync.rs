//! Synchronization: grouping the packets that arrive from a node's children into waves.
//!
//! [`Synchronizer`] is a pure state machine: packets and failures come in through
//! [`Synchronizer::push`] and [`Synchronizer::child_lost`], the passing of time through
//! [`Synchronizer::poll`], and every call returns the waves it completed. It never
//! reads a clock; the caller arms a timer at [`Synchronizer::next_deadline`].

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use treecast_wire::{Frame, SyncMode};

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
    /// Live children expected in every wave.
    expected: BTreeSet<usize>,
    /// Children reported lost and not added again.
    lost: BTreeSet<usize>,
    /// Queued packets with their arrival time; the entry of a child that is not
    /// expected is removed when its queue empties.
    queues: BTreeMap<usize, VecDeque<(Frame, Instant)>>,
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

impl Synchronizer {
    /// A synchronizer in `mode` expecting a packet from each of `children` (indices
    /// chosen by the caller, e.g. the position of the child link) in every wave.
    pub fn new(mode: SyncMode, children: impl IntoIterator<Item = usize>) -> Self {
        Synchronizer {
            mode,
            expected: children.into_iter().collect(),
            lost: BTreeSet::new(),
            queues: BTreeMap::new(),
            ready_children: 0,
            queued: 0,
            released: 0,
            deferred: BTreeMap::new(),
        }
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
            if !self.lost.contains(&child) {
                self.expected.insert(child);
            }
            return vec![Wave { frames: vec![frame], children: vec![child], index: 0 }];
        }
        if let Some((_, waiting)) = self.deferred.get_mut(&child) {
            waiting.push_back((frame, now));
            return self.release_expired(now);
        }
        let mut waves = self.release_expired(now);
        let mut expected = self.expected.contains(&child);
        if !expected && !self.lost.contains(&child) && self.expected.insert(child) {
            expected = true;
            // A newly learnt child: its queue (if any) now counts toward readiness.
            if self.queues.get(&child).is_some_and(|q| !q.is_empty()) {
                self.ready_children += 1;
            }
        }
        let queue = self.queues.entry(child).or_default();
        queue.push_back((frame, now));
        if queue.len() == 1 && expected {
            self.ready_children += 1;
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
        self.lost.insert(child);
        if self.expected.remove(&child) {
            match self.queues.get(&child) {
                Some(q) if !q.is_empty() => self.ready_children -= 1,
                Some(_) => {
                    self.queues.remove(&child);
                }
                None => {}
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
        self.lost.remove(&child);
        if self.expected.insert(child) && self.queues.get(&child).is_some_and(|q| !q.is_empty()) {
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
        if self.expected.is_empty() && self.queued == 0 {
            self.released = self.released.max(first);
        }
        if first <= self.released || self.expected.is_empty() {
            return self.add_child(child);
        }
        self.lost.remove(&child);
        self.deferred.insert(child, (first, VecDeque::new()));
    }

    /// Waves before `first` will never form: nobody is left to answer them. The count
    /// jumps to `first` (only while no child is expected and nothing is queued).
    pub fn skip_to(&mut self, first: u64) {
        if self.expected.is_empty() && self.queued == 0 && self.deferred.is_empty() {
            self.released = self.released.max(first);
        }
    }

    /// Index of the next wave to be released.
    pub fn next_wave(&self) -> u64 {
        self.released
    }

    /// Deferred children whose first wave is next (or that no one else can hold
    /// back any longer) become expected, with the packets they sent meanwhile.
    fn activate_deferred(&mut self) {
        let due: Vec<usize> = self
            .deferred
            .iter()
            .filter(|(_, (first, _))| *first <= self.released || self.expected.is_empty())
            .map(|(&c, _)| c)
            .collect();
        for c in due {
            let Some((first, waiting)) = self.deferred.remove(&c) else { continue };
            if self.expected.is_empty() && self.queued == 0 {
                // Nobody is left to answer the waves before `first`: they never form.
                self.released = self.released.max(first);
            }
            self.add_child(c);
            if waiting.is_empty() {
                continue;
            }
            let queue = self.queues.entry(c).or_default();
            let was_empty = queue.is_empty();
            self.queued += waiting.len();
            queue.extend(waiting);
            if was_empty && self.expected.contains(&c) {
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
        let oldest = self.queues.values().filter_map(|q| q.front().map(|(_, t)| *t)).min()?;
        Some(oldest + Duration::from_millis(u64::from(ms)))
    }

    /// Number of live children expected in every wave.
    pub fn expected(&self) -> usize {
        self.expected.len()
    }

    /// The live expected children, in increasing index.
    pub fn children(&self) -> impl Iterator<Item = usize> + '_ {
        self.expected.iter().copied()
    }

    /// Number of packets held, waiting for their wave.
    pub fn queued(&self) -> usize {
        self.queued + self.deferred.values().map(|(_, w)| w.len()).sum::<usize>()
    }

    fn wave_ready(&self) -> bool {
        self.queued > 0 && self.ready_children == self.expected.len()
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
        let n = self.queues.len();
        let mut wave =
            Wave { frames: Vec::with_capacity(n), children: Vec::with_capacity(n), index: self.released };
        let mut emptied_gone = Vec::new();
        for (child, queue) in &mut self.queues {
            let Some((frame, _)) = queue.pop_front() else { continue };
            wave.frames.push(frame);
            wave.children.push(*child);
            self.queued -= 1;
            if queue.is_empty() {
                if self.expected.contains(child) {
                    self.ready_children -= 1;
                } else {
                    emptied_gone.push(*child);
                }
            }
        }
        for child in emptied_gone {
            self.queues.remove(&child);
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
}
