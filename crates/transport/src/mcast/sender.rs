//! The sending side: one node multicasting messages to its children, several under
//! way at once (a window over messages that the receivers' final ACKs release),
//! paced by one congestion window over all their fragments that the acker's ACKs open.

use std::collections::{BTreeMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use treecast_wire::{McastAnswer, McastHeader, McastKind};

use super::{HalveOn, McastConfig, Repair};

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
    /// Times the window was halved (losses taken for congestion).
    pub halvings: u64,
}

/// A receiver as the sender knows it.
#[derive(Debug, Clone, Copy)]
struct Member {
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

/// Fragments in a row one receiver must miss (in one NACK's holes) for its losses to
/// count as congestion (a queue that overflowed, at the sender, on the way or at
/// that receiver) rather than as scattered losses, which halve nothing: at 5 %
/// random loss a run of 3 is one loss in 400.
pub const BURST_LOSSES: u32 = 3;

impl Member {
    fn new(heard: Option<Instant>) -> Member {
        Member { heard, asked: None, asked_as_acker: None }
    }

    /// Since when it has owed an answer.
    fn owes_since(&self) -> Option<Instant> {
        [self.asked, self.asked_as_acker].into_iter().flatten().min()
    }
}

/// How far a receiver a message waits for got with it.
#[derive(Debug, Clone, Copy, Default)]
struct Progress {
    /// Bytes of the message it holds from the start, as it last said.
    holds: u32,
    /// End of the furthest fragment it holds past any gap (or of the message's
    /// last, once that came), as it last said.
    furthest: u32,
    /// It acknowledged the whole message.
    done: bool,
}

/// The most fragments in a row, each `fragment` bytes after the one before, among
/// a NACK's ascending `holes`. (A loss all receivers share can show shorter, when
/// another receiver's repair filled a fragment first.)
fn longest_run(holes: &[u32], fragment: u32) -> u32 {
    let mut longest = 0;
    let mut run = 0;
    let mut last: Option<u32> = None;
    for &hole in holes {
        run = if last.and_then(|l| l.checked_add(fragment)) == Some(hole) { run + 1 } else { 1 };
        longest = longest.max(run);
        last = Some(hole);
    }
    longest
}

/// A message under way.
#[derive(Debug)]
struct Current {
    id: u32,
    stream: u32,
    data: Bytes,
    /// The receivers it waits for: the members when it started.
    waiting: BTreeMap<u32, Progress>,
    /// Next byte offset to multicast.
    next: u32,
    /// Bytes the acker holds from the start.
    acked: u32,
    /// End of the furthest fragment the acker holds, past its gaps: with selective
    /// repair the window's left edge (a gap is repaired outside the window, not
    /// waited for).
    seen: u32,
    /// Which fragments went out at least once, by index.
    sent: Vec<bool>,
    /// Last multicast, for the sender time-out.
    last_send: Instant,
    /// NACKs gathered: the lowest offset asked for, and when the gathering ends.
    pending_nack: Option<(u32, Instant)>,
    /// Time-outs of this message in a row with no answer about it in between.
    unanswered: u32,
    /// Selective repair: when each fragment was last resent.
    repaired: std::collections::HashMap<u32, Instant>,
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

    fn complete(&self) -> bool {
        self.waiting.values().all(|p| p.done)
    }

    /// The window's edges move to where receiver `p`, the new acker, is.
    fn edges_to(&mut self, p: Progress) {
        self.acked = p.holds.min(self.next);
        self.seen = p.furthest.min(self.next);
    }

    /// The acker holds `offset` bytes from the start and fragments up to `furthest`;
    /// true when either edge moved.
    fn acker_at(&mut self, offset: u32, furthest: u32) -> bool {
        let seen = furthest.min(self.next);
        let moved = offset > self.acked || seen > self.seen;
        self.acked = self.acked.max(offset);
        self.seen = self.seen.max(seen);
        moved
    }

    /// Fragments sent and not yet held by the acker: past the furthest it holds
    /// under selective repair, past what it holds from the start under go-back-N.
    /// The furthest counts no more than half of what a receiver keeps past a gap
    /// beyond what the acker holds from the start, so with the window on top
    /// nothing goes further past its gap than it keeps.
    fn outstanding(&self, config: &McastConfig) -> u32 {
        let fragment = config.fragment;
        let edge = match config.repair {
            Repair::Selective => {
                let most = config.keep_past_gap() / 2;
                let cap = u32::try_from(u64::from(self.acked).saturating_add(most)).unwrap_or(u32::MAX);
                self.acked.max(self.seen.min(cap))
            }
            Repair::GoBackN => self.acked,
        };
        self.next.saturating_sub(edge).div_ceil(fragment)
    }
}

/// The sender of one group: the messages of one node to its children.
#[derive(Debug)]
pub struct Sender {
    config: McastConfig,
    group: u32,
    members: BTreeMap<u32, Member>,
    /// Receivers that joined while messages were under way: members from the next.
    joining: Vec<u32>,
    queue: VecDeque<(u32, Bytes)>,
    /// Messages under way, oldest first: at most `in_flight`.
    flight: VecDeque<Current>,
    next_id: u32,
    cwnd: f64,
    ssthresh: f64,
    ignore_acks: u32,
    /// When the window was last halved.
    last_cut: Option<Instant>,
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
            flight: VecDeque::new(),
            next_id: 0,
            cwnd: config.initial_cwnd,
            ssthresh: config.ssthresh,
            ignore_acks: 0,
            last_cut: None,
            acker,
            acker_since: None,
            out: VecDeque::new(),
            events: VecDeque::new(),
            stats: SenderStats::default(),
            rtt: RttEstimate::default(),
        }
    }

    /// Queues a message of `stream`; returns its id. Messages go out in order, each
    /// once the one before is all sent, with at most `in_flight` waiting for their
    /// acknowledgements.
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
        // `next_id` is the id of the next message to start: those under way have theirs.
        let id = self.next_id.wrapping_add(self.queue.len() as u32);
        self.queue.push_back((stream, data));
        self.advance(now);
        Ok(id)
    }

    /// A receiver joins the group; returns the first message it is a member for: the
    /// next one to start. Messages under way do not wait for it.
    pub fn add_receiver(&mut self, receiver: u32) -> u32 {
        if !self.flight.is_empty() {
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

    /// An ACK or NACK from a receiver, with its payload.
    pub fn handle_answer(&mut self, header: &McastHeader, answer: &McastAnswer, now: Instant) {
        if header.group != self.group || header.kind == McastKind::Data {
            return;
        }
        let Some(member) = self.members.get_mut(&header.rank) else { return };
        member.heard = Some(now);
        let Some(i) = self.flight.iter().position(|c| c.id == header.message) else { return };
        let cur = &mut self.flight[i];
        let len = cur.len();
        cur.unanswered = 0;
        let Some(progress) = cur.waiting.get_mut(&header.rank) else { return };
        // Only an answer about a message that waits for it is the answer owed.
        member.asked = None;
        member.asked_as_acker = None;
        self.rtt.backoff = 0;
        if header.offset > len {
            return;
        }
        progress.holds = progress.holds.max(header.offset);
        let furthest = answer.furthest.max(header.offset).min(len);
        progress.furthest = progress.furthest.max(furthest);
        match header.kind {
            McastKind::Ack => self.on_ack(i, header.rank, header.offset, furthest, now),
            McastKind::Nack => self.on_nack(i, header, answer, furthest, now),
            McastKind::Data => {}
        }
        self.advance(now);
    }

    fn on_ack(&mut self, i: usize, from: u32, offset: u32, furthest: u32, now: Instant) {
        self.stats.acks += 1;
        let acker = self.acker;
        let cur = &mut self.flight[i];
        if Some(from) == acker {
            self.rtt.acked(cur.id, furthest, now);
        }
        if offset == cur.len() {
            if let Some(p) = cur.waiting.get_mut(&from) {
                p.done = true;
            }
        }
        // Under go-back-N only what the acker holds from the start opens the window.
        let furthest = if self.config.repair == Repair::Selective { furthest } else { 0 };
        if Some(from) == acker && cur.acker_at(offset, furthest) {
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

    fn on_nack(&mut self, i: usize, header: &McastHeader, answer: &McastAnswer, furthest: u32, now: Instant) {
        self.stats.nacks += 1;
        let (from, offset) = (header.rank, header.offset);
        if offset >= self.flight[i].next {
            // It misses nothing that was sent (a receiver time-out, or a fragment it
            // keeps from far ahead, such as a resent last one): as good as an ACK.
            // Counted as a loss, it would pin the window at one (found by the route
            // benchmark at 5 % loss).
            return self.on_ack(i, from, offset, furthest, now);
        }
        // The slowest receiver sets the pace: it becomes the acker, at most once per hold.
        let held =
            self.acker_since.is_some_and(|t| now.saturating_duration_since(t) < self.config.acker_hold);
        if Some(from) != self.acker && !held {
            self.forget_acker_duty();
            self.acker = Some(from);
            self.acker_since = Some(now);
            self.stats.acker_changes += 1;
            // The window's edge in every message is where the new acker is.
            for c in &mut self.flight {
                if let Some(&p) = c.waiting.get(&from) {
                    c.edges_to(p);
                }
            }
        }
        let fragment = self.config.fragment;
        let cur = &mut self.flight[i];
        if Some(from) == self.acker {
            // Its NACK says what it holds: the window's edge moves to it.
            cur.acker_at(offset, furthest);
        }
        match self.config.repair {
            Repair::GoBackN => {
                // The first hole it lists: its NACKs after the first list only new ones.
                let back_to = answer.holes.first().copied().unwrap_or(offset).max(offset);
                cur.pending_nack = Some(match cur.pending_nack {
                    Some((lowest, until)) => (lowest.min(back_to), until),
                    None => (back_to, now + self.config.nack_coalesce),
                });
            }
            Repair::Selective => {
                let burst = longest_run(&answer.holes, fragment) >= BURST_LOSSES;
                let congested = burst || self.config.halve_on == HalveOn::EveryLoss;
                self.repair(i, &answer.holes, congested, now)
            }
        }
    }

    /// Selective repair: resends each fragment of message `i` at `holes` that went
    /// out and was not resent within the coalescing interval (other receivers'
    /// NACKs of the same loss), and halves the window, at most once per that
    /// interval, when the losses look like `congested`.
    fn repair(&mut self, i: usize, holes: &[u32], congested: bool, now: Instant) {
        let coalesce = self.config.nack_coalesce;
        let fragment = self.config.fragment;
        // Congestion halves the window even when the fragment was just resent for
        // another receiver (a loss they share is the likeliest to be congestion).
        let cut = congested && self.last_cut.map_or(true, |t| now.saturating_duration_since(t) >= coalesce);
        if cut {
            self.last_cut = Some(now);
            self.halve_window();
        }
        for &hole in holes {
            let Some(cur) = self.flight.get_mut(i) else { return };
            let start = hole - hole % fragment;
            let sent = cur.sent.get((start / fragment) as usize).copied().unwrap_or(false);
            if !sent
                || cur.repaired.get(&start).is_some_and(|&at| now.saturating_duration_since(at) < coalesce)
            {
                continue;
            }
            cur.repaired.insert(start, now);
            let header = self.fragment_at(i, start);
            self.queue_fragment(i, header, start, now);
        }
    }

    /// Halves the window (the slow-start threshold stays as configured, so a small
    /// window grows back by one per ACK) and skips the growth of the next cwnd/2 ACKs.
    fn halve_window(&mut self) {
        self.stats.halvings += 1;
        self.cwnd = (self.cwnd / 2.0).max(1.0);
        self.ignore_acks = (self.cwnd / 2.0) as u32;
    }

    /// Starts the gathered go-backs whose wait is over: resend from the lowest
    /// offset asked for, with the window halved once for all the NACKs gathered.
    fn go_back(&mut self, now: Instant) {
        let fragment = self.config.fragment;
        let acker = self.acker;
        let mut halve = false;
        for cur in &mut self.flight {
            let Some((offset, until)) = cur.pending_nack else { continue };
            if now < until {
                continue;
            }
            cur.pending_nack = None;
            cur.next = cur.next.min(offset - offset % fragment);
            // The window restarts at the resend point, so the resend is paced too;
            // an acker that holds more (or all: it says nothing more about a
            // message it completed) leaves nothing outstanding there.
            let holds = acker.and_then(|a| cur.waiting.get(&a)).map_or(0, |p| p.holds);
            cur.acked = cur.acked.min(cur.next).max(holds.min(cur.next));
            halve = true;
        }
        if halve {
            self.halve_window();
        }
    }

    /// Timers: the NACK gathering, the sender time-out and silent receivers.
    pub fn handle_timeout(&mut self, now: Instant) {
        self.go_back(now);
        // The go-back's first fragments go now, before the time-out below looks.
        self.fill(now);
        self.check_silent(now);
        let timeout = self.rtt.timeout(&self.config);
        // Nothing went out for a message for the time-out: everything is sent and
        // final ACKs are missing, or the window stays shut because the acker's ACKs
        // were lost (and a receiver that holds the whole message says nothing until
        // asked).
        let stuck: Vec<usize> = (0..self.flight.len())
            .filter(|&i| {
                let c = &self.flight[i];
                c.pending_nack.is_none() && now.saturating_duration_since(c.last_send) >= timeout
            })
            .collect();
        if !stuck.is_empty() {
            self.rtt.backoff = self.rtt.backoff.saturating_add(1);
            self.stats.timeouts += 1;
        }
        for i in stuck {
            // The last fragment again makes every receiver either ACK the whole
            // message or NACK what it misses. While the window is shut, the acker's
            // first missing fragment goes instead, which saves the acker a round
            // trip; if that goes unanswered, the last fragment goes with it, as an
            // acker whose final ACK was lost answers no other fragment (found by the
            // property test).
            let fragment = self.config.fragment;
            let cur = &mut self.flight[i];
            // Counted per message: answers about other messages under way do not
            // say that this one's resends were heard (found by the property test:
            // the last fragment was never resent while a later message answered).
            cur.unanswered = cur.unanswered.saturating_add(1);
            let unanswered = cur.unanswered;
            let last = if cur.data.is_empty() { 0 } else { (cur.len() - 1) / fragment * fragment };
            let first_missing = cur.acked / fragment * fragment;
            let shut = !cur.all_sent() && first_missing < last;
            if shut {
                let header = self.fragment_at(i, first_missing);
                self.queue_fragment(i, header, first_missing, now);
            }
            if !shut || unanswered > 1 {
                let header = self.fragment_at(i, last);
                self.queue_fragment(i, header, last, now);
            }
        }
        self.advance(now);
    }

    /// Receivers that a message under way still waits for.
    fn awaited(&self) -> std::collections::BTreeSet<u32> {
        self.flight.iter().flat_map(|c| c.waiting.iter().filter(|(_, p)| !p.done).map(|(&r, _)| r)).collect()
    }

    fn check_silent(&mut self, now: Instant) {
        let Some(message) = self.flight.front().map(|c| c.id) else { return };
        let limit = self.config.silent_limit;
        let awaited = self.awaited();
        let silent: Vec<u32> = self
            .members
            .iter()
            .filter(|(r, m)| {
                awaited.contains(r)
                    && m.owes_since().is_some_and(|t| now.saturating_duration_since(t) >= limit)
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
        for c in &mut self.flight {
            c.waiting.remove(&receiver);
        }
        if self.acker == Some(receiver) {
            // The receiver holding the least of the oldest message still sets the pace.
            self.acker = self.flight.front().and_then(|c| {
                c.waiting.iter().filter(|(_, p)| !p.done).min_by_key(|(_, p)| p.holds).map(|(&r, _)| r)
            });
            self.acker = self.acker.or_else(|| self.members.keys().next().copied());
            if let Some(a) = self.acker {
                for c in &mut self.flight {
                    if let Some(&p) = c.waiting.get(&a) {
                        c.edges_to(p);
                    }
                }
            }
            self.acker_since = Some(now);
            self.stats.acker_changes += 1;
        }
        self.advance(now);
    }

    /// When [`Sender::handle_timeout`] must run next.
    pub fn deadline(&self) -> Option<Instant> {
        if self.flight.is_empty() {
            return None;
        }
        let awaited = self.awaited();
        let silent = self
            .members
            .iter()
            .filter(|(r, _)| awaited.contains(r))
            .filter_map(|(_, m)| m.owes_since())
            .min()
            .map(|t| t + self.config.silent_limit);
        let timeout = self.rtt.timeout(&self.config);
        let timers = self.flight.iter().map(|c| match c.pending_nack {
            Some((_, until)) => until,
            None => c.last_send + timeout,
        });
        timers.chain(silent).min()
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

    /// Messages under way (started, not yet acknowledged by every receiver).
    pub fn in_flight(&self) -> usize {
        self.flight.len()
    }

    /// Nothing queued, nothing in flight.
    pub fn is_idle(&self) -> bool {
        self.flight.is_empty() && self.queue.is_empty()
    }

    /// Completes, in order, the messages nobody waits for any more, and sends what
    /// the window allows.
    fn advance(&mut self, now: Instant) {
        while self.flight.front().is_some_and(Current::complete) {
            if let Some(cur) = self.flight.pop_front() {
                self.events.push_back(SenderEvent::Completed { message: cur.id, stream: cur.stream });
                self.stats.messages += 1;
                if self.rtt.timing.is_some_and(|(m, _, _)| m == cur.id) {
                    self.rtt.timing = None;
                }
            }
        }
        // A receiver every message under way holds owes nothing.
        let awaited = self.awaited();
        for (r, m) in &mut self.members {
            if !awaited.contains(r) {
                m.asked = None;
                m.asked_as_acker = None;
            }
        }
        self.fill(now);
    }

    /// Starts the next queued message.
    fn start(&mut self, now: Instant) -> bool {
        let Some((stream, data)) = self.queue.pop_front() else { return false };
        let id = self.next_id;
        self.next_id = id.wrapping_add(1);
        for r in self.joining.drain(..) {
            self.members.entry(r).or_insert_with(|| Member::new(None));
        }
        if !self.acker.is_some_and(|a| self.members.contains_key(&a)) {
            self.acker = self.members.keys().next().copied();
        }
        let waiting = self.members.keys().map(|&r| (r, Progress::default())).collect();
        self.flight.push_back(Current {
            id,
            stream,
            data,
            waiting,
            next: 0,
            acked: 0,
            seen: 0,
            sent: Vec::new(),
            last_send: now,
            pending_nack: None,
            unanswered: 0,
            repaired: std::collections::HashMap::new(),
        });
        true
    }

    /// Sends fragments while the window has room, starting messages as the ones
    /// before are all sent and fewer than `in_flight` are under way.
    fn fill(&mut self, now: Instant) {
        loop {
            // A message nobody waits for (an empty group) completes at once.
            if self.flight.front().is_some_and(Current::complete) {
                return self.advance(now);
            }
            let config = &self.config;
            let outstanding: u32 = self.flight.iter().map(|c| c.outstanding(config)).sum();
            if f64::from(outstanding) >= self.cwnd.floor().max(1.0) {
                return;
            }
            let i = match self.flight.iter().position(|c| !c.all_sent()) {
                Some(i) if self.flight[i].pending_nack.is_some() => return,
                Some(i) => i,
                None => {
                    if self.flight.len() >= self.config.in_flight as usize || !self.start(now) {
                        return;
                    }
                    self.flight.len() - 1
                }
            };
            let offset = self.flight[i].next;
            let header = self.fragment_at(i, offset);
            self.queue_fragment(i, header, offset, now);
        }
    }

    fn fragment_at(&self, i: usize, offset: u32) -> McastHeader {
        let fragment = self.config.fragment;
        let (id, stream, len) = self.flight.get(i).map_or((0, 0, 0), |c| (c.id, c.stream, c.len()));
        let more = offset.saturating_add(fragment) < len;
        McastHeader::data(self.group, stream, id, offset, more, self.acker.unwrap_or(u32::MAX))
    }

    fn queue_fragment(&mut self, i: usize, header: McastHeader, offset: u32, now: Instant) {
        let fragment = self.config.fragment;
        let Some(cur) = self.flight.get_mut(i) else { return };
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
        for (r, _) in cur.waiting.iter().filter(|(_, p)| !p.done) {
            let Some(m) = self.members.get_mut(r) else { continue };
            if last {
                m.asked.get_or_insert(now);
            }
            if Some(*r) == self.acker {
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
            // An ACK about another message under way: the timed one may follow.
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
