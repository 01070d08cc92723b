//! The global clock: each parent measures each child's clock against its own by
//! round-trip probes and keeps, per round, the probe with the shortest round trip
//! (Cristian's method: the child's reading lies within half that round trip of the
//! probe's midpoint). A second round a little later gives each child's drift rate, and
//! later rounds (every few minutes) refresh both, so between them an offset is
//! interpolated with the drift rather than measured again. The drift is measured
//! against the oldest round within [`ClockConfig::drift_window`], so it grows more
//! accurate with every round of the first hour. Every measurement goes up
//! the tree as a [`ClockSample`] against the node's own parent; the front-end keeps
//! the latest per node and composes them along the tree (see `treecast_api`).
//!
//! The core reads no clock: a node's clock is a [`ClockSource`] its driver sets, a
//! function of the `now` every input carries.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use treecast_wire::{ClockSample, ControlMsg};

use treecast_transport::timing::{drifted, PeerClock};

use super::{ChildState, Event, LinkId, Node, Role};

/// Most earlier rounds kept per child for the drift (an hour of rounds at the
/// default resync is 13).
const MAX_HISTORY: usize = 64;

/// How a node reads its clock: a time base plus, for tests, a distortion.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockSource {
    /// The instant the base was read at.
    pub base: Instant,
    /// The clock at `base`, nanoseconds (CLOCK_REALTIME for real processes).
    pub base_ns: i64,
    /// What a test adds to the true clock (none for a true clock).
    pub distortion: Distortion,
}

/// A distortion of a node's clock, a test knob: a fixed offset plus a drift that
/// accumulates from an epoch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Distortion {
    /// Added offset, nanoseconds.
    pub offset_ns: i64,
    /// Added rate, parts per billion.
    pub drift_ppb: i64,
    /// Clock reading (nanoseconds since the Unix epoch) from which the drift accumulates.
    pub epoch_ns: i64,
}

impl Distortion {
    /// What it adds to the true clock when that reads `true_ns`.
    pub fn at(&self, true_ns: i64) -> i64 {
        drifted(self.offset_ns, self.drift_ppb, i128::from(true_ns) - i128::from(self.epoch_ns))
    }
}

impl ClockSource {
    /// An undistorted clock that read `base_ns` at `base`.
    pub fn new(base: Instant, base_ns: i64) -> ClockSource {
        ClockSource { base, base_ns, distortion: Distortion::default() }
    }

    /// The clock at `now`, nanoseconds.
    pub fn read(&self, now: Instant) -> i64 {
        let true_ns = match now.checked_duration_since(self.base) {
            Some(d) => self.base_ns.saturating_add(duration_ns(d)),
            None => self.base_ns.saturating_sub(duration_ns(self.base.duration_since(now))),
        };
        true_ns.saturating_add(self.distortion.at(true_ns))
    }
}

fn duration_ns(d: Duration) -> i64 {
    i64::try_from(d.as_nanos()).unwrap_or(i64::MAX)
}

/// When and how often a parent probes its children.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClockConfig {
    /// Probes per round; the one with the shortest round trip counts.
    pub probes: u32,
    /// Time from the first round to the second, which measures the drift.
    pub drift_after: Duration,
    /// Time between later rounds.
    pub resync: Duration,
    /// The drift is measured from the oldest round at most this old: a longer
    /// baseline divides the offsets' errors by more, while a clock whose rate wanders
    /// (with temperature, over hours) is followed still.
    pub drift_window: Duration,
    /// A round whose answer does not come within this is given up (tried again later).
    pub probe_limit: Duration,
    /// Time between the probes of a round: spread out, they are more likely to catch
    /// a moment when neither end waits for a CPU than back to back.
    pub probe_gap: Duration,
    /// Time from a child joining to its first round (the start-up traffic is over by
    /// then); each child also waits up to as long again, by its node id, so that the
    /// children of one parent are not probed all at once.
    pub first_round_after: Duration,
}

impl Default for ClockConfig {
    fn default() -> Self {
        ClockConfig {
            probes: 16,
            drift_after: Duration::from_secs(2),
            resync: Duration::from_secs(300),
            drift_window: Duration::from_secs(3600),
            probe_limit: Duration::from_secs(5),
            probe_gap: Duration::from_millis(2),
            first_round_after: Duration::from_millis(50),
        }
    }
}

/// A parent's measurement of one child.
#[derive(Debug, Default)]
struct ChildClock {
    rounds: u32,
    /// The probe sent and not yet answered: its number and when it left.
    in_flight: Option<(u32, Instant)>,
    /// Number of the next probe; never reused, so a late answer to a probe given up
    /// on cannot pass for the answer to a later one.
    next_seq: u32,
    probes_done: u32,
    /// Best probe of the round: round trip, offset, midpoint (parent clock).
    best: Option<(i64, i64, i64)>,
    /// Earlier rounds within the drift window, oldest first: offset, midpoint and
    /// error bound, for the drift.
    history: std::collections::VecDeque<(i64, i64, i64)>,
    drift_ppb: i64,
    drift_error_ppb: u64,
    /// When the next probe goes (the next of a round, or the first of the next round).
    next_send: Option<Instant>,
}

/// A node's part of the global clock.
#[derive(Debug, Default)]
pub(super) struct ClockSync {
    source: Option<ClockSource>,
    config: ClockConfig,
    /// Per child index.
    children: HashMap<usize, ChildClock>,
    /// Front-end: the latest sample of every node, and how many rounds it has.
    samples: HashMap<u32, (ClockSample, u32)>,
}

impl Node {
    /// Gives the node its clock, which switches the global clock on: it answers its
    /// parent's probes and probes its children. Without one (the default) it does neither.
    pub fn set_clock(&mut self, source: ClockSource, config: ClockConfig) {
        self.clock.source = Some(source);
        self.clock.config = config;
    }

    /// The clock the driver gave the node, if any (the route stamps frames with it).
    pub fn clock_source(&self) -> Option<ClockSource> {
        self.clock.source
    }

    /// This node's clock at `now`, if it has one.
    pub fn clock_now(&self, now: Instant) -> Option<i64> {
        self.clock.source.map(|s| s.read(now))
    }

    /// Front-end: the latest clock sample of every node against its parent, with the
    /// number of rounds measured so far.
    pub fn clock_samples(&self) -> impl Iterator<Item = (&ClockSample, u32)> {
        self.clock.samples.values().map(|(s, rounds)| (s, *rounds))
    }

    /// Starts due rounds and probes, and gives up on probes that were not answered.
    pub(super) fn clock_timeout(&mut self, now: Instant) {
        if self.clock.source.is_none() || !self.is_running() {
            return;
        }
        let config = self.clock.config;
        for c in 0..self.children.len() {
            let Some(link) = self.children[c].link.filter(|_| self.children[c].state == ChildState::Joined)
            else {
                self.clock.children.remove(&c);
                continue;
            };
            let Some(state) = self.clock.children.get_mut(&c) else { continue };
            if state.in_flight.is_some_and(|(_, at)| now.saturating_duration_since(at) >= config.probe_limit)
            {
                // Lost with its answer: the round starts again later. A child that never
                // answers has no clock (an older build) and is asked again now and then.
                state.in_flight = None;
                state.best = None;
                state.probes_done = 0;
                state.next_send = Some(now + config.resync.min(config.probe_limit * 4));
            }
            if state.in_flight.is_none() && state.next_send.is_some_and(|t| t <= now) {
                state.next_send = None;
                self.send_probe(c, link, now);
            }
        }
    }

    /// When [`Node::clock_timeout`] must run next.
    pub(super) fn clock_deadline(&self) -> Option<Instant> {
        if self.clock.source.is_none() || !self.is_running() {
            return None;
        }
        let limit = self.clock.config.probe_limit;
        self.clock
            .children
            .values()
            .filter_map(|s| match s.in_flight {
                Some((_, at)) => Some(at + limit),
                None => s.next_send,
            })
            .min()
    }

    /// Child `c` joined: its first round is scheduled.
    pub(super) fn clock_child_joined(&mut self, c: usize, now: Instant) {
        if self.clock.source.is_none() {
            return;
        }
        let config = self.clock.config;
        let node_id = self.children[c].node_id;
        let stagger = config.first_round_after.mul_f64(f64::from(node_id.wrapping_mul(7919) % 1000) / 1000.0);
        let first =
            ChildClock { next_send: Some(now + config.first_round_after + stagger), ..ChildClock::default() };
        self.clock.children.insert(c, first);
    }

    fn send_probe(&mut self, c: usize, link: LinkId, now: Instant) {
        let Some(source) = self.clock.source else { return };
        let state = self.clock.children.entry(c).or_default();
        let seq = state.next_seq;
        state.next_seq = seq.wrapping_add(1);
        state.in_flight = Some((seq, now));
        self.out.control(link, &ControlMsg::ClockProbe { seq, sent_ns: source.read(now) });
    }

    /// A probe from the parent: answered at once with this node's clock.
    pub(super) fn on_clock_probe(&mut self, link: LinkId, seq: u32, sent_ns: i64, now: Instant) {
        if let Some(source) = self.clock.source {
            self.out.control(link, &ControlMsg::ClockReply { seq, sent_ns, child_ns: source.read(now) });
        }
    }

    /// A child's answer to a probe.
    pub(super) fn on_clock_reply(&mut self, c: usize, seq: u32, sent_ns: i64, child_ns: i64, now: Instant) {
        let Some(source) = self.clock.source else { return };
        let config = self.clock.config;
        let Some(state) = self.clock.children.get_mut(&c) else { return };
        if state.in_flight.map(|(s, _)| s) != Some(seq) {
            return;
        }
        state.in_flight = None;
        let back_ns = source.read(now);
        let rtt = back_ns.saturating_sub(sent_ns).max(0);
        let midpoint = sent_ns.saturating_add(rtt / 2);
        let offset = child_ns.saturating_sub(midpoint);
        if state.best.map_or(true, |(best_rtt, _, _)| rtt < best_rtt) {
            state.best = Some((rtt, offset, midpoint));
        }
        state.probes_done += 1;
        if state.probes_done < config.probes {
            state.next_send = Some(now + config.probe_gap);
            return;
        }
        state.probes_done = 0;
        let Some((rtt, offset, midpoint)) = state.best.take() else { return };
        let window = i128::try_from(config.drift_window.as_nanos()).unwrap_or(i128::MAX);
        let age = |mid: i64| i128::from(midpoint) - i128::from(mid);
        // A round not after the last (a clock stepped back, a bogus echo) would
        // anchor the drift for good: the history starts again from this one.
        if state.history.back().is_some_and(|&(_, mid, _)| age(mid) <= 0) {
            state.history.clear();
        }
        while state.history.len() >= MAX_HISTORY
            || state.history.len() > 1 && state.history.front().is_some_and(|&(_, mid, _)| age(mid) > window)
        {
            state.history.pop_front();
        }
        if let Some(&(prev_offset, prev_mid, prev_error)) = state.history.front() {
            let span = i128::from(midpoint) - i128::from(prev_mid);
            if span > 0 {
                let ppb = (i128::from(offset) - i128::from(prev_offset)) * 1_000_000_000 / span;
                state.drift_ppb = i64::try_from(ppb).unwrap_or(0);
                let error = (i128::from(prev_error) + i128::from(rtt / 2)) * 1_000_000_000 / span;
                state.drift_error_ppb = u64::try_from(error).unwrap_or(u64::MAX);
            }
        }
        state.history.push_back((offset, midpoint, rtt / 2));
        state.rounds += 1;
        state.next_send = Some(now + if state.rounds == 1 { config.drift_after } else { config.resync });
        let sample = ClockSample {
            node_id: self.children[c].node_id,
            offset_ns: offset,
            error_ns: (rtt / 2).unsigned_abs(),
            rtt_ns: rtt.unsigned_abs(),
            drift_ppb: state.drift_ppb,
            drift_error_ppb: state.drift_error_ppb,
            measured_ns: midpoint,
        };
        self.tell_link_clock(c, offset, sample.drift_ppb, midpoint);
        self.clock_report(vec![sample]);
    }

    /// A round of child `c` ended: its route and the child learn the offset, so that
    /// each end can correct the net latency of the other's frames.
    fn tell_link_clock(&mut self, c: usize, offset_ns: i64, drift_ppb: i64, measured_ns: i64) {
        let Some(link) = self.children[c].link else { return };
        let clock = PeerClock { offset_ns, drift_ppb, at_ns: measured_ns };
        self.out.event(Event::LinkClock { link, clock });
        self.out.control(link, &ControlMsg::LinkClock { offset_ns, drift_ppb, measured_ns });
    }

    /// The parent's measurement of this node's clock: the parent's clock minus this
    /// node's, on this node's clock, for the route to the parent.
    pub(super) fn on_link_clock(&mut self, link: LinkId, offset_ns: i64, drift_ppb: i64, measured_ns: i64) {
        let clock = PeerClock {
            offset_ns: offset_ns.saturating_neg(),
            drift_ppb: drift_ppb.saturating_neg(),
            at_ns: measured_ns.saturating_add(offset_ns),
        };
        self.out.event(Event::LinkClock { link, clock });
    }

    /// Samples measured here or below: kept at the front-end, sent up elsewhere.
    pub(super) fn clock_report(&mut self, samples: Vec<ClockSample>) {
        match (self.role, self.parent) {
            (Role::FrontEnd, _) => {
                for s in samples {
                    let rounds = self.clock.samples.get(&s.node_id).map_or(0, |(_, r)| *r) + 1;
                    self.clock.samples.insert(s.node_id, (s, rounds));
                }
            }
            (_, Some(parent)) => self.out.control(parent, &ControlMsg::ClockReport { samples }),
            (_, None) => {}
        }
    }
}
