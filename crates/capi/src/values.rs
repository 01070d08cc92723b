//! Typed values across the boundary: `tc_value` (what C hands in, one per format
//! specifier) and the type codes C sees, which are the wire's own
//! (`docs/wire-format.md`).

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr};
use std::rc::Rc;

use bytes::Bytes;
use treecast_api::{encode_values, Format, ScalarType, Value, ValueType};

use crate::error::{tc_result, Failure};
use crate::ffi::{out_ok, put, text};

/// `%c`: a signed 8-bit integer.
pub const TC_TYPE_CHAR: u32 = 1;
/// `%uc`: an unsigned 8-bit integer.
pub const TC_TYPE_UCHAR: u32 = 2;
/// `%hd`: a signed 16-bit integer.
pub const TC_TYPE_SHORT: u32 = 3;
/// `%uhd`: an unsigned 16-bit integer.
pub const TC_TYPE_USHORT: u32 = 4;
/// `%d`: a signed 32-bit integer.
pub const TC_TYPE_INT: u32 = 5;
/// `%ud`: an unsigned 32-bit integer.
pub const TC_TYPE_UINT: u32 = 6;
/// `%ld`: a signed 64-bit integer.
pub const TC_TYPE_LONG: u32 = 7;
/// `%uld`: an unsigned 64-bit integer.
pub const TC_TYPE_ULONG: u32 = 8;
/// `%f`: a 32-bit float.
pub const TC_TYPE_FLOAT: u32 = 9;
/// `%lf`: a 64-bit float.
pub const TC_TYPE_DOUBLE: u32 = 10;
/// `%s`: a UTF-8 string.
pub const TC_TYPE_STRING: u32 = 11;
/// `%b`: raw bytes.
pub const TC_TYPE_BYTES: u32 = 0x20;
/// Added to a scalar type for an array of it: `TC_TYPE_ARRAY | TC_TYPE_INT` is `%ad`.
pub const TC_TYPE_ARRAY: u32 = 0x40;
/// Most values one variadic call (`tc_stream_send`, `tc_packet_unpack`) takes; the
/// array calls take any number.
pub const TC_MAX_VA_VALUES: usize = 64;

/// One value handed to a send, of the type its format specifier names (`kind`, a
/// `TC_TYPE_*` code): signed integers in `i`, unsigned ones in `u`, floats in `d`; a
/// string (`%s`) as a NUL-terminated `ptr`; an array as `ptr` to `len` elements
/// (`const char *const *` for `%as`); `%b` as `ptr` to `len` bytes.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct tc_value {
    /// The `TC_TYPE_*` code of the value.
    pub kind: u32,
    /// A signed integer (`%c %hd %d %ld`).
    pub i: i64,
    /// An unsigned integer (`%uc %uhd %ud %uld`).
    pub u: u64,
    /// A float (`%f %lf`).
    pub d: f64,
    /// A string, an array's first element or the bytes; borrowed for the call only.
    pub ptr: *const c_void,
    /// Elements of an array, or bytes of `%b`.
    pub len: usize,
}

/// The type code of `t`, as C sees it.
pub(crate) fn code(t: ValueType) -> u32 {
    u32::from(t.code())
}

/// The types a format string names, in order: written to `types` (room for `cap`)
/// and their number to `count`. A variadic call uses it to read its arguments.
///
/// # Safety
/// `format` is NULL or NUL-terminated; `types` points to `cap` writable `uint32_t`
/// (or is NULL when `cap` is 0); `count` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_format_types(
    format: *const c_char,
    types: *mut u32,
    cap: usize,
    count: *mut usize,
) -> tc_result {
    crate::error::guard("tc_format_types", || {
        // SAFETY: as the caller promised.
        let fmt = parse(unsafe { text(format, "format") }?)?;
        out_ok(count, "count")?;
        if fmt.types.len() > cap {
            return Err(Failure::new(
                tc_result::TC_ERR_RANGE,
                format!("the format names {} values, more than the {cap} there is room for", fmt.types.len()),
            ));
        }
        if !fmt.types.is_empty() {
            out_ok(types, "types")?;
        }
        for (i, t) in fmt.types.iter().enumerate() {
            // SAFETY: i < cap, and the caller promised room for cap.
            unsafe { put(types.add(i), code(*t)) };
        }
        // SAFETY: checked not NULL.
        unsafe { put(count, fmt.types.len()) };
        Ok(())
    })
}

/// Parses a format string, as a failure C can read. A tool sends and unpacks with a
/// few format strings over and over, so the last one read on this thread is kept.
pub(crate) fn parse(format: &str) -> Result<Rc<Format>, Failure> {
    let known = LAST_FORMAT.try_with(|last| match &*last.borrow() {
        Some((text, fmt)) if **text == *format.as_bytes() => Some(Rc::clone(fmt)),
        _ => None,
    });
    if let Ok(Some(fmt)) = known {
        return Ok(fmt);
    }
    let fmt =
        Rc::new(Format::parse(format).map_err(|e| Failure::new(tc_result::TC_ERR_FORMAT, e.to_string()))?);
    // parse_c compares the cache with C strings, which hold no NUL (a Rust string
    // that does is not kept).
    if !format.as_bytes().contains(&0) {
        let _ = LAST_FORMAT
            .try_with(|last| *last.borrow_mut() = Some((format.as_bytes().into(), Rc::clone(&fmt))));
    }
    Ok(fmt)
}

/// A format string's bytes (UTF-8, no NUL) and its reading.
type KnownFormat = (Box<[u8]>, Rc<Format>);

thread_local! {
    /// The last format string parsed on this thread.
    static LAST_FORMAT: RefCell<Option<KnownFormat>> = const { RefCell::new(None) };
}

/// A send's format string from C, with its reading: one equal to the last this
/// thread took is neither measured, checked as UTF-8 nor parsed again.
///
/// # Safety
/// `p` is NULL or NUL-terminated.
pub(crate) unsafe fn parse_c<'a>(p: *const c_char) -> Result<(&'a str, Rc<Format>), Failure> {
    if !p.is_null() {
        let known = LAST_FORMAT.try_with(|last| match &*last.borrow() {
            // SAFETY: not NULL and NUL-terminated, as the caller promised.
            Some((bytes, fmt)) if unsafe { crate::ffi::c_equals(p, bytes) } => {
                Some((bytes.len(), Rc::clone(fmt)))
            }
            _ => None,
        });
        if let Ok(Some((len, fmt))) = known {
            // SAFETY: the `len` bytes at `p` are those of the last format, checked UTF-8.
            let text =
                unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(p.cast::<u8>(), len)) };
            return Ok((text, fmt));
        }
    }
    // SAFETY: as the caller promised.
    let text = unsafe { crate::ffi::text(p, "format") }?;
    Ok((text, parse(text)?))
}

/// The values `values[..n]` as the format `format` names them.
///
/// # Safety
/// `values` points to `n` values whose pointers are valid as [`tc_value`] says.
pub(crate) unsafe fn from_c(format: &str, values: *const tc_value, n: usize) -> Result<Vec<Value>, Failure> {
    // SAFETY: as the caller promised.
    unsafe { values_of(&*parse(format)?, format, values, n) }
}

/// [`from_c`] with the format already read (by [`parse_c`]).
///
/// # Safety
/// As [`from_c`].
pub(crate) unsafe fn values_of(
    fmt: &Format,
    format: &str,
    values: *const tc_value,
    n: usize,
) -> Result<Vec<Value>, Failure> {
    let mut out = Vec::with_capacity(n);
    // SAFETY: as the caller promised (each_c hands over values it checked).
    unsafe {
        each_c(fmt, format, values, n, |t, v| {
            out.push(one(t, v)?);
            Ok(())
        })
    }?;
    Ok(out)
}

/// The values `values[..n]` as the format `format` names them, encoded as a payload
/// (`treecast_wire::encode_values`), with the format: a send's work without a list
/// of values on the way, into a buffer the thread keeps (see
/// [`treecast_api::encoding::payload_from`]).
///
/// # Safety
/// As [`from_c`].
pub(crate) unsafe fn encode_c(
    fmt: &Format,
    format: &str,
    values: *const tc_value,
    n: usize,
) -> Result<Bytes, Failure> {
    let encoded = ENCODING.try_with(|e| {
        let scratch = &mut e.borrow_mut().scratch;
        scratch.clear();
        // SAFETY: as the caller promised.
        unsafe { encode_into(fmt, format, values, n, scratch) }?;
        Ok(treecast_api::encoding::payload_from(scratch))
    });
    encoded.unwrap_or_else(|_| {
        // Only while the thread's locals are being destroyed: a buffer of its own.
        let mut payload = Vec::new();
        // SAFETY: as the caller promised.
        unsafe { encode_into(fmt, format, values, n, &mut payload) }?;
        Ok(Bytes::from(payload))
    })
}

/// Appends the encoding of the values `values[..n]` of format `fmt` (named `format`
/// in errors) to `out`.
///
/// # Safety
/// As [`from_c`].
unsafe fn encode_into(
    fmt: &Format,
    format: &str,
    values: *const tc_value,
    n: usize,
    out: &mut Vec<u8>,
) -> Result<(), Failure> {
    // SAFETY: as the caller promised (each_c hands over values it checked).
    unsafe {
        each_c(fmt, format, values, n, |t, v| match t {
            ValueType::Scalar(s) if s != ScalarType::Str => encode_scalar(s, v, out),
            _ => {
                encode_values(std::slice::from_ref(&one(t, v)?), out);
                Ok(())
            }
        })
    }
}

/// A thread's buffer for encoding sends.
struct Encoding {
    /// Where a send encodes, kept between sends.
    scratch: Vec<u8>,
}

thread_local! {
    static ENCODING: RefCell<Encoding> = const { RefCell::new(Encoding { scratch: Vec::new() }) };
}

/// Hands each of the values `values[..n]`, with the type the format `format` names
/// and its kind checked against it, to `take`, in order; the format, or what does
/// not match it (a kind, or what `take` refused).
///
/// # Safety
/// As [`from_c`].
unsafe fn each_c(
    fmt: &Format,
    format: &str,
    values: *const tc_value,
    n: usize,
    mut take: impl FnMut(ValueType, &tc_value) -> Result<(), Bad>,
) -> Result<(), Failure> {
    if fmt.types.len() != n {
        return Err(Failure::new(
            tc_result::TC_ERR_FORMAT,
            format!("the format {format:?} names {} values and {n} were given", fmt.types.len()),
        ));
    }
    if n == 0 {
        return Ok(());
    }
    if values.is_null() {
        return Err(crate::ffi::null("values"));
    }
    // SAFETY: not NULL, and the caller promised n values.
    let given = unsafe { std::slice::from_raw_parts(values, n) };
    for (i, (t, v)) in fmt.types.iter().zip(given).enumerate() {
        let mismatch = |why: String| {
            Failure::new(
                tc_result::TC_ERR_FORMAT,
                format!("value {} ({}) of {format:?}: {why}", i + 1, t.spec()),
            )
        };
        if v.kind != code(*t) {
            return Err(mismatch(format!("its kind is {}, the format says {}", kind_name(v.kind), t.spec())));
        }
        match take(*t, v) {
            Ok(()) => {}
            Err(Bad::Range(why)) => {
                let mut f = mismatch(why);
                f.code = tc_result::TC_ERR_RANGE;
                return Err(f);
            }
            Err(Bad::Value(why)) => return Err(mismatch(why)),
        }
    }
    Ok(())
}

/// Appends a scalar C value of type `s` (not `%s`; its kind already checked) as
/// `encode_values` encodes the same value, without making a [`Value`]: a send of a
/// few numbers then moves no enum through the stack (a tenth of a C send's cost).
fn encode_scalar(s: ScalarType, v: &tc_value, out: &mut Vec<u8>) -> Result<(), Bad> {
    let int = |what: &str| Bad::Range(format!("{} does not fit in {what}", v.i));
    let uint = |what: &str| Bad::Range(format!("{} does not fit in {what}", v.u));
    out.push(ValueType::Scalar(s).code());
    match s {
        ScalarType::Char => {
            out.extend_from_slice(&i8::try_from(v.i).map_err(|_| int("8 bits"))?.to_le_bytes())
        }
        ScalarType::UChar => out.push(u8::try_from(v.u).map_err(|_| uint("8 bits"))?),
        ScalarType::Short => {
            out.extend_from_slice(&i16::try_from(v.i).map_err(|_| int("16 bits"))?.to_le_bytes())
        }
        ScalarType::UShort => {
            out.extend_from_slice(&u16::try_from(v.u).map_err(|_| uint("16 bits"))?.to_le_bytes())
        }
        ScalarType::Int => {
            out.extend_from_slice(&i32::try_from(v.i).map_err(|_| int("32 bits"))?.to_le_bytes())
        }
        ScalarType::UInt => {
            out.extend_from_slice(&u32::try_from(v.u).map_err(|_| uint("32 bits"))?.to_le_bytes())
        }
        ScalarType::Long => out.extend_from_slice(&v.i.to_le_bytes()),
        ScalarType::ULong => out.extend_from_slice(&v.u.to_le_bytes()),
        ScalarType::Float => out.extend_from_slice(&(v.d as f32).to_le_bytes()),
        ScalarType::Double => out.extend_from_slice(&v.d.to_le_bytes()),
        ScalarType::Str => return Err(Bad::Value("a string is not a scalar to encode here".into())),
    }
    Ok(())
}

fn kind_name(kind: u32) -> String {
    u8::try_from(kind)
        .ok()
        .and_then(ValueType::from_code)
        .map_or_else(|| format!("the unknown code {kind}"), |t| t.spec().to_owned())
}

/// Why one C value cannot be taken.
enum Bad {
    /// A number that does not fit its type (`TC_ERR_RANGE`).
    Range(String),
    /// A NULL, a string that is not UTF-8 (`TC_ERR_FORMAT`).
    Value(String),
}

/// Converts one C value of type `t` (its kind already checked).
///
/// # Safety
/// As [`from_c`].
unsafe fn one(t: ValueType, v: &tc_value) -> Result<Value, Bad> {
    let int = |what: &str| Bad::Range(format!("{} does not fit in {what}", v.i));
    let uint = |what: &str| Bad::Range(format!("{} does not fit in {what}", v.u));
    Ok(match t {
        ValueType::Scalar(s) => match s {
            ScalarType::Char => Value::Char(v.i.try_into().map_err(|_| int("8 bits"))?),
            ScalarType::UChar => Value::UChar(v.u.try_into().map_err(|_| uint("8 bits"))?),
            ScalarType::Short => Value::Short(v.i.try_into().map_err(|_| int("16 bits"))?),
            ScalarType::UShort => Value::UShort(v.u.try_into().map_err(|_| uint("16 bits"))?),
            ScalarType::Int => Value::Int(v.i.try_into().map_err(|_| int("32 bits"))?),
            ScalarType::UInt => Value::UInt(v.u.try_into().map_err(|_| uint("32 bits"))?),
            ScalarType::Long => Value::Long(v.i),
            ScalarType::ULong => Value::ULong(v.u),
            ScalarType::Float => Value::Float(v.d as f32),
            ScalarType::Double => Value::Double(v.d),
            // SAFETY: as the caller promised.
            ScalarType::Str => Value::Str(unsafe { c_str(v.ptr.cast()) }.map_err(Bad::Value)?),
        },
        // SAFETY: as the caller promised.
        ValueType::Bytes => Value::Bytes(unsafe { slice::<u8>(v) }.map_err(Bad::Value)?.to_vec()),
        // SAFETY: as the caller promised.
        ValueType::Array(s) => unsafe { array(s, v) }.map_err(Bad::Value)?,
    })
}

/// # Safety
/// `p` is NULL or NUL-terminated.
unsafe fn c_str(p: *const c_char) -> Result<String, String> {
    if p.is_null() {
        return Err("the string is NULL".into());
    }
    // SAFETY: as the caller promised.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(str::to_owned).map_err(|e| format!("the string is not UTF-8: {e}"))
}

/// # Safety
/// `v.ptr` points to `v.len` elements of `T` (or is NULL with `len` 0).
unsafe fn slice<'a, T>(v: &tc_value) -> Result<&'a [T], String> {
    if v.len == 0 {
        return Ok(&[]);
    }
    if v.ptr.is_null() {
        return Err(format!("NULL with {} elements", v.len));
    }
    // SAFETY: as the caller promised.
    Ok(unsafe { std::slice::from_raw_parts(v.ptr.cast::<T>(), v.len) })
}

/// # Safety
/// As [`slice`], for elements of type `s`.
unsafe fn array(s: ScalarType, v: &tc_value) -> Result<Value, String> {
    // SAFETY: as the caller promised, for the element type the kind names (every arm).
    unsafe {
        Ok(match s {
            ScalarType::Char => Value::CharArray(slice::<i8>(v)?.to_vec()),
            ScalarType::UChar => Value::UCharArray(slice::<u8>(v)?.to_vec()),
            ScalarType::Short => Value::ShortArray(slice::<i16>(v)?.to_vec()),
            ScalarType::UShort => Value::UShortArray(slice::<u16>(v)?.to_vec()),
            ScalarType::Int => Value::IntArray(slice::<i32>(v)?.to_vec()),
            ScalarType::UInt => Value::UIntArray(slice::<u32>(v)?.to_vec()),
            ScalarType::Long => Value::LongArray(slice::<i64>(v)?.to_vec()),
            ScalarType::ULong => Value::ULongArray(slice::<u64>(v)?.to_vec()),
            ScalarType::Float => Value::FloatArray(slice::<f32>(v)?.to_vec()),
            ScalarType::Double => Value::DoubleArray(slice::<f64>(v)?.to_vec()),
            ScalarType::Str => {
                let ptrs = slice::<*const c_char>(v)?;
                let mut all = Vec::with_capacity(ptrs.len());
                for (j, p) in ptrs.iter().enumerate() {
                    all.push(c_str(*p).map_err(|e| format!("element {j}: {e}"))?);
                }
                Value::StrArray(all)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c_value(t: ScalarType, i: i64, u: u64, d: f64) -> tc_value {
        tc_value { kind: code(ValueType::Scalar(t)), i, u, d, ptr: std::ptr::null(), len: 0 }
    }

    /// The direct encoding of scalars writes what `encode_values` writes for the same
    /// value, and refuses what does not fit as `one` does.
    #[test]
    fn scalars_encode_as_their_values_do() {
        let edges = [i64::MIN, -40_000, -129, -128, -1, 0, 1, 127, 128, 255, 256, 65_535, 70_000, i64::MAX];
        let floats = [0.0, -1.5, 3.25e38, f64::MAX, f64::MIN_POSITIVE, f64::INFINITY];
        for t in ScalarType::ALL.into_iter().filter(|t| *t != ScalarType::Str) {
            for (k, &i) in edges.iter().enumerate() {
                let v = c_value(t, i, i as u64, floats[k % floats.len()]);
                let mut direct = Vec::new();
                // SAFETY: a scalar value with no pointer.
                match (encode_scalar(t, &v, &mut direct), unsafe { one(ValueType::Scalar(t), &v) }) {
                    (Ok(()), Ok(value)) => {
                        let mut by_value = Vec::new();
                        encode_values(&[value], &mut by_value);
                        assert_eq!(direct, by_value, "{t:?} of {i}");
                    }
                    (Err(Bad::Range(a)), Err(Bad::Range(b))) => assert_eq!(a, b, "{t:?} of {i}"),
                    (a, b) => panic!("{t:?} of {i}: direct {:?}, by value {:?}", a.is_ok(), b.is_ok()),
                }
            }
        }
    }
}
