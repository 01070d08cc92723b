//! Collective frame payloads: a head and a gather's entries decode or fail without
//! panicking, and a head that decodes re-encodes to the bytes it came from.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::{decode_collective, decode_entries, encode_collective, encode_entry};

fuzz_target!(|data: &[u8]| {
    if let Ok((head, at)) = decode_collective(data) {
        assert_eq!(encode_collective(&head, &data[at..]), data, "a collective head does not re-encode to its bytes");
    }
    if let Ok(entries) = decode_entries(data) {
        let mut again = Vec::new();
        for (rank, values) in entries {
            encode_entry(&mut again, rank, values);
        }
        assert_eq!(again, data, "gather entries do not re-encode to their bytes");
    }
});
