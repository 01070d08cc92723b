//! The one-way cross-check of the global clock: frames of one size crossing a link
//! down and up should take the same shortest time both ways; half the difference is
//! what the link's clock correction is off by, plus whatever the link's two
//! directions really differ by.

use serde::{Deserialize, Serialize};

use crate::{Component, Report};

/// The shortest net latency of one link's frames of one size class, both ways.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct OneWay {
    /// The link, by the node id of its lower end.
    pub link: u32,
    /// The frames' size class.
    pub size_class: u8,
    /// Shortest net latency going down (parent to child), nanoseconds.
    pub down_min_ns: u64,
    /// Frames going down.
    pub down_frames: u64,
    /// Of those, frames that arrived before they were sent by the corrected clocks.
    pub down_early: u64,
    /// Shortest net latency going up, nanoseconds.
    pub up_min_ns: u64,
    /// Frames going up.
    pub up_frames: u64,
    /// Of those, frames that arrived before they were sent by the corrected clocks.
    pub up_early: u64,
}

impl OneWay {
    /// Half of down minus up, nanoseconds: how far the link's clock correction would
    /// be off if both directions really took the same time.
    pub fn skew_ns(&self) -> i64 {
        let diff = i128::from(self.down_min_ns) - i128::from(self.up_min_ns);
        i64::try_from(diff / 2).unwrap_or(if diff > 0 { i64::MAX } else { i64::MIN })
    }

    /// A direction's shortest latency is not above 1 ns: a frame arrived before it
    /// was sent, by the corrected clocks (samples below 1 ns are kept as 1), so the
    /// correction is off by more than that frame's true latency.
    pub fn breaks_causality(&self) -> bool {
        self.down_min_ns <= 1 || self.up_min_ns <= 1
    }
}

/// Every (link, size class) whose net latency was recorded in both directions, with
/// at least `min_frames` frames each way, in link and size order.
pub fn one_way(report: &Report, min_frames: u64) -> Vec<OneWay> {
    let mut seen: std::collections::BTreeMap<(u32, u8), [Side; 2]> = Default::default();
    for cell in report.cells.iter().filter(|c| c.component == Component::Net && c.count > 0) {
        if cell.key() == crate::Key::OTHER {
            continue;
        }
        let sides = seen.entry((cell.link, cell.size_class)).or_insert([Side::EMPTY; 2]);
        let side = &mut sides[usize::from(cell.up)];
        side.min_ns = side.min_ns.min(cell.min_ns());
        side.frames = side.frames.saturating_add(cell.count);
        // Net samples below 1 ns are kept as 1: the lowest bucket holds them.
        let early: u64 = cell.buckets.iter().take_while(|b| b[0] <= 1).map(|b| b[1]).sum();
        side.early = side.early.saturating_add(early);
    }
    seen.into_iter()
        .filter(|(_, [down, up])| down.frames >= min_frames.max(1) && up.frames >= min_frames.max(1))
        .map(|((link, size_class), [down, up])| OneWay {
            link,
            size_class,
            down_min_ns: down.min_ns,
            down_frames: down.frames,
            down_early: down.early,
            up_min_ns: up.min_ns,
            up_frames: up.frames,
            up_early: up.early,
        })
        .collect()
}

/// One direction of a link, for one size class.
#[derive(Clone, Copy)]
struct Side {
    min_ns: u64,
    frames: u64,
    early: u64,
}

impl Side {
    const EMPTY: Side = Side { min_ns: u64::MAX, frames: 0, early: 0 };
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{Key, Recorder};

    #[test]
    fn each_link_and_size_gets_its_shortest_latency_both_ways() {
        let mut r = Recorder::default();
        let key = |link, up, tag| Key { link, up, tag, program: 0 };
        for ns in [50_000, 30_000, 90_000] {
            r.record(key(3, false, 1), Component::Net, 8, ns);
        }
        // Another tag on the same link and size joins the same pair.
        r.record(key(3, false, 2), Component::Net, 8, 20_000);
        for ns in [26_000, 70_000] {
            r.record(key(3, true, 1), Component::Net, 8, ns);
        }
        // Only one direction: no pair. Other components: ignored.
        r.record(key(4, true, 1), Component::Net, 8, 10_000);
        r.record(key(3, true, 1), Component::Send, 8, 1);
        let pairs = one_way(&r.report(), 1);
        assert_eq!(pairs.len(), 1, "{pairs:?}");
        let p = pairs[0];
        assert_eq!((p.link, p.size_class, p.down_frames, p.up_frames), (3, 4, 4, 2));
        assert_eq!((p.down_early, p.up_early), (0, 0));
        // Within the histogram's precision (1 % with two significant digits).
        assert!(p.down_min_ns.abs_diff(20_000) <= 200, "{p:?}");
        assert!(p.up_min_ns.abs_diff(26_000) <= 260, "{p:?}");
        assert!((p.skew_ns() + 3_000).abs() <= 300, "{p:?}");
        assert!(!p.breaks_causality());
        assert!(one_way(&r.report(), 3).is_empty(), "two frames up are fewer than three");
    }

    #[test]
    fn a_frame_that_arrived_before_it_was_sent_breaks_causality() {
        let mut r = Recorder::default();
        r.record(Key { link: 1, up: false, tag: 1, program: 0 }, Component::Net, 8, 0);
        r.record(Key { link: 1, up: true, tag: 1, program: 0 }, Component::Net, 8, 900_000_000);
        let p = one_way(&r.report(), 1)[0];
        assert!(p.breaks_causality(), "{p:?}");
        assert_eq!((p.down_early, p.up_early), (1, 0));
        assert!(p.skew_ns() < -400_000_000);
    }
}
