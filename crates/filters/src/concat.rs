//! Concatenation: per value position, one array of that position's base type.
//!
//! Arrays are concatenated and scalars appended as elements, in wave order, so
//! back-ends may send `%d` and the front-end receives `%ad`; strings become `%as`;
//! raw bytes (`%b`) are concatenated into one `%b`. Every packet must agree with the
//! first on the number of values and the base type at each position (`%d` and `%ad`
//! agree, `%d` and `%lf` do not).

use treecast_wire::{Format, Frame, ScalarType, Value, ValueType};

use crate::spec::{decode_frame, encode, format_string, output_header};
use crate::{FilterContext, FilterError, Transform};

const NAME: &str = "concat";

/// The base type of a value type: its scalar type, or `None` for bytes.
fn base(t: ValueType) -> Option<ScalarType> {
    match t {
        ValueType::Scalar(s) | ValueType::Array(s) => Some(s),
        ValueType::Bytes => None,
    }
}

fn empty(base: Option<ScalarType>) -> Value {
    match base {
        None => Value::Bytes(Vec::new()),
        Some(ScalarType::Char) => Value::CharArray(Vec::new()),
        Some(ScalarType::UChar) => Value::UCharArray(Vec::new()),
        Some(ScalarType::Short) => Value::ShortArray(Vec::new()),
        Some(ScalarType::UShort) => Value::UShortArray(Vec::new()),
        Some(ScalarType::Int) => Value::IntArray(Vec::new()),
        Some(ScalarType::UInt) => Value::UIntArray(Vec::new()),
        Some(ScalarType::Long) => Value::LongArray(Vec::new()),
        Some(ScalarType::ULong) => Value::ULongArray(Vec::new()),
        Some(ScalarType::Float) => Value::FloatArray(Vec::new()),
        Some(ScalarType::Double) => Value::DoubleArray(Vec::new()),
        Some(ScalarType::Str) => Value::StrArray(Vec::new()),
    }
}

macro_rules! append_match {
    ($acc:expr, $v:expr; $(($s:ident, $a:ident)),*) => {
        match ($acc, $v) {
            $(
                (Value::$a(xs), Value::$s(x)) => { xs.push(x); true }
                (Value::$a(xs), Value::$a(ys)) => { xs.extend(ys); true }
            )*
            (Value::Bytes(xs), Value::Bytes(ys)) => { xs.extend(ys); true }
            _ => false,
        }
    };
}

/// Appends `v` to the array `acc`; false if the base types differ.
fn append(acc: &mut Value, v: Value) -> bool {
    append_match!(acc, v;
        (Char, CharArray), (UChar, UCharArray), (Short, ShortArray), (UShort, UShortArray),
        (Int, IntArray), (UInt, UIntArray), (Long, LongArray), (ULong, ULongArray),
        (Float, FloatArray), (Double, DoubleArray), (Str, StrArray))
}

/// The concatenation filter; see the module documentation.
#[derive(Debug, Default)]
pub(crate) struct Concat;

impl Transform for Concat {
    fn apply(&mut self, wave: Vec<Frame>, ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        self.apply_borrowed(&wave, ctx)
    }

    fn apply_borrowed(&mut self, wave: &[Frame], ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        if wave.is_empty() {
            return Ok(Vec::new());
        }
        let mut reference: Option<(Format, Vec<Option<ScalarType>>)> = None;
        let mut acc: Vec<Value> = Vec::new();
        for frame in wave {
            let values = decode_frame(frame, NAME, ctx)?;
            let format = Format::of(&values);
            let bases: Vec<_> = format.types.iter().map(|t| base(*t)).collect();
            match &reference {
                None => {
                    acc = bases.iter().map(|b| empty(*b)).collect();
                    reference = Some((format, bases));
                }
                Some((ref_format, ref_bases)) => {
                    if *ref_bases != bases {
                        return Err(FilterError::FormatMismatch {
                            filter: NAME,
                            stream: ctx.stream,
                            rank: frame.header.rank,
                            expected: format_string(ref_format),
                            found: format_string(&format),
                        });
                    }
                }
            }
            for (a, v) in acc.iter_mut().zip(values) {
                // Cannot fail: the base types were compared above.
                let appended = append(a, v);
                debug_assert!(appended, "base types were checked");
            }
        }
        Ok(vec![Frame::new(output_header(wave, 0), encode(&acc))])
    }
}
