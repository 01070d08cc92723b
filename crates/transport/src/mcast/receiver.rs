//! The receiving side: one child assembling its parent's multicast messages in
//! order (several at once, as the sender has several under way), NACKing the
//! fragments it misses (all it knows of, in one answer) after a random back-off,
//! and ACKing what it must.

use std::collections::{BTreeMap, VecDeque};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use treecast_wire::{McastAnswer, McastHeader, McastKind, MCAST_MAX_HOLES};

use super::{McastConfig, MAX_IN_FLIGHT};

/// What the receiver hands its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiverEvent {
    /// A whole message, in the order the sender queued them.
    Message {
        /// Its stream.
        stream: u32,
        /// Its id.
        message: u32,
        /// Its bytes.
        data: Bytes,
    },
    /// The sender went on past messages this receiver never got (it was reported
    /// lost): the link must be treated as failed.
    Missed {
        /// First message missed.
        from: u32,
        /// The message the sender is at now.
        to: u32,
    },
    /// In the middle of a message nothing came from the sender for the silent
    /// limit, NACKs notwithstanding: the link must be treated as failed.
    SenderSilent {
        /// The message that stopped.
        message: u32,
    },
    /// A message grew past the configured largest one: it is dropped and the link
    /// must be treated as failed.
    TooLarge {
        /// The message.
        message: u32,
        /// Its size so far.
        bytes: u64,
    },
}

/// What the receiver did, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReceiverStats {
    /// Fragments taken in order.
    pub fragments: u64,
    /// Fragments already held (duplicates and go-back resends).
    pub duplicates: u64,
    /// Fragments that arrived after a gap (kept, within bounds, until it is filled).
    pub out_of_order: u64,
    /// NACKs sent.
    pub nacks: u64,
    /// ACKs sent.
    pub acks: u64,
    /// Receiver time-outs (a NACK because nothing came in the middle of a message).
    pub timeouts: u64,
    /// Data datagrams of a shape the sender never makes (not on a fragment boundary,
    /// a fragment other than the last not full, an end that moved): dropped.
    pub invalid: u64,
}

/// One message being assembled.
#[derive(Debug, Default)]
struct Assembly {
    /// Its bytes so far, from the start.
    buf: BytesMut,
    /// Its length, once its last fragment arrived.
    end: Option<u32>,
    /// Fragments past the first gap, by offset, kept until the gap is filled.
    ahead: BTreeMap<u32, Bytes>,
    ahead_bytes: usize,
    /// A fragment of it arrived: the receiver time-out runs while it is not whole.
    started: bool,
    /// Whole, with its stream: it waits for the messages before it.
    whole: Option<u32>,
    /// End of the furthest fragment kept past a gap, or of the last fragment once
    /// it came (0 before any).
    furthest: u32,
    /// Missing fragments asked for, by offset, and when: a fragment is not asked
    /// for again sooner than the repeat interval.
    asked: BTreeMap<u32, Instant>,
    /// A gap was seen: the NACK is due then, unless a repair fills the gap first.
    nack_at: Option<Instant>,
}

impl Assembly {
    fn have(&self) -> u32 {
        self.buf.len() as u32
    }

    fn in_progress(&self) -> bool {
        self.started && self.whole.is_none()
    }

    /// Something past the bytes held arrived: a gap.
    fn has_gap(&self) -> bool {
        self.whole.is_none() && (!self.ahead.is_empty() || self.end.is_some_and(|e| e > self.have()))
    }
}

/// The receiver of one group's messages at one child.
#[derive(Debug)]
pub struct Receiver {
    config: McastConfig,
    me: u32,
    group: u32,
    /// Next message to hand on: the first of `slots`.
    expect: u32,
    /// Messages `expect`, `expect + 1`, … being assembled (the sender has up to
    /// `in_flight` under way, at most [`MAX_IN_FLIGHT`]).
    slots: VecDeque<Assembly>,
    last_data: Option<Instant>,
    /// When data of a message in progress last came (the time-out's NACKs do not
    /// move it), for giving up on a silent sender.
    heard_data: Option<Instant>,
    /// Draws the NACK back-off.
    rng: StdRng,
    out: VecDeque<(McastHeader, McastAnswer)>,
    events: VecDeque<ReceiverEvent>,
    stats: ReceiverStats,
}

impl Receiver {
    /// Receiver `me` of `group`'s messages, the first being `first`.
    pub fn new(config: McastConfig, me: u32, group: u32, first: u32) -> Receiver {
        let config = config.sanitized();
        Receiver {
            config,
            me,
            group,
            expect: first,
            slots: VecDeque::new(),
            last_data: None,
            heard_data: None,
            rng: StdRng::seed_from_u64((u64::from(group) << 32) | u64::from(me)),
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: ReceiverStats::default(),
        }
    }

    /// A data datagram of the group.
    pub fn handle_data(&mut self, header: &McastHeader, payload: &[u8], now: Instant) {
        if header.kind != McastKind::Data || header.group != self.group {
            return;
        }
        let (m, offset) = (header.message, header.offset);
        if !self.well_formed(header, payload.len()) {
            self.stats.invalid += 1;
            return;
        }
        let end = offset.saturating_add(payload.len() as u32);
        let mut ahead = m.wrapping_sub(self.expect);
        if ahead >= u32::MAX / 2 {
            // An old message: its last fragment again means the final ACK was lost.
            if !header.more() {
                self.answer(McastKind::Ack, m, end, end, Vec::new());
            }
            return;
        }
        if ahead >= MAX_IN_FLIGHT {
            // The sender completed messages without this receiver.
            self.events.push_back(ReceiverEvent::Missed { from: self.expect, to: m });
            self.restart(m);
            ahead = 0;
        }
        let i = ahead as usize;
        if self.slots.len() <= i {
            self.slots.resize_with(i + 1, Assembly::default);
        }
        let slot = &mut self.slots[i];
        if slot.whole.is_some() {
            // Whole, waiting for the messages before it: a duplicate.
            self.stats.duplicates += 1;
            let have = slot.have();
            if !header.more() || header.rank == self.me {
                self.answer(McastKind::Ack, m, have, have, Vec::new());
            }
            return;
        }
        let have = slot.have();
        let end_moved = match (header.more(), slot.end) {
            (false, Some(known)) => known != end,
            (false, None) => end < have,
            (true, Some(known)) => end >= known,
            (true, None) => false,
        };
        if end_moved {
            self.stats.invalid += 1;
            return;
        }
        if !header.more() {
            slot.end = Some(end);
        }
        slot.started = true;
        self.last_data = Some(now);
        self.heard_data = Some(now);
        if offset > have {
            // Past a gap: kept (within bounds) for when the gap is filled, and NACKed.
            self.stats.out_of_order += 1;
            // Not the last fragment, which the sender resends on its own to ask for
            // answers: kept, it would make every later fragment look like a gap.
            let limit = self.ahead_limit();
            let slot = &mut self.slots[i];
            let keep = header.more() && slot.ahead_bytes + payload.len() <= limit;
            if keep && !slot.ahead.contains_key(&offset) {
                slot.ahead_bytes += payload.len();
                slot.ahead.insert(offset, Bytes::copy_from_slice(payload));
            }
            // What it holds, or the message's end: a fragment dropped for the limit
            // must not move the sender's window on.
            if keep || !header.more() {
                slot.furthest = slot.furthest.max(end);
            }
            // The acker answers every fragment, past a gap too: its furthest byte
            // keeps the sender's window moving while the gap is repaired.
            if header.rank == self.me {
                self.ack_progress(i, m);
            }
            self.gap(i, now);
            return;
        }
        let empty_end = payload.is_empty() && !header.more() && offset == have;
        if end <= have && !empty_end {
            self.stats.duplicates += 1;
            if header.rank == self.me {
                self.ack_progress(i, m);
            }
            return;
        }
        if !self.take(i, m, &payload[(have - offset) as usize..]) {
            return;
        }
        self.stats.fragments += 1;
        if !self.take_ahead(i, m) {
            return;
        }
        let slot = &mut self.slots[i];
        let have = slot.have();
        if slot.end == Some(have) {
            slot.whole = Some(header.stream);
            slot.nack_at = None;
            slot.asked.clear();
            self.answer(McastKind::Ack, m, have, have, Vec::new());
            self.hand_on();
            return;
        }
        if slot.has_gap() {
            // Fragments past `have` are here: the next gap is known at once.
            self.gap(i, now);
        } else {
            self.slots[i].nack_at = None;
        }
        if header.rank == self.me {
            self.ack_progress(i, m);
        }
    }

    /// The acker's ACK of message `m` (slot `i`): the bytes held and the furthest.
    fn ack_progress(&mut self, i: usize, m: u32) {
        let slot = &self.slots[i];
        let (have, furthest) = (slot.have(), slot.furthest.max(slot.have()));
        self.answer(McastKind::Ack, m, have, furthest, Vec::new());
    }

    /// Hands on, in order, the whole messages at the front.
    fn hand_on(&mut self) {
        while let Some(stream) = self.slots.front().and_then(|s| s.whole) {
            if let Some(slot) = self.slots.pop_front() {
                let data = slot.buf.freeze();
                self.events.push_back(ReceiverEvent::Message { stream, message: self.expect, data });
            }
            self.expect = self.expect.wrapping_add(1);
        }
    }

    /// Message `expect + i` has a gap: NACK it now, or after a random back-off
    /// during which the repair another receiver asked for may fill it.
    fn gap(&mut self, i: usize, now: Instant) {
        let backoff = self.config.nack_backoff;
        if backoff.is_zero() {
            return self.nack(i, now);
        }
        if self.slots[i].nack_at.is_none() {
            let wait = backoff.mul_f64(self.rng.gen::<f64>());
            self.slots[i].nack_at = Some(now + wait);
        }
    }

    /// Bytes kept past a gap at most, per message ([`McastConfig::keep_past_gap`]).
    fn ahead_limit(&self) -> usize {
        usize::try_from(self.config.keep_past_gap()).unwrap_or(usize::MAX)
    }

    /// Appends `fresh` to message `m` (slot `i`); false (and every message dropped)
    /// past the size limit.
    fn take(&mut self, i: usize, m: u32, fresh: &[u8]) -> bool {
        let slot = &mut self.slots[i];
        let total = slot.buf.len() as u64 + fresh.len() as u64;
        if total > u64::from(self.config.max_message) {
            self.events.push_back(ReceiverEvent::TooLarge { message: m, bytes: total });
            self.restart(m.wrapping_add(1));
            return false;
        }
        slot.buf.extend_from_slice(fresh);
        true
    }

    /// Appends the fragments kept past the gap that now follow on; false when the
    /// message was dropped for its size.
    fn take_ahead(&mut self, i: usize, m: u32) -> bool {
        loop {
            let slot = &mut self.slots[i];
            let have = slot.have();
            let Some(entry) = slot.ahead.first_entry() else { return true };
            if *entry.key() > have {
                return true;
            }
            let (offset, bytes) = entry.remove_entry();
            slot.ahead_bytes -= bytes.len();
            let end = offset.saturating_add(bytes.len() as u32);
            if end > have && !self.take(i, m, &bytes[(have - offset) as usize..]) {
                return false;
            }
        }
    }

    /// The shape every sender's fragment has: on a fragment boundary, full unless
    /// it is the last, the last no longer than a fragment. Anything else would let a
    /// peer fill the buffer past a gap with empty fragments.
    fn well_formed(&self, header: &McastHeader, len: usize) -> bool {
        let f = self.config.fragment;
        header.offset % f == 0 && if header.more() { len == f as usize } else { len <= f as usize }
    }

    fn restart(&mut self, next: u32) {
        self.expect = next;
        self.slots.clear();
    }

    /// NACKs every fragment of message `expect + i` it knows to be missing (from
    /// the first byte it lacks to the furthest it holds, at least the first, no
    /// further than what it may keep past a gap) and did not ask for within the
    /// repeat interval, up to [`MCAST_MAX_HOLES`].
    fn nack(&mut self, i: usize, now: Instant) {
        let message = self.expect.wrapping_add(i as u32);
        let (fragment, repeat) = (self.config.fragment, self.config.nack_repeat);
        let keep_span = u32::try_from(self.ahead_limit()).unwrap_or(u32::MAX);
        let slot = &mut self.slots[i];
        slot.nack_at = None;
        let have = slot.have();
        slot.asked.retain(|&offset, _| offset >= have);
        let furthest = slot.furthest.max(have);
        // The holes are the spaces between the fragments kept past the gap, walked
        // in order (no lookup per fragment), up to the furthest.
        let stop = furthest.min(have.saturating_add(keep_span)).max(have.saturating_add(1));
        // The last fragment came when `end` is known, but is not kept past a gap: it
        // is asked for once it is the first missing.
        let last = slot.end.map(|e| e.saturating_sub(1) / fragment * fragment);
        let mut holes = Vec::new();
        let mut cursor = have;
        let mut kept = slot.ahead.range(have..).map(|(&o, b)| (o, o.saturating_add(b.len() as u32)));
        'walk: loop {
            let next_kept = kept.next();
            let gap_end = next_kept.map_or(stop, |(o, _)| o.min(stop));
            while cursor < gap_end {
                if holes.len() == MCAST_MAX_HOLES {
                    break 'walk;
                }
                let asked =
                    slot.asked.get(&cursor).is_some_and(|&at| now.saturating_duration_since(at) < repeat);
                let came = last == Some(cursor) && cursor > have;
                if !asked && !came {
                    holes.push(cursor);
                }
                let Some(next) = cursor.checked_add(fragment) else { break 'walk };
                cursor = next;
            }
            match next_kept {
                Some((_, end)) if end < stop => cursor = cursor.max(end),
                _ => break,
            }
        }
        if holes.is_empty() {
            return;
        }
        for &hole in &holes {
            slot.asked.insert(hole, now);
        }
        self.answer(McastKind::Nack, message, have, furthest, holes);
    }

    fn answer(&mut self, kind: McastKind, message: u32, offset: u32, furthest: u32, holes: Vec<u32>) {
        match kind {
            McastKind::Ack => self.stats.acks += 1,
            McastKind::Nack => self.stats.nacks += 1,
            McastKind::Data => {}
        }
        let header = McastHeader::answer(kind, self.group, self.me, 0, message, offset);
        self.out.push_back((header, McastAnswer { furthest, holes }));
    }

    fn in_message(&self) -> bool {
        self.slots.iter().any(Assembly::in_progress)
    }

    /// Timers: the NACK back-off, and the receiver time-out: in the middle of a
    /// message and nothing heard, it NACKs what it misses (which also tells the
    /// sender it is alive).
    pub fn handle_timeout(&mut self, now: Instant) {
        let silent =
            self.heard_data.is_some_and(|t| now.saturating_duration_since(t) >= self.config.silent_limit);
        if silent {
            if let Some(i) = self.slots.iter().position(Assembly::in_progress) {
                let message = self.expect.wrapping_add(i as u32);
                self.events.push_back(ReceiverEvent::SenderSilent { message });
                for s in &mut self.slots {
                    s.started = false;
                    s.nack_at = None;
                }
                return;
            }
        }
        for i in 0..self.slots.len() {
            if self.slots[i].nack_at.is_some_and(|at| at <= now) {
                self.slots[i].nack_at = None;
                if self.slots[i].has_gap() {
                    self.nack(i, now);
                }
            }
        }
        let timed_out =
            self.in_message() && self.last_data.is_some_and(|t| now >= t + self.config.receiver_timeout);
        if timed_out {
            self.last_data = Some(now);
            self.stats.timeouts += 1;
            for i in 0..self.slots.len() {
                if self.slots[i].in_progress() {
                    self.slots[i].asked.clear();
                    self.nack(i, now);
                }
            }
        }
    }

    /// When [`Receiver::handle_timeout`] must run next.
    pub fn deadline(&self) -> Option<Instant> {
        let backoff = self.slots.iter().filter_map(|s| s.nack_at).min();
        let timeout =
            if self.in_message() { self.last_data.map(|t| t + self.config.receiver_timeout) } else { None };
        [backoff, timeout].into_iter().flatten().min()
    }

    /// Next ACK or NACK to send to the sender by unicast, with its payload.
    pub fn poll_answer(&mut self) -> Option<(McastHeader, McastAnswer)> {
        self.out.pop_front()
    }

    /// Next event for the driver.
    pub fn poll_event(&mut self) -> Option<ReceiverEvent> {
        self.events.pop_front()
    }

    /// The group whose messages it receives.
    pub fn group(&self) -> u32 {
        self.group
    }

    /// What the receiver did so far.
    pub fn stats(&self) -> ReceiverStats {
        self.stats
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Fragments of 4 bytes, NACKs at once: what most tests here read.
    fn tiny() -> McastConfig {
        McastConfig { fragment: 4, nack_backoff: std::time::Duration::ZERO, ..McastConfig::default() }
    }

    fn data(message: u32, offset: u32, more: bool, acker: u32) -> McastHeader {
        McastHeader::data(1, 0, message, offset, more, acker)
    }

    fn answers(r: &mut Receiver) -> Vec<(McastKind, u32, u32)> {
        std::iter::from_fn(|| r.poll_answer()).map(|(h, _)| (h.kind, h.message, h.offset)).collect()
    }

    #[test]
    fn one_nack_asks_for_every_missing_fragment_and_none_again_within_the_repeat_interval() {
        let config = tiny();
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        // Fragments 0, 2 and 5 arrive: 1, 3 and 4 are missing.
        for (offset, bytes) in [(0, b"abcd"), (8, b"ijkl"), (20, b"uvwx")] {
            r.handle_data(&data(0, offset, true, 9), bytes, now);
        }
        let all: Vec<(McastHeader, McastAnswer)> = std::iter::from_fn(|| r.poll_answer()).collect();
        let holes: Vec<(u32, u32, Vec<u32>)> =
            all.iter().map(|(h, a)| (h.offset, a.furthest, a.holes.clone())).collect();
        // The first NACK came with fragment 2; fragment 5's asks only for what is new.
        assert_eq!(holes, [(4, 12, vec![4]), (4, 24, vec![12, 16])]);
        // Within the repeat interval nothing is asked again; after it, all still missing.
        r.handle_data(&data(0, 24, true, 9), b"yzAB", now);
        assert!(answers(&mut r).is_empty());
        r.handle_data(&data(0, 12, true, 9), b"mnop", now + config.nack_repeat);
        let (h, a) = r.poll_answer().unwrap();
        assert_eq!((h.kind, h.offset, a.furthest, a.holes), (McastKind::Nack, 4, 28, vec![4, 16]));
    }

    #[test]
    fn the_acker_acks_past_a_gap_with_the_furthest_byte_it_holds() {
        let config = McastConfig {
            fragment: 4,
            nack_backoff: std::time::Duration::from_millis(1),
            ..McastConfig::default()
        };
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        r.handle_data(&data(0, 0, true, 5), b"abcd", now);
        r.handle_data(&data(0, 8, true, 5), b"ijkl", now);
        r.handle_data(&data(0, 12, true, 5), b"mnop", now);
        let acks: Vec<(McastKind, u32, u32)> =
            std::iter::from_fn(|| r.poll_answer()).map(|(h, a)| (h.kind, h.offset, a.furthest)).collect();
        assert_eq!(acks, [(McastKind::Ack, 4, 4), (McastKind::Ack, 4, 12), (McastKind::Ack, 4, 16)]);
    }

    #[test]
    fn a_gap_is_nacked_once_per_repeat_interval_and_the_acker_acks_every_fragment() {
        let config = tiny();
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        r.handle_data(&data(0, 0, true, 9), b"abcd", now);
        assert!(answers(&mut r).is_empty(), "not the acker: nothing to say");
        r.handle_data(&data(0, 8, true, 9), b"ijkl", now);
        r.handle_data(&data(0, 12, true, 9), b"mnop", now);
        assert_eq!(answers(&mut r), [(McastKind::Nack, 0, 4)], "one NACK for the gap");
        r.handle_data(&data(0, 12, true, 9), b"mnop", now + config.nack_repeat);
        assert_eq!(answers(&mut r), [(McastKind::Nack, 0, 4)]);
        // The gap filled: the fragments kept past it follow on, and the acker acks all.
        r.handle_data(&data(0, 4, true, 5), b"efgh", now);
        assert_eq!(answers(&mut r), [(McastKind::Ack, 0, 16)], "the acker acks");
        r.handle_data(&data(0, 16, false, 9), b"qr", now);
        assert_eq!(answers(&mut r), [(McastKind::Ack, 0, 18)], "every receiver acks the end");
        let got = r.poll_event().unwrap();
        let whole = Bytes::from_static(b"abcdefghijklmnopqr");
        assert_eq!(got, ReceiverEvent::Message { stream: 0, message: 0, data: whole });
        // The end again (a final ACK was lost): acknowledged again.
        r.handle_data(&data(0, 16, false, 9), b"qr", now);
        assert_eq!(answers(&mut r), [(McastKind::Ack, 0, 18)]);
        assert_eq!(r.stats().out_of_order, 3);
    }

    #[test]
    fn fragments_of_a_shape_no_sender_makes_are_dropped_and_counted() {
        let config = tiny();
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        // Empty or short fragments with "more", off a boundary, or a last one too long.
        r.handle_data(&data(0, 8, true, 9), b"", now);
        r.handle_data(&data(0, 8, true, 9), b"ab", now);
        r.handle_data(&data(0, 6, true, 9), b"abcd", now);
        r.handle_data(&data(0, 8, false, 9), b"abcde", now);
        assert_eq!(r.stats().invalid, 4);
        assert!(r.slots.iter().all(|s| s.ahead.is_empty()) && answers(&mut r).is_empty());
        // A last fragment fixes the end; another end for the same message is refused.
        r.handle_data(&data(0, 8, false, 9), b"ij", now);
        r.handle_data(&data(0, 8, false, 9), b"i", now);
        r.handle_data(&data(0, 12, true, 9), b"mnop", now);
        assert_eq!(r.stats().invalid, 6);
    }

    #[test]
    fn a_sender_silent_past_the_limit_in_the_middle_of_a_message_is_reported() {
        let config = tiny();
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        r.handle_data(&data(0, 0, true, 9), b"abcd", now);
        let mut t = now;
        while r.poll_event().is_none() {
            t = r.deadline().unwrap();
            r.handle_timeout(t);
        }
        assert!(t.saturating_duration_since(now) >= config.silent_limit);
        assert_eq!(r.deadline(), None, "it stops asking");
        let nacks = answers(&mut r).len() as u32;
        assert!(
            nacks >= config.silent_limit.as_millis() as u32 / config.receiver_timeout.as_millis() as u32 - 1
        );
    }

    #[test]
    fn silence_in_the_middle_of_a_message_is_nacked_and_idle_silence_is_not() {
        let config = tiny();
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        assert_eq!(r.deadline(), None);
        r.handle_data(&data(0, 0, true, 9), b"abcd", now);
        assert_eq!(r.deadline(), Some(now + config.receiver_timeout));
        r.handle_timeout(now + config.receiver_timeout);
        assert_eq!(answers(&mut r), [(McastKind::Nack, 0, 4)]);
        assert_eq!(r.deadline(), Some(now + config.receiver_timeout * 2));
    }

    #[test]
    fn a_skipped_message_or_an_oversized_one_is_reported() {
        let config = McastConfig {
            fragment: 4,
            nack_backoff: std::time::Duration::ZERO,
            max_message: 6,
            ..McastConfig::default()
        };
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        // A message as far ahead as the sender may have under way waits its turn.
        r.handle_data(&data(MAX_IN_FLIGHT - 1, 0, false, 9), b"ab", now);
        assert_eq!(r.poll_event(), None);
        // One further means the sender went on without this receiver.
        let far = MAX_IN_FLIGHT + 2;
        r.handle_data(&data(far, 0, false, 9), b"ab", now);
        assert_eq!(r.poll_event(), Some(ReceiverEvent::Missed { from: 0, to: far }));
        assert!(matches!(r.poll_event(), Some(ReceiverEvent::Message { message, .. }) if message == far));
        r.handle_data(&data(far + 1, 0, true, 9), b"abcd", now);
        r.handle_data(&data(far + 1, 4, true, 9), b"efgh", now);
        assert_eq!(r.poll_event(), Some(ReceiverEvent::TooLarge { message: far + 1, bytes: 8 }));
        // Another group's datagrams are not for it.
        r.handle_data(&McastHeader::data(2, 0, far + 2, 0, false, 9), b"x", now);
        assert_eq!(r.poll_event(), None);
    }

    #[test]
    fn later_messages_are_assembled_meanwhile_and_handed_on_in_order() {
        let config = tiny();
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        // Message 0 misses its first fragment; 1 and 2 arrive whole meanwhile.
        r.handle_data(&data(0, 4, false, 9), b"ef", now);
        assert_eq!(answers(&mut r), [(McastKind::Nack, 0, 0)]);
        r.handle_data(&data(1, 0, false, 9), b"xy", now);
        r.handle_data(&data(2, 0, true, 9), b"1234", now);
        r.handle_data(&data(2, 4, false, 9), b"5", now);
        assert_eq!(answers(&mut r), [(McastKind::Ack, 1, 2), (McastKind::Ack, 2, 5)], "acked whole at once");
        assert_eq!(r.poll_event(), None, "but they wait for message 0");
        // Message 1's end again: acknowledged again while it waits.
        r.handle_data(&data(1, 0, false, 9), b"xy", now);
        assert_eq!(answers(&mut r), [(McastKind::Ack, 1, 2)]);
        r.handle_data(&data(0, 0, true, 9), b"abcd", now);
        // The last fragment past the gap was not kept (the sender resends it on its own).
        assert_eq!(answers(&mut r), [(McastKind::Nack, 0, 4)]);
        assert_eq!(r.poll_event(), None);
        r.handle_data(&data(0, 4, false, 9), b"ef", now);
        assert_eq!(answers(&mut r), [(McastKind::Ack, 0, 6)]);
        let got: Vec<(u32, Bytes)> = std::iter::from_fn(|| r.poll_event())
            .map(|e| match e {
                ReceiverEvent::Message { message, data, .. } => (message, data),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                (0, Bytes::from_static(b"abcdef")),
                (1, Bytes::from_static(b"xy")),
                (2, Bytes::from_static(b"12345"))
            ]
        );
    }

    #[test]
    fn a_nack_waits_a_random_back_off_and_a_repair_meanwhile_suppresses_it() {
        let backoff = std::time::Duration::from_millis(2);
        let config = McastConfig { fragment: 4, nack_backoff: backoff, ..McastConfig::default() };
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        r.handle_data(&data(0, 0, true, 9), b"abcd", now);
        r.handle_data(&data(0, 8, true, 9), b"ijkl", now);
        assert!(answers(&mut r).is_empty(), "no NACK at once");
        let at = r.deadline().unwrap();
        assert!(at <= now + backoff, "within the back-off");
        // Another receiver's NACK brought the repair before the back-off ended.
        r.handle_data(&data(0, 4, true, 9), b"efgh", now);
        r.handle_timeout(at);
        assert!(answers(&mut r).is_empty(), "suppressed: the gap is filled");
        assert_eq!(r.stats().nacks, 0);
        // A gap nobody repairs is NACKed once the back-off is over.
        r.handle_data(&data(0, 20, true, 9), b"uvwx", now);
        let at = r.deadline().unwrap();
        r.handle_timeout(at);
        assert_eq!(answers(&mut r), [(McastKind::Nack, 0, 12)]);
        // Receivers draw different back-offs.
        let draws: std::collections::BTreeSet<Instant> = (0..8)
            .map(|me| {
                let mut r = Receiver::new(config, me, 1, 0);
                r.handle_data(&data(0, 8, true, 9), b"ijkl", now);
                r.deadline().unwrap()
            })
            .collect();
        assert!(draws.len() > 4, "{draws:?}");
    }
}
