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

pub(crate) mod state;

use std::time::{Duration, Instant};

use treecast_wire::{ClockSample, ControlMsg};

use treecast_monitor::clock::{drifted, PeerClock};

use super::{ChildState, Event, LinkId, Node, Role};
use state::{ChildClock, ClockConfig, ClockSource, Distortion, Probe};

/// Most earlier rounds kept per child for the drift (an hour of rounds at the
/// default resync is 13).
const MAX_HISTORY: usize = 64;

/// The drift allowed for within a child's first round, before it is measured: five
/// times what an ordinary crystal is specified to (±100 ppm). A round of
/// back-to-back probes lasts about a millisecond, which this turns into half a
/// microsecond of bound.
const UNKNOWN_DRIFT_PPB: u64 = 500_000;

/// What a round of probes says of a child's clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Estimate {
    /// The shortest round trip.
    rtt: i64,
    /// The child's clock minus the parent's at `midpoint`.
    offset: i64,
    /// The parent's clock the offset holds at: the shortest round trip's midpoint.
    midpoint: i64,
    /// How far the true offset may lie from `offset`.
    error: i64,
}

/// The offset a round's probes allow. Each probe bounds the true offset to its own
/// offset ± half its round trip; the truth lies in all those intervals at once, so
/// the estimate is the middle of their intersection and the error bound half its
/// width. The intersection's ends come from the fastest trip down and the fastest
/// trip up, even when no one probe had both, so the bound is never wider than half
/// the shortest round trip and most often narrower. Offsets are carried to the
/// shortest round trip's midpoint by the drift known so far. Should the intervals
/// not meet (a drift not known yet, a clock stepped), the shortest round trip alone
/// counts, as in Cristian's method. Each interval is widened by what the drift's
/// error (`drift_error_ppb`) may have moved it, so the bound stays a bound.
fn estimate(samples: &[Probe], drift_ppb: i64, drift_error_ppb: u64) -> Option<Estimate> {
    let best = samples.iter().min_by_key(|p| p.rtt)?;
    let (mut low, mut high) = (i64::MIN, i64::MAX);
    for p in samples {
        let since = i128::from(best.midpoint) - i128::from(p.midpoint);
        let offset = drifted(p.offset, drift_ppb, since);
        let moved =
            i64::try_from(since.unsigned_abs().saturating_mul(u128::from(drift_error_ppb)) / 1_000_000_000)
                .unwrap_or(i64::MAX);
        // The probe's offset was taken half the round trip, rounded down, after the
        // fastest it could be: the rest of the round trip lies below it.
        low = low.max(offset.saturating_sub(p.rtt - p.rtt / 2).saturating_sub(moved));
        high = high.min(offset.saturating_add(p.rtt / 2).saturating_add(moved));
    }
    let (offset, error) = if low <= high {
        (low + (high - low) / 2, (high - low + 1) / 2)
    } else {
        (best.offset, best.rtt - best.rtt / 2)
    };
    Some(Estimate { rtt: best.rtt, offset, midpoint: best.midpoint, error })
}

/// How long after joining a child's first round starts when this node's parent has
/// not probed it by then (a parent without a clock); once it does, the first rounds
/// of the children not measured yet start [`ClockConfig::first_round_after`] (and
/// their stagger) from then.
pub(crate) const FIRST_ROUND_UNPROBED: Duration = Duration::from_secs(5);

/// Most probes per round, and per burst, a plan may ask for.
pub const MAX_PROBES: u32 = 1024;

impl Node {
    /// Gives the node its clock, which switches the global clock on: it answers its
    /// parent's probes and probes its children. Without one (the default) it does neither.
    pub fn set_clock(&mut self, source: ClockSource, config: ClockConfig) {
        self.clock.source = Some(source);
        self.clock.config = config;
    }

    /// Takes what `plan` sets over the clock's settings (what it leaves unset stays),
    /// and this node's distortion from its test knob; a malformed knob is refused by
    /// the front-end's user before any plan goes out, so here it only leaves the
    /// clock true.
    pub(crate) fn apply_clock_plan(&mut self, plan: &treecast_wire::ClockPlan) {
        let config = &mut self.clock.config;
        if let Some(ms) = plan.resync_ms {
            config.resync = Duration::from_millis(u64::from(ms.max(1)));
        }
        if let Some(n) = plan.probes {
            config.probes = n.clamp(1, MAX_PROBES);
        }
        if let Some(n) = plan.probe_burst {
            config.probe_burst = n.clamp(1, MAX_PROBES);
        }
        if let Some(us) = plan.probe_gap_us {
            config.probe_gap = Duration::from_micros(u64::from(us));
        }
        let Some(source) = self.clock.source.as_mut().filter(|_| !plan.distort.is_empty()) else { return };
        match clock_distortion(&plan.distort, self.node_id, source.base_ns) {
            Ok(Some(d)) => {
                source.distortion = d;
                self.out.event(Event::ClockChanged);
            }
            Ok(None) => {}
            Err(e) => tracing::debug!(node = %self.name, "{e}; the clock is not distorted"),
        }
    }

    /// Children the clock's timer work visited so far.
    pub(super) fn clock_visits(&self) -> u64 {
        self.clock.visits
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
        let mut due: Vec<usize> = Vec::new();
        while let Some(&(at, c)) = self.clock.due.first() {
            if at > now {
                break;
            }
            self.clock.due.pop_first();
            if let Some(state) = self.clock.children.get_mut(&c) {
                state.scheduled = None;
            }
            due.push(c);
        }
        // In child order, as one walk over the children would take them.
        due.sort_unstable();
        due.dedup();
        for c in due {
            self.clock.visits += 1;
            let joined = self.children.get(c).filter(|ch| ch.state == ChildState::Joined);
            let Some(link) = joined.and_then(|ch| ch.link) else {
                self.clock.children.remove(&c);
                continue;
            };
            let Some(state) = self.clock.children.get_mut(&c) else { continue };
            if state.in_flight.is_some_and(|(_, at)| now.saturating_duration_since(at) >= config.probe_limit)
            {
                // Lost with its answer: the round starts again later. A child that never
                // answers has no clock (an older build) and is asked again now and then.
                state.in_flight = None;
                state.samples.clear();
                state.probes_done = 0;
                state.next_send = Some(now + config.resync.min(config.probe_limit * 4));
            }
            if state.in_flight.is_none() && state.next_send.is_some_and(|t| t <= now) {
                state.next_send = None;
                self.send_probe(c, link, now);
            }
            self.clock_reschedule(c);
        }
    }

    /// Puts child `c`'s next deadline (if any) in the timer's order, in place of its last.
    fn clock_reschedule(&mut self, c: usize) {
        let limit = self.clock.config.probe_limit;
        let Some(state) = self.clock.children.get_mut(&c) else { return };
        let next = state.deadline(limit);
        if next == state.scheduled {
            return;
        }
        if let Some(at) = state.scheduled.take() {
            self.clock.due.remove(&(at, c));
        }
        if let Some(at) = next {
            self.clock.due.insert((at, c));
        }
        state.scheduled = next;
    }

    /// When [`Node::clock_timeout`] must run next.
    pub(super) fn clock_deadline(&self) -> Option<Instant> {
        if self.clock.source.is_none() || !self.is_running() {
            return None;
        }
        self.clock.due.first().map(|&(at, _)| at)
    }

    /// Child `c` joined: its first round is scheduled, soon where this node's
    /// children may be measured, else once they may ([`Node::clock_children_begin`]).
    pub(super) fn clock_child_joined(&mut self, c: usize, now: Instant) {
        if self.clock.source.is_none() {
            return;
        }
        let wait = if self.clock.children_may_begin {
            self.clock.config.first_round_after
        } else {
            FIRST_ROUND_UNPROBED
        };
        let first =
            ChildClock { next_send: Some(now + wait + self.first_round_stagger(c)), ..ChildClock::default() };
        if let Some(old) = self.clock.children.insert(c, first).and_then(|old| old.scheduled) {
            self.clock.due.remove(&(old, c));
        }
        self.clock_reschedule(c);
    }

    /// Up to four times [`ClockConfig::first_round_after`], by child `c`'s node id:
    /// the children of one parent are not probed all at once.
    fn first_round_stagger(&self, c: usize) -> Duration {
        let node_id = self.children[c].node_id;
        self.clock
            .config
            .first_round_after
            .mul_f64(4.0 * f64::from(node_id.wrapping_mul(7919) % 1000) / 1000.0)
    }

    /// This node's children may be measured now: the front-end's once every back-end
    /// has reported, any other node's once its parent first probed it (so the whole
    /// tree is up). Each child not measured yet starts its first round soon, staggered.
    pub(super) fn clock_children_begin(&mut self, now: Instant) {
        self.clock.children_may_begin = true;
        let waiting: Vec<usize> = self
            .clock
            .children
            .iter()
            .filter(|(_, s)| s.rounds == 0 && s.probes_done == 0 && s.in_flight.is_none())
            .map(|(&c, _)| c)
            .collect();
        for c in waiting {
            let soon = now + self.clock.config.first_round_after + self.first_round_stagger(c);
            if let Some(state) = self.clock.children.get_mut(&c) {
                state.next_send = Some(soon);
            }
            self.clock_reschedule(c);
        }
    }

    fn send_probe(&mut self, c: usize, link: LinkId, now: Instant) {
        let Some(source) = self.clock.source else { return };
        let state = self.clock.children.entry(c).or_default();
        let seq = state.next_seq;
        state.next_seq = seq.wrapping_add(1);
        state.in_flight = Some((seq, now));
        self.out.control_timed(link, &ControlMsg::ClockProbe { seq, sent_ns: source.read(now) });
        self.clock_reschedule(c);
    }

    /// A probe from the parent, sent when the parent's clock read `sent_ns` (the
    /// start of its write) and read here at `now`: answered at once with both.
    pub(super) fn on_clock_probe(&mut self, link: LinkId, seq: u32, sent_ns: i64, now: Instant) {
        if let Some(source) = self.clock.source {
            self.out
                .control_timed(link, &ControlMsg::ClockReply { seq, sent_ns, child_ns: source.read(now) });
        }
        if !self.clock.children_may_begin {
            self.clock_children_begin(now);
        }
    }

    /// A child's answer to a probe, read at `now`, with three stamps: the parent's
    /// write of the probe and, on the child's clock, the read of the probe and the
    /// write of the answer. The child's time between the two is no part of the round
    /// trip (the four-stamp form of Cristian's method, as in NTP).
    pub(super) fn on_clock_reply(&mut self, c: usize, seq: u32, stamps: (i64, i64, i64), now: Instant) {
        self.clock_round(c, seq, stamps, now);
        self.clock_reschedule(c);
    }

    /// [`Node::on_clock_reply`]'s measurement; the caller reschedules the child.
    fn clock_round(&mut self, c: usize, seq: u32, stamps: (i64, i64, i64), now: Instant) {
        let (sent_ns, child_ns, answered_ns) = stamps;
        let Some(source) = self.clock.source else { return };
        let config = self.clock.config;
        let can_go_on =
            self.is_running() && self.children.get(c).is_some_and(|ch| ch.state == ChildState::Joined);
        let Some(state) = self.clock.children.get_mut(&c) else { return };
        if state.in_flight.map(|(s, _)| s) != Some(seq) {
            return;
        }
        state.in_flight = None;
        let back_ns = source.read(now);
        let held = answered_ns.saturating_sub(child_ns).max(0);
        let rtt = back_ns.saturating_sub(sent_ns).saturating_sub(held).max(0);
        let midpoint = sent_ns.saturating_add(rtt / 2);
        let offset = child_ns.saturating_sub(midpoint);
        state.samples.push(Probe { rtt, offset, midpoint });
        state.probes_done += 1;
        if state.probes_done < config.probes {
            let back_to_back =
                config.probe_gap.is_zero() || state.probes_done % config.probe_burst.max(1) != 0;
            if back_to_back && !can_go_on {
                // A child leaving, or a node ending: the timer's check gives the round up.
                state.next_send = Some(now);
            } else if back_to_back {
                // Back to back within a burst: both ends are still awake, where the
                // first probe of a burst has to wake them.
                if let Some(link) = self.children[c].link {
                    self.send_probe(c, link, now);
                }
            } else {
                state.next_send = Some(now + config.probe_gap);
            }
            return;
        }
        state.probes_done = 0;
        // Until a drift is measured (at the end of the second round since the
        // history last started), a drift as large as any crystal's is allowed for
        // over the round.
        let drift_error = if state.history.len() >= 2 { state.drift_error_ppb } else { UNKNOWN_DRIFT_PPB };
        let Some(Estimate { rtt, offset, midpoint, error }) =
            estimate(&state.samples, state.drift_ppb, drift_error)
        else {
            return;
        };
        state.samples.clear();
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
                let error = (i128::from(prev_error) + i128::from(error)) * 1_000_000_000 / span;
                state.drift_error_ppb = u64::try_from(error).unwrap_or(u64::MAX);
            }
        }
        state.history.push_back((offset, midpoint, error));
        state.rounds += 1;
        state.next_send = Some(now + if state.rounds == 1 { config.drift_after } else { config.resync });
        let sample = ClockSample {
            node_id: self.children[c].node_id,
            offset_ns: offset,
            error_ns: error.unsigned_abs(),
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

/// Test knob: distorts the clock of every node but the front-end, so that the global
/// clock's estimates can be checked against known offsets and drifts. Either
/// `OFFSET_US,DRIFT_PPM` (the same for every node) or
/// `seed:S,offset_us:O,drift_ppm:D[,epoch_s:E]` (each node draws its own offset in
/// ±O µs and drift in ±D ppm from S and its node id, see [`clock_distortion`]). The
/// drift accumulates from `E` seconds after the Unix epoch (default: the start of
/// the current UTC hour).
pub const CLOCK_DISTORT: &str = "TREECAST_CLOCK_DISTORT";
/// The distortion `knob` (the value of [`CLOCK_DISTORT`]) gives node `node_id`; `None`
/// for the front-end (node 0), the reference. `now_ns` picks the default epoch.
///
/// # Errors
/// A knob that is not in one of the two forms, naming what did not parse.
pub fn clock_distortion(knob: &str, node_id: u32, now_ns: i64) -> Result<Option<Distortion>, String> {
    const HOUR_NS: i64 = 3_600_000_000_000;
    let mut epoch_ns = now_ns - now_ns.rem_euclid(HOUR_NS);
    let number =
        |s: &str| s.trim().parse::<f64>().map_err(|_| format!("{CLOCK_DISTORT}: {s:?} is not a number"));
    let (offset_us, drift_ppm) = if knob.contains(':') {
        let (mut seed, mut max_offset, mut max_drift) = (0u64, 0.0, 0.0);
        for part in knob.split(',') {
            let (key, value) =
                part.split_once(':').ok_or_else(|| format!("{CLOCK_DISTORT}: {part:?} is not KEY:VALUE"))?;
            match key.trim() {
                "seed" => seed = number(value)? as u64,
                "offset_us" => max_offset = number(value)?,
                "drift_ppm" => max_drift = number(value)?,
                "epoch_s" => epoch_ns = (number(value)? * 1e9) as i64,
                other => {
                    return Err(format!(
                        "{CLOCK_DISTORT}: unknown key {other:?} (seed, offset_us, drift_ppm, epoch_s)"
                    ))
                }
            }
        }
        let draw = |k: u64| {
            let x = splitmix64(seed ^ (u64::from(node_id) << 8) ^ k);
            (x >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        (draw(1) * max_offset, draw(2) * max_drift)
    } else {
        let (o, d) = knob.split_once(',').ok_or_else(|| {
            format!("{CLOCK_DISTORT}: write OFFSET_US,DRIFT_PPM or seed:S,offset_us:O,drift_ppm:D")
        })?;
        (number(o)?, number(d)?)
    };
    if node_id == 0 {
        return Ok(None);
    }
    Ok(Some(Distortion {
        offset_ns: (offset_us * 1e3) as i64,
        drift_ppb: (drift_ppm * 1e3) as i64,
        epoch_ns,
    }))
}

fn splitmix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_monotonic_reading_agrees_with_the_instant_reading_distortion_included() {
        use treecast_monitor::clock::Mono;
        let base = Instant::now();
        let mut source = ClockSource::new(base, 1_700_000_000_000_000_000);
        source.distortion = Distortion { offset_ns: -5_000_000, drift_ppb: 90_000, epoch_ns: source.base_ns };
        let base_mono = Mono::from_nanos(40_000_000_000);
        // The same moment, 3 s after the base, on either clock.
        let by_instant = source.read(base + Duration::from_secs(3));
        assert_eq!(source.read_mono(base_mono, Mono::from_nanos(43_000_000_000)), by_instant);
    }

    /// A probe of a child whose clock is `offset` ahead, sent at `sent` (parent's
    /// clock), `down` and `up` nanoseconds each way.
    fn probe(offset: i64, sent: i64, down: i64, up: i64) -> Probe {
        let rtt = down + up;
        Probe { rtt, offset: offset + down - rtt / 2, midpoint: sent + rtt / 2 }
    }

    #[test]
    fn the_fastest_trip_down_and_the_fastest_trip_up_bound_the_offset_from_different_probes() {
        // No probe is fast both ways, yet one was fast down and another fast up.
        let samples = [
            probe(1_000, 0, 2_000, 50_000),
            probe(1_000, 100_000, 50_000, 2_000),
            probe(1_000, 200_000, 30_000, 30_000),
        ];
        let e = estimate(&samples, 0, 0).unwrap();
        assert_eq!((e.offset, e.error, e.rtt), (1_000, 2_000, 52_000), "{e:?}");
        // The shortest round trip alone would be off by 24 µs.
        assert_eq!(samples[0].offset, 1_000 - 24_000);
    }

    #[test]
    fn probes_are_carried_to_one_instant_by_the_drift() {
        // The child gains 100 ppm: 10 µs over the 0.1 s between these probes.
        let samples = [probe(1_000, 0, 2_000, 8_000), probe(11_000, 100_000_000, 8_000, 2_000)];
        let e = estimate(&samples, 100_000, 0).unwrap();
        assert_eq!(e.midpoint, 5_000, "the shortest round trip's midpoint (the first of equals)");
        assert_eq!((e.offset, e.error), (1_000, 2_000), "{e:?}");
        // A drift known to 10 ppm may have moved the later probe's interval by 1 µs.
        let e = estimate(&samples, 100_000, 10_000).unwrap();
        assert_eq!((e.offset, e.error), (500, 2_500), "{e:?}");
        // Not carried, the two probes contradict each other.
        assert_eq!(estimate(&samples, 0, 0).map(|e| (e.offset, e.error)), Some((-2_000, 5_000)));
    }

    #[test]
    fn probes_that_cannot_all_be_right_leave_the_shortest_round_trip_alone() {
        // A clock stepped by a millisecond between the probes: the intervals do not meet.
        let samples = [probe(1_000, 0, 5_000, 6_000), probe(1_001_000, 100_000, 5_000, 5_000)];
        let e = estimate(&samples, 0, 0).unwrap();
        assert_eq!((e.offset, e.error, e.rtt), (1_001_000, 5_000, 10_000), "{e:?}");
        assert_eq!(estimate(&[], 0, 0), None);
    }
}
