//! Little-endian primitives shared by every decoder of this crate.

use crate::DecodeError;

/// A cursor over a byte slice whose reads fail with a typed error instead of panicking.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

macro_rules! read_le {
    ($name:ident, $t:ty) => {
        #[doc = concat!("Reads a little-endian `", stringify!($t), "`; `what` names it in errors.")]
        pub fn $name(&mut self, what: &'static str) -> Result<$t, DecodeError> {
            let bytes = self.take(std::mem::size_of::<$t>(), what)?;
            let mut arr = [0u8; std::mem::size_of::<$t>()];
            arr.copy_from_slice(bytes);
            Ok(<$t>::from_le_bytes(arr))
        }
    };
}

impl<'a> Reader<'a> {
    /// Starts reading at the beginning of `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Reader { buf, pos: 0 }
    }

    /// Offset of the next byte to read.
    pub fn offset(&self) -> usize {
        self.pos
    }

    /// Bytes not yet read.
    pub fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    /// Takes the next `n` bytes.
    ///
    /// # Errors
    /// [`DecodeError::Truncated`] when fewer than `n` bytes remain.
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], DecodeError> {
        if self.remaining() < n {
            return Err(DecodeError::Truncated {
                what,
                needed: n - self.remaining(),
                available: self.remaining(),
            });
        }
        let out = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(out)
    }

    read_le!(u8, u8);
    read_le!(i8, i8);
    read_le!(u16, u16);
    read_le!(i16, i16);
    read_le!(u32, u32);
    read_le!(i32, i32);
    read_le!(u64, u64);
    read_le!(i64, i64);
    read_le!(f32, f32);
    read_le!(f64, f64);

    /// Reads a `u32` length that must not exceed `max`, checked before any allocation.
    ///
    /// # Errors
    /// [`DecodeError::TooLong`] or [`DecodeError::Truncated`].
    pub fn len_u32(&mut self, what: &'static str, max: usize) -> Result<usize, DecodeError> {
        let len = self.u32(what)? as usize;
        if len > max {
            return Err(DecodeError::TooLong { what, len: len as u64, max: max as u64 });
        }
        Ok(len)
    }

    /// Reads a string: `u32` byte length then UTF-8 bytes.
    ///
    /// # Errors
    /// Truncation, a length over the remaining input, or invalid UTF-8.
    pub fn string(&mut self, what: &'static str) -> Result<String, DecodeError> {
        let len = self.len_u32(what, self.remaining())?;
        let offset = self.pos;
        let bytes = self.take(len, what)?;
        std::str::from_utf8(bytes).map(str::to_owned).map_err(|_| DecodeError::InvalidUtf8 { what, offset })
    }

    /// Fails unless every byte was consumed.
    ///
    /// # Errors
    /// [`DecodeError::TrailingBytes`].
    pub fn finish(&self, what: &'static str) -> Result<(), DecodeError> {
        match self.remaining() {
            0 => Ok(()),
            count => Err(DecodeError::TrailingBytes { what, count }),
        }
    }
}

/// Appends a string as `u32` length + UTF-8 bytes.
pub(crate) fn put_string(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u32).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

/// Appends a list of strings as `u32` count + each string.
pub(crate) fn put_strings(out: &mut Vec<u8>, items: &[String]) {
    out.extend_from_slice(&(items.len() as u32).to_le_bytes());
    for s in items {
        put_string(out, s);
    }
}

/// Reads a list written by [`put_strings`], its count checked against what is left.
pub(crate) fn strings(r: &mut Reader<'_>, what: &'static str) -> Result<Vec<String>, DecodeError> {
    let n = r.len_u32(what, r.remaining() / 4)?;
    (0..n).map(|_| r.string(what)).collect()
}
