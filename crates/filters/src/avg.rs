//! Average: correct through any tree, weighted by the number of back-ends.
//!
//! # Partial layout
//!
//! A back-end sends its values unflagged: weight 1. A comm node (not the root)
//! outputs one frame flagged [`FLAG_PARTIAL_AVG`] whose payload is:
//!
//! 1. for each value of the original format, its sum over the sub-tree as `%lf`
//!    (for a scalar) or `%alf` (for an array, element-wise);
//! 2. `%uld`: the total weight, i.e. the number of back-end packets summed;
//! 3. `%s`: the original format string of the back-ends' values (e.g. `"%d %af"`),
//!    so that a root that only sees partials can restore the original types.
//!
//! A partial from a child is combined by adding its sums and its weight; one wave may
//! mix unflagged back-end packets and partials. The root outputs an unflagged frame
//! with the averages in the original types: integers rounded toward zero (and
//! saturated to the type's range), floats cast. Sums are kept in `f64`, so 64-bit
//! integer averages are exact only while the sums stay below 2^53.

use treecast_wire::{Format, Frame, ScalarType, Value, ValueType, FLAG_PARTIAL_AVG};

use crate::arith::check_numeric;
use crate::spec::{decode_frame, encode, format_string, output_header, parse_format};
use crate::{FilterContext, FilterError, Transform};

const NAME: &str = "avg";
const ACTION: &str = "average";

/// One packet's contribution: the original format, sums per value, weight.
struct Partial {
    format: Format,
    sums: Vec<Vec<f64>>,
    weight: u64,
}

fn to_f64s(v: &Value) -> Option<Vec<f64>> {
    fn all<T: Copy + Into<f64>>(xs: &[T]) -> Vec<f64> {
        xs.iter().map(|x| (*x).into()).collect()
    }
    // `as` is the only conversion from 64-bit integers; precision loss is documented.
    #[allow(clippy::cast_precision_loss)]
    let out = match v {
        Value::Char(x) => vec![f64::from(*x)],
        Value::UChar(x) => vec![f64::from(*x)],
        Value::Short(x) => vec![f64::from(*x)],
        Value::UShort(x) => vec![f64::from(*x)],
        Value::Int(x) => vec![f64::from(*x)],
        Value::UInt(x) => vec![f64::from(*x)],
        Value::Long(x) => vec![*x as f64],
        Value::ULong(x) => vec![*x as f64],
        Value::Float(x) => vec![f64::from(*x)],
        Value::Double(x) => vec![*x],
        Value::CharArray(xs) => all(xs),
        Value::UCharArray(xs) => all(xs),
        Value::ShortArray(xs) => all(xs),
        Value::UShortArray(xs) => all(xs),
        Value::IntArray(xs) => all(xs),
        Value::UIntArray(xs) => all(xs),
        Value::LongArray(xs) => xs.iter().map(|x| *x as f64).collect(),
        Value::ULongArray(xs) => xs.iter().map(|x| *x as f64).collect(),
        Value::FloatArray(xs) => all(xs),
        Value::DoubleArray(xs) => xs.clone(),
        Value::Str(_) | Value::StrArray(_) | Value::Bytes(_) => return None,
    };
    Some(out)
}

/// The value of type `t` holding `xs` (one element for a scalar); `as` rounds toward
/// zero and saturates, which is the documented rounding of integer averages.
fn from_f64s(t: ValueType, xs: &[f64]) -> Value {
    macro_rules! conv {
        ($s:ident, $a:ident, $ty:ty) => {
            match t {
                ValueType::Array(_) => Value::$a(xs.iter().map(|x| *x as $ty).collect()),
                _ => Value::$s(xs.first().map_or(0 as $ty, |x| *x as $ty)),
            }
        };
    }
    let scalar = match t {
        ValueType::Scalar(s) | ValueType::Array(s) => s,
        ValueType::Bytes => ScalarType::Double,
    };
    match scalar {
        ScalarType::Char => conv!(Char, CharArray, i8),
        ScalarType::UChar => conv!(UChar, UCharArray, u8),
        ScalarType::Short => conv!(Short, ShortArray, i16),
        ScalarType::UShort => conv!(UShort, UShortArray, u16),
        ScalarType::Int => conv!(Int, IntArray, i32),
        ScalarType::UInt => conv!(UInt, UIntArray, u32),
        ScalarType::Long => conv!(Long, LongArray, i64),
        ScalarType::ULong => conv!(ULong, ULongArray, u64),
        ScalarType::Float => conv!(Float, FloatArray, f32),
        // Str never reaches here: formats are checked to be numeric.
        ScalarType::Double | ScalarType::Str => conv!(Double, DoubleArray, f64),
    }
}

fn read(frame: &Frame, ctx: &FilterContext) -> Result<Partial, FilterError> {
    let rank = frame.header.rank;
    let mut values = decode_frame(frame, NAME, ctx)?;
    if frame.header.flags & FLAG_PARTIAL_AVG == 0 {
        let format = Format::of(&values);
        check_numeric(&format, NAME, ACTION, ctx, rank)?;
        let sums = values.iter().map(|v| to_f64s(v).unwrap_or_default()).collect();
        return Ok(Partial { format, sums, weight: 1 });
    }
    let malformed =
        |detail: String| FilterError::Malformed { filter: NAME, stream: ctx.stream, rank, detail };
    let (Some(Value::Str(text)), Some(Value::ULong(weight))) = (values.pop(), values.pop()) else {
        return Err(malformed("a partial average must end with a %uld weight and a %s format".into()));
    };
    let format = parse_format(&text).ok_or_else(|| {
        malformed(format!("the partial average names the format {text:?}, which is not valid"))
    })?;
    check_numeric(&format, NAME, ACTION, ctx, rank)?;
    if weight == 0 {
        return Err(malformed("the partial average has weight 0".into()));
    }
    if values.len() != format.types.len() {
        return Err(malformed(format!(
            "the partial average has {} sums for the format \"{text}\"",
            values.len()
        )));
    }
    let mut sums = Vec::with_capacity(values.len());
    for (index, (v, t)) in values.into_iter().zip(&format.types).enumerate() {
        match (v, t) {
            (Value::Double(x), ValueType::Scalar(_)) => sums.push(vec![x]),
            (Value::DoubleArray(xs), ValueType::Array(_)) => sums.push(xs),
            _ => {
                return Err(malformed(format!(
                    "sum {index} of the partial average is not %lf or %alf as the format \"{text}\" requires"
                )))
            }
        }
    }
    Ok(Partial { format, sums, weight })
}

/// The average filter; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Avg;

impl Transform for Avg {
    fn apply(&mut self, wave: Vec<Frame>, ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        self.apply_borrowed(&wave, ctx)
    }

    fn apply_borrowed(&mut self, wave: &[Frame], ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        let Some(first) = wave.first() else { return Ok(Vec::new()) };
        let mut acc = read(first, ctx)?;
        for frame in &wave[1..] {
            let p = read(frame, ctx)?;
            if p.format != acc.format {
                return Err(FilterError::FormatMismatch {
                    filter: NAME,
                    stream: ctx.stream,
                    rank: frame.header.rank,
                    expected: format_string(&acc.format),
                    found: format_string(&p.format),
                });
            }
            for (index, (a, b)) in acc.sums.iter_mut().zip(&p.sums).enumerate() {
                if a.len() != b.len() {
                    return Err(FilterError::LengthMismatch {
                        filter: NAME,
                        stream: ctx.stream,
                        rank: frame.header.rank,
                        expected_rank: first.header.rank,
                        index,
                        expected: a.len(),
                        found: b.len(),
                    });
                }
                for (x, y) in a.iter_mut().zip(b) {
                    *x += *y;
                }
            }
            acc.weight = acc.weight.saturating_add(p.weight);
        }
        let out = if ctx.is_root {
            #[allow(clippy::cast_precision_loss)] // weights are far below 2^53
            let w = acc.weight as f64;
            let values: Vec<Value> = acc
                .format
                .types
                .iter()
                .zip(&acc.sums)
                .map(|(t, s)| from_f64s(*t, &s.iter().map(|x| x / w).collect::<Vec<_>>()))
                .collect();
            Frame::new(output_header(wave, 0), encode(&values))
        } else {
            let mut values: Vec<Value> = acc
                .format
                .types
                .iter()
                .zip(acc.sums)
                .map(|(t, s)| match t {
                    ValueType::Array(_) => Value::DoubleArray(s),
                    _ => Value::Double(s.first().copied().unwrap_or(0.0)),
                })
                .collect();
            values.push(Value::ULong(acc.weight));
            values.push(Value::Str(format_string(&acc.format)));
            Frame::new(output_header(wave, FLAG_PARTIAL_AVG), encode(&values))
        };
        Ok(vec![out])
    }
}
