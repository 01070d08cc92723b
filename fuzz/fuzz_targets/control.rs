//! ControlMsg::decode on arbitrary bytes; accepted messages must round-trip.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_wire::ControlMsg;

fuzz_target!(|data: &[u8]| {
    if let Ok(msg) = ControlMsg::decode(data) {
        let wire = msg.encode();
        assert_eq!(ControlMsg::decode(&wire).as_ref(), Ok(&msg));
    }
});
