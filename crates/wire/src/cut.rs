//! The frame cutter: the one way bytes read from a link become frames.
//!
//! Every link runs [`cut_frames_into`] on what it read so far; the test vectors,
//! the property tests and the fuzz target (`fuzz/fuzz_targets/frame.rs`) run the
//! same code through [`cut_frames`]. A frame whose payload came as a file beside
//! its header ([`FLAG_PAYLOAD_FD`]) takes its payload from [`PayloadFiles`]: the
//! route that received the file maps it; this layer opens nothing.

use bytes::{Buf, Bytes, BytesMut};

use crate::{DecodeError, Frame, FrameHeader, FrameKind, FLAG_PAYLOAD_FD, HEADER_LEN};

/// Bytes a link reads per system call at most. While a large frame arrives the
/// cutter keeps this much room (or what the frame still lacks) in the buffer, so
/// that the next read goes straight there.
pub const READ_CHUNK: usize = 64 << 10;
/// Most frames a read's list of frames is sized for before it is cut: a caller that
/// keeps its list from one read to the next keeps no more room than this.
pub const MAX_FRAMES_GUESS: usize = 1024;
/// Payloads smaller than this are copied out of the read buffer, so a frame the
/// node keeps (waiting for its wave) does not pin a whole read chunk.
const COPY_BELOW: usize = 4 << 10;
/// Most the read buffer grows by at once while a large frame arrives.
const RESERVE_STEP: usize = 1 << 20;

/// Why the bytes of a link cannot be cut into frames: the link cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CutError {
    /// A frame header does not decode.
    #[error("malformed frame: {0}")]
    Malformed(#[from] DecodeError),
    /// A frame says its payload came as a file, and none came with it (or the link
    /// cannot carry files).
    #[error("a frame says its payload came as a file beside it, and none came")]
    NoFile,
    /// A payload file that cannot be used.
    #[error("{0}")]
    File(String),
    /// A frame announces more payload than this node accepts.
    #[error(
        "a frame of {len} bytes is over this node's limit of {max} bytes (TREECAST_MAX_FRAME); the link is closed"
    )]
    TooLarge {
        /// The payload length announced.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A control frame announces more payload than this link may send in one.
    #[error(
        "a control frame of {len} bytes is over this link's control limit of {max} bytes \
         (TREECAST_MAX_CONTROL per back-end the peer reaches); the link is closed"
    )]
    ControlTooLarge {
        /// The payload length announced.
        len: usize,
        /// The limit.
        max: usize,
    },
}

/// Where the payloads of frames marked [`FLAG_PAYLOAD_FD`] come from: the files a
/// link received beside its bytes, oldest first.
pub trait PayloadFiles {
    /// The payload of `len` bytes held by the next file received.
    ///
    /// # Errors
    /// No file came ([`CutError::NoFile`]), or it cannot be used ([`CutError::File`]).
    fn take(&mut self, len: usize) -> Result<Bytes, CutError>;
}

/// A byte stream, which carries no files: a frame that claims one is refused.
#[derive(Debug, Default, Clone, Copy)]
pub struct NoFiles;

impl PayloadFiles for NoFiles {
    fn take(&mut self, _len: usize) -> Result<Bytes, CutError> {
        Err(CutError::NoFile)
    }
}

/// Cuts the whole frames at the front of `buf` (what a link read so far), leaving a
/// partial frame in it and reserving room for its payload in steps as bytes come.
/// Payloads under 4 KiB are copied out, so a frame the node keeps pins no read buffer.
///
/// # Errors
/// A malformed header or a frame over `max_frame` bytes: the stream cannot go on.
/// A frame whose payload comes as a file ([`FLAG_PAYLOAD_FD`]) is refused: a byte
/// stream carries none.
pub fn cut_frames(buf: &mut BytesMut, max_frame: usize) -> Result<Vec<Frame>, CutError> {
    let mut frames = Vec::new();
    cut_frames_into(buf, max_frame, max_frame, &mut NoFiles, &mut frames)?;
    Ok(frames)
}

/// [`cut_frames`] into `frames` (empty), so that a caller can keep its list's room
/// from one read to the next, for a link whose payload files come from `files` and
/// whose control frames may hold `max_control` bytes at most (the smaller of the two
/// limits applies to them).
///
/// Generic over `files` so that a link's reader gets its own copy, compiled where
/// it is called, with no indirect call per frame.
///
/// # Errors
/// As [`cut_frames`], a control frame over `max_control` bytes
/// ([`CutError::ControlTooLarge`]), and what `files` says of a payload file.
pub fn cut_frames_into<F: PayloadFiles>(
    buf: &mut BytesMut,
    max_frame: usize,
    max_control: usize,
    files: &mut F,
    frames: &mut Vec<Frame>,
) -> Result<(), CutError> {
    while buf.len() >= HEADER_LEN {
        let (mut header, len) = FrameHeader::decode(&buf[..HEADER_LEN])?;
        if len > max_frame {
            return Err(CutError::TooLarge { len, max: max_frame });
        }
        if header.kind == FrameKind::Control && len > max_control {
            return Err(CutError::ControlTooLarge { len, max: max_control });
        }
        if frames.is_empty() {
            // Sized once, as if the rest were like the first: a read of many small
            // frames makes one allocation at most instead of growing again and again.
            frames.reserve((buf.len() / (HEADER_LEN + len)).clamp(1, MAX_FRAMES_GUESS));
        }
        if header.flags & FLAG_PAYLOAD_FD != 0 {
            // The sender sends a file no later than its header's first byte.
            let payload = files.take(len)?;
            buf.advance(HEADER_LEN);
            header.flags &= !FLAG_PAYLOAD_FD;
            frames.push(Frame { header, payload });
            continue;
        }
        if buf.len() < HEADER_LEN + len {
            // Grow in steps as the bytes come: a header alone must not make us allocate its payload.
            let missing = HEADER_LEN + len - buf.len();
            if buf.capacity() - buf.len() < missing.min(READ_CHUNK) {
                buf.reserve(missing.min(RESERVE_STEP));
            }
            break;
        }
        let payload = if len < COPY_BELOW {
            let p = Bytes::copy_from_slice(&buf[HEADER_LEN..HEADER_LEN + len]);
            buf.advance(HEADER_LEN + len);
            p
        } else {
            buf.advance(HEADER_LEN);
            buf.split_to(len).freeze()
        };
        frames.push(Frame { header, payload });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::{encode_batch, MAX_PAYLOAD_LEN};

    fn sample(n: u8) -> Frame {
        Frame::new(FrameHeader::data(7, -3, n as u32), vec![n; n as usize])
    }

    #[test]
    fn bytes_arriving_one_by_one_are_cut_into_the_frames_they_encode() {
        let frames: Vec<Frame> = (0..5).map(sample).collect();
        let wire = encode_batch(&frames);
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for b in wire.iter() {
            buf.extend_from_slice(&[*b]);
            out.extend(cut_frames(&mut buf, MAX_PAYLOAD_LEN).unwrap());
        }
        assert_eq!(out, frames);
        assert!(buf.is_empty());
    }

    #[test]
    fn an_oversized_payload_is_refused_before_allocation() {
        let mut hdr = BytesMut::new();
        FrameHeader::data(1, 0, 0).encode(MAX_PAYLOAD_LEN + 1, &mut hdr);
        let err = cut_frames(&mut hdr, MAX_PAYLOAD_LEN).unwrap_err();
        assert!(matches!(err, CutError::Malformed(DecodeError::TooLong { .. })), "{err:?}");
        let mut hdr = BytesMut::new();
        FrameHeader::data(1, 0, 0).encode(2000, &mut hdr);
        assert_eq!(cut_frames(&mut hdr, 1000).unwrap_err(), CutError::TooLarge { len: 2000, max: 1000 });
    }

    #[test]
    fn a_control_frame_over_the_control_limit_is_refused_from_its_header() {
        let mut buf = BytesMut::new();
        FrameHeader::control().encode(2000, &mut buf);
        let err = cut_frames_into(&mut buf, 1 << 20, 1000, &mut NoFiles, &mut Vec::new()).unwrap_err();
        assert_eq!(err, CutError::ControlTooLarge { len: 2000, max: 1000 });
        // Data frames are held to the frame limit only: credits bound them.
        let mut buf = BytesMut::new();
        FrameHeader::data(1, 0, 0).encode(2000, &mut buf);
        buf.extend_from_slice(&[0; 2000]);
        let mut frames = Vec::new();
        cut_frames_into(&mut buf, 1 << 20, 1000, &mut NoFiles, &mut frames).unwrap();
        assert_eq!(frames.len(), 1);
    }

    #[test]
    fn a_frame_claiming_a_payload_file_on_a_byte_stream_is_refused() {
        let mut header = FrameHeader::data(1, 0, 0);
        header.flags = FLAG_PAYLOAD_FD;
        let mut buf = BytesMut::new();
        header.encode(100, &mut buf);
        assert_eq!(cut_frames(&mut buf, MAX_PAYLOAD_LEN).unwrap_err(), CutError::NoFile);
    }

    #[test]
    fn a_header_alone_does_not_allocate_its_payload() {
        let mut buf = BytesMut::new();
        FrameHeader::data(1, 0, 0).encode(200 << 20, &mut buf);
        let frames = cut_frames(&mut buf, MAX_PAYLOAD_LEN).unwrap();
        assert!(frames.is_empty());
        assert!(buf.capacity() <= 2 * RESERVE_STEP, "reserved {} bytes", buf.capacity());
    }
}
