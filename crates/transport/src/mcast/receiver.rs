//! The receiving side: one child assembling its parent's multicast messages in
//! order, NACKing what it misses and ACKing what it must.

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use treecast_wire::{McastHeader, McastKind};

use super::McastConfig;

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

/// The receiver of one group's messages at one child.
#[derive(Debug)]
pub struct Receiver {
    config: McastConfig,
    me: u32,
    group: u32,
    /// Next message to assemble.
    expect: u32,
    /// Its bytes so far, from the start.
    buf: BytesMut,
    /// Its length, once its last fragment arrived.
    end: Option<u32>,
    /// Fragments past the first gap, by offset, kept until the gap is filled.
    ahead: std::collections::BTreeMap<u32, Bytes>,
    ahead_bytes: usize,
    /// A fragment of `expect` arrived: the receiver time-out runs.
    in_message: bool,
    last_data: Option<Instant>,
    /// When data of the current message last came (the time-out's NACKs do not
    /// move it), for giving up on a silent sender.
    heard_data: Option<Instant>,
    /// The last NACK: its offset and when, so that it is not repeated too soon.
    last_nack: Option<(u32, u32, Instant)>,
    out: VecDeque<McastHeader>,
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
            buf: BytesMut::new(),
            end: None,
            ahead: std::collections::BTreeMap::new(),
            ahead_bytes: 0,
            in_message: false,
            last_data: None,
            heard_data: None,
            last_nack: None,
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
        let ahead = m.wrapping_sub(self.expect);
        if ahead != 0 && ahead < u32::MAX / 2 {
            // The sender completed messages without this receiver.
            self.events.push_back(ReceiverEvent::Missed { from: self.expect, to: m });
            self.restart(m);
        } else if ahead != 0 {
            // An old message: its last fragment again means the final ACK was lost.
            if !header.more() {
                let end = offset.saturating_add(payload.len() as u32);
                self.answer(McastKind::Ack, m, end);
            }
            return;
        }
        let end = offset.saturating_add(payload.len() as u32);
        let have = self.buf.len() as u32;
        let end_moved = match (header.more(), self.end) {
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
            self.end = Some(end);
        }
        self.in_message = true;
        self.last_data = Some(now);
        self.heard_data = Some(now);
        if offset > have {
            // Past a gap: kept (within bounds) for when the gap is filled, and NACKed.
            self.stats.out_of_order += 1;
            // Not the last fragment, which the sender resends on its own to ask for
            // answers: kept, it would make every later fragment look like a gap.
            let keep = header.more() && self.ahead_bytes + payload.len() <= self.ahead_limit();
            if keep && !self.ahead.contains_key(&offset) {
                self.ahead_bytes += payload.len();
                self.ahead.insert(offset, Bytes::copy_from_slice(payload));
            }
            self.nack(have, now);
            return;
        }
        let empty_end = payload.is_empty() && !header.more() && offset == have;
        if end <= have && !empty_end {
            self.stats.duplicates += 1;
            if header.rank == self.me {
                self.answer(McastKind::Ack, m, have);
            }
            return;
        }
        if !self.take(m, &payload[(have - offset) as usize..]) {
            return;
        }
        self.stats.fragments += 1;
        if !self.take_ahead(m) {
            return;
        }
        let have = self.buf.len() as u32;
        if self.end == Some(have) {
            let data = std::mem::take(&mut self.buf).freeze();
            self.events.push_back(ReceiverEvent::Message { stream: header.stream, message: m, data });
            self.answer(McastKind::Ack, m, have);
            self.restart(m.wrapping_add(1));
        } else if !self.ahead.is_empty() {
            // Fragments past `have` are here: the next gap is known at once.
            self.nack(have, now);
        } else if header.rank == self.me {
            self.answer(McastKind::Ack, m, have);
        }
    }

    /// Bytes kept past a gap at most: twice the largest window.
    fn ahead_limit(&self) -> usize {
        (self.config.max_cwnd as usize).saturating_mul(self.config.fragment as usize).saturating_mul(2)
    }

    /// Appends `fresh` to message `m`; false (and the message dropped) past the size limit.
    fn take(&mut self, m: u32, fresh: &[u8]) -> bool {
        let total = self.buf.len() as u64 + fresh.len() as u64;
        if total > u64::from(self.config.max_message) {
            self.events.push_back(ReceiverEvent::TooLarge { message: m, bytes: total });
            self.restart(m.wrapping_add(1));
            return false;
        }
        self.buf.extend_from_slice(fresh);
        true
    }

    /// Appends the fragments kept past the gap that now follow on; false when the
    /// message was dropped for its size.
    fn take_ahead(&mut self, m: u32) -> bool {
        while let Some(entry) = self.ahead.first_entry() {
            let have = self.buf.len() as u32;
            if *entry.key() > have {
                return true;
            }
            let (offset, bytes) = entry.remove_entry();
            self.ahead_bytes -= bytes.len();
            let end = offset.saturating_add(bytes.len() as u32);
            if end > have && !self.take(m, &bytes[(have - offset) as usize..]) {
                return false;
            }
        }
        true
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
        self.buf = BytesMut::new();
        self.end = None;
        self.ahead.clear();
        self.ahead_bytes = 0;
        self.in_message = false;
        self.last_nack = None;
    }

    fn nack(&mut self, have: u32, now: Instant) {
        let repeat = self.last_nack.is_some_and(|(m, o, at)| {
            m == self.expect && o == have && now.saturating_duration_since(at) < self.config.nack_repeat
        });
        if !repeat {
            self.last_nack = Some((self.expect, have, now));
            self.answer(McastKind::Nack, self.expect, have);
        }
    }

    fn answer(&mut self, kind: McastKind, message: u32, offset: u32) {
        match kind {
            McastKind::Ack => self.stats.acks += 1,
            McastKind::Nack => self.stats.nacks += 1,
            McastKind::Data => {}
        }
        self.out.push_back(McastHeader::answer(kind, self.group, self.me, 0, message, offset));
    }

    /// The receiver time-out: in the middle of a message and nothing heard, it NACKs
    /// what it misses (which also tells the sender it is alive).
    pub fn handle_timeout(&mut self, now: Instant) {
        let silent =
            self.heard_data.is_some_and(|t| now.saturating_duration_since(t) >= self.config.silent_limit);
        if self.in_message && silent {
            self.events.push_back(ReceiverEvent::SenderSilent { message: self.expect });
            self.in_message = false;
            return;
        }
        if let Some(at) = self.deadline() {
            if now >= at {
                self.last_data = Some(now);
                self.last_nack = None;
                self.stats.timeouts += 1;
                let have = self.buf.len() as u32;
                self.nack(have, now);
            }
        }
    }

    /// When [`Receiver::handle_timeout`] must run next.
    pub fn deadline(&self) -> Option<Instant> {
        if !self.in_message {
            return None;
        }
        self.last_data.map(|t| t + self.config.receiver_timeout)
    }

    /// Next ACK or NACK to send to the sender by unicast.
    pub fn poll_answer(&mut self) -> Option<McastHeader> {
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

    fn data(message: u32, offset: u32, more: bool, acker: u32) -> McastHeader {
        McastHeader::data(1, 0, message, offset, more, acker)
    }

    fn answers(r: &mut Receiver) -> Vec<(McastKind, u32, u32)> {
        std::iter::from_fn(|| r.poll_answer()).map(|h| (h.kind, h.message, h.offset)).collect()
    }

    #[test]
    fn a_gap_is_nacked_once_per_repeat_interval_and_the_acker_acks_every_fragment() {
        let config = McastConfig { fragment: 4, ..McastConfig::default() };
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
        let config = McastConfig { fragment: 4, ..McastConfig::default() };
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        // Empty or short fragments with "more", off a boundary, or a last one too long.
        r.handle_data(&data(0, 8, true, 9), b"", now);
        r.handle_data(&data(0, 8, true, 9), b"ab", now);
        r.handle_data(&data(0, 6, true, 9), b"abcd", now);
        r.handle_data(&data(0, 8, false, 9), b"abcde", now);
        assert_eq!(r.stats().invalid, 4);
        assert!(r.ahead.is_empty() && answers(&mut r).is_empty());
        // A last fragment fixes the end; another end for the same message is refused.
        r.handle_data(&data(0, 8, false, 9), b"ij", now);
        r.handle_data(&data(0, 8, false, 9), b"i", now);
        r.handle_data(&data(0, 12, true, 9), b"mnop", now);
        assert_eq!(r.stats().invalid, 6);
    }

    #[test]
    fn a_sender_silent_past_the_limit_in_the_middle_of_a_message_is_reported() {
        let config = McastConfig { fragment: 4, ..McastConfig::default() };
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
        let config = McastConfig { fragment: 4, ..McastConfig::default() };
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
        let config = McastConfig { fragment: 4, max_message: 6, ..McastConfig::default() };
        let now = Instant::now();
        let mut r = Receiver::new(config, 5, 1, 0);
        r.handle_data(&data(2, 0, false, 9), b"ab", now);
        assert_eq!(r.poll_event(), Some(ReceiverEvent::Missed { from: 0, to: 2 }));
        assert!(matches!(r.poll_event(), Some(ReceiverEvent::Message { message: 2, .. })));
        r.handle_data(&data(3, 0, true, 9), b"abcd", now);
        r.handle_data(&data(3, 4, true, 9), b"efgh", now);
        assert_eq!(r.poll_event(), Some(ReceiverEvent::TooLarge { message: 3, bytes: 8 }));
        // Another group's datagrams are not for it.
        r.handle_data(&McastHeader::data(2, 0, 4, 0, false, 9), b"x", now);
        assert_eq!(r.poll_event(), None);
    }
}
