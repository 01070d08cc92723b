//! Topology::parse on arbitrary UTF-8: it must return, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = treecast_topology::Topology::parse(text);
    }
});
