//! Payloads of peer frames ([`crate::FrameKind::Peer`]) beyond a plain message: a
//! message for several ranks (its destination set, then the values) and an
//! acknowledgement (how many messages and bytes were read).

use crate::{codec::Reader, DecodeError, RankSet};

/// Peer frames only: a message for several ranks: the payload is the destination
/// set ([`encode_multi`]), then the values; the stream field is unused.
pub const FLAG_PEER_MULTI: u16 = 32;
/// Length of an acknowledgement's payload.
pub const PEER_ACK_LEN: usize = 12;

/// The payload of a message for `targets`: the set, then `values` (encoded values).
pub fn encode_multi(targets: &RankSet, values: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(values.len() + 16);
    targets.encode(&mut out);
    out.extend_from_slice(values);
    out
}

/// Splits a message for several ranks into its destination set and the offset where
/// its values start.
///
/// # Errors
/// A malformed rank set.
pub fn decode_multi(payload: &[u8]) -> Result<(RankSet, usize), DecodeError> {
    let mut r = Reader::new(payload);
    let targets = RankSet::decode(&mut r)?;
    Ok((targets, payload.len() - r.remaining()))
}

/// The payload of an acknowledgement: `messages` read, `bytes` of values in them.
pub fn encode_ack(messages: u32, bytes: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(PEER_ACK_LEN);
    out.extend_from_slice(&messages.to_le_bytes());
    out.extend_from_slice(&bytes.to_le_bytes());
    out
}

/// Reads an acknowledgement: messages and bytes.
///
/// # Errors
/// A payload of the wrong length.
pub fn decode_ack(payload: &[u8]) -> Result<(u32, u64), DecodeError> {
    let mut r = Reader::new(payload);
    let ack = (r.u32("peer acknowledgement")?, r.u64("peer acknowledgement")?);
    r.finish("peer acknowledgement")?;
    Ok(ack)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn payloads_round_trip_and_bad_ones_are_errors() {
        let mut targets = RankSet::range(4, 3);
        targets.union_with(&RankSet::single(40));
        let payload = encode_multi(&targets, b"values");
        let (back, at) = decode_multi(&payload).unwrap();
        assert_eq!((back, &payload[at..]), (targets, &b"values"[..]));
        assert!(decode_multi(&payload[..2]).is_err());
        assert_eq!(decode_ack(&encode_ack(3, 1 << 40)).unwrap(), (3, 1 << 40));
        assert!(decode_ack(&encode_ack(3, 9)[..11]).is_err());
        assert!(decode_ack(&[0; 13]).is_err());
    }
}
