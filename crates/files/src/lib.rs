//! File distribution on top of the treecast API: [`bcast_files`] and [`bcast_file`]
//! on the front-end (over a [`treecast_api::Network`]), [`FileReceivers`] (one
//! [`FileReceiver`] per transfer) and the [`FileWorker`] thread that writes on the
//! back-ends (fed the packets a [`treecast_api::BackEnd`] receives).
//!
//! One transfer (one file, symbolic link or directory's attributes) takes two streams.
//! Both reduce answers with equivalence classes (ranks with equal answers travel as
//! one class) and a time-out synchronization, so a rank that does not answer holds
//! up no other rank's answer for long.
//!
//! 1. The *status stream*, over every rank of the communicator:
//!    * [`FILE_STATUS`] `%s %uld %uld %s %d %ud %d %s %ud`: absolute source path, mtime
//!      (ns since the epoch), size, destination path, write mode ([`WriteMode::code`]),
//!      mode bits, kind ([`EntryKind::code`]: 0 file, 1 symbolic link, 2 directory
//!      attributes), the link's target (empty unless a link) and flags (bit 0: the
//!      destination is exact, so an existing directory there is an error rather than
//!      the place to put the file under the source's name).
//!    * Every rank answers at once, on the status stream with tag [`FILE_STATUS`],
//!      `%s %s`: `receive` (empty detail) when it wants the data, or its final
//!      outcome ([`Outcome::word`]) and a detail that names no rank. Links and
//!      directory attributes are applied here; they never take the data phase.
//!    * [`FILE_OPEN`] `%ud %s`: the id of the data stream (0 when no rank receives)
//!      and the receiving ranks (`0-15,32`). A rank that wanted the data but is not
//!      among them (it answered too late) drops its temporary file. No answer.
//! 2. The *data stream*, over the receiving ranks only, made only when there are any:
//!    * [`FILE_CHUNK`] `%uld %b`: offset and bytes, in order, each at most the chunk size.
//!    * [`FILE_END`] `%s %uld %s`: BLAKE3 of the whole content (hex), bytes sent, and
//!      an abort reason (empty when the source was read completely).
//!    * Every receiving rank answers once, with tag [`FILE_END`], `%s %s`: outcome
//!      word and detail.
//!
//! The checksum travels in [`FILE_END`] rather than in the status packet so the source
//! is read only once. Ranks lost in either phase are reported as lost; ranks still
//! connected that do not answer within [`FileOptions::timeout`] are reported as
//! failed ("no answer within …").

use std::path::PathBuf;
use std::time::{Duration, UNIX_EPOCH};

use treecast_wire::RankSet;

use treecast_api::SourceError;

mod message;
mod receive;
mod send;
mod worker;

#[cfg(test)]
mod test_support {
    use treecast_api::{ApiError, Value};
    use treecast_wire::{encode_values, Format};

    /// Encodes `values` after checking them against `format`, as a stream's `send` does.
    pub(crate) fn encode_checked(format: &str, values: &[Value]) -> Result<(Format, Vec<u8>), ApiError> {
        let fmt = Format::parse(format)?;
        fmt.check(values)?;
        let mut payload = Vec::with_capacity(values.len() * 8 + 8);
        encode_values(values, &mut payload);
        Ok((fmt, payload))
    }
}

pub use message::{FileMessage, FileMessageError, FileStatus};
pub use receive::{Decision, FileAnswer, FileReceiver, FileReceivers};
pub use send::{bcast_file, bcast_files, FileEntry, Progress};
pub use worker::FileWorker;

use treecast_wire::requests::FIRST_RESERVED_TAG;

/// Tag of the status packet that opens a transfer, and of every rank's first answer.
pub const FILE_STATUS: i32 = FIRST_RESERVED_TAG + 16;
/// Tag of a data chunk.
pub const FILE_CHUNK: i32 = FIRST_RESERVED_TAG + 17;
/// Tag of the packet that ends a transfer, and of every receiving rank's final answer.
pub const FILE_END: i32 = FIRST_RESERVED_TAG + 18;
/// Tag of the packet that ends the status phase: which ranks receive, on which stream.
pub const FILE_OPEN: i32 = FIRST_RESERVED_TAG + 19;
// The api's errors name these limits (`SourceError`), and its largest frame is
// sized to carry a default chunk: they are defined there.
pub use treecast_api::{DEFAULT_CHUNK, DEFAULT_TIMEOUT, MAX_CHUNK, MAX_TIMEOUT};

const STATUS_FORMAT: &str = "%s %uld %uld %s %d %ud %d %s %ud";
/// Status flag: the destination is the file's own path ([`FileEntry::file_at`]).
const FLAG_EXACT: u32 = 1;
/// Status flag: the status is sent again, on the data stream, to a rank whose
/// [`FILE_OPEN`] went with a lost comm node; it answers only at the end packet.
const FLAG_RESTART: u32 = 2;
const OPEN_FORMAT: &str = "%ud %s";
const CHUNK_FORMAT: &str = "%uld %b";
const END_FORMAT: &str = "%s %uld %s";
const ANSWER_FORMAT: &str = "%s %s";
/// The answer to a status packet of a rank that wants the data.
const RECEIVE_WORD: &str = "receive";
/// The answer to an end packet of a rank that missed chunks while its comm node was
/// lost and it rejoined; the detail is the offset to send again from.
const RESUME_WORD: &str = "resume";
/// The answer to an end packet on a data stream the rank was never moved to (its
/// [`FILE_OPEN`] went with a lost comm node): send the status and every chunk again.
const RESTART_WORD: &str = "restart";

/// How [`bcast_files`] sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileOptions {
    /// What a rank does with an existing destination.
    pub mode: WriteMode,
    /// Bytes per chunk, 1 to [`MAX_CHUNK`].
    pub chunk: usize,
    /// The longest the front-end waits without progress: for the answers to the
    /// status packet, for the tree to take each chunk, and for the final answers after
    /// the last chunk (plus one second per 32 MiB of file, for flushing it to disk).
    /// The whole transfer has no limit. Ranks still connected that miss it are
    /// reported as failed with "no answer within …".
    pub timeout: Duration,
}

impl FileOptions {
    /// Checks the chunk size and the time limit, as [`bcast_files`] does before it
    /// sends anything; lets a program check its configuration before it starts a tree.
    ///
    /// # Errors
    /// [`SourceError::ChunkSize`] for a chunk of 0 or over [`MAX_CHUNK`],
    /// [`SourceError::Timeout`] for a time limit of 0 or over [`MAX_TIMEOUT`].
    pub fn validate(&self) -> Result<(), SourceError> {
        if self.chunk == 0 || self.chunk > MAX_CHUNK {
            return Err(SourceError::ChunkSize(self.chunk));
        }
        if self.timeout.is_zero() || self.timeout > MAX_TIMEOUT {
            return Err(SourceError::Timeout(self.timeout));
        }
        Ok(())
    }
}

impl Default for FileOptions {
    fn default() -> Self {
        FileOptions { mode: WriteMode::Leave, chunk: DEFAULT_CHUNK, timeout: DEFAULT_TIMEOUT }
    }
}

/// What a transfer sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum EntryKind {
    /// A regular file (a source that is a symbolic link is followed): status, then data.
    #[default]
    File,
    /// A symbolic link, recreated with the same target text (not followed).
    Symlink,
    /// The mode bits and mtime of a directory that exists on the ranks; sent after
    /// the directory's content so writing files does not change the mtime again.
    Directory,
}

impl EntryKind {
    /// The number sent in the status packet.
    pub fn code(self) -> i32 {
        match self {
            EntryKind::File => 0,
            EntryKind::Symlink => 1,
            EntryKind::Directory => 2,
        }
    }

    /// The kind a status packet's number stands for.
    pub fn from_code(code: i32) -> Option<EntryKind> {
        [EntryKind::File, EntryKind::Symlink, EntryKind::Directory].into_iter().find(|k| k.code() == code)
    }
}

/// What a back-end does when the destination already exists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// Keep an existing destination (the default).
    #[default]
    Leave,
    /// Overwrite only if the source is newer than the destination.
    Newer,
    /// Always overwrite.
    Overwrite,
}

impl WriteMode {
    /// The number sent in the status packet.
    pub fn code(self) -> i32 {
        match self {
            WriteMode::Leave => 0,
            WriteMode::Newer => 1,
            WriteMode::Overwrite => 2,
        }
    }

    /// The mode a status packet's number stands for.
    pub fn from_code(code: i32) -> Option<WriteMode> {
        match code {
            0 => Some(WriteMode::Leave),
            1 => Some(WriteMode::Newer),
            2 => Some(WriteMode::Overwrite),
            _ => None,
        }
    }

    /// `leave`, `newer` or `overwrite`.
    pub fn name(self) -> &'static str {
        match self {
            WriteMode::Leave => "leave",
            WriteMode::Newer => "newer",
            WriteMode::Overwrite => "overwrite",
        }
    }
}

impl std::str::FromStr for WriteMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "leave" => Ok(WriteMode::Leave),
            "newer" => Ok(WriteMode::Newer),
            "overwrite" => Ok(WriteMode::Overwrite),
            _ => Err(format!("unknown write mode {s:?}: use leave, newer or overwrite")),
        }
    }
}

/// What happened to the file on some ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Outcome {
    /// Received, verified and renamed into place (a link: made; directory attributes: set).
    Written,
    /// The rank already sees the same file (shared file system, or an identical copy).
    SkippedShared,
    /// The destination exists and the write mode is `leave`.
    SkippedLeave,
    /// The destination is not older than the source and the write mode is `newer`.
    SkippedOlder,
    /// The file could not be written; the detail says why.
    Failed,
}

impl Outcome {
    /// The word sent on the wire: `written`, `skipped-shared`, `skipped-leave`, `skipped-older`, `failed`.
    pub fn word(self) -> &'static str {
        match self {
            Outcome::Written => "written",
            Outcome::SkippedShared => "skipped-shared",
            Outcome::SkippedLeave => "skipped-leave",
            Outcome::SkippedOlder => "skipped-older",
            Outcome::Failed => "failed",
        }
    }

    /// The outcome a word stands for.
    pub fn from_word(word: &str) -> Option<Outcome> {
        [
            Outcome::Written,
            Outcome::SkippedShared,
            Outcome::SkippedLeave,
            Outcome::SkippedOlder,
            Outcome::Failed,
        ]
        .into_iter()
        .find(|o| o.word() == word)
    }
}

/// One outcome and the ranks that had it.
#[derive(Debug, Clone, PartialEq)]
pub struct RankOutcome {
    /// What happened.
    pub outcome: Outcome,
    /// Why (empty for a plain success).
    pub detail: String,
    /// The ranks.
    pub ranks: RankSet,
}

/// The result of one transfer of [`bcast_files`] or [`bcast_file`].
#[derive(Debug, Clone, PartialEq)]
pub struct FileReport {
    /// What was sent.
    pub kind: EntryKind,
    /// The absolute source path.
    pub source: PathBuf,
    /// The destination path sent to the ranks.
    pub destination: PathBuf,
    /// Bytes in the file (0 for a link or a directory).
    pub size: u64,
    /// BLAKE3 of the content, hex (empty for a link or a directory).
    pub hash: String,
    /// Ranks that took the data phase (empty when every rank decided at the status).
    pub receivers: RankSet,
    /// Outcomes, grouped, in the order of [`Outcome`] then lowest rank.
    pub outcomes: Vec<RankOutcome>,
    /// Ranks whose link was lost before they answered, with the reason.
    pub lost: Vec<(RankSet, String)>,
    /// Time from the status packet to the last answer.
    pub elapsed: Duration,
}

impl FileReport {
    /// True when no rank failed and none was lost.
    pub fn ok(&self) -> bool {
        self.lost.is_empty() && self.outcomes.iter().all(|o| o.outcome != Outcome::Failed)
    }

    /// Every rank that had `outcome`.
    pub fn ranks_with(&self, outcome: Outcome) -> RankSet {
        let mut set = RankSet::new();
        for o in self.outcomes.iter().filter(|o| o.outcome == outcome) {
            set.union_with(&o.ranks);
        }
        set
    }

    /// Every rank that was lost.
    pub fn lost_ranks(&self) -> RankSet {
        let mut set = RankSet::new();
        for (r, _) in &self.lost {
            set.union_with(r);
        }
        set
    }
}

// Errors name a file's kind the same way in the api (attach files) and here.
pub(crate) use treecast_api::file_kind as kind_of;

pub(crate) fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}
