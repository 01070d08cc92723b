//! Peer frame payloads: a destination set and an acknowledgement decode or fail
//! without panicking, and what decodes re-encodes to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::{decode_ack, decode_multi, encode_ack, encode_multi};

fuzz_target!(|data: &[u8]| {
    if let Ok((targets, at)) = decode_multi(data) {
        assert_eq!(encode_multi(&targets, &data[at..]), data, "a destination set does not re-encode to its bytes");
    }
    if let Ok((messages, bytes)) = decode_ack(data) {
        assert_eq!(encode_ack(messages, bytes), data);
    }
});
