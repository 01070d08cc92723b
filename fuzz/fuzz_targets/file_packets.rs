//! FileMessage::decode (what a back-end reads from the file-transfer packets) on
//! arbitrary payloads for each of the four tags: it must return, never panic. The
//! first byte picks the tag.
#![no_main]

use libfuzzer_sys::fuzz_target;
use treecast_files::{FileMessage, FILE_CHUNK, FILE_END, FILE_OPEN, FILE_STATUS};

fuzz_target!(|data: &[u8]| {
    let Some((&pick, payload)) = data.split_first() else { return };
    let tag = [FILE_STATUS, FILE_OPEN, FILE_CHUNK, FILE_END][usize::from(pick % 4)];
    if let Ok(message) = FileMessage::decode(tag, payload) {
        let kind_fits = matches!(
            (tag, &message),
            (FILE_STATUS, FileMessage::Status(_))
                | (FILE_OPEN, FileMessage::Open { .. })
                | (FILE_CHUNK, FileMessage::Chunk { .. })
                | (FILE_END, FileMessage::End { .. })
        );
        assert!(kind_fits, "tag {tag} decoded as {message:?}");
    }
});
