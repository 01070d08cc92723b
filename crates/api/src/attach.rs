//! Attach files: where back-ends started by someone else (an MPI launcher, a batch
//! system, a debugger) connect, and the secret that lets them in.
//!
//! ```text
//! # treecast attach file: it holds the session secret, keep it private
//! version 1
//! session 1f2e3d4c5b6a7988
//! secret 64-hex-digits
//! size 4
//! rank 0 2 unix:/tmp/treecast-ab12/s
//! rank 1 2 unix:/tmp/treecast-ab12/s
//! ```
//!
//! Each `rank` line names the rank, the node id it authenticates as, and the
//! address of its parent. A network's port for other networks has a `network
//! ADDRESS` line instead of rank lines: where its front-end listens, with a secret
//! of that port's own, not the session's. A *port file* (`Network::accept`) has a `base R` line
//! too: its ranks start at R, and a process that finds its rank as 0, 1, 2… (from
//! its launcher's environment) takes the place of rank R, R+1, R+2…
//!
//! Whoever writes this file decides where back-ends connect and what they run, so
//! both sides check it: the front-end creates it with mode 0600 under a fresh name
//! and renames it into place (a failure to do so stops the launch, and leaves no
//! temporary file), and removes it when the network ends; a back-end uses it only
//! when it is a regular file owned by its own user (or root) that group and others
//! can neither read nor write. See `docs/security.md`.

use std::io::{Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use treecast_transport::Secret;

use crate::error::file_kind as kind_of;
use crate::{ApiError, AttachError};

/// What a back-end needs to attach: its parent and the session secret.
#[derive(Debug, Clone)]
pub struct AttachInfo {
    /// The session id.
    pub session: String,
    /// The session secret.
    pub secret: Secret,
    /// Number of back-ends.
    pub size: u32,
    /// `(rank, node id, parent address)` of every back-end.
    pub points: Vec<(u32, u32, String)>,
    /// The rank a process whose launcher numbers it 0 takes (a port file's first
    /// rank; 0 in a launch's attach file).
    pub base: u32,
    /// A network's port for other networks (`Network::open_network_port`): where
    /// its front-end listens for them. Such a file names no rank.
    pub network: Option<String>,
}

/// Environment variables that name a process's rank, in the order they are tried:
/// treecast's own, then Open MPI's, PMIx's, MPICH's (PMI) and Slurm's.
pub const RANK_VARS: [&str; 5] =
    ["TREECAST_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"];

impl AttachInfo {
    /// Writes the file, readable by this user only: under a fresh name created
    /// exclusively with mode 0600, then renamed to `path`.
    ///
    /// # Errors
    /// [`AttachError::Write`] when the file cannot be created, written or renamed
    /// into place; the temporary file is removed then.
    pub fn write(&self, path: &Path) -> Result<(), AttachError> {
        let failed = |source| AttachError::Write { path: path.to_path_buf(), source };
        // A fresh name, created exclusively (never through a planted file or link), mode 0600 from the start.
        let mut tag = [0u8; 8];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut tag);
        let tmp = PathBuf::from(format!("{}.{}.tmp", path.display(), hex::encode(tag)));
        let mut f = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
            .map_err(failed)?;
        let text = self.to_text();
        let written = (|| {
            f.write_all(text.as_bytes())?;
            f.sync_all()?;
            drop(f);
            // Renamed into place so a back-end never reads half a file.
            std::fs::rename(&tmp, path)
        })();
        if let Err(e) = written {
            // It holds the secret: it must not outlive the failure.
            let _ = std::fs::remove_file(&tmp);
            return Err(failed(e));
        }
        Ok(())
    }

    /// The text of the file.
    fn to_text(&self) -> String {
        let mut text =
            String::from("# treecast attach file: it holds the session secret, keep it private\nversion 1\n");
        text.push_str(&format!(
            "session {}\nsecret {}\nsize {}\n",
            self.session,
            self.secret.to_hex(),
            self.size
        ));
        if self.base != 0 {
            text.push_str(&format!("base {}\n", self.base));
        }
        if let Some(address) = &self.network {
            text.push_str(&format!("network {address}\n"));
        }
        for (rank, id, addr) in &self.points {
            text.push_str(&format!("rank {rank} {id} {addr}\n"));
        }
        text
    }

    /// Reads an attach file after checking that it can be trusted: a regular file,
    /// owned by this process's user or by root, that group and others can neither
    /// read nor write. The checks look at the file opened, not at the path, so the
    /// file cannot be swapped between the check and the read.
    ///
    /// # Errors
    /// [`AttachError::NotOwned`], [`AttachError::Exposed`] or [`AttachError::NotAFile`]
    /// for a file that fails a check, [`AttachError::Read`] when it cannot be read,
    /// and the errors of [`AttachInfo::parse`].
    pub fn read(path: &Path) -> Result<AttachInfo, AttachError> {
        let unreadable = |source| AttachError::Read { path: path.to_path_buf(), source };
        // Non-blocking: a fifo planted at the path must not hang the open.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(path)
            .map_err(unreadable)?;
        let meta = file.metadata().map_err(unreadable)?;
        check_private(path, &meta, treecast_launch::effective_uid())?;
        let mut text = String::new();
        file.read_to_string(&mut text).map_err(unreadable)?;
        Self::parse(&text, path)
    }

    /// Parses the text of an attach file; `path` names it in errors.
    ///
    /// # Errors
    /// [`AttachError::Line`] for a malformed line (named by its number),
    /// [`AttachError::Missing`] for a missing `session`, `secret` or `size` line.
    pub fn parse(text: &str, path: &Path) -> Result<AttachInfo, AttachError> {
        let bad = |line: usize, what: String| AttachError::Line { path: path.to_path_buf(), line, what };
        let (mut session, mut secret, mut size, mut points) = (None, None, None, Vec::new());
        let (mut base, mut network) = (0, None);
        for (i, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["version", "1"] => {}
                ["version", v] => {
                    return Err(bad(i, format!("version {v} is not supported (this build reads 1)")))
                }
                ["session", s] => session = Some((*s).to_owned()),
                ["secret", s] => secret = Some(Secret::from_hex(s).map_err(|e| bad(i, e.to_string()))?),
                ["size", n] => {
                    size = Some(n.parse::<u32>().map_err(|_| bad(i, "size is not a number".into()))?)
                }
                ["base", n] => base = n.parse::<u32>().map_err(|_| bad(i, "base is not a number".into()))?,
                ["network", address] => network = Some((*address).to_owned()),
                ["rank", r, id, addr] => {
                    let r = r.parse().map_err(|_| bad(i, "rank is not a number".into()))?;
                    let id = id.parse().map_err(|_| bad(i, "node id is not a number".into()))?;
                    points.push((r, id, (*addr).to_owned()));
                }
                _ => return Err(bad(i, format!("unexpected line {line:?}"))),
            }
        }
        let missing = |what| AttachError::Missing { path: path.to_path_buf(), what };
        Ok(AttachInfo {
            session: session.ok_or_else(|| missing("session"))?,
            secret: secret.ok_or_else(|| missing("secret"))?,
            size: size.ok_or_else(|| missing("size"))?,
            points,
            base,
            network,
        })
    }

    /// The parent and node id of `rank`.
    ///
    /// # Errors
    /// [`AttachError::NoPlace`] when the rank has no slot in this network.
    pub fn point(&self, rank: u32) -> Result<(u32, &str), AttachError> {
        self.points
            .iter()
            .find(|(r, _, _)| *r == rank)
            .map(|(_, id, addr)| (*id, addr.as_str()))
            .ok_or(AttachError::NoPlace { rank, size: self.size })
    }
}

/// Checks an opened attach file's metadata: a regular file, owned by `uid` or root,
/// with no permission for group or others to read or write it.
fn check_private(path: &Path, meta: &std::fs::Metadata, uid: u32) -> Result<(), AttachError> {
    let path = path.to_path_buf();
    if !meta.is_file() {
        return Err(AttachError::NotAFile { path, kind: kind_of(meta.file_type()) });
    }
    if meta.uid() != uid && meta.uid() != 0 {
        return Err(AttachError::NotOwned { path, owner: meta.uid(), uid });
    }
    if meta.mode() & 0o066 != 0 {
        return Err(AttachError::Exposed { path, mode: meta.mode() & 0o7777 });
    }
    Ok(())
}

/// The attach file of a running network: removed when the network ends (this is
/// dropped), unless something else has been put at its path meanwhile.
#[derive(Debug)]
pub(crate) struct AttachFile {
    path: PathBuf,
    /// Device, inode and mtime of the file written (the mtime guards against a new
    /// file that got the same inode number).
    id: (u64, u64, i64, i64),
}

/// What tells the attach file written from another file put at its path.
fn identity(m: &std::fs::Metadata) -> (u64, u64, i64, i64) {
    (m.dev(), m.ino(), m.mtime(), m.mtime_nsec())
}

impl AttachFile {
    /// Remembers the file just written at `path`.
    ///
    /// # Errors
    /// [`AttachError::Write`] when it cannot be found there any more.
    pub(crate) fn written(path: &Path) -> Result<AttachFile, AttachError> {
        let meta = std::fs::symlink_metadata(path)
            .map_err(|source| AttachError::Write { path: path.to_path_buf(), source })?;
        Ok(AttachFile { path: path.to_path_buf(), id: identity(&meta) })
    }
}

impl Drop for AttachFile {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.path) {
            Ok(m) if identity(&m) == self.id => {
                if let Err(e) = std::fs::remove_file(&self.path) {
                    tracing::warn!("could not remove the attach file {}: {e}", self.path.display());
                }
            }
            _ => {}
        }
    }
}

/// This process's rank from the first of [`RANK_VARS`] that is set.
///
/// # Errors
/// None of them is set, or the value is not a number.
pub fn rank_from_env() -> Result<u32, ApiError> {
    for var in RANK_VARS {
        if let Ok(v) = std::env::var(var) {
            return v.trim().parse().map_err(|_| ApiError::Env(format!("{var}={v:?} is not a rank")));
        }
    }
    Err(ApiError::Env(format!("no rank given: set one of {} or pass it explicitly", RANK_VARS.join(", "))))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn info() -> AttachInfo {
        AttachInfo {
            session: "s1".into(),
            secret: Secret::generate(),
            size: 2,
            points: vec![(0, 1, "unix:/tmp/x/s".into()), (1, 1, "10.0.0.1:4000".into())],
            base: 0,
            network: None,
        }
    }

    #[test]
    fn a_network_port_names_where_its_front_end_listens() {
        let mut port = info();
        port.points.clear();
        port.network = Some("unix:@treecast-ab".into());
        let back = AttachInfo::parse(&port.to_text(), Path::new("port")).unwrap();
        assert_eq!(back.network.as_deref(), Some("unix:@treecast-ab"));
        assert!(back.points.is_empty());
        assert_eq!(AttachInfo::parse(&info().to_text(), Path::new("a")).unwrap().network, None);
    }

    #[test]
    fn a_port_file_keeps_its_base_rank() {
        let mut port = info();
        port.base = 16;
        port.points = vec![(16, 30, "unix:@p".into()), (17, 31, "unix:@p".into())];
        let back = AttachInfo::parse(&port.to_text(), Path::new("port")).unwrap();
        assert_eq!(back.base, 16);
        assert_eq!(back.point(back.base + 1).unwrap(), (31, "unix:@p"));
        let err = AttachInfo::parse("base x\n", Path::new("port")).unwrap_err();
        assert!(err.to_string().contains("base is not a number"), "{err}");
    }

    fn chmod(path: &Path, mode: u32) {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    fn is_root() -> bool {
        treecast_launch::effective_uid() == 0
    }

    #[test]
    fn round_trip_private_and_errors_name_the_line() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attach");
        let info = info();
        info.write(&path).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let back = AttachInfo::read(&path).unwrap();
        assert_eq!(back.secret, info.secret);
        assert_eq!(back.point(1).unwrap(), (1, "10.0.0.1:4000"));
        assert!(matches!(back.point(5), Err(AttachError::NoPlace { rank: 5, size: 2 })));
        std::fs::write(&path, "version 1\nsession s\nsecret zz\n").unwrap();
        chmod(&path, 0o600);
        let err = AttachInfo::read(&path).unwrap_err().to_string();
        assert!(err.contains("line 3"), "{err}");
    }

    #[test]
    fn a_failed_write_leaves_no_temporary_file_with_the_secret() {
        let dir = tempfile::tempdir().unwrap();
        // A non-empty directory at the path: the temporary file is written, the rename fails.
        let path = dir.path().join("attach");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("x"), b"").unwrap();
        let err = info().write(&path).unwrap_err();
        assert!(matches!(err, AttachError::Write { .. }), "{err:?}");
        assert!(err.to_string().contains("cannot write the attach file"), "{err}");
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert_eq!(left, ["attach"], "a temporary file survived the failure");
    }

    #[test]
    fn a_file_group_or_others_can_read_or_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attach");
        info().write(&path).unwrap();
        for mode in [0o644, 0o640, 0o604, 0o620, 0o602] {
            chmod(&path, mode);
            let err = AttachInfo::read(&path).unwrap_err();
            assert!(matches!(err, AttachError::Exposed { mode: m, .. } if m == mode), "{mode:o}: {err:?}");
            assert!(err.to_string().contains("chmod 600"), "{err}");
        }
        // Execute bits give nobody the secret.
        chmod(&path, 0o711);
        AttachInfo::read(&path).unwrap();
    }

    #[test]
    #[cfg_attr(not(has_root), ignore = "needs root (changing a file's owner)")]
    fn a_file_owned_by_another_user_is_refused() {
        assert!(is_root(), "changing a file's owner needs root, but the build ran as root: rebuild");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attach");
        info().write(&path).unwrap();
        // uid 1 (daemon on Debian): a user other than this one and root.
        std::os::unix::fs::chown(&path, Some(1), None).unwrap();
        let err = AttachInfo::read(&path).unwrap_err();
        assert!(matches!(err, AttachError::NotOwned { owner: 1, uid: 0, .. }), "{err:?}");
        assert!(err.to_string().contains("owned by uid 1"), "{err}");
    }

    #[test]
    fn the_owner_check_accepts_this_user_and_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attach");
        info().write(&path).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        let owner = meta.uid();
        check_private(&path, &meta, owner).unwrap();
        let other = owner.wrapping_add(1).max(1);
        let refused = check_private(&path, &meta, other);
        if owner == 0 {
            refused.unwrap();
        } else {
            assert!(matches!(refused, Err(AttachError::NotOwned { .. })), "{refused:?}");
        }
    }

    #[test]
    fn a_fifo_is_refused_without_hanging() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attach");
        let made = std::process::Command::new("mkfifo").arg("-m").arg("600").arg(&path).status().unwrap();
        assert!(made.success());
        let err = AttachInfo::read(&path).unwrap_err();
        assert!(matches!(err, AttachError::NotAFile { kind: "a fifo", .. }), "{err:?}");
    }

    #[test]
    fn the_file_is_removed_when_the_network_ends_unless_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("attach");
        info().write(&path).unwrap();
        drop(AttachFile::written(&path).unwrap());
        assert!(!path.exists());
        info().write(&path).unwrap();
        let guard = AttachFile::written(&path).unwrap();
        let other = dir.path().join("other");
        std::fs::write(&other, b"someone else's").unwrap();
        std::fs::rename(&other, &path).unwrap();
        drop(guard);
        assert_eq!(std::fs::read(&path).unwrap(), b"someone else's");
    }
}
