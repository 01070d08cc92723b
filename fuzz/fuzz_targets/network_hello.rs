//! decode_network_hello and network_hello_len on arbitrary bytes (what another
//! network's front-end sends once authenticated): they must return, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::{decode_network_hello, encode_network_hello, network_hello_len, NETWORK_HELLO_HEAD};

fuzz_target!(|data: &[u8]| {
    if data.len() >= NETWORK_HELLO_HEAD {
        let _ = network_hello_len(&data[..NETWORK_HELLO_HEAD]);
    }
    if let Ok(hello) = decode_network_hello(data) {
        // What reads back encodes to the same bytes.
        assert_eq!(encode_network_hello(&hello), data);
    }
});
