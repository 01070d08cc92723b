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

use std::cell::Cell;
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

/// Per link: when something last arrived, and when the next heartbeat is due.
#[derive(Debug, Default)]
pub(super) struct Liveness {
    limits: Option<LivenessLimits>,
    links: LinkMap<LinkTimes>,
    /// Links visited so far by the timer's work (the deadline query included), for
    /// `treecast bench sim`'s per-node costs.
    visits: Cell<u64>,
}

#[derive(Debug, Clone, Copy)]
struct LinkTimes {
    heard: Instant,
    next_beat: Instant,
    /// A heartbeat arrived: the peer sends them, so its silence means something.
    armed: bool,
}

impl Liveness {
    /// Switches the checks on (or off with `None`) for every link, from `now`.
    pub(super) fn configure(&mut self, limits: Option<LivenessLimits>, now: Instant) {
        self.limits = limits;
        for (_, t) in self.links.iter_mut() {
            *t = LinkTimes { heard: now, next_beat: now, armed: t.armed };
        }
    }

    pub(super) fn limits(&self) -> Option<LivenessLimits> {
        self.limits
    }

    pub(super) fn link_up(&mut self, link: LinkId, now: Instant) {
        self.links.insert(link, LinkTimes { heard: now, next_beat: now, armed: false });
    }

    pub(super) fn link_closed(&mut self, link: LinkId) {
        self.links.remove(link);
    }

    /// `frame` arrived on `link`.
    pub(super) fn heard(&mut self, link: LinkId, frame: &Frame, now: Instant) {
        if let Some(t) = self.links.get_mut(link) {
            t.heard = now;
            t.armed |= is_heartbeat(frame);
        }
    }

    /// Links silent for longer than the limit, and how long each has been silent.
    pub(super) fn silent(&self, now: Instant) -> Vec<(LinkId, Duration)> {
        let Some(limits) = self.limits else { return Vec::new() };
        self.links
            .iter()
            .filter_map(|(link, t)| {
                self.visit();
                let silent = now.saturating_duration_since(t.heard);
                (t.armed && silent >= limits.dead_after).then_some((link, silent))
            })
            .collect()
    }

    /// Links a heartbeat is due on; their next one is scheduled.
    pub(super) fn beats_due(&mut self, now: Instant) -> Vec<LinkId> {
        let Some(limits) = self.limits else { return Vec::new() };
        let mut due = Vec::new();
        for (link, t) in self.links.iter_mut() {
            self.visits.set(self.visits.get() + 1);
            if t.next_beat <= now {
                t.next_beat = now + limits.heartbeat;
                due.push(link);
            }
        }
        due
    }

    /// When the next heartbeat or silence limit falls due.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let limits = self.limits?;
        self.links
            .iter()
            .map(|(_, t)| {
                self.visit();
                t
            })
            .map(|t| if t.armed { t.next_beat.min(t.heard + limits.dead_after) } else { t.next_beat })
            .min()
    }

    fn visit(&self) {
        self.visits.set(self.visits.get() + 1);
    }

    /// Links the timer's work visited so far.
    pub(super) fn visits(&self) -> u64 {
        self.visits.get()
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
}
