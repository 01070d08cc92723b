//! The multicast route over UDP on a test cluster of 16 network namespaces
//! (`tools/testcluster`) joined by a bridge: datagrams really cross veths and a
//! bridge, and loss is real, made by nftables rules inside the receiving hosts.
//! They need root; without it they show as ignored.
//!
//! The hosts share this file system, so every back-end runs in a directory of its
//! own and writes through `/proc/self/cwd`: each rank writes its own copy.

use crate::common;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::copies::{assert_copies, own_dirs, route_reports, send_to_own_dirs};
use crate::common::{random_bytes, TestDir};
use treecast_api::{Network, NetworkBuilder, RankSet, SshOptions, Topology};
use treecast_files::Outcome;
use treecast_monitor::RouteReport;

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const HOSTS: usize = 16;
const FANOUT: usize = 4;
const LIMIT: Duration = Duration::from_secs(300);

/// The cluster, removed when dropped (also when a test fails).
struct Cluster {
    prefix: &'static str,
    state: String,
    /// The sessions of this test (all of them reach its hosts).
    _sessions: common::OwnSessions,
}

impl Cluster {
    /// Hosts `prefix`1 to `prefix`16 (each test its own, so that they can run at once).
    fn up(prefix: &'static str) -> Option<Cluster> {
        let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        assert!(root, "the test cluster needs root (network namespaces), but the build ran as root: rebuild");
        let out =
            Command::new(script()).args(["up", &HOSTS.to_string(), "--prefix", prefix]).output().unwrap();
        assert!(out.status.success(), "testcluster up failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let _sessions = common::OwnSessions::watch(Some(prefix));
        Some(Cluster { prefix, state: format!("/tmp/treecast-testcluster-{prefix}"), _sessions })
    }

    fn ssh(&self) -> SshOptions {
        SshOptions {
            args: vec!["-F".into(), format!("{}/ssh_config", self.state)],
            remote_path: TREECAST.to_owned(),
            ..SshOptions::default()
        }
    }

    /// Runs `nft` in every host's namespace.
    fn nft_everywhere(&self, args: &[&str]) {
        for k in 1..=HOSTS {
            let out = Command::new("ip")
                .args(["netns", "exec", &format!("treecast-{}{k}", self.prefix), "nft"])
                .args(args)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "nft {args:?} in host {k}: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Every host drops `percent` % of the UDP datagrams it receives (data at the
    /// back-ends and comm nodes, answers at the comm nodes).
    fn drop_udp(&self, percent: u32) {
        self.nft_everywhere(&["add", "table", "inet", "treecast_loss"]);
        self.nft_everywhere(&[
            "add",
            "chain",
            "inet",
            "treecast_loss",
            "in",
            "{ type filter hook input priority 0; }",
        ]);
        let rule = format!("meta l4proto udp numgen random mod 100 < {percent} drop");
        let mut args = vec!["add", "rule", "inet", "treecast_loss", "in"];
        args.extend(rule.split(' '));
        self.nft_everywhere(&args);
    }

    fn stop_dropping(&self) {
        self.nft_everywhere(&["delete", "table", "inet", "treecast_loss"]);
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

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/testcluster")
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_owned()
}

fn have_nft() -> bool {
    Command::new("nft").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// The 16 hosts with fan-out 4 over ssh, every node multicasting, each rank in a
/// directory of its own under `dir`.
async fn launch(cluster: &Cluster, dir: &TestDir, settings: &[(&str, &str)]) -> Network {
    let script = own_dirs(dir, HOSTS, TREECAST, "");
    let hosts: Vec<String> = (1..=HOSTS).map(|k| format!("{}{k}", cluster.prefix)).collect();
    let topo = Topology::from_hosts(&hosts, FANOUT, 1, &this_host()).unwrap();
    let mut builder = NetworkBuilder::new(topo)
        .treecast_path(TREECAST)
        .ssh(cluster.ssh())
        .startup_timeout(Duration::from_secs(60))
        .backend_command(["/bin/sh", "-c", &script])
        .udp_route(true);
    for (k, v) in settings {
        builder = builder.udp_setting(*k, *v);
    }
    builder.launch().await.unwrap()
}

/// Sends `data` as `name` to every rank; checks every copy.
async fn send_and_check(net: &mut Network, dir: &TestDir, name: &str, data: &[u8], chunk: usize) {
    let report = send_to_own_dirs(net, dir, name, data, chunk, LIMIT).await;
    assert!(report.ok(), "{name}: {report:?}");
    assert_eq!(report.ranks_with(Outcome::Written), RankSet::range(0, HOSTS as u32), "{name}: {report:?}");
    assert_copies(dir, 0..HOSTS as u32, name, data);
}

#[test]
#[cfg_attr(
    not(all(has_root, has_nft)),
    ignore = "needs root (network namespaces) and nft (nftables) for real loss"
)]
fn every_size_and_one_five_and_twenty_percent_real_loss_arrive_at_sixteen_hosts() {
    let Some(cluster) = Cluster::up("tcu") else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = TestDir::new("udp-cluster");
        // Every chunk goes by multicast, small ones included.
        let mut net = launch(&cluster, &dir, &[("TREECAST_UDP_MIN_FRAME", "0")]).await;
        for (i, size) in [0usize, 1, 1432 - 28, 1432 - 27, 8 << 20].into_iter().enumerate() {
            send_and_check(&mut net, &dir, &format!("size{i}"), &random_bytes(size), 64 << 10).await;
        }
        let before = route_reports(&net).await;
        // The front-end and each comm node multicast to their children: a comm node's
        // back-end on its own host may be alone in a loopback group (then its frames
        // go over its link), the others share the LAN group.
        let nodes: std::collections::BTreeSet<u32> = before.iter().map(|r| r.node).collect();
        assert!(nodes.len() > 1, "{before:?}");
        let reached: usize = before.iter().map(|r| r.udp_children.len()).sum();
        assert_eq!(
            reached,
            HOSTS + nodes.len() - 1,
            "every node but the front-end is in a group: {before:?}"
        );
        assert!(before.iter().all(|r| r.tcp_children.is_empty()), "{before:?}");
        let lan: Vec<&RouteReport> = before.iter().filter(|r| r.udp_children.len() >= 2).collect();
        assert!(lan.iter().all(|r| r.frames > 0), "{before:?}");
        assert!(lan.iter().any(|r| r.node != 0), "no comm node multicast: {before:?}");
        assert!(have_nft(), "nft (nftables) is needed for real loss, but the build found it: rebuild");
        for percent in [1, 5, 20] {
            cluster.drop_udp(percent);
            let data = random_bytes(4 << 20);
            send_and_check(&mut net, &dir, &format!("loss{percent}"), &data, 256 << 10).await;
            cluster.stop_dropping();
        }
        let after = route_reports(&net).await;
        let resent: u64 = after.iter().map(|r| r.retransmitted).sum();
        let nacks: u64 = after.iter().map(|r| r.nacks).sum();
        assert!(resent > 0 && nacks > 0, "no repair under loss: {after:?}");
        net.shutdown().await;
    });
    common::assert_no_session_left();
}

/// 200 MiB to 16 hosts over the UDP route (about a minute and 3.2 GB of writes on
/// two cores): `cargo test --test e2e -- --ignored cluster_udp::`.
#[test]
#[ignore = "long: 200 MiB to 16 hosts; run with --ignored"]
fn two_hundred_megabytes_arrive_byte_identical_at_sixteen_hosts() {
    let Some(cluster) = Cluster::up("tcv") else { return };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let dir = TestDir::new("udp-cluster-big");
        let mut net = launch(&cluster, &dir, &[]).await;
        let data = random_bytes(200 << 20);
        let started = std::time::Instant::now();
        send_and_check(&mut net, &dir, "big", &data, 1 << 20).await;
        let routes = route_reports(&net).await;
        eprintln!("200 MiB to {HOSTS} hosts in {:.2} s; routes: {routes:?}", started.elapsed().as_secs_f64());
        net.shutdown().await;
    });
    common::assert_no_session_left();
}
