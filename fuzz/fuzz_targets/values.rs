//! decode_values on arbitrary bytes; accepted payloads must re-encode to the same
//! bytes (the encoding is canonical) and decode again to the same values.
//! decode_format must give the decoded values' format, or the same error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::{decode_format, decode_values, encode_values, Format};

fuzz_target!(|data: &[u8]| {
    assert_eq!(decode_format(data), decode_values(data).map(|v| Format::of(&v)));
    if let Ok(values) = decode_values(data) {
        let mut out = Vec::new();
        encode_values(&values, &mut out);
        assert_eq!(out, data, "re-encoding differs");
        let again = decode_values(&out).expect("re-encoded payload must decode");
        // Compare through the encoding: floats may be NaN, which `==` rejects.
        let mut out2 = Vec::new();
        encode_values(&again, &mut out2);
        assert_eq!(out2, out);
        let format = Format::of(&values);
        assert!(format.check(&again).is_ok());
        assert_eq!(Format::parse(&format.to_string()).ok(), Some(format));
    }
});
