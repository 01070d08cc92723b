//! Helpers shared by the end-to-end test binaries: finding processes a test left
//! behind, and scratch directories.

// Each test binary uses a different subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

pub(crate) mod copies;
pub(crate) mod tree;

/// Pids of live processes whose environment holds `needle` (e.g. `TREECAST_SESSION=ab12`).
pub(crate) fn processes_with_env(needle: &str) -> Vec<u32> {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
        if env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) && !is_zombie(&entry.path()) {
            found.push(pid);
        }
    }
    found
}

pub(crate) fn is_zombie(proc_dir: &Path) -> bool {
    std::fs::read_to_string(proc_dir.join("stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
        .unwrap_or(true)
}

/// Waits (up to 5 s) until no process carries `needle`; kills and fails otherwise.
pub(crate) fn assert_no_leftovers(needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let left = processes_with_env(needle);
        if left.is_empty() {
            return;
        }
        if Instant::now() > deadline {
            let described: Vec<String> = left.iter().map(|pid| describe(*pid)).collect();
            for pid in &left {
                let _ = Command::new("kill").arg("-9").arg(pid.to_string()).status();
            }
            panic!("processes left behind with {needle}: {}", described.join("; "));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// A process's pid, command line and parent, for failure messages.
pub(crate) fn describe(pid: u32) -> String {
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " ").trim_end().to_owned())
        .unwrap_or_default();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat.rsplit_once(')').map(|(_, rest)| rest.trim()).unwrap_or("");
    format!("{pid} ({cmdline}) [{}]", state.split(' ').take(4).collect::<Vec<_>>().join(" "))
}

/// Waits (up to 10 s) until no process of any treecast session runs; the test
/// binaries that use this are the only users of treecast on the machine.
pub(crate) fn assert_no_session_left() {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_with_env_prefix("TREECAST_SESSION=");
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "treecast processes left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Pids of live processes with an environment entry starting with `prefix`.
pub(crate) fn processes_with_env_prefix(prefix: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
        if env.split(|b| *b == 0).any(|kv| kv.starts_with(prefix.as_bytes())) && !is_zombie(&entry.path()) {
            found.push(pid);
        }
    }
    found
}

/// Pseudo-random bytes (xorshift), different for every call.
pub(crate) fn random_bytes(n: usize) -> Vec<u8> {
    static SEED: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let mut x = SEED.fetch_add(0x2545_f491_4f6c_dd1d, Ordering::Relaxed) | 1;
    let mut data = Vec::with_capacity(n + 8);
    while data.len() < n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        data.extend_from_slice(&x.to_le_bytes());
    }
    data.truncate(n);
    data
}

/// A fresh directory under the system's temporary directory, removed when dropped
/// (also when the test fails).
pub(crate) struct TestDir(tempfile::TempDir);

impl TestDir {
    pub(crate) fn new(name: &str) -> TestDir {
        TestDir(tempfile::Builder::new().prefix(&format!("treecast-{name}-")).tempdir().unwrap())
    }

    /// The directory itself.
    pub(crate) fn root(&self) -> &Path {
        self.0.path()
    }

    /// `name` inside the directory.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.0.path().join(name)
    }
}

/// Pid of the comm node with pre-order id `id` in a session.
pub(crate) fn commnode_pid(session: &str, id: u32) -> u32 {
    let a = processes_with_env(&format!("TREECAST_SESSION={session}"));
    let b = processes_with_env(&format!("TREECAST_NODE_ID={id}"));
    let both: Vec<u32> = a.into_iter().filter(|p| b.contains(p)).collect();
    let nodes: Vec<u32> = both
        .into_iter()
        .filter(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.ends_with(b"node\0")))
        .collect();
    assert_eq!(nodes.len(), 1, "comm node {id}");
    nodes[0]
}
