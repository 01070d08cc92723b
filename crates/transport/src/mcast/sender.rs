//! The sending side: one node multicasting messages to its children, one message at
//! a time, paced by a congestion window that the acker's ACKs open.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use treecast_wire::{McastHeader, McastKind};

use super::{McastConfig, Repair};

/// What the sender tells its driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SenderEvent {
    /// Every receiver still in the group holds the message.
    Completed {
        /// The message.
        message: u32,
        /// Its stream.
        stream: u32,
    },
    /// A receiver stayed silent past the limit while a message waited for it: it is
    /// out of the group, and messages complete without it.
    Lost {
        /// The receiver.
        receiver: u32,
        /// Why, for the failure report.
        reason: String,
    },
}

/// What the sender did, for reports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SenderStats {
    /// Messages every receiver acknowledged.
    pub messages: u64,
    /// Fragments multicast, first sendings and retransmissions.
    pub fragments: u64,
    /// Of those, retransmissions.
    pub retransmitted: u64,
    /// NACKs received.
    pub nacks: u64,
    /// ACKs received.
    pub acks: u64,
    /// Times the acker changed.
    pub acker_changes: u64,
    /// Sender time-outs (the last fragment resent because nothing was heard).
    pub timeouts: u64,
}

/// A receiver as the sender knows it.
#[derive(Debug, Clone, Copy)]
struct Member {
    /// Bytes of the current message it holds from the start, as it last said.
    holds: u32,
    /// It acknowledged the whole current message.
    done: bool,
    /// When it was last heard from.
    heard: Option<Instant>,
    /// Since when an answer from it is due and has not come: the first last
    /// fragment (which every receiver answers) sent after it was last heard. A
    /// receiver without a gap and not the acker says nothing in the middle of a
    /// message, so only an unanswered question counts as silence.
    asked: Option<Instant>,
    /// The same for any fragment sent while it is the acker (which answers them
    /// all); forgotten when it stops being the acker.
    asked_as_acker: Option<Instant>,
}

impl Member {
    fn new(heard: Option<Instant>) -> Member {
        Member { holds: 0, done: false, heard, asked: None, asked_as_acker: None }
    }

    /// Since when it has owed an answer.
    fn owes_since(&self) -> Option<Instant> {
        [self.asked, self.asked_as_acker].into_iter().flatten().min()
    }
}

/// The message being sent.
#[derive(Debug)]
struct Current {
    id: u32,
    stream: u32,
    data: Bytes,
    /// Next byte offset to multicast.
    next: u32,
    /// Bytes the acker holds from the start: the window's left edge.
    acked: u32,
    /// Which fragments went out at least once, by index.
    sent: Vec<bool>,
    /// Last multicast, for the sender time-out.
    last_send: Instant,
    /// NACKs gathered: the lowest offset asked for, and when the gathering ends.
    pending_nack: Option<(u32, Instant)>,
    /// Selective repair: when each fragment was last resent.
    repaired: std::collections::HashMap<u32, Instant>,
    /// When the window was last halved.
    last_cut: Option<Instant>,
}

impl Current {
    fn len(&self) -> u32 {
        self.data.len() as u32
    }

    fn all_sent(&self) -> bool {
        if self.data.is_empty() {
            // Its only fragment, empty, went out.
            self.sent.first().copied().unwrap_or(false)
        } else {
            self.next >= self.len()
        }
    }
}

/// The sender of one group: the messages of one node to its children.
#[derive(Debug)]
pub struct Sender {
    config: McastConfig,
    group: u32,
    members: BTreeMap<u32, Member>,
    /// Receivers that joined while a message was under way: members from the next.
    joining: Vec<u32>,
    queue: VecDeque<(u32, Bytes)>,
    current: Option<Current>,
    next_id: u32,
    cwnd: f64,
    ssthresh: f64,
    ignore_acks: u32,
    acker: Option<u32>,
    acker_since: Option<Instant>,
    out: VecDeque<(McastHeader, Bytes)>,
    events: VecDeque<SenderEvent>,
    stats: SenderStats,
    rtt: RttEstimate,
}

impl Sender {
    /// A sender for `group` (the node's id) to `receivers`, numbering messages from 0.
    pub fn new(config: McastConfig, group: u32, receivers: impl IntoIterator<Item = u32>) -> Sender {
        let config = config.sanitized();
        let members: BTreeMap<u32, Member> = receivers.into_iter().map(|r| (r, Member::new(None))).collect();
        let acker = members.keys().next().copied();
        Sender {
            config,
            group,
            members,
            joining: Vec::new(),
            queue: VecDeque::new(),
            current: None,
            next_id: 0,
            cwnd: config.initial_cwnd,
            ssthresh: config.ssthresh,
            ignore_acks: 0,
            acker,
            acker_since: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: SenderStats::default(),
            rtt: RttEstimate::default(),
        }
    }

    /// Queues a message of `stream`; returns its id. Messages go out in order, each
    /// once the one before completed.
    ///
    /// # Errors
    /// The message is longer than an offset can name (4 GiB).
    pub fn send(&mut self, stream: u32, data: Bytes, now: Instant) -> Result<u32, crate::TransportError> {
        if data.len() as u64 > u64::from(self.config.max_message) {
            return Err(crate::TransportError::Config(format!(
                "message of {} bytes: receivers take at most {} (TREECAST_UDP_MAX_MESSAGE)",
                data.len(),
                self.config.max_message
            )));
        }
        // `next_id` is the id of the next message to start: the one under way has one already.
        let id = self.next_id.wrapping_add(self.queue.len() as u32);
        self.queue.push_back((stream, data));
        self.advance(now);
        Ok(id)
    }

    /// A receiver joins the group; returns the first message it is a member for: the
    /// next one to start. The message under way, if any, does not wait for it.
    pub fn add_receiver(&mut self, receiver: u32) -> u32 {
        if self.current.is_some() {
            if !self.members.contains_key(&receiver) && !self.joining.contains(&receiver) {
                self.joining.push(receiver);
            }
        } else {
            self.members.entry(receiver).or_insert_with(|| Member::new(None));
            self.acker = self.acker.filter(|a| self.members.contains_key(a)).or(Some(receiver));
        }
        self.next_id
    }

    /// A receiver left the group (its link closed): messages no longer wait for it.
    pub fn remove_receiver(&mut self, receiver: u32, now: Instant) {
        self.joining.retain(|&r| r != receiver);
        if self.members.remove(&receiver).is_some() {
            self.after_leave(receiver, now);
        }
    }

    /// An ACK or NACK from a receiver.
    pub fn handle_answer(&mut self, header: &McastHeader, now: Instant) {
        if header.group != self.group || header.kind == McastKind::Data {
            return;
        }
        let Some(member) = self.members.get_mut(&header.rank) else { return };
        member.heard = Some(now);
        if self.current.as_ref().is_some_and(|c| c.id == header.message) {
            // Only an answer about the message under way is the answer owed.
            member.asked = None;
            member.asked_as_acker = None;
            self.rtt.backoff = 0;
        }
        let Some(cur) = self.current.as_mut() else { return };
        if header.message != cur.id || header.offset > cur.len() {
            return;
        }
        member.holds = member.holds.max(header.offset);
        match header.kind {
            McastKind::Ack => self.on_ack(header.rank, header.offset, now),
            McastKind::Nack => self.on_nack(header.rank, header.offset, now),
            McastKind::Data => {}
        }
        self.advance(now);
    }

    fn on_ack(&mut self, from: u32, offset: u32, now: Instant) {
        self.stats.acks += 1;
        let Some(cur) = self.current.as_mut() else { return };
        if Some(from) == self.acker {
            self.rtt.acked(cur.id, offset, now);
        }
        if offset == cur.len() {
            if let Some(m) = self.members.get_mut(&from) {
                m.done = true;
            }
        }
        if Some(from) == self.acker && offset > cur.acked {
            cur.acked = offset;
            self.grow_window();
        }
    }

    fn grow_window(&mut self) {
        if self.ignore_acks > 0 {
            self.ignore_acks -= 1;
        } else if self.cwnd < self.ssthresh {
            self.cwnd += 1.0;
        } else {
            self.cwnd += 1.0 / self.cwnd;
        }
        self.cwnd = self.cwnd.min(self.config.max_cwnd);
    }

    fn on_nack(&mut self, from: u32, offset: u32, now: Instant) {
        self.stats.nacks += 1;
        if self.current.as_ref().is_some_and(|cur| offset >= cur.next) {
            // It misses nothing that was sent (a receiver time-out, or a fragment it
            // keeps from far ahead, such as a resent last one): as good as an ACK.
            // Counted as a loss, it would pin the window at one (found by the route
            // benchmark at 5 % loss).
            return self.on_ack(from, offset, now);
        }
        // The slowest receiver sets the pace: it becomes the acker, at most once per hold.
        let held =
            self.acker_since.is_some_and(|t| now.saturating_duration_since(t) < self.config.acker_hold);
        if Some(from) != self.acker && !held {
            self.forget_acker_duty();
            self.acker = Some(from);
            self.acker_since = Some(now);
            self.stats.acker_changes += 1;
        }
        let Some(cur) = self.current.as_mut() else { return };
        if Some(from) == self.acker {
            // Its NACK says what it holds: the window's edge moves to it.
            cur.acked = offset;
        }
        if offset >= cur.next {
            // Nothing sent is missing there (a receiver time-out while the window is shut).
            return;
        }
        match self.config.repair {
            Repair::GoBackN => {
                cur.pending_nack = Some(match cur.pending_nack {
                    Some((lowest, until)) => (lowest.min(offset), until),
                    None => (offset, now + self.config.nack_coalesce),
                });
            }
            Repair::Selective => self.repair(offset, now),
        }
    }

    /// Selective repair: resends the fragment at `offset` unless it was resent
    /// within the coalescing interval (other receivers' NACKs of the same loss).
    fn repair(&mut self, offset: u32, now: Instant) {
        let coalesce = self.config.nack_coalesce;
        let fragment = self.config.fragment;
        let Some(cur) = self.current.as_mut() else { return };
        let start = offset - offset % fragment;
        if cur.repaired.get(&start).is_some_and(|&at| now.saturating_duration_since(at) < coalesce) {
            return;
        }
        cur.repaired.insert(start, now);
        let cut = cur.last_cut.map_or(true, |t| now.saturating_duration_since(t) >= coalesce);
        if cut {
            cur.last_cut = Some(now);
        }
        let header = self.fragment_at(start);
        self.queue_fragment(header, start, now);
        if cut {
            self.halve_window();
        }
    }

    /// Halves the window (the slow-start threshold stays as configured, so a small
    /// window grows back by one per ACK) and skips the growth of the next cwnd/2 ACKs.
    fn halve_window(&mut self) {
        self.cwnd = (self.cwnd / 2.0).max(1.0);
        self.ignore_acks = (self.cwnd / 2.0) as u32;
    }

    /// Starts the gathered go-back once its wait is over: resend from the lowest
    /// offset asked for, with the window halved once for all the NACKs gathered.
    fn go_back(&mut self, now: Instant) {
        let Some(cur) = self.current.as_mut() else { return };
        let Some((offset, until)) = cur.pending_nack else { return };
        if now < until {
            return;
        }
        cur.pending_nack = None;
        let fragment = self.config.fragment;
        cur.next = cur.next.min(offset - offset % fragment);
        // The window restarts at the resend point, so the resend is paced too.
        cur.acked = cur.acked.min(cur.next);
        self.halve_window();
    }

    /// Timers: the NACK gathering, the sender time-out and silent receivers.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.go_back(now);
        // The go-back's first fragments go now, before the time-out below looks.
        self.fill(now);
        self.check_silent(now);
        if let Some(cur) = self.current.as_mut() {
            // Nothing went out for the time-out: everything is sent and final ACKs are
            // missing, or the window stays shut because the acker's ACKs were lost (and
            // a receiver that holds the whole message says nothing until asked).
            let stuck = cur.pending_nack.is_none();
            if stuck && now.saturating_duration_since(cur.last_send) >= self.rtt.timeout(&self.config) {
                // The last fragment again makes every receiver either ACK the whole
                // message or NACK what it misses. While the window is shut, the
                // acker's first missing fragment goes instead, which saves the acker a
                // round trip; if that goes unanswered, the last fragment goes with it,
                // as an acker whose final ACK was lost answers no other fragment
                // (found by the property test).
                let fragment = self.config.fragment;
                let last = if cur.data.is_empty() { 0 } else { (cur.len() - 1) / fragment * fragment };
                let first_missing = cur.acked / fragment * fragment;
                let shut = !cur.all_sent() && first_missing < last;
                self.rtt.backoff = self.rtt.backoff.saturating_add(1);
                self.stats.timeouts += 1;
                if shut {
                    let header = self.fragment_at(first_missing);
                    self.queue_fragment(header, first_missing, now);
                }
                if !shut || self.rtt.backoff > 1 {
                    let header = self.fragment_at(last);
                    self.queue_fragment(header, last, now);
                }
            }
        }
        self.advance(now);
    }

    fn check_silent(&mut self, now: Instant) {
        let Some(cur) = self.current.as_ref() else { return };
        let limit = self.config.silent_limit;
        let message = cur.id;
        let silent: Vec<u32> = self
            .members
            .iter()
            .filter(|(_, m)| {
                !m.done && m.owes_since().is_some_and(|t| now.saturating_duration_since(t) >= limit)
            })
            .map(|(&r, _)| r)
            .collect();
        for receiver in silent {
            self.members.remove(&receiver);
            self.events.push_back(SenderEvent::Lost {
                receiver,
                reason: format!(
                    "multicast receiver {receiver} of group {} silent for {:.1} s while message {} waited for it",
                    self.group,
                    limit.as_secs_f64(),
                    message
                ),
            });
            self.after_leave(receiver, now);
        }
    }

    /// The acker is about to change: the answers it owed as acker are no longer due.
    fn forget_acker_duty(&mut self) {
        if let Some(m) = self.acker.and_then(|a| self.members.get_mut(&a)) {
            m.asked_as_acker = None;
        }
    }

    fn after_leave(&mut self, receiver: u32, now: Instant) {
        if self.acker == Some(receiver) {
            // The receiver holding the least still sets the pace.
            self.acker =
                self.members.iter().filter(|(_, m)| !m.done).min_by_key(|(_, m)| m.holds).map(|(&r, _)| r);
            self.acker = self.acker.or_else(|| self.members.keys().next().copied());
            if let (Some(a), Some(cur)) = (self.acker, self.current.as_mut()) {
                cur.acked = self.members.get(&a).map_or(0, |m| m.holds);
            }
            self.acker_since = Some(now);
            self.stats.acker_changes += 1;
        }
        self.advance(now);
    }

    /// When [`Sender::handle_timeout`] must run next.
    pub fn deadline(&self) -> Option<Instant> {
        let cur = self.current.as_ref()?;
        let silent = self
            .members
            .values()
            .filter(|m| !m.done)
            .filter_map(Member::owes_since)
            .min()
            .map(|t| t + self.config.silent_limit);
        let resend = cur.pending_nack.is_none().then(|| cur.last_send + self.rtt.timeout(&self.config));
        [cur.pending_nack.map(|(_, until)| until), resend, silent].into_iter().flatten().min()
    }

    /// Next datagram to multicast to the group: a header and the fragment's bytes.
    pub fn poll_datagram(&mut self) -> Option<(McastHeader, Bytes)> {
        self.out.pop_front()
    }

    /// Next event for the driver.
    pub fn poll_event(&mut self) -> Option<SenderEvent> {
        self.events.pop_front()
    }

    /// What the sender did so far.
    pub fn stats(&self) -> SenderStats {
        self.stats
    }

    /// Receivers still in the group.
    pub fn receivers(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.keys().copied()
    }

    /// The congestion window, fragments.
    pub fn cwnd(&self) -> f64 {
        self.cwnd
    }

    /// The receiver that acknowledges every fragment now.
    pub fn acker(&self) -> Option<u32> {
        self.acker
    }

    /// Nothing queued, nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.current.is_none() && self.queue.is_empty()
    }

    /// Completes the current message if nobody waits for it, starts the next one,
    /// and sends what the window allows.
    fn advance(&mut self, now: Instant) {
        loop {
            if let Some(cur) = &self.current {
                if !self.members.values().all(|m| m.done) {
                    break;
                }
                self.events.push_back(SenderEvent::Completed { message: cur.id, stream: cur.stream });
                self.stats.messages += 1;
                self.current = None;
            }
            let Some((stream, data)) = self.queue.pop_front() else { return };
            let id = self.next_id;
            self.next_id = id.wrapping_add(1);
            for m in self.members.values_mut() {
                *m = Member::new(m.heard);
            }
            for r in self.joining.drain(..) {
                self.members.entry(r).or_insert_with(|| Member::new(None));
            }
            if !self.acker.is_some_and(|a| self.members.contains_key(&a)) {
                self.acker = self.members.keys().next().copied();
            }
            self.current = Some(Current {
                id,
                stream,
                data,
                next: 0,
                acked: 0,
                sent: Vec::new(),
                last_send: now,
                pending_nack: None,
                repaired: std::collections::HashMap::new(),
                last_cut: None,
            });
        }
        self.fill(now);
    }

    /// Sends fragments while the window has room.
    fn fill(&mut self, now: Instant) {
        let fragment = self.config.fragment;
        loop {
            let Some(cur) = self.current.as_ref() else { return };
            if cur.all_sent() || cur.pending_nack.is_some() {
                return;
            }
            let in_flight = cur.next.saturating_sub(cur.acked).div_ceil(fragment);
            if f64::from(in_flight) >= self.cwnd.floor().max(1.0) {
                return;
            }
            let offset = cur.next;
            let header = self.fragment_at(offset);
            self.queue_fragment(header, offset, now);
        }
    }

    fn fragment_at(&self, offset: u32) -> McastHeader {
        let fragment = self.config.fragment;
        let (id, stream, len) = self.current.as_ref().map_or((0, 0, 0), |c| (c.id, c.stream, c.len()));
        let more = offset.saturating_add(fragment) < len;
        McastHeader::data(self.group, stream, id, offset, more, self.acker.unwrap_or(u32::MAX))
    }

    fn queue_fragment(&mut self, header: McastHeader, offset: u32, now: Instant) {
        let fragment = self.config.fragment;
        let Some(cur) = self.current.as_mut() else { return };
        let end = offset.saturating_add(fragment).min(cur.len());
        let bytes = cur.data.slice(offset as usize..end as usize);
        let index = (offset / fragment) as usize;
        if cur.sent.len() <= index {
            cur.sent.resize(index + 1, false);
        }
        let again = std::mem::replace(&mut cur.sent[index], true);
        if again {
            self.stats.retransmitted += 1;
            // Karn: an ACK after a resend does not say which sending it answers.
            self.rtt.timing = None;
        } else if self.rtt.timing.is_none() {
            self.rtt.timing = Some((cur.id, end, now));
        }
        // Only the fragment at the window's front moves it: a repair or a time-out's
        // resend must not undo a go-back (found by the property test).
        if offset == cur.next {
            cur.next = end;
        }
        cur.last_send = now;
        self.stats.fragments += 1;
        let last = !header.more();
        for (&r, m) in self.members.iter_mut().filter(|(_, m)| !m.done) {
            if last {
                m.asked.get_or_insert(now);
            }
            if Some(r) == self.acker {
                m.asked_as_acker.get_or_insert(now);
            }
        }
        self.out.push_back((header, bytes));
    }
}

/// The round trip to the acker, smoothed, from one timed fragment at a time (as
/// TCP times segments): it shortens the sender time-out on a fast LAN.
#[derive(Debug, Default)]
struct RttEstimate {
    /// The fragment being timed: its message, the offset its end reaches, when it left.
    timing: Option<(u32, u32, Instant)>,
    /// Smoothed round trip and its mean deviation (RFC 6298), once measured.
    smoothed: Option<(Duration, Duration)>,
    /// Time-outs in a row with no answer in between: each doubles the next.
    backoff: u32,
}

impl RttEstimate {
    /// The acker holds the current message up to `offset`.
    fn acked(&mut self, message: u32, offset: u32, now: Instant) {
        let Some((timed, end, sent)) = self.timing else { return };
        if timed != message {
            self.timing = None;
            return;
        }
        if offset < end {
            return;
        }
        self.timing = None;
        let sample = now.saturating_duration_since(sent);
        self.smoothed = Some(match self.smoothed {
            None => (sample, sample / 2),
            Some((srtt, var)) => {
                let diff = if sample > srtt { sample - srtt } else { srtt - sample };
                (srtt * 7 / 8 + sample / 8, var * 3 / 4 + diff / 4)
            }
        });
    }

    /// The sender time-out: the configured one, or less once the round trip is
    /// known: four deviations above it, at least twice it and 100 µs, doubled for
    /// each time-out in a row that got no answer.
    fn timeout(&self, config: &McastConfig) -> Duration {
        match self.smoothed {
            Some((srtt, var)) => {
                let base = (srtt + var * 4).max(srtt * 2).max(Duration::from_micros(100));
                base.saturating_mul(1 << self.backoff.min(16)).min(config.sender_timeout)
            }
            None => config.sender_timeout,
        }
    }
}
