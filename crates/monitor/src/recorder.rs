//! One node's histograms: a cell per (key, component, size class), made on first use.

use std::sync::atomic::{AtomicU64, Ordering};

use rustc_hash::{FxHashMap, FxHashSet};

use hdrhistogram::Histogram;

use crate::report::{CellReport, MonitorError, Report};
use crate::{size_class, Component, Key, SIZE_CLASSES};

/// Longest latency told apart, nanoseconds (one hour); longer samples count as this.
pub const HIGHEST_NS: u64 = 3_600_000_000_000;
/// Significant decimal digits kept per sample: 2 keeps every latency within 1 %,
/// which is 1 µs or better up to 100 µs, where small frames' latencies lie.
pub const SIGNIFICANT_DIGITS: u8 = 2;
/// Most samples one cell of a report may bring into a merge (2^53).
const MAX_CELL_SAMPLES: u64 = 1 << 53;
/// Histograms a recorder keeps apart by default (see [`Recorder::new`]).
pub const DEFAULT_MAX_CELLS: usize = 512;
/// Memory of one histogram's counts, bytes (checked by a test against the library):
/// 4,608 counters of 8 bytes for 1 ns to one hour at 2 significant digits.
pub const CELL_BYTES: usize = 36_864;

/// Where a sample goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Cell {
    pub(crate) key: Key,
    pub(crate) component: Component,
    pub(crate) size_class: u8,
}

/// The samples of one cell: their counts in the histogram's buckets and their
/// exact sum, so that merged means stay exact.
///
/// The counts are laid out as `hdrhistogram` lays out a histogram from 1 ns to
/// [`HIGHEST_NS`] at [`SIGNIFICANT_DIGITS`], and a sample is counted with the index
/// computed here: the library's record checks and resizes, and it is on every
/// frame's path. [`Latencies::histogram`] makes the library's histogram for a report.
#[derive(Debug, Clone)]
pub(crate) struct Latencies {
    counts: Box<[u64]>,
    pub(crate) sum_ns: u64,
}

/// A report holds more samples in one cell than any recording makes.
fn too_many() -> MonitorError {
    MonitorError::Histogram(format!(
        "a cell claims more than {MAX_CELL_SAMPLES} samples: the report is damaged"
    ))
}

/// Sub-buckets per bucket, as the library chooses them for 2 significant digits
/// (the smallest power of two above 2 × 10²), as a power of two.
const SUB_BUCKETS_LOG2: u32 = 8;
const SUB_BUCKET_HALF: u64 = 1 << (SUB_BUCKETS_LOG2 - 1);
const SUB_BUCKET_MASK: u64 = (1 << SUB_BUCKETS_LOG2) - 1;

/// The index of `value`'s bucket in the library's layout (`value` at least 1).
fn index_of(value: u64) -> usize {
    let bucket = (64 - SUB_BUCKETS_LOG2) - (value | SUB_BUCKET_MASK).leading_zeros();
    let sub_bucket = value >> bucket;
    (((u64::from(bucket) + 1) << (SUB_BUCKETS_LOG2 - 1)) + sub_bucket - SUB_BUCKET_HALF) as usize
}

/// The lowest value of the bucket at `index` (the inverse of [`index_of`]).
fn lowest_of(index: usize) -> u64 {
    let index = index as u64;
    let bucket = (index >> (SUB_BUCKETS_LOG2 - 1)).saturating_sub(1);
    let sub_bucket = match index >> (SUB_BUCKETS_LOG2 - 1) {
        0 => index,
        _ => (index & (SUB_BUCKET_HALF - 1)) + SUB_BUCKET_HALF,
    };
    sub_bucket << bucket
}

impl Latencies {
    fn new() -> Latencies {
        Latencies { counts: vec![0; CELL_BYTES / 8].into_boxed_slice(), sum_ns: 0 }
    }

    /// Counts `count` samples of `value` (1 to [`HIGHEST_NS`]); `sum_ns` is their sum.
    fn add(&mut self, value: u64, count: u64, sum_ns: u64) {
        // Every value up to HIGHEST_NS has its bucket (checked by a test).
        if let Some(n) = self.counts.get_mut(index_of(value)) {
            *n = n.saturating_add(count);
        }
        self.sum_ns = self.sum_ns.saturating_add(sum_ns);
    }

    /// How many samples the counts hold (summed when asked: only a merge asks).
    fn total(&self) -> u64 {
        self.counts.iter().fold(0u64, |n, &c| n.saturating_add(c))
    }

    /// The library's histogram of these counts.
    pub(crate) fn histogram(&self) -> Result<Histogram<u64>, MonitorError> {
        let mut h = Histogram::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS)
            .map_err(|e| MonitorError::Histogram(e.to_string()))?;
        for (index, &count) in self.counts.iter().enumerate().filter(|(_, &n)| n > 0) {
            h.saturating_record_n(lowest_of(index).min(HIGHEST_NS), count);
        }
        Ok(h)
    }
}

/// The histograms of one node, within a memory bound.
///
/// At most `max_cells` cells are kept apart; once that many exist, samples for a new
/// (key, component, size class) go to [`Key::OTHER`], at most
/// 4 × [`SIZE_CLASSES`] more cells, and are counted in [`Report::folded`]. Memory is
/// thus at most (`max_cells` + 136) × [`CELL_BYTES`] plus the map's own overhead:
/// about 23 MiB at the default of 512 cells. A comm node with 16 children and two
/// tags, each carrying frames of a few sizes, fills a few hundred cells.
///
/// Recording is on every frame's path, so it is kept cheap: a caller that counts
/// the same cells over and over (a link, for its frames) finds each once
/// ([`Recorder::slot`]) and counts into it ([`Recorder::add_at`]), with no search.
/// [`Recorder::record_n`] looks the cell up on every call. Samples of one batch
/// (frames that share their latencies, see the transport's timing) come as one
/// call with their count.
#[derive(Debug)]
pub struct Recorder {
    cells: Vec<(Cell, Latencies)>,
    index: FxHashMap<Cell, usize>,
    max_cells: usize,
    folded: u64,
    /// This recorder (high half, unique in the process) and its clears (low half):
    /// a [`Slot`] found by another recorder, or before the last clear, names no cell.
    generation: u64,
}

/// Hands each recorder its own high half of [`Recorder`]'s generation.
static RECORDERS: AtomicU64 = AtomicU64::new(0);

/// A cell found once and counted into directly ([`Recorder::add_at`]): what a link
/// keeps for the frames it carries, which keep one stream, tag and size class for
/// long stretches, so that their samples need no search.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    at: u32,
    generation: u64,
    /// The cell is [`Key::OTHER`]'s: its samples are counted as folded.
    folded: bool,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder::new(DEFAULT_MAX_CELLS)
    }
}

impl Recorder {
    /// An empty recorder keeping at most `max_cells` cells apart (see the type).
    pub fn new(max_cells: usize) -> Recorder {
        Recorder {
            cells: Vec::new(),
            index: FxHashMap::default(),
            max_cells,
            folded: 0,
            generation: RECORDERS.fetch_add(1, Ordering::Relaxed) << 32,
        }
    }

    /// The cell of samples of `key` and `component` for frames of `bytes` bytes,
    /// made if new (under [`Key::OTHER`] once the recorder is full), to count into
    /// with [`Recorder::add_at`]. Found for frames that exist: a cell found and never
    /// counted into shows in reports with no samples.
    pub fn slot(&mut self, key: Key, component: Component, bytes: u64) -> Slot {
        let at = self.cell_at(Cell { key, component, size_class: size_class(bytes) });
        let folded = self.cells.get(at).is_some_and(|(cell, _)| cell.key != key);
        Slot { at: at as u32, generation: self.generation, folded }
    }

    /// Counts `count` samples of `latency_ns` in `slot`'s cell, as
    /// [`Recorder::record_n`] would for its key, component and size. False, counting
    /// nothing, when the recorder was cleared since the slot was found (find it
    /// again), or when another recorder found it.
    #[inline]
    pub fn add_at(&mut self, slot: Slot, latency_ns: u64, count: u64) -> bool {
        if slot.generation != self.generation {
            return false;
        }
        let Some((_, l)) = self.cells.get_mut(slot.at as usize) else { return false };
        // Summed as the histogram holds it, so that no mean exceeds the largest bucket
        // and a merge can refuse sums no recording makes.
        let latency_ns = latency_ns.clamp(1, HIGHEST_NS);
        l.add(latency_ns, count, latency_ns.saturating_mul(count));
        if slot.folded {
            self.folded += count;
        }
        true
    }

    /// Records one sample: a frame of `bytes` bytes spent `latency_ns` in `component`.
    pub fn record(&mut self, key: Key, component: Component, bytes: u64, latency_ns: u64) {
        self.record_n(key, component, bytes, latency_ns, 1);
    }

    /// Records `count` equal samples at once (frames of one batch, which share
    /// their latency); a count of 0 records nothing.
    pub fn record_n(&mut self, key: Key, component: Component, bytes: u64, latency_ns: u64, count: u64) {
        if count == 0 {
            return;
        }
        let slot = self.slot(key, component, bytes);
        self.add_at(slot, latency_ns, count);
    }

    /// The cell that samples of `cell` go to: itself when it is kept already (or
    /// among `made`, cells about to be made) or while there is room, otherwise its
    /// [`Key::OTHER`] cell. The one rule for [`Recorder::cell_at`] and a merge's check.
    fn place(&self, mut cell: Cell, made: &FxHashSet<Cell>) -> Cell {
        let kept = self.index.contains_key(&cell) || made.contains(&cell);
        if !kept && self.cells.len() + made.len() >= self.max_cells {
            cell.key = Key::OTHER;
        }
        cell
    }

    /// The cells that [`Recorder::cell_at`] would count `cells` in, one after
    /// another, without making any.
    fn placements(&self, cells: &[Cell]) -> Vec<Cell> {
        let mut made = FxHashSet::default();
        cells
            .iter()
            .map(|&cell| {
                let target = self.place(cell, &made);
                if !self.index.contains_key(&target) {
                    made.insert(target);
                }
                target
            })
            .collect()
    }

    /// Where the cell is in `cells`, made if new: under [`Key::OTHER`] once the
    /// recorder is full.
    fn cell_at(&mut self, cell: Cell) -> usize {
        if let Some(&at) = self.index.get(&cell) {
            return at;
        }
        let cell = self.place(cell, &FxHashSet::default());
        if let Some(&at) = self.index.get(&cell) {
            return at;
        }
        self.cells.push((cell, Latencies::new()));
        self.index.insert(cell, self.cells.len() - 1);
        self.cells.len() - 1
    }

    /// Adds a report's samples (a child's, on its way up the tree).
    ///
    /// # Errors
    /// A cell of the report names a size class that does not exist, or a latency
    /// over [`HIGHEST_NS`]: the report did not come from a recorder.
    pub fn merge(&mut self, report: &Report) -> Result<(), MonitorError> {
        // Checked whole first: a damaged report adds nothing and makes no cell.
        let mut totals = Vec::with_capacity(report.cells.len());
        for c in &report.cells {
            if c.size_class >= SIZE_CLASSES {
                return Err(MonitorError::SizeClass(c.size_class));
            }
            if let Some(&[value, _]) = c.buckets.iter().find(|[value, _]| *value == 0 || *value > HIGHEST_NS)
            {
                return Err(MonitorError::Latency(value));
            }
            // Counts are added without checks when quantiles are read: refuse totals
            // no real recording reaches.
            let total = c.buckets.iter().try_fold(0u64, |n, [_, count]| n.checked_add(*count));
            match total {
                Some(n) if n <= MAX_CELL_SAMPLES => totals.push(n),
                _ => return Err(too_many()),
            }
            // Each sample is at most its bucket's latency: a larger sum is no recording's
            // (2^64 - 1 read as a mean of 18 million seconds).
            let max_ns: u128 =
                c.buckets.iter().map(|[value, count]| u128::from(*value) * u128::from(*count)).sum();
            if u128::from(c.sum_ns) > max_ns {
                return Err(MonitorError::Sum {
                    sum_ns: c.sum_ns,
                    count: totals.last().copied().unwrap_or(0),
                    max_ns,
                });
            }
        }
        // Cells of one key repeated in the report, or merged again and again, add
        // up: a report that would take a cell past the bound is refused whole.
        let cells: Vec<Cell> = report
            .cells
            .iter()
            .map(|c| Cell { key: c.key(), component: c.component, size_class: c.size_class })
            .collect();
        let mut after: FxHashMap<Cell, u64> = FxHashMap::default();
        for (target, total) in self.placements(&cells).into_iter().zip(&totals) {
            let sum = after.entry(target).or_insert_with(|| match self.index.get(&target) {
                Some(&at) => self.cells[at].1.total(),
                None => 0,
            });
            *sum = sum.saturating_add(*total);
            if *sum > MAX_CELL_SAMPLES {
                return Err(too_many());
            }
        }
        for ((c, cell), total) in report.cells.iter().zip(cells).zip(totals) {
            let at = self.cell_at(cell);
            let (kept, l) = &mut self.cells[at];
            if kept.key != cell.key {
                self.folded += total;
            }
            for &[value, count] in &c.buckets {
                l.add(value, count, 0);
            }
            l.sum_ns = l.sum_ns.saturating_add(c.sum_ns);
        }
        self.folded = self.folded.saturating_add(report.folded);
        Ok(())
    }

    /// Everything recorded so far, cells in key order.
    pub fn report(&self) -> Report {
        let mut cells: Vec<&(Cell, Latencies)> = self.cells.iter().collect();
        cells.sort_by_key(|(c, _)| *c);
        Report {
            // Only a bad bound fails, and the bounds are constants checked by a test.
            cells: cells
                .into_iter()
                .filter_map(|(c, l)| Some(CellReport::of(c, &l.histogram().ok()?, l.sum_ns)))
                .collect(),
            folded: self.folded,
            routes: Vec::new(),
        }
    }

    /// Forgets every sample (recording starts anew).
    pub fn clear(&mut self) {
        self.cells.clear();
        self.index.clear();
        self.folded = 0;
        let clears = (self.generation as u32).wrapping_add(1);
        self.generation = (self.generation & !u64::from(u32::MAX)) | u64::from(clears);
    }

    /// Cells in use.
    pub fn len(&self) -> usize {
        self.cells.len()
    }

    /// True when nothing was recorded.
    pub fn is_empty(&self) -> bool {
        self.cells.is_empty()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const KEY: Key = Key { link: 3, up: true, tag: 7, program: 1 };

    /// One sample into one histogram per cell, as the recorder's documentation says.
    fn naive_record(
        naive: &mut Vec<(Cell, Histogram<u64>, u64)>,
        folded: &mut u64,
        max_cells: usize,
        mut cell: Cell,
        ns: u64,
    ) {
        if !naive.iter().any(|(c, _, _)| *c == cell) && naive.len() >= max_cells {
            *folded += 1;
            cell.key = Key::OTHER;
        }
        let at = match naive.iter().position(|(c, _, _)| *c == cell) {
            Some(at) => at,
            None => {
                naive.push((cell, Histogram::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS).unwrap(), 0));
                naive.len() - 1
            }
        };
        naive[at].1.saturating_record(ns);
        naive[at].2 += ns;
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

        /// Counting samples in batches changes nothing: the report is what one
        /// histogram per cell, fed each sample, gives (folding included).
        #[test]
        fn a_report_equals_recording_every_sample_on_its_own(
            samples in proptest::collection::vec((0u32..3, 0usize..4, 0u64..3, 0u64..5, 0u64..4), 0..400),
            max_cells in 1usize..8,
        ) {
            let mut r = Recorder::new(max_cells);
            let mut naive: Vec<(Cell, Histogram<u64>, u64)> = Vec::new();
            let mut folded = 0;
            for (link, component, size, step, times) in samples {
                let (key, component) = (Key { link, ..KEY }, Component::ALL[component]);
                let (bytes, ns) = (size * 1000, 1_000 + step * 7);
                // Frames of a batch come as one call with their count (0: none), others one by one.
                if times == 1 {
                    r.record(key, component, bytes, ns);
                } else {
                    r.record_n(key, component, bytes, ns, times);
                }
                for _ in 0..times {
                    naive_record(&mut naive, &mut folded, max_cells, Cell { key, component, size_class: size_class(bytes) }, ns);
                }
            }
            naive.sort_by_key(|(c, _, _)| *c);
            let cells = naive.iter().map(|(c, h, sum)| CellReport::of(c, h, *sum)).collect();
            let expected = Report { cells, folded, routes: Vec::new() };
            proptest::prop_assert_eq!(r.report(), expected);
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

        /// Counting through slots found once is counting sample by sample: the same
        /// report, folding included, whatever the latency (0 and past the highest too).
        #[test]
        fn counting_into_slots_equals_recording(
            samples in proptest::collection::vec((0u32..4, 0usize..4, 0u64..3, proptest::prelude::any::<u64>(), 1u64..4), 0..200),
            max_cells in 1usize..6,
        ) {
            let (mut direct, mut slotted) = (Recorder::new(max_cells), Recorder::new(max_cells));
            let mut slots: Vec<((Key, Component, u64), Slot)> = Vec::new();
            for (link, component, size, ns, times) in samples {
                let (key, component, bytes) = (Key { link, ..KEY }, Component::ALL[component], size * 1000);
                direct.record_n(key, component, bytes, ns, times);
                let slot = match slots.iter().find(|(k, _)| *k == (key, component, bytes)) {
                    Some((_, slot)) => *slot,
                    None => {
                        let slot = slotted.slot(key, component, bytes);
                        slots.push(((key, component, bytes), slot));
                        slot
                    }
                };
                proptest::prop_assert!(slotted.add_at(slot, ns, times));
            }
            proptest::prop_assert_eq!(slotted.report(), direct.report());
        }
    }

    #[test]
    fn a_slot_found_before_a_clear_counts_nothing_after_it() {
        let mut r = Recorder::default();
        let slot = r.slot(KEY, Component::Net, 64);
        assert!(r.add_at(slot, 1_000, 2));
        r.clear();
        assert!(!r.add_at(slot, 1_000, 1), "the cell it named is gone");
        assert_eq!(r.report().count(), 0);
        let again = r.slot(KEY, Component::Net, 64);
        assert!(r.add_at(again, 1_000, 1));
        assert_eq!(r.report().count(), 1);
        let mut other = Recorder::default();
        let its_own = other.slot(KEY, Component::Net, 64);
        assert!(!other.add_at(again, 1_000, 1), "a slot belongs to the recorder that found it");
        assert!(other.add_at(its_own, 1_000, 1));
        assert_eq!(other.report().count(), 1);
    }

    #[test]
    fn runs_that_alternate_go_to_their_histograms_and_none_is_lost() {
        let mut r = Recorder::default();
        let runs = 3_000u64 + 5;
        // Every sample differs from the last: each ends a run.
        for i in 0..runs {
            r.record(KEY, Component::Send, 64, 1_000 + (i % 2) * 1_000);
        }
        let report = r.report();
        assert_eq!(report.count(), runs);
        assert_eq!(report.cells[0].sum_ns, (runs / 2) * 2_000 + (runs - runs / 2) * 1_000);
    }

    #[test]
    fn the_stated_memory_of_a_cell_is_what_the_histogram_holds() {
        let l = Latencies::new();
        assert_eq!(l.histogram().unwrap().distinct_values() * std::mem::size_of::<u64>(), CELL_BYTES);
        assert_eq!(l.counts.len() * std::mem::size_of::<u64>(), CELL_BYTES);
    }

    #[test]
    fn samples_are_kept_within_one_percent_and_one_microsecond_below_100_us() {
        let mut r = Recorder::default();
        for ns in [1_000u64, 1_500, 12_345, 99_999] {
            r.record(KEY, Component::Net, 64, ns);
        }
        let report = r.report();
        let cell = &report.cells[0];
        assert_eq!((cell.count, cell.sum_ns, cell.size_class), (4, 114_844, 7));
        for &[value, _] in &cell.buckets {
            let nearest =
                [1_000u64, 1_500, 12_345, 99_999].into_iter().min_by_key(|v| v.abs_diff(value)).unwrap();
            assert!(value.abs_diff(nearest) <= 1_000 && value.abs_diff(nearest) * 100 <= nearest, "{value}");
        }
    }

    #[test]
    fn a_full_recorder_folds_new_cells_into_other_and_counts_them() {
        let mut r = Recorder::new(2);
        r.record(KEY, Component::Queue, 10, 100);
        r.record(KEY, Component::Send, 10, 100);
        // Full: a new link and a new size go to OTHER, an existing cell still counts.
        r.record(Key { link: 9, ..KEY }, Component::Queue, 10, 100);
        r.record(KEY, Component::Queue, 5000, 100);
        r.record(KEY, Component::Queue, 10, 100);
        let report = r.report();
        assert_eq!(report.folded, 2);
        assert_eq!(r.len(), 4);
        let other: u64 = report.cells.iter().filter(|c| c.key() == Key::OTHER).map(|c| c.count).sum();
        assert_eq!(other, 2);
        assert_eq!(report.count(), 5, "nothing is dropped");
    }

    #[test]
    fn samples_of_an_hour_or_more_merge_again_and_huge_counts_are_refused() {
        let mut r = Recorder::default();
        r.record(KEY, Component::Send, 10, HIGHEST_NS);
        r.record(KEY, Component::Send, 10, u64::MAX);
        let report = r.report();
        let mut again = Recorder::default();
        again.merge(&report).unwrap();
        assert_eq!(again.report().count(), 2);
        let mut bad = report.clone();
        bad.cells[0].buckets = vec![[1_000, u64::MAX], [2_000, 1]];
        assert!(Recorder::default().merge(&bad).unwrap_err().to_string().contains("damaged"));
    }

    #[test]
    fn a_sum_larger_than_the_buckets_allow_is_refused() {
        // Regression: `sum_ns` = 2^64 - 1 on one sample read as a mean of 18 million seconds.
        let mut r = Recorder::default();
        r.record(KEY, Component::Send, 10, 1_000);
        let mut bad = r.report();
        bad.cells[0].sum_ns = u64::MAX;
        let e = Recorder::default().merge(&bad).unwrap_err();
        assert!(matches!(e, MonitorError::Sum { sum_ns: u64::MAX, count: 1, .. }), "{e}");
        Recorder::default().merge(&r.report()).unwrap();
    }

    #[test]
    fn a_report_that_did_not_come_from_a_recorder_is_refused() {
        let mut r = Recorder::default();
        r.record(KEY, Component::Queue, 10, 100);
        let mut bad = r.report();
        bad.cells[0].size_class = SIZE_CLASSES;
        assert_eq!(Recorder::default().merge(&bad), Err(MonitorError::SizeClass(SIZE_CLASSES)));
        let mut bad = r.report();
        bad.cells[0].buckets = vec![[HIGHEST_NS + 1, 1]];
        assert!(Recorder::default().merge(&bad).unwrap_err().to_string().contains("latency"));
    }

    #[test]
    fn a_damaged_report_adds_nothing_and_cells_of_one_key_repeated_are_bounded() {
        let mut r = Recorder::default();
        r.record(KEY, Component::Queue, 10, 100);
        let good = r.report();
        let mut bad = good.clone();
        bad.cells.push(CellReport { buckets: vec![[0, 1]], ..good.cells[0].clone() });
        let mut target = Recorder::default();
        assert!(target.merge(&bad).is_err());
        assert!(target.is_empty(), "no cell made by a report refused");
        // One key repeated, each within the bound, together past it.
        let mut repeated = good.clone();
        let half = MAX_CELL_SAMPLES / 2 + 1;
        repeated.cells = vec![CellReport { buckets: vec![[100, half]], ..good.cells[0].clone() }; 2];
        assert!(target.merge(&repeated).unwrap_err().to_string().contains("damaged"));
        assert!(target.is_empty(), "refused whole: not its first cell either");
        // One key merged again and again: the merge that would pass the bound adds nothing.
        repeated.cells.truncate(1);
        target.merge(&repeated).unwrap();
        assert!(target.merge(&repeated).is_err());
        assert_eq!(target.report().count(), half);
        // Two new keys that a full recorder folds into one cell add up there too.
        let mut full = Recorder::new(1);
        full.record(KEY, Component::Queue, 10, 100);
        let mut two = good.clone();
        two.cells = [8, 9]
            .map(|link| CellReport { link, buckets: vec![[100, half]], ..good.cells[0].clone() })
            .to_vec();
        assert!(full.merge(&two).is_err());
        assert_eq!((full.len(), full.report().count()), (1, 1), "nothing added, no cell made");
    }

    #[test]
    fn folded_counts_samples_when_merging_as_when_recording() {
        let mut full = Recorder::new(1);
        full.record(KEY, Component::Queue, 10, 100);
        let mut other = Recorder::default();
        for _ in 0..3 {
            other.record(Key { link: 9, ..KEY }, Component::Send, 10, 200);
        }
        full.merge(&other.report()).unwrap();
        assert_eq!(full.report().folded, 3);
    }

    #[test]
    fn every_bucket_ends_where_the_next_begins() {
        for index in 0..CELL_BYTES / 8 - 1 {
            let next = lowest_of(index + 1);
            if next > HIGHEST_NS {
                break;
            }
            assert_eq!(index_of(next - 1), index, "the last value of bucket {index}");
        }
    }

    #[test]
    fn every_bucket_index_is_the_librarys() {
        let h = Histogram::<u64>::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS).unwrap();
        for index in 0..CELL_BYTES / 8 {
            let lowest = lowest_of(index);
            if lowest > HIGHEST_NS {
                break;
            }
            assert_eq!(index_of(lowest), index);
            assert_eq!(h.lowest_equivalent(lowest), lowest, "index {index}");
        }
        assert!(index_of(HIGHEST_NS) < CELL_BYTES / 8);
    }

    proptest::proptest! {
        /// A sample lands in the bucket the library would put it in.
        #[test]
        fn a_sample_lands_in_the_librarys_bucket(value in 1u64..=HIGHEST_NS) {
            let h = Histogram::<u64>::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS).unwrap();
            proptest::prop_assert_eq!(lowest_of(index_of(value)), h.lowest_equivalent(value));
        }
    }
}
