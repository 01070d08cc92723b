//! Helpers shared by the end-to-end tests: finding the processes a test left behind
//! (by its session id, or a tag of its own, never by being alone), and scratch
//! directories.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub(crate) mod copies;
pub(crate) mod local;
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

/// Waits (up to 10 s) until no process of a session this thread's test started
/// runs: the sessions its [`OwnSessions`] learned. Other tests of this binary run
/// trees of their own meanwhile, so it never looks at every session.
pub(crate) fn assert_no_session_left() {
    let watch = OWN
        .with(|own| own.borrow().clone())
        .expect("this test watches no sessions: open an OwnSessions first");
    let deadline = Instant::now() + Duration::from_secs(10);
    watch.scan();
    assert!(!watch.sessions.lock().unwrap().is_empty(), "no session of this test was seen: nothing to check");
    loop {
        let left = watch.scan();
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "treecast processes left behind: {left:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

thread_local! {
    /// The sessions the test running on this thread watches.
    static OWN: RefCell<Option<Arc<Watch>>> = const { RefCell::new(None) };
}

/// The treecast sessions of one test whose processes cannot all carry its tag
/// (started over ssh, or as Slurm job steps): learned while the test runs from
/// every process that carries the tag or runs in one of its hosts' network
/// namespaces, so that [`assert_no_session_left`] looks at these sessions alone.
/// Stops watching when dropped.
pub(crate) struct OwnSessions {
    watch: Arc<Watch>,
    poller: Option<std::thread::JoinHandle<()>>,
}

struct Watch {
    /// `TREECAST_TEST_TAG=...`, put in the environment of the commands the test runs.
    tag: String,
    /// Inodes of the network namespaces of the test's hosts.
    namespaces: BTreeSet<u64>,
    /// Session ids seen on processes of the test.
    sessions: Mutex<BTreeSet<String>>,
    stop: AtomicBool,
}

impl OwnSessions {
    /// Starts watching, for the test running on this thread, the sessions of
    /// processes that carry a fresh tag or run in a network namespace named
    /// `treecast-{prefix}N` (a host of `tools/testcluster --prefix {prefix}`).
    pub(crate) fn watch(hosts_prefix: Option<&str>) -> OwnSessions {
        let mut namespaces = BTreeSet::new();
        if let Some(prefix) = hosts_prefix {
            let wanted = format!("treecast-{prefix}");
            for entry in std::fs::read_dir("/run/netns").into_iter().flatten().flatten() {
                let name = entry.file_name().to_string_lossy().into_owned();
                let host = name.strip_prefix(&wanted).is_some_and(|k| k.parse::<u32>().is_ok());
                if let (true, Ok(meta)) = (host, entry.metadata()) {
                    namespaces.insert(meta.ino());
                }
            }
            assert!(!namespaces.is_empty(), "no namespace {wanted}N in /run/netns");
        }
        let watch = Arc::new(Watch {
            tag: local::tag(),
            namespaces,
            sessions: Mutex::new(BTreeSet::new()),
            stop: AtomicBool::new(false),
        });
        OWN.with(|own| *own.borrow_mut() = Some(watch.clone()));
        let polled = watch.clone();
        let poller = std::thread::spawn(move || {
            while !polled.stop.load(Ordering::Relaxed) {
                polled.scan();
                // Often enough to see every session: a tree lives far longer.
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        OwnSessions { watch, poller: Some(poller) }
    }

    /// The tag (`TREECAST_TEST_TAG`, value) to put in the environment of a command
    /// the test runs, so that its local processes count as the test's.
    pub(crate) fn tag(&self) -> (&str, &str) {
        self.watch.tag.split_once('=').unwrap()
    }
}

impl Drop for OwnSessions {
    fn drop(&mut self) {
        self.watch.stop.store(true, Ordering::Relaxed);
        if let Some(poller) = self.poller.take() {
            let _ = poller.join();
        }
        OWN.with(|own| own.borrow_mut().take());
    }
}

impl Watch {
    /// Learns the sessions of the test's processes running now; returns the pids of
    /// every live process of a session learned so far.
    fn scan(&self) -> Vec<u32> {
        let mut live = Vec::new();
        for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
            let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
            let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
            let session = env.split(|b| *b == 0).find_map(|kv| kv.strip_prefix(b"TREECAST_SESSION="));
            let Some(session) = session.map(|s| String::from_utf8_lossy(s).into_owned()) else { continue };
            if is_zombie(&entry.path()) {
                continue;
            }
            let tagged = env.split(|b| *b == 0).any(|kv| kv == self.tag.as_bytes());
            if tagged || self.in_our_namespace(&entry.path()) {
                self.sessions.lock().unwrap().insert(session.clone());
            }
            live.push((pid, session));
        }
        let sessions = self.sessions.lock().unwrap();
        live.into_iter().filter(|(_, s)| sessions.contains(s)).map(|(pid, _)| pid).collect()
    }

    fn in_our_namespace(&self, proc_dir: &Path) -> bool {
        let Ok(link) = std::fs::read_link(proc_dir.join("ns/net")) else { return false };
        let inode =
            link.to_str().and_then(|l| l.strip_prefix("net:[")?.strip_suffix(']')?.parse::<u64>().ok());
        inode.is_some_and(|i| self.namespaces.contains(&i))
    }
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
