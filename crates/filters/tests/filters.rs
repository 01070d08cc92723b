//! The built-in transformation filters through the public API: every numeric type,
//! reductions through simulated trees, composition, and every error.

#![allow(clippy::unwrap_used)]

use bytes::Bytes;
use proptest::prelude::*;
use treecast_filters::TransformKind;
use treecast_filters::{
    apply_dropping_bad, builtin, check_format, decode_eq_classes, FilterContext, FilterError,
};
use treecast_wire::{
    decode_values, encode_values, Format, Frame, FrameHeader, RankSet, Value, FLAG_EQCLASS, FLAG_PARTIAL_AVG,
};

const STREAM: u32 = 7;
const TAG: i32 = -4;

fn frame(rank: u32, values: Vec<Value>) -> Frame {
    let mut buf = Vec::new();
    encode_values(&values, &mut buf);
    Frame::new(FrameHeader::data(STREAM, TAG, rank), buf)
}

fn ctx(is_root: bool) -> FilterContext {
    FilterContext { stream: STREAM, is_root }
}

/// Applies a fresh `kind` filter and expects exactly one output frame.
fn reduce_one(kind: TransformKind, wave: Vec<Frame>, is_root: bool) -> Frame {
    let mut out = builtin(kind).apply(wave, &ctx(is_root)).unwrap();
    assert_eq!(out.len(), 1, "{kind:?} outputs one frame");
    out.pop().unwrap()
}

fn values(kind: TransformKind, wave: Vec<Frame>) -> Vec<Value> {
    decode_values(&reduce_one(kind, wave, true).payload).unwrap()
}

fn reduce_err(kind: TransformKind, wave: Vec<Frame>) -> FilterError {
    builtin(kind).apply(wave, &ctx(true)).unwrap_err()
}

/// Sum, min, max and avg of one numeric type, as scalars and as arrays, at the root
/// and (for avg) through one comm node.
macro_rules! numeric_case {
    ($name:ident, $s:ident, $a:ident, $t:ty, [$x0:expr, $x1:expr, $x2:expr],
     sum = $sum:expr, min = $min:expr, max = $max:expr, avg = $avg:expr) => {
        #[test]
        fn $name() {
            use TransformKind::*;
            let xs: [$t; 3] = [$x0, $x1, $x2];
            let ranks = [4u32, 2, 9];
            let scalars: Vec<Frame> =
                xs.iter().zip(ranks).map(|(x, r)| frame(r, vec![Value::$s(*x)])).collect();
            assert_eq!(values(Sum, scalars.clone()), vec![Value::$s($sum)]);
            assert_eq!(values(Min, scalars.clone()), vec![Value::$s($min)]);
            assert_eq!(values(Max, scalars.clone()), vec![Value::$s($max)]);
            assert_eq!(values(Avg, scalars.clone()), vec![Value::$s($avg)]);
            // Through a comm node: a partial, then the root.
            let partial = reduce_one(Avg, scalars.clone(), false);
            assert_eq!(partial.header.flags, FLAG_PARTIAL_AVG);
            assert_eq!(values(Avg, vec![partial]), vec![Value::$s($avg)]);

            let out = reduce_one(Sum, scalars, true);
            assert_eq!(out.header, FrameHeader::data(STREAM, TAG, 2), "stream, tag, lowest rank");

            let arrays: Vec<Frame> = xs
                .iter()
                .zip(ranks)
                .enumerate()
                .map(|(i, (x, r))| frame(r, vec![Value::$a(vec![*x, (i + 1) as $t]), Value::Int(1)]))
                .collect();
            let two = |a: $t, b: $t| vec![Value::$a(vec![a, b])];
            assert_eq!(values(Sum, arrays.clone()), [two($sum, 6 as $t), vec![Value::Int(3)]].concat());
            assert_eq!(values(Min, arrays.clone()), [two($min, 1 as $t), vec![Value::Int(1)]].concat());
            assert_eq!(values(Max, arrays.clone()), [two($max, 3 as $t), vec![Value::Int(1)]].concat());
            assert_eq!(values(Avg, arrays.clone()), [two($avg, 2 as $t), vec![Value::Int(1)]].concat());
            let partial = reduce_one(Avg, arrays[..2].to_vec(), false);
            assert_eq!(
                values(Avg, vec![arrays[2].clone(), partial]),
                [two($avg, 2 as $t), vec![Value::Int(1)]].concat()
            );
        }
    };
}

numeric_case!(char_c, Char, CharArray, i8, [10, -3, 6], sum = 13, min = -3, max = 10, avg = 4);
numeric_case!(uchar_uc, UChar, UCharArray, u8, [10, 3, 6], sum = 19, min = 3, max = 10, avg = 6);
numeric_case!(short_hd, Short, ShortArray, i16, [-10, 3, -6], sum = -13, min = -10, max = 3, avg = -4);
numeric_case!(ushort_uhd, UShort, UShortArray, u16, [1000, 3, 6], sum = 1009, min = 3, max = 1000, avg = 336);
numeric_case!(
    int_d,
    Int,
    IntArray,
    i32,
    [-100_000, 3, 6],
    sum = -99_991,
    min = -100_000,
    max = 6,
    avg = -33_330
);
numeric_case!(
    uint_ud,
    UInt,
    UIntArray,
    u32,
    [4_000_000_000, 3, 6],
    sum = 4_000_000_009,
    min = 3,
    max = 4_000_000_000,
    avg = 1_333_333_336
);
numeric_case!(
    long_ld,
    Long,
    LongArray,
    i64,
    [-(1 << 40), 3, 8],
    sum = -(1 << 40) + 11,
    min = -(1 << 40),
    max = 8,
    avg = -366_503_875_921
);
numeric_case!(
    ulong_uld,
    ULong,
    ULongArray,
    u64,
    [1 << 40, 3, 7],
    sum = (1 << 40) + 10,
    min = 3,
    max = 1 << 40,
    avg = 366_503_875_928
);
numeric_case!(
    float_f,
    Float,
    FloatArray,
    f32,
    [1.5, -0.25, 2.0],
    sum = 3.25,
    min = -0.25,
    max = 2.0,
    avg = (3.25f64 / 3.0) as f32
);
numeric_case!(
    double_lf,
    Double,
    DoubleArray,
    f64,
    [1.5, -0.25, 2.0],
    sum = 3.25,
    min = -0.25,
    max = 2.0,
    avg = 3.25 / 3.0
);

#[test]
fn integer_sums_wrap() {
    let wave = vec![frame(0, vec![Value::UChar(200)]), frame(1, vec![Value::UChar(100)])];
    assert_eq!(values(TransformKind::Sum, wave), vec![Value::UChar(44)]);
    let wave = vec![frame(0, vec![Value::Long(i64::MAX)]), frame(1, vec![Value::Long(1)])];
    assert_eq!(values(TransformKind::Sum, wave), vec![Value::Long(i64::MIN)]);
}

#[test]
fn null_passes_the_wave_unchanged_without_copying() {
    let wave = vec![frame(3, vec![Value::Int(1)]), frame(1, vec![Value::Str("x".into())])];
    let ptrs: Vec<*const u8> = wave.iter().map(|f| f.payload.as_ptr()).collect();
    let out = builtin(TransformKind::Null).apply(wave.clone(), &ctx(false)).unwrap();
    assert_eq!(out, wave);
    assert_eq!(out.iter().map(|f| f.payload.as_ptr()).collect::<Vec<_>>(), ptrs);
}

#[test]
fn empty_wave_gives_nothing() {
    for kind in TransformKind::ALL {
        assert!(builtin(kind).apply(Vec::new(), &ctx(true)).unwrap().is_empty());
    }
}

#[test]
fn avg_partial_layout() {
    let wave = vec![
        frame(5, vec![Value::Int(3), Value::FloatArray(vec![1.0, 2.0])]),
        frame(6, vec![Value::Int(4), Value::FloatArray(vec![0.5, 0.5])]),
    ];
    let out = reduce_one(TransformKind::Avg, wave, false);
    assert_eq!(out.header.flags, FLAG_PARTIAL_AVG);
    assert_eq!(out.header.rank, 5);
    assert_eq!(
        decode_values(&out.payload).unwrap(),
        vec![
            Value::Double(7.0),
            Value::DoubleArray(vec![1.5, 2.5]),
            Value::ULong(2),
            Value::Str("%d %af".into())
        ]
    );
}

/// Leaves 0..=7 with values; comm node A has 2 back-ends, comm node B has 5, and the
/// root also has back-end 7 directly: the root's wave mixes partials and a plain packet.
#[test]
fn avg_through_an_unequal_two_level_tree_is_the_global_average() {
    let xs: [i32; 8] = [1, 2, 100, 7, -3, 9, 11, 40];
    let leaf =
        |r: usize| frame(r as u32, vec![Value::Int(xs[r]), Value::DoubleArray(vec![xs[r] as f64, 1.0])]);
    let a = reduce_one(TransformKind::Avg, (0..2).map(leaf).collect(), false);
    let b = reduce_one(TransformKind::Avg, (2..7).map(leaf).collect(), false);
    let root = values(TransformKind::Avg, vec![a, b, leaf(7)]);
    let sum: i32 = xs.iter().sum();
    assert_eq!(root, vec![Value::Int(sum / 8), Value::DoubleArray(vec![f64::from(sum) / 8.0, 1.0])]);
    // The naive average of averages would differ.
    assert_ne!(sum / 8, ((1 + 2) / 2 + (100 + 7 - 3 + 9 + 11) / 5 + 40) / 3);
}

#[test]
fn avg_negative_integers_round_toward_zero() {
    let wave =
        vec![frame(0, vec![Value::Int(-10)]), frame(1, vec![Value::Int(3)]), frame(2, vec![Value::Int(-6)])];
    assert_eq!(values(TransformKind::Avg, wave), vec![Value::Int(-4)]);
}

#[test]
fn avg_rejects_a_malformed_partial() {
    let mut bad = frame(3, vec![Value::Int(1)]);
    bad.header.flags = FLAG_PARTIAL_AVG;
    let err = reduce_err(TransformKind::Avg, vec![frame(0, vec![Value::Int(1)]), bad]);
    assert!(matches!(err, FilterError::Malformed { rank: 3, .. }), "{err}");
    // A partial for another original format mismatches.
    let partial = reduce_one(TransformKind::Avg, vec![frame(4, vec![Value::Long(1)])], false);
    let err = reduce_err(TransformKind::Avg, vec![frame(0, vec![Value::Int(1)]), partial]);
    assert!(matches!(err, FilterError::FormatMismatch { rank: 4, .. }), "{err}");
    assert!(err.to_string().contains("\"%ld\"") && err.to_string().contains("\"%d\""), "{err}");
}

#[test]
fn concat_keeps_wave_order_and_turns_scalars_into_arrays() {
    let wave = vec![
        frame(2, vec![Value::Int(1), Value::Str("a".into()), Value::Bytes(vec![1])]),
        frame(
            0,
            vec![
                Value::IntArray(vec![2, 3]),
                Value::StrArray(vec!["b".into(), "c".into()]),
                Value::Bytes(vec![2, 3]),
            ],
        ),
        frame(1, vec![Value::Int(4), Value::Str("d".into()), Value::Bytes(vec![])]),
    ];
    let out = reduce_one(TransformKind::Concat, wave, true);
    assert_eq!(out.header, FrameHeader::data(STREAM, TAG, 0));
    assert_eq!(
        decode_values(&out.payload).unwrap(),
        vec![
            Value::IntArray(vec![1, 2, 3, 4]),
            Value::StrArray(vec!["a".into(), "b".into(), "c".into(), "d".into()]),
            Value::Bytes(vec![1, 2, 3]),
        ]
    );
    // A single %d becomes %ad; concatenation composes over levels.
    let low = reduce_one(TransformKind::Concat, vec![frame(0, vec![Value::Int(9)])], false);
    let top = values(TransformKind::Concat, vec![low, frame(1, vec![Value::Int(8)])]);
    assert_eq!(top, vec![Value::IntArray(vec![9, 8])]);
}

#[test]
fn concat_base_type_mismatch_names_both_formats() {
    let wave = vec![frame(0, vec![Value::Int(1)]), frame(6, vec![Value::DoubleArray(vec![1.0])])];
    let err = reduce_err(TransformKind::Concat, wave);
    assert_eq!(err.rank(), Some(6));
    let text = err.to_string();
    assert!(text.contains("\"%d\"") && text.contains("\"%alf\"") && text.contains("concat"), "{text}");
}

fn eq_wave() -> Vec<Frame> {
    // Keys: even ranks "a", ranks 3 and 5 "b", the rest "c".
    (0..10u32)
        .map(|r| {
            let key: &[u8] = if r % 2 == 0 {
                b"a"
            } else if r == 3 || r == 5 {
                b"b"
            } else {
                b"c"
            };
            Frame::new(FrameHeader::data(STREAM, TAG, r), Bytes::from_static(key))
        })
        .collect()
}

#[test]
fn eqclass_groups_ranks_by_payload() {
    let out = reduce_one(TransformKind::EqClass, eq_wave(), true);
    assert_eq!(out.header.flags, FLAG_EQCLASS);
    assert_eq!(out.header.rank, 0);
    let classes = decode_eq_classes(&out).unwrap();
    let expect = vec![
        (Bytes::from_static(b"a"), "0,2,4,6,8".parse::<RankSet>().unwrap()),
        (Bytes::from_static(b"c"), "1,7,9".parse().unwrap()),
        (Bytes::from_static(b"b"), "3,5".parse().unwrap()),
    ];
    assert_eq!(classes, expect);
    // The layout: %ud count, then %b %aud %aud per class.
    let vals = decode_values(&out.payload).unwrap();
    assert_eq!(vals[0], Value::UInt(3));
    assert_eq!(vals[1], Value::Bytes(b"a".to_vec()));
    assert_eq!(vals[2], Value::UIntArray(vec![0, 2, 4, 6, 8]));
    assert_eq!(vals[8], Value::UIntArray(vec![3, 5]));
    assert_eq!(Format::of(&vals).to_string(), "%ud %b %aud %aud %b %aud %aud %b %aud %aud");
    // An unflagged frame is a class of one.
    let single = &eq_wave()[3];
    assert_eq!(decode_eq_classes(single).unwrap(), vec![(Bytes::from_static(b"b"), RankSet::single(3))]);
}

#[test]
fn eqclass_over_two_levels_equals_eqclass_at_once() {
    let flat = reduce_one(TransformKind::EqClass, eq_wave(), true);
    let wave = eq_wave();
    let left = reduce_one(TransformKind::EqClass, wave[..4].to_vec(), false);
    let right = reduce_one(TransformKind::EqClass, wave[4..9].to_vec(), false);
    // The root mixes two tables and a direct back-end.
    let tree = reduce_one(TransformKind::EqClass, vec![left, right, wave[9].clone()], true);
    assert_eq!(tree, flat);
    // And a third level changes nothing.
    assert_eq!(reduce_one(TransformKind::EqClass, vec![tree], true), flat);
}

#[test]
fn eqclass_rejects_a_malformed_table() {
    let mut bad = frame(
        5,
        vec![Value::UInt(2), Value::Bytes(vec![1]), Value::UIntArray(vec![5]), Value::UIntArray(vec![5])],
    );
    bad.header.flags = FLAG_EQCLASS;
    let err = reduce_err(TransformKind::EqClass, vec![eq_wave()[0].clone(), bad]);
    assert!(matches!(err, FilterError::Malformed { rank: 5, .. }), "{err}");
}

#[test]
fn format_mismatch_names_the_rank_and_both_formats() {
    let wave = vec![
        frame(0, vec![Value::Int(1)]),
        frame(1, vec![Value::Int(2)]),
        frame(7, vec![Value::Double(2.0)]),
        frame(8, vec![Value::Long(2)]),
    ];
    for kind in [TransformKind::Sum, TransformKind::Min, TransformKind::Max, TransformKind::Avg] {
        let err = reduce_err(kind, wave.clone());
        assert_eq!(err.rank(), Some(7));
        assert_eq!(
            err,
            FilterError::FormatMismatch {
                filter: kind.name(),
                stream: STREAM,
                rank: 7,
                expected: "%d".into(),
                found: "%lf".into()
            }
        );
        let text = err.to_string();
        assert!(text.contains("rank 7") && text.contains(kind.name()), "{text}");
    }
}

#[test]
fn unsupported_type_is_named() {
    let wave = vec![frame(3, vec![Value::Str("x".into())]), frame(4, vec![Value::Str("y".into())])];
    let err = reduce_err(TransformKind::Sum, wave);
    assert_eq!(err.rank(), Some(3));
    assert!(err.to_string().contains("sum cannot add %s (value 0)"), "{err}");
    let wave = vec![frame(3, vec![Value::Int(1), Value::Bytes(vec![1])])];
    let err = reduce_err(TransformKind::Max, wave);
    assert!(err.to_string().contains("max cannot compare %b (value 1)"), "{err}");
}

#[test]
fn arrays_of_different_lengths_name_both_lengths_and_ranks() {
    let wave =
        vec![frame(1, vec![Value::IntArray(vec![1, 2, 3])]), frame(6, vec![Value::IntArray(vec![1, 2])])];
    for kind in [TransformKind::Sum, TransformKind::Avg] {
        let err = reduce_err(kind, wave.clone());
        assert_eq!(
            err,
            FilterError::LengthMismatch {
                filter: kind.name(),
                stream: STREAM,
                rank: 6,
                expected_rank: 1,
                index: 0,
                expected: 3,
                found: 2
            }
        );
        let text = err.to_string();
        assert!(
            text.contains("rank 1") && text.contains("rank 6") && text.contains('3') && text.contains('2')
        );
    }
}

#[test]
fn undecodable_payload_is_an_error_naming_the_rank() {
    let garbage = Frame::new(FrameHeader::data(STREAM, TAG, 11), vec![0xff, 0xff, 0xff]);
    for kind in [TransformKind::Sum, TransformKind::Avg, TransformKind::Concat] {
        let err = reduce_err(kind, vec![frame(0, vec![Value::Int(1)]), garbage.clone()]);
        assert!(matches!(err, FilterError::Decode { rank: 11, .. }), "{err}");
    }
    let mut table = garbage.clone();
    table.header.flags = FLAG_EQCLASS;
    let err = reduce_err(TransformKind::EqClass, vec![table]);
    assert!(matches!(err, FilterError::Decode { rank: 11, .. }), "{err}");
    // EqClass takes any unflagged payload as a key, even one that does not decode.
    assert!(builtin(TransformKind::EqClass).apply(vec![garbage], &ctx(true)).is_ok());
}

#[test]
fn dropping_bad_packets_reduces_the_rest() {
    let wave = vec![
        frame(0, vec![Value::Int(1)]),
        Frame::new(FrameHeader::data(STREAM, TAG, 1), vec![0xff]),
        frame(2, vec![Value::Int(2)]),
        frame(3, vec![Value::Double(2.0)]),
        frame(4, vec![Value::Int(3)]),
    ];
    let mut sum = builtin(TransformKind::Sum);
    let (out, errors) = apply_dropping_bad(sum.as_mut(), wave, &ctx(true));
    assert_eq!(errors.iter().map(|e| e.rank()).collect::<Vec<_>>(), vec![Some(1), Some(3)]);
    assert_eq!(out.len(), 1);
    assert_eq!(decode_values(&out[0].payload).unwrap(), vec![Value::Int(6)]);
}

#[test]
fn check_format_before_sending() {
    let f = Format::parse("%d %alf %s").unwrap();
    let err = check_format(TransformKind::Sum, &f).unwrap_err();
    assert_eq!(err.rank(), None);
    assert!(err.to_string().contains("sum cannot add %s (value 2)"), "{err}");
    assert!(check_format(TransformKind::Avg, &Format::parse("%b").unwrap()).is_err());
    assert!(check_format(TransformKind::Min, &Format::parse("%c %auld %f").unwrap()).is_ok());
    for kind in [TransformKind::Null, TransformKind::Concat, TransformKind::EqClass] {
        assert!(check_format(kind, &f).is_ok());
    }
}

// ---- Random trees ------------------------------------------------------------

/// xorshift64*: a tiny deterministic generator driven by proptest's seed.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: usize) -> usize {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) as usize % n
    }
}

/// Reduces `leaves` through a random tree whose root is this node: the leaves are
/// cut into 1..=4 contiguous groups; a group of one may be a back-end child, any
/// group may be a comm-node child (below depth 4).
fn tree_reduce(kind: TransformKind, leaves: &[Frame], rng: &mut Rng, depth: u32, is_root: bool) -> Frame {
    let groups = 1 + rng.below(4.min(leaves.len()));
    let mut cuts: Vec<usize> = (0..groups - 1).map(|_| 1 + rng.below(leaves.len())).collect();
    cuts.push(0);
    cuts.push(leaves.len());
    cuts.sort_unstable();
    cuts.dedup();
    let mut wave = Vec::new();
    for w in cuts.windows(2) {
        let group = &leaves[w[0]..w[1]];
        if group.len() == 1 && (depth >= 4 || rng.below(2) == 0) {
            wave.push(group[0].clone());
        } else if depth >= 4 {
            wave.extend(group.iter().cloned());
        } else {
            wave.push(tree_reduce(kind, group, rng, depth + 1, false));
        }
    }
    reduce_one(kind, wave, is_root)
}

fn leaf_frames(xs: &[i64]) -> Vec<Frame> {
    xs.iter()
        .enumerate()
        .map(|(r, x)| {
            frame(r as u32, vec![Value::Long(*x), Value::LongArray(vec![*x, x.wrapping_neg() / 2])])
        })
        .collect()
}

fn flat(kind: TransformKind, xs: &[i64]) -> Vec<Value> {
    let col = |f: &dyn Fn(i64) -> i64| -> Vec<i64> { xs.iter().map(|x| f(*x)).collect() };
    let cols = [col(&|x| x), col(&|x| x.wrapping_neg() / 2)];
    let r: Vec<i64> = cols
        .iter()
        .map(|c| match kind {
            TransformKind::Sum => c.iter().fold(0i64, |a, b| a.wrapping_add(*b)),
            TransformKind::Min => *c.iter().min().unwrap(),
            TransformKind::Max => *c.iter().max().unwrap(),
            TransformKind::Avg => (c.iter().map(|x| i128::from(*x)).sum::<i128>() / c.len() as i128) as i64,
            _ => unreachable!(),
        })
        .collect();
    vec![Value::Long(r[0]), Value::LongArray(vec![r[0], r[1]])]
}

proptest! {
    #[test]
    fn tree_reduction_equals_flat_computation(
        xs in proptest::collection::vec(any::<i64>(), 1..40),
        small in proptest::collection::vec(-(1i64 << 40)..(1i64 << 40), 1..40),
        seed in 1u64..,
    ) {
        for kind in [TransformKind::Sum, TransformKind::Min, TransformKind::Max] {
            let got = decode_values(&tree_reduce(kind, &leaf_frames(&xs), &mut Rng(seed), 0, true).payload).unwrap();
            prop_assert_eq!(got, flat(kind, &xs));
        }
        // Averages are carried in f64: exact while sums stay below 2^53.
        let got = tree_reduce(TransformKind::Avg, &leaf_frames(&small), &mut Rng(seed), 0, true);
        prop_assert_eq!(got.header.flags, 0);
        prop_assert_eq!(decode_values(&got.payload).unwrap(), flat(TransformKind::Avg, &small));
    }
}
