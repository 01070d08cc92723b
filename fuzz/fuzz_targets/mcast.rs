//! Multicast datagrams: any bytes either fail to decode or re-encode to exactly
//! themselves (header and payload; the tag is placed, not interpreted).
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::{decode_mcast, encode_mcast, MCAST_TAG_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(d) = decode_mcast(data) else { return };
    let mut out = Vec::new();
    encode_mcast(&d.header, d.payload, &mut out);
    let n = out.len();
    out[n - MCAST_TAG_LEN..].copy_from_slice(d.tag);
    assert_eq!(out, data, "a datagram does not re-encode to its bytes");
});
