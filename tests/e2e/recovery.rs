//! Failures on real trees: back-ends and comm nodes killed or stopped mid-stream, the
//! orphans of a lost comm node rejoining its parent, and chaos runs (`treecast bench
//! chaos`) striking at random, in real processes and in the simulated tree.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::local::*;
use crate::common::tree::finish;
use crate::common::{commnode_pid, processes_with_env};
use treecast::apps::protocol::*;
use treecast_api::{ApiError, Event, Network, RankSet, StreamOptions, Topology, TransformKind, Value};

#[tokio::test]
async fn a_backend_dying_mid_wave_completes_it_with_the_survivors() {
    let net = launch("balanced:2x4", 8).await;
    let s = sum_stream(&net).await;
    s.send(TAG_DIE, "%ad", &[Value::IntArray(vec![5])]).await.unwrap();
    let p = s.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(int(&p), (0..8).sum::<i64>() - 5);
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::single(5));
            // Pre-order: 0 front-end, 1 comm node (ranks 0-3), 6 comm node (ranks 4-7, nodes 7-10).
            let name = "comm node localhost (node 6): link to back-end rank 5 on localhost (node 8)";
            assert!(reason.starts_with(name), "{reason}");
            // Regression: the reason was only "link … closed", without how the process ended.
            assert!(reason.ends_with("; the process exited with status 3"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    // Later waves go on without the lost rank.
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), (0..8).sum::<i64>() - 5);
    finish(net).await;
}

#[tokio::test]
async fn with_recovery_off_a_comm_node_killed_loses_its_subtree_and_the_rest_goes_on() {
    let topo = Topology::from_spec("balanced:2x3", Some(6)).unwrap();
    let net = builder(topo).rejoin_within(None).launch().await.unwrap();
    let s = sum_stream(&net).await;
    // Pre-order ids: 0 front-end, 1 first comm node (ranks 0-2), 5 second comm node (ranks 3-5).
    let pid = commnode_pid(net.session(), 5);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::range(3, 3));
            assert!(reason.starts_with("front-end: link to comm node localhost (node 5) "), "{reason}");
            assert!(reason.ends_with("; the process was killed by signal 9"), "{reason}");
            let shown = Event::RanksLost { ranks, reason }.to_string();
            assert!(shown.starts_with("lost ranks 3-5: front-end: link to comm node"), "{shown}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 30 + 3);
    finish(net).await;
}

/// Rejoin limit of the recovery tests.
const REJOIN: Duration = Duration::from_secs(10);

async fn launch_recovering(spec: &str, backends: usize) -> Network {
    let topo = Topology::from_spec(spec, Some(backends)).unwrap();
    builder(topo).rejoin_within(Some(REJOIN)).launch().await.unwrap()
}

/// Sum of `x + rank` over `ranks`.
fn sum_over(x: i32, ranks: std::ops::Range<i32>) -> i64 {
    ranks.map(|r| i64::from(x + r)).sum()
}

/// The next event that is not about the clock or a filter, within the limit.
async fn next_membership_event(net: &mut Network) -> Event {
    loop {
        match tokio::time::timeout(LIMIT, net.next_event()).await {
            Ok(Some(
                e @ (Event::NodeLost { .. } | Event::RanksRejoined { .. } | Event::RanksLost { .. }),
            )) => return e,
            Ok(Some(_)) => continue,
            other => panic!("no membership event within {LIMIT:?}: {other:?}"),
        }
    }
}

/// A back-end's silence and rejoin limits come from its plan: variables in its
/// environment that say otherwise (a silence limit of 1 ms, recovery off) change nothing.
#[tokio::test]
async fn backends_keep_the_plans_limits_whatever_their_environment_says() {
    let topo = Topology::from_spec("balanced:2x3", Some(6)).unwrap();
    let mut net = builder(topo)
        .rejoin_within(Some(REJOIN))
        .env("TREECAST_DEAD_AFTER", "0.001")
        .env("TREECAST_REJOIN_WITHIN", "0")
        .launch()
        .await
        .unwrap();
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(10, 0..6));
    // Pre-order ids: 0 front-end, 1 first comm node (ranks 0-2), 5 second comm node (ranks 3-5).
    let pid = commnode_pid(net.session(), 5);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    match next_membership_event(&mut net).await {
        Event::NodeLost { ranks, .. } => assert_eq!(ranks, RankSet::range(3, 3)),
        other => panic!("expected NodeLost, got {other:?}"),
    }
    let mut back = RankSet::new();
    while back != RankSet::range(3, 3) {
        match next_membership_event(&mut net).await {
            Event::RanksRejoined { ranks, .. } => back.union_with(&ranks),
            other => panic!("expected RanksRejoined, got {other:?}"),
        }
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(20)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(20, 0..6));
    assert!(net.lost().ranks().is_empty(), "{:?}", net.lost());
    finish(net).await;
}

#[tokio::test]
async fn a_level_one_comm_node_killed_mid_stream_its_sub_tree_rejoins_and_sums_go_on() {
    // Pre-order ids of balanced:2x2x2: 0 front-end; 1 comm node (ranks 0-3) over comm
    // nodes 2 (ranks 0-1) and 5 (ranks 2-3); 8 comm node (ranks 4-7).
    let mut net = launch_recovering("balanced:2x2x2", 8).await;
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(10, 0..8));
    let before = backend_pids(net.session());
    // Waves in flight when node 1 dies complete with all ranks or with the survivors.
    for x in 1..=20 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
    }
    let pid = commnode_pid(net.session(), 1);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    for x in 1..=20 {
        let sum = int(&s.recv_timeout(LIMIT).await.unwrap());
        assert!(sum == sum_over(x, 0..8) || sum == sum_over(x, 4..8), "wave {x}: {sum}");
    }
    match next_membership_event(&mut net).await {
        Event::NodeLost { node, ranks, reason } => {
            assert_eq!(node, "comm node localhost (node 1)");
            assert_eq!(ranks, RankSet::range(0, 4));
            assert!(reason.starts_with("front-end: link to comm node localhost (node 1)"), "{reason}");
        }
        other => panic!("expected NodeLost, got {other:?}"),
    }
    let mut back = RankSet::new();
    while back != RankSet::range(0, 4) {
        match next_membership_event(&mut net).await {
            Event::RanksRejoined { ranks, parent } => {
                assert_eq!(parent, "front-end");
                back.union_with(&ranks);
            }
            other => panic!("expected RanksRejoined, got {other:?}"),
        }
    }
    // The next waves include every rank again: the same processes, not new ones.
    for x in 30..40 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
        assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(x, 0..8), "wave {x}");
    }
    assert_eq!(backend_pids(net.session()), before);
    assert!(net.lost().ranks().is_empty(), "{:?}", net.lost());
    finish(net).await;
}

/// The front-end's only comm node killed: every rank of the stream is cut off at
/// once. Each request in flight gets its full answer or, when no rank is left to
/// answer it, `ApiError::NoAnswer` (never a wait past the limit); the stream goes on
/// and, once the orphans are back, every rank answers again.
#[tokio::test]
async fn when_every_rank_is_orphaned_at_once_waves_in_flight_end_and_the_stream_goes_on() {
    let text =
        "localhost:0 => localhost:1 ;\nlocalhost:1 => localhost:2 localhost:3 localhost:4 localhost:5 ;\n";
    let topo = Topology::parse(text).unwrap();
    let mut net = builder(topo).rejoin_within(Some(REJOIN)).launch().await.unwrap();
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(0, 0..4));
    for x in 1..=20 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
    }
    let pid = commnode_pid(net.session(), 1);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    for x in 1..=20 {
        match s.recv_timeout(LIMIT).await {
            Ok(p) => assert_eq!(int(&p), sum_over(x, 0..4), "wave {x}"),
            Err(ApiError::NoAnswer(id)) => assert_eq!(id, s.id()),
            Err(e) => panic!("wave {x}: {e}"),
        }
    }
    let mut back = RankSet::new();
    while back != RankSet::range(0, 4) {
        match next_membership_event(&mut net).await {
            Event::NodeLost { ranks, .. } => assert_eq!(ranks, RankSet::range(0, 4)),
            Event::RanksRejoined { ranks, .. } => back.union_with(&ranks),
            other => panic!("expected NodeLost or RanksRejoined, got {other:?}"),
        }
    }
    for x in 30..40 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await.unwrap();
        assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(x, 0..4), "wave {x}");
    }
    assert!(net.lost().ranks().is_empty(), "{:?}", net.lost());
    finish(net).await;
}

#[tokio::test]
async fn a_level_two_comm_node_killed_its_back_ends_rejoin_its_parent_and_a_new_stream_reaches_them() {
    let mut net = launch_recovering("balanced:2x2x2", 8).await;
    let s = sum_stream(&net).await;
    // Node 9 is the comm node of ranks 4-5, under node 8.
    let pid = commnode_pid(net.session(), 9);
    Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    match next_membership_event(&mut net).await {
        Event::NodeLost { node, ranks, .. } => {
            assert_eq!((node.as_str(), ranks), ("comm node localhost (node 9)", RankSet::range(4, 2)));
        }
        other => panic!("expected NodeLost, got {other:?}"),
    }
    let mut back = RankSet::new();
    while back != RankSet::range(4, 2) {
        match next_membership_event(&mut net).await {
            Event::RanksRejoined { ranks, parent } => {
                assert_eq!(parent, "comm node localhost (node 8)");
                let shown = Event::RanksRejoined { ranks: ranks.clone(), parent }.to_string();
                assert!(shown.contains("rejoined under comm node localhost (node 8)"), "{shown}");
                back.union_with(&ranks);
            }
            other => panic!("expected RanksRejoined, got {other:?}"),
        }
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(1)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(1, 0..8));
    let fresh = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    fresh.send(TAG_ADD_RANK, "%d", &[Value::Int(2)]).await.unwrap();
    assert_eq!(int(&fresh.recv_timeout(LIMIT).await.unwrap()), sum_over(2, 0..8));
    finish(net).await;
}

#[tokio::test]
async fn a_stopped_comm_node_is_cut_off_and_its_back_ends_rejoin() {
    let topo = Topology::from_spec("balanced:2x3", Some(6)).unwrap();
    let builder = builder(topo).dead_after(Some(Duration::from_secs(2))).rejoin_within(Some(REJOIN));
    let mut net = builder.launch().await.unwrap();
    let s = sum_stream(&net).await;
    let pid = commnode_pid(net.session(), 5);
    Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(10, 0..3));
    match next_membership_event(&mut net).await {
        Event::NodeLost { ranks, reason, .. } => {
            assert_eq!(ranks, RankSet::range(3, 3));
            assert!(reason.contains("nothing arrived for"), "{reason}");
        }
        other => panic!("expected NodeLost, got {other:?}"),
    }
    let mut back = RankSet::new();
    while back != RankSet::range(3, 3) {
        match next_membership_event(&mut net).await {
            Event::RanksRejoined { ranks, .. } => back.union_with(&ranks),
            other => panic!("expected RanksRejoined, got {other:?}"),
        }
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(20)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), sum_over(20, 0..6));
    // The stopped node was killed by its parent: nothing is left behind.
    finish(net).await;
}

/// Back-end pids of a session (the processes running `treecast backend`).
fn backend_pids(session: &str) -> Vec<u32> {
    processes_with_env(&format!("TREECAST_SESSION={session}"))
        .into_iter()
        .filter(|p| std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.ends_with(b"backend\0")))
        .collect()
}

#[tokio::test]
async fn with_recovery_off_a_stopped_comm_node_is_cut_off_after_the_silence_limit_and_the_rest_goes_on() {
    let topo = Topology::from_spec("balanced:2x3", Some(6)).unwrap();
    let builder = builder(topo).dead_after(Some(Duration::from_secs(2))).rejoin_within(None);
    let net = builder.launch().await.unwrap();
    let s = sum_stream(&net).await;
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 60 + 15);
    // Comm node 5 (ranks 3-5) stops: it neither reads nor writes, its links stay open.
    let pid = commnode_pid(net.session(), 5);
    let below = backend_pids(net.session());
    Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    // The wave completes with the live ranks once the stopped node is cut off.
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 30 + 3);
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::range(3, 3));
            assert!(reason.contains("nothing arrived for"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 30 + 3);
    // Its back-ends lost their parent's heartbeats too and left on their own.
    let deadline = Instant::now() + LIMIT;
    while below.iter().filter(|p| !common::is_zombie(Path::new(&format!("/proc/{p}")))).count() > 3 {
        assert!(Instant::now() < deadline, "the stopped node's back-ends are still running");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Resumed, it finds its links closed and ends: nothing is left behind.
    Command::new("kill").args(["-CONT", &pid.to_string()]).status().unwrap();
    finish(net).await;
}

#[tokio::test]
async fn a_stopped_backend_is_cut_off_but_a_busy_one_is_not() {
    let topo = Topology::from_spec("flat", Some(3)).unwrap();
    let net = builder(topo).dead_after(Some(Duration::from_secs(2))).launch().await.unwrap();
    let s = sum_stream(&net).await;
    // Rank 1 stops reading for 3 s but its driver runs: its heartbeats keep it in.
    s.send(TAG_STALL, "%ad %d", &[Value::IntArray(vec![1]), Value::Int(3000)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 3);
    assert!(net.lost_ranks().is_empty(), "a busy tool is not a hung node");
    let pids = backend_pids(net.session());
    assert_eq!(pids.len(), 3);
    for pid in &pids {
        Command::new("kill").args(["-STOP", &pid.to_string()]).status().unwrap();
    }
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { reason, .. }) => assert!(reason.contains("nothing arrived for"), "{reason}"),
        other => panic!("expected RanksLost, got {other:?}"),
    }
    for pid in &pids {
        Command::new("kill").args(["-CONT", &pid.to_string()]).status().unwrap();
    }
    finish(net).await;
}

#[test]
fn chaos_runs_kill_and_stop_nodes_without_hangs_wrong_answers_or_leftovers() {
    let t = tag();
    let out = treecast(
        &t,
        &[
            "bench",
            "chaos",
            "--local",
            "8",
            "--topology",
            "kary:2",
            "--runs",
            "10",
            "--waves",
            "15",
            "--faults",
            "2",
            "--stop-fraction",
            "0.4",
            "--dead-after",
            "1",
            "--seed",
            "7",
            "--during",
            "reduce",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let totals = &report["totals"];
    assert_eq!(totals["faults"], 20, "{totals}");
    // Recovery is on by default: the orphans of the faulted comm nodes rejoin, and
    // none is reported lost. In one run of this seed a comm node and then its child
    // are stopped: the grandchildren's nearest fallback is stopped too, and they
    // rejoin at the next ancestor up.
    for key in ["hangs", "wrong", "left", "panics", "live_ranks_lost", "orphaned_ranks"] {
        assert_eq!(totals[key], 0, "{key}: {report}");
    }
    assert!(totals["rejoined_ranks"].as_u64().unwrap() > 0, "{totals}");
    assert!(totals["waves"].as_u64().unwrap() > 100, "{totals}");
    assert!(out.status.success());
}

#[test]
fn a_chaos_run_counts_every_orphan_of_a_killed_comm_node_once_it_has_rejoined() {
    // Regression: the run was counted while the orphans were still on their way back,
    // so killing a comm node showed 0 orphaned and 0 (or some) rejoined ranks.
    let t = tag();
    let out = treecast(
        &t,
        &[
            "bench",
            "chaos",
            "--local",
            "16",
            "--topology",
            "balanced:4x4",
            "--runs",
            "3",
            "--waves",
            "1",
            "--faults",
            "1",
            "--stop-fraction",
            "0",
            "--during",
            "reduce",
            "--seed",
            "8",
            "--json",
        ],
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let mut comm_node_kills = 0;
    for run in report["runs"].as_array().unwrap() {
        if run["faults"][0].as_str().unwrap().starts_with("SIGKILL comm node") {
            comm_node_kills += 1;
            // Each comm node of balanced:4x4 holds 4 back-ends; none was faulted itself.
            assert_eq!(run["rejoined_ranks"], 4, "{run}");
            assert_eq!(run["orphaned_ranks"], 0, "{run}");
        }
    }
    assert!(comm_node_kills > 0, "seed 8 no longer strikes a comm node: {report}");
    assert!(out.status.success());
}

#[test]
fn chaos_runs_strike_during_file_transfers_and_start_up_without_hangs_wrong_copies_or_leftovers() {
    let t = tag();
    let args: Vec<&str> = "bench chaos --local 8 --topology kary:2 --runs 6 --waves 5 --faults 2 \
         --dead-after 1 --file-size 1000000 --during bcast,startup --seed 7 --json"
        .split_whitespace()
        .collect();
    let out = treecast(&t, &args);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let totals = &report["totals"];
    for key in ["hangs", "wrong", "left", "panics", "live_ranks_lost"] {
        assert_eq!(totals[key], 0, "{key}: {report}");
    }
    let (bcast, startup) = (&totals["phases"]["bcast"], &totals["phases"]["startup"]);
    assert_eq!(bcast["runs"], 3, "{totals}");
    assert_eq!(startup["runs"], 3, "{totals}");
    // Every strike of a transfer lands (at a byte count it reaches); one of a start-up
    // lands unless the tree was up before its process was seen.
    assert_eq!(bcast["faults"], 6, "{totals}");
    assert!(startup["faults"].as_u64().unwrap() > 0, "{totals}");
    let runs = report["runs"].as_array().unwrap();
    assert!(runs.iter().all(|r| r["phase"] == "bcast" || r["phase"] == "startup"), "{report}");
    assert!(out.status.success());
}

#[test]
fn chaos_runs_in_the_simulated_tree_from_the_command_line() {
    let t = tag();
    let args =
        ["bench", "chaos", "--sim", "--runs", "20", "--waves", "10", "--faults", "2", "--max-nodes", "60"];
    let out = treecast(&t, &[&args[..], &["--seed", "3", "--json"]].concat());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)));
    let totals = &report["totals"];
    assert_eq!(totals["simulated"], true, "{totals}");
    assert_eq!(totals["runs"], 20, "{totals}");
    // Reduce runs strike before waves, always; start-up runs only while the tree starts.
    let reduce = &totals["phases"]["reduce"];
    assert_eq!(reduce["faults"].as_u64(), reduce["runs"].as_u64().map(|r| 2 * r), "{totals}");
    assert_eq!(reduce["runs"].as_u64().unwrap() + totals["phases"]["startup"]["runs"].as_u64().unwrap(), 20);
    for key in ["hangs", "wrong", "left", "panics", "live_ranks_lost"] {
        assert_eq!(totals[key], 0, "{key}: {report}");
    }
    assert_eq!(report["runs"][5]["sim"]["seed"], 8, "run k has seed + k");
    assert!(report["runs"].as_array().unwrap().iter().all(|r| r["sim"]["nodes"].as_u64().unwrap() <= 60));
    assert!(out.status.success());
    // The text form prints each of these few runs, then the totals.
    let out = treecast(&t, &args);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().filter(|l| l.starts_with("run ")).count(), 20, "{text}");
    assert!(text.lines().last().unwrap().starts_with("totals: "), "{text}");
}

#[tokio::test]
async fn a_stream_whose_members_are_all_lost_is_closed_not_hung() {
    let net = launch("flat", 3).await;
    let comm = net.communicator(RankSet::single(1)).unwrap();
    let s = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    s.send(TAG_DIE, "%ad", &[Value::IntArray(vec![1])]).await.unwrap();
    let err = s.recv_timeout(LIMIT).await.unwrap_err();
    assert!(matches!(err, ApiError::StreamClosed(_)), "{err}");
    finish(net).await;
}
