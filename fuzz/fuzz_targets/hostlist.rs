//! hostlist::expand on arbitrary UTF-8: it must return, never panic; the hosts of an
//! accepted list must come back (as a set) through compress and expand. Inputs naming a
//! host file (`^FILE`) are skipped: the fuzzer must not read files of the machine.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_topology::hostlist::{compress, expand};

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if text.contains('^') {
        return;
    }
    let Ok(mut hosts) = expand(text) else { return };
    // Big lists are correct too, but too slow to round-trip on every input; an empty
    // one (everything excluded, `-n1`) has no expression to write back.
    if hosts.len() > 10_000 || hosts.is_empty() {
        return;
    }
    let list = compress(&hosts);
    let mut again = expand(&list).unwrap_or_else(|e| panic!("{list:?} does not expand: {e}"));
    hosts.sort();
    again.sort();
    assert_eq!(again, hosts, "{list:?}");
});
