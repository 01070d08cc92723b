//! Striped links on loopback: frames whole and in order over 2 and 4 connections,
//! and a connection cut mid-transfer (on the sending or the receiving side) with
//! nothing lost or delivered twice.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::future::poll_fn;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::Bytes;
use treecast_monitor::Component;
use treecast_wire::{FrameHeader, LinkTable};

use super::*;
use crate::handshake::Accepted;

const LIMIT: Duration = Duration::from_secs(60);

/// Two routes joined by one striped link of `count` connections over loopback TCP,
/// made through the rail handshake and [`Rails`].
async fn pair(count: u8) -> (StripedRoute, LinkId, StripedRoute, LinkId) {
    pair_with(count, stall::DEFAULT_LIMIT).await
}

/// As [`pair`], both routes giving up a connection that stands still for `stall`.
async fn pair_with(count: u8, stall: Duration) -> (StripedRoute, LinkId, StripedRoute, LinkId) {
    let secret = Secret::generate();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let s2 = secret.clone();
    let accepting = tokio::spawn(async move {
        let mut rails = Rails::default();
        loop {
            let (tcp, peer) = listener.accept().await.unwrap();
            let mut stream = Stream::Tcp(tcp);
            let got = handshake::accept_any(&mut stream, &s2, &peer.to_string(), LIMIT).await.unwrap();
            let Accepted::Rail { node_id, token, index, count } = got else { panic!("not a rail: {got:?}") };
            let socket = stream.into_socket().unwrap();
            if let Some(group) = rails.arrived((node_id, token), (index, count), socket, Instant::now()) {
                assert_eq!(node_id, 5);
                return group;
            }
        }
    });
    let mine = connect(&[addr], count, 5, &secret, LIMIT).await.unwrap();
    let theirs = accepting.await.unwrap();
    assert_eq!(theirs.len(), usize::from(count));
    let mut ids = LinkTable::new();
    let (la, lb) = (ids.insert(()), ids.insert(()));
    // The limit comes after the links, as a node's plan comes after its parent
    // link: the links' watches take it then (`a` from a plan, `b` as a back-end's
    // member plan gives it).
    let mut a = StripedRoute::default();
    a.add_striped(la, mine, "b".into()).unwrap();
    let mut plan = treecast_wire::LaunchPlan::local("s", String::new(), 1);
    (plan.max_frame, plan.stripe_stall_ms) = (a.max_frame as u32, stall.as_millis() as u32);
    Route::apply_plan(&mut a, &plan);
    let mut b = StripedRoute::default();
    b.add_striped(lb, theirs, "a".into()).unwrap();
    Route::set_stripe_stall(&mut b, stall);
    (a, la, b, lb)
}

fn frames(big: usize) -> Vec<Frame> {
    let mut out = Vec::new();
    for i in 0..200u32 {
        out.push(Frame::new(FrameHeader::data(1, i as i32, 0), vec![i as u8; i as usize]));
    }
    let payload: Bytes = (0..big).map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1]).collect();
    out.push(Frame::new(FrameHeader::data(2, -1, 0), payload));
    for i in 200..300u32 {
        out.push(Frame::new(FrameHeader::data(1, i as i32, 0), vec![i as u8; 70_000 + i as usize]));
    }
    out
}

/// Polls both routes until `b` has `want` frames (or fails); `cut` runs once when
/// `b` holds `cut_after` pieces in order.
async fn carry(
    a: &mut StripedRoute,
    b: &mut StripedRoute,
    lb: LinkId,
    want: usize,
    cut_after: u64,
    mut cut: impl FnMut(&mut StripedRoute, &mut StripedRoute),
) -> Vec<Frame> {
    let mut got = Vec::new();
    let mut cut_done = false;
    let run = poll_fn(|cx| loop {
        let mut any = a.poll_recv(cx, &mut |_, e| panic!("the sender got {e:?}"));
        any |= b.poll_recv(cx, &mut |l, e| {
            assert_eq!(l, lb);
            match e {
                RouteEvent::Frame(f) => got.push(f),
                other => panic!("the receiver got {other:?}"),
            }
        });
        if !cut_done && b.links.get(lb).is_some_and(|l| l.inc.in_order() >= cut_after) {
            cut_done = true;
            cut(a, b);
        }
        if got.len() >= want {
            return Poll::Ready(());
        }
        if !any {
            return Poll::Pending;
        }
    });
    tokio::time::timeout(LIMIT, run).await.expect("the frames did not all arrive within a minute");
    got
}

fn assert_same(sent: &[Frame], got: &[Frame]) {
    assert_eq!(got.len(), sent.len(), "frames delivered");
    for (i, (s, g)) in sent.iter().zip(got).enumerate() {
        assert_eq!(s.header, g.header, "frame {i}'s header");
        assert!(s.payload == g.payload, "frame {i}'s payload ({} bytes) differs", s.payload.len());
    }
}

async fn whole_and_in_order(count: u8) {
    let (mut a, la, mut b, lb) = pair(count).await;
    let sent = frames(64 << 20);
    for f in &sent {
        a.send(&[la], f);
    }
    let got = carry(&mut a, &mut b, lb, sent.len(), u64::MAX, |_, _| {}).await;
    assert_same(&sent, &got);
    assert_eq!(b.duplicates(lb), 0);
    assert_eq!(a.connections(la), usize::from(count));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_connections_carry_a_64_mib_frame_and_small_ones_whole_and_in_order() {
    whole_and_in_order(2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_connections_carry_a_64_mib_frame_and_small_ones_whole_and_in_order() {
    whole_and_in_order(4).await;
}

async fn cut_mid_transfer(on_receiver: bool) {
    let (mut a, la, mut b, lb) = pair(3).await;
    let sent = frames(64 << 20);
    for f in &sent {
        a.send(&[la], f);
    }
    let got = carry(&mut a, &mut b, lb, sent.len(), 40, |a, b| {
        let cut = if on_receiver { b.break_connection(lb, 1) } else { a.break_connection(la, 1) };
        assert!(cut, "connection 1 was live");
    })
    .await;
    assert_same(&sent, &got);
    assert_eq!(b.connections(lb), 2, "the cut connection is gone on the receiver");
    // And the link still carries frames both ways afterwards.
    let more = Frame::new(FrameHeader::data(3, 7, 1), vec![9u8; 1 << 20]);
    b.send(&[lb], &more);
    let back = carry(&mut b, &mut a, la, 1, u64::MAX, |_, _| {}).await;
    assert_same(&[more], &back);
    assert_eq!(a.connections(la), 2, "the cut connection is gone on the sender");
    assert!(a.resent(la) > 0, "the cut connection's pieces went again");
    eprintln!("resent {} pieces, {} copies dropped", a.resent(la), b.duplicates(lb));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_on_the_receiver_mid_transfer_loses_and_duplicates_nothing() {
    cut_mid_transfer(true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_cut_on_the_sender_mid_transfer_loses_and_duplicates_nothing() {
    cut_mid_transfer(false).await;
}

/// A rail that goes down resets nothing: what is sent on it just stops arriving.
/// Here the receiver stops reading its connection 1, which leaves the sender's
/// pieces on it in the kernels' buffers, undelivered, while connection 0 moves. A
/// small frame every 50 ms stands for the heartbeats that keep a live link moving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_that_stops_delivering_is_given_up_and_its_pieces_go_on_the_other() {
    let (mut a, la, mut b, lb) = pair_with(2, Duration::from_millis(300)).await;
    b.links.get_mut(lb).unwrap().conns[1]._tasks[0].0.abort();
    let sent = frames(64 << 20);
    for f in &sent {
        a.send(&[la], f);
    }
    let mut got = Vec::new();
    let mut beats = tokio::time::interval(Duration::from_millis(50));
    let run = poll_fn(|cx| loop {
        let mut any = a.poll_recv(cx, &mut |_, e| panic!("the sender got {e:?}"));
        any |= b.poll_recv(cx, &mut |_, e| match e {
            RouteEvent::Frame(f) if f.header.stream == 9 => {}
            RouteEvent::Frame(f) => got.push(f),
            other => panic!("the receiver got {other:?}"),
        });
        if beats.poll_tick(cx).is_ready() {
            any = true;
            a.send(&[la], &Frame::new(FrameHeader::data(9, 0, 0), vec![1u8; 8]));
        }
        if got.len() >= sent.len() {
            return Poll::Ready(());
        }
        if !any {
            return Poll::Pending;
        }
    });
    tokio::time::timeout(LIMIT, run).await.expect("the frames did not all arrive within a minute");
    assert_same(&sent, &got);
    assert_eq!(a.connections(la), 1, "the connection that stood still was given up");
    assert!(a.resent(la) > 0, "its pieces went again on the other");
    eprintln!("resent {} pieces, {} copies dropped", a.resent(la), b.duplicates(lb));
}

/// A stream kept off striping sends all the pieces of a frame on one connection
/// (the others' go to whichever connection has the fewest bytes queued, which on
/// loopback may well be one too, so only the kept stream is checked).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_that_chose_tcp_keeps_each_frame_on_one_connection() {
    let (mut a, la, mut b, lb) = pair(2).await;
    let payload: Bytes = (0..(8usize << 20)).map(|i| i as u8).collect();
    // Bytes written on each connection of `a`'s link.
    let written = |a: &StripedRoute| a.written(la);
    a.set_stream_route(2, Some(RouteChoice::Tcp));
    for round in 0..4 {
        let before = written(&a);
        let sent = [Frame::new(FrameHeader::data(2, round, 0), payload.clone())];
        a.send(&[la], &sent[0]);
        assert_same(&sent, &carry(&mut a, &mut b, lb, 1, u64::MAX, |_, _| {}).await);
        // The writers count a write once it is done: wait until the frame is all
        // counted, its header and its pieces' headers too.
        let frame_len = HEADER_LEN + payload.len();
        let on_wire = (frame_len + frame_len.div_ceil(PIECE) * PIECE_HEADER_LEN) as u64;
        let until = Instant::now() + LIMIT;
        while written(&a).iter().sum::<u64>() - before.iter().sum::<u64>() < on_wire {
            assert!(Instant::now() < until, "the writers never counted the frame");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        let used = written(&a).iter().zip(&before).filter(|(x, y)| x > y).count();
        assert_eq!(used, 1, "connections that carried frame {round} of the tcp stream");
    }
    a.set_stream_route(2, None);
    assert_eq!(a.choices.of(2), RouteChoice::Network, "the stream's choice, once gone, still applies");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_closes_when_its_last_connection_ends_and_an_orderly_close_says_so() {
    let (mut a, la, mut b, lb) = pair(2).await;
    a.send(&[la], &Frame::new(FrameHeader::data(1, 1, 0), vec![1u8; 300_000]));
    a.close(la, Close::Flush);
    let mut got = Vec::new();
    let mut closed = None;
    let run = poll_fn(|cx| loop {
        let mut any = a.poll_recv(cx, &mut |_, e| panic!("the closing side got {e:?}"));
        any |= b.poll_recv(cx, &mut |_, e| match e {
            RouteEvent::Frame(f) => got.push(f),
            RouteEvent::Closed(r) => closed = Some(r),
            RouteEvent::Timed(..) => panic!("no timed frame was sent"),
        });
        if closed.is_some() {
            return Poll::Ready(());
        }
        if !any {
            return Poll::Pending;
        }
    });
    tokio::time::timeout(LIMIT, run).await.unwrap();
    assert_eq!(got.len(), 1);
    assert_eq!(closed, Some(None), "an orderly close");
    assert_eq!(b.connections(lb), 0);
}

#[test]
fn rails_group_a_links_connections_and_drop_stale_groups() {
    let mut rails = Rails::default();
    let now = Instant::now();
    let (x, y) = std::os::unix::net::UnixStream::pair().unwrap();
    assert!(rails.arrived((1, [1; TOKEN]), (1, 2), Socket::Unix(x), now).is_none());
    assert!(rails.arrived((2, [1; TOKEN]), (0, 2), Socket::Unix(y), now).is_none(), "another node's link");
    let (z, _w) = std::os::unix::net::UnixStream::pair().unwrap();
    assert_eq!(rails.arrived((1, [1; TOKEN]), (0, 2), Socket::Unix(z), now).map(|g| g.len()), Some(2));
    assert_eq!(rails.expire(now + Duration::from_secs(1)), 1);
}

/// While recording, a striped link stamps its frames and the receiver counts each
/// frame's net latency and delivery, keyed like a TCP link's; stopped, a frame that
/// came with an earlier hop's stamp leaves without it (the stamp is per hop).
#[tokio::test]
async fn recording_stamps_the_frames_and_the_receiver_counts_net_and_deliver() {
    let (mut a, la, mut b, lb) = pair(2).await;
    // b is the parent: the frames go up the link of node 3.
    b.place_link(lb, LinkPlace { lower_node: 3, to_parent: false });
    a.monitor_start(7);
    b.monitor_start(7);
    let sent: Vec<Frame> = (0..5u8).map(|i| Frame::new(FrameHeader::data(4, 9, 0), vec![i; 100])).collect();
    for f in &sent {
        a.send(&[la], f);
    }
    let got = carry(&mut a, &mut b, lb, sent.len(), u64::MAX, |_, _| {}).await;
    assert!(got.iter().all(|f| f.header.stamp().is_some()), "every frame stamped while recording");
    let report = b.monitor_report();
    for component in [Component::Net, Component::Deliver] {
        let cell = report
            .cells
            .iter()
            .find(|c| c.component == component && c.link == 3 && c.up && c.tag == 9 && c.program == 7)
            .unwrap_or_else(|| panic!("no {component:?} cell in {:?}", report.cells));
        assert_eq!(cell.count, 5, "{component:?}");
    }
    assert!(a.monitor_report().cells.is_empty(), "the sender records no queue or send of its own");

    a.monitor_stop();
    b.monitor_stop();
    let mut forwarded = Frame::new(FrameHeader::data(4, 9, 0), vec![1; 10]);
    forwarded.header.flags |= FLAG_STAMPED;
    forwarded.header.timestamp_ns = 12_345;
    a.send(&[la], &forwarded);
    let got = carry(&mut a, &mut b, lb, 1, u64::MAX, |_, _| {}).await;
    assert_eq!(got[0].header.stamp(), None, "an earlier hop's stamp is not this hop's");
    assert_eq!(got[0].payload, forwarded.payload);
}
