//! What a recorder holds, in a form that travels (JSON) and merges.

use serde::{Deserialize, Serialize};

use crate::recorder::Cell;
use crate::recorder::HIGHEST_NS;
use crate::{Component, Key, Recorder};
use hdrhistogram::Histogram;

/// Cells a merge keeps apart (a comm node merging its sub-tree's reports); the rest
/// fold into [`Key::OTHER`]. About 78 MiB at most while a merge runs.
pub const MERGE_MAX_CELLS: usize = 2048;

/// Why a report cannot be read or merged.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MonitorError {
    /// The text is not a report.
    #[error("not a monitor report: {0}")]
    Json(String),
    /// A cell names a size class past the last.
    #[error("a monitor report names size class {0}, past the last (33): the report is damaged")]
    SizeClass(u8),
    /// A bucket holds a latency the histograms cannot hold.
    #[error("a monitor report holds a latency of {0} ns, outside 1 ns to one hour: the report is damaged")]
    Latency(u64),
    /// A cell's latencies add up to more than its samples can (each at most its
    /// bucket's latency).
    #[error("a monitor report's cell adds its {count} samples up to {sum_ns} ns, more than the {max_ns} ns its buckets allow: the report is damaged")]
    Sum {
        /// The cell's `sum_ns`.
        sum_ns: u64,
        /// Samples in the cell's buckets.
        count: u64,
        /// The largest sum those buckets allow.
        max_ns: u128,
    },
    /// The histogram library refused a value or a bound.
    #[error("histogram: {0}")]
    Histogram(String),
    /// The plotting library failed to draw a signature.
    #[error("drawing the signature failed: {0}")]
    Plot(String),
}

/// The histograms of one node, or of a sub-tree merged, as they travel.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Report {
    /// One entry per (key, component, size class), in that order.
    pub cells: Vec<CellReport>,
    /// Samples that went to [`Key::OTHER`] because a recorder was full.
    pub folded: u64,
    /// What each node's multicast route did (nodes that multicast to children only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub routes: Vec<RouteReport>,
}

/// What one node's multicast route over UDP did: which children it reached by
/// multicast and which over their own links, and the protocol's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RouteReport {
    /// The node that multicasts.
    pub node: u32,
    /// Where its datagrams went (group or broadcast address, and port).
    pub group: String,
    /// Children in its group (node ids).
    pub udp_children: Vec<u32>,
    /// Children its frames reach over their own links only (node ids).
    pub tcp_children: Vec<u32>,
    /// Frames multicast.
    pub frames: u64,
    /// Their payload bytes.
    pub bytes: u64,
    /// Messages every member acknowledged.
    pub messages: u64,
    /// Fragments multicast, first sendings and retransmissions.
    pub fragments: u64,
    /// Of those, retransmissions.
    pub retransmitted: u64,
    /// NACKs received.
    pub nacks: u64,
    /// Times the sender heard nothing and asked again.
    pub timeouts: u64,
    /// Times the acker (the member that sets the pace) changed.
    #[serde(default)]
    pub acker_changes: u64,
    /// Datagrams not sent: the kernel's buffer was full, or the drop knob threw them away.
    pub not_sent: u64,
    /// Datagrams dropped on arrival: not of the session, or an answer from an
    /// address that is not the member's.
    pub rejected: u64,
}

/// One histogram: the latencies of one component for one key and size class.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CellReport {
    /// The link ([`Key::link`]).
    pub link: u32,
    /// Going up ([`Key::up`]).
    pub up: bool,
    /// Stream tag ([`Key::tag`]).
    pub tag: i32,
    /// Program tag ([`Key::program`]).
    pub program: u32,
    /// The part of the path.
    pub component: Component,
    /// The frames' size class ([`crate::size_class`]).
    pub size_class: u8,
    /// Samples.
    pub count: u64,
    /// Their exact sum, nanoseconds (each sample at most [`HIGHEST_NS`], as the histogram
    /// holds it; saturating), so means merge exactly.
    pub sum_ns: u64,
    /// Median, nanoseconds (within the histogram's precision).
    pub p50_ns: u64,
    /// 99th percentile, nanoseconds.
    pub p99_ns: u64,
    /// Largest, nanoseconds.
    pub max_ns: u64,
    /// The histogram: `[latency_ns, count]` for each non-empty bucket, the latency
    /// being the bucket's highest; recording these again rebuilds the same histogram.
    pub buckets: Vec<[u64; 2]>,
}

impl CellReport {
    pub(crate) fn of(cell: &Cell, h: &Histogram<u64>, sum_ns: u64) -> CellReport {
        // The last bucket reaches past HIGHEST_NS; any value in it records into it again.
        let buckets = h
            .iter_recorded()
            .map(|v| [h.highest_equivalent(v.value_iterated_to()).min(HIGHEST_NS), v.count_at_value()])
            .collect();
        CellReport {
            link: cell.key.link,
            up: cell.key.up,
            tag: cell.key.tag,
            program: cell.key.program,
            component: cell.component,
            size_class: cell.size_class,
            count: h.len(),
            sum_ns,
            p50_ns: h.value_at_quantile(0.5),
            p99_ns: h.value_at_quantile(0.99),
            max_ns: h.max(),
            buckets,
        }
    }

    /// The key the cell is kept under.
    pub fn key(&self) -> Key {
        Key { link: self.link, up: self.up, tag: self.tag, program: self.program }
    }

    /// Smallest latency, nanoseconds, within the histogram's precision (the top of the
    /// lowest non-empty bucket; 0 for an empty cell). Samples below 1 ns read as 1.
    pub fn min_ns(&self) -> u64 {
        self.buckets.first().map_or(0, |b| b[0])
    }

    /// Mean latency, nanoseconds (0 for an empty cell).
    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_ns as f64 / self.count as f64
        }
    }
}

impl Report {
    /// Samples in every cell.
    pub fn count(&self) -> u64 {
        self.cells.iter().fold(0u64, |n, c| n.saturating_add(c.count))
    }

    /// The reports merged into one, as a comm node merges its children's with its own.
    ///
    /// # Errors
    /// As [`Recorder::merge`].
    pub fn merged<'a>(reports: impl IntoIterator<Item = &'a Report>) -> Result<Report, MonitorError> {
        let mut all = Recorder::new(MERGE_MAX_CELLS);
        let mut routes = Vec::new();
        for r in reports {
            all.merge(r)?;
            routes.extend(r.routes.iter().cloned());
        }
        routes.sort_by_key(|r| r.node);
        Ok(Report { routes, ..all.report() })
    }

    /// The report as JSON text.
    pub fn to_json(&self) -> String {
        // A report holds only numbers, strings and arrays: it always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a report from JSON text.
    ///
    /// # Errors
    /// [`MonitorError::Json`] naming what did not parse.
    pub fn from_json(text: &str) -> Result<Report, MonitorError> {
        serde_json::from_str(text).map_err(|e| MonitorError::Json(e.to_string()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// (link, tag, component, size, latency) samples of one node.
    fn samples() -> impl Strategy<Value = Vec<(u32, i32, usize, u64, u64)>> {
        prop::collection::vec((0u32..4, 0i32..3, 0usize..4, 0u64..100_000, 1u64..10_000_000_000), 0..40)
    }

    fn recorded(s: &[(u32, i32, usize, u64, u64)]) -> Recorder {
        let mut r = Recorder::default();
        for &(link, tag, c, bytes, ns) in s {
            r.record(Key { link, up: link % 2 == 0, tag, program: 0 }, Component::ALL[c], bytes, ns);
        }
        r
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// A comm node merges its children's reports with its own, level by level; the
        /// front-end must get what merging every node's report at once gives.
        #[test]
        fn merging_in_a_tree_equals_merging_flat(nodes in prop::collection::vec(samples(), 1..12), fanout in 1usize..5) {
            let reports: Vec<Report> = nodes.iter().map(|s| recorded(s).report()).collect();
            let flat = Report::merged(&reports).unwrap();
            // Node i's parent is (i - 1) / fanout: merge from the leaves up.
            let mut up: Vec<Report> = reports.clone();
            for i in (1..up.len()).rev() {
                let parent = (i - 1) / fanout;
                up[parent] = Report::merged([&up[parent], &up[i]]).unwrap();
            }
            prop_assert_eq!(&up[0], &flat);
            prop_assert_eq!(flat.count(), nodes.iter().map(Vec::len).sum::<usize>() as u64);
        }

        #[test]
        fn a_report_survives_json(s in samples()) {
            let report = recorded(&s).report();
            prop_assert_eq!(Report::from_json(&report.to_json()).unwrap(), report);
        }
    }

    #[test]
    fn a_bad_report_names_what_did_not_parse() {
        let err = Report::from_json("{\"cells\": 3}").unwrap_err().to_string();
        assert!(err.starts_with("not a monitor report: invalid type"), "{err}");
    }
}
