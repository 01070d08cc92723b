//! Where a round trip's time goes: CPU time and wake-ups of each process of a tree,
//! read from `/proc` before and after the measured round trips. Both are counts, not
//! timings, so they hold on a loaded machine too: a node that wakes once per child
//! frame, or spends more CPU per frame than its raw relay, shows here wherever it runs.

use std::collections::HashMap;

use serde::Serialize;

/// What one process (all its threads) has used so far.
#[derive(Debug, Clone, Copy, Default)]
struct Used {
    /// CPU time, nanoseconds (the first field of each thread's `schedstat`).
    cpu_ns: u64,
    /// Voluntary context switches: each is a wait that ended in a wake-up.
    wakeups: u64,
}

/// A process's place in the tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Place {
    FrontEnd,
    Inner,
    Leaf,
}

/// What the processes of a tree have used so far, by process.
#[derive(Debug, Default)]
pub(super) struct Snapshot(HashMap<u32, (Place, Used)>);

/// Per round trip, per process: CPU microseconds and wake-ups.
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct PerRound {
    /// CPU time, microseconds.
    pub cpu_us: f64,
    /// Wake-ups.
    pub wakeups: f64,
}

/// The costs of one round trip at each level of the tree: the front-end (or the raw
/// tree's root), the mean inner node (comm node, or relay with children) and the mean
/// leaf (back-end, or leaf relay).
#[derive(Debug, Clone, Copy, Default, Serialize, PartialEq)]
pub struct RoundCosts {
    /// The front-end process.
    pub frontend: PerRound,
    /// The mean comm node (none: zeros).
    pub inner: PerRound,
    /// The mean back-end.
    pub leaf: PerRound,
}

impl Snapshot {
    /// The front-end (this process) and every process of `session`.
    pub(super) fn of_session(session: &str) -> Snapshot {
        let mut snap = Snapshot::default();
        snap.add_self();
        for (pid, place) in session_processes(session) {
            snap.add(pid, place);
        }
        snap
    }

    /// This process (the raw tree's root) and the raw tree's relays below it.
    pub(super) fn of_relays(relay_var: &str) -> Snapshot {
        let me = std::process::id();
        let parents: HashMap<u32, u32> = all_pids().filter_map(|pid| Some((pid, parent(pid)?))).collect();
        let below_me = |mut pid: u32| {
            while let Some(&p) = parents.get(&pid) {
                if p == me {
                    return true;
                }
                pid = p;
            }
            false
        };
        let mut snap = Snapshot::default();
        snap.add_self();
        let prefix = format!("{relay_var}=");
        for &pid in parents.keys().filter(|&&pid| below_me(pid)) {
            let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
            let Some(tree) = env.split(|b| *b == 0).find_map(|kv| kv.strip_prefix(prefix.as_bytes())) else {
                continue;
            };
            // A relay's sub-tree of one node is a leaf.
            let nodes = String::from_utf8_lossy(tree).split_whitespace().filter(|w| w.contains(':')).count();
            snap.add(pid, if nodes <= 1 { Place::Leaf } else { Place::Inner });
        }
        snap
    }

    fn add_self(&mut self) {
        let me = std::process::id();
        self.add(me, Place::FrontEnd);
    }

    fn add(&mut self, pid: u32, place: Place) {
        if let Some(used) = used(pid) {
            self.0.insert(pid, (place, used));
        }
    }

    /// What each level used per round between `self` and `after`, over `rounds` round trips.
    pub(super) fn per_round(&self, after: &Snapshot, rounds: usize) -> RoundCosts {
        let mut sums: HashMap<Place, (Used, u32)> = HashMap::new();
        for (pid, (place, then)) in &self.0 {
            let Some((_, now)) = after.0.get(pid) else { continue };
            let entry = sums.entry(*place).or_default();
            entry.0.cpu_ns += now.cpu_ns.saturating_sub(then.cpu_ns);
            entry.0.wakeups += now.wakeups.saturating_sub(then.wakeups);
            entry.1 += 1;
        }
        let rounds = rounds.max(1) as f64;
        let mean = |place| {
            sums.get(&place).map_or(PerRound::default(), |(used, n)| PerRound {
                cpu_us: used.cpu_ns as f64 / 1e3 / f64::from(*n) / rounds,
                wakeups: used.wakeups as f64 / f64::from(*n) / rounds,
            })
        };
        RoundCosts { frontend: mean(Place::FrontEnd), inner: mean(Place::Inner), leaf: mean(Place::Leaf) }
    }
}

/// The comm nodes (`Inner`) and back-ends (`Leaf`) of `session` on this machine: the
/// processes whose environment holds its `TREECAST_SESSION`.
pub(super) fn session_processes(session: &str) -> Vec<(u32, Place)> {
    let needle = format!("TREECAST_SESSION={session}");
    all_pids()
        .filter_map(|pid| {
            let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
            if !env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
                return None;
            }
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            if cmdline.ends_with(b"node\0") {
                Some((pid, Place::Inner))
            } else if cmdline.ends_with(b"backend\0") {
                Some((pid, Place::Leaf))
            } else {
                None
            }
        })
        .collect()
}

fn all_pids() -> impl Iterator<Item = u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str().and_then(|s| s.parse().ok()))
}

fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: the fields follow the last ')'.
    stat.rsplit_once(')')?.1.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time and voluntary switches of every thread of `pid`.
fn used(pid: u32) -> Option<Used> {
    let mut total = Used::default();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).ok()?.flatten() {
        let dir = task.path();
        if let Some(ns) = std::fs::read_to_string(dir.join("schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        {
            total.cpu_ns += ns;
        }
        if let Some(n) = std::fs::read_to_string(dir.join("status")).ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("voluntary_ctxt_switches:"))?
                .split_whitespace()
                .nth(1)?
                .parse::<u64>()
                .ok()
        }) {
            total.wakeups += n;
        }
    }
    Some(total)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn this_process_is_counted_as_the_front_end_and_its_work_shows() {
        let before = Snapshot::of_session("no-such-session");
        // Some CPU work and one wait, in this thread.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let after = Snapshot::of_session("no-such-session");
        let costs = before.per_round(&after, 1);
        assert!(costs.frontend.cpu_us > 0.0, "{costs:?}");
        assert!(costs.frontend.wakeups >= 1.0, "{costs:?}");
        assert_eq!(costs.inner, PerRound::default());
        assert_eq!(costs.leaf, PerRound::default());
    }

    #[test]
    fn a_parent_is_read_past_a_name_with_spaces_and_parentheses() {
        assert_eq!(parent(std::process::id()), Some(std::os::unix::process::parent_id()));
    }
}
