//! Frame cutting: the whole frames at the front of what a link read so far.

use std::collections::VecDeque;
use std::os::fd::OwnedFd;

use bytes::{Buf, Bytes, BytesMut};
use treecast_wire::{Frame, FrameHeader, FLAG_PAYLOAD_FD, HEADER_LEN};

use super::{COPY_BELOW, MAX_FRAMES_GUESS, READ_CHUNK, RESERVE_STEP};
use crate::shared_payload;

/// Why the bytes of a link cannot be cut into frames: the link cannot go on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CutError {
    /// A frame header does not decode.
    #[error("malformed frame: {0}")]
    Malformed(#[from] treecast_wire::DecodeError),
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
    cut_frames_into(buf, max_frame, &mut VecDeque::new(), &mut frames)?;
    Ok(frames)
}

/// [`cut_frames`] into `frames` (empty), so that a caller can keep its list's room
/// from one read to the next, for a link that carries payload files: `files` holds
/// those received and not yet matched, oldest first.
pub(super) fn cut_frames_into(
    buf: &mut BytesMut,
    max_frame: usize,
    files: &mut VecDeque<OwnedFd>,
    frames: &mut Vec<Frame>,
) -> Result<(), CutError> {
    while buf.len() >= HEADER_LEN {
        let (mut header, len) = FrameHeader::decode(&buf[..HEADER_LEN])?;
        if len > max_frame {
            return Err(CutError::TooLarge { len, max: max_frame });
        }
        if frames.is_empty() {
            // Sized once, as if the rest were like the first: a read of many small
            // frames makes one allocation at most instead of growing again and again.
            frames.reserve((buf.len() / (HEADER_LEN + len)).clamp(1, MAX_FRAMES_GUESS));
        }
        if header.flags & FLAG_PAYLOAD_FD != 0 {
            // The sender sends a file no later than its header's first byte.
            let file = files.pop_front().ok_or(CutError::NoFile)?;
            let payload = shared_payload::map(file, len).map_err(CutError::File)?;
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
    use treecast_wire::MAX_PAYLOAD_LEN;

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
