//! File distribution: [`bcast_file`] on the front-end, [`FileReceiver`] on the back-ends.
//!
//! Protocol, on one stream (wait for all, equivalence classes up, null filter down):
//! * [`FILE_STATUS`] `%s %uld %uld %s %d %ud`: absolute source path, mtime (ns since
//!   the epoch), size, destination path, write mode ([`WriteMode::code`]), mode bits.
//! * [`FILE_CHUNK`] `%uld %b`: offset and bytes, in order, each at most the chunk size.
//! * [`FILE_END`] `%s %uld %s`: BLAKE3 of the whole content (hex), bytes sent, and an
//!   abort reason (empty when the source was read completely).
//!
//! Every back-end answers once, on the same stream with tag [`FILE_END`], `%s %s`:
//! an outcome word ([`Outcome::word`]) and a detail message that names no rank, so
//! the equivalence-class filter groups ranks by outcome. A back-end that decides
//! at the status packet (skip, or fail before writing) answers right away and
//! ignores the chunks; the others answer after [`FILE_END`].

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, UNIX_EPOCH};

use tokio::io::AsyncReadExt;
use treecast_wire::{RankSet, SyncMode, TransformKind, Value};

use crate::{ApiError, Communicator, Event, Network, Packet, StreamOptions};

/// Tag of the status packet that opens a transfer.
pub const FILE_STATUS: i32 = 16;
/// Tag of a data chunk.
pub const FILE_CHUNK: i32 = 17;
/// Tag of the packet that ends a transfer, and of every back-end's answer.
pub const FILE_END: i32 = 18;
/// Default chunk size: 1 MiB.
pub const DEFAULT_CHUNK: usize = 1 << 20;
/// Largest chunk size accepted (frames carry at most 256 MiB).
pub const MAX_CHUNK: usize = 64 << 20;

const STATUS_FORMAT: &str = "%s %uld %uld %s %d %ud";
const CHUNK_FORMAT: &str = "%uld %b";
const END_FORMAT: &str = "%s %uld %s";
const ANSWER_FORMAT: &str = "%s %s";

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
    /// Received, verified and renamed into place.
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

/// The result of [`bcast_file`].
#[derive(Debug, Clone, PartialEq)]
pub struct FileReport {
    /// The absolute source path.
    pub source: PathBuf,
    /// The destination path sent to the ranks.
    pub destination: PathBuf,
    /// Bytes in the file.
    pub size: u64,
    /// BLAKE3 of the content, hex.
    pub hash: String,
    /// Outcomes, grouped, in the order of [`Outcome`] then lowest rank.
    pub outcomes: Vec<RankOutcome>,
    /// Ranks that never answered, with the reason.
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

/// Why a file cannot be sent: every cause is found on the front-end before anything
/// is sent for that file.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SourceError {
    /// The chunk size is 0 or over [`MAX_CHUNK`].
    #[error("chunk size {0} is not between 1 and {MAX_CHUNK} bytes: pick a size in that range (default {DEFAULT_CHUNK})")]
    ChunkSize(usize),
    /// A path could not be made absolute (the working directory is gone).
    #[error("cannot make {path} absolute: {source}; give an absolute path")]
    Absolute {
        /// The path as given.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The source could not be opened.
    #[error("cannot open source {path}: {source}; check that it exists and is readable")]
    Open {
        /// The source.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The source's metadata (size, mtime, mode) could not be read.
    #[error("cannot stat source {path}: {source}")]
    Stat {
        /// The source.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
    /// The source is not a regular file (a directory, a device …).
    #[error("source {path} is not a regular file ({kind}); send directories with `treecast bcast -r`")]
    NotAFile {
        /// The source.
        path: PathBuf,
        /// What it is.
        kind: &'static str,
    },
    /// A source or destination path is not valid UTF-8, which the status packet needs.
    #[error("path {0} is not valid UTF-8: rename it, or send it under a UTF-8 destination name")]
    NotUtf8(PathBuf),
}

fn kind_of(t: std::fs::FileType) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    if t.is_dir() {
        "a directory"
    } else if t.is_symlink() {
        "a symbolic link"
    } else if t.is_fifo() {
        "a fifo"
    } else if t.is_socket() {
        "a socket"
    } else if t.is_block_device() || t.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}

fn mtime_ns(meta: &std::fs::Metadata) -> u64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Sends the file `src` to every rank of `comm`, to `dst` (default: the same absolute path).
///
/// See [`bcast_file_with_progress`].
///
/// # Errors
/// As [`bcast_file_with_progress`].
///
/// Cancel safety: not cancel safe; ranks keep a temporary file until the stream closes.
pub async fn bcast_file(
    net: &mut Network,
    comm: &Communicator,
    src: &Path,
    dst: Option<&Path>,
    mode: WriteMode,
    chunk: usize,
) -> Result<FileReport, ApiError> {
    bcast_file_with_progress(net, comm, src, dst, mode, chunk, |_, _| {}).await
}

/// [`bcast_file`], calling `progress(bytes sent, size)` after each chunk.
///
/// A relative `dst` is made absolute against this process's working directory; a `dst`
/// that is an existing directory on a rank receives the file under the source's name.
/// Per-rank failures (no space, permission, checksum mismatch, missing destination
/// directory) and lost ranks are in the report, not errors.
///
/// # Errors
/// [`ApiError::Source`] when the source is not a readable regular file, a path is not
/// UTF-8 or `chunk` is 0 or over [`MAX_CHUNK`] (nothing is sent then); an error of the
/// network when it is gone, or an answer is malformed.
///
/// Cancel safety: not cancel safe.
pub async fn bcast_file_with_progress(
    net: &mut Network,
    comm: &Communicator,
    src: &Path,
    dst: Option<&Path>,
    mode: WriteMode,
    chunk: usize,
    mut progress: impl FnMut(u64, u64),
) -> Result<FileReport, ApiError> {
    if chunk == 0 || chunk > MAX_CHUNK {
        return Err(SourceError::ChunkSize(chunk).into());
    }
    let absolute =
        |p: &Path| std::path::absolute(p).map_err(|source| SourceError::Absolute { path: p.into(), source });
    let source = absolute(src)?;
    let destination = match dst {
        Some(d) => absolute(d)?,
        None => source.clone(),
    };
    let mut file = tokio::fs::File::open(&source)
        .await
        .map_err(|e| SourceError::Open { path: source.clone(), source: e })?;
    let meta = file.metadata().await.map_err(|e| SourceError::Stat { path: source.clone(), source: e })?;
    if !meta.is_file() {
        return Err(SourceError::NotAFile { path: source, kind: kind_of(meta.file_type()) }.into());
    }
    let size = meta.len();
    let mtime = mtime_ns(&meta);
    let perm = meta.permissions().mode() & 0o7777;
    let utf8 = |p: &Path| p.to_str().map(str::to_owned).ok_or_else(|| SourceError::NotUtf8(p.into()));
    let (src_text, dst_text) = (utf8(&source)?, utf8(&destination)?);

    let started = Instant::now();
    let options =
        StreamOptions { sync: SyncMode::WaitForAll, up: TransformKind::EqClass, down: TransformKind::Null };
    let mut stream = net.new_stream(comm, options).await?;
    let status = [
        Value::Str(src_text),
        Value::ULong(mtime),
        Value::ULong(size),
        Value::Str(dst_text),
        Value::Int(mode.code()),
        Value::UInt(perm),
    ];
    stream.send(FILE_STATUS, STATUS_FORMAT, &status).await?;

    let mut hasher = blake3::Hasher::new();
    let mut sent: u64 = 0;
    let mut abort = String::new();
    let mut buf = vec![0u8; chunk];
    loop {
        // Fill a whole chunk (short reads happen), so chunks are fixed-size but the last.
        let mut filled = 0;
        while filled < chunk {
            match file.read(&mut buf[filled..]).await {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) => {
                    abort = format!("reading the source failed after {} bytes: {e}", sent + filled as u64);
                    break;
                }
            }
        }
        if !abort.is_empty() {
            break;
        }
        if filled == 0 {
            break;
        }
        if sent + filled as u64 > size {
            abort = format!("the source grew during the transfer (past {size} bytes)");
            break;
        }
        hasher.update(&buf[..filled]);
        let values = [Value::ULong(sent), Value::Bytes(buf[..filled].to_vec())];
        stream.send(FILE_CHUNK, CHUNK_FORMAT, &values).await?;
        sent += filled as u64;
        progress(sent, size);
        if filled < chunk {
            break;
        }
    }
    if abort.is_empty() && sent != size {
        abort = format!("the source shrank during the transfer ({sent} of {size} bytes)");
    }
    let hash = hasher.finalize().to_hex().to_string();
    stream
        .send(FILE_END, END_FORMAT, &[Value::Str(hash.clone()), Value::ULong(sent), Value::Str(abort)])
        .await?;

    let mut outcomes = Vec::new();
    let mut answered = RankSet::new();
    match stream.recv().await {
        Ok(packet) => {
            for class in packet.eq_classes()? {
                let [Value::Str(word), Value::Str(detail)] = class.values.as_slice() else {
                    return Err(ApiError::Env(format!("malformed file answer from ranks {}", class.ranks)));
                };
                let outcome = Outcome::from_word(word).unwrap_or(Outcome::Failed);
                let detail = if Outcome::from_word(word).is_some() {
                    detail.clone()
                } else {
                    format!("unknown outcome {word:?}: {detail}")
                };
                answered.union_with(&class.ranks);
                outcomes.push(RankOutcome { outcome, detail, ranks: class.ranks });
            }
        }
        Err(ApiError::StreamClosed(_)) => {}
        Err(e) => return Err(e),
    }
    stream.close().await;
    outcomes.sort_by_key(|o| (o.outcome, o.ranks.first()));

    let mut lost: Vec<(RankSet, String)> = Vec::new();
    let mut missing = comm.ranks().difference(&answered);
    while let Some(event) = net.try_event() {
        if let Event::RanksLost { ranks, reason } = event {
            let mine = ranks.intersection(&missing);
            if !mine.is_empty() {
                missing = missing.difference(&mine);
                lost.push((mine, reason));
            }
        }
    }
    if !missing.is_empty() {
        lost.push((missing, "no answer (lost earlier or the stream closed)".into()));
    }
    Ok(FileReport { source, destination, size, hash, outcomes, lost, elapsed: started.elapsed() })
}

/// What a back-end decided on a status packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Receive the chunks; answer after [`FILE_END`].
    Receive,
    /// Answer now with this outcome and detail, and ignore the rest of the transfer.
    Answer(Outcome, String),
}

struct Incoming {
    tmp: PathBuf,
    dst: PathBuf,
    file: File,
    hasher: blake3::Hasher,
    written: u64,
}

enum State {
    Idle,
    Answered,
    Receiving(Box<Incoming>),
    Failed(String),
}

/// The back-end side of one transfer: a state machine fed with the stream's packets in order.
///
/// Data goes to a temporary file in the destination directory, which is renamed over
/// the destination only after the checksum matched; dropping a receiver before that
/// removes the temporary file.
pub struct FileReceiver {
    size: u64,
    mtime: u64,
    perm: u32,
    state: State,
}

impl std::fmt::Debug for FileReceiver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Idle => "idle",
            State::Answered => "answered",
            State::Receiving(_) => "receiving",
            State::Failed(_) => "failed",
        };
        f.debug_struct("FileReceiver").field("size", &self.size).field("state", &state).finish()
    }
}

impl Default for FileReceiver {
    fn default() -> Self {
        Self::new()
    }
}

fn failed(detail: String) -> Decision {
    Decision::Answer(Outcome::Failed, detail)
}

impl FileReceiver {
    /// A receiver waiting for its status packet.
    pub fn new() -> Self {
        FileReceiver { size: 0, mtime: 0, perm: 0o644, state: State::Idle }
    }

    /// Reads a [`FILE_STATUS`] packet and decides; `tag` is a name for the temporary file
    /// (e.g. the stream id), unique among this process's transfers.
    pub fn on_status(&mut self, packet: &Packet, tag: u32) -> Decision {
        let decision = match packet.unpack(STATUS_FORMAT) {
            Ok(v) => match v.as_slice() {
                [Value::Str(src), Value::ULong(mtime), Value::ULong(size), Value::Str(dst), Value::Int(mode), Value::UInt(perm)] =>
                {
                    self.size = *size;
                    self.mtime = *mtime;
                    self.perm = *perm;
                    match WriteMode::from_code(*mode) {
                        Some(mode) => self.decide(Path::new(src), Path::new(dst), mode, tag),
                        None => failed(format!("unknown write mode {mode}")),
                    }
                }
                _ => failed("malformed status packet".into()),
            },
            Err(e) => failed(format!("malformed status packet: {e}")),
        };
        if let Decision::Answer(..) = decision {
            self.state = State::Answered;
        }
        decision
    }

    fn decide(&mut self, src: &Path, dst: &Path, mode: WriteMode, tag: u32) -> Decision {
        // A destination that is an existing directory receives the file under its own name.
        let dst = match std::fs::metadata(dst) {
            Ok(m) if m.is_dir() => match src.file_name() {
                Some(name) => dst.join(name),
                None => return failed(format!("source {} has no file name", src.display())),
            },
            _ => dst.to_path_buf(),
        };
        match std::fs::metadata(&dst) {
            Ok(m) if m.is_dir() => {
                return failed(format!("destination {} is a directory", dst.display()));
            }
            Ok(m) if m.len() == self.size && mtime_ns(&m) == self.mtime => {
                let detail = if dst == src {
                    "the same file is already at this path (shared file system)".to_owned()
                } else {
                    format!("{} already has the same size and mtime", dst.display())
                };
                return Decision::Answer(Outcome::SkippedShared, detail);
            }
            Ok(m) => match mode {
                WriteMode::Leave => {
                    return Decision::Answer(
                        Outcome::SkippedLeave,
                        format!("{} exists (write mode leave)", dst.display()),
                    );
                }
                WriteMode::Newer if mtime_ns(&m) >= self.mtime => {
                    return Decision::Answer(
                        Outcome::SkippedOlder,
                        format!("{} is not older than the source (write mode newer)", dst.display()),
                    );
                }
                _ => {}
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return failed(format!("cannot stat {}: {e}", dst.display())),
        }
        let (Some(dir), Some(name)) = (dst.parent(), dst.file_name()) else {
            return failed(format!("destination {} has no parent directory", dst.display()));
        };
        match std::fs::metadata(dir) {
            Ok(m) if m.is_dir() => {}
            Ok(_) => return failed(format!("destination directory {} is not a directory", dir.display())),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return failed(format!("destination directory {} does not exist", dir.display()));
            }
            Err(e) => return failed(format!("destination directory {}: {e}", dir.display())),
        }
        let tmp = dir.join(format!(".{}.treecast-{}-{tag}.tmp", name.to_string_lossy(), std::process::id()));
        let file = match OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp) {
            Ok(f) => f,
            Err(e) => return failed(format!("cannot create a file in {}: {e}", dir.display())),
        };
        self.state = State::Receiving(Box::new(Incoming {
            tmp,
            dst,
            file,
            hasher: blake3::Hasher::new(),
            written: 0,
        }));
        Decision::Receive
    }

    /// Writes a [`FILE_CHUNK`] packet; errors are kept for the answer at the end.
    pub fn on_chunk(&mut self, packet: &Packet) {
        let State::Receiving(inc) = &mut self.state else { return };
        let result = match packet.unpack(CHUNK_FORMAT) {
            Ok(v) => match v.as_slice() {
                [Value::ULong(offset), Value::Bytes(data)] if *offset == inc.written => {
                    if inc.written + data.len() as u64 > self.size {
                        Err(format!("more data than the announced {} bytes", self.size))
                    } else {
                        inc.hasher.update(data);
                        inc.written += data.len() as u64;
                        inc.file.write_all(data).map_err(|e| format!("writing {}: {e}", inc.dst.display()))
                    }
                }
                [Value::ULong(offset), Value::Bytes(_)] => {
                    Err(format!("chunk at offset {offset} arrived while expecting {}", inc.written))
                }
                _ => Err("malformed chunk packet".into()),
            },
            Err(e) => Err(format!("malformed chunk packet: {e}")),
        };
        if let Err(detail) = result {
            self.fail(detail);
        }
    }

    fn fail(&mut self, detail: String) {
        if let State::Receiving(inc) = std::mem::replace(&mut self.state, State::Failed(detail)) {
            let Incoming { tmp, file, .. } = *inc;
            drop(file);
            let _ = std::fs::remove_file(tmp);
        }
    }

    /// Reads the [`FILE_END`] packet, verifies and renames into place. Returns the
    /// answer to send, or `None` if it was already sent after the status packet.
    pub fn on_end(&mut self, packet: &Packet) -> Option<(Outcome, String)> {
        match &self.state {
            State::Answered => return None,
            State::Idle => return Some((Outcome::Failed, "the transfer ended before its status".into())),
            _ => {}
        }
        if let State::Receiving(_) = self.state {
            if let Err(detail) = self.verify(packet) {
                self.fail(detail);
            }
        }
        let answer = match std::mem::replace(&mut self.state, State::Answered) {
            State::Failed(detail) => (Outcome::Failed, detail),
            State::Receiving(inc) => match self.finish(*inc) {
                Ok(()) => (Outcome::Written, String::new()),
                Err(detail) => (Outcome::Failed, detail),
            },
            State::Idle | State::Answered => return None,
        };
        Some(answer)
    }

    fn verify(&self, packet: &Packet) -> Result<(), String> {
        let State::Receiving(inc) = &self.state else { return Ok(()) };
        let v = packet.unpack(END_FORMAT).map_err(|e| format!("malformed end packet: {e}"))?;
        let [Value::Str(hash), Value::ULong(sent), Value::Str(abort)] = v.as_slice() else {
            return Err("malformed end packet".into());
        };
        if !abort.is_empty() {
            return Err(format!("the front-end aborted: {abort}"));
        }
        if *sent != inc.written || inc.written != self.size {
            return Err(format!(
                "received {} bytes, the front-end sent {sent}, the file has {}",
                inc.written, self.size
            ));
        }
        let mine = inc.hasher.finalize().to_hex();
        if mine.as_str() != hash {
            return Err(format!("checksum mismatch (BLAKE3 {mine}, expected {hash})"));
        }
        Ok(())
    }

    fn finish(&self, inc: Incoming) -> Result<(), String> {
        let Incoming { tmp, dst, file, .. } = inc;
        let result = (|| {
            let time = UNIX_EPOCH + Duration::from_nanos(self.mtime);
            file.set_permissions(std::fs::Permissions::from_mode(self.perm))
                .map_err(|e| format!("setting the mode of {}: {e}", dst.display()))?;
            file.set_modified(time).map_err(|e| format!("setting the mtime of {}: {e}", dst.display()))?;
            file.sync_all().map_err(|e| format!("writing {}: {e}", dst.display()))?;
            drop(file);
            std::fs::rename(&tmp, &dst).map_err(|e| format!("renaming into {}: {e}", dst.display()))
        })();
        if result.is_err() {
            let _ = std::fs::remove_file(&tmp);
        }
        result
    }
}

impl Drop for FileReceiver {
    fn drop(&mut self) {
        if let State::Receiving(inc) = &self.state {
            let _ = std::fs::remove_file(&inc.tmp);
        }
    }
}

/// The answer a back-end sends for a transfer: `(format, values)` on tag [`FILE_END`].
pub fn file_answer(outcome: Outcome, detail: &str) -> (&'static str, [Value; 2]) {
    (ANSWER_FORMAT, [Value::Str(outcome.word().to_owned()), Value::Str(detail.to_owned())])
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use treecast_wire::{Frame, FrameHeader};

    use super::*;
    use crate::network::encode_checked;

    fn packet(tag: i32, format: &str, values: &[Value]) -> Packet {
        let (_, payload) = encode_checked(format, values).unwrap();
        Packet::from_frame(Frame::new(FrameHeader::data(1, tag, 0), payload))
    }

    fn dir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("treecast-receiver-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    fn status(dst: &Path, size: u64, mode: WriteMode) -> Packet {
        let values = [
            Value::Str("/nonexistent/src".into()),
            Value::ULong(1_000_000_000),
            Value::ULong(size),
            Value::Str(dst.to_str().unwrap().into()),
            Value::Int(mode.code()),
            Value::UInt(0o640),
        ];
        packet(FILE_STATUS, STATUS_FORMAT, &values)
    }

    fn chunk(offset: u64, data: &[u8]) -> Packet {
        packet(FILE_CHUNK, CHUNK_FORMAT, &[Value::ULong(offset), Value::Bytes(data.to_vec())])
    }

    fn end(hash: &str, sent: u64, abort: &str) -> Packet {
        packet(FILE_END, END_FORMAT, &[Value::Str(hash.into()), Value::ULong(sent), Value::Str(abort.into())])
    }

    fn entries(d: &Path) -> usize {
        std::fs::read_dir(d).unwrap().count()
    }

    #[test]
    fn a_verified_file_is_renamed_into_place_with_its_mode_and_mtime() {
        let d = dir("ok");
        let dst = d.join("f");
        let mut r = FileReceiver::new();
        assert_eq!(r.on_status(&status(&dst, 6, WriteMode::Leave), 1), Decision::Receive);
        r.on_chunk(&chunk(0, b"abc"));
        r.on_chunk(&chunk(3, b"def"));
        assert!(!dst.exists(), "nothing under the destination name before the end");
        let hash = blake3::hash(b"abcdef").to_hex().to_string();
        assert_eq!(r.on_end(&end(&hash, 6, "")), Some((Outcome::Written, String::new())));
        assert_eq!(std::fs::read(&dst).unwrap(), b"abcdef");
        let meta = std::fs::metadata(&dst).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        assert_eq!(mtime_ns(&meta), 1_000_000_000);
        assert_eq!(entries(&d), 1);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_checksum_mismatch_fails_and_leaves_nothing() {
        let d = dir("mismatch");
        let dst = d.join("f");
        let mut r = FileReceiver::new();
        r.on_status(&status(&dst, 3, WriteMode::Leave), 1);
        r.on_chunk(&chunk(0, b"abc"));
        let wrong = blake3::hash(b"abd").to_hex().to_string();
        let (outcome, detail) = r.on_end(&end(&wrong, 3, "")).unwrap();
        assert_eq!(outcome, Outcome::Failed);
        assert!(detail.contains("checksum mismatch"), "{detail}");
        assert_eq!(entries(&d), 0);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn out_of_order_chunks_an_abort_or_a_drop_leave_nothing() {
        let d = dir("order");
        let dst = d.join("f");
        let mut r = FileReceiver::new();
        r.on_status(&status(&dst, 6, WriteMode::Leave), 1);
        r.on_chunk(&chunk(3, b"def"));
        let (outcome, detail) = r.on_end(&end("x", 6, "")).unwrap();
        assert_eq!(outcome, Outcome::Failed);
        assert!(detail.contains("offset 3"), "{detail}");
        assert_eq!(entries(&d), 0);

        let mut r = FileReceiver::new();
        r.on_status(&status(&dst, 6, WriteMode::Leave), 2);
        r.on_chunk(&chunk(0, b"abc"));
        let (outcome, detail) = r.on_end(&end("x", 3, "the source shrank")).unwrap();
        assert_eq!(outcome, Outcome::Failed);
        assert!(detail.contains("the source shrank"), "{detail}");
        assert_eq!(entries(&d), 0);

        let mut r = FileReceiver::new();
        r.on_status(&status(&dst, 6, WriteMode::Leave), 3);
        r.on_chunk(&chunk(0, b"abc"));
        assert_eq!(entries(&d), 1);
        drop(r);
        assert_eq!(entries(&d), 0);
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn a_skip_is_answered_once_at_the_status() {
        let d = dir("skip");
        let dst = d.join("f");
        std::fs::write(&dst, b"old").unwrap();
        let mut r = FileReceiver::new();
        let decision = r.on_status(&status(&dst, 6, WriteMode::Leave), 1);
        assert!(matches!(decision, Decision::Answer(Outcome::SkippedLeave, _)), "{decision:?}");
        r.on_chunk(&chunk(0, b"abcdef"));
        assert_eq!(r.on_end(&end("x", 6, "")), None);
        assert_eq!(std::fs::read(&dst).unwrap(), b"old");
        let _ = std::fs::remove_dir_all(d);
    }

    #[test]
    fn words_and_modes_round_trip() {
        for o in [
            Outcome::Written,
            Outcome::SkippedShared,
            Outcome::SkippedLeave,
            Outcome::SkippedOlder,
            Outcome::Failed,
        ] {
            assert_eq!(Outcome::from_word(o.word()), Some(o));
        }
        for m in [WriteMode::Leave, WriteMode::Newer, WriteMode::Overwrite] {
            assert_eq!(WriteMode::from_code(m.code()), Some(m));
            assert_eq!(m.name().parse::<WriteMode>(), Ok(m));
        }
    }
}
