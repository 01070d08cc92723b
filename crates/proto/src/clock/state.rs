//! What [`crate::Node`] keeps for the global clock: the state, apart from the behaviour
//! (`clock.rs`) that changes it, so that the node's definition imports no behaviour.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use treecast_monitor::clock::{drifted, Mono, NodeClock};
use treecast_wire::ClockSample;

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

impl ClockSource {
    /// The clock at monotonic reading `now`, nanoseconds, where `base_mono` is the
    /// monotonic reading at `base`: what the route stamps frames with while
    /// recording. It agrees with [`ClockSource::read`] within the error of
    /// `base_mono` (tens of nanoseconds when read beside an `Instant`).
    pub fn read_mono(&self, base_mono: Mono, now: Mono) -> i64 {
        self.node_clock(base_mono).at(now)
    }

    /// This clock as the route reads it, where `base_mono` is the monotonic reading
    /// at `base` (see [`ClockSource::read_mono`]).
    pub fn node_clock(&self, base_mono: Mono) -> NodeClock {
        let d = self.distortion;
        NodeClock {
            base: base_mono,
            base_ns: self.base_ns,
            offset_ns: d.offset_ns,
            drift_ppb: d.drift_ppb,
            epoch_ns: d.epoch_ns,
        }
    }
}

pub(super) fn duration_ns(d: Duration) -> i64 {
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
    /// Probes sent back to back, each as soon as the last is answered: the first
    /// of a burst finds the ends asleep and waking them takes longer one way than
    /// the other, the next ones find both awake.
    pub probe_burst: u32,
    /// Time between bursts: spread out, they are more likely to catch a moment when
    /// neither end waits for a CPU.
    pub probe_gap: Duration,
    /// Time from a child joining to its first round, or, where this node was not
    /// probed by its parent yet, from its first probe (the whole tree is up by then);
    /// each child also waits up to four times as long again, by its node id, so that
    /// the children of one parent are not probed all at once.
    pub first_round_after: Duration,
}

impl Default for ClockConfig {
    fn default() -> Self {
        ClockConfig {
            probes: 32,
            drift_after: Duration::from_secs(2),
            resync: Duration::from_secs(300),
            drift_window: Duration::from_secs(3600),
            probe_limit: Duration::from_secs(5),
            probe_burst: 32,
            probe_gap: Duration::from_millis(2),
            first_round_after: Duration::from_millis(50),
        }
    }
}

/// One answered probe: its round trip (the child's time between read and answer
/// left out), the child's clock minus the parent's, and the parent's clock at the
/// round trip's midpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Probe {
    pub(super) rtt: i64,
    pub(super) offset: i64,
    pub(super) midpoint: i64,
}

/// A parent's measurement of one child.
#[derive(Debug, Default)]
pub(super) struct ChildClock {
    pub(super) rounds: u32,
    /// The probe sent and not yet answered: its number and when it left.
    pub(super) in_flight: Option<(u32, Instant)>,
    /// Number of the next probe; never reused, so a late answer to a probe given up
    /// on cannot pass for the answer to a later one.
    pub(super) next_seq: u32,
    pub(super) probes_done: u32,
    /// The probes of the round answered so far.
    pub(super) samples: Vec<Probe>,
    /// Earlier rounds within the drift window, oldest first: offset, midpoint and
    /// error bound, for the drift.
    pub(super) history: std::collections::VecDeque<(i64, i64, i64)>,
    pub(super) drift_ppb: i64,
    pub(super) drift_error_ppb: u64,
    /// When the next probe goes (the next of a round, or the first of the next round).
    pub(super) next_send: Option<Instant>,
    /// Its entry in [`ClockSync::due`]: when the timer must look at it next.
    pub(super) scheduled: Option<Instant>,
}

impl ChildClock {
    /// When the timer must look at this child: its probe's limit, or its next probe.
    pub(super) fn deadline(&self, probe_limit: Duration) -> Option<Instant> {
        match self.in_flight {
            Some((_, at)) => Some(at + probe_limit),
            None => self.next_send,
        }
    }
}

/// A node's part of the global clock.
#[derive(Debug, Default)]
pub(crate) struct ClockSync {
    pub(super) source: Option<ClockSource>,
    pub(crate) config: ClockConfig,
    /// Per child index.
    pub(super) children: BTreeMap<usize, ChildClock>,
    /// Each child's next deadline, earliest first: the timer looks at the children
    /// due and no other, and the next deadline is the first entry (a parent of a
    /// thousand children walks none of them per wake-up).
    pub(super) due: std::collections::BTreeSet<(Instant, usize)>,
    /// Children the timer looked at so far, for `treecast bench sim`'s per-node costs.
    pub(crate) visits: u64,
    /// This node's children may be measured: the whole tree is up (the front-end's
    /// start-up is over, or this node's parent has probed it), so that no round takes
    /// CPU from a start-up still under way.
    pub(super) children_may_begin: bool,
    /// Front-end: the latest sample of every node, and how many rounds it has.
    pub(super) samples: BTreeMap<u32, (ClockSample, u32)>,
}
