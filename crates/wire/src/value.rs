//! Typed values carried in data payloads, and their self-describing encoding.

use crate::DecodeError;

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

/// One typed value of a payload.
#[derive(Debug, Clone, PartialEq)]
#[allow(missing_docs)] // each variant is its format specifier's type, see ScalarType
pub enum Value {
    Char(i8),
    UChar(u8),
    Short(i16),
    UShort(u16),
    Int(i32),
    UInt(u32),
    Long(i64),
    ULong(u64),
    Float(f32),
    Double(f64),
    Str(String),
    CharArray(Vec<i8>),
    UCharArray(Vec<u8>),
    ShortArray(Vec<i16>),
    UShortArray(Vec<u16>),
    IntArray(Vec<i32>),
    UIntArray(Vec<u32>),
    LongArray(Vec<i64>),
    ULongArray(Vec<u64>),
    FloatArray(Vec<f32>),
    DoubleArray(Vec<f64>),
    StrArray(Vec<String>),
    Bytes(Vec<u8>),
}

impl Value {
    /// The type of this value, as a format string would name it.
    pub fn value_type(&self) -> ValueType {
        todo!("wire helper")
    }
}

/// Appends the self-describing encoding of `values` to `out`.
pub fn encode_values(values: &[Value], out: &mut Vec<u8>) {
    let _ = (values, out);
    todo!("wire helper")
}

/// Decodes a whole payload into values.
///
/// # Errors
/// A [`DecodeError`] naming what was malformed; trailing bytes are an error.
pub fn decode_values(buf: &[u8]) -> Result<Vec<Value>, DecodeError> {
    let _ = buf;
    todo!("wire helper")
}
