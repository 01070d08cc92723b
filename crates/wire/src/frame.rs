//! Frames: the unit every link carries, and the batching codec.
//!
//! Layout (little-endian, 28-byte header, then `payload_len` bytes):
//!
//! | offset | size | field |
//! |---|---|---|
//! | 0 | 1 | protocol version ([`PROTOCOL_VERSION`]) |
//! | 1 | 1 | kind ([`FrameKind`]) |
//! | 2 | 2 | flags (`FLAG_*`) |
//! | 4 | 4 | stream id; for a peer frame, the destination rank |
//! | 8 | 4 | tag (signed) |
//! | 12 | 4 | rank: source rank, or destination rank with [`FLAG_DIRECT`] |
//! | 16 | 8 | send timestamp, nanoseconds |
//! | 24 | 4 | payload length |

use bytes::{Buf, Bytes, BytesMut};

use crate::{codec::Reader, DecodeError, Window};

/// Version byte every frame starts with.
pub const PROTOCOL_VERSION: u8 = 11;
/// Size of the fixed frame header in bytes.
pub const HEADER_LEN: usize = 28;
/// Where the send timestamp sits in an encoded header: a route that encodes a frame
/// before it knows the stamp writes it there later.
pub const TIMESTAMP_AT: usize = 16;
/// Largest payload a decoder accepts (256 MiB); larger frames close the link.
pub const MAX_PAYLOAD_LEN: usize = 256 << 20;
/// [`MAX_PAYLOAD_LEN`] as the `u32` the header carries.
pub(crate) const MAX_PAYLOAD_U32: u32 = 256 << 20;

/// The window a child is given on each stream on the way up, unless the stream says
/// otherwise: what a comm node holds at most per child and stream, however far one
/// child runs ahead of its siblings. A larger window buys burst throughput with
/// memory: see docs/benchmarks.md.
pub const DEFAULT_UP_WINDOW: Window = Window { packets: 256, bytes: 1 << 20 };
/// The window a parent is given on each stream on the way down, unless the stream
/// says otherwise: what a node holds at most per stream for children slower than
/// their siblings (file chunks are pipelined this deep).
pub const DEFAULT_DOWN_WINDOW: Window = Window { packets: 256, bytes: 8 << 20 };

/// Downstream only: the frame goes to one back-end, whose rank is in the rank field.
pub const FLAG_DIRECT: u16 = 1;
/// Upstream only: a partial average (sums followed by a `%uld` count).
pub const FLAG_PARTIAL_AVG: u16 = 2;
/// Upstream only: the payload is an equivalence-class table.
pub const FLAG_EQCLASS: u16 = 4;
/// The timestamp was taken by the sender of this hop while it recorded (see
/// `treecast_transport::recording`): the receiver may measure the hop's net latency
/// from it. Every hop sets or clears it.
pub const FLAG_STAMPED: u16 = 8;
/// Peer frames only: an acknowledgement, not a message: the rank in the stream
/// field may have more messages and bytes in the tree, as many as the payload says
/// (see [`crate::encode_ack`] and [`FrameKind::Peer`]).
pub const FLAG_PEER_ACK: u16 = 16;

/// The payload did not follow the header in the byte stream: it came beside it as a
/// sealed memory file (`SCM_RIGHTS` on a Unix link between two processes of one
/// host), holding the payload length's bytes. Every hop sets or clears it; a link
/// that cannot carry descriptors refuses it.
pub const FLAG_PAYLOAD_FD: u16 = 128;

/// A global-clock probe or its answer: whether or not the node records, the route
/// stamps it at the write that takes it (and sets [`FLAG_STAMPED`]) and reports the
/// instant the read that brought it ended, so that the clock is measured between
/// the socket calls, not between the protocol cores' turns.
pub const FLAG_TIMED: u16 = 256;

/// What a frame carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FrameKind {
    /// Tool data on a stream; the payload is typed values.
    Data = 1,
    /// A [`crate::ControlMsg`] between nodes.
    Control = 2,
    /// Flow control: the receiver of data on `stream` grants its sender more (see
    /// [`Grant`]). Both directions use it: a parent grants a child upward credit, a
    /// child grants its parent downward credit.
    Credit = 3,
    /// A [`crate::RouteMsg`] between two nodes' drivers (how frames travel between
    /// them); the protocol core never sees it.
    Route = 4,
    /// A message from one back-end to another, outside any stream: the stream field
    /// holds the destination rank, the rank field the source, the tag is the tool's.
    /// Comm nodes route it through the lowest common ancestor of the two ranks. The
    /// destination acknowledges each one its tool read ([`FLAG_PEER_ACK`]), which
    /// bounds what a sender has in the tree.
    Peer = 5,
}

impl FrameKind {
    fn from_u8(b: u8) -> Result<Self, DecodeError> {
        match b {
            1 => Ok(FrameKind::Data),
            2 => Ok(FrameKind::Control),
            3 => Ok(FrameKind::Credit),
            4 => Ok(FrameKind::Route),
            5 => Ok(FrameKind::Peer),
            other => Err(DecodeError::UnknownKind(other)),
        }
    }
}

/// The fixed part of a frame; the payload length is derived from the payload.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FrameHeader {
    /// Data, control or credit.
    pub kind: FrameKind,
    /// `FLAG_*` bits.
    pub flags: u16,
    /// Stream the frame belongs to (0 for control frames).
    pub stream: u32,
    /// Tool-chosen tag.
    pub tag: i32,
    /// Source rank (upstream) or destination rank ([`FLAG_DIRECT`]).
    pub rank: u32,
    /// Send time in nanoseconds of the sender's clock (0 when unset).
    pub timestamp_ns: u64,
}

impl FrameHeader {
    /// The sender's stamp for this hop, if it took one ([`FLAG_STAMPED`]).
    pub fn stamp(&self) -> Option<u64> {
        (self.flags & FLAG_STAMPED != 0).then_some(self.timestamp_ns)
    }

    /// True for a global-clock probe or answer ([`FLAG_TIMED`]).
    pub fn is_timed(&self) -> bool {
        self.flags & FLAG_TIMED != 0
    }

    /// A data header for `stream` and `tag` from `rank`, no flags, no timestamp.
    pub fn data(stream: u32, tag: i32, rank: u32) -> Self {
        FrameHeader { kind: FrameKind::Data, flags: 0, stream, tag, rank, timestamp_ns: 0 }
    }

    /// A peer header: a message with `tag` from rank `from` to rank `to`.
    pub fn peer(to: u32, tag: i32, from: u32) -> Self {
        FrameHeader { kind: FrameKind::Peer, flags: 0, stream: to, tag, rank: from, timestamp_ns: 0 }
    }

    /// A control header.
    pub fn control() -> Self {
        FrameHeader { kind: FrameKind::Control, flags: 0, stream: 0, tag: 0, rank: 0, timestamp_ns: 0 }
    }

    /// A credit header for `stream`; the grant is the payload (see [`Frame::credit`]).
    pub fn credit(stream: u32) -> Self {
        FrameHeader { kind: FrameKind::Credit, flags: 0, stream, tag: 0, rank: 0, timestamp_ns: 0 }
    }

    /// Writes the 28-byte header for a payload of `payload_len` bytes.
    pub fn encode(&self, payload_len: usize, out: &mut impl bytes::BufMut) {
        out.put_u8(PROTOCOL_VERSION);
        out.put_u8(self.kind as u8);
        out.put_u16_le(self.flags);
        out.put_u32_le(self.stream);
        out.put_i32_le(self.tag);
        out.put_u32_le(self.rank);
        out.put_u64_le(self.timestamp_ns);
        out.put_u32_le(payload_len as u32);
    }

    /// Reads a header and the payload length that follows it.
    ///
    /// # Errors
    /// Truncation, a wrong version, an unknown kind, or a payload over [`MAX_PAYLOAD_LEN`].
    pub fn decode(buf: &[u8]) -> Result<(FrameHeader, usize), DecodeError> {
        let mut r = Reader::new(buf);
        let version = r.u8("frame header")?;
        if version != PROTOCOL_VERSION {
            return Err(DecodeError::BadVersion { found: version, expected: PROTOCOL_VERSION });
        }
        let kind = FrameKind::from_u8(r.u8("frame header")?)?;
        let header = FrameHeader {
            kind,
            flags: r.u16("frame header")?,
            stream: r.u32("frame header")?,
            tag: r.i32("frame header")?,
            rank: r.u32("frame header")?,
            timestamp_ns: r.u64("frame header")?,
        };
        let len = r.len_u32("frame payload", MAX_PAYLOAD_LEN)?;
        Ok((header, len))
    }
}

/// A header and its payload. Cloning shares the payload (reference counted).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    /// The fixed part.
    pub header: FrameHeader,
    /// The payload bytes, shared between clones.
    pub payload: Bytes,
}

/// What a credit frame gives back: the sender of data on the frame's stream may send
/// this much more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Grant {
    /// Data frames.
    pub packets: u32,
    /// Payload bytes.
    pub bytes: u64,
}

/// Payload length of a credit frame.
const GRANT_LEN: usize = 12;

impl Frame {
    /// A credit frame granting `grant` more on `stream`.
    pub fn credit(stream: u32, grant: Grant) -> Frame {
        let mut payload = Vec::with_capacity(GRANT_LEN);
        payload.extend_from_slice(&grant.packets.to_le_bytes());
        payload.extend_from_slice(&grant.bytes.to_le_bytes());
        Frame::new(FrameHeader::credit(stream), payload)
    }

    /// The grant a credit frame carries.
    ///
    /// # Errors
    /// A payload of the wrong size.
    pub fn grant(&self) -> Result<Grant, DecodeError> {
        let mut r = Reader::new(&self.payload);
        let grant = Grant { packets: r.u32("credit")?, bytes: r.u64("credit")? };
        r.finish("credit")?;
        Ok(grant)
    }

    /// Builds a frame.
    pub fn new(header: FrameHeader, payload: impl Into<Bytes>) -> Self {
        Frame { header, payload: payload.into() }
    }

    /// Bytes this frame occupies on the wire.
    pub fn wire_len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Appends header and payload to `out`.
    pub fn encode(&self, out: &mut impl bytes::BufMut) {
        self.header.encode(self.payload.len(), out);
        out.put_slice(&self.payload);
    }
}

/// Encodes frames back to back into one buffer.
pub fn encode_batch(frames: &[Frame]) -> Bytes {
    let mut out = BytesMut::with_capacity(frames.iter().map(Frame::wire_len).sum());
    for f in frames {
        f.encode(&mut out);
    }
    out.freeze()
}

/// Decodes a buffer that holds whole frames back to back, and nothing else.
///
/// # Errors
/// A malformed frame, or bytes left over after the last whole frame.
pub fn decode_batch(buf: Bytes) -> Result<Vec<Frame>, DecodeError> {
    let mut frames = Vec::new();
    let mut rest = buf;
    while !rest.is_empty() {
        let (header, len) = FrameHeader::decode(&rest)?;
        if rest.len() < HEADER_LEN + len {
            return Err(DecodeError::Truncated {
                what: "frame payload",
                needed: HEADER_LEN + len - rest.len(),
                available: rest.len() - HEADER_LEN,
            });
        }
        rest.advance(HEADER_LEN);
        frames.push(Frame { header, payload: rest.split_to(len) });
    }
    Ok(frames)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample(n: u8) -> Frame {
        Frame::new(FrameHeader::data(7, -3, n as u32), vec![n; n as usize])
    }

    #[test]
    fn a_stamp_written_at_its_place_in_an_encoded_header_is_the_header_stamp() {
        let mut wire = BytesMut::new();
        sample(3).header.encode(3, &mut wire);
        wire[TIMESTAMP_AT..TIMESTAMP_AT + 8].copy_from_slice(&0x0102_0304_0506_0708u64.to_le_bytes());
        let (header, len) = FrameHeader::decode(&wire).unwrap();
        assert_eq!((header.timestamp_ns, len), (0x0102_0304_0506_0708, 3));
    }

    #[test]
    fn batch_rejects_trailing_partial_frame() {
        let mut wire = encode_batch(&[sample(3)]).to_vec();
        wire.push(PROTOCOL_VERSION);
        assert!(matches!(decode_batch(wire.into()), Err(DecodeError::Truncated { .. })));
    }

    #[test]
    fn wrong_version_is_named() {
        let mut wire = encode_batch(&[sample(1)]).to_vec();
        let other = PROTOCOL_VERSION + 1;
        wire[0] = other;
        let err = decode_batch(wire.into()).unwrap_err();
        assert_eq!(err, DecodeError::BadVersion { found: other, expected: PROTOCOL_VERSION });
    }
}
