//! End-to-end tests: real comm nodes and back-ends on loopback.
//!
//! Every test checks that no process of its network is left behind, by looking
//! for its session id (or a per-test tag) in the environment of every process.

#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{assert_no_leftovers, processes_with_env, TestDir};
use treecast::apps::protocol::*;
use treecast_api::{
    ApiError, Event, Network, NetworkBuilder, RankSet, StreamOptions, SyncMode, Topology, TransformKind,
    Value,
};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(20);

async fn launch(spec: &str, backends: usize) -> Network {
    let topo = Topology::from_spec(spec, Some(backends)).unwrap();
    builder(topo).launch().await.unwrap()
}

fn builder(topo: Topology) -> NetworkBuilder {
    NetworkBuilder::new(topo).treecast_path(TREECAST).startup_timeout(LIMIT)
}

async fn finish(net: Network) {
    let needle = format!("TREECAST_SESSION={}", net.session());
    net.shutdown().await;
    assert_no_leftovers(&needle);
}

fn int(p: &treecast_api::Packet) -> i64 {
    p.values().unwrap()[0].as_i64().unwrap()
}

async fn sum_waves(spec: &str, n: usize) {
    let net = launch(spec, n).await;
    assert_eq!(net.backends(), n as u32);
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    let ranks: i64 = (0..n as i64).sum();
    for wave in 0..5 {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(wave)]).await.unwrap();
    }
    for wave in 0..5 {
        let p = s.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(int(&p), wave * n as i64 + ranks, "wave {wave} on {spec}");
    }
    finish(net).await;
}

#[tokio::test]
async fn sums_are_correct_on_a_flat_tree_of_64() {
    sum_waves("flat", 64).await;
}

#[tokio::test]
async fn sums_are_correct_on_kary8_with_64() {
    sum_waves("kary:8", 64).await;
}

#[tokio::test]
async fn sums_are_correct_on_balanced_4x4x4() {
    sum_waves("balanced:4x4x4", 64).await;
}

#[tokio::test]
async fn sums_are_correct_over_tcp_links() {
    let topo = Topology::from_spec("balanced:2x3", None).unwrap();
    let net = builder(topo).unix_links(false).launch().await.unwrap();
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(1)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 6 + 15);
    finish(net).await;
}

#[tokio::test]
async fn concurrent_streams_with_different_filters_and_communicators() {
    let net = launch("balanced:4x4", 16).await;
    let low = net.communicator(RankSet::range(0, 8)).unwrap();
    let high = net.communicator(RankSet::range(8, 8)).unwrap();
    let all = net.broadcast_communicator();
    let mut sum = net.new_stream(&low, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let mut max = net.new_stream(&high, StreamOptions::reduce(TransformKind::Max)).await.unwrap();
    let mut min = net.new_stream(&all, StreamOptions::reduce(TransformKind::Min)).await.unwrap();
    let mut cat = net.new_stream(&low, StreamOptions::reduce(TransformKind::Concat)).await.unwrap();
    let mut avg = net.new_stream(&all, StreamOptions::reduce(TransformKind::Avg)).await.unwrap();
    let mut eq = net.new_stream(&all, StreamOptions::reduce(TransformKind::EqClass)).await.unwrap();
    let mut raw = net
        .new_stream(&high, StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::default() })
        .await
        .unwrap();
    for s in [&sum, &max, &min, &cat, &avg, &raw] {
        s.send(TAG_ADD_RANK, "%d", &[Value::Int(100)]).await.unwrap();
    }
    eq.send(TAG_WHERE, "", &[]).await.unwrap();
    assert_eq!(int(&sum.recv_timeout(LIMIT).await.unwrap()), 800 + 28);
    assert_eq!(int(&max.recv_timeout(LIMIT).await.unwrap()), 115);
    assert_eq!(int(&min.recv_timeout(LIMIT).await.unwrap()), 100);
    assert_eq!(int(&avg.recv_timeout(LIMIT).await.unwrap()), (16 * 100 + 120) / 16);
    let cat_values = cat.recv_timeout(LIMIT).await.unwrap().unpack("%ad").unwrap();
    let Value::IntArray(mut got) = cat_values[0].clone() else { panic!("not %ad") };
    got.sort();
    assert_eq!(got, (100..108).collect::<Vec<_>>());
    let classes = eq.recv_timeout(LIMIT).await.unwrap().eq_classes().unwrap();
    let groups: Vec<String> = classes.iter().map(|c| c.ranks.to_string()).collect();
    assert_eq!(groups, ["0-3", "4-7", "8-11", "12-15"]);
    let mut seen = BTreeSet::new();
    for _ in 0..8 {
        let p = raw.recv_timeout(LIMIT).await.unwrap();
        assert_eq!(int(&p), 100 + i64::from(p.rank()));
        seen.insert(p.rank());
    }
    assert_eq!(seen, (8..16).collect());
    finish(net).await;
}

#[tokio::test]
async fn a_stream_the_tool_does_not_read_holds_up_no_other_stream() {
    // Flow control regression: stream `unread` gets more waves than the front-end
    // buffers (ROOT_WINDOW), so the tree must hold them back per stream; stream
    // `read` must still complete, then every held wave must arrive intact.
    let topo = Topology::from_spec("balanced:2x4", Some(8)).unwrap();
    let window = treecast_api::Window { packets: 4096, bytes: 64 << 20 };
    let net = builder(topo).receive_window(window).launch().await.unwrap();
    let all = net.broadcast_communicator();
    let mut unread = net.new_stream(&all, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let mut read = net.new_stream(&all, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let many = window.packets as i32 + 1000;
    unread.send(TAG_BURST, "%d", &[Value::Int(many)]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    read.send(TAG_BURST, "%d", &[Value::Int(300)]).await.unwrap();
    for i in 0..300 {
        let p = read.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("wave {i} of the read stream: {e}"));
        assert_eq!(int(&p), 8);
    }
    for i in 0..many {
        let p = unread.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("held wave {i}: {e}"));
        assert_eq!(int(&p), 8, "held wave {i}");
    }
    assert!(unread.try_recv().is_none());
    finish(net).await;
}

#[tokio::test]
async fn the_tool_can_send_ten_thousand_packets_before_reading() {
    // Regression: a stream deadlocked for good when the front-end sent many packets
    // before reading (9 runs in 10 stopped after 256-512 waves): a back-end waited for
    // credits that came behind requests it had not read, and a comm node waited on one
    // child's full queue while its siblings starved.
    for (shape, n) in [("balanced:4x4", 16), ("flat", 4), ("balanced:2x2x2", 8)] {
        let net = launch(shape, n).await;
        let mut s = net
            .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
            .await
            .unwrap();
        let ranks: i64 = (0..n as i64).sum();
        for wave in 0..10_000 {
            tokio::time::timeout(LIMIT, s.send(TAG_ADD_RANK, "%d", &[Value::Int(wave % 7)]))
                .await
                .unwrap_or_else(|_| panic!("{shape}: send {wave} hung"))
                .unwrap();
        }
        for wave in 0..10_000 {
            let p = s.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("{shape}: wave {wave}: {e}"));
            assert_eq!(int(&p), i64::from(wave % 7) * n as i64 + ranks, "{shape}: wave {wave}");
        }
        finish(net).await;
    }
}

#[tokio::test]
async fn an_unread_stream_is_bounded_in_bytes_not_packets() {
    // Regression: an unread stream held up to 4,096 reduced packets at the front-end
    // whatever their size (1.2 GB with 16 back-ends sending 16 KiB strings).
    let topo = Topology::from_spec("balanced:4x4", None).unwrap();
    let window = treecast_api::Window { packets: 1 << 16, bytes: 4 << 20 };
    let net = builder(topo).receive_window(window).launch().await.unwrap();
    let options = StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::default() };
    let mut s = net.new_stream(&net.broadcast_communicator(), options).await.unwrap();
    let (count, size) = (200, 16 << 10);
    s.send(TAG_BURST_BYTES, "%d %d", &[Value::Int(count), Value::Int(size)]).await.unwrap();
    // The bound holds at every moment; give the tree time to push what it can.
    let mut most = 0;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        most = most.max(net.held_bytes());
    }
    // The receive window, one frame over it, and one upward window per child (4 comm nodes).
    let bound = window.bytes + (16 << 10) + 4 * treecast_api::DEFAULT_UP_WINDOW.bytes;
    assert!(most > window.bytes / 2, "the tree did not fill the window ({most} bytes held)");
    assert!(most <= bound, "the front-end held {most} bytes, more than {bound}");
    for i in 0..16 * count {
        let p = s.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("packet {i}: {e}"));
        assert_eq!(p.unpack("%s").unwrap()[0].as_str().unwrap().len(), size as usize);
    }
    assert!(s.try_recv().is_none());
    finish(net).await;
}

#[tokio::test]
async fn a_child_that_stops_reading_holds_up_only_its_own_stream() {
    // Regression: while a comm node waited on one slow child's send queue, nothing
    // else moved through it. Rank 0 stops reading; a stream to it fills up and its
    // sender waits; a stream over rank 1, below the same comm node, goes on.
    let net = launch("balanced:2x2", 4).await;
    let stall = net
        .new_stream(&net.communicator(RankSet::single(0)).unwrap(), StreamOptions::default())
        .await
        .unwrap();
    stall.send(TAG_STALL, "%ad %d", &[Value::IntArray(vec![0]), Value::Int(15_000)]).await.unwrap();
    let flood = net
        .new_stream(
            &net.broadcast_communicator(),
            StreamOptions { sync: SyncMode::DoNotWait, ..StreamOptions::default() },
        )
        .await
        .unwrap();
    let flooding = tokio::spawn(async move {
        for i in 0..2000 {
            flood.send(TAG_ADD_RANK, "%d", &[Value::Int(i)]).await.unwrap();
        }
        flood
    });
    let mut side = net
        .new_stream(&net.communicator(RankSet::single(1)).unwrap(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    for wave in 0..20 {
        side.send(TAG_ADD_RANK, "%d", &[Value::Int(wave)]).await.unwrap();
        let p =
            side.recv_timeout(Duration::from_secs(5)).await.unwrap_or_else(|e| panic!("wave {wave}: {e}"));
        assert_eq!(int(&p), i64::from(wave) + 1);
    }
    assert!(!flooding.is_finished(), "the flood went through a child that does not read");
    flooding.abort();
    finish(net).await;
}

#[tokio::test]
async fn a_filter_a_comm_node_lacks_refuses_the_stream_and_names_the_node() {
    let mut registry = treecast_api::FilterRegistry::builtin();
    registry.register("front-end-only", 1..=1, |_| Ok(treecast_filters_null()));
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let mut net = builder(topo).filters(registry).launch().await.unwrap();
    let options =
        StreamOptions { up: treecast_api::FilterSpec::new("front-end-only", 1), ..StreamOptions::default() };
    let mut s = net.new_stream(&net.broadcast_communicator(), options).await.unwrap();
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::StreamRefused { node, message, .. }) => {
            assert!(node.contains("comm node"), "{node}");
            assert!(message.contains("front-end-only"), "{message}");
        }
        other => panic!("expected StreamRefused, got {other:?}"),
    }
    let err = s.recv_timeout(LIMIT).await.unwrap_err().to_string();
    assert!(err.contains("refused") && err.contains("front-end-only"), "{err}");
    let unknown =
        StreamOptions { up: treecast_api::FilterSpec::new("median", 1), ..StreamOptions::default() };
    let err = net.new_stream(&net.broadcast_communicator(), unknown).await.unwrap_err().to_string();
    assert!(err.contains("front-end") && err.contains("median"), "{err}");
    finish(net).await;
}

fn treecast_filters_null() -> Box<dyn treecast_api::Transform> {
    struct PassThrough;
    impl treecast_api::Transform for PassThrough {
        fn apply(
            &mut self,
            wave: Vec<treecast_wire::Frame>,
            _ctx: &treecast_api::FilterContext,
        ) -> Result<Vec<treecast_wire::Frame>, treecast_api::FilterError> {
            Ok(wave)
        }
    }
    Box::new(PassThrough)
}

#[tokio::test]
async fn a_backend_dying_mid_wave_completes_it_with_the_survivors() {
    let mut net = launch("balanced:2x4", 8).await;
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
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

/// Pid of the comm node with `id` in a session.
fn commnode_pid(session: &str, id: u32) -> u32 {
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

#[tokio::test]
async fn a_comm_node_killed_loses_its_subtree_and_the_rest_goes_on() {
    let mut net = launch("balanced:2x3", 6).await;
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
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

#[tokio::test]
async fn a_stream_whose_members_are_all_lost_is_closed_not_hung() {
    let net = launch("flat", 3).await;
    let comm = net.communicator(RankSet::single(1)).unwrap();
    let mut s = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    s.send(TAG_DIE, "%ad", &[Value::IntArray(vec![1])]).await.unwrap();
    let err = s.recv_timeout(LIMIT).await.unwrap_err();
    assert!(matches!(err, ApiError::StreamClosed(_)), "{err}");
    finish(net).await;
}

#[tokio::test]
async fn mismatched_formats_are_reported_and_the_wave_goes_on() {
    let mut net = launch("flat", 4).await;
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    for rank in 0..4u32 {
        if rank == 2 {
            s.send_to(rank, TAG_ECHO, "%lf", &[Value::Double(1.5)]).await.unwrap();
        } else {
            s.send_to(rank, TAG_ECHO, "%d", &[Value::Int(rank as i32 + 10)]).await.unwrap();
        }
    }
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 10 + 11 + 13);
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::FilterError { rank, message, .. }) => {
            assert_eq!(rank, 2);
            assert!(message.contains("%lf") && message.contains("%d"), "{message}");
        }
        other => panic!("expected FilterError, got {other:?}"),
    }
    finish(net).await;
}

#[tokio::test]
async fn time_out_filter_releases_a_partial_wave() {
    let net = launch("flat", 4).await;
    let options = StreamOptions { sync: SyncMode::TimeOut(300), ..StreamOptions::reduce(TransformKind::Sum) };
    let mut s = net.new_stream(&net.broadcast_communicator(), options).await.unwrap();
    for rank in 0..4u32 {
        let ms = if rank == 3 { 3000 } else { 0 };
        s.send_to(rank, TAG_SLEEP, "%d", &[Value::Int(ms)]).await.unwrap();
    }
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 1 + 2, "ranks 0, 1 and 2");
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 3);
    finish(net).await;
}

#[tokio::test]
async fn format_errors_are_caught_at_the_sender() {
    let net = launch("flat", 2).await;
    let s = net.new_stream(&net.broadcast_communicator(), StreamOptions::default()).await.unwrap();
    let err = s.send(TAG_ECHO, "%d %s", &[Value::Int(1), Value::Int(2)]).await.unwrap_err();
    assert!(err.to_string().contains("value 1"), "{err}");
    let err = s.send(TAG_ECHO, "%q", &[]).await.unwrap_err();
    assert!(err.to_string().contains("column"), "{err}");
    let err = s.send_to(7, TAG_ECHO, "", &[]).await.unwrap_err();
    assert!(matches!(err, ApiError::NoSuchRanks { .. }), "{err}");
    assert!(net.communicator(RankSet::range(1, 5)).is_err());
    finish(net).await;
}

#[tokio::test]
async fn a_backend_that_cannot_start_is_named_with_its_stderr() {
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let err = builder(topo)
        .backend_command(["/bin/sh", "-c", "echo boom on $TREECAST_RANK >&2; exit 7"])
        .launch()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("back-end rank"), "{err}");
    assert!(err.contains("exited with status 7"), "{err}");
    assert!(err.contains("boom on"), "{err}");

    let topo = Topology::from_spec("flat", Some(2)).unwrap();
    let err = builder(topo).backend_command(["/nonexistent/tool"]).launch().await.unwrap_err().to_string();
    assert!(err.contains("/nonexistent/tool") && err.contains("back-end rank 0"), "{err}");
}

/// Not a test on its own: a back-end that panics at once. Runs only when re-executed
/// by `a_start_up_error_is_printed_once_with_the_childs_panic_message`.
#[test]
fn panicking_backend_entry() {
    if std::env::var("TREECAST_PANIC_ENTRY").is_err() {
        return;
    }
    let rank = std::env::var("TREECAST_RANK").unwrap_or_default();
    panic!("rank {rank} cannot read its settings file /etc/tool-test.conf");
}

#[test]
fn a_start_up_error_is_printed_once_with_the_childs_panic_message() {
    // Regression: at depth 3 every comm node logged the error, its parent forwarded
    // the log, and the front-end printed it again (three times in all); with
    // RUST_BACKTRACE set the backtrace pushed the panic message out of the report.
    let dir = TestDir::new("printed-once");
    let script = dir.path("treecast-wrapper");
    let text = format!(
        "#!/bin/sh\nif [ \"$1\" = backend ] && [ \"$TREECAST_RANK\" = 5 ]; then exec {} panicking_backend_entry \
         --exact --nocapture --test-threads=1; fi\nexec {TREECAST} \"$@\"\n",
        std::env::current_exe().unwrap().display()
    );
    std::fs::write(&script, text).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let tag = tag();
    let (k, v) = tag.split_once('=').unwrap();
    let out = Command::new(TREECAST)
        .args(["run", "--local", "8", "--topology", "balanced:2x2x2", "--", "true"])
        .env(k, v)
        .env("TREECAST_PATH", &script)
        .env("TREECAST_PANIC_ENTRY", "1")
        .env("RUST_BACKTRACE", "1")
        .env_remove("TREECAST_LOG")
        .output()
        .unwrap();
    assert_no_leftovers(&tag);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert_eq!(stderr.matches("exited with status 101").count(), 1, "{stderr}");
    assert!(!stderr.contains("ERROR"), "no comm node logs it on the way: {stderr}");
    let (_, error) = stderr.split_once("treecast: error: ").unwrap_or_default();
    assert!(!error.contains("treecast: error: "), "printed once: {stderr}");
    assert!(
        error.starts_with(
            "starting the network failed: back-end rank 5 on localhost (node 11) exited before connecting"
        ),
        "{error}"
    );
    assert!(error.contains("rank 5 cannot read its settings file /etc/tool-test.conf"), "{error}");
}

#[tokio::test]
async fn a_peer_with_the_wrong_secret_is_refused() {
    let topo = Topology::from_spec("flat", Some(2)).unwrap();
    let wrong = "00".repeat(32);
    let script = format!("TREECAST_SECRET={wrong} exec {TREECAST} backend");
    let err = builder(topo)
        .backend_command(["/bin/sh", "-c", &script])
        .startup_timeout(Duration::from_secs(5))
        .launch()
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("refused our proof"), "{err}");
}

/// Not a test on its own: the body of a rogue back-end that authenticates, reports
/// ready, then sends bytes that are not a frame. Runs only when re-executed by
/// `a_malformed_frame_closes_only_that_link`.
#[tokio::test]
async fn rogue_backend_entry() {
    if std::env::var("TREECAST_ROGUE").is_err() {
        return;
    }
    use tokio::io::AsyncWriteExt;
    let parent = std::env::var("TREECAST_PARENT").unwrap();
    let node_id: u32 = std::env::var("TREECAST_NODE_ID").unwrap().parse().unwrap();
    let secret = treecast_node::read_secret().unwrap();
    let mut stream = treecast_node::connect_to(&parent, node_id, &secret, LIMIT).await.unwrap();
    let rank: u32 = std::env::var("TREECAST_RANK").unwrap().parse().unwrap();
    let join = treecast_wire::ControlMsg::Join { ranks: RankSet::single(rank), commnodes: 0 };
    let mut bytes = bytes::BytesMut::new();
    treecast_node::core::control_frame(&join).encode(&mut bytes);
    stream.write_all(&bytes).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    if std::env::var("TREECAST_ROGUE").as_deref() == Ok("huge") {
        // A header announcing 200 MiB, then a trickle: the parent must refuse it, not buffer it.
        let mut header = bytes::BytesMut::new();
        treecast_wire::FrameHeader::data(1, 0, rank).encode(200 << 20, &mut header);
        stream.write_all(&header).await.unwrap();
        stream.write_all(&[0u8; 4096]).await.unwrap();
    } else {
        stream.write_all(&[0xEE; 64]).await.unwrap();
    }
    tokio::time::sleep(Duration::from_secs(30)).await;
}

/// Launches balanced:2x2 where rank 1 is the rogue back-end in `mode`.
async fn with_rogue_rank_1(mode: &str) -> Network {
    let test_bin = std::env::current_exe().unwrap();
    let script = format!(
        "if [ \"$TREECAST_RANK\" = 1 ]; then exec {} rogue_backend_entry --exact --nocapture --test-threads=1; else exec {TREECAST} backend; fi",
        test_bin.display()
    );
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    builder(topo)
        .backend_command(["/bin/sh", "-c", &script])
        .env("TREECAST_ROGUE", mode)
        .launch()
        .await
        .unwrap()
}

#[tokio::test]
async fn a_frame_over_the_size_limit_is_refused_before_it_is_buffered() {
    // Regression: one header announcing 256 MiB from an authenticated child cost its
    // comm node 230 MB at once. Now it closes that link and nothing else.
    let mut net = with_rogue_rank_1("huge").await;
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::single(1));
            assert!(reason.contains("over this node's limit"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 2 + 3);
    finish(net).await;
}

#[tokio::test]
async fn a_malformed_frame_closes_only_that_link() {
    let mut net = with_rogue_rank_1("malformed").await;
    match tokio::time::timeout(LIMIT, net.next_event()).await.unwrap() {
        Some(Event::RanksLost { ranks, reason }) => {
            assert_eq!(ranks, RankSet::single(1));
            assert!(reason.contains("malformed frame"), "{reason}");
        }
        other => panic!("expected RanksLost, got {other:?}"),
    }
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 2 + 3);
    finish(net).await;
}

/// Not a test on its own: a back-end that answers the first request (`%d n`) with `n`
/// packets of its rank and returns at once, dropping its `BackEnd` without `close()`
/// as a tool's `main` would. Runs only when re-executed by
/// `a_backend_that_returns_right_after_sending_loses_nothing`.
#[tokio::test]
async fn send_and_return_backend_entry() {
    if std::env::var("TREECAST_SEND_AND_RETURN").is_err() {
        return;
    }
    let mut be = treecast_api::BackEnd::connect().await.unwrap();
    let p = be.recv().await.unwrap();
    for _ in 0..int(&p) {
        be.send(p.stream(), p.tag(), "%d", &[Value::Int(be.rank() as i32)]).await.unwrap();
    }
}

/// Regression: `send` only queued, so a back-end that returned right after sending
/// lost its last packets (a 32-rank sum came out short, with no error anywhere).
#[tokio::test]
async fn a_backend_that_returns_right_after_sending_loses_nothing() {
    // Its harness's report goes to /dev/null, not into this test's output.
    let script = format!(
        "exec {} send_and_return_backend_entry --exact --test-threads=1 >/dev/null",
        std::env::current_exe().unwrap().display()
    );
    let command = ["/bin/sh".to_owned(), "-c".to_owned(), script];
    const PACKETS: i32 = 200;
    for unix in [true, false] {
        let topo = Topology::from_spec("balanced:4x8", None).unwrap();
        let net = builder(topo)
            .unix_links(unix)
            .backend_command(command.clone())
            .env("TREECAST_SEND_AND_RETURN", "1")
            .launch()
            .await
            .unwrap();
        let n = i64::from(net.backends());
        let mut s = net
            .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
            .await
            .unwrap();
        s.send(TAG_ECHO, "%d", &[Value::Int(PACKETS)]).await.unwrap();
        for wave in 0..PACKETS {
            let p = s.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("wave {wave} (unix {unix}): {e}"));
            assert_eq!(int(&p), n * (n - 1) / 2, "wave {wave} (unix {unix}): a rank's packet was lost");
        }
        finish(net).await;
    }
}

#[tokio::test]
async fn once_the_tree_is_up_no_process_shows_the_secret_in_proc() {
    // Regression: `treecast run` kept the secret out of a command's environment, but
    // the command could read it in its back-end's /proc/PID/environ.
    let dir = TestDir::new("secret");
    // Each back-end's shell saves the secret it was given, then becomes the back-end.
    let script = format!(
        "printf %s \"$TREECAST_SECRET\" > {}/secret.$TREECAST_RANK; exec {TREECAST} backend",
        dir.root().display()
    );
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let net = builder(topo).backend_command(["/bin/sh", "-c", &script]).launch().await.unwrap();
    let secret = std::fs::read_to_string(dir.path("secret.0")).unwrap();
    assert_eq!(secret.len(), 64, "{secret:?}");
    let session = processes_with_env(&format!("TREECAST_SESSION={}", net.session()));
    assert_eq!(session.len(), 2 + 4, "every comm node and back-end is readable here: {session:?}");
    for pid in session {
        for what in ["environ", "cmdline"] {
            let bytes = std::fs::read(format!("/proc/{pid}/{what}")).unwrap();
            let shown = bytes.windows(secret.len()).any(|w| w == secret.as_bytes());
            assert!(!shown, "process {pid} shows the secret in /proc/{pid}/{what}");
        }
    }
    // And the tree still works: the secret is gone from the environment only.
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 6);
    finish(net).await;
}

// ---- the command line ----

/// A unique tag put in the environment of a CLI run, inherited by its whole tree.
fn tag() -> String {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    format!("TREECAST_TEST_TAG={}-{}", std::process::id(), N.fetch_add(1, Ordering::Relaxed))
}

fn treecast(tag: &str, args: &[&str]) -> std::process::Output {
    let (k, v) = tag.split_once('=').unwrap();
    let out = Command::new(TREECAST).args(args).env(k, v).output().unwrap();
    assert_no_leftovers(tag);
    out
}

#[test]
fn run_groups_outputs_by_equivalence_class() {
    let t = tag();
    let out = treecast(
        &t,
        &[
            "run",
            "--local",
            "8",
            "--topology",
            "kary:4",
            "--",
            "sh",
            "-c",
            "echo $((TREECAST_RANK % 2)) of $TREECAST_SIZE",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("---- [0,2,4,6] (4 ranks) ----\n0 of 8\n"), "{stdout}");
    assert!(stdout.contains("---- [1,3,5,7] (4 ranks) ----\n1 of 8\n"), "{stdout}");
    assert!(stdout.contains("8 back-ends; exit 0: 8 [0-7]"), "{stdout}");
}

#[test]
fn run_reports_failures_in_json_and_exit_status() {
    let t = tag();
    let out = treecast(&t, &["run", "--local", "4", "--json", "--", "sh", "-c", "[ $TREECAST_RANK != 2 ]"]);
    assert_eq!(out.status.code(), Some(1));
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["ok"], false);
    let classes = report["classes"].as_array().unwrap();
    assert_eq!(classes.len(), 2);
    assert_eq!(classes[0]["ranks"], "0-1,3");
    assert_eq!(classes[1]["ranks"], "2");
    assert_eq!(classes[1]["exit_code"], 1);
}

#[test]
fn run_does_not_leak_the_secret_to_commands() {
    let t = tag();
    let out =
        treecast(&t, &["run", "--local", "2", "--", "sh", "-c", "echo secret=${TREECAST_SECRET:-none}"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("secret=none"), "{stdout}");
}

#[test]
fn killing_the_front_end_takes_the_whole_tree_down() {
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let mut child = Command::new(TREECAST)
        .args(["run", "--local", "8", "--topology", "balanced:2x4", "--", "sleep", "60"])
        .env(k, v)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + LIMIT;
    // front-end + 2 comm nodes + 8 back-ends + 8 guards + 8 sleeps
    while processes_with_env(&t).len() < 27 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(processes_with_env(&t).len(), 27);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&t);
}

/// Processes carrying `needle` in their environment whose program is `name`.
fn processes_named(needle: &str, name: &str) -> Vec<u32> {
    let named = |pid: &u32| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|comm| comm.trim_end() == name)
    };
    processes_with_env(needle).into_iter().filter(named).collect()
}

/// Waits until `n` processes carrying `needle` run `name`.
fn wait_for_processes(needle: &str, name: &str, n: usize) {
    let deadline = Instant::now() + LIMIT;
    while processes_named(needle, name).len() < n {
        assert!(Instant::now() < deadline, "never saw {n} {name} processes");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A command whose shell starts a grandchild (`; true` keeps the shell from exec'ing it).
const FORKING: [&str; 3] = ["sh", "-c", "sleep 60; true"];

#[test]
fn processes_started_by_commands_die_when_the_front_end_is_killed() {
    // Regression: only a command's direct child had the die-with-parent signal, so
    // the shell died with its back-end and its `sleep` ran on.
    let t = tag();
    let (k, v) = t.split_once('=').unwrap();
    let mut child = Command::new(TREECAST)
        .args(["run", "--local", "4", "--topology", "kary:2", "--"])
        .args(FORKING)
        .env(k, v)
        .spawn()
        .unwrap();
    wait_for_processes(&t, "sleep", 4);
    child.kill().unwrap();
    child.wait().unwrap();
    assert_no_leftovers(&t);
}

#[test]
fn a_command_cut_off_by_its_time_limit_takes_the_processes_it_started_along() {
    let t = tag();
    let out = treecast(&t, &[&["run", "--local", "2", "--timeout", "1", "--"][..], &FORKING[..]].concat());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains("did not finish within 1.0 s and was killed"), "{stdout}");
    // `treecast` checked that no `sleep` (which carries the tag) was left behind.
}

#[tokio::test]
async fn processes_started_by_commands_die_when_the_network_shuts_down_under_them() {
    let net = launch("kary:2", 4).await;
    let needle = format!("TREECAST_SESSION={}", net.session());
    let s = net.new_stream(&net.broadcast_communicator(), StreamOptions::default()).await.unwrap();
    let argv: Vec<String> = FORKING.iter().map(|a| a.to_string()).collect();
    s.send(TAG_RUN, "%as %uld", &[argv.into(), Value::ULong(0)]).await.unwrap();
    let found = needle.clone();
    tokio::task::spawn_blocking(move || wait_for_processes(&found, "sleep", 4)).await.unwrap();
    // The back-ends leave while the commands run: each kills its command's group.
    finish(net).await;
}

#[tokio::test]
async fn a_command_cut_off_is_answered_even_if_a_process_that_left_its_group_holds_its_output() {
    let dir = TestDir::new("escaped");
    let mut net = launch("flat", 1).await;
    // `setsid` takes the sleep out of the command's process group; it keeps stdout open.
    let pidfile = dir.path("pid");
    let script = format!("setsid sleep 30 & echo $! > {}; sleep 60; true", pidfile.display());
    let argv = ["sh".to_owned(), "-c".to_owned(), script];
    let started = Instant::now();
    let report = treecast::apps::run::run_command(&mut net, &argv, Some(Duration::from_secs(1))).await;
    let escaped = std::fs::read_to_string(&pidfile).unwrap();
    Command::new("kill").args(["-9", escaped.trim()]).status().unwrap();
    let report = report.unwrap();
    assert!(started.elapsed() < Duration::from_secs(8), "waited {:?}: {report:?}", started.elapsed());
    assert_eq!(report.classes.len(), 1, "{report:?}");
    assert!(report.classes[0].stderr.contains("was killed"), "{report:?}");
    finish(net).await;
}

#[test]
fn topo_prints_trees_and_names_line_and_column_of_errors() {
    let t = tag();
    let out = treecast(&t, &["topo", "balanced:2x2", "--format", "mrnet"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success());
    assert!(text.contains("=>"), "{text}");

    let dir = std::env::temp_dir().join(format!("treecast-topo-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let bad = dir.join("bad.top");
    std::fs::write(&bad, "fe.example.org:0 => n1.example.org:1 n2:2 ;\nn1.example.org:1 => n2:2 ;\n")
        .unwrap();
    let out = treecast(&t, &["topo", bad.to_str().unwrap()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("line 2, column"), "{err}");
    let out = treecast(&t, &["run", "--local", "2", "--topology", bad.to_str().unwrap(), "--", "true"]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("line 2"));
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn demo_runs_and_explains_itself() {
    let t = tag();
    let out = treecast(&t, &["demo"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}\n{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("(expected 16120)") && text.contains("16120"), "{text}");
    assert!(text.contains("[0-15]"), "{text}");
}

// ---- attach mode ----

/// Launches a network in attach mode, starts its back-ends with `start` once the
/// attach file exists, and checks a sum over them; leaves nothing behind.
async fn attach_and_sum(spec: &str, n: usize, start: impl FnOnce(&Path, &str) -> std::process::Child) {
    let dir = std::env::temp_dir().join(format!("treecast-attach-test-{}-{spec}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("attach");
    let topo = Topology::from_spec(spec, Some(n)).unwrap();
    let launching = tokio::spawn(builder(topo).attach(&file, LIMIT).launch());
    let deadline = Instant::now() + LIMIT;
    while !file.exists() {
        assert!(Instant::now() < deadline, "no attach file");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let t = tag();
    let mut launcher = start(&file, &t);
    let net = launching.await.unwrap().unwrap();
    let mut s = net
        .new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum))
        .await
        .unwrap();
    s.send(TAG_ADD_RANK, "%d", &[Value::Int(1)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), n as i64 + (0..n as i64).sum::<i64>());
    finish(net).await;
    assert!(!file.exists(), "the attach file outlived the network");
    let _ = tokio::task::spawn_blocking(move || launcher.wait()).await;
    assert_no_leftovers(&t);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[tokio::test]
async fn backends_started_by_a_shell_loop_attach() {
    attach_and_sum("balanced:2x3", 6, |file, tag| {
        let (k, v) = tag.split_once('=').unwrap();
        let script = format!(
            "for r in 0 1 2 3 4 5; do TREECAST_RANK=$r {TREECAST} backend --attach {} & done; wait",
            file.display()
        );
        Command::new("/bin/sh").arg("-c").arg(script).env(k, v).spawn().unwrap()
    })
    .await;
}

#[tokio::test]
async fn backends_started_by_mpirun_attach() {
    if Command::new("mpirun").arg("--version").output().is_err() {
        eprintln!("skipped: mpirun is not installed (Debian: openmpi-bin)");
        return;
    }
    attach_and_sum("kary:2", 4, |file, tag| {
        let (k, v) = tag.split_once('=').unwrap();
        Command::new("mpirun")
            .args(["--allow-run-as-root", "--oversubscribe", "-n", "4", "-x", k])
            .args([TREECAST, "backend", "--attach"])
            .arg(file)
            .env(k, v)
            .stdout(std::process::Stdio::null())
            .spawn()
            .unwrap()
    })
    .await;
}

#[test]
fn a_backend_without_a_place_in_the_attach_file_says_so() {
    let dir = std::env::temp_dir().join(format!("treecast-attach-bad-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("attach");
    std::fs::write(
        &file,
        format!("version 1\nsession s\nsecret {}\nsize 1\nrank 0 1 unix:/nonexistent/s\n", "ab".repeat(32)),
    )
    .unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let out = Command::new(TREECAST)
        .args(["backend", "--attach"])
        .arg(&file)
        .args(["--rank", "3"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(err.contains("rank 3 has no place in the attach file"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_front_end_stops_at_once_when_it_cannot_write_the_attach_file() {
    // Regression: the front-end logged the error and still waited the whole attach
    // time for back-ends that had no file to find it by.
    let dir = TestDir::new("attach-unwritable");
    // A directory with something in it where the file should go: the rename fails.
    let file = dir.path("attach");
    std::fs::create_dir(&file).unwrap();
    std::fs::write(file.join("x"), b"").unwrap();
    let t = tag();
    let started = Instant::now();
    let path = file.to_str().unwrap();
    let args = ["run", "--local", "4", "--topology", "kary:2", "--attach-timeout", "300", "--attach", path];
    let out = treecast(&t, &[&args[..], &["--", "true"]].concat());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("cannot write the attach file"), "{err}");
    assert!(started.elapsed() < LIMIT, "waited {:?} for back-ends", started.elapsed());
    let names: Vec<_> = std::fs::read_dir(dir.root()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, ["attach"], "the temporary file with the secret survived the failure");
}

#[test]
fn a_backend_refuses_an_attach_file_others_can_read_or_another_user_owns() {
    let dir = TestDir::new("attach-untrusted");
    let file = dir.path("attach");
    let text =
        format!("version 1\nsession s\nsecret {}\nsize 1\nrank 0 1 unix:/nonexistent/s\n", "ab".repeat(32));
    std::fs::write(&file, text).unwrap();
    let attach = |what: &str| {
        let out =
            Command::new(TREECAST).args(["backend", "--rank", "0", "--attach"]).arg(&file).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert_eq!(out.status.code(), Some(2), "{what}: {err}");
        err
    };
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o644)).unwrap();
    let err = attach("mode 0644");
    assert!(err.contains("has mode 0644") && err.contains("chmod 600"), "{err}");
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
    // Trusted now: it gets as far as connecting to the (missing) parent.
    let err = attach("private");
    assert!(err.contains("/nonexistent/s"), "{err}");
    if !is_root() {
        eprintln!("skipped the other-owner case: changing a file's owner needs root");
        return;
    }
    std::os::unix::fs::chown(&file, Some(1), None).unwrap();
    let err = attach("owned by uid 1");
    assert!(err.contains("owned by uid 1"), "{err}");
}

fn is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|euid| euid == "0"))
        .unwrap()
}
