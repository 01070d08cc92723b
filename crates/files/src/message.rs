//! Decoding of file-transfer packets, apart from what a back-end does with them:
//! [`FileMessage::decode`] is pure, so it can be fuzzed without touching any file.

use treecast_wire::{decode_values, Format, RankSet, Value};

use super::{
    EntryKind, WriteMode, CHUNK_FORMAT, END_FORMAT, FILE_CHUNK, FILE_END, FILE_OPEN, FILE_STATUS, FLAG_EXACT,
    FLAG_RESTART, OPEN_FORMAT, STATUS_FORMAT,
};

/// A file-transfer packet, decoded (the protocol is described in `docs/files.md`).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FileMessage {
    /// [`FILE_STATUS`]: what is sent and where it goes.
    Status(FileStatus),
    /// [`FILE_OPEN`]: the data stream (0: none) and the ranks that receive on it.
    Open {
        /// The data stream's id, 0 when no rank receives.
        data: u32,
        /// The receiving ranks.
        receivers: RankSet,
    },
    /// [`FILE_CHUNK`]: bytes at an offset.
    Chunk {
        /// Where the bytes go in the file.
        offset: u64,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// [`FILE_END`]: the end of the data.
    End {
        /// BLAKE3 of the whole content, hex.
        hash: String,
        /// Bytes sent.
        sent: u64,
        /// Why the front-end gave up (empty when the source was read completely).
        abort: String,
    },
}

/// The fields of a [`FILE_STATUS`] packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileStatus {
    /// Absolute source path on the front-end.
    pub source: String,
    /// Source mtime, ns since the epoch.
    pub mtime: u64,
    /// Source size in bytes (0 for a link or a directory).
    pub size: u64,
    /// Destination path.
    pub destination: String,
    /// What to do with an existing destination.
    pub mode: WriteMode,
    /// Mode bits to give the copy.
    pub perm: u32,
    /// What is sent.
    pub kind: EntryKind,
    /// A link's target text (empty unless a link).
    pub target: String,
    /// The destination is the file's own path: an existing directory there is an error.
    pub exact: bool,
    /// Sent again on the data stream to a rank that missed [`super::FILE_OPEN`]: the
    /// rank answers only at the end packet.
    pub restart: bool,
}

/// Why a file-transfer packet does not decode; the text goes back to the front-end
/// as the rank's failure detail.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum FileMessageError {
    /// The payload does not decode as the packet's format.
    #[error("malformed {what} packet: {detail}")]
    Malformed {
        /// Which packet (`status`, `open`, `chunk`, `end`).
        what: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A write mode this build does not know.
    #[error("unknown write mode {0}")]
    UnknownMode(i32),
    /// A kind of entry this build does not know.
    #[error("unknown kind {0} (a newer front-end?)")]
    UnknownKind(i32),
    /// The tag is not one of the file protocol's.
    #[error("tag {0} is not a file-transfer packet")]
    NotAFilePacket(i32),
}

/// The payload's values, checked against `format`.
fn values(payload: &[u8], format: &str, what: &'static str) -> Result<Vec<Value>, FileMessageError> {
    let malformed = |detail: String| FileMessageError::Malformed { what, detail };
    let format = Format::parse(format).map_err(|e| malformed(e.to_string()))?;
    let values = decode_values(payload).map_err(|e| malformed(e.to_string()))?;
    format.check(&values).map_err(|e| malformed(e.to_string()))?;
    Ok(values)
}

fn unexpected(what: &'static str) -> FileMessageError {
    FileMessageError::Malformed { what, detail: "unexpected values".into() }
}

impl FileMessage {
    /// Decodes the payload of a packet with tag `tag` ([`FILE_STATUS`], [`FILE_OPEN`],
    /// [`FILE_CHUNK`] or [`FILE_END`]).
    ///
    /// # Errors
    /// [`FileMessageError`] for another tag, a payload that does not decode as the
    /// tag's format, or an unknown write mode or kind.
    pub fn decode(tag: i32, payload: &[u8]) -> Result<FileMessage, FileMessageError> {
        match tag {
            FILE_STATUS => FileStatus::decode(payload).map(FileMessage::Status),
            FILE_OPEN => match values(payload, OPEN_FORMAT, "open")?.as_slice() {
                [Value::UInt(data), Value::Str(ranks)] => {
                    let receivers = ranks
                        .parse()
                        .map_err(|e| FileMessageError::Malformed { what: "open", detail: format!("{e}") })?;
                    Ok(FileMessage::Open { data: *data, receivers })
                }
                _ => Err(unexpected("open")),
            },
            FILE_CHUNK => match values(payload, CHUNK_FORMAT, "chunk")?.as_mut_slice() {
                [Value::ULong(offset), Value::Bytes(bytes)] => {
                    Ok(FileMessage::Chunk { offset: *offset, bytes: std::mem::take(bytes) })
                }
                _ => Err(unexpected("chunk")),
            },
            FILE_END => match values(payload, END_FORMAT, "end")?.as_mut_slice() {
                [Value::Str(hash), Value::ULong(sent), Value::Str(abort)] => Ok(FileMessage::End {
                    hash: std::mem::take(hash),
                    sent: *sent,
                    abort: std::mem::take(abort),
                }),
                _ => Err(unexpected("end")),
            },
            other => Err(FileMessageError::NotAFilePacket(other)),
        }
    }
}

impl FileStatus {
    /// Decodes the payload of a [`FILE_STATUS`] packet.
    ///
    /// # Errors
    /// As [`FileMessage::decode`].
    pub fn decode(payload: &[u8]) -> Result<FileStatus, FileMessageError> {
        match values(payload, STATUS_FORMAT, "status")?.as_mut_slice() {
            [Value::Str(source), Value::ULong(mtime), Value::ULong(size), Value::Str(destination), Value::Int(mode), Value::UInt(perm), Value::Int(kind), Value::Str(target), Value::UInt(flags)] => {
                Ok(FileStatus {
                    mode: WriteMode::from_code(*mode).ok_or(FileMessageError::UnknownMode(*mode))?,
                    kind: EntryKind::from_code(*kind).ok_or(FileMessageError::UnknownKind(*kind))?,
                    source: std::mem::take(source),
                    mtime: *mtime,
                    size: *size,
                    destination: std::mem::take(destination),
                    perm: *perm,
                    target: std::mem::take(target),
                    exact: *flags & FLAG_EXACT != 0,
                    restart: *flags & FLAG_RESTART != 0,
                })
            }
            _ => Err(unexpected("status")),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_support::encode_checked;

    fn payload(format: &str, values: &[Value]) -> Vec<u8> {
        encode_checked(format, values).unwrap().1
    }

    #[test]
    fn each_packet_decodes_and_bad_ones_say_why() {
        let status = |mode: i32, kind: i32| {
            payload(
                STATUS_FORMAT,
                &[
                    Value::Str("/src".into()),
                    Value::ULong(5),
                    Value::ULong(3),
                    Value::Str("/dst".into()),
                    Value::Int(mode),
                    Value::UInt(0o640),
                    Value::Int(kind),
                    Value::Str(String::new()),
                    Value::UInt(FLAG_EXACT),
                ],
            )
        };
        let Ok(FileMessage::Status(st)) = FileMessage::decode(FILE_STATUS, &status(2, 0)) else { panic!() };
        assert_eq!(
            (st.mode, st.kind, st.exact, st.size, st.destination.as_str()),
            (WriteMode::Overwrite, EntryKind::File, true, 3, "/dst")
        );
        assert_eq!(FileMessage::decode(FILE_STATUS, &status(9, 0)), Err(FileMessageError::UnknownMode(9)));
        assert_eq!(FileMessage::decode(FILE_STATUS, &status(0, 7)), Err(FileMessageError::UnknownKind(7)));
        let open = payload(OPEN_FORMAT, &[Value::UInt(4), Value::Str("0-2,5".into())]);
        let Ok(FileMessage::Open { data: 4, receivers }) = FileMessage::decode(FILE_OPEN, &open) else {
            panic!()
        };
        assert!(receivers.contains(5) && !receivers.contains(3));
        let bad_ranks = payload(OPEN_FORMAT, &[Value::UInt(4), Value::Str("2-1".into())]);
        assert!(matches!(
            FileMessage::decode(FILE_OPEN, &bad_ranks),
            Err(FileMessageError::Malformed { what: "open", .. })
        ));
        let chunk = payload(CHUNK_FORMAT, &[Value::ULong(7), Value::Bytes(b"ab".to_vec())]);
        assert_eq!(
            FileMessage::decode(FILE_CHUNK, &chunk),
            Ok(FileMessage::Chunk { offset: 7, bytes: b"ab".to_vec() })
        );
        let err = FileMessage::decode(FILE_END, &chunk).unwrap_err();
        assert!(err.to_string().starts_with("malformed end packet: "), "{err}");
        assert_eq!(FileMessage::decode(3, &chunk), Err(FileMessageError::NotAFilePacket(3)));
    }
}
