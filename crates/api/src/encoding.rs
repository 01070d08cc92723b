//! What a thread keeps between sends: the readings of its last format strings and
//! the buffer a payload is encoded in. A loop of sends then parses its format once,
//! with no reference count to move (atomic operations were the dearest part of a
//! bursting back-end's send), and allocates its payload once, at its exact size.

use std::cell::RefCell;

use bytes::Bytes;
use treecast_wire::{encode_values, Format, FormatError, Value};

use crate::ApiError;

/// Format strings a thread keeps the reading of: a tool that answers in one format
/// and reads requests in another finds both every time.
const KNOWN_FORMATS: usize = 4;
/// Payloads up to this size are copied out of the buffer they were encoded in
/// ([`payload_from`]); larger ones become frames as they are.
const COPY_PAYLOAD_MAX: usize = 1 << 10;

/// A thread's recent format strings and their readings, the newest last.
#[derive(Default)]
struct KnownFormats {
    entries: Vec<(Box<str>, Format)>,
}

impl KnownFormats {
    fn reading(&mut self, text: &str) -> Result<&Format, FormatError> {
        match self.entries.iter().rposition(|(known, _)| **known == *text) {
            // The most recently used last: the first to go is the least used.
            Some(at) => self.entries[at..].rotate_left(1),
            None => {
                let fmt = Format::parse(text)?;
                if self.entries.len() == KNOWN_FORMATS {
                    self.entries.remove(0);
                }
                self.entries.push((text.into(), fmt));
            }
        }
        let newest = self.entries.len() - 1;
        Ok(&self.entries[newest].1)
    }
}

/// A thread's buffers for encoding.
#[derive(Default)]
struct Encoding {
    formats: KnownFormats,
    /// Where a payload is encoded, kept between sends.
    scratch: Vec<u8>,
}

thread_local! {
    static ENCODING: RefCell<Encoding> = RefCell::new(Encoding::default());
}

/// Calls `then` with the reading of the format string `text`, parsed once per
/// thread while it is among the last few used.
///
/// # Errors
/// What [`Format::parse`] finds wrong with `text`.
pub(crate) fn with_format<R>(text: &str, then: impl FnOnce(&Format) -> R) -> Result<R, FormatError> {
    with_encoding(|e| e.formats.reading(text).map(then))
}

/// The encoding ([`encode_values`]) of `values`, checked against the format
/// `format`: what every send of values does before it queues a frame.
///
/// # Errors
/// A malformed format, or the first value that does not match it.
pub(crate) fn encode_checked(format: &str, values: &[Value]) -> Result<Bytes, ApiError> {
    encode_checked_then(format, values, |_, payload| Ok(payload))
}

/// [`encode_checked`], then `then` with the format's reading and the payload.
///
/// # Errors
/// As [`encode_checked`], and what `then` returns.
pub(crate) fn encode_checked_then<R>(
    format: &str,
    values: &[Value],
    then: impl FnOnce(&Format, Bytes) -> Result<R, ApiError>,
) -> Result<R, ApiError> {
    with_encoding(|e| {
        let fmt = e.formats.reading(format)?;
        fmt.check(values)?;
        e.scratch.clear();
        encode_values(values, &mut e.scratch);
        let payload = payload_from(&mut e.scratch);
        then(fmt, payload)
    })
}

/// Calls `work` with the thread's buffers, or with fresh ones where those cannot be
/// had: while the thread's locals are destroyed, or inside a call made from `work`
/// (a hook the driver calls while a send holds them).
fn with_encoding<R>(work: impl FnOnce(&mut Encoding) -> R) -> R {
    let mut work = Some(work);
    let done = ENCODING.try_with(|e| match e.try_borrow_mut() {
        Ok(mut held) => work.take().map(|w| w(&mut held)),
        Err(_) => None,
    });
    match (done, work) {
        (Ok(Some(r)), _) => r,
        (_, Some(w)) => w(&mut Encoding::default()),
        (_, None) => unreachable!("try_with takes the work only when it runs it"),
    }
}

/// The frame payload of what was encoded in `scratch`, a buffer kept for the next
/// encoding: a large payload is taken as it is (no copy, and the thread keeps no
/// buffer of its size; `scratch` starts again empty), a small one is copied at its
/// exact size, one allocation that its last holder frees with no atomic operation
/// (a vector with room to spare becomes two allocations, shared, and a buffer that
/// small payloads are cut from counts each one atomically). For bindings that
/// encode into buffers of their own.
pub fn payload_from(scratch: &mut Vec<u8>) -> Bytes {
    match scratch.len() > COPY_PAYLOAD_MAX {
        true => Bytes::from(std::mem::take(scratch)),
        false => Bytes::copy_from_slice(scratch),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn known() -> Vec<String> {
        ENCODING.with(|e| e.borrow().formats.entries.iter().map(|(t, _)| t.to_string()).collect())
    }

    #[test]
    fn a_format_is_read_once_while_it_is_among_the_last_few_used_and_the_least_used_goes() {
        let types = with_format("%d %s", |f| f.types.len()).unwrap();
        assert_eq!(types, 2);
        for other in ["%ud", "%lf", "%as", "%d %s"] {
            with_format(other, |_| ()).unwrap();
        }
        assert_eq!(known(), ["%ud", "%lf", "%as", "%d %s"], "a known format is not read again");
        with_format("%c", |_| ()).unwrap();
        assert_eq!(known(), ["%lf", "%as", "%d %s", "%c"], "the least recently used goes");
    }

    #[test]
    fn a_malformed_format_is_refused_every_time_and_never_kept() {
        for _ in 0..2 {
            assert!(with_format("%q", |_| ()).is_err());
        }
        assert!(!known().iter().any(|t| t == "%q"));
    }

    #[test]
    fn a_send_made_while_the_buffers_are_held_reads_its_format_afresh() {
        let inner = encode_checked_then("%d", &[Value::Int(1)], |_, outer| {
            let inner = encode_checked("%ud", &[Value::UInt(2)])?;
            Ok((outer, inner))
        })
        .unwrap();
        let mut own = Vec::new();
        encode_values(&[Value::Int(1)], &mut own);
        assert_eq!(&inner.0[..], &own[..]);
        own.clear();
        encode_values(&[Value::UInt(2)], &mut own);
        assert_eq!(&inner.1[..], &own[..]);
    }

    #[test]
    fn payloads_keep_their_bytes_while_later_ones_are_encoded() {
        let a = encode_checked("%d", &[Value::Int(7)]).unwrap();
        let b = encode_checked("%s", &[Value::Str("x".repeat(5000))]).unwrap();
        let mut own = Vec::new();
        encode_values(&[Value::Int(7)], &mut own);
        assert_eq!(&a[..], &own[..]);
        own.clear();
        encode_values(&[Value::Str("x".repeat(5000))], &mut own);
        assert_eq!(&b[..], &own[..]);
    }

    #[test]
    fn values_that_do_not_match_the_format_are_refused() {
        assert!(encode_checked("%d", &[Value::Str("no".into())]).is_err());
    }

    #[test]
    fn a_small_payload_is_copied_and_a_large_one_taken_with_its_buffer() {
        let mut scratch = vec![1, 2, 3];
        assert_eq!(&payload_from(&mut scratch)[..], &[1, 2, 3]);
        assert_eq!(scratch, [1, 2, 3], "the buffer stays for the next encoding");
        let mut scratch = vec![7; COPY_PAYLOAD_MAX + 1];
        assert_eq!(payload_from(&mut scratch).len(), COPY_PAYLOAD_MAX + 1);
        assert_eq!(scratch.capacity(), 0, "the thread keeps no large buffer");
    }
}
