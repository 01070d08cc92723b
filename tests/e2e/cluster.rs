//! Multi-host tests on a test cluster of network namespaces (`tools/testcluster`),
//! each host with its own address, host name and sshd. They need root; without it
//! they show as ignored.
//!
//! One test function runs every scenario in turn on one cluster, because the
//! cluster is slow to build; a guard removes it even when a scenario fails.

use crate::common;
use crate::common::{random_bytes, TestDir};

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use treecast::apps::protocol::{RUN_ANSWER, RUN_REQUEST, TAG_ADD_RANK, TAG_RUN};
use treecast_api::{
    Event, NetworkBuilder, Placement, RankSet, SpawnOptions, SshOptions, StreamOptions, SyncMode, Topology,
    TransformKind, Value,
};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const PREFIX: &str = "tct";
const HOSTS: usize = 8;

struct Cluster {
    state: String,
    /// The sessions of this test, on its hosts and in the commands it runs here.
    sessions: common::OwnSessions,
}

impl Cluster {
    fn up() -> Option<Cluster> {
        let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        assert!(root, "the test cluster needs root (network namespaces), but the build ran as root: rebuild");
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/testcluster");
        let out =
            Command::new(&script).args(["up", &HOSTS.to_string(), "--prefix", PREFIX]).output().unwrap();
        assert!(out.status.success(), "testcluster up failed:\n{}", String::from_utf8_lossy(&out.stderr));
        let sessions = common::OwnSessions::watch(Some(PREFIX));
        Some(Cluster { state: format!("/tmp/treecast-testcluster-{PREFIX}"), sessions })
    }

    fn ssh_args(&self) -> String {
        format!("-F {}/ssh_config", self.state)
    }

    fn ssh(&self) -> SshOptions {
        SshOptions {
            args: self.ssh_args().split_whitespace().map(str::to_owned).collect(),
            remote_path: TREECAST.to_owned(),
            ..SshOptions::default()
        }
    }

    fn run(&self, args: &[&str]) -> Output {
        let (k, v) = self.sessions.tag();
        let out = Command::new(TREECAST)
            .env(k, v)
            .arg("run")
            .args(["--ssh-args", &self.ssh_args(), "--remote-path", TREECAST])
            .args(args)
            .output()
            .unwrap();
        common::assert_no_session_left();
        out
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tools/testcluster");
        let _ = Command::new(script).args(["down", "--prefix", PREFIX]).status();
        let left = Command::new("ip").args(["netns", "list"]).output().unwrap();
        let left = String::from_utf8_lossy(&left.stdout);
        if !std::thread::panicking() {
            assert!(!left.contains(&format!("treecast-{PREFIX}")), "namespaces left behind: {left}");
        }
    }
}

fn text(out: &Output) -> String {
    format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap().trim().to_owned()
}

#[test]
#[cfg_attr(not(has_root), ignore = "needs root (network namespaces, sshd per host)")]
fn multi_host_cluster() {
    let Some(cluster) = Cluster::up() else { return };

    // Every host answers with its own name, one group per host.
    let out = cluster.run(&["--hosts", &format!("{PREFIX}[1-{HOSTS}]"), "--", "hostname"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    for k in 1..=HOSTS {
        let rank = k - 1;
        assert!(
            stdout.contains(&format!("---- [{rank}] (1 rank) on {PREFIX}{k} ----\n{PREFIX}{k}\n")),
            "{stdout}"
        );
    }

    // A topology file alone, mixing names of this machine (started with fork/exec, on
    // each host: `127.0.0.1` under a remote comm node is that host's own loopback) and
    // remote hosts (started over ssh).
    let dir = TestDir::new("mixed");
    let file = dir.path("mixed.top");
    let fe = this_host();
    std::fs::write(
        &file,
        format!(
            "{fe}:0 => localhost:1 127.0.0.1:2 {fe}:3 {PREFIX}1:0 ;\n\
             {PREFIX}1:0 => {PREFIX}2:0 127.0.0.1:4 {PREFIX}1:5 ;\n"
        ),
    )
    .unwrap();
    let out = cluster.run(&["--topology", file.to_str().unwrap(), "--", "hostname"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", text(&out));
    assert!(
        stdout.contains(&format!("---- [0-2] (3 ranks) on localhost,127.0.0.1,{fe} ----\n{fe}\n")),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("---- [3] (1 rank) on {PREFIX}2 ----\n{PREFIX}2\n")), "{stdout}");
    assert!(
        stdout.contains(&format!("---- [4-5] (2 ranks) on 127.0.0.1,{PREFIX}1 ----\n{PREFIX}1\n")),
        "{stdout}"
    );

    // A depth-3 tree over ssh (front-end, 2 comm-node hosts, 3 back-end hosts each),
    // with dotted host names, sums correctly.
    let text_topo = format!(
        "{fe}:0 => {p}1:0 {p}5.cluster.test:0 ;\n{p}1:0 => {p}2.cluster.test:0 {p}3:0 {p}4:0 ;\n\
         {p}5.cluster.test:0 => {p}6:0 {p}7:0 {p}8.cluster.test:0 ;\n",
        fe = this_host(),
        p = PREFIX
    );
    let topo = Topology::parse(&text_topo).unwrap();
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let net =
            NetworkBuilder::new(topo).treecast_path(TREECAST).ssh(cluster.ssh()).launch().await.unwrap();
        assert_eq!((net.backends(), net.commnodes()), (6, 2));
        let s = net
            .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
            .await
            .unwrap();
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(100)]).await.unwrap();
        let p = s.recv_timeout(Duration::from_secs(30)).await.unwrap();
        assert_eq!(p.values().unwrap()[0].as_i64(), Some(600 + 15));
        net.shutdown().await;
    });
    common::assert_no_session_left();

    // An unreachable host is named with ssh's message; with --allow-missing the rest completes.
    let hosts = format!("{PREFIX}[1-3],nosuchhost");
    let out = cluster.run(&["--hosts", &hosts, "--", "hostname"]);
    assert_eq!(out.status.code(), Some(2), "{}", text(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("on nosuchhost") && err.contains("Could not resolve hostname"), "{err}");
    let out = cluster.run(&["--hosts", &hosts, "--allow-missing", "--json", "--", "hostname"]);
    assert_eq!(out.status.code(), Some(255), "a lost rank: the status ssh gives; {}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["classes"].as_array().unwrap().len(), 3);
    assert_eq!(report["lost"][0]["ranks"], "3");
    assert!(report["lost"][0]["reason"].as_str().unwrap().contains("nosuchhost"));

    // The same through the API: the missing rank is an event, waves go on without it.
    rt.block_on(async {
        let hosts: Vec<String> = vec![format!("{PREFIX}1"), "nosuchhost".into(), format!("{PREFIX}2")];
        let topo = Topology::from_hosts(&hosts, 2, 1, &this_host()).unwrap();
        let net = NetworkBuilder::new(topo)
            .treecast_path(TREECAST)
            .ssh(cluster.ssh())
            .allow_missing(true)
            .launch()
            .await
            .unwrap();
        match net.try_event() {
            Some(Event::RanksLost { ranks, reason }) => {
                assert_eq!(ranks, RankSet::single(1));
                assert!(reason.contains("nosuchhost"), "{reason}");
            }
            other => panic!("expected the missing rank as an event, got {other:?}"),
        }
        let s = net
            .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
            .await
            .unwrap();
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
        assert_eq!(
            s.recv_timeout(Duration::from_secs(30)).await.unwrap().values().unwrap()[0].as_i64(),
            Some(2)
        );
        net.shutdown().await;
    });
    common::assert_no_session_left();

    // Back-ends spawned on a host without a comm node start over ssh from a node of
    // the tree and join it; an unreachable host fails per process with ssh's message.
    rt.block_on(async {
        let hosts: Vec<String> = vec![format!("{PREFIX}1"), format!("{PREFIX}2")];
        let topo = Topology::from_hosts(&hosts, 2, 1, &this_host()).unwrap();
        let net =
            NetworkBuilder::new(topo).treecast_path(TREECAST).ssh(cluster.ssh()).launch().await.unwrap();
        let options = |host: &str| SpawnOptions {
            placement: Placement::Hosts(vec![host.to_owned()]),
            limit: Duration::from_secs(30),
            ..SpawnOptions::default()
        };
        let group = net.spawn(2, &[], &options(&format!("{PREFIX}3"))).await.unwrap();
        assert_eq!(group.ranks(), &[2, 3]);
        let opts = StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::reduce(TransformKind::Null) };
        let s = net.new_stream(&net.broadcast_communicator(), opts.clone()).await.unwrap();
        let request = [Value::StrArray(vec!["hostname".into()]), Value::ULong(10_000), Value::ULong(4096)];
        for rank in [2u32, 3] {
            s.send_to(rank, TAG_RUN, RUN_REQUEST, &request).await.unwrap();
            let p = s.recv_timeout(Duration::from_secs(30)).await.unwrap();
            let out = p.unpack(RUN_ANSWER).unwrap();
            assert_eq!(out[0].as_bytes().unwrap(), format!("{PREFIX}3\n").as_bytes(), "rank {}", p.rank());
        }
        let err = net.spawn(1, &[], &options("nosuchhost")).await.unwrap_err();
        assert!(err.to_string().contains("Could not resolve hostname"), "{err}");
        // Accepted there too: a process started over ssh by someone else joins
        // through the port file (the hosts share this file system).
        let dir = TestDir::new("accept-remote");
        let port = dir.path("tool.port");
        let outsider = async {
            while !port.exists() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            let ssh_args = cluster.ssh_args();
            let mut ssh = tokio::process::Command::new("ssh");
            ssh.args(ssh_args.split_whitespace()).arg(format!("{PREFIX}4"));
            ssh.arg(format!("{TREECAST} backend --attach {} --rank 0", port.display()));
            ssh.kill_on_drop(true).spawn().unwrap()
        };
        let there = options(&format!("{PREFIX}4"));
        let (accepted, mut child) = tokio::join!(net.accept(&port, 1, &there), outsider);
        assert_eq!(accepted.unwrap().ranks(), &[5]);
        // A stream made now reaches it (the one above was made before it joined).
        let s = net.new_stream(&net.broadcast_communicator(), opts.clone()).await.unwrap();
        s.send_to(5, TAG_RUN, RUN_REQUEST, &request).await.unwrap();
        let p = s.recv_timeout(Duration::from_secs(30)).await.unwrap();
        assert_eq!(p.unpack(RUN_ANSWER).unwrap()[0].as_bytes().unwrap(), format!("{PREFIX}4\n").as_bytes());
        net.shutdown().await;
        assert!(child.wait().await.unwrap().success(), "the accepted back-end ended badly");

        // A tree whose back-ends all run here has no listener for other hosts: a
        // spawn on one opens it then.
        let topo = Topology::from_spec("flat", Some(2)).unwrap();
        let net =
            NetworkBuilder::new(topo).treecast_path(TREECAST).ssh(cluster.ssh()).launch().await.unwrap();
        let group = net.spawn(1, &[], &options(&format!("{PREFIX}5"))).await.unwrap();
        let s = net.new_stream(&net.broadcast_communicator(), opts.clone()).await.unwrap();
        s.send_to(group.ranks()[0], TAG_RUN, RUN_REQUEST, &request).await.unwrap();
        let p = s.recv_timeout(Duration::from_secs(30)).await.unwrap();
        assert_eq!(p.unpack(RUN_ANSWER).unwrap()[0].as_bytes().unwrap(), format!("{PREFIX}5\n").as_bytes());
        net.shutdown().await;
    });
    common::assert_no_session_left();

    // `treecast bcast` of a 20 MB file over ssh to every host. The hosts share this
    // file system, so each rank either writes the file or finds it already written
    // by a faster rank (same size and mtime: skipped-shared).
    let dir = TestDir::new("bcast");
    let src = dir.path("src.bin");
    let data = random_bytes(20 << 20);
    std::fs::write(&src, &data).unwrap();
    let out_dir = dir.path("out");
    std::fs::create_dir(&out_dir).unwrap();
    let out = Command::new(TREECAST)
        .arg("bcast")
        .args([src.to_str().unwrap(), out_dir.to_str().unwrap(), "--json"])
        .args(["--hosts", &format!("{PREFIX}[1-{HOSTS}]")])
        .args(["--ssh-args", &cluster.ssh_args(), "--remote-path", TREECAST])
        .output()
        .unwrap();
    common::assert_no_session_left();
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], true, "{report}");
    assert_eq!(report["backends"], HOSTS, "{report}");
    let mut ranks = 0;
    let mut written = 0;
    for class in report["classes"].as_array().unwrap() {
        let outcome = class["outcome"].as_str().unwrap();
        assert!(outcome == "written" || outcome == "skipped-shared", "{report}");
        ranks += class["count"].as_u64().unwrap();
        if outcome == "written" {
            written += class["count"].as_u64().unwrap();
        }
    }
    assert_eq!(ranks, HOSTS as u64, "{report}");
    assert!(written >= 1, "{report}");
    assert!(std::fs::read(out_dir.join("src.bin")).unwrap() == data, "the copy differs from the source");
    let left: Vec<_> = std::fs::read_dir(&out_dir).unwrap().flatten().map(|e| e.file_name()).collect();
    assert_eq!(left.len(), 1, "temporary files left: {left:?}");
    drop(dir);
}
