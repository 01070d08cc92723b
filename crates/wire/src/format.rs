//! Format strings (`"%d %alf %s"`): parsing, printing, and checking values against them.

use crate::{FormatError, Value, ValueType};

/// A parsed format string: the ordered list of value types of a payload.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Default)]
pub struct Format {
    /// The types, in order.
    pub types: Vec<ValueType>,
}

impl Format {
    /// Parses a format string such as `"%d %lf %as"`.
    ///
    /// # Errors
    /// [`FormatError::Syntax`] naming the column of the first bad specifier.
    pub fn parse(text: &str) -> Result<Format, FormatError> {
        let _ = text;
        todo!("wire helper")
    }

    /// The format that describes `values`.
    pub fn of(values: &[Value]) -> Format {
        Format { types: values.iter().map(Value::value_type).collect() }
    }

    /// Checks that `values` match this format, naming the first value that does not.
    ///
    /// # Errors
    /// [`FormatError::Count`] or [`FormatError::Mismatch`].
    pub fn check(&self, values: &[Value]) -> Result<(), FormatError> {
        let _ = values;
        todo!("wire helper")
    }
}
