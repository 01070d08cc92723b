//! What recording costs one hop of a link, with nothing else on the machine: a
//! 64-byte frame sent back and forth between two routes over a Unix socket pair,
//! with recording off and on at both ends (two hops per iteration: each one a
//! send, flush, write, read, cut and hand-over).
//! `cargo bench -p treecast-transport --bench hop`.
//!
//! Knobs (environment): `HOP_THRASH_KB=N` writes a line of every 64 bytes of an
//! N KiB buffer after each hop, for caches as cold as a node's that slept between
//! two frames (the hops alone are timed then);
//! `HOP_BATCH=N` sends N frames per hop in one pass of the sender (what back-to-back
//! reductions make), so that the figures are per batch;
//! `HOP_LINKS=N` links the two routes by N socket pairs, and each hop sends its
//! frames on all of them in one pass (what a comm node's multicast to N children
//! makes), the other route reading them all: the figures are per hop, not per link;
//! `HOP_ROUNDS=N` round trips per measurement (5,000; fewer for a large thrash);
//! `HOP_ONLY=on|off` times one kind alone, 20,000 round trips unless `HOP_ROUNDS`
//! says otherwise, for a cache simulator (`valgrind --tool=cachegrind
//! --cache-sim=yes`), whose instruction and miss counts per kind subtract exactly.

#![allow(clippy::unwrap_used)] // a bench: a failure here is a bug to see at once

use std::task::Poll;
use std::time::Instant;

use treecast_transport::recording::{mono_now, NodeClock};
use treecast_transport::{LinkId, LinkTable, MonitoredRoute, Route, RouteEvent, Socket, StreamRoute};
use treecast_wire::{Frame, FrameHeader, MAX_PAYLOAD_LEN};

/// Two routes linked by `links` socket pairs: (a, its links, b, its links).
fn linked(links: usize) -> (StreamRoute, Vec<LinkId>, StreamRoute, Vec<LinkId>) {
    let mut table = LinkTable::new();
    let (mut a, mut b) = (StreamRoute::new(MAX_PAYLOAD_LEN), StreamRoute::new(MAX_PAYLOAD_LEN));
    // A node's clock: its time base read once, then arithmetic (as `ClockSource`).
    for route in [&mut a, &mut b] {
        let base_ns = 1_800_000_000_000_000_000;
        route.set_clock(NodeClock { base: mono_now(), base_ns, offset_ns: 0, drift_ppb: 0, epoch_ns: 0 });
    }
    let (mut las, mut lbs) = (Vec::new(), Vec::new());
    for _ in 0..links {
        let (x, y) = std::os::unix::net::UnixStream::pair().unwrap();
        x.set_nonblocking(true).unwrap();
        y.set_nonblocking(true).unwrap();
        let (la, lb) = (table.insert(()), table.insert(()));
        a.add(la, Socket::Unix(x), "b".into()).unwrap();
        b.add(lb, Socket::Unix(y), "a".into()).unwrap();
        las.push(la);
        lbs.push(lb);
    }
    (a, las, b, lbs)
}

/// One hop: `from` sends `batch` copies of `frame` on every one of `links` in one
/// pass, `to` takes them all in.
async fn hop(from: &mut StreamRoute, links: &[LinkId], to: &mut StreamRoute, frame: &Frame, batch: usize) {
    for _ in 0..batch {
        from.send(links, frame);
    }
    let batch = batch * links.len();
    from.flush();
    let mut got = 0;
    std::future::poll_fn(|cx| {
        to.poll_recv(cx, &mut |_, e| got += usize::from(matches!(e, RouteEvent::Frame(_))));
        if got == batch {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
}

/// Touches a line of every 64 bytes of `junk`: evicts what the last hop left in the caches.
fn thrash(junk: &mut [u8]) {
    for i in (0..junk.len()).step_by(64) {
        junk[i] = junk[i].wrapping_add(1);
    }
}

/// Seconds per hop over `iterations` round trips (two hops each).
fn time_hops(
    rt: &tokio::runtime::Runtime,
    routes: &mut (StreamRoute, Vec<LinkId>, StreamRoute, Vec<LinkId>),
    frame: &Frame,
    iterations: u32,
    junk: &mut [u8],
    batch: usize,
) -> f64 {
    let (a, la, b, lb) = routes;
    if junk.is_empty() {
        let start = Instant::now();
        rt.block_on(async {
            for _ in 0..iterations {
                hop(a, la, b, frame, batch).await;
                hop(b, lb, a, frame, batch).await;
            }
        });
        return start.elapsed().as_secs_f64() / f64::from(2 * iterations);
    }
    // The hops alone are timed: a thrash of a buffer larger than the last-level
    // cache takes milliseconds, whose noise would bury a hop's.
    let mut hops = std::time::Duration::ZERO;
    rt.block_on(async {
        for _ in 0..iterations {
            for there in [true, false] {
                let start = Instant::now();
                match there {
                    true => hop(a, la, b, frame, batch).await,
                    false => hop(b, lb, a, frame, batch).await,
                }
                hops += start.elapsed();
                thrash(junk);
            }
        }
    });
    std::hint::black_box(&*junk);
    hops.as_secs_f64() / f64::from(2 * iterations)
}

/// The knob `name` of the environment, or `default` when it is not set; a value that
/// is not a number stops the bench, rather than measuring something else than asked.
fn knob(name: &str, default: usize) -> usize {
    match std::env::var(name) {
        Err(_) => default,
        Ok(v) => v.trim().parse().unwrap_or_else(|_| panic!("{name}={v:?}: expected a whole number")),
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = rt.enter();
    let frame = Frame::new(FrameHeader::data(1, 7, 0), vec![1; 64]);
    let kb = knob("HOP_THRASH_KB", 0);
    let mut junk = vec![1u8; kb * 1024];
    let batch = knob("HOP_BATCH", 1).max(1);
    let links = knob("HOP_LINKS", 1).max(1);
    let only = std::env::var("HOP_ONLY").ok();
    let default_rounds = if only.is_some() { 20_000 } else { 5_000 };
    let iterations = u32::try_from(knob("HOP_ROUNDS", default_rounds).max(1)).unwrap_or(u32::MAX);
    let mut time = |routes: &mut _, iterations| time_hops(&rt, routes, &frame, iterations, &mut junk, batch);
    let mut off = linked(links);
    let mut on = linked(links);
    on.0.monitor_start(1);
    on.2.monitor_start(1);
    if let Some(only) = only {
        // One kind alone, for a cache simulator: HOP_ONLY=on or off.
        let routes = if only == "on" { &mut on } else { &mut off };
        let t = time(routes, iterations);
        println!("{only}: {:.0} ns per hop", t * 1e9);
        return;
    }
    let pairs = 40;
    time(&mut off, iterations);
    time(&mut on, iterations);
    let (mut offs, mut ons, mut changes) = (Vec::new(), Vec::new(), Vec::new());
    for pair in 0..pairs {
        let (t_off, t_on) = if pair % 2 == 0 {
            let t = time(&mut off, iterations);
            (t, time(&mut on, iterations))
        } else {
            let t = time(&mut on, iterations);
            (time(&mut off, iterations), t)
        };
        offs.push(t_off);
        ons.push(t_on);
        changes.push(t_on - t_off);
    }
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2] * 1e9
    };
    let (off_ns, on_ns) = (median(&mut offs), median(&mut ons));
    println!(
        "one hop of {batch} 64-byte frame(s) on each of {links} link(s) ({pairs} pairs of {iterations} round trips, order alternating): \
         not recording {off_ns:.0} ns (the reference), recording {on_ns:.0} ns ({:.3}x), \
         recording adds {:.0} ns per hop (median of the pairs)",
        on_ns / off_ns,
        median(&mut changes)
    );
}
