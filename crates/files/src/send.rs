//! The front-end side: [`bcast_files`] and [`bcast_file`].

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use bytes::BufMut;
use tokio::io::AsyncReadExt;
use tokio::sync::watch;
use treecast_filters::TransformKind;
use treecast_wire::{encode_bytes_head, encode_values, RankSet, SyncMode, Value};

use super::{
    kind_of, mtime_ns, EntryKind, FileOptions, FileReport, Outcome, RankOutcome, SourceError, WriteMode,
    END_FORMAT, FILE_CHUNK, FILE_END, FILE_OPEN, FILE_STATUS, FLAG_EXACT, FLAG_RESTART, OPEN_FORMAT,
    RECEIVE_WORD, RESTART_WORD, RESUME_WORD, STATUS_FORMAT,
};
use treecast_api::{ApiError, Communicator, EqClass, LostRanks, Network, Stream, StreamOptions};

/// One thing for [`bcast_files`] to send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileEntry {
    /// Where it is on this host.
    pub source: PathBuf,
    /// Where it goes on the ranks (`None`: the source's absolute path). A relative
    /// path is made absolute against this process's working directory.
    pub destination: Option<PathBuf>,
    /// What is sent.
    pub kind: EntryKind,
    /// For a file: `destination` is the file's own path, and an existing directory
    /// there fails the entry (as `cp` does) instead of receiving the file under the
    /// source's name.
    pub exact: bool,
}

impl FileEntry {
    /// A regular file; a `destination` that is an existing directory on a rank receives
    /// the file under the source's name.
    pub fn file(source: impl Into<PathBuf>, destination: Option<PathBuf>) -> Self {
        FileEntry { source: source.into(), destination, kind: EntryKind::File, exact: false }
    }

    /// A regular file written exactly at `destination`: a rank where that is an
    /// existing directory fails the entry with "… is a directory".
    pub fn file_at(source: impl Into<PathBuf>, destination: impl Into<PathBuf>) -> Self {
        FileEntry {
            source: source.into(),
            destination: Some(destination.into()),
            kind: EntryKind::File,
            exact: true,
        }
    }

    /// A symbolic link, recreated at `destination` with the same target text.
    pub fn symlink(source: impl Into<PathBuf>, destination: impl Into<PathBuf>) -> Self {
        let destination = Some(destination.into());
        FileEntry { source: source.into(), destination, kind: EntryKind::Symlink, exact: true }
    }

    /// The mode bits and mtime of the directory `source`, set on the existing
    /// directory `destination`. Send it after the directory's content.
    pub fn directory(source: impl Into<PathBuf>, destination: impl Into<PathBuf>) -> Self {
        let destination = Some(destination.into());
        FileEntry { source: source.into(), destination, kind: EntryKind::Directory, exact: true }
    }
}

/// What [`bcast_files`] reports while it works, through its `progress` callback.
#[derive(Debug)]
#[non_exhaustive]
pub enum Progress<'a> {
    /// Entry `index` starts; `size` bytes will be read (0 for links and directories).
    Started {
        /// Position in the entries.
        index: usize,
        /// The entry.
        entry: &'a FileEntry,
        /// Bytes in the file.
        size: u64,
    },
    /// A chunk of entry `index` was sent.
    Sent {
        /// Position in the entries.
        index: usize,
        /// Bytes sent so far.
        sent: u64,
        /// Bytes in the file.
        size: u64,
    },
    /// More ranks have their final outcome for entry `index` (skipped or failed at the
    /// status, written or failed after the data, or lost).
    Ranks {
        /// Position in the entries.
        index: usize,
        /// Ranks done so far.
        done: u64,
        /// Ranks of the communicator.
        total: u64,
    },
    /// Entry `index` is done.
    Done {
        /// Position in the entries.
        index: usize,
        /// What happened on every rank.
        report: &'a FileReport,
    },
}

/// Sends the file `src` to every rank of `comm`, to `dst` (default: the same absolute path).
///
/// [`bcast_files`] with one entry, [`FileOptions::timeout`] at its default and no
/// progress report.
///
/// # Errors
/// As [`bcast_files`].
///
/// Cancel safety: not cancel safe; ranks keep a temporary file until the network shuts down.
pub async fn bcast_file(
    net: &Network,
    comm: &Communicator,
    src: &Path,
    dst: Option<&Path>,
    mode: WriteMode,
    chunk: usize,
) -> Result<FileReport, ApiError> {
    let entry = FileEntry::file(src, dst.map(Path::to_path_buf));
    let options = FileOptions { mode, chunk, ..FileOptions::default() };
    options.validate()?;
    let source = inspect(&entry)?;
    Sender::new(net, options).transfer(comm, &entry, source, 0, &mut |_| {}).await
}

/// Sends files, links and directory attributes to every rank of `comm`, one after
/// another, and returns one report per entry, in order.
///
/// Each transfer asks every rank first (status packet) and sends the data only to
/// the ranks that want it (docs/files.md describes the protocol).
/// Per-rank failures (no space, permission, checksum mismatch, missing destination
/// directory, no answer in time) and lost ranks are in the reports, not errors.
/// `progress` is called as entries start, as chunks go out and as entries finish.
///
/// Lost ranks come from [`Network::lost`], so ranks lost before the call (for example
/// missing at launch) are reported lost at once, not waited for; the network's events
/// are left for the caller. When the tree stops taking packets (a child link that
/// stopped draining), the entry's ranks fail with "the tree took no packet …" and the
/// entries after it fail without touching the tree.
///
/// # Errors
/// [`ApiError::Source`] when an entry cannot be sent (missing or unreadable source,
/// a source that is not of its kind, a path that is not UTF-8), the chunk size is
/// 0 or over [`super::MAX_CHUNK`], or the time limit is 0 or over [`super::MAX_TIMEOUT`]: every
/// entry is checked before the first is sent. A source that vanishes after that check
/// is reported as failed on every rank, and the call goes on. An error of the network
/// when it is gone, or a malformed reduction.
///
/// Cancel safety: not cancel safe; ranks keep a temporary file until the network shuts down.
pub async fn bcast_files(
    net: &Network,
    comm: &Communicator,
    entries: &[FileEntry],
    options: &FileOptions,
    mut progress: impl FnMut(Progress<'_>),
) -> Result<Vec<FileReport>, ApiError> {
    options.validate()?;
    // Every source is checked before anything is sent, so a typo fails the whole call early.
    let sources = entries.iter().map(inspect).collect::<Result<Vec<_>, _>>()?;
    let mut sender = Sender::new(net, *options);
    let mut reports = Vec::with_capacity(entries.len());
    for (index, (entry, source)) in entries.iter().zip(sources).enumerate() {
        let report = sender.transfer(comm, entry, source, index, &mut progress).await?;
        progress(Progress::Done { index, report: &report });
        reports.push(report);
    }
    Ok(reports)
}

/// What the status packet says about an entry.
#[derive(Debug)]
struct Source {
    kind: EntryKind,
    source: PathBuf,
    destination: PathBuf,
    size: u64,
    mtime: u64,
    perm: u32,
    target: String,
    exact: bool,
    /// A file's identity when it was opened, checked again after the last read.
    opened: Option<Identity>,
}

/// What tells a file's content changed: device, inode, size, mtime and ctime (ns).
/// An edit in place moves mtime and ctime (at the file system's timestamp
/// resolution), even when it keeps the size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    dev: u64,
    ino: u64,
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
}

impl Identity {
    fn of(m: &std::fs::Metadata) -> Identity {
        use std::os::unix::fs::MetadataExt;
        Identity {
            dev: m.dev(),
            ino: m.ino(),
            size: m.size(),
            mtime: (m.mtime(), m.mtime_nsec()),
            ctime: (m.ctime(), m.ctime_nsec()),
        }
    }
}

/// Why a transfer is aborted when the source moved while it was read.
const SOURCE_CHANGED: &str = "the source changed during the transfer";

fn absolute(p: &Path) -> Result<PathBuf, SourceError> {
    std::path::absolute(p).map_err(|source| SourceError::Absolute { path: p.into(), source })
}

fn utf8(p: &Path) -> Result<String, SourceError> {
    p.to_str().map(str::to_owned).ok_or_else(|| SourceError::NotUtf8(p.into()))
}

/// Checks an entry against its kind and reads what its status packet needs.
fn inspect(entry: &FileEntry) -> Result<Source, SourceError> {
    let source = absolute(&entry.source)?;
    let destination = match &entry.destination {
        Some(d) => absolute(d)?,
        None => source.clone(),
    };
    let meta = match entry.kind {
        EntryKind::File => std::fs::metadata(&source),
        EntryKind::Symlink | EntryKind::Directory => std::fs::symlink_metadata(&source),
    };
    let meta = meta.map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound => SourceError::Open { path: source.clone(), source: e },
        _ => SourceError::Stat { path: source.clone(), source: e },
    })?;
    let t = meta.file_type();
    let (fits, expected) = match entry.kind {
        EntryKind::File => (t.is_file(), "a regular file"),
        EntryKind::Symlink => (t.is_symlink(), "a symbolic link"),
        EntryKind::Directory => (t.is_dir(), "a directory"),
    };
    if !fits {
        let kind = kind_of(t);
        return Err(match entry.kind {
            EntryKind::File => SourceError::NotAFile { path: source, kind },
            _ => SourceError::WrongKind { path: source, kind, expected },
        });
    }
    let target = match entry.kind {
        EntryKind::Symlink => {
            let t = std::fs::read_link(&source)
                .map_err(|e| SourceError::ReadLink { path: source.clone(), source: e })?;
            utf8(&t)?
        }
        _ => String::new(),
    };
    Ok(Source {
        kind: entry.kind,
        size: if entry.kind == EntryKind::File { meta.len() } else { 0 },
        mtime: mtime_ns(&meta),
        perm: meta.permissions().mode() & 0o7777,
        source,
        destination,
        target,
        exact: entry.exact,
        opened: None,
    })
}

/// The lost ranks among `ranks`, by reason; the rest as lost without a known reason.
fn lost_report(lost: &LostRanks, ranks: &RankSet) -> Vec<(RankSet, String)> {
    let mut out = lost.among(ranks);
    let unknown = ranks.difference(lost.ranks());
    if !unknown.is_empty() {
        out.push((unknown, "no answer (lost earlier or the stream closed)".into()));
    }
    out
}

/// Final answers of one transfer, grouped by outcome and detail.
#[derive(Debug, Default)]
struct Answers {
    outcomes: Vec<RankOutcome>,
    accounted: RankSet,
}

impl Answers {
    fn add(&mut self, outcome: Outcome, detail: String, ranks: &RankSet) {
        self.accounted.union_with(ranks);
        match self.outcomes.iter_mut().find(|o| o.outcome == outcome && o.detail == detail) {
            Some(o) => o.ranks.union_with(ranks),
            None => self.outcomes.push(RankOutcome { outcome, detail, ranks: ranks.clone() }),
        }
    }

    /// Records one class of answers; `receive` answers go to `receivers` when given.
    fn add_class(&mut self, class: EqClass, receivers: Option<&mut RankSet>) {
        let [Value::Str(word), Value::Str(detail)] = class.values.as_slice() else {
            self.add(
                Outcome::Failed,
                "malformed answer (a different treecast version?)".into(),
                &class.ranks,
            );
            return;
        };
        match (Outcome::from_word(word), receivers) {
            (Some(outcome), _) => self.add(outcome, detail.clone(), &class.ranks),
            (None, Some(receivers)) if word == RECEIVE_WORD => receivers.union_with(&class.ranks),
            (None, _) => {
                self.add(Outcome::Failed, format!("unknown outcome {word:?}: {detail}"), &class.ranks)
            }
        }
    }
}

/// How many times a rank that rejoined during one transfer is sent what it missed.
const MAX_RESUMES: usize = 4;

/// A packet sent again, directly, to each rank that rejoined while its answer is
/// awaited: the status or the end packet may have gone with its lost comm node.
struct Again<'a> {
    tag: i32,
    format: &'static str,
    values: &'a [Value],
}

/// What a rank that missed packets while its comm node was lost asks to be sent again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resume {
    /// `resume`: the chunks from this offset, then the end packet.
    From(u64),
    /// `restart`: the status (its `FILE_OPEN` was lost), every chunk, the end packet.
    Restart,
}

impl Resume {
    /// Reads a `resume` or `restart` answer.
    fn of(class: &EqClass) -> Option<Resume> {
        match class.values.as_slice() {
            [Value::Str(word), Value::Str(offset)] if word == RESUME_WORD => {
                offset.parse().ok().map(Resume::From)
            }
            [Value::Str(word), _] if word == RESTART_WORD => Some(Resume::Restart),
            _ => None,
        }
    }

    /// Where the chunks sent again start.
    fn offset(self) -> u64 {
        match self {
            Resume::From(offset) => offset,
            Resume::Restart => 0,
        }
    }

    /// False for an offset at or past the end: nothing the front-end sent is missing.
    fn needed(self, sent: u64) -> bool {
        match self {
            Resume::From(offset) => offset < sent,
            Resume::Restart => true,
        }
    }
}

/// The answers of one phase that arrived in time.
struct Gathered {
    classes: Vec<EqClass>,
    /// Ranks still connected that did not answer before the deadline.
    silent: RankSet,
}

/// Sends the entries of one [`bcast_files`] call.
struct Sender<'n> {
    net: &'n Network,
    options: FileOptions,
    /// The network's lost ranks when last looked at.
    lost: LostRanks,
    /// Changes of the network's lost ranks, so waits end when a rank is lost.
    lost_watch: watch::Receiver<LostRanks>,
    /// Rejoins not yet seen by a wait, so a rank that rejoined is asked again what it
    /// may have missed while its comm node was lost.
    rejoined: watch::Receiver<(u64, RankSet)>,
    /// Set once the tree took no packet in time: later entries do not touch the tree,
    /// since sending anything more (even making a stream) would wait on the same link.
    stalled: Option<String>,
    /// How long a comm node holds a partial wave of answers before sending it up.
    wave: Duration,
    /// The most the waves of the tree's levels can add to a rank's answer.
    slack: Duration,
}

impl<'n> Sender<'n> {
    fn new(net: &'n Network, options: FileOptions) -> Self {
        // Short enough that a silent rank delays the others' answers little, long enough
        // that answers arriving close together travel as one class.
        let wave = (options.timeout / 4).clamp(Duration::from_millis(1), Duration::from_secs(1));
        let levels = net.topology().depth() as u32 + 1;
        let lost_watch = net.lost_watch();
        let lost = lost_watch.borrow().clone();
        let rejoined = net.rejoined_watch();
        Sender { net, options, lost, lost_watch, rejoined, stalled: None, wave, slack: wave * levels }
    }

    /// Takes the network's lost ranks as they are now.
    fn refresh_lost(&mut self) {
        self.lost = self.lost_watch.borrow_and_update().clone();
    }

    /// The ranks of `ranks` not lost.
    fn live(&self, ranks: &RankSet) -> RankSet {
        ranks.difference(self.lost.ranks())
    }

    /// How many ranks of `ranks` are done: answered for good, or lost.
    fn finished(&self, ranks: &RankSet, answered: &RankSet) -> u64 {
        ranks.len() - self.live(ranks).difference(answered).len()
    }

    fn stream_options(&self) -> StreamOptions {
        let ms = u32::try_from(self.wave.as_millis()).unwrap_or(u32::MAX);
        StreamOptions { sync: SyncMode::TimeOut(ms), ..StreamOptions::reduce(TransformKind::EqClass) }
    }

    fn no_answer(&self, when: &str) -> String {
        format!(
            "no answer within {} s {when} (the rank is still connected: a hung file system?)",
            self.options.timeout.as_secs_f64()
        )
    }

    fn stalled(&self) -> String {
        format!(
            "the tree took no packet within {} s (a rank or comm node stopped reading; its link is up)",
            self.options.timeout.as_secs_f64()
        )
    }

    /// One entry: status phase, then the data phase over the ranks that want the data.
    async fn transfer(
        &mut self,
        comm: &Communicator,
        entry: &FileEntry,
        mut src: Source,
        index: usize,
        progress: &mut impl FnMut(Progress<'_>),
    ) -> Result<FileReport, ApiError> {
        let started = Instant::now();
        self.refresh_lost();
        let mut answers = Answers::default();
        // None: the entry is not sent, and its ranks failed.
        let file = match (&self.stalled, src.kind) {
            (Some(stall), _) => {
                let detail = format!("not sent: {stall}, earlier in this call");
                answers.add(Outcome::Failed, detail, &self.live(comm.ranks()));
                None
            }
            (None, EntryKind::File) => match open(&mut src).await {
                Ok(file) => Some(Some(file)),
                Err(e) => {
                    answers.add(Outcome::Failed, vanished(&src.source, &e), &self.live(comm.ranks()));
                    None
                }
            },
            (None, _) => Some(None),
        };
        progress(Progress::Started { index, entry, size: src.size });
        let mut receivers = RankSet::new();
        let mut hash = String::new();
        if let Some(file) = file {
            let data;
            (receivers, data) = self.status_phase(comm, &src, &mut answers).await?;
            let total = comm.ranks().len();
            let done = self.finished(comm.ranks(), &answers.accounted);
            progress(Progress::Ranks { index, done, total });
            if let (Some(file), Some(data)) = (file, data) {
                let ranks = comm.ranks().clone();
                let send = Transfer { src: &src, index, file, data, receivers: receivers.clone(), ranks };
                hash = self.data_phase(send, &mut answers, progress).await?;
            }
        }
        self.refresh_lost();
        let mut outcomes = answers.outcomes;
        outcomes.sort_by_key(|o| (o.outcome, o.ranks.first()));
        let Source { kind, source, destination, size, .. } = src;
        Ok(FileReport {
            kind,
            source,
            destination,
            size,
            hash,
            receivers,
            lost: lost_report(&self.lost, &comm.ranks().difference(&answers.accounted)),
            outcomes,
            elapsed: started.elapsed(),
        })
    }

    /// Sends the status, gathers the decisions, opens the data stream over the ranks
    /// that want the data (if any and if the entry has data) and tells every rank.
    async fn status_phase(
        &mut self,
        comm: &Communicator,
        src: &Source,
        answers: &mut Answers,
    ) -> Result<(RankSet, Option<Stream>), ApiError> {
        let limit = self.options.timeout;
        // Making a stream sends a control message down: it waits on the same links.
        let Some(mut status) = within(limit, self.net.new_stream(comm, self.stream_options())).await? else {
            self.stall(comm.ranks(), answers);
            return Ok((RankSet::new(), None));
        };
        let values = self.status_values(src, 0)?;
        if within(limit, status.send(FILE_STATUS, STATUS_FORMAT, &values)).await?.is_none() {
            self.stall(comm.ranks(), answers);
            close(status, limit).await;
            return Ok((RankSet::new(), None));
        }
        let again = Again { tag: FILE_STATUS, format: STATUS_FORMAT, values: &values };
        let gathered =
            self.gather(&mut status, comm.ranks(), limit, &again, &mut |_: &Self, _: &RankSet| {}).await?;
        let mut receivers = RankSet::new();
        for class in gathered.classes {
            answers.add_class(class, Some(&mut receivers));
        }
        if !gathered.silent.is_empty() {
            answers.add(Outcome::Failed, self.no_answer("to the status packet"), &gathered.silent);
        }
        let receivers = self.live(&receivers);
        // Links and directories are done at the status; only files have data.
        let data = if receivers.is_empty() || src.kind != EntryKind::File {
            None
        } else {
            let comm = self.net.communicator(receivers.clone())?;
            match within(limit, self.net.new_stream(&comm, self.stream_options())).await? {
                Some(data) => Some(data),
                None => {
                    self.stall(&receivers, answers);
                    close(status, limit).await;
                    return Ok((receivers, None));
                }
            }
        };
        let open = [Value::UInt(data.as_ref().map_or(0, Stream::id)), Value::Str(receivers.to_string())];
        let opened = within(limit, status.send(FILE_OPEN, OPEN_FORMAT, &open)).await?.is_some();
        self.close(status).await;
        match data {
            Some(data) if opened => Ok((receivers, Some(data))),
            Some(data) => {
                self.stall(&receivers, answers);
                close(data, limit).await;
                Ok((receivers, None))
            }
            None if receivers.is_empty() => Ok((receivers, None)),
            None => {
                // Only a front-end and back-end that disagree on the kinds get here.
                answers.add(Outcome::Failed, "asked for data that has none".into(), &receivers);
                Ok((receivers, None))
            }
        }
    }

    /// The values of `src`'s status packet, with `flags` added to its own.
    fn status_values(&self, src: &Source, flags: u32) -> Result<[Value; 9], ApiError> {
        Ok([
            Value::Str(utf8(&src.source)?),
            Value::ULong(src.mtime),
            Value::ULong(src.size),
            Value::Str(utf8(&src.destination)?),
            Value::Int(self.options.mode.code()),
            Value::UInt(src.perm),
            Value::Int(src.kind.code()),
            Value::Str(src.target.clone()),
            Value::UInt(flags | if src.exact { FLAG_EXACT } else { 0 }),
        ])
    }

    /// Sends the chunks and the end packet, gathers the final answers; returns the hash.
    async fn data_phase(
        &mut self,
        t: Transfer<'_>,
        answers: &mut Answers,
        progress: &mut impl FnMut(Progress<'_>),
    ) -> Result<String, ApiError> {
        let Transfer { src, index, mut file, mut data, receivers, ranks } = t;
        let limit = self.options.timeout;
        let mut hasher = blake3::Hasher::new();
        let mut sent: u64 = 0;
        let mut abort = String::new();
        let chunk = self.options.chunk;
        loop {
            let (payload, filled) = match read_chunk(&mut file, sent, chunk).await {
                Ok(p) => p,
                Err(e) => {
                    abort = format!("reading the source failed after {sent} bytes: {e}");
                    break;
                }
            };
            if filled == 0 {
                break;
            }
            if sent + filled as u64 > src.size {
                abort = format!("the source grew during the transfer (past {} bytes)", src.size);
                break;
            }
            hasher.update(&payload[payload.len() - filled..]);
            if within(limit, data.send_encoded(FILE_CHUNK, payload)).await?.is_none() {
                self.stall(&receivers, answers);
                close(data, limit).await;
                return Ok(String::new());
            }
            sent += filled as u64;
            progress(Progress::Sent { index, sent, size: src.size });
            if filled < chunk {
                break;
            }
        }
        if abort.is_empty() && sent != src.size {
            abort = format!("the source shrank during the transfer ({sent} of {} bytes)", src.size);
        }
        if abort.is_empty() {
            // Bytes read before and after an edit in place make a copy that is neither
            // the old file nor the new one: the ranks must not keep it.
            abort = match file.metadata().await {
                Ok(m) if Some(Identity::of(&m)) == src.opened => String::new(),
                Ok(_) => format!(
                    "{SOURCE_CHANGED} (its size, mtime or ctime moved while it was read); send it again"
                ),
                Err(e) => format!("cannot stat the source after reading it: {e}"),
            };
        }
        let hash = hasher.finalize().to_hex().to_string();
        let end = [Value::Str(hash.clone()), Value::ULong(sent), Value::Str(abort)];
        if within(limit, data.send(FILE_END, END_FORMAT, &end)).await?.is_none() {
            self.stall(&receivers, answers);
            close(data, limit).await;
            return Ok(String::new());
        }
        // Renaming into place comes after flushing the file to disk, which for a large
        // file can take long after the last chunk: allow 1 s per 32 MiB on top.
        let flush = Duration::from_secs(src.size >> 25);
        let total = ranks.len();
        let before = answers.accounted.clone();
        let mut done = |sender: &Self, answered: &RankSet| {
            let mut all = before.clone();
            all.union_with(answered);
            let done = sender.finished(&ranks, &all);
            progress(Progress::Ranks { index, done, total });
        };
        let again = Again { tag: FILE_END, format: END_FORMAT, values: &end };
        let restatus = self.status_values(src, FLAG_RESTART)?;
        let mut expect = receivers.clone();
        for round in 0..=MAX_RESUMES {
            let gathered =
                self.gather(&mut data, &expect, limit.saturating_add(flush), &again, &mut done).await?;
            let mut resume = Vec::new();
            for class in gathered.classes {
                match Resume::of(&class) {
                    Some(r) if round < MAX_RESUMES && r.needed(sent) => resume.push((r, class.ranks)),
                    Some(_) => {
                        let detail = format!("chunks missed again after {MAX_RESUMES} resumes");
                        answers.add(Outcome::Failed, detail, &class.ranks);
                    }
                    None => answers.add_class(class, None),
                }
            }
            if !gathered.silent.is_empty() {
                let when = format!("(+{} s to flush) after the last chunk", flush.as_secs());
                answers.add(Outcome::Failed, self.no_answer(&when), &gathered.silent);
            }
            if resume.is_empty() {
                break;
            }
            expect = RankSet::new();
            for (r, ranks) in resume {
                let status = (r == Resume::Restart).then_some(&restatus[..]);
                tracing::debug!(%ranks, ?r, "sending again what rejoined ranks missed");
                for rank in ranks.iter() {
                    let again = Resend { rank, offset: r.offset(), status, end: &end };
                    if !self.resend(&mut file, &data, again).await? {
                        self.stall(&ranks, answers);
                        close(data, limit).await;
                        return Ok(hash);
                    }
                }
                expect.union_with(&ranks);
            }
        }
        self.close(data).await;
        Ok(hash)
    }

    /// The tree stopped taking packets: every rank of `ranks` still connected failed,
    /// and the entries after this one are not sent.
    fn stall(&mut self, ranks: &RankSet, answers: &mut Answers) {
        // Ranks lost while the tree was stuck (perhaps why it was) are reported lost.
        self.refresh_lost();
        let stall = self.stalled();
        answers.add(Outcome::Failed, stall.clone(), &self.live(ranks));
        self.stalled = Some(stall);
    }

    /// Closes a stream; when the tree takes no control message in time, later entries
    /// are not sent (see [`Sender::stalled`]).
    async fn close(&mut self, stream: Stream) {
        if !close(stream, self.options.timeout).await {
            self.stalled = Some(self.stalled());
        }
    }

    /// Sends one rank, directly, what it missed while its comm node was lost: the
    /// status if asked, the file from an offset, and the end packet again. False when
    /// the tree took no packet in time.
    async fn resend(
        &mut self,
        file: &mut tokio::fs::File,
        data: &Stream,
        r: Resend<'_>,
    ) -> Result<bool, ApiError> {
        use tokio::io::AsyncSeekExt;
        let Resend { rank, offset, status, end } = r;
        let limit = self.options.timeout;
        if let Some(status) = status {
            if within(limit, data.send_to(rank, FILE_STATUS, STATUS_FORMAT, status)).await?.is_none() {
                return Ok(false);
            }
        }
        let mut at = offset;
        if let Err(e) = file.seek(std::io::SeekFrom::Start(offset)).await {
            tracing::warn!("resending to rank {rank}: cannot seek the source to {offset}: {e}");
        }
        loop {
            // A read error leaves the rank short of bytes: the end packet fails it.
            let Ok((payload, filled)) = read_chunk(file, at, self.options.chunk).await else { break };
            if filled == 0 {
                break;
            }
            if within(limit, data.send_encoded_to(rank, FILE_CHUNK, payload)).await?.is_none() {
                return Ok(false);
            }
            at += filled as u64;
            if filled < self.options.chunk {
                break;
            }
        }
        Ok(within(limit, data.send_to(rank, FILE_END, END_FORMAT, end)).await?.is_some())
    }

    /// Reads answers from `expect` until each answered or was lost, or `limit` (plus
    /// what the tree's levels may add) passed. A rank that rejoins meanwhile is sent
    /// `again` (its packet may have gone with its lost comm node); an answer from a
    /// rank that already answered is dropped.
    /// `answered` is told, after each packet, every rank that answered so far.
    async fn gather(
        &mut self,
        stream: &mut Stream,
        expect: &RankSet,
        limit: Duration,
        again: &Again<'_>,
        answered: &mut impl FnMut(&Self, &RankSet),
    ) -> Result<Gathered, ApiError> {
        let deadline = deadline_after(limit.saturating_add(self.slack));
        self.refresh_lost();
        let mut missing = self.live(expect);
        let mut classes = Vec::new();
        let mut got = RankSet::new();
        let mut timed_out = false;
        let mut watching = true;
        // Rejoins since the last wait count: the first change is seen at once.
        let mut rejoins = self.rejoined.clone();
        let mut watching_rejoins = true;
        while !missing.is_empty() {
            tokio::select! {
                packet = stream.recv() => match packet {
                    Ok(p) => {
                        for mut class in p.eq_classes()? {
                            class.ranks = class.ranks.intersection(&missing);
                            if class.ranks.is_empty() {
                                continue;
                            }
                            missing = missing.difference(&class.ranks);
                            got.union_with(&class.ranks);
                            classes.push(class);
                        }
                        answered(self, &got);
                    }
                    Err(ApiError::StreamClosed(_)) => break,
                    Err(e) => return Err(e),
                },
                changed = self.lost_watch.changed(), if watching => match changed {
                    Ok(()) => {
                        self.lost = self.lost_watch.borrow_and_update().clone();
                        missing = missing.difference(self.lost.ranks());
                    }
                    // The root task ended: the stream closes too, or the deadline passes.
                    Err(_) => watching = false,
                },
                changed = rejoins.changed(), if watching_rejoins => match changed {
                    Ok(()) => {
                        let back = missing.intersection(&rejoins.borrow_and_update().1);
                        for rank in back.iter() {
                            // A tree that takes nothing leaves the rank to the deadline.
                            let _ = within(limit, stream.send_to(rank, again.tag, again.format, again.values)).await?;
                        }
                    }
                    Err(_) => watching_rejoins = false,
                },
                () = tokio::time::sleep_until(deadline) => {
                    timed_out = true;
                    break;
                }
            }
        }
        // Losses reported while the last answers came in.
        self.refresh_lost();
        // Rejoins seen so far were handled; later waits react only to new ones.
        self.rejoined.borrow_and_update();
        let silent = if timed_out { self.live(&missing) } else { RankSet::new() };
        Ok(Gathered { classes, silent })
    }
}

/// What [`Sender::resend`] sends one rank again.
struct Resend<'a> {
    rank: u32,
    offset: u64,
    /// The status with [`FLAG_RESTART`], for a rank whose `FILE_OPEN` was lost.
    status: Option<&'a [Value]>,
    end: &'a [Value],
}

/// The data phase of one file.
struct Transfer<'a> {
    src: &'a Source,
    index: usize,
    file: tokio::fs::File,
    data: Stream,
    receivers: RankSet,
    /// Every rank of the communicator, for progress reports.
    ranks: RankSet,
}

/// Opens a file entry and reads size, mtime and mode from the open file, so they
/// describe the content that is sent.
async fn open(src: &mut Source) -> Result<tokio::fs::File, SourceError> {
    let file = tokio::fs::File::open(&src.source)
        .await
        .map_err(|e| SourceError::Open { path: src.source.clone(), source: e })?;
    let meta =
        file.metadata().await.map_err(|e| SourceError::Stat { path: src.source.clone(), source: e })?;
    if !meta.is_file() {
        return Err(SourceError::NotAFile { path: src.source.clone(), kind: kind_of(meta.file_type()) });
    }
    src.size = meta.len();
    src.mtime = mtime_ns(&meta);
    src.perm = meta.permissions().mode() & 0o7777;
    src.opened = Some(Identity::of(&meta));
    Ok(file)
}

/// Why an entry whose source passed the check before the call is not sent.
fn vanished(path: &Path, e: &SourceError) -> String {
    match e {
        SourceError::Open { source, .. } | SourceError::Stat { source, .. } => {
            format!("source {} vanished: {source}", path.display())
        }
        other => format!("source {} changed after it was checked: {other}", path.display()),
    }
}

/// The head of a [`FILE_CHUNK`] payload (`%uld %b`) for `len` bytes at `offset`.
fn chunk_head(offset: u64, len: usize, out: &mut Vec<u8>) -> std::io::Result<()> {
    encode_values(&[Value::ULong(offset)], out);
    // Cannot fail: chunks are at most MAX_CHUNK, far below what a frame carries.
    encode_bytes_head(len, out).map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
}

/// Reads up to `chunk` bytes at `offset` straight into a [`FILE_CHUNK`] payload, so
/// the bytes are not copied again on their way to the links. Fills the whole chunk
/// (short reads happen), so chunks are fixed-size but the last. Returns the payload
/// and the number of bytes read (at its end).
async fn read_chunk(
    file: &mut tokio::fs::File,
    offset: u64,
    chunk: usize,
) -> std::io::Result<(Vec<u8>, usize)> {
    let mut payload = Vec::with_capacity(chunk + 16);
    chunk_head(offset, chunk, &mut payload)?;
    let start = payload.len();
    let end = start + chunk;
    while payload.len() < end {
        // Reads into the spare capacity: no zero-filling, no growth past `end`.
        let left = end - payload.len();
        let mut room = (&mut payload).limit(left);
        if file.read_buf(&mut room).await? == 0 {
            break;
        }
    }
    let filled = payload.len() - start;
    // The same head with the length actually read; it has the same size.
    let mut head = Vec::with_capacity(start);
    chunk_head(offset, filled, &mut head)?;
    if let Some(place) = payload.get_mut(..head.len()) {
        place.copy_from_slice(&head);
    }
    Ok((payload, filled))
}

/// `fut`, or `None` when it did not finish within `limit`.
async fn within<T>(
    limit: Duration,
    fut: impl std::future::Future<Output = Result<T, ApiError>>,
) -> Result<Option<T>, ApiError> {
    match tokio::time::timeout(limit, fut).await {
        Ok(result) => result.map(Some),
        Err(_) => Ok(None),
    }
}

/// Closes a stream; a tree that takes no control message within `limit` is left as it
/// is, and false is returned.
async fn close(stream: Stream, limit: Duration) -> bool {
    tokio::time::timeout(limit, stream.close()).await.is_ok()
}

/// `limit` from now; far in the future when that is past what an instant can hold.
fn deadline_after(limit: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(limit).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::test_support::encode_checked;

    #[tokio::test]
    async fn chunks_read_into_their_payload_encode_as_stream_send_would() {
        let path = std::env::temp_dir().join(format!("treecast-chunk-{}", std::process::id()));
        let data: Vec<u8> = (0..10_000u32).map(|i| (i * 7 % 251) as u8).collect();
        std::fs::write(&path, &data).unwrap();
        let mut file = tokio::fs::File::open(&path).await.unwrap();
        let mut offset = 0u64;
        for want in [4096, 4096, 1808, 0] {
            let (payload, filled) = read_chunk(&mut file, offset, 4096).await.unwrap();
            assert_eq!(filled, want);
            let part = data[offset as usize..offset as usize + filled].to_vec();
            let values = [Value::ULong(offset), Value::Bytes(part)];
            assert_eq!(payload, encode_checked(super::super::CHUNK_FORMAT, &values).unwrap().1);
            offset += filled as u64;
        }
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn resume_and_restart_answers_say_what_to_send_again() {
        let class = |word: &str, detail: &str| EqClass {
            values: vec![Value::Str(word.into()), Value::Str(detail.into())],
            ranks: RankSet::from_iter([3]),
        };
        assert_eq!(Resume::of(&class(RESUME_WORD, "4096")), Some(Resume::From(4096)));
        assert_eq!(Resume::of(&class(RESTART_WORD, "")), Some(Resume::Restart));
        assert_eq!(Resume::of(&class(RESUME_WORD, "x")), None, "a bad offset is no resume");
        assert_eq!(Resume::of(&class("written", "")), None);
        // Nothing missing past the end; a restart always needs the status again,
        // even for an empty file.
        assert!(!Resume::From(10).needed(10));
        assert!(Resume::From(9).needed(10));
        assert!(Resume::Restart.needed(0));
        assert_eq!(Resume::Restart.offset(), 0);
    }

    #[test]
    fn a_regular_file_sent_as_a_link_is_named_a_regular_file() {
        let path = std::env::temp_dir().join(format!("treecast-kind-{}", std::process::id()));
        std::fs::write(&path, b"x").unwrap();
        let err = inspect(&FileEntry::symlink(&path, "/d/x")).unwrap_err();
        std::fs::remove_file(&path).unwrap();
        let text = err.to_string();
        assert!(text.contains("is a regular file, not a symbolic link"), "{text}");
    }

    #[test]
    fn a_zero_or_huge_time_limit_is_refused_before_anything_is_sent() {
        for timeout in [Duration::ZERO, Duration::from_secs(u64::MAX), super::super::MAX_TIMEOUT * 2] {
            let options = FileOptions { timeout, ..FileOptions::default() };
            assert!(matches!(options.validate(), Err(SourceError::Timeout(_))), "{timeout:?}");
        }
        let options = FileOptions { timeout: super::super::MAX_TIMEOUT, ..FileOptions::default() };
        options.validate().unwrap();
        // Deadlines from the largest values do not overflow.
        let _ = deadline_after(Duration::MAX);
    }
}
