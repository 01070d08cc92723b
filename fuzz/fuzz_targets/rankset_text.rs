//! RankSet's text form (`0-15,32`) on arbitrary UTF-8: parsing must return, never
//! panic, and an accepted set must print to text that parses to the same set.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::RankSet;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(set) = text.parse::<RankSet>() {
        let printed = set.to_string();
        assert_eq!(printed.parse::<RankSet>().ok(), Some(set), "{printed:?}");
    }
});
