//! The cost of recording one frame's latency components: what monitoring adds per frame.
//! `cargo bench -p treecast-monitor --bench record`.
//!
//! References, measured in the same run: the `hdrhistogram` library's own record
//! of the same four samples (what counting into slots replaces), and two readings
//! of the monotonic clock with one counter incremented (what a sample cannot cost
//! less than, as the monitoring issue put it). The last lines print the ratios.

#![allow(missing_docs)]
#![allow(clippy::unwrap_used)] // a bench: a failure here is a bug to see at once

use std::time::{Duration, Instant};

use criterion::{black_box, criterion_group, Criterion};
use hdrhistogram::Histogram;
use treecast_monitor::{Component, Key, Recorder, HIGHEST_NS, SIGNIFICANT_DIGITS};

/// The next pseudo-random latency, 1 ns to 1 ms.
fn next_ns(ns: u64) -> u64 {
    ns.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1) % 1_000_000 + 1
}

/// A frame's four components counted into slots found once, as the route counts them.
fn count_into_slots(r: &mut Recorder, slots: &[treecast_monitor::Slot; 4], ns: &mut u64) {
    for &slot in slots {
        r.add_at(black_box(slot), *ns, 1);
        *ns = next_ns(*ns);
    }
}

/// The same four samples through the library's record, one histogram per component.
fn library_record(histograms: &mut [Histogram<u64>; 4], ns: &mut u64) {
    for h in histograms.iter_mut() {
        h.saturating_record(black_box(*ns));
        *ns = next_ns(*ns);
    }
}

/// Two readings of the monotonic clock and one counter incremented at their difference.
fn two_clock_reads_and_an_increment(counts: &mut [u64], ns: &mut u64) {
    let start = Instant::now();
    let end = Instant::now();
    let at = (end.duration_since(start).as_nanos() as usize + *ns as usize) % counts.len();
    counts[at] += 1;
    *ns = next_ns(*ns);
}

fn histograms() -> [Histogram<u64>; 4] {
    std::array::from_fn(|_| Histogram::new_with_bounds(1, HIGHEST_NS, SIGNIFICANT_DIGITS).unwrap())
}

fn record(c: &mut Criterion) {
    let mut r = Recorder::default();
    let key = Key { link: 1, up: true, tag: 7, program: 0 };
    let mut ns = 1_000u64;
    c.bench_function("record one sample", |b| {
        b.iter(|| {
            ns = next_ns(ns);
            r.record(black_box(key), Component::Net, black_box(64), ns);
        })
    });
    c.bench_function("record a frame's four components", |b| {
        b.iter(|| {
            for component in Component::ALL {
                r.record(black_box(key), component, black_box(64), ns);
                ns = next_ns(ns);
            }
        })
    });
    // What a sender records for 16 frames written by one write: each its own queue
    // time, one send time.
    c.bench_function("record the queue and send of 16 frames written at once", |b| {
        b.iter(|| {
            for i in 0..16u64 {
                r.record(black_box(key), Component::Queue, black_box(64), 1_000 + i * 300);
            }
            for _ in 0..16 {
                r.record(black_box(key), Component::Send, black_box(64), black_box(2_500));
            }
        })
    });
    // What the route records for 16 equal frames of one batch (one pass, one write,
    // one read): each component once, with the count.
    c.bench_function("record the four components of 16 frames of one batch", |b| {
        b.iter(|| {
            for component in Component::ALL {
                r.record_n(black_box(key), component, black_box(64), black_box(2_500), 16);
            }
        })
    });
    // What the route does: each component's cell found once, then counted into.
    c.bench_function("count a frame's four components into slots", |b| {
        let slots = Component::ALL.map(|component| r.slot(key, component, 64));
        b.iter(|| count_into_slots(&mut r, &slots, &mut ns))
    });
    c.bench_function("reference: the library's record of a frame's four samples", |b| {
        let mut h = histograms();
        b.iter(|| library_record(&mut h, &mut ns))
    });
    c.bench_function("reference: two clock readings and one counter incremented", |b| {
        let mut counts = vec![0u64; 4_608];
        b.iter(|| two_clock_reads_and_an_increment(&mut counts, &mut ns))
    });
    // A sample that differs from the last in every call and goes to another cell
    // than the last: each one a new run, its cell looked up.
    c.bench_function("record one sample, each a new run, two cells alternating", |b| {
        let keys = [key, Key { link: 2, ..key }];
        let mut i = 0usize;
        b.iter(|| {
            i += 1;
            r.record(black_box(keys[i % 2]), Component::Net, black_box(64), 1_000 + (i % 7) as u64 * 300);
        })
    });
}

/// Nanoseconds per call of `f`: the median of 21 batches of 100,000 calls.
fn per_call(mut f: impl FnMut()) -> f64 {
    let mut batches: Vec<Duration> = (0..21)
        .map(|_| {
            let start = Instant::now();
            for _ in 0..100_000 {
                f();
            }
            start.elapsed()
        })
        .collect();
    batches.sort();
    batches[10].as_secs_f64() * 1e9 / 100_000.0
}

/// The ratios of counting a frame's four components to the references, measured in
/// turn in this run.
fn ratios() {
    let mut r = Recorder::default();
    let key = Key { link: 1, up: true, tag: 7, program: 0 };
    let slots = Component::ALL.map(|component| r.slot(key, component, 64));
    let (mut h, mut counts, mut ns) = (histograms(), vec![0u64; 4_608], 1_000u64);
    let slotted = per_call(|| count_into_slots(&mut r, &slots, &mut ns));
    let library = per_call(|| library_record(&mut h, &mut ns));
    let clock = per_call(|| two_clock_reads_and_an_increment(&mut counts, &mut ns));
    println!("a frame's four components into slots: {slotted:.1} ns");
    println!("  against the library's record of the four: {library:.1} ns ({:.2}x)", slotted / library);
    println!("  against two clock readings and one increment: {clock:.1} ns ({:.2}x)", slotted / clock);
}

criterion_group!(benches, record);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    ratios();
}
