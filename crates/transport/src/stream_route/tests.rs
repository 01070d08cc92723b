//! The route's tests: links between two routes over socket pairs.
#![allow(clippy::unwrap_used)]

use super::*;
use std::time::Instant;

use bytes::Bytes;
use treecast_wire::{encode_batch, FLAG_TIMED, MAX_PAYLOAD_LEN};
use treecast_wire::{FrameHeader, FLAG_PAYLOAD_FD, FLAG_STAMPED};

fn pair() -> (Socket, Socket) {
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    b.set_nonblocking(true).unwrap();
    (Socket::Unix(a), Socket::Unix(b))
}

fn ids() -> (LinkId, LinkId) {
    let mut t = crate::LinkTable::new();
    (t.insert(()), t.insert(()))
}

/// Runs `poll_recv` until `n` events came.
async fn recv(route: &mut StreamRoute, n: usize) -> Vec<(LinkId, RouteEvent)> {
    let mut got = Vec::new();
    tokio::time::timeout(
        Duration::from_secs(10),
        std::future::poll_fn(|cx| {
            route.poll_recv(cx, &mut |l, e| got.push((l, e)));
            if got.len() >= n {
                Poll::Ready(())
            } else {
                Poll::Pending
            }
        }),
    )
    .await
    .unwrap();
    got
}

/// Flushes `route` until everything queued is written.
async fn flushed(route: &mut StreamRoute) {
    std::future::poll_fn(|cx| {
        route.flush();
        route.poll_recv(cx, &mut |_, _| {});
        if route.is_flushed() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// Sends a 10-byte frame of tag 7 on `link` of `from` and returns what `to` read.
async fn hop(from: &mut StreamRoute, link: LinkId, to: &mut StreamRoute) -> Vec<(LinkId, RouteEvent)> {
    from.send(&[link], &Frame::new(FrameHeader::data(1, 7, 0), vec![1; 10]));
    flushed(from).await;
    recv(to, 1).await
}

/// A child's route and its parent's, one link between them: (child, its link,
/// parent, its link).
fn linked_routes() -> (StreamRoute, LinkId, StreamRoute, LinkId) {
    let (a, b) = pair();
    let (la, lb) = ids();
    let (mut child, mut parent) = (StreamRoute::new(MAX_PAYLOAD_LEN), StreamRoute::new(MAX_PAYLOAD_LEN));
    child.add(la, a, "parent".into()).unwrap();
    parent.add(lb, b, "child 4".into()).unwrap();
    (child, la, parent, lb)
}

/// A clock that stands at `ns`: its distortion takes back every nanosecond that passes.
fn fixed_clock(ns: i64) -> NodeClock {
    NodeClock { base: mono_now(), base_ns: 0, offset_ns: ns, drift_ppb: -1_000_000_000, epoch_ns: 0 }
}

#[tokio::test]
async fn while_monitoring_each_end_records_its_components_and_net_is_corrected_by_the_peer_clock() {
    use treecast_monitor::{Component, Key};
    let (mut child, la, mut parent, lb) = linked_routes();
    child.place_link(la, LinkPlace { lower_node: 4, to_parent: true });
    parent.place_link(lb, LinkPlace { lower_node: 4, to_parent: false });
    // The child's clock reads 5 s, the parent's 7 s, and the global clock says the
    // child's runs 2 s less 1 µs behind: each frame took 1 µs on the way.
    child.set_clock(fixed_clock(5_000_000_000));
    parent.set_clock(fixed_clock(7_000_000_000));
    parent.set_peer_clock(lb, PeerClock { offset_ns: -2_000_000_000 + 1_000, drift_ppb: 0, at_ns: 0 });
    child.monitor_start(9);
    parent.monitor_start(9);
    let sizes = [10usize, 100, ZERO_COPY_MIN * 2];
    for n in sizes {
        child.send(&[la], &Frame::new(FrameHeader::data(1, 7, 0), vec![1; n]));
    }
    flushed(&mut child).await;
    for (_, event) in recv(&mut parent, sizes.len()).await {
        let RouteEvent::Frame(f) = event else { panic!("{event:?}") };
        assert_eq!(f.header.timestamp_ns, 5_000_000_000, "stamped on the sender's clock");
    }
    let key = Key { link: 4, up: true, tag: 7, program: 9 };
    let count = |route: &mut StreamRoute, component: Component| -> (u64, u64) {
        let report = route.monitor_report();
        let cells = report.cells.iter().filter(|c| c.component == component);
        assert!(cells.clone().all(|c| c.key() == key), "{report:?}");
        cells.fold((0, 0), |(n, sum), c| (n + c.count, sum + c.sum_ns))
    };
    assert_eq!(count(&mut child, Component::Queue).0, 3);
    assert_eq!(count(&mut child, Component::Send).0, 3);
    assert_eq!(count(&mut child, Component::Net).0, 0, "the sender has no net");
    assert_eq!(count(&mut parent, Component::Net), (3, 3_000));
    assert_eq!(count(&mut parent, Component::Deliver).0, 3);
    assert_eq!(count(&mut parent, Component::Queue).0, 0);
    // A read waiting to be counted keeps the offset in effect when it was taken.
    hop(&mut child, la, &mut parent).await;
    parent.set_peer_clock(lb, PeerClock { offset_ns: -2_000_000_000 + 5_000, drift_ppb: 0, at_ns: 0 });
    assert_eq!(count(&mut parent, Component::Net), (4, 4_000));
    assert_eq!(count(&mut child, Component::Queue).0, 4);
    // Taken after the change, with the new offset.
    hop(&mut child, la, &mut parent).await;
    assert_eq!(count(&mut parent, Component::Net), (5, 9_000));

    // Stopped: nothing more is recorded, and frames no longer carry this clock.
    child.monitor_stop();
    parent.monitor_stop();
    let got = hop(&mut child, la, &mut parent).await;
    let RouteEvent::Frame(f) = &got[0].1 else { panic!() };
    assert_ne!(f.header.timestamp_ns, 5_000_000_000);
    assert_eq!(child.monitor_report().count(), 10);
    assert_eq!(parent.monitor_report().count(), 10);
    parent.monitor_clear();
    assert_eq!(parent.monitor_report().count(), 0);
}

#[tokio::test]
async fn samples_are_counted_by_batches_after_the_pass_has_written_what_it_sends_and_none_is_lost() {
    let (mut child, la, mut parent, lb) = linked_routes();
    child.monitor_start(1);
    parent.monitor_start(1);
    let frame = |tag| Frame::new(FrameHeader::data(1, tag, 0), vec![1; 10]);
    child.send(&[la], &frame(7));
    child.flush();
    assert_eq!(child.monitor.deferred.len(), 1, "a write's sample waits for its batch");
    assert_eq!(child.monitor.report().count(), 0);
    // The parent's read waits, and so does its reply's write.
    recv(&mut parent, 1).await;
    parent.send(&[lb], &frame(7));
    parent.flush();
    assert_eq!(parent.monitor.deferred.len(), 2);
    assert_eq!(parent.monitor.report().count(), 0, "nothing counted before a batch waits");
    // A report counts what waits.
    assert_eq!(parent.monitor_report().count(), 4, "net and deliver, queue and send");
    assert!(parent.monitor.deferred.is_empty());
    // The pass that fills a batch counts it, once its writes are done.
    for pass in 1..COUNT_BATCH {
        assert_eq!(child.monitor.report().count(), 0, "pass {pass}: nothing counted yet");
        child.send(&[la], &frame(7));
        child.flush();
        // Read, so that every write takes all it has (a full socket keeps frames in flight).
        recv(&mut parent, 1).await;
    }
    assert!(child.monitor.deferred.is_empty(), "a full batch is counted");
    assert_eq!(child.monitor.report().count(), 2 * COUNT_BATCH as u64, "queue and send of each");
    // A link closed before its samples are counted keeps them.
    recv(&mut child, 1).await;
    assert_eq!(child.monitor.deferred.len(), 1);
    child.close(la, Close::Now);
    assert_eq!(child.monitor_report().count(), 2 * COUNT_BATCH as u64 + 2);
    // A route read and never flushed still counts, within its bound: frames of
    // alternating tags make a sample each.
    let n = MAX_DEFERRED + 100;
    let (mut other, lo, mut reader, _) = linked_routes();
    reader.monitor_start(1);
    for i in 0..n {
        other.send(&[lo], &frame(7 + (i % 2) as i32));
    }
    flushed(&mut other).await;
    recv(&mut reader, n).await;
    assert!(
        reader.monitor.deferred.len() < MAX_DEFERRED,
        "{} samples waiting",
        reader.monitor.deferred.len()
    );
    assert_eq!(reader.monitor_report().count(), n as u64, "none lost (deliver only: the sender stamps none)");
}

#[tokio::test]
async fn samples_taken_before_a_link_moves_keep_the_place_they_were_taken_at() {
    let (mut child, la, mut parent, lb) = linked_routes();
    parent.place_link(lb, LinkPlace { lower_node: 4, to_parent: false });
    parent.monitor_start(1);
    child.send(&[la], &Frame::new(FrameHeader::data(1, 7, 0), vec![1; 10]));
    flushed(&mut child).await;
    recv(&mut parent, 1).await;
    // The child moves (a recovery) before the parent's pass ends.
    parent.place_link(lb, LinkPlace { lower_node: 6, to_parent: false });
    let links: Vec<u32> = parent.monitor_report().cells.iter().map(|c| c.link).collect();
    assert_eq!(links, [4], "counted under the place it was read at");
}

#[tokio::test]
async fn frames_stamped_in_place_across_cut_short_writes_are_each_stamped_and_counted_once() {
    use treecast_monitor::Component;
    let (mut child, la, mut parent, _) = linked_routes();
    child.set_clock(fixed_clock(5_000_000_000));
    child.monitor_start(1);
    parent.monitor_start(1);
    // About 2.6 MB in passes of 1,000 frames: more than the socket holds while
    // nobody reads, so writes are cut short in the middle of runs of frames.
    let n = 20_000usize;
    for i in 0..n {
        let tag = if i % 3000 < 2 { 8 } else { 7 };
        child.send(&[la], &Frame::new(FrameHeader::data(1, tag, 0), vec![(i % 251) as u8; 100]));
        if i % 1000 == 999 {
            child.flush();
        }
    }
    let writer = tokio::spawn(async move {
        flushed(&mut child).await;
        child
    });
    let got = recv(&mut parent, n).await;
    let mut child = writer.await.unwrap();
    for (i, (_, event)) in got.iter().enumerate() {
        let RouteEvent::Frame(f) = event else { panic!("{event:?}") };
        assert_eq!((f.header.stamp(), f.payload[0]), (Some(5_000_000_000), (i % 251) as u8), "frame {i}");
    }
    let count = |route: &mut StreamRoute, component: Component| -> u64 {
        route.monitor_report().cells.iter().filter(|c| c.component == component).map(|c| c.count).sum()
    };
    assert_eq!(count(&mut child, Component::Queue), n as u64);
    assert_eq!(count(&mut child, Component::Send), n as u64);
    assert_eq!(count(&mut parent, Component::Net), n as u64);
    assert_eq!(count(&mut parent, Component::Deliver), n as u64);
}

#[tokio::test]
async fn a_clock_probe_is_stamped_at_its_write_and_read_with_its_instant_while_nothing_records() {
    let (mut child, la, mut parent, _) = linked_routes();
    child.set_clock(fixed_clock(5_000_000_000));
    let mut probe = Frame::new(FrameHeader::control(), vec![1; 10]);
    probe.header.flags |= FLAG_TIMED;
    let before = Instant::now();
    child.send(&[la], &Frame::new(FrameHeader::data(1, 1, 0), vec![1; 10]));
    child.send(&[la], &probe);
    child.send(&[la], &Frame::new(FrameHeader::data(1, 3, 0), vec![1; 10]));
    flushed(&mut child).await;
    let got = recv(&mut parent, 3).await;
    let after = Instant::now();
    let frames: Vec<(&Frame, Option<Instant>)> = got
        .iter()
        .map(|(_, e)| match e {
            RouteEvent::Frame(f) => (f, None),
            RouteEvent::Timed(f, at) => (f, Some(*at)),
            RouteEvent::Closed(r) => panic!("closed: {r:?}"),
        })
        .collect();
    assert_eq!(frames.iter().map(|(f, _)| f.header.tag).collect::<Vec<_>>(), [1, 0, 3], "in order");
    let (timed, read_at) = frames[1];
    assert_eq!(timed.header.flags & FLAG_STAMPED, FLAG_STAMPED);
    assert_eq!(timed.header.timestamp_ns, 5_000_000_000, "stamped on the sender's clock");
    assert!(read_at.is_some_and(|at| before <= at && at <= after), "{read_at:?}");
    for (f, at) in [frames[0], frames[2]] {
        assert!(at.is_none() && f.header.flags & FLAG_STAMPED == 0, "nothing records: {f:?}");
    }
}

#[tokio::test]
async fn a_streams_own_program_tag_keeps_its_frames_apart_at_both_ends() {
    use treecast_monitor::Component;
    let (mut child, la, mut parent, lb) = linked_routes();
    child.place_link(la, LinkPlace { lower_node: 4, to_parent: true });
    parent.place_link(lb, LinkPlace { lower_node: 4, to_parent: false });
    for route in [&mut child, &mut parent] {
        route.monitor_start(9);
        route.set_stream_program(2, Some(5));
    }
    let send = |route: &mut StreamRoute, stream: u32| {
        route.send(&[la], &Frame::new(FrameHeader::data(stream, 7, 0), vec![1; 10]));
    };
    send(&mut child, 1);
    send(&mut child, 2);
    send(&mut child, 2);
    flushed(&mut child).await;
    recv(&mut parent, 3).await;
    // Gone: its frames fall back to the recording's tag. The parent's samples
    // of frames read before, not counted yet, keep the tag they came under.
    parent.set_stream_program(2, None);
    child.set_stream_program(2, None);
    send(&mut child, 2);
    flushed(&mut child).await;
    let programs = |route: &mut StreamRoute, component: Component| {
        let mut by_program = std::collections::BTreeMap::new();
        for c in route.monitor_report().cells.iter().filter(|c| c.component == component) {
            *by_program.entry(c.program).or_insert(0) += c.count;
        }
        by_program.into_iter().collect::<Vec<_>>()
    };
    assert_eq!(programs(&mut child, Component::Queue), [(5, 2), (9, 2)]);
    assert_eq!(programs(&mut child, Component::Send), [(5, 2), (9, 2)]);
    assert_eq!(programs(&mut parent, Component::Deliver), [(5, 2), (9, 1)]);
}

#[tokio::test]
async fn frames_staged_before_a_stop_keep_their_order_and_unstamped_frames_give_no_net() {
    use treecast_monitor::Component;
    let (mut child, la, mut parent, _) = linked_routes();
    child.monitor_start(1);
    parent.monitor_start(1);
    child.send(&[la], &Frame::new(FrameHeader::data(1, 1, 0), vec![1; 10]));
    child.monitor_stop();
    child.send(&[la], &Frame::new(FrameHeader::data(1, 2, 0), vec![2; 10]));
    flushed(&mut child).await;
    let tags: Vec<i32> = recv(&mut parent, 2)
        .await
        .into_iter()
        .map(|(_, e)| match e {
            RouteEvent::Frame(f) => f.header.tag,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(tags, [1, 2], "the frame sent after the stop did not overtake the staged one");
    let count = |r: &mut StreamRoute, component: Component| -> u64 {
        r.monitor_report().cells.iter().filter(|c| c.component == component).map(|c| c.count).sum()
    };
    // Frame 2 was not stamped by a recording sender: it has no net, only deliver.
    assert_eq!((count(&mut parent, Component::Net), count(&mut parent, Component::Deliver)), (1, 2));
    let report = parent.monitor_report();
    assert!(
        report.cells.iter().all(|c| c.count > 0),
        "no cell opened for samples that never came: {report:?}"
    );
    // Frame 1 was queued before the stop: its send is recorded after it.
    assert_eq!((count(&mut child, Component::Queue), count(&mut child, Component::Send)), (1, 1));
}

#[tokio::test]
async fn a_peer_that_sent_and_exited_is_read_to_its_end_although_our_write_to_it_failed() {
    // Regression: a write that failed (the peer had exited) dropped the link at
    // once, and the peer's last frames, already in our receive buffer, with it.
    use std::io::Write;
    let (a, b) = std::os::unix::net::UnixStream::pair().unwrap();
    a.set_nonblocking(true).unwrap();
    let (la, _) = ids();
    let mut route = StreamRoute::new(MAX_PAYLOAD_LEN);
    route.add(la, Socket::Unix(a), "back-end".into()).unwrap();
    let sent: Vec<Frame> = (0..3).map(|i| Frame::new(FrameHeader::data(1, i, 0), vec![7; 100])).collect();
    (&b).write_all(&encode_batch(&sent)).unwrap();
    drop(b);
    route.send(&[la], &Frame::new(FrameHeader::data(1, 9, 0), vec![1; 10]));
    route.flush();
    let got = recv(&mut route, sent.len() + 1).await;
    let tags: Vec<i32> = got
        .iter()
        .filter_map(|(_, e)| match e {
            RouteEvent::Frame(f) => Some(f.header.tag),
            _ => None,
        })
        .collect();
    assert_eq!(tags, [0, 1, 2], "{got:?}");
    assert!(matches!(got.last(), Some((_, RouteEvent::Closed(None)))), "a clean end after them: {got:?}");
    assert!(route.is_flushed(), "nothing stays queued for a link that cannot be written");
}

#[tokio::test]
async fn frames_cross_in_order_small_and_large_and_a_close_is_seen() {
    let (a, b) = pair();
    let (la, lb) = ids();
    let mut ra = StreamRoute::new(MAX_PAYLOAD_LEN);
    let mut rb = StreamRoute::new(MAX_PAYLOAD_LEN);
    ra.add(la, a, "b".into()).unwrap();
    rb.add(lb, b, "a".into()).unwrap();
    let sizes = [0usize, 1, 100, ZERO_COPY_MIN, 3 << 20, 5];
    for (i, &n) in sizes.iter().enumerate() {
        ra.send(&[la], &Frame::new(FrameHeader::data(1, i as i32, 0), vec![i as u8; n]));
    }
    let writer = tokio::spawn(async move {
        flushed(&mut ra).await;
        ra.close(la, Close::Flush);
        ra
    });
    let got = recv(&mut rb, sizes.len() + 1).await;
    for (i, &n) in sizes.iter().enumerate() {
        match &got[i].1 {
            RouteEvent::Frame(f) => {
                assert_eq!((f.header.tag, f.payload.len()), (i as i32, n));
                assert_eq!(f.header.timestamp_ns, 0, "not stamped: nothing records");
            }
            other => panic!("{other:?}"),
        }
    }
    assert!(matches!(got[sizes.len()].1, RouteEvent::Closed(None)));
    drop(writer.await.unwrap());
}

/// The payload size from which the tests send files.
const FILE_MIN: usize = 64 << 10;

/// Sends `frames` from one end of a Unix link to the other and returns them as read.
async fn across(frames: &[Frame], zero_copy_min: Option<usize>, recording: bool) -> Vec<Frame> {
    let (mut a, la, mut b, _) = linked_routes();
    a.set_zero_copy_min(zero_copy_min);
    if recording {
        a.monitor_start(1);
    }
    for f in frames {
        a.send(&[la], f);
    }
    let writer = tokio::spawn(async move {
        flushed(&mut a).await;
        a
    });
    let got = recv(&mut b, frames.len()).await;
    drop(writer.await.unwrap());
    got.into_iter()
        .map(|(_, e)| match e {
            RouteEvent::Frame(f) => f,
            other => panic!("{other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn large_payloads_cross_a_unix_link_as_sealed_files_in_order_with_the_small_ones() {
    // More files than one write carries, between small frames.
    let frames: Vec<Frame> = (0..3 * shared_payload::MAX_FDS_PER_MSG + 5)
        .map(|i| {
            let n = if i % 3 == 2 { 10 } else { FILE_MIN + i };
            let payload: Vec<u8> = (0..n).map(|j| (i * 7 + j) as u8).collect();
            Frame::new(FrameHeader::data(1, i as i32, 0), payload)
        })
        .collect();
    for recording in [false, true] {
        let got = across(&frames, Some(FILE_MIN), recording).await;
        assert_eq!(got.len(), frames.len());
        for (sent, got) in frames.iter().zip(&got) {
            assert_eq!(got.header.tag, sent.header.tag);
            assert_eq!(got.header.flags & FLAG_PAYLOAD_FD, 0, "the core never sees the flag");
            assert_eq!(got.payload, sent.payload);
            let as_file = sent.payload.len() >= FILE_MIN;
            assert_eq!(shared_payload::file_of(&got.payload).is_some(), as_file, "frame {}", sent.header.tag);
        }
    }
}

#[tokio::test]
async fn a_node_passes_a_payload_file_on_without_copying_it() {
    use std::os::unix::fs::MetadataExt;
    let inode = |payload: &Bytes| {
        let fd = shared_payload::file_of(payload).unwrap();
        std::fs::File::from(fd.try_clone().unwrap()).metadata().unwrap().ino()
    };
    let frame = Frame::new(FrameHeader::data(1, 0, 0), vec![9u8; 300_000]);
    let at_node = across(std::slice::from_ref(&frame), Some(FILE_MIN), false).await.remove(0);
    let passed_on = across(std::slice::from_ref(&at_node), Some(FILE_MIN), false).await.remove(0);
    assert_eq!(passed_on.payload, frame.payload);
    assert_eq!(inode(&at_node.payload), inode(&passed_on.payload), "the same file went on");
}

#[tokio::test]
async fn files_never_run_ahead_of_their_headers_when_writes_are_cut_short() {
    // A regression: with many small frames between file frames and a full
    // socket, each short write sent the next files early, until the receiver
    // held more unclaimed files than it allows and closed the link.
    let mut frames = Vec::new();
    for i in 0..200 {
        frames.push(Frame::new(FrameHeader::data(1, i, 0), vec![i as u8; FILE_MIN]));
        for j in 0..50 {
            frames.push(Frame::new(FrameHeader::data(2, j, 0), vec![j as u8; 2000]));
        }
    }
    let got = across(&frames, Some(FILE_MIN), false).await;
    assert_eq!(got.len(), frames.len());
    assert!(frames.iter().zip(&got).all(|(a, b)| a.payload == b.payload && a.header.tag == b.header.tag));
}

#[tokio::test]
async fn with_zero_copy_off_large_payloads_go_through_the_socket() {
    let frames = [Frame::new(FrameHeader::data(1, 0, 0), vec![3u8; 1 << 20])];
    let got = across(&frames, None, false).await;
    assert_eq!(got[0].payload, frames[0].payload);
    assert!(shared_payload::file_of(&got[0].payload).is_none());
}

#[tokio::test]
async fn malformed_and_oversized_frames_close_the_link_with_a_reason() {
    for (bytes, want) in [
        (vec![0xEEu8; 64], "malformed frame"),
        (
            encode_batch(&[Frame::new(FrameHeader::data(1, 0, 0), vec![0u8; 2000])]).to_vec(),
            "over this node's limit",
        ),
    ] {
        let (a, b) = pair();
        let (_, lb) = ids();
        let mut rb = StreamRoute::new(1000);
        rb.add(lb, b, "peer".into()).unwrap();
        let Socket::Unix(a) = a else { unreachable!() };
        std::io::Write::write_all(&mut &a, &bytes).unwrap();
        let got = recv(&mut rb, 1).await;
        match &got[0].1 {
            RouteEvent::Closed(Some(reason)) => assert!(reason.contains(want), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
}

/// Writes `bytes` to the far end of a link as its peer would, from a thread of its
/// own (more than a socket buffer holds waits for the route to read).
fn peer_writes(sock: &Socket, bytes: &[u8]) -> std::thread::JoinHandle<()> {
    let Socket::Unix(s) = sock else { unreachable!() };
    let s = s.try_clone().unwrap();
    s.set_nonblocking(false).unwrap();
    let bytes = bytes.to_vec();
    std::thread::spawn(move || std::io::Write::write_all(&mut &s, &bytes).unwrap())
}

#[tokio::test]
async fn a_childs_control_frame_over_its_allowance_closes_only_that_link() {
    let mut parent = StreamRoute::new(MAX_PAYLOAD_LEN);
    parent.set_max_control(64 << 10);
    let mut t = crate::LinkTable::new();
    let (rogue, wide, up) = (t.insert(()), t.insert(()), t.insert(()));
    let (rogue_end, a) = pair();
    let (wide_end, b) = pair();
    let (up_end, c) = pair();
    parent.add_peer(rogue, a, LinkPeer::Child { node_id: 4 }, "back-end 1".into()).unwrap();
    parent.add_peer(wide, b, LinkPeer::Child { node_id: 5 }, "comm node 5".into()).unwrap();
    parent.add_peer(up, c, LinkPeer::Parent, "parent".into()).unwrap();
    // A child over four back-ends may send four allowances' worth; the parent's frames
    // (launch plans, plug-in bytes) are held to the frame limit only.
    parent.set_reach(wide, 4);
    assert_eq!(parent.control_limit(rogue), Some(64 << 10));
    assert_eq!(parent.control_limit(wide), Some(256 << 10));
    assert_eq!(parent.control_limit(up), Some(MAX_PAYLOAD_LEN));
    // The rogue's header alone is enough to refuse it.
    let mut header = BytesMut::new();
    FrameHeader::control().encode(1 << 20, &mut header);
    peer_writes(&rogue_end, &header).join().unwrap();
    let got = recv(&mut parent, 1).await;
    match &got[..] {
        [(l, RouteEvent::Closed(Some(reason)))] if *l == rogue => {
            assert!(reason.contains("control frame of 1048576 bytes"), "{reason}");
            assert!(
                reason.contains("limit of 65536 bytes") && reason.contains("TREECAST_MAX_CONTROL"),
                "{reason}"
            );
        }
        other => panic!("{other:?}"),
    }
    let report = Frame::new(FrameHeader::control(), vec![7u8; 200 << 10]);
    let plan = Frame::new(FrameHeader::control(), vec![9u8; 1 << 20]);
    let writers = [
        peer_writes(&wide_end, &encode_batch(std::slice::from_ref(&report))),
        peer_writes(&up_end, &encode_batch(std::slice::from_ref(&plan))),
    ];
    let got = recv(&mut parent, 2).await;
    for w in writers {
        w.join().unwrap();
    }
    let mut sizes: Vec<(LinkId, usize)> = got
        .iter()
        .map(|(l, e)| match e {
            RouteEvent::Frame(f) => (*l, f.payload.len()),
            other => panic!("{other:?}"),
        })
        .collect();
    sizes.sort_by_key(|&(_, n)| n);
    assert_eq!(sizes, [(wide, 200 << 10), (up, 1 << 20)]);
}
