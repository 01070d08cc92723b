//! `treecast bench chaos`: runs reductions, file transfers and start-ups on a real
//! tree while comm nodes and back-ends are killed (SIGKILL) or stopped (SIGSTOP) at
//! random times, and counts what went wrong: hangs, wrong answers, ranks reported
//! lost that were alive, processes left behind, front-end panics. It is a benchmark,
//! not a timed test.
//!
//! Each wave asks every rank for `x + rank` through the equivalence-class filter, so
//! the front-end sees exactly which ranks answered and what each said: an answer is
//! wrong if its value is not `x + rank`, or if a rank answers after it was reported
//! lost. A wave that takes longer than its limit is a hang. A file transfer is wrong
//! if its report leaves a rank out or calls written a copy that differs from the
//! source; the ranks it fails are sorted like lost ones. A start-up under fire goes
//! on without what failed; the waves after it check the tree that came up.
//!
//! With `--sim` the same runs go through the simulated tree instead (every node's
//! protocol core in this process, heartbeats on, virtual time; see
//! `treecast_sim::chaos`), thousands of runs a minute, on random trees unless
//! `--topology` names one.

mod procs;
mod real;

use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;
use treecast_sim::chaos::{self as sim_chaos, ChaosConfig, ChaosTrees, FaultPhase};

use crate::apps::cli::{ChaosArgs, ChaosPhase};

/// What one run found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosRun {
    /// When the faults struck: `reduce`, `bcast` or `startup`.
    pub phase: &'static str,
    /// The start-up failed (start-up faults): why. Naming what failed is a correct
    /// outcome of a start-up under fire, not a finding.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub startup_failed: Option<String>,
    /// Ranks the file transfer reported failed or lost (bcast faults).
    pub transfer_failed: u64,
    /// What went wrong, in words, when something did.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// Waves completed.
    pub waves: usize,
    /// Processes killed or stopped, as `SIGKILL comm node 5`.
    pub faults: Vec<String>,
    /// API calls that exceeded their limit.
    pub hangs: usize,
    /// Answers with a wrong value, or from a rank already reported lost.
    pub wrong: u64,
    /// Ranks reported lost whose back-end was neither killed nor stopped (nor under a
    /// killed or stopped comm node).
    pub live_ranks_lost: u64,
    /// Ranks under a killed or stopped comm node whose own back-end was alive, and
    /// that were reported lost: with recovery off, all of a faulted node's sub-tree;
    /// with it on, the orphans that could not rejoin (their fallback faulted too).
    pub orphaned_ranks: u64,
    /// Ranks reported back after their comm node was lost (`RanksRejoined`), each
    /// once; a real run is counted only once every orphan rejoined or was lost.
    pub rejoined_ranks: u64,
    /// From each fault to the end of the next wave that completed, seconds.
    pub recovery_s: Vec<f64>,
    /// Processes of the session still running after the front-end shut down.
    pub left: usize,
    /// The run's task panicked.
    pub panicked: bool,
    /// Simulated runs: the run's seed and tree (`--seed S --runs 1` repeats it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimTree>,
}

/// The seed and tree of a simulated run.
#[derive(Debug, Clone, Serialize)]
pub struct SimTree {
    /// The run's seed.
    pub seed: u64,
    /// Nodes, the front-end included.
    pub nodes: usize,
    /// Back-ends.
    pub backends: usize,
    /// Depth.
    pub depth: usize,
}

impl ChaosRun {
    /// True when the run found something to look at.
    fn failed(&self) -> bool {
        self.hangs > 0 || self.wrong > 0 || self.live_ranks_lost > 0 || self.left > 0 || self.panicked
    }
}

/// Runs the chaos benchmark and prints one line per run and the totals.
pub async fn main(args: ChaosArgs) -> anyhow::Result<ExitCode> {
    check(&args)?;
    if args.sim {
        return sim_main(&args);
    }
    let runs = args.runs.unwrap_or(10);
    let spec = args.topology.clone().unwrap_or_else(|| "kary:4".to_owned());
    let topology = crate::apps::run::topology_from_spec(&spec, args.local)?;
    let phases = if args.during.is_empty() {
        vec![ChaosPhase::Reduce, ChaosPhase::Bcast, ChaosPhase::Startup]
    } else {
        args.during.clone()
    };
    let mut results = Vec::new();
    for run in 0..runs {
        let seed = args.seed.wrapping_add(run as u64);
        let phase = phases[(seed % phases.len() as u64) as usize];
        let topo = topology.clone();
        let a = args.clone();
        let outcome = tokio::spawn(async move { real::one_run(topo, &a, seed, phase).await }).await;
        let result = match outcome {
            Ok(r) => r?,
            Err(e) => ChaosRun { phase: phase.name(), panicked: e.is_panic(), ..ChaosRun::default() },
        };
        if !args.json {
            println!("{}", line(run, &result));
        }
        results.push(result);
    }
    let mut totals = totals(&results, serde_json::json!(spec), serde_json::json!(topology.backends()), false);
    totals["rejoin_within_s"] = serde_json::json!(rejoin_limit(&args).map_or(0.0, |d| d.as_secs_f64()));
    Ok(report(&results, totals, args.json))
}

/// The rejoin limit of the trees under test; `None` with recovery off.
fn rejoin_limit(args: &ChaosArgs) -> Option<Duration> {
    let secs = args.rejoin_within.unwrap_or(treecast_driver::env::DEFAULT_REJOIN_WITHIN.as_secs_f64());
    (secs > 0.0).then(|| Duration::from_secs_f64(secs))
}

/// Refuses flags no run can use, before any process starts.
fn check(args: &ChaosArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.runs != Some(0) && args.waves > 0, "--runs and --waves need at least 1");
    anyhow::ensure!(args.faults <= 100_000, "--faults {} is over 100,000 per run", args.faults);
    if let Some(p) = args.kill_rate {
        anyhow::ensure!((0.0..=1.0).contains(&p), "--kill-rate {p} is not a probability between 0 and 1");
    }
    anyhow::ensure!(
        (1..=1 << 30).contains(&args.file_size),
        "--file-size {} is not 1 byte to 1 GiB: each bcast run strikes at byte counts of a random file made in memory",
        args.file_size
    );
    if args.sim && args.during.iter().any(|p| p.simulated().is_none()) {
        anyhow::bail!(
            "--during bcast needs real processes: the simulated tree runs only the protocol core, and file \
             transfers are made above it; drop --sim, or use --during reduce,startup"
        );
    }
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.stop_fraction),
        "--stop-fraction {} is not a share between 0 and 1",
        args.stop_fraction
    );
    if let Some(secs) = args.rejoin_within {
        anyhow::ensure!(
            secs == 0.0 || (secs.is_finite() && (0.1..=1e6).contains(&secs)),
            "--rejoin-within {secs} is not 0 (off) or a number of seconds from 0.1"
        );
    }
    anyhow::ensure!(
        args.dead_after.is_finite() && args.dead_after > 0.0 && args.dead_after <= 1e6,
        "--dead-after {} must be a number of seconds above 0: a stopped node is noticed only through the silence limit",
        args.dead_after
    );
    Ok(())
}

/// The seed of the simulated run under way, for the panic hook.
static SIM_SEED: AtomicU64 = AtomicU64::new(0);

/// `--sim`: the same runs in the simulated tree, in virtual time.
fn sim_main(args: &ChaosArgs) -> anyhow::Result<ExitCode> {
    let runs = args.runs.unwrap_or(1000);
    anyhow::ensure!(args.max_nodes >= 2, "--max-nodes needs at least 2 (a front-end and a back-end)");
    let (trees, name, backends) = match &args.topology {
        Some(spec) => {
            let t = crate::apps::run::topology_from_spec(spec, args.local)?;
            let backends = t.backends();
            (ChaosTrees::Fixed(t), serde_json::json!(spec), serde_json::json!(backends))
        }
        None => {
            let name = format!("random: depth 1-5, fan-out 1-32, up to {} nodes", args.max_nodes);
            (ChaosTrees::random(args.max_nodes), serde_json::json!(name), serde_json::Value::Null)
        }
    };
    let during = if args.during.is_empty() {
        vec![FaultPhase::Reduce, FaultPhase::Startup]
    } else {
        args.during.iter().filter_map(|p| p.simulated()).collect()
    };
    let config = ChaosConfig {
        trees,
        waves: args.waves,
        faults: args.faults,
        kill_rate: args.kill_rate,
        during,
        stop_fraction: args.stop_fraction,
        dead_after: Duration::from_secs_f64(args.dead_after),
        rejoin: rejoin_limit(args),
    };
    // Release builds abort on a panic (see Cargo.toml), so one cannot be caught and
    // counted there: name the run that panicked before the process ends.
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        eprintln!(
            "chaos run with seed {} panicked; repeat it with --seed {0} --runs 1",
            SIM_SEED.load(Ordering::Relaxed)
        );
        previous(info);
    }));
    let mut results = Vec::new();
    for run in 0..runs {
        let seed = args.seed.wrapping_add(run as u64);
        SIM_SEED.store(seed, Ordering::Relaxed);
        // The simulated nodes log what real ones would (a link cut off for silence, a
        // parent gone): thousands of runs would bury the results under it; the run counts.
        let r = tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || {
            sim_chaos::run(&config, seed)
        })?;
        let result = ChaosRun {
            phase: r.phase.name(),
            startup_failed: r.startup_failed.clone(),
            transfer_failed: 0,
            notes: Vec::new(),
            waves: r.waves,
            faults: r.faults.iter().map(ToString::to_string).collect(),
            hangs: r.hangs,
            wrong: r.wrong,
            live_ranks_lost: r.live_ranks_lost,
            orphaned_ranks: r.orphaned_ranks,
            rejoined_ranks: r.rejoined_ranks,
            recovery_s: r.recovery.iter().map(Duration::as_secs_f64).collect(),
            left: r.left,
            panicked: r.panic.is_some(),
            sim: Some(SimTree { seed, nodes: r.nodes, backends: r.backends, depth: r.depth }),
        };
        // Thousands of runs: the ones that found something, and every 100th to show progress.
        if !args.json && (runs <= 100 || result.failed() || run % 100 == 0) {
            println!("{}", line(run, &result));
            if let Some(p) = &r.panic {
                println!("         panicked: {p}");
            }
        }
        results.push(result);
    }
    let _ = std::panic::take_hook();
    let mut totals = totals(&results, name, backends, true);
    totals["rejoin_within_s"] = serde_json::json!(rejoin_limit(args).map_or(0.0, |d| d.as_secs_f64()));
    Ok(report(&results, totals, args.json))
}

/// One run as a line of text.
fn line(run: usize, r: &ChaosRun) -> String {
    let tree = match &r.sim {
        Some(t) => {
            format!(" (seed {}, {} nodes, {} back-ends, depth {})", t.seed, t.nodes, t.backends, t.depth)
        }
        None => String::new(),
    };
    let startup = match &r.startup_failed {
        Some(why) => format!(", start-up failed: {why}"),
        None => String::new(),
    };
    let notes = r.notes.iter().map(|n| format!("\n         {n}")).collect::<String>();
    format!(
        "run {run:3} {}{tree}: {:4} waves, faults [{}], hangs {}, wrong {}, live lost {}, orphaned {}, rejoined {}, left {}{}{startup}{notes}",
        r.phase,
        r.waves,
        r.faults.join(", "),
        r.hangs,
        r.wrong,
        r.live_ranks_lost,
        r.orphaned_ranks,
        r.rejoined_ranks,
        r.left,
        if r.panicked { ", PANICKED" } else { "" }
    )
}

/// The totals of a set of runs, as JSON, with the same counts per phase.
fn totals(
    runs: &[ChaosRun],
    topology: serde_json::Value,
    backends: serde_json::Value,
    simulated: bool,
) -> serde_json::Value {
    let all: Vec<&ChaosRun> = runs.iter().collect();
    let mut out = counts(&all);
    let mut recovery: Vec<f64> = runs.iter().flat_map(|r| r.recovery_s.iter().copied()).collect();
    recovery.sort_by(f64::total_cmp);
    let pick = |q: f64| recovery.get(((recovery.len() as f64 - 1.0) * q).round() as usize).copied();
    let mut phases = serde_json::Map::new();
    for phase in ["reduce", "bcast", "startup"] {
        let these: Vec<&ChaosRun> = runs.iter().filter(|r| r.phase == phase).collect();
        if !these.is_empty() {
            phases.insert(phase.to_owned(), counts(&these));
        }
    }
    out["simulated"] = serde_json::json!(simulated);
    out["topology"] = topology;
    out["backends"] = backends;
    out["recovery_s_median"] = serde_json::json!(pick(0.5));
    out["recovery_s_p99"] = serde_json::json!(pick(0.99));
    out["phases"] = serde_json::Value::Object(phases);
    out
}

/// What a set of runs found, summed.
fn counts(runs: &[&ChaosRun]) -> serde_json::Value {
    serde_json::json!({
        "runs": runs.len(),
        "hangs": runs.iter().map(|r| r.hangs).sum::<usize>(),
        "wrong": runs.iter().map(|r| r.wrong).sum::<u64>(),
        "live_ranks_lost": runs.iter().map(|r| r.live_ranks_lost).sum::<u64>(),
        "orphaned_ranks": runs.iter().map(|r| r.orphaned_ranks).sum::<u64>(),
        "rejoined_ranks": runs.iter().map(|r| r.rejoined_ranks).sum::<u64>(),
        "left": runs.iter().map(|r| r.left).sum::<usize>(),
        "panics": runs.iter().filter(|r| r.panicked).count(),
        "faults": runs.iter().map(|r| r.faults.len()).sum::<usize>(),
        "waves": runs.iter().map(|r| r.waves).sum::<usize>(),
        "startups_failed": runs.iter().filter(|r| r.startup_failed.is_some()).count(),
        "transfer_failed_ranks": runs.iter().map(|r| r.transfer_failed).sum::<u64>(),
    })
}

/// Prints the totals (and with `json` every run); the exit code says whether all was well.
fn report(runs: &[ChaosRun], totals: serde_json::Value, json: bool) -> ExitCode {
    if json {
        println!("{}", serde_json::json!({ "totals": totals, "runs": runs }));
    } else {
        println!("totals: {totals}");
    }
    let clean = ["hangs", "wrong", "left", "panics", "live_ranks_lost"].iter().all(|k| totals[*k] == 0);
    if clean {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
