//! Datagrams of the reliable multicast route over UDP: one comm node sends a
//! message's fragments to all its children at once; they answer with
//! acknowledgements (ACK) and negative ones (NACK) by unicast.
//!
//! A datagram is a fixed 24-byte little-endian header, the payload and a 16-byte
//! authentication tag over both. A data datagram's payload is a fragment of the
//! message; an answer's is a [`McastAnswer`]: how far past any gap the receiver got
//! and, in a NACK, which fragments to resend. The tag is computed and checked by the
//! transport layer (it holds the key); this module only places it.

use crate::{DecodeError, Reader};

/// Version byte of every multicast datagram (2: answers carry a [`McastAnswer`]).
pub const MCAST_VERSION: u8 = 2;
/// Fragments one NACK asks for at most.
pub const MCAST_MAX_HOLES: usize = 64;
/// Bytes of the header.
pub const MCAST_HEADER_LEN: usize = 24;
/// Bytes of the authentication tag that ends every datagram.
pub const MCAST_TAG_LEN: usize = 16;
/// Flag: more fragments of this message follow this one.
pub const MCAST_MORE: u8 = 1;

/// What a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum McastKind {
    /// A fragment of a message, sender to the group.
    Data,
    /// A receiver has every byte of the message before `offset`.
    Ack,
    /// A receiver has every byte before `offset` and misses the fragments its
    /// answer lists, starting there.
    Nack,
}

impl McastKind {
    fn code(self) -> u8 {
        match self {
            McastKind::Data => 0,
            McastKind::Ack => 1,
            McastKind::Nack => 2,
        }
    }

    fn from_code(code: u8) -> Result<McastKind, DecodeError> {
        match code {
            0 => Ok(McastKind::Data),
            1 => Ok(McastKind::Ack),
            2 => Ok(McastKind::Nack),
            other => Err(DecodeError::Invalid {
                what: "multicast datagram type",
                detail: format!("{other} is not data (0), ack (1) or nack (2)"),
            }),
        }
    }
}

/// The header of a multicast datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct McastHeader {
    /// Data, ACK or NACK.
    pub kind: McastKind,
    /// `MCAST_MORE` on every fragment but a message's last; 0 on ACK and NACK.
    pub flags: u8,
    /// Data: the receiver that must acknowledge every fragment (the acker).
    /// ACK and NACK: the receiver that sends it.
    pub rank: u32,
    /// The sending group: the node id of the node that multicasts to its children.
    pub group: u32,
    /// The stream the message belongs to (0 for a route's own traffic).
    pub stream: u32,
    /// The message, numbered by the group's sender from 0.
    pub message: u32,
    /// Data: the fragment's byte offset in the message. ACK and NACK: bytes held
    /// from the start (a NACK's first missing byte).
    pub offset: u32,
}

impl McastHeader {
    /// A fragment of `message` at `offset`, with `acker` named.
    pub fn data(group: u32, stream: u32, message: u32, offset: u32, more: bool, acker: u32) -> McastHeader {
        let flags = if more { MCAST_MORE } else { 0 };
        McastHeader { kind: McastKind::Data, flags, rank: acker, group, stream, message, offset }
    }

    /// An answer of `receiver` about `message`: an ACK or a NACK at `offset`.
    pub fn answer(
        kind: McastKind,
        group: u32,
        receiver: u32,
        stream: u32,
        message: u32,
        offset: u32,
    ) -> McastHeader {
        McastHeader { kind, flags: 0, rank: receiver, group, stream, message, offset }
    }

    /// More fragments of the message follow.
    pub fn more(&self) -> bool {
        self.flags & MCAST_MORE != 0
    }

    fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&[MCAST_VERSION, self.kind.code(), self.flags, 0]);
        for v in [self.rank, self.group, self.stream, self.message, self.offset] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
}

/// Writes a datagram: header and payload, then [`MCAST_TAG_LEN`] zero bytes for the
/// tag, which the caller computes over everything before it and writes in place.
pub fn encode_mcast(header: &McastHeader, payload: &[u8], out: &mut Vec<u8>) {
    out.clear();
    out.reserve(MCAST_HEADER_LEN + payload.len() + MCAST_TAG_LEN);
    header.encode(out);
    out.extend_from_slice(payload);
    out.extend_from_slice(&[0; MCAST_TAG_LEN]);
}

/// The payload of an ACK or NACK: what a sender needs to keep its window open past
/// a receiver's gaps and to resend only what is missing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct McastAnswer {
    /// End of the furthest fragment the receiver holds past any gap (or of the
    /// message's last fragment, once that came): at least the header's offset.
    pub furthest: u32,
    /// NACK: byte offsets of the fragments to resend, ascending, none below the
    /// header's offset, 1 to [`MCAST_MAX_HOLES`] of them. ACK: none.
    pub holes: Vec<u32>,
}

impl McastAnswer {
    /// Appends the payload's bytes: `furthest`, then each hole, 4 bytes each.
    pub fn encode(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.furthest.to_le_bytes());
        for hole in &self.holes {
            out.extend_from_slice(&hole.to_le_bytes());
        }
    }

    /// Reads the payload of the answer `header`.
    ///
    /// # Errors
    /// A payload not a whole number of 4-byte values, a `furthest` below the
    /// header's offset, an ACK with holes, a NACK with none or more than
    /// [`MCAST_MAX_HOLES`], or holes out of order or below the offset.
    pub fn decode(header: &McastHeader, payload: &[u8]) -> Result<McastAnswer, DecodeError> {
        let mut holes = Vec::new();
        let furthest = read_answer(header, payload, |hole| holes.push(hole))?;
        Ok(McastAnswer { furthest, holes })
    }
}

/// Checks an answer's payload and hands each hole to `each`, in order; returns its
/// furthest byte. [`decode_mcast`] checks with it and keeps nothing, so a datagram
/// is not collected twice on its way to [`McastAnswer::decode`].
fn read_answer(header: &McastHeader, payload: &[u8], mut each: impl FnMut(u32)) -> Result<u32, DecodeError> {
    let invalid = |detail: String| DecodeError::Invalid { what: "multicast answer", detail };
    if payload.len() < 4 || payload.len() % 4 != 0 {
        return Err(invalid(format!(
            "{} bytes of payload: an answer carries 4 bytes of progress and 4 per hole",
            payload.len()
        )));
    }
    let mut r = Reader::new(payload);
    let furthest = r.u32("multicast answer's furthest byte")?;
    let count = payload.len() / 4 - 1;
    let allowed = match header.kind {
        McastKind::Nack => 1..=MCAST_MAX_HOLES,
        _ => 0..=0,
    };
    if !allowed.contains(&count) {
        return Err(invalid(format!(
            "{count} holes in a {:?}: an ACK lists none, a NACK 1 to {MCAST_MAX_HOLES}",
            header.kind
        )));
    }
    if furthest < header.offset {
        return Err(invalid(format!("furthest byte {furthest} is below the bytes held, {}", header.offset)));
    }
    let mut floor = Some(header.offset);
    for _ in 0..count {
        let hole = r.u32("multicast answer's hole")?;
        if floor.map_or(true, |f| hole < f) {
            return Err(invalid(format!(
                "hole {hole} out of order (holes ascend from the bytes held, {})",
                header.offset
            )));
        }
        each(hole);
        floor = hole.checked_add(1);
    }
    Ok(furthest)
}

/// A datagram cut into its parts; nothing is checked against the tag yet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct McastDatagram<'a> {
    /// The header.
    pub header: McastHeader,
    /// The fragment's bytes, or an answer's [`McastAnswer`] (already checked).
    pub payload: &'a [u8],
    /// What the tag covers: header and payload.
    pub signed: &'a [u8],
    /// The tag.
    pub tag: &'a [u8; MCAST_TAG_LEN],
}

/// Reads a datagram.
///
/// # Errors
/// A datagram shorter than header and tag, another version, an unknown type or
/// flag, a non-zero reserved byte, or an ACK or NACK with the "more" flag or a
/// payload that is not a valid [`McastAnswer`].
pub fn decode_mcast(datagram: &[u8]) -> Result<McastDatagram<'_>, DecodeError> {
    if datagram.len() < MCAST_HEADER_LEN + MCAST_TAG_LEN {
        return Err(DecodeError::Truncated {
            what: "multicast datagram",
            needed: MCAST_HEADER_LEN + MCAST_TAG_LEN - datagram.len(),
            available: datagram.len(),
        });
    }
    let (signed, tag) = datagram.split_at(datagram.len() - MCAST_TAG_LEN);
    let tag: &[u8; MCAST_TAG_LEN] = tag
        .try_into()
        .map_err(|_| DecodeError::Invalid { what: "multicast tag", detail: "not 16 bytes".into() })?;
    let mut r = Reader::new(signed);
    let version = r.u8("multicast version")?;
    if version != MCAST_VERSION {
        return Err(DecodeError::BadVersion { found: version, expected: MCAST_VERSION });
    }
    let kind = McastKind::from_code(r.u8("multicast type")?)?;
    let flags = r.u8("multicast flags")?;
    let reserved = r.u8("multicast reserved byte")?;
    if flags & !MCAST_MORE != 0 || reserved != 0 {
        return Err(DecodeError::Invalid {
            what: "multicast flags",
            detail: format!(
                "flags {flags:#04x} and reserved byte {reserved} (only flag 1, \"more\", is defined)"
            ),
        });
    }
    let header = McastHeader {
        kind,
        flags,
        rank: r.u32("multicast rank")?,
        group: r.u32("multicast group")?,
        stream: r.u32("multicast stream")?,
        message: r.u32("multicast message id")?,
        offset: r.u32("multicast offset")?,
    };
    let payload = &signed[MCAST_HEADER_LEN..];
    if kind != McastKind::Data {
        if header.more() {
            return Err(DecodeError::Invalid {
                what: "multicast answer",
                detail: format!("an ACK or NACK carries no flag (flags {flags})"),
            });
        }
        read_answer(&header, payload, |_| {})?;
    }
    Ok(McastDatagram { header, payload, signed, tag })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_datagram_reads_back_as_written_and_the_tag_covers_header_and_payload() {
        let h = McastHeader::data(3, 7, 42, 1432, true, 9);
        let mut out = Vec::new();
        encode_mcast(&h, b"abc", &mut out);
        assert_eq!(out.len(), MCAST_HEADER_LEN + 3 + MCAST_TAG_LEN);
        let n = out.len();
        out[n - MCAST_TAG_LEN..].copy_from_slice(&[0xAB; MCAST_TAG_LEN]);
        let d = decode_mcast(&out).unwrap();
        assert_eq!(d.header, h);
        assert!(d.header.more());
        assert_eq!(d.payload, b"abc");
        assert_eq!(d.signed, &out[..n - MCAST_TAG_LEN]);
        assert_eq!(d.tag, &[0xAB; MCAST_TAG_LEN]);
    }

    fn answer_bytes(header: &McastHeader, answer: &McastAnswer) -> Vec<u8> {
        let mut payload = Vec::new();
        answer.encode(&mut payload);
        let mut out = Vec::new();
        encode_mcast(header, &payload, &mut out);
        out
    }

    #[test]
    fn the_byte_layout_is_pinned() {
        let h = McastHeader::answer(McastKind::Nack, 0x0102_0304, 5, 6, 7, 8);
        let out = answer_bytes(&h, &McastAnswer { furthest: 20, holes: vec![8, 16] });
        let hex: String = out[..out.len() - MCAST_TAG_LEN].iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(
            hex,
            "020200000500000004030201060000000700000008000000\
             140000000800000010000000"
        );
    }

    #[test]
    fn an_answer_reads_back_as_written() {
        let h = McastHeader::answer(McastKind::Nack, 1, 2, 0, 4, 100);
        let answer = McastAnswer { furthest: 900, holes: vec![100, 300, 301] };
        let out = answer_bytes(&h, &answer);
        let d = decode_mcast(&out).unwrap();
        assert_eq!(McastAnswer::decode(&d.header, d.payload).unwrap(), answer);
        let ack = McastHeader::answer(McastKind::Ack, 1, 2, 0, 4, 100);
        let d = answer_bytes(&ack, &McastAnswer { furthest: 100, holes: vec![] });
        assert!(decode_mcast(&d).is_ok());
    }

    #[test]
    fn bad_datagrams_say_what_is_wrong() {
        let ok = answer_bytes(&McastHeader::answer(McastKind::Ack, 1, 2, 3, 4, 5), &McastAnswer::default());
        let err = |bytes: &[u8]| decode_mcast(bytes).unwrap_err().to_string();
        assert!(err(&ok[..39]).starts_with("truncated multicast datagram"), "{}", err(&ok[..39]));
        let mut v = ok.clone();
        v[0] = 1;
        assert!(err(&v).contains("unsupported protocol version 1"));
        let mut t = ok.clone();
        t[1] = 3;
        assert!(err(&t).contains("3 is not data (0), ack (1) or nack (2)"));
        let mut f = ok.clone();
        f[2] = 2;
        assert!(err(&f).contains("only flag 1"));
        let mut p = ok.clone();
        p.insert(MCAST_HEADER_LEN, 0);
        assert!(err(&p).contains("4 bytes of progress and 4 per hole"), "{}", err(&p));
    }

    #[test]
    fn answers_that_no_receiver_makes_are_refused() {
        let nack = McastHeader::answer(McastKind::Nack, 1, 2, 0, 4, 100);
        let ack = McastHeader::answer(McastKind::Ack, 1, 2, 0, 4, 100);
        let err = |h: &McastHeader, furthest, holes: &[u32]| {
            let d = answer_bytes(h, &McastAnswer { furthest, holes: holes.to_vec() });
            decode_mcast(&d).unwrap_err().to_string()
        };
        assert!(err(&ack, 100, &[100]).contains("1 holes in a Ack"), "{}", err(&ack, 100, &[100]));
        assert!(err(&nack, 200, &[]).contains("0 holes in a Nack"));
        let many: Vec<u32> = (100..100 + MCAST_MAX_HOLES as u32 + 1).collect();
        assert!(err(&nack, 500, &many).contains("65 holes"));
        assert!(err(&nack, 99, &[100]).contains("furthest byte 99 is below the bytes held, 100"));
        assert!(err(&nack, 500, &[99]).contains("hole 99 out of order"));
        assert!(err(&nack, 500, &[200, 200]).contains("hole 200 out of order"));
        assert!(err(&nack, 500, &[200, 150]).contains("hole 150 out of order"));
    }
}
