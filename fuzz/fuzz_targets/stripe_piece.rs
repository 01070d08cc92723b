//! Striped-link piece headers: any bytes either fail to decode or re-encode to
//! exactly themselves (every field has one encoding).
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::PieceHeader;

fuzz_target!(|data: &[u8]| {
    let Ok(h) = PieceHeader::decode(data) else { return };
    assert_eq!(h.encode().as_slice(), data, "a piece header does not re-encode to its bytes");
});
