//! Sum, minimum and maximum: element-wise over numeric scalars and arrays.
//!
//! Every packet of a wave must have the first packet's format; every value must be
//! a numeric scalar or a numeric array; arrays at one position must have equal
//! lengths. The output has the same format. Integer sums wrap around
//! (`wrapping_add`), as C unsigned arithmetic does, so that a reduction never fails
//! half-way up the tree and the result does not depend on the tree's shape; float
//! sums follow IEEE rules. Float minimum and maximum ignore NaN (`f64::min`).

use treecast_wire::{Format, Frame, Value};

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

/// The sum, min or max filter.
#[derive(Debug)]
pub(crate) struct Arith {
    op: Op,
}

impl Arith {
    pub(crate) fn new(op: Op) -> Self {
        Arith { op }
    }
}

impl Transform for Arith {
    fn apply(&mut self, wave: Vec<Frame>, ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        let Some(first) = wave.first() else { return Ok(Vec::new()) };
        let (name, action) = (self.op.name(), self.op.action());
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
                fold(self.op, a, b).map_err(|e| match e {
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
        Ok(vec![Frame::new(output_header(&wave, 0), encode(&acc))])
    }
}
