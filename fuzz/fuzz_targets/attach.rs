//! AttachInfo::parse on arbitrary UTF-8 (the text of an attach file): it must
//! return, never panic, and an accepted file's ranks must be found by point().
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_api::AttachInfo;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(info) = AttachInfo::parse(text, std::path::Path::new("fuzz.attach")) {
        for (rank, _, _) in &info.points {
            assert!(info.point(*rank).is_ok());
        }
    }
});
