//! Where a round trip's time goes: CPU time and wake-ups of each process of a tree,
//! read from `/proc` before and after the measured round trips. Both are counts, not
//! timings, so they hold on a loaded machine too: a node that wakes once per child
//! frame, or spends more CPU per frame than its raw relay, shows here wherever it runs.

use std::collections::HashMap;
use std::time::Instant;

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

/// The processes a window reads, found once before it opens: finding them reads every
/// process of the host, which at 10,000 back-ends costs the front-end more than the
/// round trips it would be divided by.
#[derive(Debug, Default)]
pub(super) struct Tracked(Vec<(u32, Place)>);

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
    /// Seconds from the start of the first reading to the end of the second: the
    /// round trips and the readings (when it is far above the round trips' sum, idle
    /// work such as heartbeats weighs in the figures).
    pub window_s: f64,
}

impl Tracked {
    /// The comm nodes and back-ends of `session` on this machine.
    pub(super) fn session(session: &str) -> Tracked {
        Tracked(session_processes(session))
    }

    /// The raw tree's relays below this process (its root).
    pub(super) fn relays(relay_var: &str) -> Tracked {
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
        let prefix = format!("{relay_var}=");
        let mut relays = Vec::new();
        for &pid in parents.keys().filter(|&&pid| below_me(pid)) {
            let Ok(env) = std::fs::read(format!("/proc/{pid}/environ")) else { continue };
            let Some(tree) = env.split(|b| *b == 0).find_map(|kv| kv.strip_prefix(prefix.as_bytes())) else {
                continue;
            };
            // A relay's sub-tree of one node is a leaf.
            let nodes = String::from_utf8_lossy(tree).split_whitespace().filter(|w| w.contains(':')).count();
            relays.push((pid, if nodes <= 1 { Place::Leaf } else { Place::Inner }));
        }
        Tracked(relays)
    }

    /// The tracked processes, each with its place in the tree.
    pub(super) fn processes(&self) -> &[(u32, Place)] {
        &self.0
    }

    /// CPU seconds the tracked processes and this one have used so far, all together.
    pub(super) fn cpu_so_far_s(&self) -> f64 {
        self.read(true).0.values().map(|(_, used)| used.cpu_ns as f64 / 1e9).sum()
    }

    /// Opens a window: the tracked processes first, this one (the front-end) last, so
    /// that reading them is not counted as the front-end's work.
    pub(super) fn before(&self) -> (Snapshot, Instant) {
        let opened = Instant::now();
        (self.read(false), opened)
    }

    /// Closes the window `before` opened: this process first, then the others; what
    /// each level used per round over `rounds` round trips.
    pub(super) fn after(&self, (before, opened): &(Snapshot, Instant), rounds: usize) -> RoundCosts {
        let after = self.read(true);
        RoundCosts { window_s: opened.elapsed().as_secs_f64(), ..before.per_round(&after, rounds) }
    }

    /// What this process and the tracked ones have used so far, this one read first
    /// or last.
    fn read(&self, front_end_first: bool) -> Snapshot {
        let mut snap = Snapshot::default();
        if front_end_first {
            snap.add_self();
        }
        for &(pid, place) in &self.0 {
            snap.add(pid, place);
        }
        if !front_end_first {
            snap.add_self();
        }
        snap
    }
}

impl Snapshot {
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
    fn per_round(&self, after: &Snapshot, rounds: usize) -> RoundCosts {
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
        RoundCosts {
            frontend: mean(Place::FrontEnd),
            inner: mean(Place::Inner),
            leaf: mean(Place::Leaf),
            window_s: 0.0,
        }
    }
}

/// CPU seconds this process has used so far.
pub(super) fn own_cpu_s() -> f64 {
    used(std::process::id()).map_or(0.0, |u| u.cpu_ns as f64 / 1e9)
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
        let tracked = Tracked::session("no-such-session");
        let before = tracked.before();
        // Some CPU work and one wait, in this thread.
        let mut x = 0u64;
        for i in 0..2_000_000u64 {
            x = x.wrapping_mul(31).wrapping_add(i);
        }
        std::hint::black_box(x);
        std::thread::sleep(std::time::Duration::from_millis(2));
        let costs = tracked.after(&before, 1);
        assert!(costs.frontend.cpu_us > 0.0, "{costs:?}");
        assert!(costs.frontend.wakeups >= 1.0, "{costs:?}");
        assert_eq!(costs.inner, PerRound::default());
        assert_eq!(costs.leaf, PerRound::default());
        assert!(costs.window_s >= 0.002, "{costs:?}");
        assert!(tracked.cpu_so_far_s() > 0.0);
    }

    #[test]
    fn a_parent_is_read_past_a_name_with_spaces_and_parentheses() {
        assert_eq!(parent(std::process::id()), Some(std::os::unix::process::parent_id()));
    }
}
