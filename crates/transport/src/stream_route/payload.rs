//! The route's side of payload passing (`crate::shared_payload`): the sealed file
//! a large payload goes in, which payload files go with a write, where a write must
//! stop so that no header goes before its file, and the files a link received,
//! handed to the frame cutter.

use std::collections::VecDeque;
use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use bytes::Bytes;
use treecast_wire::{CutError, PayloadFiles};

use crate::shared_payload;

/// Payload files a link may hold that no frame has claimed yet; a sender sends
/// each with its frame's header, so more means the peer is not one of ours.
pub(super) const MAX_WAITING_FILES: usize = 4 * shared_payload::MAX_FDS_PER_MSG;

/// The payload files to send with a write of `total` bytes starting at byte
/// `written` of the stream: those whose header starts in them, at most
/// [`shared_payload::MAX_FDS_PER_MSG`]; and, when some are left over, how many bytes
/// the write may take so that no header goes before its file.
pub(super) fn files_for(
    files: &VecDeque<(u64, Arc<OwnedFd>)>,
    written: u64,
    total: u64,
) -> (Vec<RawFd>, Option<usize>) {
    let end = written + total;
    let mut out = Vec::new();
    for (at, file) in files {
        if *at >= end {
            break;
        }
        if out.len() == shared_payload::MAX_FDS_PER_MSG {
            // `at > written`: the files taken start at `written` or later, before it.
            return (out, Some((*at - written) as usize));
        }
        out.push(file.as_raw_fd());
    }
    (out, None)
}

/// How many of `total` bytes from byte `written` may go before the header of the
/// next file to send, if that header starts within them.
pub(super) fn before_next_file(
    files: &VecDeque<(u64, Arc<OwnedFd>)>,
    written: u64,
    total: u64,
) -> Option<usize> {
    let (at, _) = files.front()?;
    (*at < written + total).then(|| at.saturating_sub(written) as usize)
}

/// The first `limit` bytes of `sources` (all of them without a limit), as slices.
pub(super) fn slices_up_to<'a>(sources: &[&'a [u8]], limit: Option<usize>) -> Vec<IoSlice<'a>> {
    let mut left = limit.unwrap_or(usize::MAX);
    let mut slices = Vec::with_capacity(sources.len());
    for &b in sources {
        if left == 0 {
            break;
        }
        let take = b.len().min(left);
        slices.push(IoSlice::new(&b[..take]));
        left -= take;
    }
    slices
}

/// A sealed memory file holding `payload`, or `None` (said once) when the kernel
/// cannot make one: the payload then goes through the socket.
pub(super) fn payload_file(payload: &Bytes) -> Option<Arc<OwnedFd>> {
    static WARNED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    match shared_payload::file_for(payload) {
        Ok(file) => Some(file),
        Err(e) => {
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!("large payloads go through the socket: cannot make a sealed memory file: {e}");
            }
            None
        }
    }
}

/// The payload files a link received and no frame has claimed yet, oldest first:
/// the frame cutter maps the next one for each frame that says its payload came
/// as a file.
pub(super) struct ReceivedFiles<'a>(pub(super) &'a mut VecDeque<OwnedFd>);

impl PayloadFiles for ReceivedFiles<'_> {
    #[inline]
    fn take(&mut self, len: usize) -> Result<Bytes, CutError> {
        let file = self.0.pop_front().ok_or(CutError::NoFile)?;
        shared_payload::map(file, len).map_err(CutError::File)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_write_with_more_files_than_one_message_carries_stops_before_the_first_left_over() {
        let file = shared_payload::file_for(&Bytes::from_static(b"x")).unwrap();
        let max = shared_payload::MAX_FDS_PER_MSG as u64;
        // Headers every 28 bytes from byte 1000, the stream written up to 1000.
        let files: VecDeque<_> = (0..max + 3).map(|i| (1000 + 28 * i, file.clone())).collect();
        let (taken, limit) = files_for(&files, 1000, 28 * (max + 3));
        assert_eq!(taken.len() as u64, max);
        assert_eq!(limit, Some(28 * max as usize));
        let (a, b) = ([1u8; 500], [2u8; 2000]);
        let slices = slices_up_to(&[&a, &b], limit);
        assert_eq!(slices.iter().map(|s| s.len()).sum::<usize>(), 28 * max as usize);
        // A write that ends before a header takes no file for it.
        assert_eq!(files_for(&files, 1000, 1).0.len(), 1);
        assert!(files_for(&files, 0, 1000).0.is_empty());
    }
}
