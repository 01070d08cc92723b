//! Reports gathered through the tree for one collection request.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::{MonitorError, Report};

/// What one collection brought back: reports by node id, and the nodes that did not
/// answer. Each comm node adds its children's collections to its own, keeping the
/// reports apart (one per node) or merging them into its own (one per sub-tree).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Collection {
    /// Reports by node id: every node's own, or one per sub-tree under its root's id.
    pub reports: BTreeMap<u32, Report>,
    /// Nodes whose report did not come, each with why.
    pub missing: Vec<String>,
}

impl Collection {
    /// A collection holding one node's own report.
    pub fn of(node: u32, report: Report) -> Collection {
        Collection { reports: BTreeMap::from([(node, report)]), missing: Vec::new() }
    }

    /// Adds a child's collection: its reports merged into `merge_into`'s, or kept
    /// apart when `merge_into` is `None`.
    ///
    /// # Errors
    /// A report of the child does not merge (see [`crate::Recorder::merge`]).
    pub fn absorb(&mut self, child: Collection, merge_into: Option<u32>) -> Result<(), MonitorError> {
        self.missing.extend(child.missing);
        match merge_into {
            None => self.reports.extend(child.reports),
            Some(node) => {
                // Merged before anything is replaced: a child's bad report leaves the
                // reports gathered so far as they were.
                let merged =
                    Report::merged(self.reports.get(&node).into_iter().chain(child.reports.values()))?;
                self.reports.insert(node, merged);
            }
        }
        Ok(())
    }

    /// Every report merged into one.
    ///
    /// # Errors
    /// As [`Collection::absorb`].
    pub fn merged(&self) -> Result<Report, MonitorError> {
        Report::merged(self.reports.values())
    }

    /// The collection as JSON text.
    pub fn to_json(&self) -> String {
        // Numbers, strings, arrays and maps with integer keys: it always serializes.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Reads a collection from JSON text.
    ///
    /// # Errors
    /// [`MonitorError::Json`] naming what did not parse.
    pub fn from_json(text: &str) -> Result<Collection, MonitorError> {
        serde_json::from_str(text).map_err(|e| MonitorError::Json(e.to_string()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{Component, Key, Recorder};

    fn report(link: u32, samples: u64) -> Report {
        let mut r = Recorder::default();
        for i in 0..samples {
            r.record(Key { link, up: true, tag: 1, program: 0 }, Component::Net, 10, 1_000 + i);
        }
        r.report()
    }

    #[test]
    fn a_sub_tree_merges_into_its_root_or_stays_per_node_and_survives_json() {
        let mut leaf = Collection::of(2, report(2, 3));
        leaf.missing.push("back-end rank 5: no report".into());
        let mut per_node = Collection::of(1, report(1, 2));
        per_node.absorb(leaf.clone(), None).unwrap();
        assert_eq!(per_node.reports.keys().copied().collect::<Vec<_>>(), [1, 2]);
        assert_eq!(per_node.missing.len(), 1);
        let mut merged = Collection::of(1, report(1, 2));
        merged.absorb(leaf, Some(1)).unwrap();
        assert_eq!(merged.reports.len(), 1);
        assert_eq!(merged.reports[&1].count(), 5);
        assert_eq!(merged.merged().unwrap(), per_node.merged().unwrap());
        assert_eq!(Collection::from_json(&per_node.to_json()).unwrap(), per_node);
    }

    #[test]
    fn a_child_report_that_does_not_merge_leaves_what_was_gathered() {
        let mut own = Collection::of(1, report(1, 2));
        let mut bad = Collection::of(2, report(2, 1));
        if let Some(r) = bad.reports.get_mut(&2) {
            r.cells[0].size_class = 200;
        }
        assert!(own.absorb(bad, Some(1)).is_err());
        assert_eq!(own.reports[&1].count(), 2);
    }
}
