//! The average filter on arbitrary partials (flagged payloads) next to a back-end's
//! packet and another partial, at a comm node and at the root: it must return, never panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_filters::{builtin, FilterContext, TransformKind};
use treecast_wire::{Frame, FrameHeader, FLAG_PARTIAL_AVG};

fuzz_target!(|data: &[u8]| {
    let mut header = FrameHeader::data(1, 0, 3);
    header.flags |= FLAG_PARTIAL_AVG;
    let partial = Frame::new(header, data.to_vec());
    let plain = Frame::new(FrameHeader::data(1, 0, 4), data.to_vec());
    for wave in
        [vec![partial.clone()], vec![partial.clone(), plain.clone()], vec![plain, partial.clone(), partial]]
    {
        for is_root in [false, true] {
            let _ = builtin(TransformKind::Avg).apply(wave.clone(), &FilterContext { stream: 1, is_root });
        }
    }
});
