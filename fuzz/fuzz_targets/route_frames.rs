//! The frame cutter every link runs on the bytes it reads (`treecast_wire::cut_frames`), fed arbitrary
//! bytes in arbitrary chunks, with a random frame-size limit.
//!
//! Input: `[limit byte, n, chunk sizes (n bytes)..., stream bytes...]`. The frames cut
//! must re-encode to exactly the bytes they came from; an error must come only from
//! a malformed header or a frame over the limit; credit frames' grants decode or fail
//! without panicking, and re-encode when they decode.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use treecast_wire::{cut_frames, encode_batch, CutError, Frame, FrameKind};

fuzz_target!(|data: &[u8]| {
    let Some((&limit, rest)) = data.split_first() else { return };
    let max_frame = usize::from(limit) * 64;
    let Some((&n, rest)) = rest.split_first() else { return };
    let n = usize::from(n % 16).min(rest.len());
    let (sizes, stream) = rest.split_at(n);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut fed = 0;
    let mut sizes = sizes.iter().map(|&s| usize::from(s) + 1);
    while fed < stream.len() {
        let take = sizes.next().unwrap_or(stream.len()).min(stream.len() - fed);
        buf.extend_from_slice(&stream[fed..fed + take]);
        fed += take;
        match cut_frames(&mut buf, max_frame) {
            Ok(f) => frames.extend(f),
            Err(CutError::TooLarge { len, max }) => {
                assert!(len > max);
                break;
            }
            Err(_) => break,
        }
    }
    let wire = encode_batch(&frames);
    assert_eq!(&wire[..], &stream[..wire.len()], "frames do not re-encode to their bytes");
    for f in frames.iter().filter(|f| f.header.kind == FrameKind::Credit) {
        if let Ok(grant) = f.grant() {
            assert_eq!(Frame::credit(f.header.stream, grant).payload, f.payload);
        }
    }
});
