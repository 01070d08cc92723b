//! Typed values carried in data payloads, and their self-describing encoding.
//!
//! Each value is one type-code byte followed by its data, little-endian:
//!
//! * a scalar: code = [`ScalarType`] discriminant (1..=11), then the value
//!   (fixed width; `%s` is a `u32` byte length then UTF-8);
//! * an array: code = `0x40 | scalar code`, then a `u32` element count, then
//!   the elements back to back as above (without per-element codes);
//! * raw bytes (`%b`): code `0x20`, then a `u32` length and the bytes.
//!
//! The payload is exactly the concatenation of its values: nothing may follow
//! the last one.

use std::fmt;

use crate::{codec::Reader, DecodeError, EncodeError};

/// The element types a format string can name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum ScalarType {
    /// `%c`: signed 8-bit.
    Char = 1,
    /// `%uc`: unsigned 8-bit.
    UChar = 2,
    /// `%hd`: signed 16-bit.
    Short = 3,
    /// `%uhd`: unsigned 16-bit.
    UShort = 4,
    /// `%d`: signed 32-bit.
    Int = 5,
    /// `%ud`: unsigned 32-bit.
    UInt = 6,
    /// `%ld`: signed 64-bit.
    Long = 7,
    /// `%uld`: unsigned 64-bit.
    ULong = 8,
    /// `%f`: 32-bit float.
    Float = 9,
    /// `%lf`: 64-bit float.
    Double = 10,
    /// `%s`: UTF-8 string.
    Str = 11,
}

/// Type code of raw bytes (`%b`).
const BYTES_CODE: u8 = 0x20;
/// Bit set in the type code of an array; the low bits are the element's scalar code.
const ARRAY_BIT: u8 = 0x40;

impl ScalarType {
    /// Every scalar type, in type-code order.
    pub const ALL: [ScalarType; 11] = [
        ScalarType::Char,
        ScalarType::UChar,
        ScalarType::Short,
        ScalarType::UShort,
        ScalarType::Int,
        ScalarType::UInt,
        ScalarType::Long,
        ScalarType::ULong,
        ScalarType::Float,
        ScalarType::Double,
        ScalarType::Str,
    ];

    /// The format specifier, e.g. `%uhd`.
    pub fn spec(self) -> &'static str {
        match self {
            ScalarType::Char => "%c",
            ScalarType::UChar => "%uc",
            ScalarType::Short => "%hd",
            ScalarType::UShort => "%uhd",
            ScalarType::Int => "%d",
            ScalarType::UInt => "%ud",
            ScalarType::Long => "%ld",
            ScalarType::ULong => "%uld",
            ScalarType::Float => "%f",
            ScalarType::Double => "%lf",
            ScalarType::Str => "%s",
        }
    }

    /// The specifier without its `%`, e.g. `uhd` (what follows `%a` in an array).
    pub fn letters(self) -> &'static str {
        &self.spec()[1..]
    }

    /// The type code of one scalar of this type on the wire.
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The scalar type whose code is `code`, if any.
    pub fn from_code(code: u8) -> Option<ScalarType> {
        ScalarType::ALL.into_iter().find(|t| t.code() == code)
    }

    /// Encoded width in bytes; `None` for `%s`, whose width depends on its length.
    pub fn width(self) -> Option<usize> {
        match self {
            ScalarType::Char | ScalarType::UChar => Some(1),
            ScalarType::Short | ScalarType::UShort => Some(2),
            ScalarType::Int | ScalarType::UInt | ScalarType::Float => Some(4),
            ScalarType::Long | ScalarType::ULong | ScalarType::Double => Some(8),
            ScalarType::Str => None,
        }
    }

    /// Fewest bytes one element of this type occupies (4 for a string: its length).
    fn min_width(self) -> usize {
        self.width().unwrap_or(4)
    }
}

impl fmt::Display for ScalarType {
    /// Writes the specifier, e.g. `%lf`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.spec())
    }
}

/// The type of one value of a payload: a scalar, an array of scalars, or raw bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// One scalar, e.g. `%d`.
    Scalar(ScalarType),
    /// An array, e.g. `%ad` (32-bit length; `%A..` is accepted as a synonym).
    Array(ScalarType),
    /// Raw bytes, `%b`.
    Bytes,
}

impl ValueType {
    /// The type code that starts a value of this type on the wire.
    pub fn code(self) -> u8 {
        match self {
            ValueType::Scalar(t) => t.code(),
            ValueType::Array(t) => ARRAY_BIT | t.code(),
            ValueType::Bytes => BYTES_CODE,
        }
    }

    /// The value type whose code is `code`, if any.
    pub fn from_code(code: u8) -> Option<ValueType> {
        if code == BYTES_CODE {
            Some(ValueType::Bytes)
        } else if code & ARRAY_BIT != 0 {
            ScalarType::from_code(code & !ARRAY_BIT).map(ValueType::Array)
        } else {
            ScalarType::from_code(code).map(ValueType::Scalar)
        }
    }

    /// The canonical specifier, e.g. `%d`, `%alf` or `%b`.
    pub fn spec(self) -> &'static str {
        match self {
            ValueType::Scalar(t) => t.spec(),
            ValueType::Array(t) => match t {
                ScalarType::Char => "%ac",
                ScalarType::UChar => "%auc",
                ScalarType::Short => "%ahd",
                ScalarType::UShort => "%auhd",
                ScalarType::Int => "%ad",
                ScalarType::UInt => "%aud",
                ScalarType::Long => "%ald",
                ScalarType::ULong => "%auld",
                ScalarType::Float => "%af",
                ScalarType::Double => "%alf",
                ScalarType::Str => "%as",
            },
            ValueType::Bytes => "%b",
        }
    }
}

impl fmt::Display for ValueType {
    /// Writes the canonical specifier, e.g. `%ad`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.spec())
    }
}

/// One typed value of a payload; each variant is the value of one format specifier
/// (`"%d %as"` is an [`Value::Int`] then a [`Value::StrArray`]).
///
/// Build values with the variants or `From` (`Value::from(7i32)`, `vec!["a"].into()`);
/// read them with [`Value::as_i64`], [`Value::as_f64`], [`Value::as_str`],
/// [`Value::as_array`] and their kin, or by matching. `%A…` is a synonym of `%a…`.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// `%c`: a signed 8-bit integer.
    Char(i8),
    /// `%uc`: an unsigned 8-bit integer.
    UChar(u8),
    /// `%hd`: a signed 16-bit integer.
    Short(i16),
    /// `%uhd`: an unsigned 16-bit integer.
    UShort(u16),
    /// `%d`: a signed 32-bit integer.
    Int(i32),
    /// `%ud`: an unsigned 32-bit integer.
    UInt(u32),
    /// `%ld`: a signed 64-bit integer.
    Long(i64),
    /// `%uld`: an unsigned 64-bit integer.
    ULong(u64),
    /// `%f`: a 32-bit float.
    Float(f32),
    /// `%lf`: a 64-bit float.
    Double(f64),
    /// `%s`: a UTF-8 string.
    Str(String),
    /// `%ac`: an array of signed 8-bit integers.
    CharArray(Vec<i8>),
    /// `%auc`: an array of unsigned 8-bit integers (a different type from `%b`).
    UCharArray(Vec<u8>),
    /// `%ahd`: an array of signed 16-bit integers.
    ShortArray(Vec<i16>),
    /// `%auhd`: an array of unsigned 16-bit integers.
    UShortArray(Vec<u16>),
    /// `%ad`: an array of signed 32-bit integers.
    IntArray(Vec<i32>),
    /// `%aud`: an array of unsigned 32-bit integers.
    UIntArray(Vec<u32>),
    /// `%ald`: an array of signed 64-bit integers.
    LongArray(Vec<i64>),
    /// `%auld`: an array of unsigned 64-bit integers.
    ULongArray(Vec<u64>),
    /// `%af`: an array of 32-bit floats.
    FloatArray(Vec<f32>),
    /// `%alf`: an array of 64-bit floats.
    DoubleArray(Vec<f64>),
    /// `%as`: an array of UTF-8 strings.
    StrArray(Vec<String>),
    /// `%b`: raw bytes (build it with [`Value::bytes`]; `Vec<u8>` converts to `%auc`).
    Bytes(Vec<u8>),
}

impl Value {
    /// The type of this value, as a format string would name it.
    pub fn value_type(&self) -> ValueType {
        use ScalarType as S;
        use ValueType::{Array, Scalar};
        match self {
            Value::Char(_) => Scalar(S::Char),
            Value::UChar(_) => Scalar(S::UChar),
            Value::Short(_) => Scalar(S::Short),
            Value::UShort(_) => Scalar(S::UShort),
            Value::Int(_) => Scalar(S::Int),
            Value::UInt(_) => Scalar(S::UInt),
            Value::Long(_) => Scalar(S::Long),
            Value::ULong(_) => Scalar(S::ULong),
            Value::Float(_) => Scalar(S::Float),
            Value::Double(_) => Scalar(S::Double),
            Value::Str(_) => Scalar(S::Str),
            Value::CharArray(_) => Array(S::Char),
            Value::UCharArray(_) => Array(S::UChar),
            Value::ShortArray(_) => Array(S::Short),
            Value::UShortArray(_) => Array(S::UShort),
            Value::IntArray(_) => Array(S::Int),
            Value::UIntArray(_) => Array(S::UInt),
            Value::LongArray(_) => Array(S::Long),
            Value::ULongArray(_) => Array(S::ULong),
            Value::FloatArray(_) => Array(S::Float),
            Value::DoubleArray(_) => Array(S::Double),
            Value::StrArray(_) => Array(S::Str),
            Value::Bytes(_) => ValueType::Bytes,
        }
    }

    /// A numeric array cut into `n` equal blocks, of which those at `keep` are
    /// put together in that order (reduce-scatter's blocks); `None` for a value
    /// that is not a numeric array of a multiple of `n` elements, or an index
    /// past `n`.
    pub fn blocks(&self, n: usize, keep: &[usize]) -> Option<Value> {
        if n == 0 || keep.iter().any(|&i| i >= n) {
            return None;
        }
        macro_rules! cut {
            ($($variant:ident),*) => {
                match self {
                    $(Value::$variant(a) if a.len() % n == 0 => {
                        let k = a.len() / n;
                        let mut out = Vec::with_capacity(k * keep.len());
                        for &i in keep {
                            out.extend_from_slice(&a[i * k..(i + 1) * k]);
                        }
                        Some(Value::$variant(out))
                    })*
                    _ => None,
                }
            };
        }
        cut!(
            CharArray,
            UCharArray,
            ShortArray,
            UShortArray,
            IntArray,
            UIntArray,
            LongArray,
            ULongArray,
            FloatArray,
            DoubleArray
        )
    }

    /// The canonical specifier of this value's type, e.g. `%ad`.
    pub fn spec(&self) -> &'static str {
        self.value_type().spec()
    }

    /// Raw bytes (`%b`); use this rather than `From<Vec<u8>>`, which gives a `%auc` array.
    pub fn bytes(data: impl Into<Vec<u8>>) -> Value {
        Value::Bytes(data.into())
    }

    /// The value of an integer scalar of any width, if it fits in an `i64`.
    pub fn as_i64(&self) -> Option<i64> {
        match *self {
            Value::Char(v) => Some(v.into()),
            Value::UChar(v) => Some(v.into()),
            Value::Short(v) => Some(v.into()),
            Value::UShort(v) => Some(v.into()),
            Value::Int(v) => Some(v.into()),
            Value::UInt(v) => Some(v.into()),
            Value::Long(v) => Some(v),
            Value::ULong(v) => i64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The value of an integer scalar of any width, if it is not negative.
    pub fn as_u64(&self) -> Option<u64> {
        match *self {
            Value::ULong(v) => Some(v),
            _ => self.as_i64().and_then(|v| u64::try_from(v).ok()),
        }
    }

    /// The value of any numeric scalar as an `f64` (64-bit integers may round).
    pub fn as_f64(&self) -> Option<f64> {
        match *self {
            Value::Float(v) => Some(v.into()),
            Value::Double(v) => Some(v),
            Value::Long(v) => Some(v as f64),
            Value::ULong(v) => Some(v as f64),
            _ => self.as_i64().map(|v| v as f64),
        }
    }

    /// The string of a `%s` value.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The bytes of a `%b` value.
    pub fn as_bytes(&self) -> Option<&[u8]> {
        match self {
            Value::Bytes(b) => Some(b),
            _ => None,
        }
    }

    /// The elements of an array whose elements are `T`: `as_array::<i32>()` for `%ad`,
    /// `as_array::<String>()` for `%as`, `as_array::<u8>()` for `%auc` (not `%b`: see
    /// [`Value::as_bytes`]). `None` for a scalar or an array of another type.
    pub fn as_array<T: ArrayElement>(&self) -> Option<&[T]> {
        T::slice(self)
    }

    /// The elements of an integer array of any width, if each fits in an `i64`.
    pub fn to_i64_vec(&self) -> Option<Vec<i64>> {
        fn all<T: Copy>(v: &[T], f: impl Fn(T) -> Option<i64>) -> Option<Vec<i64>> {
            v.iter().map(|&x| f(x)).collect()
        }
        match self {
            Value::CharArray(v) => all(v, |x| Some(x.into())),
            Value::UCharArray(v) => all(v, |x| Some(x.into())),
            Value::ShortArray(v) => all(v, |x| Some(x.into())),
            Value::UShortArray(v) => all(v, |x| Some(x.into())),
            Value::IntArray(v) => all(v, |x| Some(x.into())),
            Value::UIntArray(v) => all(v, |x| Some(x.into())),
            Value::LongArray(v) => Some(v.clone()),
            Value::ULongArray(v) => all(v, |x| i64::try_from(x).ok()),
            _ => None,
        }
    }

    /// The elements of any numeric array as `f64`s (64-bit integers may round).
    pub fn to_f64_vec(&self) -> Option<Vec<f64>> {
        match self {
            Value::FloatArray(v) => Some(v.iter().map(|&x| x.into()).collect()),
            Value::DoubleArray(v) => Some(v.clone()),
            Value::LongArray(v) => Some(v.iter().map(|&x| x as f64).collect()),
            Value::ULongArray(v) => Some(v.iter().map(|&x| x as f64).collect()),
            _ => self.to_i64_vec().map(|v| v.into_iter().map(|x| x as f64).collect()),
        }
    }
}

/// An element type of an array value, for [`Value::as_array`]: `i8`, `u8`, `i16`,
/// `u16`, `i32`, `u32`, `i64`, `u64`, `f32`, `f64` and `String`.
pub trait ArrayElement: sealed::Sealed + Sized {
    /// The elements of `value` if it is an array of this type.
    fn slice(value: &Value) -> Option<&[Self]>;
}

mod sealed {
    /// Only the wire's element types are array elements.
    pub trait Sealed {}
}

macro_rules! array_element {
    ($($t:ty => $array:ident;)*) => {$(
        impl sealed::Sealed for $t {}
        impl ArrayElement for $t {
            fn slice(value: &Value) -> Option<&[Self]> {
                match value {
                    Value::$array(v) => Some(v),
                    _ => None,
                }
            }
        }
    )*};
}

array_element! {
    i8 => CharArray;
    u8 => UCharArray;
    i16 => ShortArray;
    u16 => UShortArray;
    i32 => IntArray;
    u32 => UIntArray;
    i64 => LongArray;
    u64 => ULongArray;
    f32 => FloatArray;
    f64 => DoubleArray;
    String => StrArray;
}

macro_rules! value_from {
    ($($t:ty => $scalar:ident, $array:ident;)*) => {$(
        impl From<$t> for Value {
            fn from(v: $t) -> Self {
                Value::$scalar(v)
            }
        }
        impl From<Vec<$t>> for Value {
            fn from(v: Vec<$t>) -> Self {
                Value::$array(v)
            }
        }
    )*};
}

value_from! {
    i8 => Char, CharArray;
    u8 => UChar, UCharArray;
    i16 => Short, ShortArray;
    u16 => UShort, UShortArray;
    i32 => Int, IntArray;
    u32 => UInt, UIntArray;
    i64 => Long, LongArray;
    u64 => ULong, ULongArray;
    f32 => Float, FloatArray;
    f64 => Double, DoubleArray;
    String => Str, StrArray;
}

impl From<&str> for Value {
    fn from(v: &str) -> Self {
        Value::Str(v.to_owned())
    }
}

impl From<Vec<&str>> for Value {
    fn from(v: Vec<&str>) -> Self {
        Value::StrArray(v.into_iter().map(str::to_owned).collect())
    }
}

/// Appends a `u32` length. Lengths over `u32::MAX` cannot occur in a frame
/// (payloads are at most [`crate::MAX_PAYLOAD_LEN`] bytes).
fn put_len(out: &mut Vec<u8>, len: usize) {
    debug_assert!(u32::try_from(len).is_ok(), "length {len} does not fit the wire's u32");
    out.extend_from_slice(&(len as u32).to_le_bytes());
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_len(out, s.len());
    out.extend_from_slice(s.as_bytes());
}

macro_rules! put_array {
    ($out:expr, $v:expr) => {{
        put_len($out, $v.len());
        for x in $v {
            $out.extend_from_slice(&x.to_le_bytes());
        }
    }};
}

/// Appends the self-describing encoding of `values` to `out`.
pub fn encode_values(values: &[Value], out: &mut Vec<u8>) {
    for value in values {
        out.push(value.value_type().code());
        match value {
            Value::Char(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::UChar(v) => out.push(*v),
            Value::Short(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::UShort(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Int(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::UInt(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Long(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::ULong(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Float(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Double(v) => out.extend_from_slice(&v.to_le_bytes()),
            Value::Str(s) => put_str(out, s),
            Value::CharArray(v) => put_array!(out, v),
            Value::UCharArray(v) | Value::Bytes(v) => {
                put_len(out, v.len());
                out.extend_from_slice(v);
            }
            Value::ShortArray(v) => put_array!(out, v),
            Value::UShortArray(v) => put_array!(out, v),
            Value::IntArray(v) => put_array!(out, v),
            Value::UIntArray(v) => put_array!(out, v),
            Value::LongArray(v) => put_array!(out, v),
            Value::ULongArray(v) => put_array!(out, v),
            Value::FloatArray(v) => put_array!(out, v),
            Value::DoubleArray(v) => put_array!(out, v),
            Value::StrArray(v) => {
                put_len(out, v.len());
                for s in v {
                    put_str(out, s);
                }
            }
        }
    }
}

/// Appends the head of a `%b` value of `len` bytes (its type code and length); the
/// caller appends the `len` bytes themselves. With [`encode_values`] for the values
/// before it, this lets a large byte payload be read straight into the buffer that
/// becomes the frame, with the same encoding as a [`Value::Bytes`].
///
/// # Errors
/// [`EncodeError::TooLong`] when `len` is over [`crate::MAX_PAYLOAD_LEN`] (no frame
/// could carry the value, and the wire's `u32` length could not say it); nothing is
/// appended then.
pub fn encode_bytes_head(len: usize, out: &mut Vec<u8>) -> Result<(), EncodeError> {
    if len > crate::MAX_PAYLOAD_LEN {
        return Err(EncodeError::TooLong { what: "byte array", len, max: crate::MAX_PAYLOAD_LEN });
    }
    out.push(BYTES_CODE);
    put_len(out, len);
    Ok(())
}

/// Reads a `u32` count of items that each take at least `min_width` bytes, and
/// checks that the rest of the input can hold them, before anything is allocated.
fn read_count(r: &mut Reader<'_>, what: &'static str, min_width: usize) -> Result<usize, DecodeError> {
    let n = r.u32(what)?;
    // u32 * 8 cannot overflow a u64.
    let needed = u64::from(n) * min_width as u64;
    let available = r.remaining();
    if needed > available as u64 {
        return Err(DecodeError::Truncated {
            what,
            needed: usize::try_from(needed - available as u64).unwrap_or(usize::MAX),
            available,
        });
    }
    Ok(n as usize)
}

fn read_str(r: &mut Reader<'_>, what: &'static str) -> Result<String, DecodeError> {
    str_slice(r, what).map(str::to_owned)
}

fn str_slice<'a>(r: &mut Reader<'a>, what: &'static str) -> Result<&'a str, DecodeError> {
    let len = read_count(r, what, 1)?;
    let offset = r.offset();
    let bytes = r.take(len, what)?;
    std::str::from_utf8(bytes).map_err(|_| DecodeError::InvalidUtf8 { what, offset })
}

macro_rules! get_array {
    ($r:expr, $read:ident, $width:expr) => {{
        let n = read_count($r, "array", $width)?;
        let mut v = Vec::with_capacity(n);
        for _ in 0..n {
            v.push($r.$read("array element")?);
        }
        v
    }};
}

fn decode_one(r: &mut Reader<'_>) -> Result<Value, DecodeError> {
    let offset = r.offset();
    let code = r.u8("value type code")?;
    let Some(ty) = ValueType::from_code(code) else {
        return Err(DecodeError::UnknownTypeCode { code, offset });
    };
    use ScalarType as S;
    const W: &str = "value";
    Ok(match ty {
        ValueType::Scalar(t) => match t {
            S::Char => Value::Char(r.i8(W)?),
            S::UChar => Value::UChar(r.u8(W)?),
            S::Short => Value::Short(r.i16(W)?),
            S::UShort => Value::UShort(r.u16(W)?),
            S::Int => Value::Int(r.i32(W)?),
            S::UInt => Value::UInt(r.u32(W)?),
            S::Long => Value::Long(r.i64(W)?),
            S::ULong => Value::ULong(r.u64(W)?),
            S::Float => Value::Float(r.f32(W)?),
            S::Double => Value::Double(r.f64(W)?),
            S::Str => Value::Str(read_str(r, "string")?),
        },
        ValueType::Array(t) => {
            let w = t.min_width();
            match t {
                S::Char => Value::CharArray(get_array!(r, i8, w)),
                S::UChar => {
                    let n = read_count(r, "array", w)?;
                    Value::UCharArray(r.take(n, "array")?.to_vec())
                }
                S::Short => Value::ShortArray(get_array!(r, i16, w)),
                S::UShort => Value::UShortArray(get_array!(r, u16, w)),
                S::Int => Value::IntArray(get_array!(r, i32, w)),
                S::UInt => Value::UIntArray(get_array!(r, u32, w)),
                S::Long => Value::LongArray(get_array!(r, i64, w)),
                S::ULong => Value::ULongArray(get_array!(r, u64, w)),
                S::Float => Value::FloatArray(get_array!(r, f32, w)),
                S::Double => Value::DoubleArray(get_array!(r, f64, w)),
                S::Str => {
                    let n = read_count(r, "string array", w)?;
                    let mut v = Vec::with_capacity(n);
                    for _ in 0..n {
                        v.push(read_str(r, "string array element")?);
                    }
                    Value::StrArray(v)
                }
            }
        }
        ValueType::Bytes => {
            let n = read_count(r, "bytes", 1)?;
            Value::Bytes(r.take(n, "bytes")?.to_vec())
        }
    })
}

/// Checks the next value of a payload as [`decode_values`] reads it, with the same
/// errors, and returns its type without making the value: `r` is left after it, so
/// its offsets before and after bound the value (for code that reads the bytes
/// itself, such as a filter folding numbers where they lie).
///
/// # Errors
/// As [`decode_values`], for this value.
pub fn skip_value(r: &mut Reader<'_>) -> Result<ValueType, DecodeError> {
    let offset = r.offset();
    let code = r.u8("value type code")?;
    let Some(ty) = ValueType::from_code(code) else {
        return Err(DecodeError::UnknownTypeCode { code, offset });
    };
    match ty {
        ValueType::Scalar(ScalarType::Str) => {
            str_slice(r, "string")?;
        }
        ValueType::Scalar(t) => {
            r.take(t.min_width(), "value")?;
        }
        ValueType::Array(ScalarType::Str) => {
            for _ in 0..read_count(r, "string array", ScalarType::Str.min_width())? {
                str_slice(r, "string array element")?;
            }
        }
        ValueType::Array(t) => {
            let w = t.min_width();
            let n = read_count(r, "array", w)?;
            // read_count checked that the input holds the n elements.
            r.take(n.saturating_mul(w), "array")?;
        }
        ValueType::Bytes => {
            let n = read_count(r, "bytes", 1)?;
            r.take(n, "bytes")?;
        }
    }
    Ok(ty)
}

/// The format of the values a payload holds, checked as [`decode_values`] checks
/// it (the same error for the same input) without making the values: for code that
/// needs a packet's format string but reads its bytes itself (a plug-in filter).
///
/// # Errors
/// As [`decode_values`].
pub fn decode_format(buf: &[u8]) -> Result<crate::Format, DecodeError> {
    let mut r = Reader::new(buf);
    let mut types = Vec::new();
    while r.remaining() > 0 {
        types.push(skip_value(&mut r)?);
    }
    Ok(crate::Format { types })
}

/// Decodes a whole payload into values.
///
/// Never panics, and never allocates more than the input could hold: every
/// length is checked against the bytes that remain before anything is reserved.
///
/// # Errors
/// A [`DecodeError`] naming what was malformed; trailing bytes are an error.
pub fn decode_values(buf: &[u8]) -> Result<Vec<Value>, DecodeError> {
    let mut r = Reader::new(buf);
    let mut values = Vec::new();
    // Every byte left over starts another value, so bytes after the last
    // well-formed value fail as an unknown type code or a truncated value.
    while r.remaining() > 0 {
        values.push(decode_one(&mut r)?);
    }
    Ok(values)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_bytes_head_then_the_bytes_encode_as_a_bytes_value() {
        let data = vec![7u8; 300];
        let mut whole = Vec::new();
        encode_values(&[Value::ULong(5), Value::Bytes(data.clone())], &mut whole);
        let mut parts = Vec::new();
        encode_values(&[Value::ULong(5)], &mut parts);
        encode_bytes_head(data.len(), &mut parts).unwrap();
        parts.extend_from_slice(&data);
        assert_eq!(parts, whole);
    }

    #[test]
    fn a_bytes_head_too_long_for_a_frame_is_an_error_and_appends_nothing() {
        let mut out = vec![1u8];
        let err = encode_bytes_head(crate::MAX_PAYLOAD_LEN + 1, &mut out).unwrap_err();
        assert!(matches!(err, EncodeError::TooLong { .. }), "{err:?}");
        assert_eq!(out, [1u8]);
        encode_bytes_head(crate::MAX_PAYLOAD_LEN, &mut out).unwrap();
    }

    #[test]
    fn arrays_are_read_by_element_type_and_widened() {
        let ints = Value::IntArray(vec![1, -2]);
        assert_eq!(ints.as_array::<i32>(), Some(&[1, -2][..]));
        assert_eq!(ints.as_array::<i64>(), None, "the element type must match");
        assert_eq!(ints.to_i64_vec(), Some(vec![1, -2]));
        assert_eq!(ints.to_f64_vec(), Some(vec![1.0, -2.0]));
        let names = Value::from(vec!["a", "b"]);
        assert_eq!(names.as_array::<String>().map(<[String]>::len), Some(2));
        assert_eq!(names.to_i64_vec(), None);
        assert_eq!(Value::UCharArray(vec![1]).as_array::<u8>(), Some(&[1u8][..]));
        assert_eq!(Value::bytes(vec![1]).as_array::<u8>(), None, "%b is not %auc");
        assert_eq!(Value::ULongArray(vec![u64::MAX]).to_i64_vec(), None);
        assert_eq!(Value::FloatArray(vec![0.5]).to_f64_vec(), Some(vec![0.5]));
        assert_eq!(Value::Int(1).as_array::<i32>(), None);
        assert_eq!(Value::Int(1).to_i64_vec(), None);
    }

    fn enc(values: &[Value]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_values(values, &mut out);
        out
    }

    #[test]
    fn codes_and_specs_are_consistent() {
        for t in ScalarType::ALL {
            assert_eq!(ScalarType::from_code(t.code()), Some(t));
            assert_eq!(ValueType::from_code(t.code()), Some(ValueType::Scalar(t)));
            assert_eq!(ValueType::from_code(0x40 | t.code()), Some(ValueType::Array(t)));
            assert_eq!(ValueType::Array(t).spec(), format!("%a{}", t.letters()));
            assert_eq!(ValueType::Scalar(t).to_string(), t.spec());
        }
        assert_eq!(ValueType::from_code(0x20), Some(ValueType::Bytes));
        for bad in [0u8, 12, 0x21, 0x40, 0x4c, 0x60, 0x61, 0xff] {
            assert_eq!(ValueType::from_code(bad), None, "{bad:#x}");
        }
    }

    #[test]
    fn scalar_layout_is_code_then_little_endian() {
        assert_eq!(enc(&[Value::Int(-2)]), [5, 0xfe, 0xff, 0xff, 0xff]);
        assert_eq!(enc(&[Value::Str("hé".into())]), [11, 3, 0, 0, 0, b'h', 0xc3, 0xa9]);
        assert_eq!(enc(&[Value::ShortArray(vec![1, -1])]), [0x43, 2, 0, 0, 0, 1, 0, 0xff, 0xff]);
        assert_eq!(enc(&[Value::bytes([7u8])]), [0x20, 1, 0, 0, 0, 7]);
    }

    #[test]
    fn hostile_array_count_is_refused_before_allocation() {
        // %auld claiming u32::MAX elements with 16 bytes behind it.
        let mut buf = vec![0x48, 0xff, 0xff, 0xff, 0xff];
        buf.extend_from_slice(&[0; 16]);
        let err = decode_values(&buf).unwrap_err();
        assert!(matches!(err, DecodeError::Truncated { what: "array", available: 16, .. }), "{err:?}");
        // %as claiming 5 strings with 16 bytes: needs at least 20.
        let mut buf = vec![0x4b, 5, 0, 0, 0];
        buf.extend_from_slice(&[0; 16]);
        assert!(matches!(decode_values(&buf), Err(DecodeError::Truncated { what: "string array", .. })));
    }

    #[test]
    fn errors_name_what_and_where() {
        assert_eq!(
            decode_values(&[5, 1, 0]).unwrap_err().to_string(),
            "truncated value: needed 2 more bytes, 2 available"
        );
        let err = decode_values(&[5, 0, 0, 0, 0, 0x13]).unwrap_err();
        assert_eq!(err, DecodeError::UnknownTypeCode { code: 0x13, offset: 5 });
        assert_eq!(err.to_string(), "unknown value type code 0x13 at byte 5");
        let err = decode_values(&[11, 2, 0, 0, 0, 0xc3, 0x28]).unwrap_err();
        assert_eq!(err, DecodeError::InvalidUtf8 { what: "string", offset: 5 });
        assert_eq!(
            decode_values(&[11, 9, 0, 0, 0, b'a']).unwrap_err().to_string(),
            "truncated string: needed 8 more bytes, 1 available"
        );
    }

    #[test]
    fn accessors_convert_across_widths() {
        assert_eq!(Value::from(-3i8).as_i64(), Some(-3));
        assert_eq!(Value::from(-3i8).as_u64(), None);
        assert_eq!(Value::from(u64::MAX).as_i64(), None);
        assert_eq!(Value::from(u64::MAX).as_u64(), Some(u64::MAX));
        assert_eq!(Value::from(7u16).as_f64(), Some(7.0));
        assert_eq!(Value::from(1.5f32).as_f64(), Some(1.5));
        assert_eq!(Value::from(1.5f32).as_i64(), None);
        assert_eq!(Value::from("x").as_str(), Some("x"));
        assert_eq!(Value::from(vec!["a", "b"]).spec(), "%as");
        assert_eq!(Value::from(vec![1u8]).spec(), "%auc");
        assert_eq!(Value::bytes(vec![1u8]).as_bytes(), Some(&[1u8][..]));
        assert_eq!(Value::from("x").as_bytes(), None);
    }

    #[test]
    fn numeric_arrays_give_the_blocks_asked_for_in_that_order() {
        let v = Value::IntArray(vec![0, 1, 2, 3, 4, 5]);
        assert_eq!(v.blocks(3, &[2, 0]), Some(Value::IntArray(vec![4, 5, 0, 1])));
        assert_eq!(v.blocks(3, &[]), Some(Value::IntArray(vec![])));
        assert_eq!(v.blocks(4, &[0]), None, "6 elements do not make 4 blocks");
        assert_eq!(v.blocks(3, &[3]), None);
        assert_eq!(v.blocks(0, &[]), None);
        assert_eq!(Value::Int(3).blocks(1, &[0]), None);
        assert_eq!(Value::StrArray(vec!["a".into()]).blocks(1, &[0]), None);
    }
}
