//! Format strings (`"%d %alf %s"`): parsing, printing, and checking values against them.
//!
//! Grammar: zero or more specifiers, separated by any amount of whitespace or
//! by nothing (`"%d%d"`). A specifier is `%` followed by one of `c uc hd uhd d
//! ud ld uld f lf s` (a scalar), by `a` or `A` and one of those (an array), or
//! by `b` (raw bytes).

use std::fmt;
use std::str::FromStr;

use crate::{FormatError, ScalarType, Value, ValueType};

/// The scalar letters, longest first so that matching is greedy (`uhd` before `d`).
const LETTERS: [(&str, ScalarType); 11] = [
    ("uhd", ScalarType::UShort),
    ("uld", ScalarType::ULong),
    ("uc", ScalarType::UChar),
    ("ud", ScalarType::UInt),
    ("hd", ScalarType::Short),
    ("ld", ScalarType::Long),
    ("lf", ScalarType::Double),
    ("c", ScalarType::Char),
    ("d", ScalarType::Int),
    ("f", ScalarType::Float),
    ("s", ScalarType::Str),
];

/// What every syntax error about a specifier lists as acceptable.
const EXPECTED: &str =
    "expected one of %c %uc %hd %uhd %d %ud %ld %uld %f %lf %s %b, or an array %a<spec> such as %ad";

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
        let syntax = |byte: usize, reason: String| FormatError::Syntax {
            format: text.to_owned(),
            column: text[..byte].chars().count() + 1,
            reason,
        };
        let mut types = Vec::new();
        let mut i = 0;
        loop {
            i = text.len() - text[i..].trim_start().len();
            let Some(c) = text[i..].chars().next() else { break };
            if c != '%' {
                return Err(syntax(i, format!("expected a specifier starting with %, found {c:?}")));
            }
            let start = i;
            i += 1;
            let array = text[i..].starts_with(['a', 'A']);
            if array {
                i += 1;
            }
            let rest = &text[i..];
            let ty = if let Some(&(letters, t)) = LETTERS.iter().find(|(l, _)| rest.starts_with(l)) {
                i += letters.len();
                if array {
                    ValueType::Array(t)
                } else {
                    ValueType::Scalar(t)
                }
            } else if rest.starts_with('b') && !array {
                i += 1;
                ValueType::Bytes
            } else {
                let word_len = text[start + 1..]
                    .find(|c: char| !c.is_ascii_alphanumeric())
                    .unwrap_or(text.len() - start - 1);
                let word = &text[start..start + 1 + word_len];
                let reason = if array && rest.starts_with('b') {
                    format!("{word} is not allowed: %b cannot be an array element (use %auc for an array of bytes)")
                } else if array && word.len() == 2 {
                    format!("array {word} without an element type; expected %a followed by c uc hd uhd d ud ld uld f lf or s")
                } else if word == "%" {
                    format!("% without a specifier; {EXPECTED}")
                } else {
                    format!("unknown specifier {word}; {EXPECTED}")
                };
                return Err(syntax(start, reason));
            };
            if let Some(c) = text[i..].chars().next() {
                if c != '%' && !c.is_whitespace() {
                    return Err(syntax(
                        i,
                        format!("unexpected {c:?} after {ty}; separate specifiers with spaces"),
                    ));
                }
            }
            types.push(ty);
        }
        Ok(Format { types })
    }

    /// The format that describes `values`.
    pub fn of(values: &[Value]) -> Format {
        Format { types: values.iter().map(Value::value_type).collect() }
    }

    /// Number of values the format names.
    pub fn len(&self) -> usize {
        self.types.len()
    }

    /// True for the empty format, which names no value.
    pub fn is_empty(&self) -> bool {
        self.types.is_empty()
    }

    /// Checks that `values` match this format, naming the first value that does not.
    ///
    /// # Errors
    /// [`FormatError::Count`] or [`FormatError::Mismatch`].
    pub fn check(&self, values: &[Value]) -> Result<(), FormatError> {
        if values.len() != self.types.len() {
            return Err(FormatError::Count {
                format: self.to_string(),
                expected: self.types.len(),
                found: values.len(),
            });
        }
        for (index, (ty, value)) in self.types.iter().zip(values).enumerate() {
            let found = value.value_type();
            if found != *ty {
                return Err(FormatError::Mismatch {
                    format: self.to_string(),
                    index,
                    expected: ty.to_string(),
                    found: found.to_string(),
                });
            }
        }
        Ok(())
    }
}

impl fmt::Display for Format {
    /// Writes the canonical form: canonical specifiers separated by single spaces.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, ty) in self.types.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(ty.spec())?;
        }
        Ok(())
    }
}

impl FromStr for Format {
    type Err = FormatError;

    /// Same as [`Format::parse`].
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Format::parse(s)
    }
}

impl From<Vec<ValueType>> for Format {
    fn from(types: Vec<ValueType>) -> Self {
        Format { types }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use ScalarType as S;

    fn column(text: &str) -> (usize, String) {
        match Format::parse(text).unwrap_err() {
            FormatError::Syntax { column, reason, format } => {
                assert_eq!(format, text);
                (column, reason)
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn parses_every_specifier() {
        let f = Format::parse("%c %uc %hd %uhd %d %ud %ld %uld %f %lf %s").unwrap();
        assert_eq!(f.types, S::ALL.map(ValueType::Scalar).to_vec());
        let f = Format::parse("%ac %auc %ahd %auhd %ad %aud %ald %auld %af %alf %as %b").unwrap();
        let mut want = S::ALL.map(ValueType::Array).to_vec();
        want.push(ValueType::Bytes);
        assert_eq!(f.types, want);
        assert_eq!(f.len(), 12);
    }

    #[test]
    fn spacing_and_synonyms() {
        let f = Format::parse("  %d%Alf\t\n %as%b ").unwrap();
        assert_eq!(f.to_string(), "%d %alf %as %b");
        assert_eq!(Format::parse("%Ad").unwrap(), Format::parse("%ad").unwrap());
        assert!(Format::parse("").unwrap().is_empty());
        assert!(Format::parse(" \t ").unwrap().is_empty());
        assert_eq!(Format::default().to_string(), "");
    }

    #[test]
    fn syntax_errors_name_the_column() {
        let (col, reason) = column("%d %x");
        assert_eq!(col, 4);
        assert!(reason.starts_with("unknown specifier %x; expected one of %c %uc"), "{reason}");
        assert_eq!(column("%d %ux").1.split(';').next().unwrap(), "unknown specifier %ux");
        let (col, reason) = column("%dx");
        assert_eq!(col, 3);
        assert!(reason.contains("unexpected 'x' after %d"), "{reason}");
        let (col, reason) = column("%d d");
        assert_eq!(col, 4);
        assert!(reason.contains("found 'd'"), "{reason}");
        assert_eq!(column("%d %").0, 4);
        assert!(column("%d %").1.starts_with("% without a specifier"));
        assert_eq!(column("%a").0, 1);
        assert!(column("%d %A").1.starts_with("array %A without an element type"));
        assert!(column("%ab").1.contains("%b cannot be an array element"));
        // Columns count characters, not bytes.
        assert_eq!(column("%s é %d").0, 4);
        let err = Format::parse("%d %q").unwrap_err().to_string();
        assert!(err.starts_with("bad format string \"%d %q\" at column 4: unknown specifier %q"), "{err}");
    }

    #[test]
    fn mismatch_names_index_and_both_specs() {
        let f = Format::parse("%d %d").unwrap();
        let err = f.check(&[Value::Int(1), Value::Str("x".into())]).unwrap_err();
        assert_eq!(
            err,
            FormatError::Mismatch {
                format: "%d %d".into(),
                index: 1,
                expected: "%d".into(),
                found: "%s".into()
            }
        );
        assert_eq!(
            err.to_string(),
            "value 1 does not match format \"%d %d\": the format says %d, the value is %s"
        );
        let err = Format::parse("%Alf").unwrap().check(&[Value::IntArray(vec![])]).unwrap_err();
        assert!(err.to_string().ends_with("the format says %alf, the value is %ad"), "{err}");
    }

    #[test]
    fn count_is_checked() {
        let f = Format::parse("%d %s").unwrap();
        let err = f.check(&[Value::Int(1)]).unwrap_err();
        assert_eq!(err, FormatError::Count { format: "%d %s".into(), expected: 2, found: 1 });
        assert_eq!(err.to_string(), "format \"%d %s\" names 2 values but 1 were given");
        assert!(f.check(&[Value::Int(1), "a".into()]).is_ok());
        assert!(Format::default().check(&[]).is_ok());
    }
}
