//! The routes end to end: the multicast route over UDP (`--route udp`) on loopback,
//! where every node multicasts its large downstream frames to its children through
//! the loopback interface and the links carry placeholders in their place; and
//! `treecast bench route` and `bench bcast` from the command line, the UDP multicast
//! protocol in the simulated LAN included.
//!
//! All back-ends share this host's file system, so each runs in a directory of its
//! own and writes through `/proc/self/cwd`: every rank writes its own copy.

use std::path::PathBuf;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::copies::{assert_copies, own_dirs, route_reports, send_to_own_dirs};
use crate::common::{assert_no_leftovers, random_bytes, TestDir};
use treecast::apps::protocol::{TAG_ADD_RANK, TAG_DIE};
use treecast_api::{
    ApiError, Network, NetworkBuilder, RankSet, RouteChoice, StreamOptions, Topology, TransformKind, Value,
};
use treecast_files::{bcast_files, FileEntry, FileOptions, FileReport, Outcome, Progress};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(60);

/// A network of `backends` ranks shaped by `spec`, each rank in its own directory
/// under `dir`, multicasting with these UDP settings.
async fn launch(dir: &TestDir, spec: &str, backends: usize, settings: &[(&str, &str)]) -> Network {
    launch_with(dir, spec, backends, settings, "").await
}

/// [`launch`], each back-end's shell running `prelude` first.
async fn launch_with(
    dir: &TestDir,
    spec: &str,
    backends: usize,
    settings: &[(&str, &str)],
    prelude: &str,
) -> Network {
    let script = own_dirs(dir, backends, TREECAST, prelude);
    let topo = Topology::from_spec(spec, Some(backends)).unwrap();
    let mut builder = NetworkBuilder::new(topo)
        .treecast_path(TREECAST)
        .startup_timeout(LIMIT)
        .backend_command(["/bin/sh", "-c", &script])
        .udp_route(true);
    for (k, v) in settings {
        builder = builder.udp_setting(*k, *v);
    }
    builder.launch().await.unwrap()
}

async fn finish(net: Network) {
    let needle = format!("TREECAST_SESSION={}", net.session());
    net.shutdown().await;
    assert_no_leftovers(&needle);
}

async fn send(net: &mut Network, dir: &TestDir, name: &str, data: &[u8], chunk: usize) -> FileReport {
    send_to_own_dirs(net, dir, name, data, chunk, LIMIT).await
}

#[tokio::test]
async fn every_size_arrives_byte_identical_through_each_nodes_group() {
    let dir = TestDir::new("udp-sizes");
    // Chunks of any size go by multicast, so the small ones do too; fragments of
    // Ethernet's size, whatever loopback's MTU, so that the sizes below sit at a
    // fragment's edges.
    let settings = [("TREECAST_UDP_MIN_FRAME", "0"), ("TREECAST_UDP_FRAGMENT", "1432")];
    let mut net = launch(&dir, "kary:2", 4, &settings).await;
    // Chunk frames of 1 B, one fragment's payload, one more byte, and several fragments.
    for (i, size) in [0usize, 1, 1432 - 28, 1432 - 27, 3_000_017].into_iter().enumerate() {
        let data = random_bytes(size);
        let name = format!("file{i}");
        let report = send(&mut net, &dir, &name, &data, 64 << 10).await;
        assert!(report.ok(), "{report:?}");
        assert_eq!(report.ranks_with(Outcome::Written), RankSet::range(0, 4), "{report:?}");
        assert_copies(&dir, 0..4, &name, &data);
    }
    let routes = route_reports(&net).await;
    // kary:2 over 4 back-ends: the front-end (0) feeds comm nodes 1 and 4, which feed
    // back-ends 2, 3 and 5, 6.
    let groups: Vec<(u32, Vec<u32>, Vec<u32>)> =
        routes.iter().map(|r| (r.node, r.udp_children.clone(), r.tcp_children.clone())).collect();
    assert_eq!(groups, [(0, vec![1, 4], vec![]), (1, vec![2, 3], vec![]), (4, vec![5, 6], vec![])]);
    for r in &routes {
        assert!(r.frames > 0 && r.fragments >= r.frames && r.messages > 0, "{r:?}");
        // Each node's own group in 239.255.0.0/16.
        assert!(r.group.starts_with("239.255."), "{r:?}");
    }
    finish(net).await;
}

/// Frames the network's nodes multicast so far.
async fn frames_multicast(net: &Network) -> u64 {
    route_reports(net).await.iter().map(|r| r.frames).sum()
}

/// Sends three requests on `s` and checks the sums of 4 ranks' answers.
async fn add_ranks(s: &mut treecast_api::Stream) {
    for round in 0..3 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(round)]).await.unwrap();
        let p = s.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(p.values().unwrap()[0].as_i64(), Some(i64::from(4 * round + 6)), "round {round}");
    }
}

/// On a network that multicasts every frame, a stream that chose tcp sends its
/// frames over the links (the groups' counts do not move) and one that chose udp
/// multicasts them; on a network without groups, udp and striped are refused.
#[tokio::test]
async fn a_stream_that_chose_tcp_goes_over_the_links_and_one_that_chose_udp_multicasts() {
    let dir = TestDir::new("udp-stream-route");
    let net = launch(&dir, "kary:2", 4, &[("TREECAST_UDP_MIN_FRAME", "0")]).await;
    let all = net.communicator(RankSet::range(0, 4)).unwrap();
    let sum = |route| StreamOptions { route, ..StreamOptions::reduce(TransformKind::Sum) };
    let before = frames_multicast(&net).await;
    let mut tcp = net.new_stream(&all, sum(RouteChoice::Tcp)).await.unwrap();
    add_ranks(&mut tcp).await;
    assert_eq!(frames_multicast(&net).await, before, "the tcp stream's frames went by multicast");
    let mut udp = net.new_stream(&all, sum(RouteChoice::Udp)).await.unwrap();
    add_ranks(&mut udp).await;
    // Three requests, multicast by the front-end and by both comm nodes.
    assert!(frames_multicast(&net).await >= before + 9, "the udp stream's frames went over the links");
    add_ranks(&mut tcp).await;
    finish(net).await;

    let topo = Topology::from_spec("flat", Some(2)).unwrap();
    let net = NetworkBuilder::new(topo).treecast_path(TREECAST).launch().await.unwrap();
    let all = net.communicator(RankSet::range(0, 2)).unwrap();
    for route in [RouteChoice::Udp, RouteChoice::Striped] {
        let err = net.new_stream(&all, sum(route)).await.unwrap_err();
        assert!(matches!(err, ApiError::RouteNotCarried { .. }), "{err}");
        assert!(err.to_string().contains(&format!("--route {route}")), "{err}");
    }
    let tcp = net.new_stream(&all, sum(RouteChoice::Tcp)).await.unwrap();
    tcp.send(TAG_ADD_RANK, "%d", &[Value::Int(1)]).await.unwrap();
    assert_eq!(tcp.recv_timeout(LIMIT).await.unwrap().values().unwrap()[0].as_i64(), Some(3));
    finish(net).await;
}

#[tokio::test]
async fn at_one_five_and_twenty_percent_loss_every_byte_arrives() {
    for (loss, seed) in [("0.01", "1"), ("0.05", "2"), ("0.2", "3")] {
        let dir = TestDir::new("udp-loss");
        let drop = format!("{loss},{seed}");
        // Ethernet-sized fragments (loopback's MTU would make 46 of them): enough
        // datagrams for 1 % to drop some.
        let settings = [("TREECAST_UDP_DROP", drop.as_str()), ("TREECAST_UDP_FRAGMENT", "1432")];
        let mut net = launch(&dir, "flat", 4, &settings).await;
        let data = random_bytes(2 << 20);
        let report = send(&mut net, &dir, "copy", &data, 256 << 10).await;
        assert!(report.ok(), "loss {loss}: {report:?}");
        assert_copies(&dir, 0..4, "copy", &data);
        let routes = route_reports(&net).await;
        assert_eq!(routes.len(), 1, "{routes:?}");
        let r = &routes[0];
        assert_eq!(r.udp_children, [1, 2, 3, 4]);
        assert!(r.frames > 0, "loss {loss}: {r:?}");
        assert!(r.not_sent > 0 && r.retransmitted > 0, "loss {loss}: the knob dropped nothing: {r:?}");
        finish(net).await;
    }
}

/// Many messages under way at once (small chunks, a window of 16 messages) while
/// the knob drops 5 % of the datagrams: repairs of older messages interleave with
/// later ones, and every byte still arrives, in order, at every rank.
#[tokio::test]
async fn several_messages_in_flight_at_five_percent_loss_every_byte_arrives() {
    let dir = TestDir::new("udp-in-flight");
    let settings = [
        ("TREECAST_UDP_DROP", "0.05,4"),
        ("TREECAST_UDP_FRAGMENT", "1432"),
        ("TREECAST_UDP_IN_FLIGHT", "16"),
        ("TREECAST_UDP_MIN_FRAME", "0"),
    ];
    let mut net = launch(&dir, "flat", 4, &settings).await;
    let data = random_bytes((3 << 20) + 17);
    let report = send(&mut net, &dir, "copy", &data, 32 << 10).await;
    assert!(report.ok(), "{report:?}");
    assert_copies(&dir, 0..4, "copy", &data);
    let routes = route_reports(&net).await;
    let r = &routes[0];
    assert_eq!(r.udp_children, [1, 2, 3, 4]);
    assert!(r.messages > 16, "several windows of messages: {r:?}");
    assert!(r.not_sent > 0 && r.retransmitted > 0, "the knob dropped nothing: {r:?}");
    finish(net).await;
}

#[tokio::test]
async fn a_rank_killed_mid_transfer_is_lost_and_the_others_complete() {
    let dir = TestDir::new("udp-killed");
    let net = launch(&dir, "flat", 4, &[]).await;
    let src = dir.path("big");
    let data = random_bytes(24 << 20);
    std::fs::write(&src, &data).unwrap();
    let comm = net.broadcast_communicator();
    let killer = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let seen = sent.clone();
    let entry = [FileEntry::file(&src, Some(PathBuf::from("/proc/self/cwd/copy")))];
    let options = FileOptions { chunk: 256 << 10, ..FileOptions::default() };
    let transfer = bcast_files(&net, &comm, &entry, &options, |p| {
        if let Progress::Sent { sent, .. } = p {
            seen.store(sent, Ordering::Relaxed)
        }
    });
    let kill = async {
        while sent.load(Ordering::Relaxed) < (2 << 20) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        killer.send(TAG_DIE, "%ad", &[Value::IntArray(vec![2])]).await.unwrap();
    };
    let (reports, ()) = tokio::time::timeout(LIMIT, async { tokio::join!(transfer, kill) }).await.unwrap();
    let report = reports.unwrap().pop().unwrap();
    assert_eq!(report.lost_ranks(), RankSet::single(2), "{report:?}");
    let others = RankSet::range(0, 4).difference(&RankSet::single(2));
    assert_eq!(report.ranks_with(Outcome::Written), others, "{report:?}");
    assert_copies(&dir, [0, 1, 3], "copy", &data);
    let routes = route_reports(&net).await;
    assert!(routes[0].frames > 0, "nothing went by multicast: {routes:?}");
    finish(net).await;
}

/// A member that never answers (the drop knob at 100 % in its own environment) is
/// given up by the sender after the silent limit and reported lost; its siblings,
/// which wait longer for their placeholders while the sender lives, complete.
#[tokio::test]
async fn a_member_that_never_answers_is_lost_and_its_siblings_complete() {
    let dir = TestDir::new("udp-silent");
    let deaf = r#"if [ "$TREECAST_RANK" = 1 ]; then export TREECAST_UDP_DROP=1; fi;"#;
    let settings = [("TREECAST_UDP_SILENT_LIMIT_MS", "1000")];
    let mut net = launch_with(&dir, "flat", 3, &settings, deaf).await;
    let data = random_bytes(8 << 20);
    let report = send(&mut net, &dir, "copy", &data, 256 << 10).await;
    assert_eq!(report.lost_ranks(), RankSet::single(1), "{report:?}");
    assert!(report.lost[0].1.contains("silent for 1.0 s"), "lost for its silence: {report:?}");
    let others = RankSet::range(0, 3).difference(&RankSet::single(1));
    assert_eq!(report.ranks_with(Outcome::Written), others, "{report:?}");
    assert_copies(&dir, [0, 2], "copy", &data);
    finish(net).await;
}

// ---- the route benchmarks from the command line ----

/// The JSON rows of `treecast bench route --sim` with these flags.
fn rows(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(TREECAST).args(["bench", "route", "--sim", "--json"]).args(args).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

#[test]
fn the_simulated_route_benchmark_prints_a_row_per_group_and_size_and_delivers_under_loss() {
    let args = ["--receivers", "1,4", "--sizes", "1,64K", "--loss", "0.05"];
    let rows = rows(&args);
    let shape: Vec<(u64, u64)> =
        rows.iter().map(|r| (r["receivers"].as_u64().unwrap(), r["bytes"].as_u64().unwrap())).collect();
    assert_eq!(shape, [(1, 1), (1, 65536), (4, 1), (4, 65536)]);
    for r in &rows {
        assert_eq!(r["lost"], 0, "{r}");
        assert!(r["time_us"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["fragments_per_fragment"].as_f64().unwrap() >= 1.0, "{r}");
    }
    // The same seed gives the same virtual figures.
    assert_eq!(self::rows(&args), rows);
}

/// On real sockets: a TCP and a UDP row per size, the UDP rows multicast every
/// message and carry their ratio to the TCP row of the same run.
#[test]
fn the_live_route_benchmark_times_both_routes_and_the_udp_rows_multicast() {
    let out = Command::new(TREECAST)
        .args(["bench", "route", "--json", "--receivers", "2", "--sizes", "1,64K", "--rounds", "2"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let rows: Vec<serde_json::Value> =
        String::from_utf8(out.stdout).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let shape: Vec<(&str, u64)> =
        rows.iter().map(|r| (r["route"].as_str().unwrap(), r["bytes"].as_u64().unwrap())).collect();
    assert_eq!(shape, [("tcp", 1), ("tcp", 65536), ("udp", 1), ("udp", 65536)]);
    for r in &rows {
        assert!(r["rtt_us"].as_f64().unwrap() > 0.0 && r["rate_mb_s"].as_f64().unwrap() > 0.0, "{r}");
        let sent = r["rounds"].as_u64().unwrap() + r["messages"].as_u64().unwrap();
        if r["route"] == "udp" {
            assert_eq!(r["multicast"].as_u64().unwrap(), sent, "every message multicast, once: {r}");
            assert!(r["rtt_vs_tcp"].as_f64().unwrap() > 0.0, "{r}");
        } else {
            assert_eq!(r["multicast"], 0, "{r}");
        }
    }
}

#[test]
fn the_route_benchmark_says_which_flag_is_wrong() {
    let run = |args: &[&str]| {
        let out = Command::new(TREECAST).args(["bench", "route"]).args(args).output().unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    assert!(run(&["--sim", "--route", "tcp"]).contains("models the UDP multicast route only"));
    assert!(run(&["--sim", "--sizes", "big"]).contains("write 4096, 64K or 1M"));
    assert!(run(&["--sim", "--loss", "1.5"]).contains("--loss 1.5 must be at least 0 and below 1"));
    assert!(run(&["--sim", "--receivers", "0"]).contains("group sizes from 1 to 1024"));
}

/// The warm transfer benchmark: the file goes `--runs` times over the running tree,
/// by multicast with --route udp, and the route's counts come with the times.
#[test]
fn the_bcast_benchmark_times_warm_transfers_and_reports_the_route() {
    let out = Command::new(TREECAST)
        .args(["bench", "bcast", "--local", "2", "--topology", "flat", "--route", "udp"])
        .args(["--size", "2", "--runs", "2", "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let b: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(b["backends"], 2, "{b}");
    assert_eq!(b["bytes"], 2 << 20, "{b}");
    assert_eq!(b["runs_s"].as_array().unwrap().len(), 2, "{b}");
    let route = &b["routes"][0];
    assert_eq!(route["udp_children"], serde_json::json!([1, 2]), "{b}");
    // Two runs of two 1 MiB chunks, each multicast once.
    assert_eq!(route["frames"], 4, "{b}");
    assert!(b["fragments_per_fragment"].as_f64().unwrap() >= 1.0, "{b}");
    // The reference measured in the same run: the same transfers over TCP.
    let (tcp, ratio) = (b["tcp_median_s"].as_f64().unwrap(), b["vs_tcp"].as_f64().unwrap());
    assert!(tcp > 0.0 && (ratio - b["median_s"].as_f64().unwrap() / tcp).abs() < 1e-9, "{b}");
    // The floor of a local tree, in the same run: as many processes copying and syncing the file.
    let (floor, vs_floor) = (b["floor_median_s"].as_f64().unwrap(), b["vs_floor"].as_f64().unwrap());
    assert!(floor > 0.0 && (vs_floor - b["median_s"].as_f64().unwrap() / floor).abs() < 1e-9, "{b}");
}

/// A bad `TREECAST_UDP_*` value stops the launch, naming the variable and its range,
/// before any process starts.
#[test]
fn a_bad_udp_setting_stops_the_launch_and_names_the_variable() {
    let out = Command::new(TREECAST)
        .args(["run", "--local", "2", "--route", "udp", "--", "true"])
        .env("TREECAST_UDP_FRAGMENT", "9")
        .output()
        .unwrap();
    assert!(!out.status.success(), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("TREECAST_UDP_FRAGMENT=\"9\": write a whole number from 64 to 65000"), "{err}");
}
