//! The global clock at the front-end: every node's offset to the front-end's clock,
//! composed along the tree from the measurements each parent made of its children
//! (see `treecast_proto` for how they are made).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use treecast_driver::lock;
use treecast_monitor::clock::drifted;
use treecast_topology::Topology;
use treecast_wire::ClockSample;

use crate::{ApiError, Network};

/// One node's clock against the front-end's.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeClock {
    /// The node's id (pre-order in the topology; 0 is the front-end).
    pub node_id: u32,
    /// Its name in the topology, `host:index`.
    pub name: String,
    /// Its clock minus the front-end's now, nanoseconds, interpolated with the drift
    /// from the latest measurement of every link on its path.
    pub offset_ns: i64,
    /// How fast its clock runs against the front-end's, parts per million.
    pub drift_ppm: f64,
    /// Bound on the offset's error now: for each link on its path, half the shortest
    /// round trip of its latest round, plus the drift's error bound times the time
    /// since that round, nanoseconds.
    pub error_ns: u64,
    /// Shortest round trip to its parent in the latest round, nanoseconds.
    pub rtt_ns: u64,
    /// Seconds since the latest measurement of its own link.
    pub age_s: f64,
    /// Rounds of probes measured on its own link.
    pub rounds: u32,
}

impl Network {
    /// Every node's clock against the front-end's, as measured so far. Nodes not yet
    /// measured, and nodes whose every rank is lost, are absent; the front-end itself
    /// is not listed.
    pub fn clock(&self) -> Vec<NodeClock> {
        let d = lock(&self.shared);
        let Some(fe_now) = d.core().clock_now(Instant::now()) else { return Vec::new() };
        let samples: HashMap<u32, (ClockSample, u32)> =
            d.core().clock_samples().map(|(s, r)| (s.node_id, (*s, r))).collect();
        drop(d);
        let gone = self.gone_nodes();
        let mut table = compose(self.topology(), &samples, fe_now);
        table.retain(|c| !gone[c.node_id as usize]);
        table
    }

    /// Per node id: true when every rank below it is lost (the node is gone with them).
    fn gone_nodes(&self) -> Vec<bool> {
        let lost = self.lost();
        let topo = self.topology();
        (0..topo.len())
            .map(|id| {
                let r = topo.rank_range(id);
                treecast_wire::RankSet::range(r.start, r.end - r.start).difference(lost.ranks()).is_empty()
            })
            .collect()
    }

    /// Waits until every node of the tree that is still reachable has been measured in
    /// at least `rounds` rounds (2 gives the drift), then returns [`Network::clock`].
    ///
    /// # Errors
    /// [`ApiError::ClockTimeout`] when that has not happened within `limit`.
    ///
    /// Cancel safety: cancel safe.
    pub async fn wait_clock(&self, rounds: u32, limit: Duration) -> Result<Vec<NodeClock>, ApiError> {
        let deadline = Instant::now() + limit;
        loop {
            // Rounds per node id, counted without composing the table.
            let mut measured = vec![0u32; self.topology().len()];
            for (s, r) in lock(&self.shared).core().clock_samples() {
                if let Some(m) = measured.get_mut(s.node_id as usize) {
                    *m = r;
                }
            }
            let gone = self.gone_nodes();
            let missing = (1..measured.len()).filter(|&id| !gone[id] && measured[id] < rounds).count();
            if missing == 0 {
                return Ok(self.clock());
            }
            if Instant::now() >= deadline {
                return Err(ApiError::ClockTimeout { rounds, missing, secs: limit.as_secs_f64() });
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Composes per-link samples into offsets to the root's clock at `root_now_ns`.
///
/// Node ids are in pre-order, so a parent's offset is known before its children's:
/// each link's offset is interpolated to "now" on the parent's clock with the link's
/// drift, then added to the parent's offset.
pub fn compose(
    topo: &Topology,
    samples: &HashMap<u32, (ClockSample, u32)>,
    root_now_ns: i64,
) -> Vec<NodeClock> {
    // Per node: offset to the root (ns), drift (ppb), error bound (ns).
    let mut known: Vec<Option<(i64, i64, u64)>> = vec![None; topo.len()];
    known[topo.root()] = Some((0, 0, 0));
    let mut out = Vec::new();
    for id in 0..topo.len() {
        let Some(parent) = topo.node(id).parent else { continue };
        let (Some((parent_offset, parent_drift, parent_error)), Some((s, rounds))) =
            (known[parent], samples.get(&(id as u32)))
        else {
            continue;
        };
        let parent_now = root_now_ns.saturating_add(parent_offset);
        let since = i128::from(parent_now) - i128::from(s.measured_ns);
        // Samples come from the network: absurd ones saturate rather than wrap or vanish.
        let link = drifted(s.offset_ns, s.drift_ppb, since);
        let offset = parent_offset.saturating_add(link);
        let drift = parent_drift.saturating_add(s.drift_ppb);
        let aged = u64::try_from(since.unsigned_abs() * u128::from(s.drift_error_ppb) / 1_000_000_000)
            .unwrap_or(u64::MAX);
        let error = parent_error.saturating_add(s.error_ns).saturating_add(aged);
        known[id] = Some((offset, drift, error));
        out.push(NodeClock {
            node_id: id as u32,
            name: topo.node(id).name(),
            offset_ns: offset,
            drift_ppm: drift as f64 / 1e3,
            error_ns: error,
            rtt_ns: s.rtt_ns,
            age_s: since as f64 / 1e9,
            rounds: *rounds,
        });
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample(
        node_id: u32,
        offset_ns: i64,
        error_ns: u64,
        drift_ppb: i64,
        measured_ns: i64,
    ) -> (u32, (ClockSample, u32)) {
        let s = ClockSample {
            node_id,
            offset_ns,
            error_ns,
            rtt_ns: 2 * error_ns,
            drift_ppb,
            drift_error_ppb: 0,
            measured_ns,
        };
        (node_id, (s, 1))
    }

    #[test]
    fn offsets_add_up_along_the_path_and_drift_moves_them_on() {
        // 0 => 1 => 2, and 0 => 3.
        let topo = Topology::parse("h:0 => h:1 h:3 ;\nh:1 => h:2 ;").unwrap();
        let (a, b, c) = (topo.find("h", 1).unwrap(), topo.find("h", 2).unwrap(), topo.find("h", 3).unwrap());
        let samples: HashMap<u32, (ClockSample, u32)> = [
            sample(a as u32, 1_000, 10, 0, 0),
            // Measured on node 1's clock at 1_000 (root time 0); drifting 1 ppm.
            sample(b as u32, -300, 20, 1_000, 1_000),
        ]
        .into_iter()
        .collect();
        let table = compose(&topo, &samples, 1_000_000_000);
        let of = |id: usize| table.iter().find(|n| n.node_id as usize == id).cloned();
        assert_eq!(of(a).unwrap().offset_ns, 1_000);
        // One second on: the link drifted 1 µs.
        let node2 = of(b).unwrap();
        assert_eq!(node2.offset_ns, 1_000 - 300 + 1_000);
        assert_eq!(node2.error_ns, 30);
        assert_eq!(node2.drift_ppm, 1.0);
        assert!(of(c).is_none(), "a node never measured is not listed");
    }
}
