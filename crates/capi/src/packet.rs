//! Packets received (`tc_packet`): their header, and their values read by index or
//! checked against a format string. Every pointer a getter hands out stays valid
//! until the packet is freed.

use std::ffi::{c_char, c_void, CString};

use treecast_api::{ApiError, Format, Packet, ScalarType, Value, ValueType};

use crate::error::{guard, quiet, tc_result, Failure};
use crate::ffi::{arg, out_ok, put, take, text};
use crate::values::code;

/// A packet received from the tree; owned by the caller, freed with `tc_packet_free`.
/// A packet may be read from several threads at once.
#[allow(non_camel_case_types)]
pub struct tc_packet {
    packet: Packet,
    values: Vec<Value>,
    /// NUL-terminated copies of the strings, by value index (empty for other values,
    /// and none at all for a packet without strings).
    strings: Vec<Vec<CString>>,
    /// For each `%as` value, its strings' pointers, as C reads an array of them.
    string_tables: Vec<Vec<*const c_char>>,
}

// SAFETY: the raw pointers point into `strings`, owned by the same packet and never
// changed after it is made; reading them from several threads is safe.
unsafe impl Send for tc_packet {}
// SAFETY: as above; nothing in a packet changes after it is made.
unsafe impl Sync for tc_packet {}

impl tc_packet {
    /// Decodes a packet's values for C.
    pub(crate) fn new(packet: Packet) -> Result<tc_packet, Failure> {
        let values = packet.values().map_err(Failure::from)?;
        let (mut strings, mut string_tables) = (Vec::new(), Vec::new());
        // Most packets hold numbers only: no copies, no tables, no allocation for them.
        if values.iter().any(|v| matches!(v, Value::Str(_) | Value::StrArray(_))) {
            for v in &values {
                let copies: Vec<CString> = match v {
                    Value::Str(s) => vec![c_string(s)],
                    Value::StrArray(all) => all.iter().map(|s| c_string(s)).collect(),
                    _ => Vec::new(),
                };
                string_tables.push(match v {
                    Value::StrArray(_) => copies.iter().map(|c| c.as_ptr()).collect(),
                    _ => Vec::new(),
                });
                strings.push(copies);
            }
        }
        Ok(tc_packet { packet, values, strings, string_tables })
    }

    /// The NUL-terminated copies of value `index`'s strings (none for other values).
    fn strings_of(&self, index: usize) -> &[CString] {
        self.strings.get(index).map_or(&[], Vec::as_slice)
    }

    /// Value `index`'s table of string pointers (empty for other values).
    fn string_table(&self, index: usize) -> &[*const c_char] {
        self.string_tables.get(index).map_or(&[], Vec::as_slice)
    }

    fn value(&self, index: usize) -> Result<&Value, Failure> {
        self.values.get(index).ok_or_else(|| {
            Failure::new(
                tc_result::TC_ERR_RANGE,
                format!("the packet has {} values; index {index} is past them", self.values.len()),
            )
        })
    }
}

/// A string as C reads it: cut at a NUL inside it (data holding NUL goes as `%b`).
fn c_string(s: &str) -> CString {
    CString::new(s.split('\0').next().unwrap_or_default()).unwrap_or_default()
}

fn wrong_type(index: usize, v: &Value, wanted: &str) -> Failure {
    Failure::new(
        tc_result::TC_ERR_FORMAT,
        format!("value {index} is {}, not {wanted}", v.value_type().spec()),
    )
}

/// The number of classes in an equivalence-class table (what the `eqclass` filter
/// sends up); 0 for any other packet, or NULL.
///
/// # Safety
/// `packet` is NULL or a live packet.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_class_count(packet: *const tc_packet) -> usize {
    quiet(0, || {
        // SAFETY: as the caller promised.
        let p = unsafe { packet.as_ref() }.filter(|p| p.packet.is_eq_classes());
        p.and_then(|p| p.packet.eq_classes().ok()).map_or(0, |c| c.len())
    })
}

/// Class `index` of an equivalence-class table: the ranks that sent the same values,
/// as text (`"0-3,8"`, freed with `tc_string_free`), and those values as a packet
/// of the same stream, tag and rank (read with `tc_packet_unpack` and the getters,
/// freed with `tc_packet_free`). Either out-parameter may be NULL when not wanted.
/// `TC_ERR_FORMAT` for a packet that is no such table, `TC_ERR_RANGE` past its classes.
///
/// # Safety
/// `packet` is NULL or a live packet; `ranks` and `values` are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_class(
    packet: *const tc_packet,
    index: usize,
    ranks: *mut *mut c_char,
    values: *mut *mut tc_packet,
) -> tc_result {
    guard("tc_packet_class", || {
        // SAFETY: as the caller promised.
        let p = unsafe { arg(packet, "packet") }?;
        if !p.packet.is_eq_classes() {
            return Err(Failure::new(
                tc_result::TC_ERR_FORMAT,
                "the packet is not an equivalence-class table (a stream with the eqclass filter sends those); \
                 read it with tc_packet_unpack",
            ));
        }
        let classes = p.packet.eq_classes().map_err(Failure::from)?;
        let n = classes.len();
        let class = classes.into_iter().nth(index).ok_or_else(|| {
            Failure::new(
                tc_result::TC_ERR_RANGE,
                format!("the table has {n} classes; index {index} is past them"),
            )
        })?;
        let made = match values.is_null() {
            true => None,
            false => Some(tc_packet::new(p.packet.with_values(&class.values))?),
        };
        // SAFETY: each written only when not NULL.
        unsafe {
            if !ranks.is_null() {
                put(ranks, crate::ffi::c_text(&class.ranks.to_string()).into_raw());
            }
            if let Some(made) = made {
                put(values, crate::ffi::handle(made));
            }
        }
        Ok(())
    })
}

/// Frees a packet; NULL is ignored.
///
/// # Safety
/// `packet` is NULL or a packet not freed yet, used by no other thread.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_free(packet: *mut tc_packet) {
    // SAFETY: as the caller promised.
    quiet((), || drop(unsafe { take(packet) }));
}

/// The stream the packet came on (0 for NULL).
///
/// # Safety
/// `packet` is NULL or a live packet.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_stream(packet: *const tc_packet) -> u32 {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { packet.as_ref() }.map_or(0, |p| p.packet.stream()))
}

/// The packet's tag (0 for NULL).
///
/// # Safety
/// `packet` is NULL or a live packet.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_tag(packet: *const tc_packet) -> i32 {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { packet.as_ref() }.map_or(0, |p| p.packet.tag()))
}

/// The rank that sent the packet; for a reduction, the rank its filter put there
/// (`UINT32_MAX` from the front-end, and for NULL).
///
/// # Safety
/// `packet` is NULL or a live packet.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_rank(packet: *const tc_packet) -> u32 {
    // SAFETY: as the caller promised.
    quiet(u32::MAX, || unsafe { packet.as_ref() }.map_or(u32::MAX, |p| p.packet.rank()))
}

/// The number of values in the packet (0 for NULL).
///
/// # Safety
/// `packet` is NULL or a live packet.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_count(packet: *const tc_packet) -> usize {
    // SAFETY: as the caller promised.
    quiet(0, || unsafe { packet.as_ref() }.map_or(0, |p| p.values.len()))
}

/// The `TC_TYPE_*` code of value `index` (0 when there is no such value).
///
/// # Safety
/// `packet` is NULL or a live packet.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_type(packet: *const tc_packet, index: usize) -> u32 {
    quiet(0, || {
        // SAFETY: as the caller promised.
        let p = unsafe { packet.as_ref() };
        p.and_then(|p| p.values.get(index)).map_or(0, |v| code(v.value_type()))
    })
}

/// Checks the packet's values against a format string, e.g. `"%d %as"`; the message
/// of a mismatch names the first value that differs.
///
/// # Safety
/// `packet` is NULL or a live packet; `format` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_check(packet: *const tc_packet, format: *const c_char) -> tc_result {
    guard("tc_packet_check", || {
        // SAFETY: as the caller promised.
        let (p, format) = unsafe { (arg(packet, "packet")?, text(format, "format")?) };
        // As `Packet::unpack`, against the values decoded when the packet came.
        let format = Format::parse(format).map_err(ApiError::from)?;
        if p.packet.is_eq_classes() {
            return Err(ApiError::EqClassPacket { stream: p.packet.stream() }.into());
        }
        format.check(&p.values).map_err(ApiError::from)?;
        Ok(())
    })
}

/// Value `index`, any integer type, as a signed 64-bit integer (an unsigned one over
/// `INT64_MAX` is `TC_ERR_RANGE`).
///
/// # Safety
/// `packet` is NULL or a live packet; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_get_i64(
    packet: *const tc_packet,
    index: usize,
    out: *mut i64,
) -> tc_result {
    guard("tc_packet_get_i64", || {
        // SAFETY: as the caller promised.
        let v = unsafe { arg(packet, "packet") }?.value(index)?;
        out_ok(out, "out")?;
        let n = match v.as_i64() {
            Some(n) => n,
            None if v.as_u64().is_some() => {
                return Err(Failure::new(tc_result::TC_ERR_RANGE, format!("value {index} is over INT64_MAX")))
            }
            None => return Err(wrong_type(index, v, "an integer")),
        };
        // SAFETY: checked not NULL.
        unsafe { put(out, n) };
        Ok(())
    })
}

/// Value `index`, an unsigned integer type (or a signed one that is not negative), as
/// an unsigned 64-bit integer.
///
/// # Safety
/// `packet` is NULL or a live packet; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_get_u64(
    packet: *const tc_packet,
    index: usize,
    out: *mut u64,
) -> tc_result {
    guard("tc_packet_get_u64", || {
        // SAFETY: as the caller promised.
        let v = unsafe { arg(packet, "packet") }?.value(index)?;
        out_ok(out, "out")?;
        let n = match (v.as_u64(), v.as_i64()) {
            (Some(n), _) => n,
            (None, Some(n)) => u64::try_from(n).map_err(|_| {
                Failure::new(tc_result::TC_ERR_RANGE, format!("value {index} is negative: {n}"))
            })?,
            _ => return Err(wrong_type(index, v, "an integer")),
        };
        // SAFETY: checked not NULL.
        unsafe { put(out, n) };
        Ok(())
    })
}

/// Value `index`, `%f` or `%lf`, as a double.
///
/// # Safety
/// `packet` is NULL or a live packet; `out` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_get_f64(
    packet: *const tc_packet,
    index: usize,
    out: *mut f64,
) -> tc_result {
    guard("tc_packet_get_f64", || {
        // SAFETY: as the caller promised.
        let v = unsafe { arg(packet, "packet") }?.value(index)?;
        out_ok(out, "out")?;
        let d = match v {
            Value::Float(f) => f64::from(*f),
            Value::Double(d) => *d,
            _ => return Err(wrong_type(index, v, "%f or %lf")),
        };
        // SAFETY: checked not NULL.
        unsafe { put(out, d) };
        Ok(())
    })
}

/// Value `index`, `%s`: a NUL-terminated string owned by the packet, and its length
/// in bytes (`len` may be NULL). A string holding NUL reads as cut there.
///
/// # Safety
/// `packet` is NULL or a live packet; `out` is NULL or writable; `len` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_get_string(
    packet: *const tc_packet,
    index: usize,
    out: *mut *const c_char,
    len: *mut usize,
) -> tc_result {
    guard("tc_packet_get_string", || {
        // SAFETY: as the caller promised.
        let p = unsafe { arg(packet, "packet") }?;
        let v = p.value(index)?;
        out_ok(out, "out")?;
        let (Value::Str(_), Some(s)) = (v, p.strings_of(index).first()) else {
            return Err(wrong_type(index, v, "%s"));
        };
        // SAFETY: checked not NULL; `len` only when not NULL.
        unsafe {
            put(out, s.as_ptr());
            if !len.is_null() {
                put(len, s.as_bytes().len());
            }
        }
        Ok(())
    })
}

/// Value `index`, an array or `%b`: its elements' `TC_TYPE_*` code (`elem` may be
/// NULL), a pointer to them owned by the packet, and their number. The elements of
/// `%as` are `const char *` (NUL-terminated); those of `%b` and `%auc` bytes.
///
/// # Safety
/// `packet` is NULL or a live packet; the out-pointers are NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn tc_packet_get_array(
    packet: *const tc_packet,
    index: usize,
    elem: *mut u32,
    data: *mut *const c_void,
    len: *mut usize,
) -> tc_result {
    guard("tc_packet_get_array", || {
        // SAFETY: as the caller promised.
        let p = unsafe { arg(packet, "packet") }?;
        let v = p.value(index)?;
        out_ok(data, "data")?;
        out_ok(len, "len")?;
        let (kind, ptr, n) =
            array_parts(p, index, v).ok_or_else(|| wrong_type(index, v, "an array or %b"))?;
        // SAFETY: checked not NULL; `elem` only when not NULL.
        unsafe {
            put(data, ptr);
            put(len, n);
            if !elem.is_null() {
                put(elem, kind);
            }
        }
        Ok(())
    })
}

/// An array value's element code, first element and length.
fn array_parts(p: &tc_packet, index: usize, v: &Value) -> Option<(u32, *const c_void, usize)> {
    fn of<T>(s: ScalarType, all: &[T]) -> Option<(u32, *const c_void, usize)> {
        Some((code(ValueType::Scalar(s)), all.as_ptr().cast(), all.len()))
    }
    match v {
        Value::CharArray(a) => of(ScalarType::Char, a),
        Value::UCharArray(a) => of(ScalarType::UChar, a),
        Value::ShortArray(a) => of(ScalarType::Short, a),
        Value::UShortArray(a) => of(ScalarType::UShort, a),
        Value::IntArray(a) => of(ScalarType::Int, a),
        Value::UIntArray(a) => of(ScalarType::UInt, a),
        Value::LongArray(a) => of(ScalarType::Long, a),
        Value::ULongArray(a) => of(ScalarType::ULong, a),
        Value::FloatArray(a) => of(ScalarType::Float, a),
        Value::DoubleArray(a) => of(ScalarType::Double, a),
        Value::StrArray(_) => of(ScalarType::Str, p.string_table(index)),
        Value::Bytes(b) => Some((code(ValueType::Bytes), b.as_ptr().cast(), b.len())),
        _ => None,
    }
}
