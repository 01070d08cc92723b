//! The collective part of `treecast bench intergroup`: all-reduce, reduce (one
//! group to a root in the other), all-gather, reduce-scatter and barrier over the
//! union of the launch's group and a spawned group of the same size, computed in
//! the tree, against MPI's collectives over a spawned and merged job in the same run.

use std::collections::BTreeMap;

use anyhow::{ensure, Context};
use serde::Serialize;
use treecast_api::{Network, SpawnOptions, Value};

use super::shared::{request_stream, stop_and_wait, MpiReference, STEP_LIMIT};
use crate::apps::protocol::{COLLECTIVE_ANSWER, COLLECTIVE_REQUEST, TAG_COLLECTIVE};

/// The operations timed, as `TAG_COLLECTIVE` numbers them and MPI's reference names them.
pub const OPERATIONS: [(u32, &str); 5] =
    [(2, "allreduce"), (1, "reduce"), (3, "allgather"), (4, "reducescatter"), (5, "barrier")];

/// Minimum, mean and maximum across processes of each one's mean time, microseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Spread {
    /// The fastest process.
    pub min_us: f64,
    /// The mean over processes.
    pub mean_us: f64,
    /// The slowest process.
    pub max_us: f64,
}

impl Spread {
    fn of(values: &[f64]) -> Option<Spread> {
        let min_us = values.iter().copied().reduce(f64::min)?;
        let max_us = values.iter().copied().reduce(f64::max)?;
        Some(Spread { min_us, mean_us: values.iter().sum::<f64>() / values.len() as f64, max_us })
    }
}

/// One operation at one size.
#[derive(Debug, Clone, Serialize)]
pub struct CollectiveRow {
    /// Which operation.
    pub op: &'static str,
    /// Bytes each member contributes.
    pub bytes: u32,
    /// Operations timed (after one warm-up).
    pub rounds: u32,
    /// treecast, computed in the tree.
    pub treecast: Spread,
    /// MPI over a spawned and merged job of the same size, or why not.
    pub mpi: Result<Spread, String>,
    /// treecast's mean over MPI's.
    pub ratio: Option<f64>,
}

/// The collective rows of `bench intergroup`.
#[derive(Debug, Clone, Serialize)]
pub struct CollectiveBench {
    /// Members: the launch's group then the spawned one.
    pub members: usize,
    /// One row per operation and size.
    pub rows: Vec<CollectiveRow>,
}

/// Operations timed per size: many for small contributions, fewer for large ones.
fn rounds_for(bytes: u32) -> u32 {
    (u64::from(16u32 << 20) / u64::from(bytes.max(1))).clamp(3, 50) as u32
}

/// `%ald` elements a member contributes for `bytes` (reduce-scatter: a multiple of
/// the members, so each gets a block).
fn elements(op: u32, bytes: u32, members: u32) -> u32 {
    let k = (bytes / 8).max(1);
    if op == 4 {
        (k / members).max(1) * members
    } else {
        k
    }
}

/// Times every operation at every size in the tree, then in MPI.
pub(super) async fn measure(
    net: &mut Network,
    sizes: &[u32],
    mpi: Result<&MpiReference, String>,
) -> anyhow::Result<CollectiveBench> {
    let launch: Vec<u32> = net.launch_group().ranks().to_vec();
    let options = SpawnOptions { placement: treecast_api::Placement::Cyclic, ..SpawnOptions::default() };
    let spawned = net.spawn(launch.len() as u32, &[], &options).await?;
    let members: Vec<u32> = launch.iter().chain(spawned.ranks()).copied().collect();
    let mut stream = request_stream(net).await?;
    let mut rows = Vec::new();
    for &bytes in sizes {
        let rounds = rounds_for(bytes);
        for (op, name) in OPERATIONS {
            // Reduce: the spawned group to rank 0 of the launch's.
            let (group, root) =
                if op == 1 { (spawned.ranks().to_vec(), 0) } else { (members.clone(), u32::MAX) };
            let mut taking_part = group.clone();
            if op == 1 {
                taking_part.push(root);
            }
            let k = elements(op, bytes, group.len() as u32);
            let request = |n: u32| {
                vec![
                    Value::UInt(op),
                    Value::UInt(1),
                    Value::UIntArray(group.clone()),
                    Value::UInt(root),
                    Value::UInt(k),
                    Value::UInt(n),
                ]
            };
            let mut times = Vec::new();
            for n in [1, rounds] {
                times = run_once(&mut stream, &taking_part, &request(n), group.len())
                    .await
                    .with_context(|| format!("{name} of {bytes} bytes"))?;
            }
            let treecast = Spread::of(&times).context("no process answered")?;
            rows.push(CollectiveRow {
                op: name,
                bytes,
                rounds,
                treecast,
                mpi: Err("not measured yet".into()),
                ratio: None,
            });
        }
    }
    stream.close().await;
    stop_and_wait(net, &[spawned]).await?;
    add_mpi(&mut rows, launch.len() as u32, sizes, mpi);
    Ok(CollectiveBench { members: members.len(), rows })
}

/// Sends one request to every rank taking part; returns each one's mean time.
async fn run_once(
    stream: &mut treecast_api::Stream,
    ranks: &[u32],
    request: &[Value],
    members: usize,
) -> anyhow::Result<Vec<f64>> {
    for &r in ranks {
        stream.send_to(r, TAG_COLLECTIVE, COLLECTIVE_REQUEST, request).await?;
    }
    let mut answers = BTreeMap::new();
    while answers.len() < ranks.len() {
        let p = stream.recv_timeout(STEP_LIMIT).await?;
        let v = p.unpack(COLLECTIVE_ANSWER).map_err(|_| {
            let why = p.values().ok().and_then(|v| v.first().and_then(|s| s.as_str().map(str::to_owned)));
            anyhow::anyhow!("rank {}: {}", p.rank(), why.unwrap_or_else(|| "a malformed answer".into()))
        })?;
        ensure!(
            v[3] == Value::UInt(members as u32),
            "rank {}: {:?} of {members} members took part",
            p.rank(),
            v[3]
        );
        answers.insert(p.rank(), v[0].as_f64().unwrap_or(f64::NAN));
    }
    Ok(answers.into_values().collect())
}

/// Fills in MPI's figures (one job for every size) and the ratios.
fn add_mpi(rows: &mut [CollectiveRow], n: u32, sizes: &[u32], mpi: Result<&MpiReference, String>) {
    let rounds = sizes.iter().map(|&b| rounds_for(b)).min().unwrap_or(3);
    let text: Vec<String> = sizes.iter().map(u32::to_string).collect();
    let measured = mpi.and_then(|m| {
        if 2 * n > 64 {
            return Err(format!("{} MPI processes on this machine's cores: skipped", 2 * n));
        }
        m.job(n, &["collectives", &n.to_string(), &text.join(","), &rounds.to_string()])
    });
    for row in rows {
        row.mpi = match &measured {
            Ok(lines) => parse_mpi(lines, row.op, row.bytes).ok_or_else(|| "no figure printed".to_owned()),
            Err(why) => Err(why.clone()),
        };
        row.ratio = row.mpi.as_ref().ok().map(|m| row.treecast.mean_us / m.mean_us);
    }
}

/// `coll OP BYTES MIN MEAN MAX` lines.
fn parse_mpi(lines: &[String], op: &str, bytes: u32) -> Option<Spread> {
    lines.iter().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        match f[..] {
            ["coll", o, b, lo, mean, hi] if o == op && b.parse() == Ok(bytes) => Some(Spread {
                min_us: lo.parse().ok()?,
                mean_us: mean.parse().ok()?,
                max_us: hi.parse().ok()?,
            }),
            _ => None,
        }
    })
}

/// The table of `bench intergroup`'s collectives.
pub fn render(b: &CollectiveBench) -> String {
    let mut out = format!(
        "collectives over {} members (the launch's group, then a spawned one; reduce: the spawned group to rank 0),\n\
         mean time of one operation per process, us: min / mean / max across processes\n",
        b.members
    );
    out.push_str(&format!(
        "{:>14} {:>8} {:>6} {:>28} {:>28} {:>7}\n",
        "operation", "bytes", "rounds", "treecast", "MPI", "ratio"
    ));
    let spread = |s: &Spread| format!("{:.0} / {:.0} / {:.0}", s.min_us, s.mean_us, s.max_us);
    for r in &b.rows {
        let mpi = r.mpi.as_ref().map_or_else(|_| "-".to_owned(), spread);
        let ratio = r.ratio.map_or_else(|| "-".to_owned(), |x| format!("{x:.2}"));
        out.push_str(&format!(
            "{:>14} {:>8} {:>6} {:>28} {:>28} {:>7}\n",
            r.op,
            r.bytes,
            r.rounds,
            spread(&r.treecast),
            mpi,
            ratio
        ));
    }
    if let Some(Err(why)) = b.rows.first().map(|r| &r.mpi) {
        out.push_str(&format!("  MPI: {why}\n"));
    }
    out.push_str(
        "  ratio: treecast's mean over MPI's. MPI's reduce returns at a contributing process once its\n  \
         buffer may be reused; treecast's waits until the root has the result.\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mpi_lines_are_read_by_operation_and_size() {
        let lines = vec!["coll allreduce 8 1.0 2.0 3.0".to_owned(), "coll reduce 8 0.5 1.5 2.5".to_owned()];
        assert_eq!(parse_mpi(&lines, "reduce", 8), Some(Spread { min_us: 0.5, mean_us: 1.5, max_us: 2.5 }));
        assert_eq!(parse_mpi(&lines, "reduce", 16), None);
        assert_eq!(elements(4, 1024, 32), 128);
        assert_eq!(elements(4, 8, 32), 32);
        assert_eq!(elements(2, 4, 32), 1);
    }
}
