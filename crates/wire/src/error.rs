//! Typed errors of the wire layer.

use thiserror::Error;

/// Why a sequence of bytes could not be decoded.
///
/// Every variant says what was being read, so that a link that drops a peer
/// can log a reason a person can act on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The input ended before `what` was complete.
    #[error("truncated {what}: needed {needed} more bytes, {available} available")]
    Truncated {
        /// The item being read.
        what: &'static str,
        /// Bytes still needed.
        needed: usize,
        /// Bytes that were left.
        available: usize,
    },
    /// The frame header names a protocol version this build does not speak.
    #[error("unsupported protocol version {found} (this build speaks {expected}); run the same treecast version everywhere")]
    BadVersion {
        /// Version found in the header.
        found: u8,
        /// Version this build speaks.
        expected: u8,
    },
    /// The frame kind byte is not a known kind.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// A length field is larger than allowed.
    #[error("{what} length {len} exceeds the limit of {max}")]
    TooLong {
        /// The item whose length is too large.
        what: &'static str,
        /// The length found.
        len: u64,
        /// The largest length accepted.
        max: u64,
    },
    /// A typed value starts with a type code that is not defined.
    #[error("unknown value type code {code:#04x} at byte {offset}")]
    UnknownTypeCode {
        /// The code found.
        code: u8,
        /// Offset of the code in the payload.
        offset: usize,
    },
    /// A string is not valid UTF-8.
    #[error("invalid UTF-8 in {what} at byte {offset}")]
    InvalidUtf8 {
        /// The item being read.
        what: &'static str,
        /// Offset of the string in the input.
        offset: usize,
    },
    /// Bytes remain after a complete item; the codec accepts no padding.
    #[error("{count} trailing bytes after {what}")]
    TrailingBytes {
        /// The item that was complete.
        what: &'static str,
        /// How many bytes were left over.
        count: usize,
    },
    /// A control message tag is not defined.
    #[error("unknown control message tag {0}")]
    UnknownControl(u8),
    /// A field holds a value outside its domain.
    #[error("invalid {what}: {detail}")]
    Invalid {
        /// The field.
        what: &'static str,
        /// What was wrong with it.
        detail: String,
    },
}

/// Why values could not be encoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum EncodeError {
    /// A length is over what a frame can carry; split the data into smaller values.
    #[error("{what} of {len} bytes is over the limit of {max}: split it into smaller values")]
    TooLong {
        /// The item whose length is too large.
        what: &'static str,
        /// Its length.
        len: usize,
        /// The largest length accepted.
        max: usize,
    },
}

/// Why a format string is malformed or does not match the values given with it.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[non_exhaustive]
pub enum FormatError {
    /// The format string itself cannot be parsed.
    #[error("bad format string {format:?} at column {column}: {reason}")]
    Syntax {
        /// The whole format string.
        format: String,
        /// 1-based column of the offending character.
        column: usize,
        /// What is wrong there.
        reason: String,
    },
    /// A value's type differs from the one the format names at its position.
    #[error(
        "value {index} does not match format {format:?}: the format says {expected}, the value is {found}"
    )]
    Mismatch {
        /// The whole format string.
        format: String,
        /// 0-based index of the value.
        index: usize,
        /// The specifier at that position, e.g. `%d`.
        expected: String,
        /// The specifier of the value given, e.g. `%s`.
        found: String,
    },
    /// The format names a different number of values than were given.
    #[error("format {format:?} names {expected} values but {found} were given")]
    Count {
        /// The whole format string.
        format: String,
        /// Number of specifiers in the format.
        expected: usize,
        /// Number of values given.
        found: usize,
    },
}
