//! Flow control both ways on real trees: a stream the tool does not read, or a child
//! that stops reading, holds up only itself, and what waits is bounded in bytes.

use std::time::Duration;

use crate::common::local::*;
use crate::common::tree::finish;
use treecast::apps::protocol::*;
use treecast_api::{RankSet, StreamOptions, SyncMode, Topology, TransformKind, Value};

#[tokio::test]
async fn a_stream_the_tool_does_not_read_holds_up_no_other_stream() {
    // Flow control regression: stream `unread` gets more waves than the front-end
    // buffers (ROOT_WINDOW), so the tree must hold them back per stream; stream
    // `read` must still complete, then every held wave must arrive intact.
    let topo = Topology::from_spec("balanced:2x4", Some(8)).unwrap();
    let window = treecast_api::Window { packets: 4096, bytes: 64 << 20 };
    let net = builder(topo).receive_window(window).launch().await.unwrap();
    let all = net.broadcast_communicator();
    let unread = net.new_stream(&all, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let read = net.new_stream(&all, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
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
        let s = sum_stream(&net).await;
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
    let s = net.new_stream(&net.broadcast_communicator(), options).await.unwrap();
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
    let side = net
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
