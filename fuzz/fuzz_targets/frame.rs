//! The frame cutter every link runs (`cut_frames`) fed arbitrary bytes in arbitrary
//! chunks, with no limit below the wire's own (`route_frames` varies the limit).
//!
//! Input: `[n, chunk sizes (n bytes)..., stream bytes...]`. Whatever frames come
//! out must re-encode to exactly the bytes they were cut from, and when the
//! whole stream is a valid batch the cutter must yield the same frames.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use treecast_wire::{cut_frames, decode_batch, encode_batch, FLAG_PAYLOAD_FD, MAX_PAYLOAD_LEN};

fuzz_target!(|data: &[u8]| {
    let Some((&n, rest)) = data.split_first() else { return };
    let n = usize::from(n % 16).min(rest.len());
    let (sizes, stream) = rest.split_at(n);

    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut fed = 0;
    let mut sizes = sizes.iter().map(|&s| usize::from(s) + 1);
    let mut failed = false;
    'feed: while fed < stream.len() {
        let take = sizes.next().unwrap_or(stream.len()).min(stream.len() - fed);
        buf.extend_from_slice(&stream[fed..fed + take]);
        fed += take;
        match cut_frames(&mut buf, MAX_PAYLOAD_LEN) {
            Ok(f) => frames.extend(f),
            Err(_) => {
                failed = true;
                break 'feed;
            }
        }
    }
    let wire = encode_batch(&frames);
    assert_eq!(&wire[..], &stream[..wire.len()], "frames do not re-encode to their bytes");
    if let Ok(batch) = decode_batch(Bytes::copy_from_slice(stream)) {
        if batch.iter().any(|f| f.header.flags & FLAG_PAYLOAD_FD != 0) {
            // A byte stream carries no payload files: a frame that claims one is refused.
            assert!(failed, "the cutter took a frame claiming a payload file");
            return;
        }
        assert!(!failed, "the cutter failed on a valid batch");
        assert_eq!(batch, frames);
        assert!(buf.is_empty());
    }
});
