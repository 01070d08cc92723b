//! The processes of a run under test, found in `/proc`, and the signals sent to them.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use treecast_api::{RankSet, Topology};

/// One process of the tree under test.
#[derive(Debug, Clone)]
pub(super) struct Victim {
    pub(super) pid: u32,
    /// `comm node N` or `back-end rank R`.
    pub(super) what: String,
    /// The ranks it serves (its sub-tree).
    pub(super) ranks: RankSet,
    /// True for a back-end.
    pub(super) backend: bool,
}

impl Victim {
    /// Node `id` of `topo`, running as `pid`.
    pub(super) fn new(pid: u32, id: usize, topo: &Topology) -> Victim {
        let range = topo.rank_range(id);
        let ranks = RankSet::range(range.start, range.end.saturating_sub(range.start));
        let (what, backend) = match topo.backend_rank(id) {
            Some(r) => (format!("back-end rank {r}"), true),
            None => (format!("comm node {id}"), false),
        };
        Victim { pid, what, ranks, backend }
    }
}

/// Sends a signal with kill(1); a process that is already gone is not an error here.
pub(super) fn signal_process(signal: &str, pid: u32) {
    let _ = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

/// The value of `name` in an environment read from `/proc`.
pub(super) fn env_value(env: &[String], name: &str) -> Option<String> {
    env.iter().find_map(|kv| kv.strip_prefix(name).and_then(|v| v.strip_prefix('=')).map(str::to_owned))
}

/// The comm nodes and back-ends of a session, from `/proc`.
pub(super) fn processes(session: &str, topo: &Topology) -> Vec<Victim> {
    let mut found = BTreeMap::new();
    for (pid, env) in session_processes(session) {
        let Some(id) = env_value(&env, "TREECAST_NODE_ID").and_then(|s| s.parse::<usize>().ok()) else {
            continue;
        };
        if id == 0 || id >= topo.len() {
            continue;
        }
        found.insert(id, Victim::new(pid, id, topo));
    }
    found.into_values().collect()
}

/// Pids and environments of the live processes of a session (this one excepted).
pub(super) fn session_processes(session: &str) -> Vec<(u32, Vec<String>)> {
    let needle = format!("TREECAST_SESSION={session}");
    live_processes()
        .into_iter()
        .filter_map(|(pid, _)| Some((pid, environment(pid)?)))
        .filter(|(_, env)| env.contains(&needle))
        .collect()
}

/// The live treecast processes this process started, directly or through the ones
/// it started (pid, environment): while a tree starts, its session is not known yet.
/// Only descendants' environments are read: this runs every few milliseconds.
pub(super) fn descendants() -> Vec<(u32, Vec<String>)> {
    let mut children: HashMap<u32, Vec<u32>> = HashMap::new();
    for (pid, ppid) in live_processes() {
        children.entry(ppid).or_default().push(pid);
    }
    let node_of = |env: &[String]| env_value(env, "TREECAST_NODE_ID");
    // A tool that runs this benchmark inside a tree of its own: that tree is not ours.
    let outer = std::env::var("TREECAST_SESSION").ok();
    let mut out = Vec::new();
    let mut todo = vec![(std::process::id(), None)];
    while let Some((pid, parent_node)) = todo.pop() {
        for &child in children.get(&pid).map(Vec::as_slice).unwrap_or_default() {
            let env = environment(child).unwrap_or_default();
            let node = node_of(&env);
            todo.push((child, node.clone()));
            let session = env_value(&env, "TREECAST_SESSION");
            // A child between fork and exec still shows its parent's environment.
            let forked_copy = node.is_some() && node == parent_node;
            if node.is_some() && session.is_some() && session != outer && !forked_copy {
                out.push((child, env));
            }
        }
    }
    out
}

/// Every live process but this one and zombies: pid and parent pid.
fn live_processes() -> Vec<(u32, u32)> {
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        // After the command's closing parenthesis: state, then the parent's pid.
        let Some((state, ppid)) = std::fs::read_to_string(entry.path().join("stat")).ok().and_then(|s| {
            let rest = s.rsplit_once(')')?.1.to_owned();
            let mut fields = rest.split_whitespace();
            let state = fields.next()?.to_owned();
            let ppid = fields.next()?.parse::<u32>().ok()?;
            Some((state, ppid))
        }) else {
            continue;
        };
        if state != "Z" {
            out.push((pid, ppid));
        }
    }
    out
}

/// The environment of process `pid`, if it can be read.
fn environment(pid: u32) -> Option<Vec<String>> {
    let env = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(env.split(|b| *b == 0).map(|kv| String::from_utf8_lossy(kv).into_owned()).collect())
}

/// Waits up to `limit` for every process of the session to end; returns how many remain.
pub(super) async fn wait_for_none(session: &str, limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    loop {
        let left = session_processes(session).len();
        if left == 0 || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
