//! The cost of recording one frame's latency components: what monitoring adds per frame.

#![allow(missing_docs)]

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use treecast_monitor::{Component, Key, Recorder};

fn record(c: &mut Criterion) {
    let mut r = Recorder::default();
    let key = Key { link: 1, up: true, tag: 7, program: 0 };
    let mut ns = 1_000u64;
    c.bench_function("record one sample", |b| {
        b.iter(|| {
            ns = ns.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1) % 1_000_000 + 1;
            r.record(black_box(key), Component::Net, black_box(64), ns);
        })
    });
    c.bench_function("record a frame's four components", |b| {
        b.iter(|| {
            for component in Component::ALL {
                r.record(black_box(key), component, black_box(64), ns);
                ns = ns.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1) % 1_000_000 + 1;
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
        b.iter(|| {
            for slot in slots {
                r.add_at(black_box(slot), ns, 1);
                ns = ns.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1) % 1_000_000 + 1;
            }
        })
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

criterion_group!(benches, record);
criterion_main!(benches);
