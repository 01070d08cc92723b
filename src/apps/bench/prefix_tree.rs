//! `treecast bench prefix-tree`: what merging call-graph prefix trees inside the tree
//! saves, as STAT does with MRNet. Every back-end answers a synthetic stack
//! ([`TAG_STACK`]); the plug-in of examples/filters/prefix_tree.cpp merges them at
//! every comm node of the tree measured, and at the front-end alone over a flat tree
//! of the same back-ends, the reference, in the same run.

use std::path::Path;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::ensure;
use treecast_api::{FilterSpec, Network, StreamOptions, TransformKind, Value};

use super::shared::STEP_LIMIT;
use crate::apps::cli::BenchPrefixTreeArgs;
use crate::apps::protocol::{synthetic_stack, TAG_STACK};

/// The merge on one tree shape: its start-up and its time per wave.
struct Measured {
    spec: String,
    commnodes: u32,
    startup: Duration,
    /// Wave times, sorted.
    waves: Vec<Duration>,
    /// Call paths in the merged tree.
    paths: usize,
}

impl Measured {
    fn median(&self) -> Duration {
        self.waves[self.waves.len() / 2]
    }
}

/// Runs `treecast bench prefix-tree`.
pub async fn main(args: BenchPrefixTreeArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.waves > 0 && args.local > 0, "--waves and --local need at least 1");
    ensure!(args.depth > 0 && args.classes > 0, "--depth and --classes need at least 1");
    let tree = measure(&args.topology, &args).await?;
    let flat = measure("flat", &args).await?;
    ensure!(
        tree.paths == flat.paths,
        "the two trees merged different prefix trees ({} and {} call paths)",
        tree.paths,
        flat.paths
    );
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    println!(
        "prefix-tree merge, {} back-ends, stacks of {} frames in {} classes ({} call paths), {} waves each:",
        args.local, args.depth, args.classes, tree.paths, args.waves
    );
    for m in [&tree, &flat] {
        println!(
            "  {:<14} {:>4} comm nodes  start-up {:>7.3} s  wave median {:>8.2} ms  p90 {:>8.2} ms",
            m.spec,
            m.commnodes,
            m.startup.as_secs_f64(),
            ms(m.median()),
            ms(m.waves[m.waves.len() * 9 / 10]),
        );
    }
    println!(
        "  merged in the tree: {:.2}x the front-end's time per wave alone",
        tree.median().as_secs_f64() / flat.median().as_secs_f64()
    );
    Ok(ExitCode::SUCCESS)
}

/// Launches `spec` over the back-ends, ships the plug-in, and times the waves.
async fn measure(spec: &str, args: &BenchPrefixTreeArgs) -> anyhow::Result<Measured> {
    let topology = crate::apps::run::topology_from_spec(spec, Some(args.local))?;
    let net = crate::apps::settings::builder(topology)?.launch().await?;
    let outcome = waves(&net, &args.plugin, args).await;
    let (commnodes, startup) = (net.commnodes(), net.startup_time());
    net.shutdown().await;
    let (waves, paths) = outcome?;
    Ok(Measured { spec: spec.to_owned(), commnodes, startup, waves, paths })
}

async fn waves(
    net: &Network,
    plugin: &Path,
    args: &BenchPrefixTreeArgs,
) -> anyhow::Result<(Vec<Duration>, usize)> {
    let loaded = net.load_filter(plugin).await?;
    ensure!(
        loaded.name() == "prefix_tree",
        "{} holds the filter {:?}, not prefix_tree",
        plugin.display(),
        loaded.name()
    );
    let up = FilterSpec::new("prefix_tree", loaded.version());
    let options = StreamOptions { up, ..StreamOptions::reduce(TransformKind::Null) };
    let stream = net.new_stream(&net.broadcast_communicator(), options).await?;
    let expected = expected_paths(args);
    let request = [Value::UInt(args.depth), Value::UInt(args.classes)];
    let mut times = Vec::with_capacity(args.waves);
    for i in 0..=args.waves {
        let t = Instant::now();
        stream.send(TAG_STACK, "%ud %ud", &request).await?;
        let p = stream.recv_timeout(STEP_LIMIT).await?;
        let elapsed = t.elapsed();
        let values = p.unpack("%as %as")?;
        let (Value::StrArray(paths), Value::StrArray(ranks)) = (&values[0], &values[1]) else {
            anyhow::bail!("wave {i}: the merged tree is not \"%as %as\"");
        };
        ensure!(paths.len() == expected, "wave {i}: {} call paths, expected {expected}", paths.len());
        let at_root = ranks.first().map_or(0, |r| r.split(',').count());
        ensure!(at_root == args.local, "wave {i}: {at_root} ranks under main, expected {}", args.local);
        if i > 0 {
            times.push(elapsed);
        }
    }
    times.sort();
    Ok((times, expected))
}

/// The number of distinct call paths the back-ends' stacks make.
fn expected_paths(args: &BenchPrefixTreeArgs) -> usize {
    let ranks = (args.local as u32).min(args.classes);
    let mut paths = std::collections::BTreeSet::new();
    for rank in 0..ranks {
        let stack = synthetic_stack(rank, args.depth, args.classes);
        for k in 1..=stack.len() {
            paths.insert(stack[..k].join("/"));
        }
    }
    paths.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stacks_branch_one_class_bit_per_level() {
        assert_eq!(synthetic_stack(5, 3, 4), ["main", "f1_1", "f2_1"]);
        assert_eq!(synthetic_stack(6, 3, 4), ["main", "f1_0", "f2_2"]);
        let args = BenchPrefixTreeArgs {
            local: 100,
            topology: "flat".into(),
            waves: 1,
            depth: 3,
            classes: 4,
            plugin: "x.so".into(),
        };
        // main; f1_0, f1_1; f2_0 to f2_3.
        assert_eq!(expected_paths(&args), 7);
    }
}
