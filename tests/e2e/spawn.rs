//! Processes started while the tree runs: real comm nodes and back-ends on loopback.
//!
//! Every test checks that no process of its network is left behind, by looking
//! for its session id in the environment of every process.

use crate::common;
use crate::common::tree::{finish, launch};

use std::time::Duration;

use crate::common::processes_with_env;
use treecast::apps::protocol::*;
use treecast_api::{
    ApiError, Event, Group, JoinMode, Network, Placement, RankSet, SpawnOptions, StreamOptions, SyncMode,
    TransformKind, Value,
};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(20);

/// The sum of `TAG_ADD_RANK` over `ranks`, once: what the back-ends of a stream answer.
async fn sum_over(net: &Network, ranks: RankSet) -> i64 {
    let comm = net.communicator(ranks).unwrap();
    let s = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    let p = s.recv_timeout(LIMIT).await.unwrap();
    p.values().unwrap()[0].as_i64().unwrap()
}

fn ranks_sum(ranks: &[u32]) -> i64 {
    ranks.iter().map(|&r| i64::from(r)).sum()
}

/// Pids of this session's processes whose environment also holds `needle`.
fn session_processes(net: &Network, needle: &str) -> Vec<u32> {
    let session = processes_with_env(&format!("TREECAST_SESSION={}", net.session()));
    processes_with_env(needle).into_iter().filter(|p| session.contains(p)).collect()
}

/// Waits until no process of this session holds `needle`; fails naming those left.
/// (Asynchronously: the front-end's driver runs on this test's thread.)
async fn wait_until_gone(net: &Network, needle: &str) {
    let deadline = tokio::time::Instant::now() + LIMIT;
    loop {
        let left = session_processes(net, needle);
        if left.is_empty() {
            return;
        }
        if tokio::time::Instant::now() > deadline {
            let described: Vec<String> = left.iter().map(|pid| common::describe(*pid)).collect();
            panic!("processes with {needle} still running: {}", described.join("; "));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn options(placement: Placement) -> SpawnOptions {
    SpawnOptions { placement, limit: LIMIT, ..SpawnOptions::default() }
}

#[tokio::test]
async fn backends_spawned_while_reductions_run_join_the_next_streams() {
    let net = launch("balanced:2x2", 4).await;
    let running = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    for wave in 0..3 {
        running.send(TAG_ADD_RANK, "%d", &[Value::Int(wave)]).await.unwrap();
    }
    let group = net.spawn(4, &[], &options(Placement::LeastLoaded)).await.unwrap();
    assert_eq!(group.ranks(), &[4, 5, 6, 7]);
    assert_eq!(net.backends(), 8);
    // The waves under way are not disturbed: the stream's communicator is the launch's.
    for wave in 0..3 {
        let p = running.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(p.values().unwrap()[0].as_i64().unwrap(), 4 * wave + 6, "wave {wave}");
    }
    assert_eq!(sum_over(&net, RankSet::range(0, 8)).await, ranks_sum(&[0, 1, 2, 3, 4, 5, 6, 7]));
    assert_eq!(sum_over(&net, group.rank_set()).await, ranks_sum(group.ranks()));
    // Each comm node started two (least loaded), and each process knows its group.
    for (group_rank, rank) in group.ranks().iter().enumerate() {
        let pids = session_processes(&net, &format!("TREECAST_RANK={rank}"));
        assert_eq!(pids.len(), 1, "rank {rank}");
        let env = std::fs::read(format!("/proc/{}/environ", pids[0])).unwrap();
        let env = String::from_utf8_lossy(&env);
        assert!(env.contains(&format!("TREECAST_GROUP={}\0", group.id())), "rank {rank}");
        assert!(env.contains(&format!("TREECAST_GROUP_RANK={group_rank}\0")), "rank {rank}");
        assert!(env.contains("TREECAST_GROUP_SIZE=4\0"), "rank {rank}");
        assert!(env.contains("TREECAST_SIZE=8\0"), "rank {rank}");
    }
    let mut joined = RankSet::new();
    while let Some(e) = net.try_event() {
        if let Event::RanksJoined { ranks } = e {
            joined.union_with(&ranks);
        }
    }
    assert_eq!(joined, group.rank_set());
    // A second spawn, one per comm node in turn, merged with the launch's back-ends.
    let more = net.spawn(2, &[], &options(Placement::Cyclic)).await.unwrap();
    let all = net.merge(&more, &net.launch_group(), true);
    assert_eq!(all.ranks(), &[0, 1, 2, 3, 8, 9]);
    assert_eq!(sum_over(&net, all.rank_set()).await, ranks_sum(all.ranks()));
    // Split by parity of the group rank: each half keeps the merged order.
    let halves = net.split(&all, |i, _| Some((i % 2) as u32));
    assert_eq!(halves[0].1.ranks(), &[0, 2, 8]);
    assert_eq!(halves[1].1.ranks(), &[1, 3, 9]);
    assert_ne!(halves[0].1.id(), halves[1].1.id());
    assert_eq!(sum_over(&net, halves[1].1.rank_set()).await, 1 + 3 + 9);
    finish(net).await;
}

/// A generic back-end that, once it has announced itself, connects only when
/// `gate` exists (the `TREECAST_JOIN_GATE` test knob).
fn gated_backend(gate: &std::path::Path) -> Vec<String> {
    let knob = format!("TREECAST_JOIN_GATE={}", gate.display());
    vec!["/usr/bin/env".into(), knob, TREECAST.into(), "backend".into()]
}

/// The pid of this session's process of `rank`.
fn pid_of(net: &Network, rank: u32) -> u32 {
    let pids = session_processes(net, &format!("TREECAST_RANK={rank}"));
    assert_eq!(pids.len(), 1, "rank {rank}: {pids:?}");
    pids[0]
}

/// The environment of this session's process of `rank`.
fn environment_of(net: &Network, rank: u32) -> String {
    let pid = pid_of(net, rank);
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap()).into_owned()
}

/// Sockets process `pid` holds open, but Unix datagram sockets: a back-end's
/// announcement goes out on one that lives a moment after the announcement is
/// read, so counting it would depend on when the count is taken.
fn sockets_of(pid: u32) -> usize {
    let unix = std::fs::read_to_string("/proc/net/unix").unwrap();
    // Columns: Num RefCount Protocol Flags Type St Inode [Path]; type 0002 is SOCK_DGRAM.
    let datagrams: std::collections::HashSet<&str> = unix
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            (cols.get(4) == Some(&"0002")).then(|| cols.get(6).copied()).flatten()
        })
        .collect();
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().filter_map(Result::ok);
    let links = fds.filter_map(|fd| std::fs::read_link(fd.path()).ok());
    let inodes = links.filter_map(|l| {
        let l = l.to_string_lossy().into_owned();
        l.strip_prefix("socket:[").and_then(|rest| rest.strip_suffix(']')).map(str::to_owned)
    });
    inodes.filter(|inode| !datagrams.contains(inode.as_str())).count()
}

#[tokio::test]
async fn an_announced_backend_joins_before_it_connects_and_then_gets_what_was_sent_to_it() {
    let net = launch("balanced:2x2", 4).await;
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("gate");
    let light = SpawnOptions { join: JoinMode::Announce, ..options(Placement::Block) };
    // Its link cannot connect before the gate opens, so the spawn returns on the
    // announcement alone.
    let group = net.spawn(1, &gated_backend(&gate), &light).await.unwrap();
    assert_eq!(group.ranks(), &[4]);
    assert!(environment_of(&net, 4).contains("TREECAST_JOIN_ANNOUNCE=@treecast-join-"));
    let before = sockets_of(pid_of(&net, 4));
    // A stream over it and a wave: what its comm node sends it waits there.
    let comm = net.communicator(RankSet::range(0, 5)).unwrap();
    let s = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(10)]).await.unwrap();
    std::fs::write(&gate, b"").unwrap();
    for wave in [0, 10] {
        let p = s.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(p.values().unwrap()[0].as_i64().unwrap(), ranks_sum(&[0, 1, 2, 3, 4]) + 5 * wave);
    }
    // Its link is one socket more than it held when the spawn returned.
    assert_eq!(sockets_of(pid_of(&net, 4)), before + 1, "rank 4 was connected when the spawn returned");
    // Joining by connecting: no announcement, so the gate is never consulted.
    let connect = SpawnOptions { join: JoinMode::Connect, ..options(Placement::Block) };
    let more = net.spawn(1, &gated_backend(&dir.path().join("never")), &connect).await.unwrap();
    assert!(!environment_of(&net, more.ranks()[0]).contains("TREECAST_JOIN_ANNOUNCE"));
    assert_eq!(sum_over(&net, RankSet::range(0, 6)).await, ranks_sum(&[0, 1, 2, 3, 4, 5]));
    finish(net).await;
}

#[tokio::test]
async fn an_announced_backend_that_dies_before_connecting_is_reported_lost() {
    let net = launch("balanced:2x2", 4).await;
    let dir = tempfile::tempdir().unwrap();
    let light = SpawnOptions { join: JoinMode::Announce, ..options(Placement::Block) };
    let group = net.spawn(1, &gated_backend(&dir.path().join("never")), &light).await.unwrap();
    while net.try_event().is_some() {}
    for pid in session_processes(&net, "TREECAST_RANK=4") {
        std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
    }
    loop {
        match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap().unwrap() {
            Event::RanksLost { ranks, reason } => {
                assert_eq!(ranks, group.rank_set());
                assert!(reason.contains("announced itself, then exited before connecting"), "{reason}");
                break;
            }
            _ => continue,
        }
    }
    assert_eq!(sum_over(&net, RankSet::range(0, net.backends())).await, ranks_sum(&[0, 1, 2, 3]));
    finish(net).await;
}

#[tokio::test]
async fn a_flat_front_end_spawns_its_own_children() {
    let net = launch("flat", 2).await;
    let group = net.spawn(3, &[], &SpawnOptions::default()).await.unwrap();
    assert_eq!(sum_over(&net, RankSet::range(0, 5)).await, ranks_sum(&[0, 1, 2, 3, 4]));
    assert_eq!(group.size(), 3);
    finish(net).await;
}

#[tokio::test]
async fn a_spawn_that_fails_names_each_process_and_leaves_none_of_it_running() {
    let net = launch("balanced:2x2", 4).await;
    // No such program: every process fails to start.
    let err = net.spawn(2, &["/nonexistent/worker".into()], &options(Placement::Block)).await.unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, ApiError::SpawnFailed { n: 2, .. }), "{text}");
    assert!(text.contains("rank 4") && text.contains("rank 5"), "{text}");
    assert!(text.contains("/nonexistent/worker"), "{text}");
    // One of three exits at once; the two that joined are stopped with it.
    let script = format!(
        "if [ \"$TREECAST_GROUP_RANK\" = 1 ]; then echo no licence >&2; exit 3; fi; exec {TREECAST} backend"
    );
    let command = vec!["/bin/sh".to_owned(), "-c".to_owned(), script];
    let err = net.spawn(3, &command, &options(Placement::LeastLoaded)).await.unwrap_err();
    let ApiError::SpawnFailed { failures, .. } = &err else { panic!("{err}") };
    assert_eq!(failures.len(), 1, "{err}");
    assert_eq!(failures[0].0, RankSet::single(7), "{err}");
    assert!(failures[0].1.contains("no licence"), "{err}");
    for rank in 6..9 {
        wait_until_gone(&net, &format!("TREECAST_RANK={rank}")).await;
    }
    // The tree goes on: the launch's ranks and the stopped ones' absence.
    assert_eq!(sum_over(&net, RankSet::range(0, 9)).await, ranks_sum(&[0, 1, 2, 3]));
    finish(net).await;
}

#[tokio::test]
async fn a_killed_group_is_lost_a_stopped_group_leaves_and_the_others_go_on() {
    let net = launch("balanced:2x2", 4).await;
    let doomed = net.spawn(2, &[], &options(Placement::LeastLoaded)).await.unwrap();
    let stopped = net.spawn(2, &[], &options(Placement::LeastLoaded)).await.unwrap();
    let kept: Group = net.spawn(2, &[], &options(Placement::LeastLoaded)).await.unwrap();
    while net.try_event().is_some() {}
    for rank in doomed.ranks() {
        for pid in session_processes(&net, &format!("TREECAST_RANK={rank}")) {
            std::process::Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
        }
    }
    net.stop(&stopped, "the pool shrinks").unwrap();
    let (mut lost, mut left) = (RankSet::new(), RankSet::new());
    while lost != doomed.rank_set() || left != stopped.rank_set() {
        match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap().unwrap() {
            Event::RanksLost { ranks, .. } => lost.union_with(&ranks),
            Event::RanksLeft { ranks, reason } => {
                assert!(reason.contains("the pool shrinks"), "{reason}");
                left.union_with(&ranks);
            }
            _ => {}
        }
    }
    assert_eq!(net.lost_ranks(), doomed.rank_set());
    let everyone = RankSet::range(0, net.backends());
    assert_eq!(sum_over(&net, everyone).await, ranks_sum(&[0, 1, 2, 3]) + ranks_sum(kept.ranks()));
    finish(net).await;
}

#[tokio::test]
async fn a_spawn_on_another_host_of_a_local_tree_fails_per_process_naming_the_missing_launcher() {
    let net = launch("balanced:2x2", 4).await;
    let err = net.spawn(2, &[], &options(Placement::Hosts(vec!["elsewhere".into()]))).await.unwrap_err();
    let ApiError::SpawnFailed { n: 2, failures } = &err else { panic!("{err}") };
    let failed: RankSet = failures.iter().fold(RankSet::new(), |mut all, (r, _)| {
        all.union_with(r);
        all
    });
    assert_eq!(failed, RankSet::range(4, 2), "{err}");
    assert!(failures.iter().all(|(_, why)| why.contains("no launcher for other hosts")), "{err}");
    // The tree goes on as it was.
    assert_eq!(sum_over(&net, RankSet::range(0, 4)).await, ranks_sum(&[0, 1, 2, 3]));
    finish(net).await;
}

#[tokio::test]
async fn a_stopped_backend_is_told_to_shut_down_and_exits_on_its_own() {
    let net = launch("balanced:2x2", 4).await;
    let dir = common::TestDir::new("spawn-stop");
    let done = dir.path("exit-status");
    // The shell outlives the back-end only if the back-end exits by itself: a kill
    // after the grace would take the shell (the process its parent watches) with it.
    let script = format!("{TREECAST} backend; echo $? > {}", done.display());
    let command = vec!["/bin/sh".to_owned(), "-c".to_owned(), script];
    let group = net.spawn(1, &command, &options(Placement::LeastLoaded)).await.unwrap();
    net.stop(&group, "done with it").unwrap();
    let deadline = tokio::time::Instant::now() + LIMIT;
    while !done.exists() {
        assert!(tokio::time::Instant::now() < deadline, "the stopped back-end did not exit by itself");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(std::fs::read_to_string(&done).unwrap().trim(), "0");
    finish(net).await;
}

#[test]
fn bench_spawn_and_merge_print_their_figures_as_json() {
    let run = |args: &[&str]| {
        let out = std::process::Command::new(TREECAST).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let tree = ["--local", "4", "--topology", "balanced:2x2", "--no-mpi", "--json"];
    let spawn = run(
        &[&["bench", "spawn", "--sizes", "1,2", "--runs", "2", "--rate-secs", "0.2"], &tree[..]].concat()
    );
    assert_eq!(spawn["latency"].as_array().unwrap().len(), 2, "{spawn}");
    assert_eq!(spawn["latency"][1]["n"], 2, "{spawn}");
    assert_eq!(spawn["latency"][1]["treecast"]["runs"], 2, "{spawn}");
    assert!(spawn["rate"][0]["treecast_per_s"].as_f64().unwrap() > 0.0, "{spawn}");
    assert_eq!(spawn["latency"][0]["mpi"]["missing"], "--no-mpi", "{spawn}");
    // Both join modes, each timed every run.
    for row in spawn["joins"].as_array().unwrap() {
        assert_eq!(row["connect"]["runs"], 2, "{spawn}");
        assert_eq!(row["announce"]["runs"], 2, "{spawn}");
    }
    assert!(spawn["join_rates"][1]["announce_per_s"].as_f64().unwrap() > 0.0, "{spawn}");
    let merge = run(&[&["bench", "merge", "--sizes", "2", "--runs", "2"], &tree[..]].concat());
    assert_eq!(merge["merge"][0]["treecast"]["runs"], 2, "{merge}");
    let peers = run(&[&["bench", "intergroup", "--sizes", "1,2K"], &tree[..]].concat());
    let rows = peers["point_to_point"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{peers}");
    assert_eq!(rows[1]["bytes"], 2048, "{peers}");
    assert!(rows.iter().all(|r| r["inter_far_us"].as_f64().unwrap() > 0.0), "{peers}");
    assert!(rows.iter().all(|r| r["network_us"].as_f64().unwrap() > 0.0), "{peers}");
    // Bad sizes are refused before anything starts.
    let out = std::process::Command::new(TREECAST).args(["bench", "spawn", "--sizes", "0"]).output().unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("0 is not between 1 and 1024"));
}

#[test]
fn the_mandelbrot_example_draws_the_same_image_with_a_fixed_and_a_growing_pool() {
    // `cargo test` builds the examples next to the binaries it tests.
    let dir = std::path::Path::new(TREECAST).parent().unwrap().join("examples");
    let example = dir.join("mandelbrot");
    assert!(
        example.exists(),
        "{} is missing: build it with `cargo build --example mandelbrot`",
        example.display()
    );
    let out = std::process::Command::new(&example).args(["96", "80", "4"]).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("pool of 1 grown to 4 by spawning"), "{stdout}");
    assert!(stdout.contains("images identical: yes"), "{stdout}");
}

#[tokio::test]
async fn backends_of_different_groups_exchange_messages_and_one_for_a_rank_gone_is_reported() {
    let net = launch("balanced:2x2", 4).await;
    let group = net.spawn(2, &[], &options(Placement::LeastLoaded)).await.unwrap();
    assert_eq!(group.ranks(), &[4, 5]);
    let opts = StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::reduce(TransformKind::Null) };
    let s = net.new_stream(&net.broadcast_communicator(), opts).await.unwrap();
    // Across comm nodes and groups, within one comm node, large and small.
    for (from, to, bytes, rounds) in
        [(0u32, 5u32, 1000u32, 10u32), (1, 4, 300_000, 3), (5, 2, 1, 5), (4, 0, 0, 2)]
    {
        let request = [Value::UInt(to), Value::UInt(bytes), Value::UInt(rounds)];
        s.send_to(from, TAG_PEER_PING, "%ud %ud %ud", &request).await.unwrap();
        let p = s.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(p.rank(), from);
        let v = p.unpack("%lf %ud").unwrap();
        assert_eq!(v[1], Value::UInt(rounds), "{from} -> {to}: echoes identical");
    }
    // One message from a spawned rank to every other rank: each gets it once.
    let everyone_else = [0u32, 1, 2, 3, 5];
    let cast = [Value::UIntArray(everyone_else.to_vec()), Value::UInt(3000)];
    s.send_to(4, TAG_PEER_CAST, "%aud %ud", &cast).await.unwrap();
    let mut got = Vec::new();
    for _ in everyone_else {
        let p = s.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(p.unpack("%ud %ud").unwrap(), vec![Value::UInt(4), Value::UInt(3000)]);
        got.push(p.rank());
    }
    got.sort_unstable();
    assert_eq!(got, everyone_else);
    // And no copy twice (one arriving later than this would go unseen, never fail it).
    assert!(s.recv_timeout(Duration::from_millis(200)).await.is_err(), "a receiver got the message twice");
    net.stop(&group, "done").unwrap();
    let mut left = RankSet::new();
    while left != group.rank_set() {
        if let Event::RanksLeft { ranks, .. } =
            tokio::time::timeout(LIMIT, net.next_event()).await.unwrap().unwrap()
        {
            left.union_with(&ranks);
        }
    }
    s.send_to(0, TAG_PEER_PING, "%ud %ud %ud", &[Value::UInt(5), Value::UInt(10), Value::UInt(1)])
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap().unwrap() {
            Event::MessageUndeliverable { from: 0, to } if to == RankSet::single(5) => break,
            other => eprintln!("{other}"),
        }
    }
    finish(net).await;
}

#[tokio::test]
async fn a_backend_spawns_helpers_through_its_parent_and_they_join_the_network() {
    let net = launch("balanced:2x2", 4).await;
    let opts = StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::reduce(TransformKind::Null) };
    let s = net.new_stream(&net.broadcast_communicator(), opts).await.unwrap();
    s.send_to(3, TAG_SPAWN_HELPERS, "%ud", &[Value::UInt(3)]).await.unwrap();
    let p = s.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.rank(), 3);
    assert_eq!(p.unpack("%aud").unwrap(), vec![Value::UIntArray(vec![4, 5, 6])]);
    assert_eq!(net.backends(), 7);
    assert_eq!(sum_over(&net, RankSet::range(0, 7)).await, ranks_sum(&[0, 1, 2, 3, 4, 5, 6]));
    let mut joined = RankSet::new();
    while let Some(e) = net.try_event() {
        if let Event::RanksJoined { ranks } = e {
            joined.union_with(&ranks);
        }
    }
    assert_eq!(joined, RankSet::range(4, 3));
    // More than a spawn may start: refused with the front-end's reason, nothing started.
    s.send_to(0, TAG_SPAWN_HELPERS, "%ud", &[Value::UInt(u32::MAX)]).await.unwrap();
    let p = s.recv_timeout(LIMIT).await.unwrap();
    let why = p.unpack("%s").unwrap()[0].as_str().unwrap().to_owned();
    assert!(why.contains("could not spawn") && why.contains("1 to 65536"), "{why}");
    assert_eq!(net.backends(), 7);
    finish(net).await;
}

#[tokio::test]
async fn processes_started_elsewhere_join_as_a_group_through_a_port_and_a_wrong_secret_is_refused() {
    let net = launch("balanced:2x2", 4).await;
    let dir = common::TestDir::new("spawn-port");
    let port = dir.path("port");
    let started = std::cell::RefCell::new(Vec::new());
    let outsiders = async {
        while !port.exists() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        // Started by "another launcher", numbered 0-2 in its own way.
        for i in 0..3 {
            let child = std::process::Command::new(TREECAST)
                .args(["backend", "--attach"])
                .arg(&port)
                .env("PMI_RANK", i.to_string())
                .env("TREECAST_SESSION", net.session())
                .spawn()
                .unwrap();
            started.borrow_mut().push(child);
        }
        // A copy of the port file with another secret: refused at the handshake.
        let text = std::fs::read_to_string(&port).unwrap();
        let forged: String =
            text.lines()
                .map(|l| {
                    if l.starts_with("secret ") {
                        format!("secret {}", "ab".repeat(32))
                    } else {
                        l.to_owned()
                    }
                })
                .collect::<Vec<_>>()
                .join("\n");
        let forged_path = dir.path("forged");
        std::fs::write(&forged_path, forged).unwrap();
        std::fs::set_permissions(&forged_path, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        tokio::process::Command::new(TREECAST)
            .args(["backend", "--attach"])
            .arg(&forged_path)
            .args(["--rank", "0"])
            .output()
            .await
            .unwrap()
    };
    let accept_options = options(Placement::LeastLoaded);
    let (group, forged) = tokio::join!(net.accept(&port, 3, &accept_options), outsiders);
    let group = group.unwrap();
    assert_eq!(group.ranks(), &[4, 5, 6]);
    assert!(!forged.status.success());
    let said = String::from_utf8_lossy(&forged.stderr);
    assert!(said.contains("authentication") && said.contains("refused our proof"), "{said}");
    assert!(!port.exists(), "the port file holds the secret: it goes when the accept ends");
    assert_eq!(sum_over(&net, RankSet::range(0, 7)).await, ranks_sum(&[0, 1, 2, 3, 4, 5, 6]));
    finish(net).await;
    for mut child in started.into_inner() {
        assert!(child.wait().unwrap().success());
    }
}

#[test]
fn treecast_run_spawns_more_backends_on_request_and_lists_the_groups() {
    let out = std::process::Command::new(TREECAST)
        .args(["run", "--local", "4", "--topology", "balanced:2x2", "--spawn", "3", "--json", "--"])
        .args(["sh", "-c", "echo $TREECAST_GROUP"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["backends"], 7, "{report}");
    let groups = report["groups"].as_array().unwrap();
    assert_eq!(groups.len(), 2, "{report}");
    assert_eq!((groups[0]["ranks"].as_str(), groups[0]["spawned"].as_bool()), (Some("0-3"), Some(false)));
    assert_eq!((groups[1]["ranks"].as_str(), groups[1]["spawned"].as_bool()), (Some("4-6"), Some(true)));
    // Every rank ran it: the launch's print nothing for their group, the spawned their group's id.
    let classes: Vec<(String, String)> = report["classes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["ranks"].as_str().unwrap().to_owned(), c["stdout"].as_str().unwrap().trim().to_owned()))
        .collect();
    let spawned_id = groups[1]["id"].to_string();
    assert_eq!(classes, vec![("0-3".to_owned(), String::new()), ("4-6".to_owned(), spawned_id)], "{report}");
}

/// Asks each of `ranks` to enter the collective operation `request` describes
/// ([`TAG_COLLECTIVE`]); returns each one's answer.
async fn enter(
    s: &mut treecast_api::Stream,
    ranks: &[u32],
    request: &[Value],
) -> std::collections::BTreeMap<u32, Vec<Value>> {
    for &r in ranks {
        s.send_to(r, TAG_COLLECTIVE, COLLECTIVE_REQUEST, request).await.unwrap();
    }
    let mut answers = std::collections::BTreeMap::new();
    while answers.len() < ranks.len() {
        let p = s.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(p.tag(), TAG_COLLECTIVE);
        answers.insert(p.rank(), p.values().unwrap());
    }
    answers
}

/// What rank `r` contributes to a [`TAG_COLLECTIVE`] operation of `k` elements.
fn contribution(r: u32, k: i64) -> Vec<i64> {
    (0..k).map(|i| i64::from(r) * 1000 + i).collect()
}

/// The element-wise fold of the members' contributions.
fn folded(members: &[u32], k: i64, f: fn(i64, i64) -> i64) -> Vec<i64> {
    (0..k as usize).map(|i| members.iter().map(|&r| contribution(r, k)[i]).reduce(f).unwrap()).collect()
}

fn result_of(answer: &[Value]) -> Vec<i64> {
    answer[1].to_i64_vec().unwrap()
}

#[tokio::test]
async fn collectives_over_two_groups_are_computed_in_the_tree_and_match_a_local_computation() {
    let net = launch("balanced:2x2", 4).await;
    let spawned = net.spawn(3, &[], &options(Placement::Cyclic)).await.unwrap();
    assert_eq!(spawned.ranks(), &[4, 5, 6]);
    let opts = StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::reduce(TransformKind::Null) };
    let mut s = net.new_stream(&net.broadcast_communicator(), opts).await.unwrap();
    // The union of both groups, the spawned one first, in an order that is not the ranks'.
    let members = [6u32, 5, 4, 0, 1, 2, 3];
    let k = 7i64;
    let request = |op: u32, combine: u32, members: &[u32], root: u32, k: i64| {
        vec![
            Value::UInt(op),
            Value::UInt(combine),
            Value::UIntArray(members.to_vec()),
            Value::UInt(root),
            Value::UInt(k as u32),
            Value::UInt(3),
        ]
    };
    let all = |f: fn(i64, i64) -> i64| folded(&members, k, f);
    for (combine, f) in [(1u32, i64::wrapping_add as fn(i64, i64) -> i64), (2, i64::min), (3, i64::max)] {
        let answers = enter(&mut s, &members, &request(2, combine, &members, u32::MAX, k)).await;
        for (rank, a) in &answers {
            assert_eq!(result_of(a), all(f), "all-reduce {combine} at rank {rank}");
            assert_eq!(a[3], Value::UInt(7));
        }
    }
    // The average weighs each member once, however the tree is shaped (integers
    // rounded toward zero).
    let answers = enter(&mut s, &members, &request(2, 4, &members, u32::MAX, k)).await;
    let n = members.len() as f64;
    let average: Vec<i64> = all(i64::wrapping_add).iter().map(|&sum| (sum as f64 / n) as i64).collect();
    for (rank, a) in &answers {
        assert_eq!(result_of(a), average, "all-reduce avg at rank {rank}");
    }
    // Reduce-scatter: member j (in the group's order) keeps block j.
    let answers = enter(&mut s, &members, &request(4, 1, &members, u32::MAX, k)).await;
    let sums = all(i64::wrapping_add);
    for (j, rank) in members.iter().enumerate() {
        assert_eq!(result_of(&answers[rank]), vec![sums[j]], "reduce-scatter at rank {rank}");
    }
    // All-gather: every member's values, in the group's order.
    let answers = enter(&mut s, &members, &request(3, 0, &members, u32::MAX, 2)).await;
    let want: Vec<i64> = members.iter().flat_map(|&r| contribution(r, 2)).collect();
    for a in answers.values() {
        assert_eq!(result_of(a), want);
        assert_eq!(a[2], Value::UIntArray(members.to_vec()));
    }
    // The spawned group reduced to a root in the launch's group, after an operation
    // of its own that the root takes no part in (reductions to a root count apart).
    let group: Vec<u32> = spawned.ranks().to_vec();
    let answers = enter(&mut s, &group, &request(2, 1, &group, u32::MAX, 1)).await;
    assert!(answers.values().all(|a| result_of(a) == folded(&group, 1, i64::wrapping_add)), "{answers:?}");
    let answers = enter(&mut s, &[4, 5, 6, 2], &request(1, 1, &group, 2, k)).await;
    assert_eq!(result_of(&answers[&2]), folded(&group, k, i64::wrapping_add));
    for rank in group {
        assert!(result_of(&answers[&rank]).is_empty(), "rank {rank} is not the root");
    }
    let answers = enter(&mut s, &members, &request(5, 0, &members, u32::MAX, 0)).await;
    assert!(answers.values().all(|a| a[3] == Value::UInt(7)), "{answers:?}");
    // Arrays that do not split in 7 blocks fail at each member, saying why.
    let answers = enter(&mut s, &members, &request(4, 1, &members, u32::MAX, 5)).await;
    for a in answers.values() {
        assert!(a[0].as_str().unwrap().contains("multiple of the group's 7 members"), "{a:?}");
    }
    finish(net).await;
}
