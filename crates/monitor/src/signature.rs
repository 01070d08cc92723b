//! Performance signatures: a run's mean latency per component against frame size,
//! and where a run differs from a baseline.
//!
//! A signature sums every cell of a report over links, directions and tags (one
//! program's, when asked), so two runs of one workload on one tree compare point by
//! point however their frames spread over links.

use serde::{Deserialize, Serialize};

use crate::{size_class_bounds, Component, Report};

/// Mean latency of one component over the frames of one size class.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Point {
    /// The frames' size class ([`crate::size_class`]).
    pub size_class: u8,
    /// Samples of the component in that class: frames that took this part of a hop.
    pub frames: u64,
    /// Their mean latency, nanoseconds.
    pub mean_ns: f64,
}

/// One component's points, in size order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Series {
    /// The part of the path.
    pub component: Component,
    /// One point per size class that has samples, smallest first.
    pub points: Vec<Point>,
}

/// A run's signature: one series per component, in path order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Signature {
    /// The series of [`Component::ALL`], each possibly empty.
    pub series: Vec<Series>,
}

impl Signature {
    /// The signature of `report`, of the cells recorded under `program` only when given.
    pub fn of(report: &Report, program: Option<u32>) -> Signature {
        let series = Component::ALL
            .iter()
            .map(|&component| {
                // Per size class: samples and their summed latency.
                let mut sums = [(0u64, 0f64); crate::SIZE_CLASSES as usize];
                let cells = report
                    .cells
                    .iter()
                    .filter(|c| c.component == component && program.map_or(true, |p| c.program == p));
                for cell in cells {
                    let slot = &mut sums[usize::from(cell.size_class.min(crate::SIZE_CLASSES - 1))];
                    slot.0 = slot.0.saturating_add(cell.count);
                    slot.1 += cell.sum_ns as f64;
                }
                let points = (0u8..)
                    .zip(sums)
                    .filter(|(_, (n, _))| *n > 0)
                    .map(|(size_class, (frames, sum))| Point {
                        size_class,
                        frames,
                        mean_ns: sum / frames as f64,
                    })
                    .collect();
                Series { component, points }
            })
            .collect();
        Signature { series }
    }

    /// The points of `component` (empty when it has none).
    pub fn points(&self, component: Component) -> &[Point] {
        self.series.iter().find(|s| s.component == component).map_or(&[], |s| &s.points)
    }

    /// No component has a sample.
    pub fn is_empty(&self) -> bool {
        self.series.iter().all(|s| s.points.is_empty())
    }
}

/// How one component at one size class compares with the baseline.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Deviation {
    /// The part of the path.
    pub component: Component,
    /// The frames' size class.
    pub size_class: u8,
    /// The run's point, if it has one.
    pub run: Option<Point>,
    /// The baseline's point, if it has one.
    pub baseline: Option<Point>,
}

impl Deviation {
    /// Change of the mean latency from the baseline to the run, percent; `None`
    /// unless both have the point.
    pub fn change_pct(&self) -> Option<f64> {
        match (self.run, self.baseline) {
            (Some(r), Some(b)) if b.mean_ns > 0.0 => Some((r.mean_ns - b.mean_ns) / b.mean_ns * 100.0),
            _ => None,
        }
    }
}

/// Every point of either signature, those whose mean moved most first; points found
/// in one signature only come last, in path and size order.
pub fn compare(run: &Signature, baseline: &Signature) -> Vec<Deviation> {
    let mut all = Vec::new();
    for component in Component::ALL {
        let (r, b) = (run.points(component), baseline.points(component));
        let classes: std::collections::BTreeSet<u8> = r.iter().chain(b).map(|p| p.size_class).collect();
        let find = |points: &[Point], class| points.iter().find(|p| p.size_class == class).copied();
        all.extend(classes.into_iter().map(|size_class| Deviation {
            component,
            size_class,
            run: find(r, size_class),
            baseline: find(b, size_class),
        }));
    }
    // Stable: equal moves and one-sided points keep path and size order.
    all.sort_by(|a, b| {
        let moved = |d: &Deviation| d.change_pct().map(f64::abs);
        match (moved(a), moved(b)) {
            (Some(x), Some(y)) => y.total_cmp(&x),
            (Some(_), None) => std::cmp::Ordering::Less,
            (None, Some(_)) => std::cmp::Ordering::Greater,
            (None, None) => std::cmp::Ordering::Equal,
        }
    });
    all
}

/// A size class as people read it: `0 B`, `64-127 B`, `1-2 KiB`, `>= 4 GiB`.
pub fn size_class_label(class: u8) -> String {
    let (lo, hi) = size_class_bounds(class);
    match class {
        0 => "0 B".into(),
        1 => "1 B".into(),
        c if c >= crate::SIZE_CLASSES - 1 => format!(">= {}", bytes_short(lo)),
        _ => format!("[{}, {})", bytes_short(lo), bytes_short(hi + 1)),
    }
}

/// `lo` as a short power-of-two figure: `512 B`, `4 KiB`, `16 MiB`.
fn bytes_short(n: u64) -> String {
    const UNITS: [&str; 4] = ["B", "KiB", "MiB", "GiB"];
    let mut unit = 0;
    let mut v = n;
    while v >= 1024 && v % 1024 == 0 && unit + 1 < UNITS.len() {
        v /= 1024;
        unit += 1;
    }
    format!("{v} {}", UNITS[unit])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{Key, Recorder};

    fn report(samples: &[(u32, Component, u64, u64)]) -> Report {
        let mut r = Recorder::default();
        for &(program, c, bytes, ns) in samples {
            r.record(Key { link: 1, up: true, tag: 5, program }, c, bytes, ns);
        }
        r.report()
    }

    #[test]
    fn a_signature_averages_each_component_per_size_class_over_every_key() {
        let mut r = Recorder::default();
        // Two links and two tags: a signature does not tell them apart.
        r.record(Key { link: 1, up: true, tag: 5, program: 0 }, Component::Net, 100, 1_000);
        r.record(Key { link: 2, up: false, tag: 6, program: 0 }, Component::Net, 120, 3_000);
        r.record(Key { link: 2, up: false, tag: 6, program: 0 }, Component::Net, 5000, 9_000);
        r.record(Key { link: 2, up: false, tag: 6, program: 0 }, Component::Queue, 0, 50);
        let s = Signature::of(&r.report(), None);
        let net = s.points(Component::Net);
        assert_eq!(net.len(), 2);
        assert_eq!((net[0].size_class, net[0].frames, net[0].mean_ns), (7, 2, 2_000.0));
        assert_eq!((net[1].size_class, net[1].frames, net[1].mean_ns), (13, 1, 9_000.0));
        assert_eq!(s.points(Component::Queue), &[Point { size_class: 0, frames: 1, mean_ns: 50.0 }]);
        assert!(s.points(Component::Send).is_empty());
        assert!(!s.is_empty());
        assert!(Signature::of(&Report::default(), None).is_empty());
    }

    #[test]
    fn a_program_filter_keeps_only_that_programs_samples() {
        let r = report(&[(1, Component::Net, 8, 1_000), (2, Component::Net, 8, 5_000)]);
        assert_eq!(Signature::of(&r, Some(2)).points(Component::Net)[0].mean_ns, 5_000.0);
        assert_eq!(Signature::of(&r, None).points(Component::Net)[0].mean_ns, 3_000.0);
        assert!(Signature::of(&r, Some(3)).is_empty());
    }

    #[test]
    fn a_comparison_puts_the_largest_move_first_and_one_sided_points_last() {
        let base = Signature::of(
            &report(&[
                (0, Component::Net, 8, 1_000),
                (0, Component::Send, 8, 1_000),
                (0, Component::Send, 300, 10),
            ]),
            None,
        );
        let run = Signature::of(
            &report(&[
                (0, Component::Net, 8, 1_100),
                (0, Component::Send, 8, 3_000),
                (0, Component::Deliver, 8, 7),
            ]),
            None,
        );
        let d = compare(&run, &base);
        let shown: Vec<_> =
            d.iter().map(|d| (d.component, d.size_class, d.change_pct().map(f64::round))).collect();
        assert_eq!(
            shown,
            vec![
                (Component::Send, 4, Some(200.0)),
                (Component::Net, 4, Some(10.0)),
                (Component::Send, 9, None),
                (Component::Deliver, 4, None),
            ]
        );
        assert!(d[2].run.is_none() && d[2].baseline.is_some());
        assert!(d[3].run.is_some() && d[3].baseline.is_none());
    }

    #[test]
    fn size_classes_read_as_byte_ranges() {
        assert_eq!(size_class_label(0), "0 B");
        assert_eq!(size_class_label(1), "1 B");
        assert_eq!(size_class_label(2), "[2 B, 4 B)");
        assert_eq!(size_class_label(11), "[1 KiB, 2 KiB)");
        assert_eq!(size_class_label(8), "[128 B, 256 B)");
        assert_eq!(size_class_label(crate::SIZE_CLASSES - 1), ">= 4 GiB");
    }
}
