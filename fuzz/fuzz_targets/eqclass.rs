//! decode_eq_classes on arbitrary class tables: it must return, never panic; tables it
//! accepts must come back the same through eq_classes_frame, and the eqclass filter
//! must merge them with a plain member without panicking.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_filters::{builtin, decode_eq_classes, eq_classes_frame, FilterContext};
use treecast_filters::TransformKind;
use treecast_wire::{Frame, FrameHeader, FLAG_EQCLASS};

fuzz_target!(|data: &[u8]| {
    let mut header = FrameHeader::data(1, 0, 3);
    header.flags |= FLAG_EQCLASS;
    let table = Frame::new(header, data.to_vec());
    if let Ok(classes) = decode_eq_classes(&table) {
        let again = eq_classes_frame(1, 0, &classes);
        assert_eq!(decode_eq_classes(&again).ok(), Some(classes), "re-encoded table differs");
    }
    let member = Frame::new(FrameHeader::data(1, 0, 9), data.to_vec());
    for is_root in [false, true] {
        let _ = builtin(TransformKind::EqClass)
            .apply(vec![table.clone(), member.clone()], &FilterContext { stream: 1, is_root });
    }
});
