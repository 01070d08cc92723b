//! Multicast datagrams: any bytes either fail to decode or re-encode to exactly
//! themselves (header and payload; the tag is placed, not interpreted), an
//! answer's payload included.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::{decode_mcast, encode_mcast, McastAnswer, McastKind, MCAST_TAG_LEN};

fuzz_target!(|data: &[u8]| {
    let Ok(d) = decode_mcast(data) else { return };
    let mut payload = Vec::new();
    if d.header.kind == McastKind::Data {
        payload.extend_from_slice(d.payload);
    } else {
        let answer = McastAnswer::decode(&d.header, d.payload).expect("decode_mcast checked the answer");
        answer.encode(&mut payload);
    }
    let mut out = Vec::new();
    encode_mcast(&d.header, &payload, &mut out);
    let n = out.len();
    out[n - MCAST_TAG_LEN..].copy_from_slice(d.tag);
    assert_eq!(out, data, "a datagram does not re-encode to its bytes");
});
