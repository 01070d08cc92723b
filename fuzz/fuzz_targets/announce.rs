//! decode_announce on arbitrary bytes (a datagram on a comm node's join socket):
//! it must return, never panic, and take nothing not signed with the secret.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_transport::announce::{decode_announce, encode_announce};
use treecast_transport::Secret;

fuzz_target!(|data: &[u8]| {
    let secret = Secret::from_bytes([7; 32]);
    assert!(decode_announce(&secret, data, "fuzz").is_err() || data.len() == 61);
    // A signed announcement with fuzzed fields reads back as what was signed.
    if data.len() >= 8 {
        let node_id = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let rank = u32::from_le_bytes([data[4], data[5], data[6], data[7]]);
        let a = decode_announce(&secret, &encode_announce(&secret, node_id, rank), "fuzz");
        assert!(a.is_ok_and(|a| (a.node_id, a.rank) == (node_id, rank)));
    }
});
