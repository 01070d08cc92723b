//! What the benchmarks share: timings and their summary, the limit of one step, a
//! stream for one-rank-at-a-time requests, stopping spawned groups, and the MPI
//! reference program (compiled with `mpicc`, run under `mpirun`) that `bench spawn`,
//! `merge`, `intergroup` and the collectives are timed against; sizes with suffixes.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use anyhow::{bail, Context};
use serde::Serialize;
use treecast_api::{Event, Group, Network, RankSet, StreamOptions, TransformKind};

/// The MPI program of the reference, compiled at run time with `mpicc`.
const MPI_SOURCE: &str = include_str!("../../../tools/mpi-spawn/spawn_bench.c");
/// Longest one MPI job of the reference may run before it is called hung.
const MPI_JOB_LIMIT: Duration = Duration::from_secs(120);
/// Longest a step of the benchmark may take.
pub(super) const STEP_LIMIT: Duration = Duration::from_secs(60);

/// Minimum, mean, median and maximum of some timings, milliseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Timings {
    /// Runs measured.
    pub runs: usize,
    /// Fastest.
    pub min_ms: f64,
    /// Mean.
    pub mean_ms: f64,
    /// Median (the upper one of an even count).
    pub median_ms: f64,
    /// Slowest.
    pub max_ms: f64,
}

impl Timings {
    pub(super) fn of(ms: &[f64]) -> Option<Timings> {
        if ms.is_empty() {
            return None;
        }
        let mut sorted = ms.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Timings {
            runs: ms.len(),
            min_ms: sorted[0],
            mean_ms: ms.iter().sum::<f64>() / ms.len() as f64,
            median_ms: sorted[sorted.len() / 2],
            max_ms: sorted[sorted.len() - 1],
        })
    }
}

/// What the MPI reference gave for one case, or why it gave nothing.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Reference {
    /// Timings (latency, merge), milliseconds.
    Timings(Timings),
    /// Spawns per second.
    Rate(f64),
    /// Not measured, and why.
    Missing(String),
}

impl Reference {
    pub(super) fn median_ms(&self) -> Option<f64> {
        match self {
            Reference::Timings(t) => Some(t.median_ms),
            _ => None,
        }
    }
}

/// A stream over every back-end that passes each answer on as it comes: requests
/// go to one rank at a time, answers come back one by one.
pub(super) async fn request_stream(net: &Network) -> anyhow::Result<treecast_api::Stream> {
    let opts = StreamOptions {
        sync: treecast_api::SyncMode::DoNotWait,
        ..StreamOptions::reduce(TransformKind::Null)
    };
    Ok(net.new_stream(&net.broadcast_communicator(), opts).await?)
}

/// Stops the groups and waits until every one of their ranks has left.
pub(super) async fn stop_and_wait(net: &mut Network, groups: &[Group]) -> anyhow::Result<()> {
    let mut waiting = RankSet::new();
    for g in groups {
        net.stop(g, "the benchmark stopped it")?;
        waiting.union_with(&g.rank_set());
    }
    let deadline = tokio::time::Instant::now() + STEP_LIMIT;
    while !waiting.is_empty() {
        let event = tokio::time::timeout_at(deadline, net.next_event())
            .await
            .with_context(|| format!("ranks {waiting} did not leave within {STEP_LIMIT:?}"))?;
        match event {
            Some(Event::RanksLeft { ranks, .. }) | Some(Event::RanksLost { ranks, .. }) => {
                waiting = waiting.difference(&ranks);
            }
            Some(_) => {}
            None => bail!("the network ended while ranks {waiting} were being stopped"),
        }
    }
    Ok(())
}

/// The MPI program, compiled, and the library it runs on.
pub(super) struct MpiReference {
    _dir: tempfile::TempDir,
    program: PathBuf,
    /// The MPI library, as `mpirun --version` names it.
    pub(super) library: String,
}

impl MpiReference {
    /// Compiles the reference with `mpicc`; says what is missing otherwise.
    pub(super) fn build() -> Result<MpiReference, String> {
        let version = Command::new("mpirun")
            .arg("--version")
            .output()
            .map_err(|e| format!("no mpirun ({e}); install openmpi-bin and libopenmpi-dev"))?;
        let library = String::from_utf8_lossy(&version.stdout).lines().next().unwrap_or("").trim().to_owned();
        let dir = tempfile::Builder::new().prefix("treecast-mpi-").tempdir().map_err(|e| e.to_string())?;
        let source = dir.path().join("spawn_bench.c");
        std::fs::write(&source, MPI_SOURCE).map_err(|e| e.to_string())?;
        let program = dir.path().join("spawn_bench");
        let out = Command::new("mpicc")
            .arg("-O2")
            .arg("-o")
            .arg(&program)
            .arg(&source)
            .output()
            .map_err(|e| format!("no mpicc ({e}); install libopenmpi-dev"))?;
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            return Err(format!("mpicc failed ({}); install libopenmpi-dev", err.trim()));
        }
        Ok(MpiReference { _dir: dir, program, library })
    }

    pub(super) fn latency(&self, n: u32, runs: usize) -> Reference {
        // Each run in a job of its own: back-to-back spawns of several processes hang
        // some Open MPI versions.
        let mut ms = Vec::new();
        for _ in 0..if n == 1 { 1 } else { runs.min(3) } {
            let per_job = if n == 1 { runs } else { 1 };
            match self.job(1, &["latency", &n.to_string(), &per_job.to_string()]) {
                Ok(lines) => ms.extend(values(&lines, "latency_ms")),
                Err(why) => return Reference::Missing(why),
            }
        }
        Timings::of(&ms).map_or_else(|| Reference::Missing("no timing printed".into()), Reference::Timings)
    }

    pub(super) fn rate(&self, n: u32, secs: f64) -> Reference {
        match self.job(1, &["rate", &n.to_string(), &secs.to_string()]) {
            Ok(lines) => values(&lines, "spawns_per_s")
                .first()
                .map_or_else(|| Reference::Missing("no rate printed".into()), |&r| Reference::Rate(r)),
            Err(why) => Reference::Missing(why),
        }
    }

    pub(super) fn merge(&self, n: u32) -> Reference {
        if n > 32 {
            return Reference::Missing(format!("{} MPI processes on this machine's cores: skipped", 2 * n));
        }
        match self.job(n, &["merge", &n.to_string()]) {
            Ok(lines) => Timings::of(&values(&lines, "merge_ms"))
                .map_or_else(|| Reference::Missing("no timing printed".into()), Reference::Timings),
            Err(why) => Reference::Missing(why),
        }
    }

    /// One-way latency of `bytes`-byte messages, from a ping-pong `mode`.
    pub(super) fn one_way(&self, mode: &str, procs: u32, bytes: u32, rounds: u32) -> Reference {
        match self.job(procs, &[mode, &bytes.to_string(), &rounds.to_string()]) {
            Ok(lines) => {
                Timings::of(&values(&lines, "one_way_us").iter().map(|us| us / 1e3).collect::<Vec<_>>())
                    .map_or_else(|| Reference::Missing("no latency printed".into()), Reference::Timings)
            }
            Err(why) => Reference::Missing(why),
        }
    }

    /// Runs the program under `mpirun -n procs`; its stdout lines, or why not.
    pub(super) fn job(&self, procs: u32, args: &[&str]) -> Result<Vec<String>, String> {
        let mut cmd = Command::new("timeout");
        cmd.arg("--kill-after=5")
            .arg(MPI_JOB_LIMIT.as_secs().to_string())
            .arg("mpirun")
            .arg("--oversubscribe")
            .arg("-n")
            .arg(procs.to_string())
            .arg(&self.program)
            .args(args)
            // Root may run it here (CI and containers run as root).
            .env("OMPI_ALLOW_RUN_AS_ROOT", "1")
            .env("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
        let out = cmd.output().map_err(|e| format!("cannot run mpirun: {e}"))?;
        if out.status.code() == Some(124) || out.status.code() == Some(137) {
            return Err(format!(
                "mpirun {} hung (killed after {} s)",
                args.join(" "),
                MPI_JOB_LIMIT.as_secs()
            ));
        }
        if !out.status.success() {
            let err = String::from_utf8_lossy(&out.stderr);
            let last = err.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim();
            return Err(format!("mpirun {} failed ({}): {last}", args.join(" "), out.status));
        }
        Ok(String::from_utf8_lossy(&out.stdout).lines().map(str::to_owned).collect())
    }
}

/// The numbers of the `key value` lines named `key`.
pub(super) fn values(lines: &[String], key: &str) -> Vec<f64> {
    lines.iter().filter_map(|l| l.strip_prefix(key)?.trim().parse::<f64>().ok()).collect()
}

/// `1`, `64K`, `1M`, `64M`: bytes, with K and M meaning 1024 and 1024².
pub(super) fn parse_size(text: &str) -> anyhow::Result<u64> {
    let t = text.trim();
    let (digits, unit) = match t.char_indices().last() {
        Some((i, 'K' | 'k')) => (&t[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&t[..i], 1 << 20),
        _ => (t, 1),
    };
    let n: u64 =
        digits.parse().with_context(|| format!("--sizes: {text:?} is not a size (write 4096, 64K or 1M)"))?;
    let bytes = n.checked_mul(unit).filter(|&b| b <= 1 << 30);
    bytes.with_context(|| format!("--sizes: {text:?} is over 1 GiB"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_read_with_their_suffixes_and_a_bad_one_says_how_to_write_it() {
        assert_eq!(parse_size("1").ok(), Some(1));
        assert_eq!(parse_size("64K").ok(), Some(64 << 10));
        assert_eq!(parse_size("64M").ok(), Some(64 << 20));
        let err = parse_size("lots").err().map(|e| e.to_string()).unwrap_or_default();
        assert!(err.contains("write 4096, 64K or 1M"), "{err}");
        assert!(parse_size("2048M").is_err());
    }
}
