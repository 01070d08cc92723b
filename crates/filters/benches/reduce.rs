//! Criterion benchmarks of what a comm node does with a wave coming up a stream.
//!
//! * `sum_filter`: the built-in sum filter (`builtin(TransformKind::Sum)`) reducing one
//!   wave of 16 or 64 packets, each `%d` or `%ald` with 1024 elements. This includes
//!   decoding every payload and encoding the result. Throughput in packets.
//! * `sync_wait_for_all`: a wait-for-all [`Synchronizer`] with 64 children, fed one
//!   packet per child until the wave completes. Throughput in packets.
//!
//! Run: `cargo bench -p treecast-filters --bench reduce -- --warm-up-time 1 --measurement-time 2`.

// criterion's macros generate undocumented items
#![allow(missing_docs)]

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use treecast_filters::TransformKind;
use treecast_filters::{builtin, FilterContext, Synchronizer};
use treecast_wire::{decode_values, encode_values, Frame, FrameHeader, SyncMode, Value};

fn packet(rank: u32, values: &[Value]) -> Frame {
    let mut payload = Vec::new();
    encode_values(values, &mut payload);
    Frame::new(FrameHeader::data(5, 0, rank), payload)
}

/// A wave of `n` packets from ranks `0..n`, each carrying `make(rank)`.
fn wave(n: u32, make: impl Fn(u32) -> Vec<Value>) -> Vec<Frame> {
    (0..n).map(|rank| packet(rank, &make(rank))).collect()
}

fn bench_sum(c: &mut Criterion) {
    let ctx = FilterContext { stream: 5, is_root: false };
    let mut group = c.benchmark_group("sum_filter");
    for n in [16u32, 64] {
        let scalar = wave(n, |rank| vec![Value::Int(rank as i32)]);
        let array = wave(n, |rank| vec![Value::LongArray((0..1024).map(|i| i64::from(rank) + i).collect())]);

        // Check the result once, so that the figures are those of a correct reduction.
        let mut sum = builtin(TransformKind::Sum);
        let out = sum.apply(scalar.clone(), &ctx).expect("sum of %d");
        let total = (0..n as i32).sum::<i32>();
        assert_eq!(decode_values(&out[0].payload).expect("decodes"), vec![Value::Int(total)]);
        let out = sum.apply(array.clone(), &ctx).expect("sum of %ald");
        let want: Vec<i64> = (0..1024).map(|i| i64::from(n) * i + i64::from(total)).collect();
        assert_eq!(decode_values(&out[0].payload).expect("decodes"), vec![Value::LongArray(want)]);

        group.throughput(Throughput::Elements(u64::from(n)));
        for (label, input) in [("d", &scalar), ("ald1024", &array)] {
            group.bench_function(format!("{label}/wave{n}"), |b| {
                // The filter consumes its wave: clone it (reference counts only) untimed.
                b.iter_batched(
                    || input.clone(),
                    |w| sum.apply(black_box(w), &ctx).expect("sums"),
                    BatchSize::SmallInput,
                );
            });
        }
    }
    group.finish();
}

fn bench_sync(c: &mut Criterion) {
    const CHILDREN: u32 = 64;
    let packets = wave(CHILDREN, |rank| vec![Value::Int(rank as i32)]);
    let now = Instant::now();
    let mut sync = Synchronizer::new(SyncMode::WaitForAll, 0..CHILDREN as usize);

    let push_wave = |sync: &mut Synchronizer, frames: Vec<Frame>| {
        let mut waves = Vec::new();
        for (child, frame) in frames.into_iter().enumerate() {
            waves.extend(sync.push(child, frame, now));
        }
        waves
    };
    let waves = push_wave(&mut sync, packets.clone());
    assert_eq!(waves.len(), 1);
    assert_eq!(waves[0].frames.len(), CHILDREN as usize);
    assert_eq!(sync.queued(), 0);

    let mut group = c.benchmark_group("sync_wait_for_all");
    group.throughput(Throughput::Elements(u64::from(CHILDREN)));
    group.bench_function("push/wave64", |b| {
        // Every iteration completes exactly one wave, so the state is the same after it.
        b.iter_batched(|| packets.clone(), |frames| push_wave(&mut sync, frames), BatchSize::SmallInput);
    });
    group.finish();
}

criterion_group!(benches, bench_sum, bench_sync);
criterion_main!(benches);
