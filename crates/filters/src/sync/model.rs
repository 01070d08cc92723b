//! The synchronizer as it was first written, over ordered sets and maps: the
//! reference the property test holds the dense one to, operation by operation.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::time::{Duration, Instant};

use treecast_wire::{Frame, SyncMode};

use super::{append, Wave};

#[derive(Debug, Clone)]
pub(crate) struct Model {
    mode: SyncMode,
    expected: BTreeSet<usize>,
    lost: BTreeSet<usize>,
    queues: BTreeMap<usize, VecDeque<(Frame, Instant)>>,
    ready_children: usize,
    queued: usize,
    released: u64,
    deferred: BTreeMap<usize, (u64, VecDeque<(Frame, Instant)>)>,
}

impl Model {
    pub(crate) fn new(mode: SyncMode, children: impl IntoIterator<Item = usize>) -> Self {
        Model {
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

    pub(crate) fn push(&mut self, child: usize, frame: Frame, now: Instant) -> Vec<Wave> {
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

    pub(crate) fn child_lost(&mut self, child: usize, now: Instant) -> Vec<Wave> {
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

    pub(crate) fn add_child(&mut self, child: usize) {
        self.lost.remove(&child);
        if self.expected.insert(child) && self.queues.get(&child).is_some_and(|q| !q.is_empty()) {
            self.ready_children += 1;
        }
    }

    pub(crate) fn add_child_from(&mut self, child: usize, first: u64) {
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

    pub(crate) fn skip_to(&mut self, first: u64) {
        if self.expected.is_empty() && self.queued == 0 && self.deferred.is_empty() {
            self.released = self.released.max(first);
        }
    }

    pub(crate) fn next_wave(&self) -> u64 {
        self.released
    }

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

    pub(crate) fn poll(&mut self, now: Instant) -> Vec<Wave> {
        let mut waves = self.release_complete();
        waves.extend(self.release_expired(now));
        waves
    }

    pub(crate) fn next_deadline(&self) -> Option<Instant> {
        let SyncMode::TimeOut(ms) = self.mode else { return None };
        let oldest = self.queues.values().filter_map(|q| q.front().map(|(_, t)| *t)).min()?;
        Some(oldest + Duration::from_millis(u64::from(ms)))
    }

    pub(crate) fn expected(&self) -> usize {
        self.expected.len()
    }

    pub(crate) fn children(&self) -> impl Iterator<Item = usize> + '_ {
        self.expected.iter().copied()
    }

    pub(crate) fn queued(&self) -> usize {
        self.queued + self.deferred.values().map(|(_, w)| w.len()).sum::<usize>()
    }

    fn wave_ready(&self) -> bool {
        self.queued > 0 && self.ready_children == self.expected.len()
    }

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
