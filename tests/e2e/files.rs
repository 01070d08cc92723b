//! End-to-end tests of file distribution (`bcast_file`, `treecast bcast`) on loopback.
//!
//! All back-ends run on this host, so they share one file system: real copies go
//! to a destination under a per-test directory (temporary file + rename makes
//! identical concurrent writes safe), and the shared-file-system case sends a file
//! to its own path.

use crate::common::tree::{finish, launch};

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use crate::common::{assert_no_leftovers, commnode_pid, random_bytes, TestDir};
use treecast::apps::protocol::{TAG_DIE, TAG_STALL};
use treecast_api::{
    ApiError, Network, NetworkBuilder, RankSet, SourceError, StreamOptions, Topology, TransformKind, Value,
};
use treecast_files::{
    bcast_file, bcast_files, FileEntry, FileOptions, FileReport, Outcome, Progress, WriteMode,
};

const TREECAST: &str = env!("CARGO_BIN_EXE_treecast");
const LIMIT: Duration = Duration::from_secs(20);
const CHUNK: usize = 4096;

fn set_mtime(path: &Path, time: SystemTime) {
    std::fs::File::options().write(true).open(path).unwrap().set_modified(time).unwrap();
}

fn mtime(path: &Path) -> SystemTime {
    std::fs::metadata(path).unwrap().modified().unwrap()
}

/// Files in `dir` whose names look like a transfer's temporary file.
fn temp_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".treecast-"))
        .collect()
}

async fn send(net: &Network, src: &Path, dst: Option<&Path>, mode: WriteMode) -> FileReport {
    let comm = net.broadcast_communicator();
    tokio::time::timeout(LIMIT, bcast_file(net, &comm, src, dst, mode, CHUNK)).await.unwrap().unwrap()
}

/// Every rank wrote the file, or (all ranks sharing this host's file system) found
/// it already written by a faster rank: a rank whose status check comes after
/// another rank's rename correctly sees the same file and skips.
fn assert_written_everywhere(report: &FileReport, net: &Network) {
    let mut done = report.ranks_with(Outcome::Written);
    assert!(!done.is_empty(), "{report:?}");
    done.union_with(&report.ranks_with(Outcome::SkippedShared));
    assert_eq!(done, all(net), "{report:?}");
}

fn all(net: &Network) -> RankSet {
    RankSet::range(0, net.backends())
}

#[tokio::test]
async fn every_size_is_copied_exactly_to_every_rank() {
    let dir = TestDir::new("sizes");
    let net = launch("kary:2", 3).await;
    for size in [0, 1, CHUNK, CHUNK + 1, 3 * CHUNK, 3_000_000 + 17] {
        let data = random_bytes(size);
        let src = dir.path(&format!("src-{size}"));
        std::fs::write(&src, &data).unwrap();
        let dst = dir.path(&format!("dst-{size}"));
        let report = send(&net, &src, Some(&dst), WriteMode::Leave).await;
        assert!(report.ok(), "{report:?}");
        assert_written_everywhere(&report, &net);
        assert_eq!(report.size, size as u64);
        assert!(report.hash.len() == 64 && report.hash.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_eq!(std::fs::read(&dst).unwrap(), data, "size {size}");
    }
    assert!(temp_files(dir.root()).is_empty(), "{:?}", temp_files(dir.root()));
    finish(net).await;
}

/// Writes `size` pseudo-random bytes (seeded xorshift, in 1 MiB blocks) to `path`;
/// returns their BLAKE3.
fn write_random_file(path: &Path, size: usize, seed: u64) -> blake3::Hash {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut hasher = blake3::Hasher::new();
    let mut x = seed | 1;
    let mut block = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(block.len());
        for word in block[..n].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            word.copy_from_slice(&x.to_le_bytes()[..word.len()]);
        }
        hasher.update(&block[..n]);
        out.write_all(&block[..n]).unwrap();
        left -= n;
    }
    out.flush().unwrap();
    hasher.finalize()
}

fn hash_file(path: &Path) -> blake3::Hash {
    let mut hasher = blake3::Hasher::new();
    hasher.update_reader(std::fs::File::open(path).unwrap()).unwrap();
    hasher.finalize()
}

#[tokio::test]
async fn two_hundred_megabytes_arrive_byte_identical_at_every_rank() {
    const SIZE: usize = 200 << 20;
    let dir = TestDir::new("big");
    let src = dir.path("src.bin");
    let want = write_random_file(&src, SIZE, 0x5eed_2000_0000_0001);
    // Each back-end runs in a directory of its own, and the destination goes through
    // /proc/self/cwd, so every rank writes its own copy although they share this host.
    for rank in 0..4 {
        std::fs::create_dir(dir.path(&format!("rank{rank}"))).unwrap();
    }
    let script = format!("cd {}/rank$TREECAST_RANK && exec {TREECAST} backend", dir.root().display());
    let topo = Topology::from_spec("kary:2", Some(4)).unwrap();
    let net = NetworkBuilder::new(topo)
        .treecast_path(TREECAST)
        .startup_timeout(LIMIT)
        .backend_command(["/bin/sh", "-c", &script])
        .launch()
        .await
        .unwrap();
    let comm = net.broadcast_communicator();
    let entries = [FileEntry::file(&src, Some(PathBuf::from("/proc/self/cwd/copy.bin")))];
    let options = FileOptions::default();
    let mut ranks_done = Vec::new();
    let transfer = bcast_files(&net, &comm, &entries, &options, |p| {
        if let Progress::Ranks { done, total, .. } = p {
            ranks_done.push((done, total));
        }
    });
    let r = tokio::time::timeout(Duration::from_secs(300), transfer).await.unwrap().unwrap().pop().unwrap();
    assert!(r.ok(), "{r:?}");
    assert_eq!(r.ranks_with(Outcome::Written), all(&net), "every rank writes its own copy: {r:?}");
    assert_eq!(ranks_done.first(), Some(&(0, 4)), "nobody is done before the data: {ranks_done:?}");
    assert_eq!(ranks_done.last(), Some(&(4, 4)), "the progress ends with every rank: {ranks_done:?}");
    assert!(ranks_done.windows(2).all(|w| w[0].0 <= w[1].0), "{ranks_done:?}");
    assert_eq!(r.hash, want.to_hex().as_str());
    for rank in 0..4 {
        let copy = dir.path(&format!("rank{rank}/copy.bin"));
        assert_eq!(std::fs::metadata(&copy).unwrap().len(), SIZE as u64, "rank {rank}");
        assert_eq!(hash_file(&copy), want, "rank {rank}");
        assert!(temp_files(&dir.path(&format!("rank{rank}"))).is_empty());
    }
    finish(net).await;
}

#[tokio::test]
async fn mode_bits_and_mtime_are_preserved_and_a_directory_takes_the_source_name() {
    let dir = TestDir::new("meta");
    let net = launch("flat", 2).await;
    let src = dir.path("tool.sh");
    std::fs::write(&src, b"#!/bin/sh\necho hi\n").unwrap();
    std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o751)).unwrap();
    let when = UNIX_EPOCH + Duration::new(1_600_000_000, 123_456_789);
    set_mtime(&src, when);
    let out = dir.path("out");
    std::fs::create_dir(&out).unwrap();
    let report = send(&net, &src, Some(&out), WriteMode::Leave).await;
    assert_written_everywhere(&report, &net);
    let copy = out.join("tool.sh");
    let meta = std::fs::metadata(&copy).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o751);
    assert_eq!(meta.modified().unwrap(), when);
    assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&src).unwrap());
    finish(net).await;
}

#[tokio::test]
async fn write_modes_leave_newer_and_overwrite() {
    let dir = TestDir::new("modes");
    let net = launch("flat", 1).await;
    let src = dir.path("src");
    let dst = dir.path("dst");
    let t = |s: u64| UNIX_EPOCH + Duration::from_secs(1_700_000_000 + s);
    std::fs::write(&src, b"new content").unwrap();
    set_mtime(&src, t(100));
    let put_old = |content: &[u8], time: SystemTime| {
        std::fs::write(&dst, content).unwrap();
        set_mtime(&dst, time);
    };

    // leave: an existing destination is kept, whatever its age.
    put_old(b"old", t(0));
    let r = send(&net, &src, Some(&dst), WriteMode::Leave).await;
    assert_eq!(r.ranks_with(Outcome::SkippedLeave), all(&net), "{r:?}");
    assert!(r.ok());
    assert!(r.receivers.is_empty(), "skipping ranks take no data: {r:?}");
    assert_eq!(std::fs::read(&dst).unwrap(), b"old");

    // newer: kept when the destination is newer …
    put_old(b"newer", t(200));
    let r = send(&net, &src, Some(&dst), WriteMode::Newer).await;
    assert_eq!(r.ranks_with(Outcome::SkippedOlder), all(&net), "{r:?}");
    assert_eq!(std::fs::read(&dst).unwrap(), b"newer");
    // … or as old as the source …
    put_old(b"same age", t(100));
    let r = send(&net, &src, Some(&dst), WriteMode::Newer).await;
    assert_eq!(r.ranks_with(Outcome::SkippedOlder), all(&net), "{r:?}");
    // … and overwritten when older.
    put_old(b"old", t(0));
    let r = send(&net, &src, Some(&dst), WriteMode::Newer).await;
    assert_eq!(r.ranks_with(Outcome::Written), all(&net), "{r:?}");
    assert_eq!(r.receivers, all(&net), "{r:?}");
    assert_eq!(std::fs::read(&dst).unwrap(), b"new content");
    assert_eq!(mtime(&dst), t(100));

    // overwrite: always, even over a newer destination.
    put_old(b"newest", t(300));
    let r = send(&net, &src, Some(&dst), WriteMode::Overwrite).await;
    assert_eq!(r.ranks_with(Outcome::Written), all(&net), "{r:?}");
    assert_eq!(std::fs::read(&dst).unwrap(), b"new content");

    // A destination with the same size and mtime is the same file: skipped in every mode.
    let r = send(&net, &src, Some(&dst), WriteMode::Overwrite).await;
    assert_eq!(r.ranks_with(Outcome::SkippedShared), all(&net), "{r:?}");
    assert!(temp_files(dir.root()).is_empty());
    finish(net).await;
}

#[tokio::test]
async fn ranks_that_see_the_source_at_its_path_skip_it() {
    let dir = TestDir::new("shared");
    let net = launch("kary:2", 4).await;
    let src = dir.path("shared.bin");
    let data = random_bytes(3 * CHUNK + 5);
    std::fs::write(&src, &data).unwrap();
    let before = mtime(&src);
    for mode in [WriteMode::Leave, WriteMode::Newer, WriteMode::Overwrite] {
        let r = send(&net, &src, None, mode).await;
        assert!(r.ok(), "{r:?}");
        assert_eq!(r.ranks_with(Outcome::SkippedShared), all(&net), "{r:?}");
        assert_eq!(r.outcomes.len(), 1, "one class for every rank: {r:?}");
        assert!(r.receivers.is_empty(), "no rank took the data: {r:?}");
        assert!(r.outcomes[0].detail.contains("shared file system"), "{r:?}");
    }
    assert_eq!(std::fs::read(&src).unwrap(), data);
    assert_eq!(mtime(&src), before);
    assert!(temp_files(dir.root()).is_empty());
    finish(net).await;
}

#[tokio::test]
async fn a_missing_destination_directory_fails_every_rank_with_a_clear_message() {
    let dir = TestDir::new("nodir");
    let net = launch("flat", 2).await;
    let src = dir.path("src");
    std::fs::write(&src, b"x").unwrap();
    let dst = dir.path("missing/sub/file");
    let r = send(&net, &src, Some(&dst), WriteMode::Leave).await;
    assert!(!r.ok());
    assert_eq!(r.ranks_with(Outcome::Failed), all(&net), "{r:?}");
    let detail = &r.outcomes[0].detail;
    assert!(detail.contains("does not exist") && detail.contains("missing/sub"), "{detail}");
    assert!(!dst.exists());
    finish(net).await;
}

#[tokio::test]
async fn a_bad_source_is_an_error_before_anything_is_sent() {
    let dir = TestDir::new("badsrc");
    let net = launch("flat", 1).await;
    let comm = net.broadcast_communicator();
    let err = bcast_file(&net, &comm, &dir.path("absent"), None, WriteMode::Leave, CHUNK).await.unwrap_err();
    assert!(matches!(err, ApiError::Source(SourceError::Open { .. })), "{err:?}");
    assert!(err.to_string().contains("absent"), "{err}");
    let err = bcast_file(&net, &comm, dir.root(), None, WriteMode::Leave, CHUNK).await.unwrap_err();
    assert!(matches!(err, ApiError::Source(SourceError::NotAFile { .. })), "{err:?}");
    assert!(err.to_string().contains("not a regular file (a directory)"), "{err}");
    let src = dir.path("src");
    std::fs::write(&src, b"x").unwrap();
    let err = bcast_file(&net, &comm, &src, None, WriteMode::Leave, 0).await.unwrap_err();
    assert!(matches!(err, ApiError::Source(SourceError::ChunkSize(0))), "{err:?}");
    finish(net).await;
}

#[tokio::test]
async fn a_rank_killed_mid_transfer_is_lost_and_leaves_no_file_under_the_destination() {
    let dir = TestDir::new("killed");
    let net = launch("flat", 2).await;
    let src = dir.path("big");
    let data = random_bytes(16 << 20);
    std::fs::write(&src, &data).unwrap();
    let dst = dir.path("copy");
    // Only rank 1 receives, so a file under `dst` could only be its partial copy.
    let comm = net.communicator(RankSet::single(1)).unwrap();
    let killer = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    let sent = Arc::new(AtomicU64::new(0));
    let seen = sent.clone();
    let entry = [FileEntry::file(&src, Some(dst.clone()))];
    let options = FileOptions { chunk: CHUNK, ..FileOptions::default() };
    let transfer = bcast_files(&net, &comm, &entry, &options, |p| {
        if let Progress::Sent { sent, .. } = p {
            seen.store(sent, Ordering::Relaxed)
        }
    });
    let kill = async {
        while sent.load(Ordering::Relaxed) < (1 << 20) {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        killer.send(TAG_DIE, "%ad", &[Value::IntArray(vec![1])]).await.unwrap();
    };
    let (reports, ()) = tokio::time::timeout(LIMIT, async { tokio::join!(transfer, kill) }).await.unwrap();
    let report = reports.unwrap().pop().unwrap();
    assert!(!report.ok());
    assert_eq!(report.lost_ranks(), RankSet::single(1), "{report:?}");
    assert!(report.outcomes.is_empty(), "{report:?}");
    assert!(!dst.exists(), "a partial file was left under the destination name");
    // The killed rank's temporary file is still there, until the next transfer to
    // that directory (here, by rank 0) removes it.
    assert_eq!(temp_files(dir.root()).len(), 1, "{:?}", temp_files(dir.root()));
    let comm = net.communicator(RankSet::single(0)).unwrap();
    let small = dir.path("small");
    std::fs::write(&small, b"x").unwrap();
    let entry = [FileEntry::file(&small, Some(dir.path("small-copy")))];
    let report = bcast_files(&net, &comm, &entry, &options, |_| {}).await.unwrap().pop().unwrap();
    assert!(report.ok(), "{report:?}");
    assert!(temp_files(dir.root()).is_empty(), "stale temporary file kept: {:?}", temp_files(dir.root()));
    finish(net).await;
}

/// A comm node SIGKILLed mid-transfer (recovery on, the default): its back-ends rejoin
/// the front-end, say from which offset they miss the file, get the rest sent again
/// and check the whole copy end to end like everyone else.
#[tokio::test]
async fn a_comm_node_killed_mid_transfer_its_ranks_rejoin_and_receive_the_rest() {
    let dir = TestDir::new("resume");
    // Pre-order ids: 0 front-end; 1 comm node of ranks 0-1; 4 comm node of ranks 2-3.
    let net = launch("balanced:2x2", 4).await;
    const SIZE: usize = 8 << 20;
    let src = dir.path("big");
    let data = random_bytes(SIZE);
    std::fs::write(&src, &data).unwrap();
    let out = dir.path("out");
    std::fs::create_dir(&out).unwrap();
    let pid = commnode_pid(net.session(), 1);
    let comm = net.broadcast_communicator();
    let options = FileOptions { chunk: CHUNK, ..FileOptions::default() };
    let entry = [FileEntry::file(&src, Some(out.join("copy")))];
    let mut killed = false;
    let transfer = bcast_files(&net, &comm, &entry, &options, |p| {
        if let Progress::Sent { sent, .. } = p {
            if !killed && sent >= SIZE as u64 / 4 {
                Command::new("kill").arg("-9").arg(pid.to_string()).status().unwrap();
                killed = true;
            }
        }
    });
    let report = tokio::time::timeout(LIMIT, transfer).await.unwrap().unwrap().pop().unwrap();
    assert!(killed);
    assert!(report.ok(), "{report:?}");
    assert_written_everywhere(&report, &net);
    assert_eq!(std::fs::read(out.join("copy")).unwrap(), data);
    assert!(temp_files(&out).is_empty(), "{:?}", temp_files(&out));
    let orphaned = net.orphaned();
    assert_eq!(orphaned.len(), 1, "{orphaned:?}");
    assert_eq!(orphaned[0].0, RankSet::range(0, 2));
    assert!(net.lost().ranks().is_empty(), "{:?}", net.lost());
    finish(net).await;
}

#[tokio::test]
async fn a_source_edited_in_place_during_the_transfer_fails_instead_of_leaving_torn_copies() {
    // Regression: every rank reported `written` for a copy that was neither the old
    // file nor the new one.
    let dir = TestDir::new("torn");
    let net = launch("kary:2", 3).await;
    let src = dir.path("src");
    const SIZE: usize = 1 << 20;
    std::fs::write(&src, random_bytes(SIZE)).unwrap();
    // An old mtime, so the edit below moves it whatever the file system's timestamp resolution.
    set_mtime(&src, UNIX_EPOCH + Duration::from_secs(1_000_000_000));
    let out = dir.path("out");
    std::fs::create_dir(&out).unwrap();
    let dst = out.join("copy");
    let options = FileOptions { chunk: CHUNK, ..FileOptions::default() };
    let entry = [FileEntry::file_at(&src, &dst)];
    let comm = net.broadcast_communicator();
    let mut edited = false;
    let transfer = bcast_files(&net, &comm, &entry, &options, |p| {
        if let Progress::Sent { sent, .. } = p {
            if !edited && sent >= SIZE as u64 / 4 {
                // Bytes already sent and bytes not yet sent both change; the size does not.
                use std::os::unix::fs::FileExt;
                let f = std::fs::OpenOptions::new().write(true).open(&src).unwrap();
                f.write_all_at(&[0xAA; 64], 0).unwrap();
                f.write_all_at(&[0xBB; 64], SIZE as u64 - 64).unwrap();
                edited = true;
            }
        }
    });
    let report = tokio::time::timeout(LIMIT, transfer).await.unwrap().unwrap().pop().unwrap();
    assert!(!report.ok(), "{report:?}");
    assert_eq!(report.ranks_with(Outcome::Failed), all(&net), "{report:?}");
    assert!(
        report.outcomes.iter().all(|o| o.detail.contains("the source changed during the transfer")),
        "{report:?}"
    );
    assert!(!dst.exists(), "a torn copy was put in place");
    assert!(temp_files(&out).is_empty(), "{:?}", temp_files(&out));
    finish(net).await;
}

#[tokio::test]
async fn a_rank_that_stops_answering_fails_after_the_time_limit_and_the_others_go_on() {
    let dir = TestDir::new("stall");
    let net = launch("flat", 2).await;
    let src = dir.path("src");
    let data = random_bytes(3 * CHUNK + 1);
    std::fs::write(&src, &data).unwrap();
    let out = dir.path("out");
    std::fs::create_dir(&out).unwrap();
    // Rank 1 stops reading for a while; its link stays up.
    let comm = net.broadcast_communicator();
    let stall = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await.unwrap();
    stall.send(TAG_STALL, "%ad %d", &[Value::IntArray(vec![1]), Value::Int(3000)]).await.unwrap();
    let options = FileOptions { chunk: CHUNK, timeout: Duration::from_millis(500), ..FileOptions::default() };
    let entries = [FileEntry::file(&src, Some(out.join("a")))];
    let r = bcast_files(&net, &comm, &entries, &options, |_| {}).await.unwrap().pop().unwrap();
    assert!(!r.ok());
    assert!(r.lost.is_empty(), "a silent rank is not lost: {r:?}");
    assert_eq!(r.receivers, RankSet::single(0), "{r:?}");
    assert_eq!(r.ranks_with(Outcome::Written), RankSet::single(0), "{r:?}");
    assert_eq!(r.ranks_with(Outcome::Failed), RankSet::single(1), "{r:?}");
    let failed = r.outcomes.iter().find(|o| o.outcome == Outcome::Failed).unwrap();
    assert!(failed.detail.contains("no answer within 0.5 s to the status packet"), "{r:?}");
    assert_eq!(std::fs::read(out.join("a")).unwrap(), data);

    // Back, rank 1 reads the old status late and drops its temporary file; the next
    // transfer reaches it again.
    stall.recv_timeout(LIMIT).await.unwrap();
    let entries = [FileEntry::file(&src, Some(out.join("b")))];
    let r = bcast_files(&net, &comm, &entries, &options, |_| {}).await.unwrap().pop().unwrap();
    assert!(r.ok(), "{r:?}");
    assert_written_everywhere(&r, &net);
    assert!(temp_files(&out).is_empty(), "{:?}", temp_files(&out));
    stall.close().await;
    finish(net).await;
}

#[tokio::test]
async fn a_rank_missing_at_launch_is_reported_lost_at_once_not_waited_for() {
    let dir = TestDir::new("missing-rank");
    let out = dir.path("out");
    std::fs::create_dir(&out).unwrap();
    let script = format!("if [ \"$TREECAST_RANK\" = 1 ]; then exit 1; fi; exec {TREECAST} backend");
    let topo = Topology::from_spec("flat", Some(2)).unwrap();
    let net = NetworkBuilder::new(topo)
        .treecast_path(TREECAST)
        .startup_timeout(LIMIT)
        .allow_missing(true)
        .backend_command(["/bin/sh", "-c", &script])
        .launch()
        .await
        .unwrap();
    assert_eq!(net.lost_ranks(), RankSet::single(1));
    // The directory step of `bcast -r` runs first; it must leave what it learns for the files.
    let true_ = ["true".to_owned()];
    let run = treecast::apps::run::run_command(&net, &true_, Some(LIMIT)).await.unwrap();
    assert_eq!(run.lost.len(), 1, "{run:?}");
    assert!(run.no_answer.is_empty(), "{run:?}");
    let src = dir.path("src");
    std::fs::write(&src, b"data").unwrap();
    // A limit far past the test's own: waiting it for the missing rank fails the test.
    let options = FileOptions { chunk: CHUNK, timeout: Duration::from_secs(3600), ..FileOptions::default() };
    let entries = [FileEntry::file_at(&src, out.join("a")), FileEntry::file_at(&src, out.join("b"))];
    let comm = net.broadcast_communicator();
    let transfer = bcast_files(&net, &comm, &entries, &options, |_| {});
    let reports =
        tokio::time::timeout(LIMIT, transfer).await.expect("waited for a rank lost at launch").unwrap();
    for r in &reports {
        assert_eq!(r.lost_ranks(), RankSet::single(1), "{r:?}");
        assert_eq!(r.ranks_with(Outcome::Written), RankSet::single(0), "{r:?}");
        assert!(r.ranks_with(Outcome::Failed).is_empty(), "{r:?}");
    }
    assert_eq!(std::fs::read(out.join("b")).unwrap(), b"data");
    finish(net).await;
}

#[tokio::test]
async fn a_source_that_vanishes_during_the_call_fails_that_entry_and_the_rest_are_sent() {
    let dir = TestDir::new("vanish");
    let out = dir.path("out");
    std::fs::create_dir(&out).unwrap();
    let names = ["a", "b", "c"];
    for n in names {
        std::fs::write(dir.path(n), n.as_bytes()).unwrap();
    }
    let entries = names.map(|n| FileEntry::file_at(dir.path(n), out.join(n)));
    let net = launch("flat", 2).await;
    let comm = net.broadcast_communicator();
    let options = FileOptions { chunk: CHUNK, timeout: LIMIT, ..FileOptions::default() };
    let b = dir.path("b");
    let transfer = bcast_files(&net, &comm, &entries, &options, |p| {
        if let Progress::Done { index: 0, .. } = p {
            std::fs::remove_file(&b).unwrap();
        }
    });
    let reports = tokio::time::timeout(LIMIT, transfer).await.unwrap().unwrap();
    assert_eq!(reports.len(), 3);
    let gone = &reports[1];
    assert_eq!(gone.ranks_with(Outcome::Failed), all(&net), "{gone:?}");
    assert!(gone.outcomes[0].detail.contains("vanished"), "{gone:?}");
    assert!(!out.join("b").exists());
    for r in [&reports[0], &reports[2]] {
        assert!(r.ok(), "{r:?}");
    }
    assert_eq!(std::fs::read(out.join("c")).unwrap(), b"c");
    finish(net).await;
}

#[test]
fn the_command_line_refuses_a_zero_or_huge_timeout_before_starting() {
    let dir = TestDir::new("cli-timeout");
    let src = dir.path("src");
    std::fs::write(&src, b"x").unwrap();
    for timeout in ["0", "1e20", "inf", "-1"] {
        let out = Command::new(TREECAST)
            .arg("bcast")
            .arg(&src)
            .arg(dir.path("dst"))
            .args(["--local", "1", "--launcher", "local", &format!("--timeout={timeout}")])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "--timeout {timeout}: {stderr}");
        assert!(stderr.contains("--timeout"), "--timeout {timeout}: {stderr}");
        assert!(!dir.path("dst").exists());
    }
}

/// A 1 MiB tmpfs mounted at a fresh directory, unmounted and removed when dropped.
struct Tmpfs(TestDir);

impl Tmpfs {
    /// Needs root: the tests that mount one are ignored when the build did not run as root.
    fn mount(name: &str) -> Tmpfs {
        let root = Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"));
        assert!(root, "mounting a tmpfs needs root, but the build ran as root: rebuild");
        let guard = Tmpfs(TestDir::new(name));
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs"])
            .arg(guard.0.root())
            .status()
            .unwrap();
        assert!(status.success(), "mount -t tmpfs failed");
        guard
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        // Unmount before the directory is removed (fields drop after this).
        let _ = Command::new("umount").arg(self.0.root()).status();
    }
}

#[tokio::test]
#[cfg_attr(not(has_root), ignore = "needs root (mounting a tmpfs)")]
async fn a_full_file_system_fails_every_rank_with_no_space_and_leaves_nothing() {
    let full = Tmpfs::mount("nospace");
    let dir = TestDir::new("nospace-src");
    let src = dir.path("big");
    std::fs::write(&src, random_bytes(4 << 20)).unwrap();
    let dst = full.0.path("big");
    let net = launch("flat", 2).await;
    let r = send(&net, &src, Some(&dst), WriteMode::Leave).await;
    assert!(!r.ok());
    assert_eq!(r.ranks_with(Outcome::Failed), all(&net), "{r:?}");
    for o in &r.outcomes {
        assert!(o.detail.contains("No space left on device"), "{r:?}");
    }
    assert_eq!(r.outcomes.len(), 1, "the message names no rank, so ranks group: {r:?}");
    assert!(!dst.exists(), "a partial file was left under the destination name");
    assert!(temp_files(full.0.root()).is_empty(), "{:?}", temp_files(full.0.root()));
    finish(net).await;
}

#[test]
fn the_command_line_copies_and_exits_1_on_failure() {
    let dir = TestDir::new("cli");
    let src = dir.path("src");
    let data = random_bytes(2 * CHUNK + 3);
    std::fs::write(&src, &data).unwrap();
    let tag = format!("TREECAST_FILES_TEST={}", std::process::id());
    let run = |args: &[&str]| {
        let (k, v) = tag.split_once('=').unwrap();
        Command::new(TREECAST)
            .arg("bcast")
            .args(args)
            .args(["--local", "2", "--launcher", "local", "--chunk", "4096"])
            .env(k, v)
            .output()
            .unwrap()
    };
    let dst = dir.path("dst");
    let out = run(&[src.to_str().unwrap(), dst.to_str().unwrap(), "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["ok"], true);
    // Both ranks share this host's file system: in write mode leave, the rank that
    // finishes second finds the first one's copy and skips it as the same file.
    assert_eq!(json["classes"][0]["outcome"], "written");
    let classes = json["classes"].as_array().unwrap();
    assert!(classes.iter().all(|c| c["outcome"] == "written" || c["outcome"] == "skipped-shared"), "{json}");
    assert_eq!(classes.iter().map(|c| c["count"].as_u64().unwrap()).sum::<u64>(), 2, "{json}");
    assert_eq!(std::fs::read(&dst).unwrap(), data);

    let out = run(&[src.to_str().unwrap(), dst.to_str().unwrap()]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("skipped-shared: 2 [0-1]"), "{text}");

    let bad = dir.path("nowhere/dst");
    let out = run(&[src.to_str().unwrap(), bad.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("failed: 2 [0-1]") && text.contains("does not exist"), "{text}");
    assert_no_leftovers(&tag);
}

#[test]
fn the_command_line_copies_several_files_and_directory_trees() {
    let dir = TestDir::new("tree");
    let tree = dir.path("tool");
    std::fs::create_dir_all(tree.join("sub/deeper")).unwrap();
    std::fs::create_dir_all(tree.join("empty-dir")).unwrap();
    let a = random_bytes(3 * CHUNK + 1);
    let b = random_bytes(10);
    std::fs::write(tree.join("a.bin"), &a).unwrap();
    std::fs::write(tree.join("sub/b.bin"), &b).unwrap();
    std::fs::write(tree.join("sub/deeper/empty"), b"").unwrap();
    std::fs::set_permissions(tree.join("sub/b.bin"), std::fs::Permissions::from_mode(0o750)).unwrap();
    std::os::unix::fs::symlink("sub/b.bin", tree.join("link")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/target", tree.join("sub/dangling")).unwrap();
    assert!(Command::new("mkfifo").arg(tree.join("fifo")).status().unwrap().success());
    std::fs::set_permissions(tree.join("sub"), std::fs::Permissions::from_mode(0o750)).unwrap();
    let dir_times = [("", 10), ("sub", 20), ("sub/deeper", 30), ("empty-dir", 40)];
    for (d, secs) in dir_times {
        let f = std::fs::File::open(tree.join(d)).unwrap();
        f.set_modified(UNIX_EPOCH + Duration::new(1_500_000_000 + secs, 7)).unwrap();
    }
    let extra = dir.path("extra.txt");
    std::fs::write(&extra, b"extra\n").unwrap();
    let out_dir = dir.path("out");
    std::fs::create_dir(&out_dir).unwrap();
    let tag = format!("TREECAST_FILES_TEST_TREE={}", std::process::id());
    let run = |args: &[&str]| {
        let (k, v) = tag.split_once('=').unwrap();
        Command::new(TREECAST)
            .arg("bcast")
            .args(args)
            .args(["--local", "2", "--launcher", "local", "--chunk", "4096"])
            .env(k, v)
            .output()
            .unwrap()
    };
    let (t, e, o) = (tree.to_str().unwrap(), extra.to_str().unwrap(), out_dir.to_str().unwrap());

    // A directory without -r is refused before anything starts.
    let out = run(&[t, o]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("use -r"), "{out:?}");

    let out = run(&[t, e, o, "-r", "--json"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let json: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(json["ok"], true, "{json}");
    assert_eq!(json["count"], 4, "{json}");
    assert_eq!(json["bytes"], a.len() + b.len() + 6, "{json}");
    let of_kind = |kind: &str| -> Vec<String> {
        let entries = json["files"].as_array().unwrap().iter().filter(|f| f["kind"] == kind);
        entries.map(|f| f["destination"].as_str().unwrap().to_owned()).collect()
    };
    let files = of_kind("file");
    assert_eq!(of_kind("symlink").len(), 2, "{json}");
    let dirs = of_kind("directory");
    let copy = out_dir.join("tool");
    let deepest_first: Vec<String> = ["sub/deeper", "empty-dir", "sub", ""]
        .iter()
        .map(|d| if d.is_empty() { copy.clone() } else { copy.join(d) }.display().to_string())
        .collect();
    assert_eq!(dirs, deepest_first, "directory attributes last, deepest first: {json}");
    assert_eq!(json["ignored"][0], tree.join("fifo").display().to_string(), "{json}");
    let want = ["tool/a.bin", "tool/sub/b.bin", "tool/sub/deeper/empty", "extra.txt"];
    assert_eq!(files, want.map(|w| out_dir.join(w).display().to_string()), "{json}");
    for f in json["files"].as_array().unwrap() {
        let mut done = 0;
        for c in f["classes"].as_array().unwrap() {
            assert!(c["outcome"] == "written" || c["outcome"] == "skipped-shared", "{json}");
            done += c["count"].as_u64().unwrap();
        }
        assert_eq!(done, 2, "{json}");
    }
    assert_eq!(std::fs::read(copy.join("a.bin")).unwrap(), a);
    assert_eq!(std::fs::read(copy.join("sub/b.bin")).unwrap(), b);
    assert_eq!(std::fs::metadata(copy.join("sub/b.bin")).unwrap().permissions().mode() & 0o7777, 0o750);
    assert_eq!(std::fs::read(copy.join("sub/deeper/empty")).unwrap(), b"");
    assert!(copy.join("empty-dir").is_dir(), "empty directories are recreated");
    assert_eq!(std::fs::read_link(copy.join("link")).unwrap(), Path::new("sub/b.bin"));
    assert_eq!(std::fs::read_link(copy.join("sub/dangling")).unwrap(), Path::new("/nonexistent/target"));
    assert!(!copy.join("fifo").exists(), "special files are not sent");
    for (d, _) in dir_times {
        let (from, to) = (std::fs::metadata(tree.join(d)).unwrap(), std::fs::metadata(copy.join(d)).unwrap());
        assert_eq!(to.modified().unwrap(), from.modified().unwrap(), "mtime of {d:?}");
        assert_eq!(to.permissions().mode(), from.permissions().mode(), "mode of {d:?}");
    }
    assert_eq!(std::fs::read(out_dir.join("extra.txt")).unwrap(), b"extra\n");
    for d in [copy.clone(), copy.join("sub"), copy.join("sub/deeper")] {
        assert!(temp_files(&d).is_empty(), "{:?}", temp_files(&d));
    }

    // Again, as text: every file is already there, and the total line sums them up.
    let out = run(&[t, e, o, "-r"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    // 4 files, 2 links, 4 directories.
    assert_eq!(text.matches("skipped-shared: 2 [0-1]").count(), 10, "{text}");
    assert!(text.contains(&format!("total: 4 files, {} bytes", a.len() + b.len() + 6)), "{text}");

    // Several files into a directory that does not exist: each fails, exit status 1.
    let missing = dir.path("missing");
    let out = run(&[e, tree.join("a.bin").to_str().unwrap(), missing.to_str().unwrap()]);
    assert_eq!(out.status.code(), Some(1));
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.matches("does not exist").count(), 2, "{text}");
    assert!(text.contains("total: 2 files") && text.contains("2 with failures"), "{text}");
    assert!(!missing.exists());
    assert_no_leftovers(&tag);
}

#[test]
fn a_destination_directory_that_does_not_exist_is_named_and_mkdir_creates_it() {
    // Regression: `bcast ./tool.tar $PWD/nodir/` said "linking into …/nodir/: No such
    // file or directory", and failures showed on stdout only.
    let dir = TestDir::new("mkdir");
    let src = dir.path("tool.tar");
    std::fs::write(&src, b"tool").unwrap();
    let tag = format!("TREECAST_FILES_TEST_MKDIR={}", std::process::id());
    let run = |args: &[&str]| {
        let (k, v) = tag.split_once('=').unwrap();
        let out = Command::new(TREECAST)
            .arg("bcast")
            .args(args)
            .args(["--local", "2", "--launcher", "local"])
            .env(k, v)
            .output()
            .unwrap();
        assert_no_leftovers(&tag);
        let (o, e) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        (out.status.code(), o.into_owned(), e.into_owned())
    };
    let s = src.to_str().unwrap();
    for missing in ["nodir", "nodir2/sub"] {
        let dst = format!("{}/", dir.path(missing).display());
        let (code, stdout, stderr) = run(&[s, &dst, "--json"]);
        let says = format!("destination directory {} does not exist", dir.path(missing).display());
        assert_eq!(code, Some(1), "{stdout}{stderr}");
        assert!(stdout.contains(&says), "{stdout}");
        assert!(stderr.contains(&format!("failed on 2 ranks [0-1]: {says}")), "{stderr}");
        assert!(stderr.contains("tip: --mkdir creates"), "{stderr}");
        let (code, stdout, stderr) = run(&[s, &dst, "--mkdir"]);
        assert_eq!(code, Some(0), "{stdout}{stderr}");
        assert_eq!(std::fs::read(dir.path(missing).join("tool.tar")).unwrap(), b"tool");
    }
}
