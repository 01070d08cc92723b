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
//! address of its parent. The file is written with mode 0600.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use treecast_transport::Secret;

use crate::ApiError;

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
}

/// Environment variables that name a process's rank, in the order they are tried:
/// treecast's own, then Open MPI's, PMIx's, MPICH's (PMI) and Slurm's.
pub const RANK_VARS: [&str; 5] =
    ["TREECAST_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"];

impl AttachInfo {
    /// Writes the file, readable by this user only.
    ///
    /// # Errors
    /// The file cannot be created or written.
    pub fn write(&self, path: &Path) -> Result<(), ApiError> {
        let io = |e: std::io::Error| ApiError::Env(format!("writing attach file {}: {e}", path.display()));
        // A fresh name, created exclusively (never through a planted file or link), mode 0600 from the start.
        let mut tag = [0u8; 8];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut tag);
        let tmp = PathBuf::from(format!("{}.{}.tmp", path.display(), hex::encode(tag)));
        let mut f =
            std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp).map_err(io)?;
        let mut text =
            String::from("# treecast attach file: it holds the session secret, keep it private\nversion 1\n");
        text.push_str(&format!(
            "session {}\nsecret {}\nsize {}\n",
            self.session,
            self.secret.to_hex(),
            self.size
        ));
        for (rank, id, addr) in &self.points {
            text.push_str(&format!("rank {rank} {id} {addr}\n"));
        }
        f.write_all(text.as_bytes()).map_err(io)?;
        f.sync_all().map_err(io)?;
        // Renamed into place so a back-end never reads half a file.
        std::fs::rename(&tmp, path).map_err(io)
    }

    /// Reads and checks an attach file.
    ///
    /// # Errors
    /// The file cannot be read, or a line is malformed (named by its number).
    pub fn read(path: &Path) -> Result<AttachInfo, ApiError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| ApiError::Env(format!("reading attach file {}: {e}", path.display())))?;
        let bad = |line: usize, what: &str| {
            ApiError::Env(format!("attach file {} line {line}: {what}", path.display()))
        };
        let (mut session, mut secret, mut size, mut points) = (None, None, None, Vec::new());
        for (i, line) in text.lines().enumerate().map(|(i, l)| (i + 1, l.trim())) {
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["version", "1"] => {}
                ["version", v] => {
                    return Err(bad(i, &format!("version {v} is not supported (this build reads 1)")))
                }
                ["session", s] => session = Some((*s).to_owned()),
                ["secret", s] => secret = Some(Secret::from_hex(s).map_err(|e| bad(i, &e.to_string()))?),
                ["size", n] => size = Some(n.parse::<u32>().map_err(|_| bad(i, "size is not a number"))?),
                ["rank", r, id, addr] => {
                    let r = r.parse().map_err(|_| bad(i, "rank is not a number"))?;
                    let id = id.parse().map_err(|_| bad(i, "node id is not a number"))?;
                    points.push((r, id, (*addr).to_owned()));
                }
                _ => return Err(bad(i, &format!("unexpected line {line:?}"))),
            }
        }
        let missing =
            |what: &str| ApiError::Env(format!("attach file {} has no {what} line", path.display()));
        Ok(AttachInfo {
            session: session.ok_or_else(|| missing("session"))?,
            secret: secret.ok_or_else(|| missing("secret"))?,
            size: size.ok_or_else(|| missing("size"))?,
            points,
        })
    }

    /// The parent and node id of `rank`.
    ///
    /// # Errors
    /// The rank has no slot in this network.
    pub fn point(&self, rank: u32) -> Result<(u32, &str), ApiError> {
        self.points.iter().find(|(r, _, _)| *r == rank).map(|(_, id, addr)| (*id, addr.as_str())).ok_or_else(
            || ApiError::Env(format!("rank {rank} has no place in the attach file (size {})", self.size)),
        )
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
    use super::*;

    #[test]
    fn round_trip_private_and_errors_name_the_line() {
        let dir = std::env::temp_dir().join(format!("treecast-attach-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("attach");
        let info = AttachInfo {
            session: "s1".into(),
            secret: Secret::generate(),
            size: 2,
            points: vec![(0, 1, "unix:/tmp/x/s".into()), (1, 1, "10.0.0.1:4000".into())],
        };
        info.write(&path).unwrap();
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o600);
        let back = AttachInfo::read(&path).unwrap();
        assert_eq!(back.secret, info.secret);
        assert_eq!(back.point(1).unwrap(), (1, "10.0.0.1:4000"));
        assert!(back.point(5).is_err());
        std::fs::write(&path, "version 1\nsession s\nsecret zz\n").unwrap();
        let err = AttachInfo::read(&path).unwrap_err().to_string();
        assert!(err.contains("line 3"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
