//! decode_batch on arbitrary bytes: it must not panic, and what it accepts must re-encode exactly.
#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use treecast_wire::{decode_batch, encode_batch};

fuzz_target!(|data: &[u8]| {
    if let Ok(frames) = decode_batch(Bytes::copy_from_slice(data)) {
        assert_eq!(&encode_batch(&frames)[..], data);
    }
});
