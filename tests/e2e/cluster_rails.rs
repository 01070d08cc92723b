//! A striped link over the two rails of a shaped test cluster (`tools/testcluster
//! up 2 --rate 1gbit --rails 2`) with one rail brought down mid-transfer, then
//! another under a quiet link: a rail that goes down resets nothing, so the link
//! must notice that connection standing still, give it up, and carry everything on
//! the other rail, nothing lost or delivered twice. Then a tree whose nodes hand
//! their children one address per rail (`TREECAST_RAILS`): a file sent to both
//! hosts crosses both rails. Needs root; without it the tests show as ignored.
//!
//! The far end is `treecast bench route --serve` in host 2, which answers each frame
//! tagged `DIGEST_TAG` with the SHA-256 of what arrived; this process is the near
//! end, in the root namespace, which has an address on both bridges.

use std::future::poll_fn;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::task::Poll;
use std::time::{Duration, Instant};

use sha2::Digest;
use treecast::apps::bench::route_pair::DIGEST_TAG;
use treecast_transport::striped::{self, WithStriped};
use treecast_transport::{LinkPeer, Route, RouteEvent, Secret, StreamRoute};
use treecast_wire::{Frame, FrameHeader, LinkTable, MAX_PAYLOAD_LEN};

use crate::common::copies::{assert_copies, own_dirs, send_to_own_dirs};
use crate::common::{self, random_bytes, TestDir};
use treecast_api::{NetworkBuilder, RankSet, SshOptions, Topology};
use treecast_files::Outcome;

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const PREFIX: &str = "trl";
/// The tree test's own cluster, so that both tests can run at once.
const TREE_PREFIX: &str = "trt";
const PORT: u16 = 47300;
const LIMIT: Duration = Duration::from_secs(120);
/// How long a connection may stand still while the other moves (both ends).
const STALL: Duration = Duration::from_secs(1);

/// Two hosts with two 1 Gbit/s rails each, removed when dropped (also on failure).
struct Cluster {
    prefix: &'static str,
}

impl Cluster {
    fn up(prefix: &'static str) -> Cluster {
        let out = Command::new(script())
            .args(["up", "2", "--prefix", prefix, "--rate", "1gbit", "--rails", "2"])
            .output()
            .unwrap();
        assert!(out.status.success(), "testcluster up failed:\n{}", String::from_utf8_lossy(&out.stderr));
        Cluster { prefix }
    }

    fn state(&self) -> String {
        format!("/tmp/treecast-testcluster-{}", self.prefix)
    }

    /// Host `k`'s address on each rail, from the cluster's state files.
    fn addresses(&self, k: usize) -> [String; 2] {
        let state = self.state();
        let find = |file: &str, name: String| {
            let text = std::fs::read_to_string(format!("{state}/{file}")).unwrap();
            let line = text.lines().find(|l| l.split_whitespace().next() == Some(&name));
            line.and_then(|l| l.split_whitespace().nth(1))
                .unwrap_or_else(|| panic!("{name} in {file}"))
                .to_owned()
        };
        let prefix = self.prefix;
        [find("hosts", format!("{prefix}{k}")), find("hosts-rail2", format!("{prefix}{k}-r2"))]
    }

    /// The two rails as subnets (each host's addresses are in a /24).
    fn rails(&self) -> [String; 2] {
        self.addresses(1).map(|a| format!("{}.0/24", a.rsplit_once('.').unwrap().0))
    }

    /// Bytes host `k` received on rail 2 so far.
    fn rail2_received(&self, k: usize) -> u64 {
        let ns = format!("treecast-{}{k}", self.prefix);
        let out = Command::new("ip")
            .args(["netns", "exec", &ns, "cat", "/sys/class/net/eth1/statistics/rx_bytes"])
            .output()
            .unwrap();
        assert!(out.status.success(), "reading eth1's counter in {ns}");
        String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new(script()).args(["down", "--prefix", self.prefix]).status();
        let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
        let left = String::from_utf8_lossy(&left.stdout);
        if !std::thread::panicking() {
            assert!(!left.contains(&format!("treecast-{}", self.prefix)), "namespaces left behind: {left}");
        }
    }
}

/// The serving process, ended when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn script() -> std::path::PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/testcluster")
}

/// Waits until something accepts connections at `addr`.
fn wait_listening(addr: &str, server: &mut Server) {
    let until = Instant::now() + LIMIT;
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(server.0.try_wait().unwrap().is_none(), "the server ended before it listened");
        assert!(Instant::now() < until, "nothing listened at {addr} within {LIMIT:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
#[cfg_attr(not(has_root), ignore = "needs root (network namespaces)")]
fn a_rail_brought_down_mid_transfer_leaves_the_other_carrying_everything() {
    let cluster = Cluster::up(PREFIX);
    let far = cluster.addresses(2);
    let secret = Secret::generate();
    let mut server = Server(
        Command::new("ip")
            .args(["netns", "exec", &format!("treecast-{PREFIX}2"), TREECAST, "bench", "route"])
            .args(["--serve", &format!("0.0.0.0:{PORT}")])
            .env("TREECAST_SECRET", secret.to_hex())
            .env(striped::stall::STALL_ENV, STALL.as_secs_f64().to_string())
            .stdout(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The raw TCP port opens after the link port.
    wait_listening(&format!("{}:{}", far[0], PORT + 1), &mut server);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut route = WithStriped::new(StreamRoute::new(MAX_PAYLOAD_LEN), MAX_PAYLOAD_LEN);
        route.striped().set_stall_limit(STALL);
        let link = LinkTable::<()>::new().insert(());
        let to: Vec<String> = far.iter().map(|a| format!("{a}:{PORT}")).collect();
        let sockets = striped::connect(&to, 2, 1, &secret, LIMIT).await.unwrap();
        route.add_links(link, sockets, LinkPeer::Parent, "host 2".into()).unwrap();

        // About a second of the two rails' worth, between two small frames.
        let payloads = [random_bytes(1000), random_bytes(192 << 20), random_bytes(70_000)];
        for (i, p) in payloads.iter().enumerate() {
            route.send(&[link], &Frame::new(FrameHeader::data(1, DIGEST_TAG, i as u32), p.clone()));
        }
        route.flush();
        let total = route.striped().unacked(link);
        let mut rail_down = false;
        let mut answers = Vec::new();
        let run = poll_fn(|cx| loop {
            let mut any = route.poll_recv(cx, &mut |_, e| match e {
                RouteEvent::Frame(f) | RouteEvent::Timed(f, _) => answers.push(f),
                RouteEvent::Closed(why) => panic!("the link closed: {why:?}"),
            });
            route.flush();
            if !rail_down && route.striped().unacked(link) < total * 3 / 4 {
                rail_down = true;
                any = true;
                // A quarter arrived: rail 2 goes down under the transfer.
                set_link(&format!("treecast-{PREFIX}2"), "eth1", "down");
            }
            if answers.len() == payloads.len() {
                return Poll::Ready(());
            }
            if !any {
                return Poll::Pending;
            }
        });
        tokio::time::timeout(LIMIT, run).await.expect("not every frame was answered within two minutes");
        assert!(rail_down, "the transfer ended before a quarter of it was acknowledged");
        for (i, (answer, sent)) in answers.iter().zip(&payloads).enumerate() {
            assert_eq!(answer.header.tag, DIGEST_TAG, "answer {i}");
            assert_eq!(&answer.payload[..], &sha2::Sha256::digest(sent)[..], "frame {i} arrived changed");
        }
        let s = route.striped();
        assert_eq!(s.connections(link), 1, "the connection on the rail that went down was given up");
        assert!(s.resent(link) > 0, "its pieces went again on rail 1");
        eprintln!("{} pieces went again on rail 1", s.resent(link));
        route.close(link, treecast_transport::Close::Now);

        // A quiet link: only small frames, as heartbeats. Rail 2 comes back, a new
        // link takes both rails, and rail 1 (connection 0's) goes down under it.
        set_link(&format!("treecast-{PREFIX}2"), "eth1", "up");
        let link = LinkTable::<()>::new().insert(());
        let sockets = striped::connect(&to, 2, 1, &secret, LIMIT).await.unwrap();
        route.add_links(link, sockets, LinkPeer::Parent, "host 2".into()).unwrap();
        let beats: Vec<Vec<u8>> = (0..40).map(|_| random_bytes(100)).collect();
        let mut answers = Vec::new();
        let mut sent = 0;
        let mut tick = tokio::time::interval(Duration::from_millis(50));
        let run = poll_fn(|cx| loop {
            let mut any = route.poll_recv(cx, &mut |_, e| match e {
                RouteEvent::Frame(f) | RouteEvent::Timed(f, _) => answers.push(f),
                RouteEvent::Closed(why) => panic!("the quiet link closed: {why:?}"),
            });
            if sent < beats.len() && tick.poll_tick(cx).is_ready() {
                any = true;
                let frame = Frame::new(FrameHeader::data(1, DIGEST_TAG, sent as u32), beats[sent].clone());
                route.send(&[link], &frame);
                sent += 1;
                if sent == 10 {
                    set_link(&format!("treecast-{PREFIX}2"), "eth0", "down");
                }
            }
            route.flush();
            if answers.len() == beats.len() {
                return Poll::Ready(());
            }
            if !any {
                return Poll::Pending;
            }
        });
        tokio::time::timeout(LIMIT, run).await.expect("the quiet link's frames were not all answered");
        for (i, (answer, sent)) in answers.iter().zip(&beats).enumerate() {
            assert_eq!(
                &answer.payload[..],
                &sha2::Sha256::digest(sent)[..],
                "small frame {i} arrived changed"
            );
        }
        assert_eq!(route.striped().connections(link), 1, "the connection on rail 1 was given up");
    });
}

/// Sets `dev` in namespace `ns` up or down.
fn set_link(ns: &str, dev: &str, state: &str) {
    let ok = Command::new("ip").args(["-n", ns, "link", "set", dev, state]).status().unwrap();
    assert!(ok.success(), "could not set {dev} {state} in {ns}");
}

#[test]
#[cfg_attr(not(has_root), ignore = "needs root (network namespaces)")]
fn a_striped_tree_hands_its_children_one_address_per_rail_and_a_file_crosses_both() {
    let cluster = Cluster::up(TREE_PREFIX);
    let sessions = common::OwnSessions::watch(Some(TREE_PREFIX));
    let dir = TestDir::new("rails");
    let script = own_dirs(&dir, 2, TREECAST, "");
    let hosts: Vec<String> = (1..=2).map(|k| format!("{TREE_PREFIX}{k}")).collect();
    let this_host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let topo = Topology::from_hosts(&hosts, 2, 1, this_host.trim()).unwrap();
    let ssh = SshOptions {
        args: vec!["-F".into(), format!("{}/ssh_config", cluster.state())],
        remote_path: TREECAST.to_owned(),
        ..SshOptions::default()
    };
    let data = random_bytes(64 << 20);
    let before = [cluster.rail2_received(1), cluster.rail2_received(2)];
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    rt.block_on(async {
        let mut net = NetworkBuilder::new(topo)
            .treecast_path(TREECAST)
            .ssh(ssh)
            .startup_timeout(Duration::from_secs(60))
            .backend_command(["/bin/sh", "-c", &script])
            .stripes(2)
            .rails(cluster.rails())
            .launch()
            .await
            .unwrap();
        let report = send_to_own_dirs(&mut net, &dir, "64M", &data, 1 << 20, LIMIT).await;
        assert!(report.ok(), "{report:?}");
        assert_eq!(report.ranks_with(Outcome::Written), RankSet::range(0, 2), "{report:?}");
        net.shutdown().await;
    });
    assert_copies(&dir, 0..2, "64M", &data);
    for (k, before) in [1, 2].into_iter().zip(before) {
        let on_rail2 = cluster.rail2_received(k) - before;
        // Connection 1 of each link is on rail 2: about half of each copy.
        assert!(
            on_rail2 > (data.len() / 4) as u64,
            "host {k} received {on_rail2} bytes on rail 2 of a {} byte copy",
            data.len()
        );
        eprintln!("host {k}: {on_rail2} bytes on rail 2 of {}", data.len());
    }
    common::assert_no_session_left();
    drop(sessions);
}
