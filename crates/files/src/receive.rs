//! The back-end side: [`FileReceiver`] per transfer, [`FileReceivers`] for all of a
//! back-end's transfers. Plain state machines: packets in, answers out, no network I/O.

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

use treecast_wire::Value;

use super::message::{FileMessage, FileStatus};
use super::{
    mtime_ns, EntryKind, Outcome, WriteMode, ANSWER_FORMAT, FILE_CHUNK, FILE_END, FILE_OPEN, FILE_STATUS,
    RECEIVE_WORD, RESTART_WORD, RESUME_WORD,
};
use treecast_api::Packet;

/// What a back-end decided on a status packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Wants the data: answers `receive`, then its outcome after [`FILE_END`].
    Receive,
    /// Done at the status: this outcome and detail are its only answer.
    Answer(Outcome, String),
}

struct Incoming {
    tmp: PathBuf,
    dst: PathBuf,
    file: File,
    hasher: blake3::Hasher,
    written: u64,
    /// Write mode `leave`: the file is linked into place only if nothing is there yet.
    leave: bool,
    /// The destination is the source's own path (what a shared file system looks like).
    same_path: bool,
}

enum State {
    Idle,
    Answered,
    Receiving(Box<Incoming>),
    Failed(String),
}

/// The back-end side of one transfer: a state machine fed with its packets in order.
///
/// Data goes to a temporary file in the destination directory, which is renamed over
/// the destination only after the checksum matched; dropping a receiver before that
/// removes the temporary file. Links and directory attributes are applied at the status.
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

/// The fields of a status packet.
struct Status<'a> {
    src: &'a Path,
    dst: &'a Path,
    mode: WriteMode,
    kind: EntryKind,
    target: &'a str,
    /// The destination is the file's own path: an existing directory there is an error.
    exact: bool,
}

impl FileReceiver {
    /// A receiver waiting for its status packet.
    pub fn new() -> Self {
        FileReceiver { size: 0, mtime: 0, perm: 0o644, state: State::Idle }
    }

    /// Reads a [`FILE_STATUS`] packet and decides; `tag` is a name for the temporary file
    /// (e.g. the stream id), unique among this process's transfers. Links and directory
    /// attributes are applied here.
    pub fn on_status(&mut self, packet: &Packet, tag: u32) -> Decision {
        let decision = match FileStatus::decode(packet.payload()) {
            Ok(st) => {
                self.size = st.size;
                self.mtime = st.mtime;
                self.perm = st.perm;
                let (src, dst) = (Path::new(&st.source), Path::new(&st.destination));
                let status =
                    Status { src, dst, mode: st.mode, kind: st.kind, target: &st.target, exact: st.exact };
                self.decide(&status, tag)
            }
            Err(e) => failed(e.to_string()),
        };
        if let Decision::Answer(..) = decision {
            self.state = State::Answered;
        }
        decision
    }

    fn decide(&mut self, s: &Status<'_>, tag: u32) -> Decision {
        match s.kind {
            EntryKind::File => self.decide_file(s, tag),
            EntryKind::Symlink => self.make_link(s.dst, s.target, s.mode, tag),
            EntryKind::Directory => self.set_directory(s.dst),
        }
    }

    /// Skips for an existing destination `m` according to the write mode; `None` to write.
    fn skip_existing(&self, dst: &Path, m: &std::fs::Metadata, mode: WriteMode) -> Option<Decision> {
        match mode {
            WriteMode::Leave => Some(Decision::Answer(
                Outcome::SkippedLeave,
                format!("{} exists (write mode leave)", dst.display()),
            )),
            WriteMode::Newer if mtime_ns(m) >= self.mtime => Some(Decision::Answer(
                Outcome::SkippedOlder,
                format!("{} is not older than the source (write mode newer)", dst.display()),
            )),
            _ => None,
        }
    }

    fn decide_file(&mut self, s: &Status<'_>, tag: u32) -> Decision {
        let (src, mode) = (s.src, s.mode);
        // Unless the destination is exact, an existing directory there receives the
        // file under its own name.
        let dst = match std::fs::metadata(s.dst) {
            Ok(m) if m.is_dir() && !s.exact => match src.file_name() {
                Some(name) => s.dst.join(name),
                None => return failed(format!("source {} has no file name", src.display())),
            },
            _ => s.dst.to_path_buf(),
        };
        match std::fs::metadata(&dst) {
            Ok(m) if m.is_dir() => {
                return failed(format!(
                    "destination {} is a directory (remove it, or send to another path)",
                    dst.display()
                ));
            }
            Ok(m) if self.is_same(&m) => {
                return Decision::Answer(Outcome::SkippedShared, same_detail(&dst, dst == src));
            }
            Ok(m) => {
                if let Some(skip) = self.skip_existing(&dst, &m, mode) {
                    return skip;
                }
            }
            // Nothing there, or a symbolic link that leads nowhere: in write mode leave
            // such a link is kept, and that is known now, before any data is sent.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if mode == WriteMode::Leave && std::fs::symlink_metadata(&dst).is_ok() {
                    let detail = format!(
                        "{} exists (a symbolic link that leads nowhere; write mode leave)",
                        dst.display()
                    );
                    return Decision::Answer(Outcome::SkippedLeave, detail);
                }
            }
            Err(e) => return failed(format!("cannot stat {}: {e}", dst.display())),
        }
        let (dir, tmp) = match temp_path(&dst, tag) {
            Ok(p) => p,
            Err(detail) => return failed(detail),
        };
        let file = match OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp) {
            Ok(f) => f,
            Err(e) => return failed(format!("cannot create a file in {}: {e}", dir.display())),
        };
        self.state = State::Receiving(Box::new(Incoming {
            tmp,
            same_path: dst == src,
            dst,
            file,
            hasher: blake3::Hasher::new(),
            written: 0,
            leave: mode == WriteMode::Leave,
        }));
        Decision::Receive
    }

    /// True when `m` (an existing destination) has the source's size and mtime.
    fn is_same(&self, m: &std::fs::Metadata) -> bool {
        m.len() == self.size && mtime_ns(m) == self.mtime
    }

    /// Creates (or replaces, as the write mode allows) a symbolic link to `target`.
    fn make_link(&self, dst: &Path, target: &str, mode: WriteMode, tag: u32) -> Decision {
        match std::fs::symlink_metadata(dst) {
            Ok(m) if m.is_symlink() && links_to(dst, target) => {
                let detail = format!("{} already links to {target}", dst.display());
                return Decision::Answer(Outcome::SkippedShared, detail);
            }
            Ok(m) if m.is_dir() => return failed(format!("destination {} is a directory", dst.display())),
            Ok(m) => {
                if let Some(skip) = self.skip_existing(dst, &m, mode) {
                    return skip;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return failed(format!("cannot stat {}: {e}", dst.display())),
        }
        if mode == WriteMode::Leave {
            // Made in place: creating fails if something appeared since the check
            // above, which write mode leave must not replace.
            return match std::os::unix::fs::symlink(target, dst) {
                Ok(()) => Decision::Answer(Outcome::Written, String::new()),
                // The same link, made by another rank on a shared file system.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && links_to(dst, target) => {
                    Decision::Answer(
                        Outcome::SkippedShared,
                        format!("{} already links to {target}", dst.display()),
                    )
                }
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    Decision::Answer(Outcome::SkippedLeave, appeared(dst))
                }
                Err(e) => failed(format!("cannot create the link {}: {e}", dst.display())),
            };
        }
        let (dir, tmp) = match temp_path(dst, tag) {
            Ok(p) => p,
            Err(detail) => return failed(detail),
        };
        // Made under a temporary name and renamed, so an existing file is replaced at once.
        if let Err(e) = std::os::unix::fs::symlink(target, &tmp) {
            return failed(format!("cannot create a link in {}: {e}", dir.display()));
        }
        match std::fs::rename(&tmp, dst) {
            Ok(()) => Decision::Answer(Outcome::Written, String::new()),
            Err(e) => {
                let _ = std::fs::remove_file(&tmp);
                failed(format!("renaming a link into {}: {e}", dst.display()))
            }
        }
    }

    /// Sets the mode bits and mtime of the existing directory `dst`.
    ///
    /// Everything goes through one handle, opened without following a link: a link
    /// put in place after a check cannot redirect the change, and a new mode without
    /// read permission for the owner does not keep the directory from being opened.
    fn set_directory(&self, dst: &Path) -> Decision {
        let not_dir = || failed(format!("destination {} is not a directory", dst.display()));
        let dir = match OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW)
            .open(dst)
        {
            Ok(d) => d,
            // ELOOP: a symbolic link, ENOTDIR: something else that is no directory.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ELOOP | libc::ENOTDIR)) => return not_dir(),
            Err(e) => return failed(format!("cannot open directory {}: {e}", dst.display())),
        };
        let meta = match dir.metadata() {
            Ok(m) if m.is_dir() => m,
            Ok(_) => return not_dir(),
            Err(e) => return failed(format!("cannot stat directory {}: {e}", dst.display())),
        };
        if meta.permissions().mode() & 0o7777 == self.perm && mtime_ns(&meta) == self.mtime {
            let detail = format!("{} already has the same mode and mtime", dst.display());
            return Decision::Answer(Outcome::SkippedShared, detail);
        }
        match set_mode_and_mtime(&dir, dst, self.perm, self.mtime) {
            Ok(()) => Decision::Answer(Outcome::Written, String::new()),
            Err(detail) => failed(detail),
        }
    }

    /// Writes a [`FILE_CHUNK`] packet; errors are kept for the answer at the end.
    pub fn on_chunk(&mut self, packet: &Packet) {
        let State::Receiving(inc) = &mut self.state else { return };
        let result = match FileMessage::decode(FILE_CHUNK, packet.payload()) {
            Ok(FileMessage::Chunk { offset, bytes }) if offset == inc.written => {
                if inc.written + bytes.len() as u64 > self.size {
                    Err(format!("more data than the announced {} bytes", self.size))
                } else {
                    inc.hasher.update(&bytes);
                    inc.written += bytes.len() as u64;
                    inc.file.write_all(&bytes).map_err(|e| format!("writing {}: {e}", inc.dst.display()))
                }
            }
            // The chunks before it went with a lost comm node while this rank
            // rejoined: the rest is asked for again at the end (`missing_from`).
            Ok(FileMessage::Chunk { offset, .. }) if offset > inc.written => Ok(()),
            Ok(FileMessage::Chunk { offset, .. }) => {
                Err(format!("chunk at offset {offset} arrived while expecting {}", inc.written))
            }
            Ok(_) => Err("malformed chunk packet".into()),
            Err(e) => Err(e.to_string()),
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

    /// The offset to resume from, when this end packet finds chunks missing that went
    /// with a lost comm node (the back-end answers `resume` with it); the transfer
    /// then stays open.
    pub fn missing_from(&self, packet: &Packet) -> Option<u64> {
        let State::Receiving(inc) = &self.state else { return None };
        let Ok(FileMessage::End { sent, abort, .. }) = FileMessage::decode(FILE_END, packet.payload()) else {
            return None;
        };
        // Chunks arrive in order on a stream; only a rejoin leaves some out.
        (abort.is_empty() && sent == self.size && inc.written < sent).then_some(inc.written)
    }

    /// Reads the [`FILE_END`] packet, verifies and renames into place. Returns the
    /// answer to send, or `None` if the only answer was given at the status.
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
                Ok(placed) => placed,
                Err(detail) => (Outcome::Failed, detail),
            },
            State::Idle | State::Answered => return None,
        };
        Some(answer)
    }

    fn verify(&self, packet: &Packet) -> Result<(), String> {
        let State::Receiving(inc) = &self.state else { return Ok(()) };
        let FileMessage::End { hash, sent, abort } =
            FileMessage::decode(FILE_END, packet.payload()).map_err(|e| e.to_string())?
        else {
            return Err("malformed end packet".into());
        };
        if !abort.is_empty() {
            return Err(format!("the front-end aborted: {abort}"));
        }
        if sent != inc.written || inc.written != self.size {
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

    /// Sets mode and mtime, flushes, and puts the verified file in place; returns
    /// the outcome (write mode leave: skipped when a file appeared meanwhile).
    fn finish(&self, inc: Incoming) -> Result<(Outcome, String), String> {
        let Incoming { tmp, dst, file, leave, same_path, .. } = inc;
        let result = (|| {
            set_mode_and_mtime(&file, &dst, self.perm, self.mtime)?;
            file.sync_all().map_err(|e| format!("writing {}: {e}", dst.display()))?;
            drop(file);
            if leave {
                return self.link_new(&tmp, &dst, same_path);
            }
            std::fs::rename(&tmp, &dst).map_err(|e| format!("renaming into {}: {e}", dst.display()))?;
            Ok((Outcome::Written, String::new()))
        })();
        // Left after an error, or after a hard link made the destination.
        let _ = std::fs::remove_file(&tmp);
        result
    }

    /// Write mode leave: makes `dst` a hard link to the finished temporary file, which
    /// fails if `dst` appeared since the status check (another process, or another
    /// rank on a shared file system), so nothing is replaced. Where hard links are not
    /// supported (EPERM, EOPNOTSUPP, EMLINK on some network and FUSE file systems), the
    /// file is renamed into place, which leaves that window open.
    fn link_new(&self, tmp: &Path, dst: &Path, same_path: bool) -> Result<(Outcome, String), String> {
        match std::fs::hard_link(tmp, dst) {
            Ok(()) => Ok((Outcome::Written, String::new())),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => match std::fs::metadata(dst) {
                Ok(m) if !m.is_dir() && self.is_same(&m) => {
                    Ok((Outcome::SkippedShared, same_detail(dst, same_path)))
                }
                _ => Ok((Outcome::SkippedLeave, appeared(dst))),
            },
            Err(e) if links_unsupported(&e) => std::fs::rename(tmp, dst)
                .map(|()| (Outcome::Written, String::new()))
                .map_err(|e| format!("renaming into {}: {e}", dst.display())),
            Err(e) => Err(format!("linking into {}: {e}", dst.display())),
        }
    }
}

/// True when `dst` is a symbolic link to `target`.
fn links_to(dst: &Path, target: &str) -> bool {
    std::fs::read_link(dst).is_ok_and(|t| t.as_os_str() == target)
}

/// True for the errors of a file system that cannot make hard links.
fn links_unsupported(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::Unsupported
        || matches!(e.raw_os_error(), Some(libc::EPERM | libc::EOPNOTSUPP | libc::EMLINK))
}

/// The detail of a destination that already has the source's size and mtime.
fn same_detail(dst: &Path, same_path: bool) -> String {
    if same_path {
        "the same file is already at this path (shared file system)".to_owned()
    } else {
        format!("{} already has the same size and mtime", dst.display())
    }
}

/// The detail of a destination that appeared during the transfer in write mode leave.
fn appeared(dst: &Path) -> String {
    format!("{} exists (write mode leave; it appeared during the transfer)", dst.display())
}

/// Sets the mtime, then the mode bits, of an open file or directory (through the
/// handle, so a path swapped meanwhile is not followed).
fn set_mode_and_mtime(f: &File, path: &Path, perm: u32, mtime: u64) -> Result<(), String> {
    let time = UNIX_EPOCH + Duration::from_nanos(mtime);
    f.set_modified(time).map_err(|e| format!("setting the mtime of {}: {e}", path.display()))?;
    f.set_permissions(std::fs::Permissions::from_mode(perm))
        .map_err(|e| format!("setting the mode of {}: {e}", path.display()))
}

impl Drop for FileReceiver {
    fn drop(&mut self) {
        if let State::Receiving(inc) = &self.state {
            let _ = std::fs::remove_file(&inc.tmp);
        }
    }
}

/// Bytes of the destination's name kept in a temporary name, so that name stays
/// under the usual 255-byte limit.
const TEMP_NAME_KEEP: usize = 100;

/// The temporary name beside `dst` (in an existing directory), and that directory.
///
/// `.NAME.treecast-SPACE-PID-TAG-RANDOM.tmp`, NAME cut to [`TEMP_NAME_KEEP`] bytes:
/// SPACE ([`pid_space`]) and the random part keep back-ends on different hosts apart
/// on a shared file system, where process ids (in containers, for example) can be
/// equal. The first time a process makes one in a directory, it removes the stale
/// ones there ([`sweep_once`]).
fn temp_path(dst: &Path, tag: u32) -> Result<(PathBuf, PathBuf), String> {
    let (Some(dir), Some(name)) = (dst.parent(), dst.file_name()) else {
        return Err(format!("destination {} has no parent directory", dst.display()));
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => return Err(format!("destination directory {} is not a directory", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!("destination directory {} does not exist", dir.display()));
        }
        Err(e) => return Err(format!("destination directory {}: {e}", dir.display())),
    }
    let mut name = name.to_string_lossy().into_owned();
    if name.len() > TEMP_NAME_KEEP {
        let mut cut = TEMP_NAME_KEEP;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
    }
    let random: u32 = rand::random();
    let space = pid_space();
    let tmp = dir.join(format!(".{name}.treecast-{space}-{}-{tag}-{random:08x}.tmp", std::process::id()));
    sweep_once(dir, &space);
    Ok((dir.to_path_buf(), tmp))
}

/// Eight hex digits naming this host's running kernel and this process's pid
/// namespace: the space in which the process id of a temporary file's name means
/// something. Back-ends on other hosts of a shared file system, or in other
/// containers, have another one, so their temporary files are never taken for stale.
fn pid_space() -> String {
    static SPACE: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SPACE
        .get_or_init(|| {
            let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
            let ns = std::fs::read_link("/proc/self/ns/pid").unwrap_or_default();
            let mut hasher = blake3::Hasher::new();
            hasher.update(boot.trim().as_bytes());
            hasher.update(ns.as_os_str().as_encoded_bytes());
            hasher.finalize().to_hex()[..8].to_owned()
        })
        .clone()
}

/// Removes, once per directory and process, the temporary files that back-ends of
/// this pid space left in `dir` when they were killed mid-transfer: files named as
/// [`temp_path`] names them whose process is gone. Best effort: errors are ignored.
fn sweep_once(dir: &Path, space: &str) {
    static SWEPT: std::sync::Mutex<Option<std::collections::HashSet<PathBuf>>> = std::sync::Mutex::new(None);
    let Ok(mut swept) = SWEPT.lock() else { return };
    if !swept.get_or_insert_with(Default::default).insert(dir.to_path_buf()) {
        return;
    }
    drop(swept);
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().and_then(|n| temp_owner(n, space)) else { continue };
        // A regular file only (never follows or removes a link someone put there).
        if pid != std::process::id() && !process_alive(pid) && entry.file_type().is_ok_and(|t| t.is_file()) {
            match std::fs::remove_file(entry.path()) {
                Ok(()) => tracing::info!(
                    "removed {}, left by a back-end killed mid-transfer",
                    entry.path().display()
                ),
                Err(e) => tracing::debug!("could not remove stale {}: {e}", entry.path().display()),
            }
        }
    }
}

/// The process id in a temporary file name of [`temp_path`]'s form made in `space`.
fn temp_owner(name: &str, space: &str) -> Option<u32> {
    let rest = name.strip_prefix('.')?.strip_suffix(".tmp")?;
    let (rest, random) = rest.rsplit_once('-')?;
    let (rest, tag) = rest.rsplit_once('-')?;
    let (rest, pid) = rest.rsplit_once('-')?;
    let (_, their_space) = rest.rsplit_once(".treecast-")?;
    let hex8 = |s: &str| s.len() == 8 && s.bytes().all(|b| b.is_ascii_hexdigit());
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    if their_space != space || !hex8(random) || !digits(tag) {
        return None;
    }
    pid.parse().ok()
}

/// True while process `pid` exists and is not a zombie (a process id reused by
/// another process also counts as alive: its files are then kept, never removed by mistake).
fn process_alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .is_ok_and(|s| s.rsplit_once(')').is_some_and(|(_, rest)| !rest.trim_start().starts_with('Z')))
}

/// An answer a back-end sends up: `send(stream, tag, format, &values)`.
#[derive(Debug, Clone, PartialEq)]
pub struct FileAnswer {
    /// The stream to answer on.
    pub stream: u32,
    /// The tag ([`FILE_STATUS`] or [`FILE_END`]).
    pub tag: i32,
    /// The format of `values`.
    pub format: &'static str,
    /// Outcome word (or `receive`) and detail.
    pub values: [Value; 2],
}

impl FileAnswer {
    fn new(stream: u32, tag: i32, word: &str, detail: &str) -> FileAnswer {
        FileAnswer {
            stream,
            tag,
            format: ANSWER_FORMAT,
            values: [Value::Str(word.to_owned()), Value::Str(detail.to_owned())],
        }
    }
}

/// Every transfer a back-end takes part in: feed it each packet whose tag
/// [`FileReceivers::handles`], in order, and send the answers it returns.
///
/// Transfers are keyed by the stream their next packets arrive on: the status stream
/// until [`FILE_OPEN`], then the data stream.
#[derive(Debug)]
pub struct FileReceivers {
    rank: u32,
    active: HashMap<u32, FileReceiver>,
    /// The final answer of each ended transfer, by data stream, until that stream
    /// closes: an end packet sent again (the answer may have gone with a lost comm
    /// node) gets it again.
    ended: HashMap<u32, (Outcome, String)>,
}

impl FileReceivers {
    /// The transfers of the back-end of rank `rank` (none yet).
    pub fn new(rank: u32) -> Self {
        FileReceivers { rank, active: HashMap::new(), ended: HashMap::new() }
    }

    /// True for the tags of the file protocol.
    pub fn handles(tag: i32) -> bool {
        matches!(tag, FILE_STATUS | FILE_CHUNK | FILE_END | FILE_OPEN)
    }

    /// Transfers in progress (waiting for their data stream or their end).
    pub fn len(&self) -> usize {
        self.active.len()
    }

    /// True when no transfer is in progress.
    pub fn is_empty(&self) -> bool {
        self.active.is_empty()
    }

    /// Drops the transfer whose packets arrive on `stream`, if any, removing its
    /// temporary file: call it when the front-end closed that stream (see
    /// [`treecast_api::BackEndEvent::StreamClosed`]), which it does when it gave up on the
    /// transfer (a stall, an error) as well as after a complete one.
    pub fn on_stream_closed(&mut self, stream: u32) {
        self.active.remove(&stream);
        self.ended.remove(&stream);
    }

    /// Feeds one packet; returns the answer to send, if any.
    pub fn on_packet(&mut self, p: &Packet) -> Option<FileAnswer> {
        let stream = p.stream();
        match p.tag() {
            FILE_STATUS => {
                let mut receiver = FileReceiver::new();
                let decision = receiver.on_status(p, stream);
                if FileStatus::decode(p.payload()).is_ok_and(|s| s.restart) {
                    // Sent again on the data stream: the answer waits for the end packet.
                    match decision {
                        Decision::Receive => {
                            self.active.insert(stream, receiver);
                        }
                        Decision::Answer(outcome, detail) => {
                            self.ended.insert(stream, (outcome, detail));
                        }
                    }
                    return None;
                }
                let answer = match decision {
                    Decision::Receive => {
                        self.active.insert(stream, receiver);
                        FileAnswer::new(stream, FILE_STATUS, RECEIVE_WORD, "")
                    }
                    Decision::Answer(outcome, detail) => {
                        FileAnswer::new(stream, FILE_STATUS, outcome.word(), &detail)
                    }
                };
                Some(answer)
            }
            FILE_OPEN => {
                // Not among the receivers (or a malformed packet): the receiver is dropped,
                // which removes its temporary file.
                let receiver = self.active.remove(&stream)?;
                if let Some(data) = self.data_stream(p) {
                    self.active.insert(data, receiver);
                }
                None
            }
            FILE_CHUNK => {
                if let Some(receiver) = self.active.get_mut(&stream) {
                    receiver.on_chunk(p);
                }
                None
            }
            FILE_END => {
                if let Some(offset) = self.active.get(&stream).and_then(|r| r.missing_from(p)) {
                    return Some(FileAnswer::new(stream, FILE_END, RESUME_WORD, &offset.to_string()));
                }
                let (outcome, detail) = match (self.active.remove(&stream), self.ended.get(&stream)) {
                    (Some(mut receiver), _) => {
                        let answer = receiver.on_end(p)?;
                        self.ended.insert(stream, answer.clone());
                        answer
                    }
                    (None, Some(answer)) => answer.clone(),
                    (None, None) => match FileMessage::decode(FILE_END, p.payload()) {
                        // Its FILE_OPEN went with a lost comm node: the front-end
                        // sends the status again on this stream, then every chunk.
                        Ok(FileMessage::End { abort, .. }) if abort.is_empty() => {
                            return Some(FileAnswer::new(stream, FILE_END, RESTART_WORD, ""));
                        }
                        Ok(FileMessage::End { abort, .. }) => (Outcome::Failed, abort),
                        _ => {
                            (Outcome::Failed, "the transfer ended but its status packet never arrived".into())
                        }
                    },
                };
                Some(FileAnswer::new(stream, FILE_END, outcome.word(), &detail))
            }
            _ => None,
        }
    }

    /// The data stream of a [`FILE_OPEN`] packet, if this rank is among its receivers.
    fn data_stream(&self, p: &Packet) -> Option<u32> {
        let Ok(FileMessage::Open { data, receivers }) = FileMessage::decode(FILE_OPEN, p.payload()) else {
            return None;
        };
        (data != 0 && receivers.contains(self.rank)).then_some(data)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use treecast_wire::{Frame, FrameHeader};

    use super::super::{CHUNK_FORMAT, END_FORMAT, FLAG_EXACT, FLAG_RESTART, OPEN_FORMAT, STATUS_FORMAT};
    use super::*;
    use crate::test_support::encode_checked;

    fn packet_on(stream: u32, tag: i32, format: &str, values: &[Value]) -> Packet {
        let (_, payload) = encode_checked(format, values).unwrap();
        Packet::from_frame(Frame::new(FrameHeader::data(stream, tag, 0), payload))
    }

    fn packet(tag: i32, format: &str, values: &[Value]) -> Packet {
        packet_on(1, tag, format, values)
    }

    fn status_of(dst: &Path, size: u64, mode: WriteMode, kind: EntryKind, target: &str) -> Packet {
        status_flags(dst, size, mode, kind, target, 0)
    }

    fn status_flags(
        dst: &Path,
        size: u64,
        mode: WriteMode,
        kind: EntryKind,
        target: &str,
        flags: u32,
    ) -> Packet {
        let values = [
            Value::Str("/nonexistent/src".into()),
            Value::ULong(1_000_000_000),
            Value::ULong(size),
            Value::Str(dst.to_str().unwrap().into()),
            Value::Int(mode.code()),
            Value::UInt(0o640),
            Value::Int(kind.code()),
            Value::Str(target.into()),
            Value::UInt(flags),
        ];
        packet(FILE_STATUS, STATUS_FORMAT, &values)
    }

    fn status(dst: &Path, size: u64, mode: WriteMode) -> Packet {
        status_of(dst, size, mode, EntryKind::File, "")
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
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
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
        assert_eq!(entries(d), 1);
    }

    #[test]
    fn a_checksum_mismatch_fails_and_leaves_nothing() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("f");
        let mut r = FileReceiver::new();
        r.on_status(&status(&dst, 3, WriteMode::Leave), 1);
        r.on_chunk(&chunk(0, b"abc"));
        let wrong = blake3::hash(b"abd").to_hex().to_string();
        let (outcome, detail) = r.on_end(&end(&wrong, 3, "")).unwrap();
        assert_eq!(outcome, Outcome::Failed);
        assert!(detail.contains("checksum mismatch"), "{detail}");
        assert_eq!(entries(d), 0);
    }

    #[test]
    fn out_of_order_chunks_an_abort_or_a_drop_leave_nothing() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("f");
        let mut r = FileReceiver::new();
        r.on_status(&status(&dst, 6, WriteMode::Leave), 1);
        r.on_chunk(&chunk(0, b"abc"));
        r.on_chunk(&chunk(0, b"abc"));
        let (outcome, detail) = r.on_end(&end("x", 6, "")).unwrap();
        assert_eq!(outcome, Outcome::Failed);
        assert!(detail.contains("chunk at offset 0 arrived while expecting 3"), "{detail}");
        assert_eq!(entries(d), 0);

        let mut r = FileReceiver::new();
        r.on_status(&status(&dst, 6, WriteMode::Leave), 2);
        r.on_chunk(&chunk(0, b"abc"));
        let (outcome, detail) = r.on_end(&end("x", 3, "the source shrank")).unwrap();
        assert_eq!(outcome, Outcome::Failed);
        assert!(detail.contains("the source shrank"), "{detail}");
        assert_eq!(entries(d), 0);

        let mut r = FileReceiver::new();
        r.on_status(&status(&dst, 6, WriteMode::Leave), 3);
        r.on_chunk(&chunk(0, b"abc"));
        assert_eq!(entries(d), 1);
        drop(r);
        assert_eq!(entries(d), 0);
    }

    #[test]
    fn a_skip_is_answered_once_at_the_status() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("f");
        std::fs::write(&dst, b"old").unwrap();
        let mut r = FileReceiver::new();
        let decision = r.on_status(&status(&dst, 6, WriteMode::Leave), 1);
        assert!(matches!(decision, Decision::Answer(Outcome::SkippedLeave, _)), "{decision:?}");
        r.on_chunk(&chunk(0, b"abcdef"));
        assert_eq!(r.on_end(&end("x", 6, "")), None);
        assert_eq!(std::fs::read(&dst).unwrap(), b"old");
    }

    fn open(status_stream: u32, data: u32, ranks: &str) -> Packet {
        packet_on(status_stream, FILE_OPEN, OPEN_FORMAT, &[Value::UInt(data), Value::Str(ranks.into())])
    }

    fn on(stream: u32, p: &Packet) -> Packet {
        let mut frame = Frame::new(FrameHeader::data(stream, p.tag(), 0), p.payload().clone());
        frame.header.rank = 0;
        Packet::from_frame(frame)
    }

    #[test]
    fn receivers_move_to_the_data_stream_only_when_named_among_the_receivers() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("f");
        let mut rs = FileReceivers::new(3);
        let answer = rs.on_packet(&on(5, &status(&dst, 3, WriteMode::Leave))).unwrap();
        assert_eq!((answer.stream, answer.tag), (5, FILE_STATUS));
        assert_eq!(answer.values[0], Value::Str("receive".into()));
        assert_eq!(entries(d), 1, "the temporary file is made at the status");
        assert_eq!(rs.on_packet(&open(5, 6, "0-2,3")), None);
        assert_eq!(rs.on_packet(&on(6, &chunk(0, b"abc"))), None);
        let hash = blake3::hash(b"abc").to_hex().to_string();
        let answer = rs.on_packet(&on(6, &end(&hash, 3, ""))).unwrap();
        assert_eq!((answer.stream, answer.tag), (6, FILE_END));
        assert_eq!(answer.values[0], Value::Str("written".into()));
        assert_eq!(std::fs::read(&dst).unwrap(), b"abc");
        assert!(rs.is_empty());

        // Left out of the data stream (an answer that came too late): the temporary file goes.
        let other = d.join("g");
        rs.on_packet(&on(7, &status(&other, 3, WriteMode::Leave))).unwrap();
        assert_eq!(entries(d), 2);
        assert_eq!(rs.on_packet(&open(7, 8, "0-2")), None);
        assert_eq!(entries(d), 1);
        assert!(rs.is_empty());
    }

    #[test]
    fn a_rank_that_missed_chunks_resumes_and_a_repeated_end_gets_the_same_answer() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("f");
        let mut rs = FileReceivers::new(0);
        rs.on_packet(&on(5, &status(&dst, 9, WriteMode::Leave))).unwrap();
        rs.on_packet(&open(5, 6, "0"));
        rs.on_packet(&on(6, &chunk(0, b"abc")));
        // "def" went with a lost comm node; this rank rejoined for "ghi".
        assert_eq!(rs.on_packet(&on(6, &chunk(6, b"ghi"))), None);
        let hash = blake3::hash(b"abcdefghi").to_hex().to_string();
        let answer = rs.on_packet(&on(6, &end(&hash, 9, ""))).unwrap();
        assert_eq!(answer.values, [Value::Str("resume".into()), Value::Str("3".into())]);
        assert_eq!(rs.len(), 1, "the transfer stays open");
        // The end packet again (it may come twice): the same offset.
        let again = rs.on_packet(&on(6, &end(&hash, 9, ""))).unwrap();
        assert_eq!(again.values, answer.values);
        rs.on_packet(&on(6, &chunk(3, b"def")));
        rs.on_packet(&on(6, &chunk(6, b"ghi")));
        let answer = rs.on_packet(&on(6, &end(&hash, 9, ""))).unwrap();
        assert_eq!(answer.values[0], Value::Str("written".into()));
        assert_eq!(std::fs::read(&dst).unwrap(), b"abcdefghi");
        // Its answer may have gone with a lost comm node: asked again, it says it again.
        let again = rs.on_packet(&on(6, &end(&hash, 9, ""))).unwrap();
        assert_eq!(again.values, answer.values);
        rs.on_stream_closed(6);
        // Forgotten with its stream: an end packet there now asks for everything.
        let after = rs.on_packet(&on(6, &end(&hash, 9, ""))).unwrap();
        assert_eq!(after.values[0], Value::Str("restart".into()));
    }

    #[test]
    fn a_rank_whose_file_open_was_lost_restarts_from_the_status_on_the_data_stream() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("f");
        let mut rs = FileReceivers::new(2);
        rs.on_packet(&on(5, &status(&dst, 6, WriteMode::Leave))).unwrap();
        // FILE_OPEN and the chunks went with a stopped comm node; the status stream
        // closed before this rank rejoined, and the end packet is sent to it again.
        rs.on_stream_closed(5);
        assert_eq!(entries(d), 0, "the first temporary file goes with its stream");
        let hash = blake3::hash(b"abcdef").to_hex().to_string();
        let answer = rs.on_packet(&on(6, &end(&hash, 6, ""))).unwrap();
        assert_eq!((answer.stream, answer.tag), (6, FILE_END));
        assert_eq!(answer.values[0], Value::Str("restart".into()));
        // The status again on the data stream: no answer until the end packet.
        let restatus = status_flags(&dst, 6, WriteMode::Leave, EntryKind::File, "", FLAG_RESTART);
        assert_eq!(rs.on_packet(&on(6, &restatus)), None);
        rs.on_packet(&on(6, &chunk(0, b"abc")));
        rs.on_packet(&on(6, &chunk(3, b"def")));
        let answer = rs.on_packet(&on(6, &end(&hash, 6, ""))).unwrap();
        assert_eq!(answer.values[0], Value::Str("written".into()));
        assert_eq!(std::fs::read(&dst).unwrap(), b"abcdef");

        // Restarted into a decision made at the status (the copy is there now, with
        // the source's size and mtime): the end packet gets it, the chunks are dropped.
        let skip = on(7, &status_flags(&dst, 6, WriteMode::Leave, EntryKind::File, "", FLAG_RESTART));
        assert_eq!(rs.on_packet(&skip), None);
        rs.on_packet(&on(7, &chunk(0, b"abcdef")));
        let answer = rs.on_packet(&on(7, &end(&hash, 6, ""))).unwrap();
        assert_eq!(answer.values[0], Value::Str("skipped-shared".into()));
        // An aborted transfer is not restarted: the abort is the answer.
        let answer = rs.on_packet(&on(8, &end(&hash, 6, "the source shrank"))).unwrap();
        assert_eq!(answer.values, [Value::Str("failed".into()), Value::Str("the source shrank".into())]);
        assert!(rs.is_empty());
    }

    #[test]
    fn links_are_made_with_their_target_text_and_replaced_by_the_write_mode() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("l");
        let mut r = FileReceiver::new();
        let link = |mode| status_of(&dst, 0, mode, EntryKind::Symlink, "../some/where");
        assert_eq!(
            r.on_status(&link(WriteMode::Leave), 1),
            Decision::Answer(Outcome::Written, String::new())
        );
        assert_eq!(std::fs::read_link(&dst).unwrap(), Path::new("../some/where"));
        let again = FileReceiver::new().on_status(&link(WriteMode::Overwrite), 2);
        assert!(matches!(again, Decision::Answer(Outcome::SkippedShared, _)), "{again:?}");
        std::fs::remove_file(&dst).unwrap();
        std::fs::write(&dst, b"a file").unwrap();
        let leave = FileReceiver::new().on_status(&link(WriteMode::Leave), 3);
        assert!(matches!(leave, Decision::Answer(Outcome::SkippedLeave, _)), "{leave:?}");
        let over = FileReceiver::new().on_status(&link(WriteMode::Overwrite), 4);
        assert_eq!(over, Decision::Answer(Outcome::Written, String::new()));
        assert!(std::fs::symlink_metadata(&dst).unwrap().is_symlink());
        assert_eq!(entries(d), 1, "no temporary link left");
    }

    #[test]
    fn directory_attributes_are_set_on_an_existing_directory_only() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let sub = d.join("sub");
        std::fs::create_dir(&sub).unwrap();
        let attrs = |p: &Path| status_of(p, 0, WriteMode::Leave, EntryKind::Directory, "");
        let set = FileReceiver::new().on_status(&attrs(&sub), 1);
        assert_eq!(set, Decision::Answer(Outcome::Written, String::new()));
        let meta = std::fs::metadata(&sub).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o640);
        assert_eq!(mtime_ns(&meta), 1_000_000_000);
        let again = FileReceiver::new().on_status(&attrs(&sub), 2);
        assert!(matches!(again, Decision::Answer(Outcome::SkippedShared, _)), "{again:?}");
        let missing = FileReceiver::new().on_status(&attrs(&d.join("missing")), 3);
        assert!(matches!(missing, Decision::Answer(Outcome::Failed, _)), "{missing:?}");
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
    }

    fn temp_names(d: &Path) -> Vec<String> {
        let names =
            std::fs::read_dir(d).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned());
        names.filter(|n| n.contains(".treecast-")).collect()
    }

    #[test]
    fn an_existing_directory_at_an_exact_destination_fails_instead_of_taking_the_file() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("name");
        std::fs::create_dir(&dst).unwrap();
        let exact = status_flags(&dst, 3, WriteMode::Overwrite, EntryKind::File, "", FLAG_EXACT);
        let decision = FileReceiver::new().on_status(&exact, 1);
        let Decision::Answer(Outcome::Failed, detail) = &decision else { panic!("{decision:?}") };
        assert!(detail.contains("is a directory"), "{detail}");
        assert_eq!(entries(&dst), 0, "nothing nested inside the directory");
        // Without the flag (one file to a directory), the directory takes the file.
        let plain = status(&dst, 3, WriteMode::Overwrite);
        assert_eq!(FileReceiver::new().on_status(&plain, 2), Decision::Receive);
    }

    #[test]
    fn directory_attributes_are_set_through_one_handle_and_never_through_a_link() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let sub = d.join("sub");
        std::fs::create_dir(&sub).unwrap();
        // A mode without read permission for the owner: opening after the change would
        // fail for a user other than root.
        let values = |p: &Path, perm: u32| {
            [
                Value::Str("/nonexistent/src".into()),
                Value::ULong(2_000_000_000),
                Value::ULong(0),
                Value::Str(p.to_str().unwrap().into()),
                Value::Int(WriteMode::Leave.code()),
                Value::UInt(perm),
                Value::Int(EntryKind::Directory.code()),
                Value::Str(String::new()),
                Value::UInt(0),
            ]
        };
        let set = FileReceiver::new().on_status(&packet(FILE_STATUS, STATUS_FORMAT, &values(&sub, 0o311)), 1);
        assert_eq!(set, Decision::Answer(Outcome::Written, String::new()));
        let meta = std::fs::metadata(&sub).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o311);
        assert_eq!(mtime_ns(&meta), 2_000_000_000);
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        // A link to a directory is not followed.
        let link = d.join("link");
        std::os::unix::fs::symlink(&sub, &link).unwrap();
        let via =
            FileReceiver::new().on_status(&packet(FILE_STATUS, STATUS_FORMAT, &values(&link, 0o700)), 2);
        let Decision::Answer(Outcome::Failed, detail) = &via else { panic!("{via:?}") };
        assert!(detail.contains("is not a directory"), "{detail}");
        assert_eq!(std::fs::metadata(&sub).unwrap().permissions().mode() & 0o7777, 0o755);
    }

    #[test]
    fn leave_mode_keeps_a_file_that_appeared_during_the_transfer() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("f");
        let mut r = FileReceiver::new();
        assert_eq!(r.on_status(&status(&dst, 3, WriteMode::Leave), 1), Decision::Receive);
        r.on_chunk(&chunk(0, b"abc"));
        std::fs::write(&dst, b"someone else's").unwrap();
        let hash = blake3::hash(b"abc").to_hex().to_string();
        let (outcome, detail) = r.on_end(&end(&hash, 3, "")).unwrap();
        assert_eq!(outcome, Outcome::SkippedLeave, "{detail}");
        assert!(detail.contains("appeared during the transfer"), "{detail}");
        assert_eq!(std::fs::read(&dst).unwrap(), b"someone else's");
        assert_eq!(entries(d), 1, "no temporary file left");

        // The same file put there by another rank (a shared file system) counts as shared.
        let other = d.join("g");
        let mut first = FileReceiver::new();
        let mut second = FileReceiver::new();
        assert_eq!(first.on_status(&status(&other, 3, WriteMode::Leave), 2), Decision::Receive);
        assert_eq!(second.on_status(&status(&other, 3, WriteMode::Leave), 3), Decision::Receive);
        for r in [&mut first, &mut second] {
            r.on_chunk(&chunk(0, b"abc"));
        }
        assert_eq!(first.on_end(&end(&hash, 3, "")), Some((Outcome::Written, String::new())));
        let (outcome, detail) = second.on_end(&end(&hash, 3, "")).unwrap();
        assert_eq!(outcome, Outcome::SkippedShared, "{detail}");
        assert_eq!(std::fs::read(&other).unwrap(), b"abc");
        assert!(temp_names(d).is_empty(), "{:?}", temp_names(d));

        // A link in leave mode is not made over something that appeared either.
        let link = d.join("l");
        std::fs::write(&link, b"x").unwrap();
        let r = FileReceiver::new();
        assert!(matches!(
            r.make_link(&link, "t", WriteMode::Leave, 4),
            Decision::Answer(Outcome::SkippedLeave, _)
        ));
        assert_eq!(std::fs::read(&link).unwrap(), b"x");
    }

    #[test]
    fn a_closed_stream_drops_its_transfer_and_temporary_file() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("f");
        let mut rs = FileReceivers::new(0);
        rs.on_packet(&on(5, &status(&dst, 3, WriteMode::Leave))).unwrap();
        assert_eq!(temp_names(d).len(), 1);
        rs.on_stream_closed(4);
        assert_eq!(rs.len(), 1, "another stream's close changes nothing");
        rs.on_stream_closed(5);
        assert!(rs.is_empty());
        assert!(temp_names(d).is_empty(), "{:?}", temp_names(d));

        // Also on the data stream, after FILE_OPEN and some chunks.
        rs.on_packet(&on(7, &status(&dst, 6, WriteMode::Leave))).unwrap();
        assert_eq!(rs.on_packet(&open(7, 8, "0")), None);
        assert_eq!(rs.on_packet(&on(8, &chunk(0, b"abc"))), None);
        rs.on_stream_closed(7);
        assert_eq!(temp_names(d).len(), 1, "the status stream's close does not end the transfer");
        rs.on_stream_closed(8);
        assert!(temp_names(d).is_empty() && !dst.exists());
    }

    #[test]
    fn temporary_names_of_long_destination_names_stay_short_and_unique() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        // 240 bytes, multi-byte characters at the cut.
        let name: String = "é".repeat(120);
        let dst = d.join(&name);
        let mut a = FileReceiver::new();
        let mut b = FileReceiver::new();
        assert_eq!(a.on_status(&status(&dst, 3, WriteMode::Overwrite), 1), Decision::Receive);
        assert_eq!(
            b.on_status(&status(&dst, 3, WriteMode::Overwrite), 1),
            Decision::Receive,
            "same tag, same process"
        );
        let names = temp_names(d);
        assert_eq!(names.len(), 2, "{names:?}");
        assert!(names.iter().all(|n| n.len() <= 255), "{names:?}");
        a.on_chunk(&chunk(0, b"abc"));
        let hash = blake3::hash(b"abc").to_hex().to_string();
        assert_eq!(a.on_end(&end(&hash, 3, "")), Some((Outcome::Written, String::new())));
        assert_eq!(std::fs::read(&dst).unwrap(), b"abc");
        drop(b);
        assert!(temp_names(d).is_empty());
    }

    #[test]
    fn a_dangling_link_in_leave_mode_is_kept_at_the_status_without_taking_the_data() {
        // Regression: the whole file was received, then reported as having "appeared
        // during the transfer".
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let dst = d.join("f");
        std::os::unix::fs::symlink("nowhere", &dst).unwrap();
        let decision = FileReceiver::new().on_status(&status(&dst, 3, WriteMode::Leave), 1);
        let Decision::Answer(Outcome::SkippedLeave, detail) = &decision else { panic!("{decision:?}") };
        assert!(detail.contains("symbolic link") && !detail.contains("appeared"), "{detail}");
        assert_eq!(std::fs::read_link(&dst).unwrap(), Path::new("nowhere"));
        assert!(temp_names(d).is_empty());
    }

    #[test]
    fn overwrite_replaces_a_linked_destination_and_never_writes_through_it() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let target = d.join("target");
        std::fs::write(&target, b"kept").unwrap();
        let hash = blake3::hash(b"abc").to_hex().to_string();
        for (mode, name) in [(WriteMode::Overwrite, "a"), (WriteMode::Newer, "b")] {
            let dst = d.join(name);
            std::os::unix::fs::symlink(&target, &dst).unwrap();
            let mut r = FileReceiver::new();
            // The target is older than the source (mtime 1 s after the epoch, below).
            let old = std::time::UNIX_EPOCH;
            std::fs::File::options().write(true).open(&target).unwrap().set_modified(old).unwrap();
            assert_eq!(r.on_status(&status(&dst, 3, mode), 1), Decision::Receive, "{mode:?}");
            r.on_chunk(&chunk(0, b"abc"));
            assert_eq!(r.on_end(&end(&hash, 3, "")), Some((Outcome::Written, String::new())), "{mode:?}");
            let meta = std::fs::symlink_metadata(&dst).unwrap();
            assert!(meta.is_file(), "{mode:?}: the link is replaced by the file");
            assert_eq!(std::fs::read(&dst).unwrap(), b"abc");
            assert_eq!(std::fs::read(&target).unwrap(), b"kept", "{mode:?}: written through the link");
        }
        // A dangling link is replaced too, in both modes.
        let dst = d.join("c");
        std::os::unix::fs::symlink("nowhere", &dst).unwrap();
        let mut r = FileReceiver::new();
        assert_eq!(r.on_status(&status(&dst, 3, WriteMode::Overwrite), 2), Decision::Receive);
        r.on_chunk(&chunk(0, b"abc"));
        assert_eq!(r.on_end(&end(&hash, 3, "")), Some((Outcome::Written, String::new())));
        assert!(std::fs::symlink_metadata(&dst).unwrap().is_file());
    }

    #[test]
    fn stale_temporary_files_of_this_pid_space_are_removed_at_the_first_transfer_to_their_directory() {
        let scratch = tempfile::tempdir().unwrap();
        let d = scratch.path();
        let space = pid_space();
        // No pid is ever this large (the kernel's limit is 2^22): its process is gone.
        let gone = i32::MAX;
        let stale = format!(".f.treecast-{space}-{gone}-3-0123abcd.tmp");
        let mine = format!(".f.treecast-{space}-{}-3-0123abcd.tmp", std::process::id());
        let elsewhere = format!(".f.treecast-00000000-{gone}-3-0123abcd.tmp");
        let old_style = format!(".f.treecast-{gone}-3-0123abcd.tmp");
        for name in [&stale, &mine, &elsewhere, &old_style] {
            std::fs::write(d.join(name), b"partial").unwrap();
        }
        assert_eq!(temp_owner(&stale, &space), Some(gone as u32));
        assert_eq!(temp_owner(&elsewhere, &space), None);
        assert_eq!(temp_owner(&old_style, &space), None);
        let mut r = FileReceiver::new();
        assert_eq!(r.on_status(&status(&d.join("g"), 3, WriteMode::Leave), 1), Decision::Receive);
        let mut left = temp_names(d);
        left.sort();
        let mut want: Vec<String> = vec![mine.clone(), elsewhere.clone(), old_style.clone()];
        want.extend(temp_names(d).into_iter().filter(|n| n.starts_with(".g.")));
        want.sort();
        assert_eq!(left, want, "only the stale file of this pid space goes");
    }

    #[test]
    fn words_modes_and_kinds_round_trip() {
        for o in [
            Outcome::Written,
            Outcome::SkippedShared,
            Outcome::SkippedLeave,
            Outcome::SkippedOlder,
            Outcome::Failed,
        ] {
            assert_eq!(Outcome::from_word(o.word()), Some(o));
        }
        assert_eq!(Outcome::from_word(RECEIVE_WORD), None, "receive is no outcome");
        for m in [WriteMode::Leave, WriteMode::Newer, WriteMode::Overwrite] {
            assert_eq!(WriteMode::from_code(m.code()), Some(m));
            assert_eq!(m.name().parse::<WriteMode>(), Ok(m));
        }
        for k in [EntryKind::File, EntryKind::Symlink, EntryKind::Directory] {
            assert_eq!(EntryKind::from_code(k.code()), Some(k));
        }
    }
}
