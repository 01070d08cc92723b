//! Streams on real trees on loopback: reductions with every filter over several
//! shapes and both link kinds, format and filter errors, and the packets a back-end
//! sends right before it returns.

use std::collections::BTreeSet;

use crate::common::local::*;
use crate::common::tree::finish;
use treecast::apps::protocol::*;
use treecast_api::{
    ApiError, Event, Match, RankSet, Request, StreamOptions, SyncMode, Topology, TransformKind, Value,
    HELD_LIMIT,
};

async fn sum_waves(spec: &str, n: usize) {
    let net = launch(spec, n).await;
    assert_eq!(net.backends(), n as u32);
    let s = sum_stream(&net).await;
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

/// A tool's own tags reach the generic back-end as plain packets, which it echoes,
/// whatever their number: the numbers its requests once had (1 ran a command, 5 made
/// the ranks it listed exit, 7 answered a burst) no longer mean anything there.
#[tokio::test]
async fn the_generic_back_end_echoes_a_tools_own_tags_whatever_their_number() {
    let net = launch("flat", 4).await;
    let s = sum_stream(&net).await;
    for tag in [0, 1, 3, 5, 7, 16, 21, 100, FIRST_RESERVED_TAG - 1] {
        s.send(tag, "%d", &[Value::Int(2)]).await.unwrap();
        let p = s.recv_timeout(LIMIT).await.unwrap();
        assert_eq!((p.tag(), int(&p)), (tag, 8), "tag {tag}");
    }
    // Once the request that made ranks 0 and 1 exit: now echoed, element-wise summed.
    s.send(5, "%ad", &[Value::IntArray(vec![0, 1])]).await.unwrap();
    let p = s.recv_timeout(LIMIT).await.unwrap();
    assert_eq!(p.values().unwrap(), vec![Value::IntArray(vec![0, 4])]);
    s.send(100, "%d", &[Value::Int(1)]).await.unwrap();
    assert_eq!(int(&s.recv_timeout(LIMIT).await.unwrap()), 4, "every rank still answers");
    assert!(net.lost_ranks().is_empty(), "{}", net.lost_ranks());
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
    let s = sum_stream(&net).await;
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
    let sum = net.new_stream(&low, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let max = net.new_stream(&high, StreamOptions::reduce(TransformKind::Max)).await.unwrap();
    let min = net.new_stream(&all, StreamOptions::reduce(TransformKind::Min)).await.unwrap();
    let cat = net.new_stream(&low, StreamOptions::reduce(TransformKind::Concat)).await.unwrap();
    let avg = net.new_stream(&all, StreamOptions::reduce(TransformKind::Avg)).await.unwrap();
    let eq = net.new_stream(&all, StreamOptions::reduce(TransformKind::EqClass)).await.unwrap();
    let raw = net
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
async fn a_filter_a_comm_node_lacks_refuses_the_stream_and_names_the_node() {
    let mut registry = treecast_api::FilterRegistry::builtin();
    registry.register("front-end-only", 1..=1, |_| Ok(treecast_filters_null()));
    let topo = Topology::from_spec("balanced:2x2", None).unwrap();
    let net = builder(topo).filters(registry).launch().await.unwrap();
    let options =
        StreamOptions { up: treecast_api::FilterSpec::new("front-end-only", 1), ..StreamOptions::default() };
    let s = net.new_stream(&net.broadcast_communicator(), options).await.unwrap();
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
async fn mismatched_formats_are_reported_and_the_wave_goes_on() {
    let net = launch("flat", 4).await;
    let s = sum_stream(&net).await;
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
    let s = net.new_stream(&net.broadcast_communicator(), options).await.unwrap();
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

/// Regression: `send` only queued, so a back-end that returned right after sending
/// lost its last packets (a 32-rank sum came out short, with no error anywhere).
#[tokio::test]
async fn a_backend_that_returns_right_after_sending_loses_nothing() {
    let command = [TEST_BACKEND.to_owned(), "send-and-return".to_owned()];
    const PACKETS: i32 = 200;
    for unix in [true, false] {
        let topo = Topology::from_spec("balanced:4x8", None).unwrap();
        let net = builder(topo).unix_links(unix).backend_command(command.clone()).launch().await.unwrap();
        let n = i64::from(net.backends());
        let s = sum_stream(&net).await;
        s.send(TAG_ECHO, "%d", &[Value::Int(PACKETS)]).await.unwrap();
        for wave in 0..PACKETS {
            let p = s.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("wave {wave} (unix {unix}): {e}"));
            assert_eq!(int(&p), n * (n - 1) / 2, "wave {wave} (unix {unix}): a rank's packet was lost");
        }
        finish(net).await;
    }
}

/// Receives that match on tag and source rank, and sends and receives as requests:
/// a matched receive skips what it does not take without losing it, a cancelled
/// request takes nothing, and every packet arrives exactly once.
#[tokio::test]
async fn matched_receives_and_requests_skip_nothing_and_lose_nothing() {
    let net = launch("balanced:2x2", 4).await;
    let s = net.new_stream(&net.broadcast_communicator(), StreamOptions::default()).await.unwrap();
    // Posted before anything arrives: one that never matches, one for a single packet.
    let never = s.irecv(Match::tag(999));
    let last = s.irecv(Match::tag(101).and_rank(3));
    // The test back-end echoes unknown tags: every rank answers each send once.
    let sends =
        vec![s.isend(100, "%d", &[Value::Int(7)]).unwrap(), s.isend(101, "%d", &[Value::Int(8)]).unwrap()];
    for outcome in Request::wait_all(sends).await {
        outcome.unwrap();
    }
    let p = tokio::time::timeout(LIMIT, last).await.unwrap().unwrap();
    assert_eq!((p.tag(), p.rank(), int(&p)), (101, 3, 8));
    never.cancel();
    assert!(matches!(never.await, Err(ApiError::Cancelled)));
    let mut seen = BTreeSet::from([(101, 3)]);
    let p = tokio::time::timeout(LIMIT, s.recv_matching(Match::tag(100).and_rank(2))).await.unwrap().unwrap();
    assert_eq!((p.tag(), p.rank(), int(&p)), (100, 2, 7));
    seen.insert((100, 2));
    for _ in 0..6 {
        let p = s.recv_timeout(LIMIT).await.unwrap();
        assert!(seen.insert((p.tag(), p.rank())), "{} from rank {} came twice", p.tag(), p.rank());
        assert_eq!(int(&p), if p.tag() == 100 { 7 } else { 8 });
    }
    assert_eq!(seen.len(), 8);
    assert!(s.try_recv().is_none());
    finish(net).await;
}

/// A matched receive that skips more than the mailbox may hold fails, naming how
/// many it holds, instead of taking without bound; nothing is lost: what it held and
/// what stayed in the tree under flow control arrive, once each, to plain receives.
#[tokio::test]
async fn a_matched_receive_past_the_held_limit_fails_and_loses_nothing() {
    let net = launch("flat", 1).await;
    let s = sum_stream(&net).await;
    let sent = HELD_LIMIT + 1;
    s.send(TAG_BURST, "%d", &[Value::Int(i32::try_from(sent).unwrap())]).await.unwrap();
    let err = tokio::time::timeout(LIMIT * 4, s.recv_matching(Match::tag(100))).await.unwrap();
    assert!(
        matches!(err, Err(ApiError::Unmatched { held, .. }) if held == HELD_LIMIT),
        "expected Unmatched with {HELD_LIMIT} held, got {err:?}"
    );
    for i in 0..sent {
        let p = s.recv_timeout(LIMIT).await.unwrap_or_else(|e| panic!("packet {i} of {sent}: {e}"));
        assert_eq!((p.tag(), int(&p)), (TAG_BURST, 1), "packet {i}");
    }
    assert!(s.try_recv().is_none(), "a packet came twice");
    finish(net).await;
}

/// Requests made and waited for on several threads at once, each receiving only the
/// packets its match names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_from_several_threads_each_get_their_own_packets() {
    let net = launch("balanced:2x2", 4).await;
    let s = net.new_stream(&net.broadcast_communicator(), StreamOptions::default()).await.unwrap();
    let runtime = tokio::runtime::Handle::current();
    let got = tokio::task::block_in_place(|| {
        std::thread::scope(|scope| {
            let threads: Vec<_> = (0..4u32)
                .map(|i| {
                    let (s, runtime) = (&s, runtime.clone());
                    scope.spawn(move || {
                        let _inside = runtime.enter();
                        let tag = 200 + i as i32;
                        let mine: Vec<_> =
                            (0..4).map(|rank| s.irecv(Match::tag(tag).and_rank(rank))).collect();
                        runtime.block_on(s.isend(tag, "%d", &[Value::Int(i as i32)]).unwrap()).unwrap();
                        let packets = runtime.block_on(async {
                            tokio::time::timeout(LIMIT, Request::wait_all(mine)).await.unwrap()
                        });
                        packets
                            .into_iter()
                            .map(|p| p.unwrap())
                            .map(|p| (p.tag(), p.rank(), int(&p)))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect::<Vec<_>>()
        })
    });
    for (i, packets) in got.iter().enumerate() {
        let want: Vec<_> = (0..4).map(|rank| (200 + i as i32, rank, i as i64)).collect();
        assert_eq!(packets, &want, "thread {i}");
    }
    drop(s);
    finish(net).await;
}
