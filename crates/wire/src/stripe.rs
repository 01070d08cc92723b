//! Pieces of a striped link: one logical link carried over several connections to
//! the same peer (`treecast_transport`'s striped route). The link's byte stream (its
//! encoded frames, in order) is cut into pieces numbered from 0; each piece travels
//! on one of the connections behind a fixed 16-byte header, and the receiver puts
//! them back in order by number. Acknowledgements travel the same way, so that a
//! sender knows which pieces to send again when a connection fails.
//!
//! Layout (little-endian), 16 bytes, then `len` bytes of data for a data piece:
//!
//! ```text
//! tag:u8 (1 data, 2 ack)  reserved:[u8; 3] = 0  seq:u64  len:u32
//! ```
//!
//! For a data piece `seq` is the piece's number and `len` its data bytes (1 to
//! [`MAX_PIECE`]); for an acknowledgement `seq` is the number of the first piece not
//! yet received in order (every piece before it is held) and `len` is 0. Every field
//! has one encoding: reserved bytes that are not 0 are refused.

use crate::{DecodeError, Reader};

/// Bytes of a piece header.
pub const PIECE_HEADER_LEN: usize = 16;
/// Most data bytes one piece carries.
pub const MAX_PIECE: u32 = 4 << 20;

const DATA: u8 = 1;
const ACK: u8 = 2;

/// The header of a piece; see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PieceHeader {
    /// `len` bytes of the link's stream follow: piece number `seq`.
    Data {
        /// The piece's number on its link, from 0.
        seq: u64,
        /// Data bytes that follow the header.
        len: u32,
    },
    /// Every piece before `next` has arrived.
    Ack {
        /// The first piece number not yet received in order.
        next: u64,
    },
}

impl PieceHeader {
    /// The header's 16 bytes.
    pub fn encode(&self) -> [u8; PIECE_HEADER_LEN] {
        let (tag, seq, len) = match *self {
            PieceHeader::Data { seq, len } => (DATA, seq, len),
            PieceHeader::Ack { next } => (ACK, next, 0),
        };
        let mut out = [0u8; PIECE_HEADER_LEN];
        out[0] = tag;
        out[4..12].copy_from_slice(&seq.to_le_bytes());
        out[12..16].copy_from_slice(&len.to_le_bytes());
        out
    }

    /// Reads a header; every byte of `buf` must belong to it.
    ///
    /// # Errors
    /// Truncation, trailing bytes, an unknown tag, reserved bytes that are not 0, a
    /// data piece of 0 bytes or over [`MAX_PIECE`], an acknowledgement with data.
    pub fn decode(buf: &[u8]) -> Result<PieceHeader, DecodeError> {
        let mut r = Reader::new(buf);
        let tag = r.u8("piece tag")?;
        let reserved = r.take(3, "piece header")?;
        if reserved != [0, 0, 0] {
            return Err(DecodeError::Invalid {
                what: "piece header",
                detail: format!(
                    "reserved bytes {reserved:?} are not 0 (a newer peer, or not a striped link)"
                ),
            });
        }
        let seq = r.u64("piece number")?;
        let len = r.u32("piece length")?;
        r.finish("piece header")?;
        match tag {
            DATA if len == 0 => {
                Err(DecodeError::Invalid { what: "data piece", detail: "a piece of 0 bytes".into() })
            }
            DATA if len > MAX_PIECE => Err(DecodeError::TooLong {
                what: "data piece",
                len: u64::from(len),
                max: u64::from(MAX_PIECE),
            }),
            DATA => Ok(PieceHeader::Data { seq, len }),
            ACK if len != 0 => Err(DecodeError::Invalid {
                what: "piece acknowledgement",
                detail: format!("an acknowledgement carries no data, not {len} bytes"),
            }),
            ACK => Ok(PieceHeader::Ack { next: seq }),
            other => Err(DecodeError::Invalid {
                what: "piece tag",
                detail: format!("{other} is not a piece (1 data, 2 acknowledgement)"),
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header() -> impl Strategy<Value = PieceHeader> {
        prop_oneof![
            (any::<u64>(), 1..=MAX_PIECE).prop_map(|(seq, len)| PieceHeader::Data { seq, len }),
            any::<u64>().prop_map(|next| PieceHeader::Ack { next }),
        ]
    }

    proptest! {
        #[test]
        fn headers_round_trip(h in header()) {
            prop_assert_eq!(PieceHeader::decode(&h.encode()).ok(), Some(h));
        }

        #[test]
        fn any_bytes_decode_to_their_own_encoding_or_fail(bytes in proptest::collection::vec(any::<u8>(), 0..24)) {
            if let Ok(h) = PieceHeader::decode(&bytes) {
                let again = h.encode();
                prop_assert_eq!(again.as_slice(), bytes.as_slice());
            }
        }
    }

    #[test]
    fn bad_headers_say_what_is_wrong() {
        let mut b = PieceHeader::Data { seq: 1, len: 5 }.encode();
        b[2] = 1;
        assert!(PieceHeader::decode(&b).unwrap_err().to_string().contains("reserved"));
        let b = PieceHeader::Data { seq: 1, len: 0 }.encode();
        assert!(PieceHeader::decode(&b).unwrap_err().to_string().contains("0 bytes"));
        let mut b = PieceHeader::Ack { next: 3 }.encode();
        b[12] = 1;
        assert!(PieceHeader::decode(&b).unwrap_err().to_string().contains("no data"));
        assert!(PieceHeader::decode(&b[..10]).is_err());
    }
}
