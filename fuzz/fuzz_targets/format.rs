//! Format::parse on arbitrary UTF-8; accepted formats must print to a canonical
//! form that parses to the same types.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::Format;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Format::parse(text) {
        Ok(format) => {
            let canonical = format.to_string();
            assert_eq!(Format::parse(&canonical).as_ref(), Ok(&format), "{canonical:?}");
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
});
