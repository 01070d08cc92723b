//! Python objects to and from the wire's typed values, as a format string types them.

use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyList, PyString, PyTuple};
use treecast_api::{Format, ScalarType, Value, ValueType};

use crate::errors::{Fail, Kind};

/// The specifier of a scalar type, for messages.
fn spec(t: ValueType) -> String {
    let letters = |s: ScalarType| match s {
        ScalarType::Char => "c",
        ScalarType::UChar => "uc",
        ScalarType::Short => "hd",
        ScalarType::UShort => "uhd",
        ScalarType::Int => "d",
        ScalarType::UInt => "ud",
        ScalarType::Long => "ld",
        ScalarType::ULong => "uld",
        ScalarType::Float => "f",
        ScalarType::Double => "lf",
        ScalarType::Str => "s",
    };
    match t {
        ValueType::Scalar(s) => format!("%{}", letters(s)),
        ValueType::Array(s) => format!("%a{}", letters(s)),
        ValueType::Bytes => "%b".to_owned(),
    }
}

/// What a Python type name and value look like in a message.
fn shown(v: &Bound<'_, PyAny>) -> String {
    let ty = v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into());
    let repr = v.repr().map(|r| r.to_string()).unwrap_or_default();
    let repr: String =
        if repr.chars().count() > 40 { repr.chars().take(40).chain("...".chars()).collect() } else { repr };
    format!("{ty} {repr}")
}

/// Python's values for `format`: one per specifier, each of the type it names.
pub(crate) fn values_from_py(
    text: &str,
    format: &Format,
    values: &Bound<'_, PyTuple>,
) -> PyResult<Vec<Value>> {
    let py = values.py();
    let fail = |msg: String| Fail::new(Kind::Format, msg).into_pyerr(py);
    if format.types.len() != values.len() {
        return Err(fail(format!(
            "format {text:?} names {} values but {} were given",
            format.types.len(),
            values.len()
        )));
    }
    let mut out = Vec::with_capacity(values.len());
    for (i, (t, v)) in format.types.iter().zip(values.iter()).enumerate() {
        let bad = |what: &str| {
            fail(format!(
                "value {} for {} of format {text:?} must be {what}, not {}",
                i + 1,
                spec(*t),
                shown(&v)
            ))
        };
        let value = match t {
            ValueType::Scalar(s) => scalar(*s, &v).ok_or_else(|| bad(what(*s)))?,
            ValueType::Bytes => {
                if let Ok(b) = v.cast::<PyBytes>() {
                    Value::Bytes(b.as_bytes().to_vec())
                } else if let Ok(b) = v.cast::<PyByteArray>() {
                    Value::Bytes(b.to_vec())
                } else {
                    return Err(bad("bytes or bytearray"));
                }
            }
            ValueType::Array(s) => array(*s, &v).ok_or_else(|| bad(&format!("a list of {}", what(*s))))?,
        };
        out.push(value);
    }
    Ok(out)
}

/// What a scalar type takes, for messages.
fn what(s: ScalarType) -> &'static str {
    match s {
        ScalarType::Char => "an int from -128 to 127",
        ScalarType::UChar => "an int from 0 to 255",
        ScalarType::Short => "an int from -32768 to 32767",
        ScalarType::UShort => "an int from 0 to 65535",
        ScalarType::Int => "an int from -2**31 to 2**31-1",
        ScalarType::UInt => "an int from 0 to 2**32-1",
        ScalarType::Long => "an int from -2**63 to 2**63-1",
        ScalarType::ULong => "an int from 0 to 2**64-1",
        ScalarType::Float | ScalarType::Double => "a float (or int)",
        ScalarType::Str => "a str",
    }
}

/// An int, refusing bools and floats (`True` for `%d` is almost surely a mistake).
fn int<'py, T>(v: &Bound<'py, PyAny>) -> Option<T>
where
    T: for<'a> FromPyObject<'a, 'py>,
{
    if v.is_instance_of::<pyo3::types::PyBool>() || !v.is_instance_of::<pyo3::types::PyInt>() {
        return None;
    }
    v.extract::<T>().ok()
}

fn float(v: &Bound<'_, PyAny>) -> Option<f64> {
    if v.is_instance_of::<pyo3::types::PyBool>() {
        return None;
    }
    if v.is_instance_of::<pyo3::types::PyFloat>() || v.is_instance_of::<pyo3::types::PyInt>() {
        return v.extract::<f64>().ok();
    }
    None
}

fn scalar(s: ScalarType, v: &Bound<'_, PyAny>) -> Option<Value> {
    Some(match s {
        ScalarType::Char => Value::Char(int(v)?),
        ScalarType::UChar => Value::UChar(int(v)?),
        ScalarType::Short => Value::Short(int(v)?),
        ScalarType::UShort => Value::UShort(int(v)?),
        ScalarType::Int => Value::Int(int(v)?),
        ScalarType::UInt => Value::UInt(int(v)?),
        ScalarType::Long => Value::Long(int(v)?),
        ScalarType::ULong => Value::ULong(int(v)?),
        ScalarType::Float => Value::Float(float(v)? as f32),
        ScalarType::Double => Value::Double(float(v)?),
        ScalarType::Str => Value::Str(v.cast::<PyString>().ok()?.to_str().ok()?.to_owned()),
    })
}

fn each<'py, T>(v: &Bound<'py, PyAny>, f: impl Fn(&Bound<'py, PyAny>) -> Option<T>) -> Option<Vec<T>> {
    if v.is_instance_of::<PyString>() {
        return None;
    }
    let mut out = Vec::new();
    for item in v.try_iter().ok()? {
        out.push(f(&item.ok()?)?);
    }
    Some(out)
}

fn array(s: ScalarType, v: &Bound<'_, PyAny>) -> Option<Value> {
    if s == ScalarType::UChar {
        if let Ok(b) = v.cast::<PyBytes>() {
            return Some(Value::UCharArray(b.as_bytes().to_vec()));
        }
    }
    Some(match s {
        ScalarType::Char => Value::CharArray(each(v, int)?),
        ScalarType::UChar => Value::UCharArray(each(v, int)?),
        ScalarType::Short => Value::ShortArray(each(v, int)?),
        ScalarType::UShort => Value::UShortArray(each(v, int)?),
        ScalarType::Int => Value::IntArray(each(v, int)?),
        ScalarType::UInt => Value::UIntArray(each(v, int)?),
        ScalarType::Long => Value::LongArray(each(v, int)?),
        ScalarType::ULong => Value::ULongArray(each(v, int)?),
        ScalarType::Float => Value::FloatArray(each(v, |x| float(x).map(|f| f as f32))?),
        ScalarType::Double => Value::DoubleArray(each(v, float)?),
        ScalarType::Str => {
            Value::StrArray(each(v, |x| Some(x.cast::<PyString>().ok()?.to_str().ok()?.to_owned()))?)
        }
    })
}

/// Wire values as Python objects: ints, floats, str, bytes (`%b`), lists (arrays).
pub(crate) fn values_to_py<'py>(py: Python<'py>, values: &[Value]) -> PyResult<Bound<'py, PyList>> {
    let list = PyList::empty(py);
    for v in values {
        let o: Bound<'py, PyAny> = match v {
            Value::Char(x) => x.into_pyobject(py)?.into_any(),
            Value::UChar(x) => x.into_pyobject(py)?.into_any(),
            Value::Short(x) => x.into_pyobject(py)?.into_any(),
            Value::UShort(x) => x.into_pyobject(py)?.into_any(),
            Value::Int(x) => x.into_pyobject(py)?.into_any(),
            Value::UInt(x) => x.into_pyobject(py)?.into_any(),
            Value::Long(x) => x.into_pyobject(py)?.into_any(),
            Value::ULong(x) => x.into_pyobject(py)?.into_any(),
            Value::Float(x) => f64::from(*x).into_pyobject(py)?.into_any(),
            Value::Double(x) => x.into_pyobject(py)?.into_any(),
            Value::Str(s) => PyString::new(py, s).into_any(),
            Value::CharArray(a) => PyList::new(py, a)?.into_any(),
            Value::UCharArray(a) => PyList::new(py, a)?.into_any(),
            Value::ShortArray(a) => PyList::new(py, a)?.into_any(),
            Value::UShortArray(a) => PyList::new(py, a)?.into_any(),
            Value::IntArray(a) => PyList::new(py, a)?.into_any(),
            Value::UIntArray(a) => PyList::new(py, a)?.into_any(),
            Value::LongArray(a) => PyList::new(py, a)?.into_any(),
            Value::ULongArray(a) => PyList::new(py, a)?.into_any(),
            Value::FloatArray(a) => PyList::new(py, a.iter().map(|f| f64::from(*f)))?.into_any(),
            Value::DoubleArray(a) => PyList::new(py, a)?.into_any(),
            Value::StrArray(a) => PyList::new(py, a)?.into_any(),
            Value::Bytes(b) => PyBytes::new(py, b).into_any(),
        };
        list.append(o)?;
    }
    Ok(list)
}
