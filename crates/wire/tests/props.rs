//! Property tests: every encoder round-trips through its decoder, and no decoder
//! panics, whatever bytes it is given.
#![allow(clippy::unwrap_used)]

use bytes::{Bytes, BytesMut};
use proptest::collection::vec;
use proptest::prelude::*;
use treecast_wire::{
    decode_batch, decode_values, encode_batch, encode_values, ControlMsg, Format, Frame, FrameDecoder,
    FrameHeader, FrameKind, RankSet, Reader, ScalarType, SyncMode, TransformKind, Value, ValueType,
};

fn short_string() -> impl Strategy<Value = String> {
    "\\PC{0,12}"
}

/// Values whose floats come from `f32s` and `f64s`.
fn value_with(
    f32s: impl Strategy<Value = f32> + Clone + 'static,
    f64s: impl Strategy<Value = f64> + Clone + 'static,
) -> BoxedStrategy<Value> {
    const N: usize = 6;
    prop_oneof![
        any::<i8>().prop_map(Value::Char),
        any::<u8>().prop_map(Value::UChar),
        any::<i16>().prop_map(Value::Short),
        any::<u16>().prop_map(Value::UShort),
        any::<i32>().prop_map(Value::Int),
        any::<u32>().prop_map(Value::UInt),
        any::<i64>().prop_map(Value::Long),
        any::<u64>().prop_map(Value::ULong),
        f32s.clone().prop_map(Value::Float),
        f64s.clone().prop_map(Value::Double),
        short_string().prop_map(Value::Str),
        vec(any::<i8>(), 0..N).prop_map(Value::CharArray),
        vec(any::<u8>(), 0..N).prop_map(Value::UCharArray),
        vec(any::<i16>(), 0..N).prop_map(Value::ShortArray),
        vec(any::<u16>(), 0..N).prop_map(Value::UShortArray),
        vec(any::<i32>(), 0..N).prop_map(Value::IntArray),
        vec(any::<u32>(), 0..N).prop_map(Value::UIntArray),
        vec(any::<i64>(), 0..N).prop_map(Value::LongArray),
        vec(any::<u64>(), 0..N).prop_map(Value::ULongArray),
        vec(f32s, 0..N).prop_map(Value::FloatArray),
        vec(f64s, 0..N).prop_map(Value::DoubleArray),
        vec(short_string(), 0..N).prop_map(Value::StrArray),
        vec(any::<u8>(), 0..16).prop_map(Value::Bytes),
    ]
    .boxed()
}

/// Values without NaN, so that `==` is meaningful.
fn value() -> BoxedStrategy<Value> {
    use proptest::num::{f32 as F, f64 as D};
    let f32s = F::POSITIVE | F::NEGATIVE | F::NORMAL | F::SUBNORMAL | F::ZERO | F::INFINITE;
    let f64s = D::POSITIVE | D::NEGATIVE | D::NORMAL | D::SUBNORMAL | D::ZERO | D::INFINITE;
    value_with(f32s, f64s)
}

/// Values whose floats are arbitrary bit patterns, NaNs with payloads included.
fn value_any_bits() -> BoxedStrategy<Value> {
    value_with(any::<u32>().prop_map(f32::from_bits), any::<u64>().prop_map(f64::from_bits))
}

fn encode(values: &[Value]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_values(values, &mut out);
    out
}

fn scalar_type() -> impl Strategy<Value = ScalarType> {
    proptest::sample::select(ScalarType::ALL.to_vec())
}

fn value_type() -> impl Strategy<Value = ValueType> {
    prop_oneof![
        scalar_type().prop_map(ValueType::Scalar),
        scalar_type().prop_map(ValueType::Array),
        Just(ValueType::Bytes),
    ]
}

fn header() -> impl Strategy<Value = FrameHeader> {
    (
        prop_oneof![Just(FrameKind::Data), Just(FrameKind::Control), Just(FrameKind::Credit)],
        any::<u16>(),
        any::<u32>(),
        any::<i32>(),
        any::<u32>(),
        any::<u64>(),
    )
        .prop_map(|(kind, flags, stream, tag, rank, timestamp_ns)| FrameHeader {
            kind,
            flags,
            stream,
            tag,
            rank,
            timestamp_ns,
        })
}

fn frame() -> impl Strategy<Value = Frame> {
    (header(), vec(any::<u8>(), 0..48)).prop_map(|(h, p)| Frame::new(h, p))
}

fn rank_set() -> impl Strategy<Value = RankSet> {
    prop_oneof![
        vec(any::<u32>(), 0..6).prop_map(|v| v.into_iter().collect::<RankSet>()),
        vec((0u32..1000, 0u32..50), 0..5).prop_map(|v| {
            let mut s = RankSet::new();
            for (lo, n) in v {
                s.insert_range(lo, lo + n);
            }
            s
        }),
        Just(RankSet::single(u32::MAX)),
    ]
}

fn transform() -> impl Strategy<Value = TransformKind> {
    proptest::sample::select(TransformKind::ALL.to_vec())
}

fn sync_mode() -> impl Strategy<Value = SyncMode> {
    prop_oneof![
        Just(SyncMode::WaitForAll),
        any::<u32>().prop_map(SyncMode::TimeOut),
        Just(SyncMode::DoNotWait)
    ]
}

fn control_msg() -> impl Strategy<Value = ControlMsg> {
    prop_oneof![
        (
            short_string(),
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            vec(short_string(), 0..4),
            vec((short_string(), short_string()), 0..4),
            any::<u32>(),
        )
            .prop_map(
                |(topology, first_id, first_rank, total_backends, backend, env, startup_timeout_ms)| {
                    ControlMsg::Subtree {
                        topology,
                        first_id,
                        first_rank,
                        total_backends,
                        backend,
                        env,
                        startup_timeout_ms,
                    }
                }
            ),
        (rank_set(), any::<u32>()).prop_map(|(ranks, commnodes)| ControlMsg::Ready { ranks, commnodes }),
        short_string().prop_map(|message| ControlMsg::LaunchFailed { message }),
        (any::<u32>(), rank_set(), sync_mode(), transform(), transform())
            .prop_map(|(id, ranks, sync, up, down)| ControlMsg::NewStream { id, ranks, sync, up, down }),
        any::<u32>().prop_map(|id| ControlMsg::CloseStream { id }),
        (rank_set(), short_string()).prop_map(|(ranks, reason)| ControlMsg::RanksLost { ranks, reason }),
        (any::<u32>(), any::<u32>(), short_string())
            .prop_map(|(stream, rank, message)| ControlMsg::FilterError { stream, rank, message }),
        Just(ControlMsg::Shutdown),
    ]
}

/// Applies `(position, byte)` overwrites and then truncates to `cut` (modulo the length).
fn mutate(mut bytes: Vec<u8>, edits: &[(usize, u8)], cut: Option<usize>) -> Vec<u8> {
    if !bytes.is_empty() {
        let len = bytes.len();
        for &(pos, b) in edits {
            bytes[pos % len] = b;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut % (len + 1));
        }
    }
    bytes
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn values_round_trip(values in vec(value(), 0..8)) {
        let wire = encode(&values);
        prop_assert_eq!(decode_values(&wire).unwrap(), values);
    }

    #[test]
    fn values_keep_float_bit_patterns(values in vec(value_any_bits(), 0..8)) {
        // The encoding is injective, so equal re-encodings mean equal bits, NaNs included.
        let wire = encode(&values);
        let back = decode_values(&wire).unwrap();
        prop_assert_eq!(back.len(), values.len());
        prop_assert_eq!(encode(&back), wire);
    }

    #[test]
    fn format_of_values_round_trips(values in vec(value(), 0..8)) {
        let format = Format::of(&values);
        prop_assert_eq!(format.len(), values.len());
        format.check(&values).unwrap();
        let text = format.to_string();
        prop_assert_eq!(Format::parse(&text).unwrap(), format);
    }

    #[test]
    fn format_parses_any_spacing_and_synonym(
        items in vec((value_type(), proptest::sample::select(vec!["", " ", "  ", "\t", "\n ", "\u{3000}"]), any::<bool>()), 0..8),
        lead in proptest::sample::select(vec!["", " ", "\t"]),
    ) {
        let mut text = String::from(lead);
        for (ty, sep, upper) in &items {
            let spec = ty.spec();
            if *upper && matches!(ty, ValueType::Array(_)) {
                text.push_str(&spec.replacen("%a", "%A", 1));
            } else {
                text.push_str(spec);
            }
            text.push_str(sep);
        }
        let types: Vec<ValueType> = items.iter().map(|i| i.0).collect();
        let parsed = Format::parse(&text).unwrap();
        prop_assert_eq!(&parsed.types, &types);
        prop_assert_eq!(parsed.to_string(), types.iter().map(|t| t.spec()).collect::<Vec<_>>().join(" "));
    }

    #[test]
    fn frames_round_trip_in_batches(frames in vec(frame(), 0..6)) {
        let wire = encode_batch(&frames);
        prop_assert_eq!(wire.len(), frames.iter().map(Frame::wire_len).sum::<usize>());
        prop_assert_eq!(decode_batch(wire).unwrap(), frames);
    }

    #[test]
    fn frame_decoder_handles_any_split(frames in vec(frame(), 0..6), splits in vec(0usize..80, 0..20)) {
        let wire = encode_batch(&frames);
        let mut dec = FrameDecoder::new();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut rest = &wire[..];
        let mut sizes = splits.into_iter();
        while !rest.is_empty() {
            let n = sizes.next().unwrap_or(rest.len()).min(rest.len());
            buf.extend_from_slice(&rest[..n]);
            rest = &rest[n..];
            while let Some(f) = dec.decode(&mut buf).unwrap() {
                out.push(f);
            }
        }
        prop_assert_eq!(dec.decode(&mut buf).unwrap(), None);
        prop_assert!(buf.is_empty());
        prop_assert_eq!(out, frames);
    }

    #[test]
    fn control_round_trips(msg in control_msg()) {
        let wire = msg.encode();
        prop_assert_eq!(ControlMsg::decode(&wire).unwrap(), msg);
    }

    #[test]
    fn rank_set_round_trips(set in rank_set()) {
        let mut wire = Vec::new();
        set.encode(&mut wire);
        let mut r = Reader::new(&wire);
        prop_assert_eq!(RankSet::decode(&mut r).unwrap(), set);
        prop_assert_eq!(r.remaining(), 0);
    }

    #[test]
    fn decoders_never_panic_on_arbitrary_bytes(bytes in vec(any::<u8>(), 0..200)) {
        let _ = decode_values(&bytes);
        let _ = decode_batch(Bytes::from(bytes.clone()));
        let _ = ControlMsg::decode(&bytes);
        let _ = FrameHeader::decode(&bytes);
        let _ = RankSet::decode(&mut Reader::new(&bytes));
        let mut dec = FrameDecoder::new();
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(_)) = dec.decode(&mut buf) {}
    }

    #[test]
    fn decoders_never_panic_on_mutated_encodings(
        values in vec(value(), 0..6),
        msg in control_msg(),
        frames in vec(frame(), 0..4),
        edits in vec((any::<usize>(), any::<u8>()), 0..4),
        cut in proptest::option::of(any::<usize>()),
    ) {
        if let Ok(back) = decode_values(&mutate(encode(&values), &edits, cut)) {
            // Whatever decodes must re-encode to a payload that decodes the same.
            prop_assert_eq!(decode_values(&encode(&back)).unwrap().len(), back.len());
        }
        if let Ok(m) = ControlMsg::decode(&mutate(msg.encode(), &edits, cut)) {
            prop_assert_eq!(ControlMsg::decode(&m.encode()).unwrap(), m);
        }
        let _ = decode_batch(Bytes::from(mutate(encode_batch(&frames).to_vec(), &edits, cut)));
    }

    #[test]
    fn format_parse_never_panics(text in "\\PC{0,40}", grammar in "[%aAbcudhlfs \t]{0,30}") {
        let _ = Format::parse(&text);
        match Format::parse(&grammar) {
            // Whatever parses prints to a canonical form that parses the same.
            Ok(f) => prop_assert_eq!(Format::parse(&f.to_string()).unwrap(), f),
            Err(e) => prop_assert!(!e.to_string().is_empty()),
        }
    }
}
