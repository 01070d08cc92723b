//! Sum, minimum and maximum: element-wise over numeric scalars and arrays.
//!
//! Every packet of a wave must have the first packet's format; every value must be
//! a numeric scalar or a numeric array; arrays at one position must have equal
//! lengths. The output has the same format. Integer sums wrap around
//! (`wrapping_add`), as C unsigned arithmetic does, so that a reduction never fails
//! half-way up the tree and the result does not depend on the tree's shape; float
//! sums follow IEEE rules. Float minimum and maximum ignore NaN (`f64::min`).

use treecast_wire::{skip_value, Format, Frame, Reader, ScalarType, Value, ValueType};

use crate::spec::{decode_frame, encode, format_string, output_header, type_spec};
use crate::{FilterContext, FilterError, Transform};

/// Which element-wise reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Op {
    Sum,
    Min,
    Max,
}

impl Op {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Op::Sum => "sum",
            Op::Min => "min",
            Op::Max => "max",
        }
    }

    pub(crate) fn action(self) -> &'static str {
        match self {
            Op::Sum => "add",
            Op::Min | Op::Max => "compare",
        }
    }

    fn apply<T: Elem>(self, a: T, b: T) -> T {
        match self {
            Op::Sum => a.add(b),
            Op::Min => a.lesser(b),
            Op::Max => a.greater(b),
        }
    }
}

/// A numeric element type.
trait Elem: Copy {
    fn add(self, other: Self) -> Self;
    fn lesser(self, other: Self) -> Self;
    fn greater(self, other: Self) -> Self;
}

macro_rules! int_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn add(self, other: Self) -> Self { self.wrapping_add(other) }
            fn lesser(self, other: Self) -> Self { Ord::min(self, other) }
            fn greater(self, other: Self) -> Self { Ord::max(self, other) }
        }
    )*};
}
int_elem!(i8, u8, i16, u16, i32, u32, i64, u64);

macro_rules! float_elem {
    ($($t:ty),*) => {$(
        impl Elem for $t {
            fn add(self, other: Self) -> Self { self + other }
            fn lesser(self, other: Self) -> Self { self.min(other) }
            fn greater(self, other: Self) -> Self { self.max(other) }
        }
    )*};
}
float_elem!(f32, f64);

/// Why two values could not be combined.
enum FoldError {
    /// Arrays of these lengths (accumulator, other).
    Length(usize, usize),
    /// Different types (cannot happen after the format check).
    Type,
}

fn fold_slice<T: Elem>(op: Op, acc: &mut [T], other: &[T]) -> Result<(), FoldError> {
    if acc.len() != other.len() {
        return Err(FoldError::Length(acc.len(), other.len()));
    }
    for (a, b) in acc.iter_mut().zip(other) {
        *a = op.apply(*a, *b);
    }
    Ok(())
}

macro_rules! fold_match {
    ($op:expr, $acc:expr, $other:expr; $(($s:ident, $a:ident)),*) => {
        match ($acc, $other) {
            $(
                (Value::$s(x), Value::$s(y)) => {
                    *x = $op.apply(*x, *y);
                    Ok(())
                }
                (Value::$a(x), Value::$a(y)) => fold_slice($op, x, y),
            )*
            _ => Err(FoldError::Type),
        }
    };
}

fn fold(op: Op, acc: &mut Value, other: &Value) -> Result<(), FoldError> {
    fold_match!(op, acc, other;
        (Char, CharArray), (UChar, UCharArray), (Short, ShortArray), (UShort, UShortArray),
        (Int, IntArray), (UInt, UIntArray), (Long, LongArray), (ULong, ULongArray),
        (Float, FloatArray), (Double, DoubleArray))
}

/// Fails on the first value of `format` that is not numeric.
pub(crate) fn check_numeric(
    format: &Format,
    filter: &'static str,
    action: &'static str,
    ctx: &FilterContext,
    rank: u32,
) -> Result<(), FilterError> {
    match format.types.iter().position(|t| !crate::spec::is_numeric_type(*t)) {
        None => Ok(()),
        Some(index) => Err(FilterError::UnsupportedType {
            filter,
            action,
            stream: ctx.stream,
            rank,
            index,
            found: type_spec(format.types[index]),
        }),
    }
}

/// Where one numeric value sits in a payload: its head (type code, and an array's
/// length) from `head` to `data`, its elements from `data` to `end`.
#[derive(Debug, Clone, Copy)]
struct Field {
    head: usize,
    data: usize,
    end: usize,
    ty: ScalarType,
}

/// Most fields a payload folded as bytes may have: the layout is kept between waves
/// (32 bytes a field, where a `%uc` takes 2 on the wire), so a payload of many
/// scalars goes the general way, which keeps nothing.
const MAX_FIELDS: usize = 1024;

/// The fields of `payload`, when it holds at most [`MAX_FIELDS`] numeric scalars
/// and arrays and nothing after them; `None` for anything else (the general path
/// says what is wrong, if anything).
fn layout(payload: &[u8], fields: &mut Vec<Field>) -> Option<()> {
    fields.clear();
    let mut r = Reader::new(payload);
    while r.remaining() > 0 {
        if fields.len() == MAX_FIELDS {
            return None;
        }
        let head = r.offset();
        let (ty, data) = match skip_value(&mut r).ok()? {
            ValueType::Scalar(t) => (t, head + 1),
            // The code, then the element count.
            ValueType::Array(t) => (t, head + 5),
            ValueType::Bytes => return None,
        };
        // Strings have no width: not numbers.
        ty.width()?;
        fields.push(Field { head, data, end: r.offset(), ty });
    }
    Some(())
}

macro_rules! fold_le {
    ($op:expr, $t:ty, $acc:expr, $other:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        for (a, b) in $acc.chunks_exact_mut(N).zip($other.chunks_exact(N)) {
            // Chunks of exactly N bytes: the conversions cannot fail.
            let (Ok(x), Ok(y)) = (<[u8; N]>::try_from(&*a), <[u8; N]>::try_from(b)) else { continue };
            a.copy_from_slice(&$op.apply(<$t>::from_le_bytes(x), <$t>::from_le_bytes(y)).to_le_bytes());
        }
    }};
}

/// Folds the encoded elements `other` of type `ty` into `acc`, element-wise.
fn fold_bytes(op: Op, ty: ScalarType, acc: &mut [u8], other: &[u8]) {
    match ty {
        ScalarType::Char => fold_le!(op, i8, acc, other),
        ScalarType::UChar => fold_le!(op, u8, acc, other),
        ScalarType::Short => fold_le!(op, i16, acc, other),
        ScalarType::UShort => fold_le!(op, u16, acc, other),
        ScalarType::Int => fold_le!(op, i32, acc, other),
        ScalarType::UInt => fold_le!(op, u32, acc, other),
        ScalarType::Long => fold_le!(op, i64, acc, other),
        ScalarType::ULong => fold_le!(op, u64, acc, other),
        ScalarType::Float => fold_le!(op, f32, acc, other),
        ScalarType::Double => fold_le!(op, f64, acc, other),
        ScalarType::Str => {}
    }
}

/// `op` over the wave's payloads straight from their bytes, when every payload has
/// the first one's layout (the same type codes and array lengths at the same places)
/// of numeric values only: the bytes that decoding, folding in wave order and
/// encoding again give, without a list of values per packet. `None` for any other
/// wave, which the general path reads and, where it must, refuses.
fn fold_encoded(op: Op, wave: &[Frame], fields: &mut Vec<Field>) -> Option<Vec<u8>> {
    let (first, rest) = wave.split_first()?;
    let first = &first.payload[..];
    layout(first, fields)?;
    let same_layout = |p: &[u8]| {
        p.len() == first.len() && fields.iter().all(|f| p[f.head..f.data] == first[f.head..f.data])
    };
    if !rest.iter().all(|f| same_layout(&f.payload)) {
        return None;
    }
    let mut acc = first.to_vec();
    for frame in rest {
        for f in fields.iter() {
            // In bounds: `layout` found these ends in a payload of this length.
            fold_bytes(op, f.ty, &mut acc[f.data..f.end], &frame.payload[f.data..f.end]);
        }
    }
    Some(acc)
}

/// The sum, min or max filter.
#[derive(Debug)]
pub(crate) struct Arith {
    op: Op,
    /// The last wave's layout, kept for its room.
    fields: Vec<Field>,
}

impl Arith {
    pub(crate) fn new(op: Op) -> Self {
        Arith { op, fields: Vec::new() }
    }
}

impl Transform for Arith {
    fn apply(&mut self, wave: Vec<Frame>, ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        self.apply_borrowed(&wave, ctx)
    }

    fn apply_borrowed(&mut self, wave: &[Frame], ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        match fold_encoded(self.op, wave, &mut self.fields) {
            Some(payload) => Ok(vec![Frame::new(output_header(wave, 0), payload)]),
            None => fold_decoded(self.op, wave, ctx),
        }
    }
}

/// `op` over the wave's decoded values: any wave, with the error of the first
/// packet that cannot take part.
fn fold_decoded(op: Op, wave: &[Frame], ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
    let Some(first) = wave.first() else { return Ok(Vec::new()) };
    let (name, action) = (op.name(), op.action());
    let mut acc = decode_frame(first, name, ctx)?;
    let reference = Format::of(&acc);
    check_numeric(&reference, name, action, ctx, first.header.rank)?;
    for frame in &wave[1..] {
        let values = decode_frame(frame, name, ctx)?;
        let format = Format::of(&values);
        let mismatch = || FilterError::FormatMismatch {
            filter: name,
            stream: ctx.stream,
            rank: frame.header.rank,
            expected: format_string(&reference),
            found: format_string(&format),
        };
        if format != reference {
            return Err(mismatch());
        }
        for (index, (a, b)) in acc.iter_mut().zip(&values).enumerate() {
            fold(op, a, b).map_err(|e| match e {
                FoldError::Length(expected, found) => FilterError::LengthMismatch {
                    filter: name,
                    stream: ctx.stream,
                    rank: frame.header.rank,
                    expected_rank: first.header.rank,
                    index,
                    expected,
                    found,
                },
                FoldError::Type => mismatch(),
            })?;
        }
    }
    Ok(vec![Frame::new(output_header(wave, 0), encode(&acc))])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use proptest::prelude::*;
    use treecast_wire::{encode_values, FrameHeader};

    use super::*;

    const CTX: FilterContext = FilterContext { stream: 9, is_root: false };

    fn frame(rank: u32, values: &[Value]) -> Frame {
        let mut payload = Vec::new();
        encode_values(values, &mut payload);
        Frame::new(FrameHeader::data(9, 1, rank), payload)
    }

    fn encoded(op: Op, wave: &[Frame]) -> Option<Vec<u8>> {
        fold_encoded(op, wave, &mut Vec::new())
    }

    /// One packet's values: a few numeric scalars and arrays, from `seed`, each with
    /// the type and array length of position `i` of `shape`.
    fn values(shape: &[(u8, usize)], seed: u64) -> Vec<Value> {
        let mut x = seed | 1;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        shape
            .iter()
            .map(|&(kind, len)| match kind % 20 {
                0 => Value::Char(next() as i8),
                1 => Value::UChar(next() as u8),
                2 => Value::Short(next() as i16),
                3 => Value::UShort(next() as u16),
                4 => Value::Int(next() as i32),
                5 => Value::UInt(next() as u32),
                6 => Value::Long(next() as i64),
                7 => Value::ULong(next()),
                8 => Value::Float(f32::from_bits(next() as u32)),
                9 => Value::Double(f64::from_bits(next())),
                10 => Value::CharArray((0..len).map(|_| next() as i8).collect()),
                11 => Value::UCharArray((0..len).map(|_| next() as u8).collect()),
                12 => Value::ShortArray((0..len).map(|_| next() as i16).collect()),
                13 => Value::UShortArray((0..len).map(|_| next() as u16).collect()),
                14 => Value::IntArray((0..len).map(|_| next() as i32).collect()),
                15 => Value::UIntArray((0..len).map(|_| next() as u32).collect()),
                16 => Value::LongArray((0..len).map(|_| next() as i64).collect()),
                17 => Value::ULongArray((0..len).map(|_| next()).collect()),
                18 => Value::FloatArray((0..len).map(|_| f32::from_bits(next() as u32)).collect()),
                _ => Value::DoubleArray((0..len).map(|_| f64::from_bits(next())).collect()),
            })
            .collect()
    }

    proptest! {
        /// The bytes-level fold gives exactly what decoding, folding and encoding give
        /// (floats bit for bit, NaNs included), for every operation.
        #[test]
        fn folding_the_bytes_gives_what_folding_the_values_gives(
            shape in proptest::collection::vec((any::<u8>(), 0usize..6), 0..5),
            seeds in proptest::collection::vec(any::<u64>(), 1..6),
        ) {
            let wave: Vec<Frame> =
                seeds.iter().enumerate().map(|(i, s)| frame(i as u32, &values(&shape, *s))).collect();
            for op in [Op::Sum, Op::Min, Op::Max] {
                let fast = encoded(op, &wave).unwrap();
                let slow = fold_decoded(op, &wave, &CTX).unwrap();
                prop_assert_eq!(&fast[..], &slow[0].payload[..]);
            }
        }

        /// Payloads of one layout with bytes changed, cut or added (and, now and
        /// then, a string among the values): the bytes-level fold declines where the
        /// general path refuses, and otherwise gives its bytes, for every operation.
        #[test]
        fn damaged_payloads_are_declined_or_folded_as_the_general_path_folds(
            shape in proptest::collection::vec((any::<u8>(), 0usize..4), 1..4),
            text in any::<bool>(),
            seeds in proptest::collection::vec(any::<u64>(), 1..4),
            damage in proptest::collection::vec((any::<usize>(), any::<u8>(), 0u8..4), 0..3),
        ) {
            let mut wave: Vec<Frame> = seeds
                .iter()
                .enumerate()
                .map(|(i, s)| {
                    let mut v = values(&shape, *s);
                    if text {
                        v.push(Value::Str("x".into()));
                    }
                    frame(i as u32, &v)
                })
                .collect();
            for (i, &(at, byte, how)) in damage.iter().enumerate() {
                let f = &mut wave[i % seeds.len()];
                let mut p = f.payload.to_vec();
                let at = at % (p.len() + 1);
                match how {
                    0 if at < p.len() => p[at] = byte,
                    1 => p.truncate(at),
                    _ => p.insert(at, byte),
                }
                f.payload = p.into();
            }
            for op in [Op::Sum, Op::Min, Op::Max] {
                let slow = fold_decoded(op, &wave, &CTX);
                match encoded(op, &wave) {
                    Some(fast) => prop_assert_eq!(&fast[..], &slow.unwrap()[0].payload[..]),
                    None => prop_assert!(slow.is_err() || text || !damage.is_empty()),
                }
            }
        }
    }

    #[test]
    fn waves_the_bytes_cannot_fold_go_to_the_general_path_and_its_errors() {
        let mut arith = Arith::new(Op::Sum);
        // Array lengths differ: the general path names the rank and the lengths.
        let wave = [frame(0, &[Value::IntArray(vec![1, 2])]), frame(1, &[Value::IntArray(vec![1])])];
        assert!(encoded(Op::Sum, &wave).is_none());
        let err = arith.apply_borrowed(&wave, &CTX).unwrap_err();
        assert!(matches!(err, FilterError::LengthMismatch { rank: 1, expected: 2, found: 1, .. }), "{err}");
        // Formats differ, with payloads of the same length.
        let wave = [frame(0, &[Value::Int(1)]), frame(1, &[Value::UInt(1)])];
        assert!(encoded(Op::Sum, &wave).is_none());
        assert!(matches!(
            arith.apply_borrowed(&wave, &CTX),
            Err(FilterError::FormatMismatch { rank: 1, .. })
        ));
        // Not numeric.
        let wave = [frame(0, &[Value::Str("a".into())]), frame(1, &[Value::Str("b".into())])];
        assert!(encoded(Op::Sum, &wave).is_none());
        assert!(matches!(arith.apply_borrowed(&wave, &CTX), Err(FilterError::UnsupportedType { .. })));
        // Bytes after the last value.
        let mut trailing = frame(0, &[Value::Int(1)]);
        trailing.payload = [&trailing.payload[..], &[0][..]].concat().into();
        assert!(encoded(Op::Sum, &[trailing.clone(), trailing]).is_none());
    }

    #[test]
    fn a_payload_of_more_scalars_than_the_kept_layout_takes_goes_the_general_way() {
        let many: Vec<Value> = (0..=MAX_FIELDS as u32).map(Value::UInt).collect();
        let wave = [frame(0, &many), frame(1, &many)];
        assert!(encoded(Op::Sum, &wave).is_none());
        let mut arith = Arith::new(Op::Sum);
        let out = arith.apply_borrowed(&wave, &CTX).unwrap();
        let doubled: Vec<Value> = (0..=MAX_FIELDS as u32).map(|x| Value::UInt(2 * x)).collect();
        assert_eq!(treecast_wire::decode_values(&out[0].payload).unwrap(), doubled);
        assert!(arith.fields.capacity() <= MAX_FIELDS * 2);
        let fits: Vec<Value> = (0..MAX_FIELDS as u32).map(Value::UInt).collect();
        assert!(encoded(Op::Sum, &[frame(0, &fits), frame(1, &fits)]).is_some());
    }

    #[test]
    fn the_bytes_fold_wraps_integers_and_keeps_the_lowest_rank() {
        let mut arith = Arith::new(Op::Sum);
        let wave =
            [frame(4, &[Value::UInt(u32::MAX), Value::Int(-3)]), frame(2, &[Value::UInt(2), Value::Int(5)])];
        let out = arith.apply_borrowed(&wave, &CTX).unwrap();
        assert_eq!(out[0].header.rank, 2);
        assert_eq!(treecast_wire::decode_values(&out[0].payload).unwrap(), [Value::UInt(1), Value::Int(2)]);
    }
}
