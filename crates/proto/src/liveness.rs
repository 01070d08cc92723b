//! Hung peers: a node that stops reading and writing (stopped by SIGSTOP, wedged on a
//! disk, its thread blocked) is cut off after a limit and treated as lost, so it can
//! stall its parent and siblings no longer than that.
//!
//! Every node sends a heartbeat on each of its links every `heartbeat`, and a link on
//! which nothing at all arrived (data, credit, control, heartbeat) for `dead_after` is
//! closed as failed: its sub-tree is reported lost, or for a child, its parent is gone
//! and it shuts down. A heartbeat is a credit frame for stream 0, which no stream
//! uses: every node already ignores it, so it needs no new frame kind.
//!
//! The limit applies to a link only once a heartbeat arrived on it: a peer that sends
//! none (its checks switched off, or an older build) is never cut off for silence, so
//! the two ends need not agree on the setting.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use treecast_wire::{Frame, FrameKind, Grant};
use treecast_wire::{LinkId, LinkMap};

/// How often a node sends a heartbeat on each link, by default.
pub const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(1);
/// How long a link may stay silent before it is cut off, by default.
pub const DEFAULT_DEAD_AFTER: Duration = Duration::from_secs(30);

/// The heartbeat and silence limits of a node; `None` switches the check off.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LivenessLimits {
    /// Interval between heartbeats on each link.
    pub heartbeat: Duration,
    /// Silence after which a link is cut off.
    pub dead_after: Duration,
}

impl LivenessLimits {
    /// From milliseconds as a launch plan or the environment carries them; `None` when
    /// either is 0 (off).
    pub fn from_ms(heartbeat_ms: u32, dead_after_ms: u32) -> Option<LivenessLimits> {
        (heartbeat_ms > 0 && dead_after_ms > 0).then(|| LivenessLimits {
            heartbeat: Duration::from_millis(heartbeat_ms.into()),
            dead_after: Duration::from_millis(dead_after_ms.into()),
        })
    }
}

impl LivenessLimits {
    /// Limits that cut a link off after `dead_after` of silence, with heartbeats four
    /// times per limit, at most once a second.
    pub fn for_dead_after(dead_after: Duration) -> LivenessLimits {
        LivenessLimits {
            heartbeat: (dead_after / 4).min(DEFAULT_HEARTBEAT).max(Duration::from_millis(1)),
            dead_after,
        }
    }
}

impl Default for LivenessLimits {
    fn default() -> Self {
        LivenessLimits { heartbeat: DEFAULT_HEARTBEAT, dead_after: DEFAULT_DEAD_AFTER }
    }
}

/// A heartbeat frame: a credit frame for stream 0 that grants nothing.
pub fn heartbeat_frame() -> Frame {
    Frame::credit(0, Grant::default())
}

/// True for a heartbeat frame.
fn is_heartbeat(frame: &Frame) -> bool {
    frame.header.kind == FrameKind::Credit && frame.header.stream == 0
}

/// Per link: when something last arrived, and whether its silence counts; per node:
/// one heartbeat timer for every link, and the silence checks in deadline order.
///
/// A node with a thousand links wakes once per heartbeat, not once per link, and
/// neither a wake-up nor a deadline query walks every link: every link gets its
/// heartbeat at the node's tick (a new link one at once, then at the tick), and
/// a link's silence is checked when its limit could first fall due
/// (`heard + dead_after` as of the last check), in an ordered set. A frame that
/// arrives only moves `heard`; the check that finds the link heard since puts it
/// back at its new limit (once per `dead_after` per live link). Checks due before
/// the next tick are looked at on any wake-up, so that a live link's check rides
/// on a wake-up the node has anyway.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    limits: Option<LivenessLimits>,
    links: LinkMap<LinkTimes>,
    /// Live links, for the heartbeat tick and for "any link at all".
    count: usize,
    /// Links up since the last tick that have not had their first heartbeat; a
    /// closed one may linger here (skipped: its entry is gone or not `fresh`).
    fresh: Vec<LinkId>,
    /// When the oldest link of `fresh` came up (its heartbeat is due then).
    fresh_since: Option<Instant>,
    /// The node's heartbeat timer: every link gets one when it falls due.
    next_beat: Option<Instant>,
    /// Silence checks of armed links: when, and which link, earliest first.
    checks: BTreeSet<(Instant, LinkId)>,
    /// Links (and check entries) visited so far by the timer's work, for
    /// `treecast bench sim`'s per-node costs.
    visits: u64,
}

#[derive(Debug, Clone, Copy)]
struct LinkTimes {
    heard: Instant,
    /// A heartbeat arrived: the peer sends them, so its silence means something.
    armed: bool,
    /// Its silence check in [`Liveness::checks`], once armed (with the limits on).
    check: Option<Instant>,
    /// Up since the last tick, first heartbeat not sent yet.
    fresh: bool,
}

impl Liveness {
    /// Switches the checks on (or off with `None`) for every link, from `now`.
    pub(super) fn configure(&mut self, limits: Option<LivenessLimits>, now: Instant) {
        self.limits = limits;
        self.checks.clear();
        self.fresh.clear();
        self.fresh_since = None;
        // Every link gets a heartbeat at once, as a new one does.
        self.next_beat = Some(now);
        for (link, t) in self.links.iter_mut() {
            self.visits += 1;
            t.heard = now;
            t.fresh = false;
            t.check = match (limits, t.armed) {
                (Some(l), true) => Some(now + l.dead_after),
                _ => None,
            };
            if let Some(at) = t.check {
                self.checks.insert((at, link));
            }
        }
    }

    pub(super) fn limits(&self) -> Option<LivenessLimits> {
        self.limits
    }

    pub(super) fn link_up(&mut self, link: LinkId, now: Instant) {
        if let Some(old) = self.links.get(link).copied() {
            // The same id again (not expected: ids are never reused): start afresh.
            self.forget(link, old);
        }
        self.links.insert(link, LinkTimes { heard: now, armed: false, check: None, fresh: true });
        self.count += 1;
        self.fresh.push(link);
        self.fresh_since.get_or_insert(now);
    }

    pub(super) fn link_closed(&mut self, link: LinkId) {
        if let Some(t) = self.links.get(link).copied() {
            self.forget(link, t);
        }
    }

    fn forget(&mut self, link: LinkId, t: LinkTimes) {
        self.links.remove(link);
        self.count -= 1;
        if let Some(at) = t.check {
            self.checks.remove(&(at, link));
        }
    }

    /// `frame` arrived on `link`.
    pub(super) fn heard(&mut self, link: LinkId, frame: &Frame, now: Instant) {
        let Some(t) = self.links.get_mut(link) else { return };
        t.heard = now;
        if !t.armed && is_heartbeat(frame) {
            t.armed = true;
            if let Some(limits) = self.limits {
                let at = now + limits.dead_after;
                t.check = Some(at);
                self.checks.insert((at, link));
            }
        }
    }

    /// Links silent for longer than the limit, and how long each has been silent
    /// (they leave the checks: the caller closes them). Looks only at the checks due
    /// before the next heartbeat tick.
    pub(super) fn silent(&mut self, now: Instant) -> Vec<(LinkId, Duration)> {
        let Some(limits) = self.limits else { return Vec::new() };
        // Checks due before the node next wakes for its heartbeats anyway: a live link's
        // is moved on now rather than waking the node on its own.
        let horizon = now + limits.heartbeat;
        let window: Vec<(Instant, LinkId)> =
            self.checks.iter().take_while(|&&(at, _)| at <= horizon).copied().collect();
        let mut silent = Vec::new();
        for (at, link) in window {
            self.visits += 1;
            let Some(t) = self.links.get_mut(link) else {
                self.checks.remove(&(at, link));
                continue;
            };
            let limit = t.heard + limits.dead_after;
            if limit <= now {
                self.checks.remove(&(at, link));
                t.check = None;
                silent.push((link, now.saturating_duration_since(t.heard)));
            } else if limit > at {
                // Heard since the check was set: it moves to the new limit.
                self.checks.remove(&(at, link));
                t.check = Some(limit);
                self.checks.insert((limit, link));
            }
            // Else silent since, and due before the next tick: it stays, its own deadline.
        }
        // In link order, as one walk over the links would find them.
        silent.sort_unstable_by_key(|&(link, _)| link);
        silent
    }

    /// Links a heartbeat is due on: every link at the node's tick, and links up since
    /// the last tick at once; the next tick is scheduled.
    pub(super) fn beats_due(&mut self, now: Instant) -> Vec<LinkId> {
        let Some(limits) = self.limits else { return Vec::new() };
        let mut due = Vec::new();
        if self.next_beat.map_or(true, |t| t <= now) {
            self.next_beat = Some(now + limits.heartbeat);
            for (link, t) in self.links.iter_mut() {
                self.visits += 1;
                t.fresh = false;
                due.push(link);
            }
            self.fresh.clear();
            self.fresh_since = None;
        } else if self.fresh_since.is_some_and(|t| t <= now) {
            for link in std::mem::take(&mut self.fresh) {
                self.visits += 1;
                if let Some(t) = self.links.get_mut(link).filter(|t| t.fresh) {
                    t.fresh = false;
                    due.push(link);
                }
            }
            due.sort_unstable();
            self.fresh_since = None;
        }
        due
    }

    /// When the next heartbeat or silence limit falls due.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.limits?;
        if self.count == 0 {
            return None;
        }
        [self.next_beat, self.fresh_since, self.checks.first().map(|&(at, _)| at)].into_iter().flatten().min()
    }

    /// Links and checks the timer's work visited so far.
    pub(super) fn visits(&self) -> u64 {
        self.visits
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use treecast_wire::LinkTable;

    #[test]
    fn a_silent_link_is_named_after_the_limit_and_a_heard_one_is_not() {
        let mut table = LinkTable::<()>::default();
        let (a, b) = (table.insert(()), table.insert(()));
        let t0 = Instant::now();
        let mut l = Liveness::default();
        l.configure(LivenessLimits::from_ms(100, 1000), t0);
        l.link_up(a, t0);
        l.link_up(b, t0);
        assert_eq!(l.beats_due(t0), vec![a, b], "a heartbeat at once on each new link");
        assert!(l.beats_due(t0 + Duration::from_millis(50)).is_empty());
        assert_eq!(l.next_deadline(), Some(t0 + Duration::from_millis(100)));
        assert!(l.silent(t0 + Duration::from_secs(5)).is_empty(), "no heartbeat heard yet: no limit");
        l.heard(a, &heartbeat_frame(), t0);
        l.heard(b, &heartbeat_frame(), t0);
        l.heard(b, &Frame::credit(3, Grant { packets: 1, bytes: 1 }), t0 + Duration::from_millis(900));
        assert!(l.silent(t0 + Duration::from_millis(999)).is_empty());
        let silent = l.silent(t0 + Duration::from_millis(1000));
        assert_eq!(silent, vec![(a, Duration::from_millis(1000))]);
        l.link_closed(a);
        assert!(l.silent(t0 + Duration::from_millis(1500)).is_empty());
    }

    #[test]
    fn off_means_no_heartbeats_and_no_deadline() {
        let mut table = LinkTable::<()>::default();
        let a = table.insert(());
        let t0 = Instant::now();
        let mut l = Liveness::default();
        l.link_up(a, t0);
        assert!(l.beats_due(t0).is_empty());
        assert!(l.silent(t0 + Duration::from_secs(3600)).is_empty());
        assert_eq!(l.next_deadline(), None);
        assert_eq!(LivenessLimits::from_ms(0, 1000), None);
    }

    #[test]
    fn a_node_with_a_thousand_links_wakes_once_per_heartbeat_and_walks_no_link_per_wake_up() {
        // Regression: each link had its own heartbeat timer, so a parent whose children
        // came up one after the other woke once per link per heartbeat, and every
        // wake-up and deadline query walked every link.
        let mut table = LinkTable::<()>::default();
        let t0 = Instant::now();
        let hb = Duration::from_millis(100);
        let mut l = Liveness::default();
        l.configure(LivenessLimits::from_ms(100, 1000), t0);
        let links: Vec<LinkId> = (0..1000).map(|_| table.insert(())).collect();
        let mut last_beat = std::collections::HashMap::new();
        for (i, &link) in links.iter().enumerate() {
            let up = t0 + Duration::from_micros(i as u64 * 97);
            l.link_up(link, up);
            l.heard(link, &heartbeat_frame(), up);
        }
        let start = t0 + Duration::from_millis(100);
        let (mut now, mut wakeups) = (start, 0);
        let end = start + Duration::from_secs(1);
        while let Some(at) = l.next_deadline().filter(|&at| at <= end) {
            now = now.max(at);
            wakeups += 1;
            for &link in &links {
                l.heard(link, &heartbeat_frame(), now); // every peer is alive
            }
            assert!(l.silent(now).is_empty());
            for link in l.beats_due(now) {
                if let Some(prev) = last_beat.insert(link, now) {
                    assert!(now - prev <= hb, "a link went {:?} without a heartbeat", now - prev);
                }
            }
        }
        assert!(wakeups <= 12, "{wakeups} wake-ups in 10 heartbeats of a node with 1,000 links");
        assert_eq!(last_beat.len(), 1000, "every link had its heartbeats");
        // Heartbeats are sent per link (1,000 a tick); the silence checks visit each
        // live link about once per limit, not once per wake-up.
        let visits = l.visits();
        assert!(visits < 11 * 1000 + 3 * 1000, "{visits} visits");
    }

    #[test]
    fn a_link_up_between_ticks_gets_a_heartbeat_at_once_then_the_nodes_tick() {
        let mut table = LinkTable::<()>::default();
        let (a, b) = (table.insert(()), table.insert(()));
        let t0 = Instant::now();
        let mut l = Liveness::default();
        l.configure(LivenessLimits::from_ms(100, 1000), t0);
        l.link_up(a, t0);
        assert_eq!(l.beats_due(t0), vec![a]);
        let mid = t0 + Duration::from_millis(30);
        l.link_up(b, mid);
        assert_eq!(l.next_deadline(), Some(mid), "the new link's first heartbeat");
        assert_eq!(l.beats_due(mid), vec![b]);
        assert_eq!(l.next_deadline(), Some(t0 + Duration::from_millis(100)), "one tick for both");
        assert_eq!(l.beats_due(t0 + Duration::from_millis(100)), vec![a, b]);
    }
}
