//! Route messages: any bytes either fail to decode or re-encode to exactly
//! themselves (every field has one encoding).
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::RouteMsg;

fuzz_target!(|data: &[u8]| {
    let Ok(msg) = RouteMsg::decode(data) else { return };
    assert_eq!(msg.encode(), data, "a route message does not re-encode to its bytes");
});
