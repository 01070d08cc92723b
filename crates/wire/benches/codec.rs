//! Criterion benchmarks of the wire codec: typed values to a framed buffer and back.
//!
//! * `codec_bytes`: one frame per iteration, throughput in wire bytes (header +
//!   payload), for small payloads (`%d`, `%d %s` with a 16-byte string) and 64 KiB
//!   ones (`%alf` with 8192 doubles, `%b` with 65536 bytes).
//!   - `encode`: values → payload ([`encode_values`]) → one-frame [`encode_batch`].
//!   - `decode_batch`: [`decode_batch`] → [`decode_values`].
//!   - `decode_stream`: [`cut_frames`] (the cutter every link runs) over the received
//!     buffer → [`decode_values`].
//! * `codec_batch64`: 64 small `%d` frames per iteration, throughput in packets.
//!
//! Run: `cargo bench -p treecast-wire --bench codec -- --warm-up-time 1 --measurement-time 2`.

// criterion's macros generate undocumented items
#![allow(missing_docs)]

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use treecast_wire::{
    cut_frames, decode_batch, decode_values, encode_batch, encode_values, Format, Frame, FrameHeader, Value,
    MAX_PAYLOAD_LEN,
};

/// One benchmark input: a label, the values of one payload and their format.
struct Case {
    name: &'static str,
    values: Vec<Value>,
}

fn cases() -> Vec<Case> {
    let doubles: Vec<f64> = (0..8192).map(|i| f64::from(i) * 0.5).collect();
    let raw: Vec<u8> = (0..65536u32).map(|i| (i % 251) as u8).collect();
    let cases = vec![
        Case { name: "small_d", values: vec![Value::Int(42)] },
        Case { name: "small_d_s16", values: vec![Value::Int(42), Value::from("0123456789abcdef")] },
        Case { name: "64KiB_alf8192", values: vec![Value::DoubleArray(doubles)] },
        Case { name: "64KiB_b65536", values: vec![Value::bytes(raw)] },
    ];
    // The labels say which format each case exercises: keep them honest.
    let formats = ["%d", "%d %s", "%alf", "%b"];
    for (case, format) in cases.iter().zip(formats) {
        let want = Format::parse(format).expect("benchmark format parses");
        want.check(&case.values).expect("benchmark values match their format");
    }
    cases
}

fn header() -> FrameHeader {
    FrameHeader::data(7, 1, 3)
}

/// What a sender does: encode the values, frame them, write the frame to a buffer.
fn encode_one(values: &[Value]) -> Bytes {
    let mut payload = Vec::new();
    encode_values(values, &mut payload);
    encode_batch(&[Frame::new(header(), payload)])
}

fn bench_bytes(c: &mut Criterion) {
    let mut group = c.benchmark_group("codec_bytes");
    for case in cases() {
        let wire = encode_one(&case.values);
        // Round-trip once so that a broken codec fails here rather than measuring garbage.
        let frames = decode_batch(wire.clone()).expect("decodes");
        assert_eq!(frames.len(), 1);
        assert_eq!(decode_values(&frames[0].payload).expect("values decode"), case.values);

        group.throughput(Throughput::Bytes(wire.len() as u64));
        group.bench_function(format!("encode/{}", case.name), |b| {
            b.iter(|| encode_one(black_box(&case.values)));
        });
        group.bench_function(format!("decode_batch/{}", case.name), |b| {
            b.iter(|| {
                let frames = decode_batch(black_box(wire.clone())).expect("decodes");
                frames.iter().map(|f| decode_values(&f.payload).expect("values decode")).collect::<Vec<_>>()
            });
        });
        // The streaming path a link reader takes. The copy into a receive buffer stands
        // for the socket read and is done in the untimed setup.
        group.bench_function(format!("decode_stream/{}", case.name), |b| {
            b.iter_batched(
                || BytesMut::from(&wire[..]),
                |mut buf| {
                    let frames = cut_frames(&mut buf, MAX_PAYLOAD_LEN).expect("decodes");
                    let frame = frames.first().expect("one whole frame");
                    decode_values(&frame.payload).expect("values decode")
                },
                BatchSize::SmallInput,
            );
        });
    }
    group.finish();
}

const BATCH: usize = 64;

fn bench_batch(c: &mut Criterion) {
    let values: Vec<Vec<Value>> = (0..BATCH as i32).map(|i| vec![Value::Int(i)]).collect();
    let encode = |values: &[Vec<Value>]| {
        let frames: Vec<Frame> = values
            .iter()
            .enumerate()
            .map(|(rank, v)| {
                let mut payload = Vec::new();
                encode_values(v, &mut payload);
                Frame::new(FrameHeader::data(7, 1, rank as u32), payload)
            })
            .collect();
        encode_batch(&frames)
    };
    let wire = encode(&values);
    let decode = |wire: Bytes| {
        decode_batch(wire)
            .expect("decodes")
            .iter()
            .map(|f| decode_values(&f.payload).expect("values decode"))
            .collect::<Vec<_>>()
    };
    assert_eq!(decode(wire.clone()), values);

    let mut group = c.benchmark_group("codec_batch64");
    group.throughput(Throughput::Elements(BATCH as u64));
    group.bench_function("encode/64x_d", |b| b.iter(|| encode(black_box(&values))));
    group.bench_function("decode/64x_d", |b| b.iter(|| decode(black_box(wire.clone()))));
    group.finish();
}

criterion_group!(benches, bench_bytes, bench_batch);
criterion_main!(benches);
