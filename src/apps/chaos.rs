//! `treecast bench chaos`: runs reductions on a real tree while comm nodes and
//! back-ends are killed (SIGKILL) or stopped (SIGSTOP) at random times, and counts
//! what went wrong: hangs, wrong answers, ranks reported lost that were alive,
//! processes left behind, front-end panics. It is a benchmark, not a timed test.
//!
//! Each wave asks every rank for `x + rank` through the equivalence-class filter, so
//! the front-end sees exactly which ranks answered and what each said: an answer is
//! wrong if its value is not `x + rank`, or if a rank answers after it was reported
//! lost. A wave that takes longer than its limit is a hang.
//!
//! With `--sim` the same runs go through the simulated tree instead (every node's
//! protocol core in this process, heartbeats on, virtual time; see
//! `treecast_sim::chaos`), thousands of runs a minute, on random trees unless
//! `--topology` names one.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use treecast_api::{Event, Network, NetworkBuilder, RankSet, StreamOptions, Topology, TransformKind, Value};
use treecast_sim::chaos::{self as sim_chaos, ChaosConfig, ChaosTrees};

use super::cli::ChaosArgs;
use super::protocol::TAG_ADD_RANK;

/// One process of the tree under test.
#[derive(Debug, Clone)]
struct Victim {
    pid: u32,
    /// `comm node N` or `back-end rank R`.
    what: String,
    /// The ranks it serves (its sub-tree).
    ranks: RankSet,
}

/// What one run found.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ChaosRun {
    /// Waves completed.
    pub waves: usize,
    /// Processes killed or stopped, as `SIGKILL comm node 5`.
    pub faults: Vec<String>,
    /// API calls that exceeded their limit.
    pub hangs: usize,
    /// Answers with a wrong value, or from a rank already reported lost.
    pub wrong: usize,
    /// Ranks reported lost whose back-end was neither killed nor stopped (nor under a
    /// killed or stopped comm node).
    pub live_ranks_lost: u64,
    /// Ranks under a killed or stopped comm node whose own back-end was alive, and
    /// that were reported lost: with recovery off, all of a faulted node's sub-tree;
    /// with it on, the orphans that could not rejoin (their fallback faulted too).
    pub orphaned_ranks: u64,
    /// Ranks reported back after their comm node was lost (`RanksRejoined`).
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
    let topology = Topology::from_spec(&spec, args.local).with_context(|| format!("topology {spec:?}"))?;
    let mut results = Vec::new();
    for run in 0..runs {
        let seed = args.seed.wrapping_add(run as u64);
        let topo = topology.clone();
        let a = args.clone();
        let outcome = tokio::spawn(async move { one_run(topo, &a, seed).await }).await;
        let result = match outcome {
            Ok(r) => r?,
            Err(e) => ChaosRun { panicked: e.is_panic(), ..ChaosRun::default() },
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
    let secs = args.rejoin_within.unwrap_or(treecast_node::env::DEFAULT_REJOIN_WITHIN.as_secs_f64());
    (secs > 0.0).then(|| Duration::from_secs_f64(secs))
}

/// Refuses flags no run can use, before any process starts.
fn check(args: &ChaosArgs) -> anyhow::Result<()> {
    anyhow::ensure!(args.runs != Some(0) && args.waves > 0, "--runs and --waves need at least 1");
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
            let t = Topology::from_spec(spec, args.local).with_context(|| format!("topology {spec:?}"))?;
            let backends = t.backends();
            (ChaosTrees::Fixed(t), serde_json::json!(spec), serde_json::json!(backends))
        }
        None => {
            let name = format!("random: depth 1-5, fan-out 1-32, up to {} nodes", args.max_nodes);
            (ChaosTrees::random(args.max_nodes), serde_json::json!(name), serde_json::Value::Null)
        }
    };
    let config = ChaosConfig {
        trees,
        waves: args.waves,
        faults: args.faults,
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
            waves: r.waves,
            faults: r.faults.iter().map(ToString::to_string).collect(),
            hangs: r.hangs,
            wrong: r.wrong as usize,
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
    format!(
        "run {run:3}{tree}: {:4} waves, faults [{}], hangs {}, wrong {}, live lost {}, orphaned {}, rejoined {}, left {}{}",
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

/// The totals of a set of runs, as JSON.
fn totals(
    runs: &[ChaosRun],
    topology: serde_json::Value,
    backends: serde_json::Value,
    simulated: bool,
) -> serde_json::Value {
    let mut recovery: Vec<f64> = runs.iter().flat_map(|r| r.recovery_s.iter().copied()).collect();
    recovery.sort_by(f64::total_cmp);
    let pick = |q: f64| recovery.get(((recovery.len() as f64 - 1.0) * q).round() as usize).copied();
    serde_json::json!({
        "runs": runs.len(),
        "simulated": simulated,
        "topology": topology,
        "backends": backends,
        "hangs": runs.iter().map(|r| r.hangs).sum::<usize>(),
        "wrong": runs.iter().map(|r| r.wrong).sum::<usize>(),
        "live_ranks_lost": runs.iter().map(|r| r.live_ranks_lost).sum::<u64>(),
        "orphaned_ranks": runs.iter().map(|r| r.orphaned_ranks).sum::<u64>(),
        "rejoined_ranks": runs.iter().map(|r| r.rejoined_ranks).sum::<u64>(),
        "left": runs.iter().map(|r| r.left).sum::<usize>(),
        "panics": runs.iter().filter(|r| r.panicked).count(),
        "faults": runs.iter().map(|r| r.faults.len()).sum::<usize>(),
        "waves": runs.iter().map(|r| r.waves).sum::<usize>(),
        "recovery_s_median": pick(0.5),
        "recovery_s_p99": pick(0.99),
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

async fn one_run(topo: Topology, args: &ChaosArgs, seed: u64) -> anyhow::Result<ChaosRun> {
    let mut rng = StdRng::seed_from_u64(seed);
    let dead_after = Duration::from_secs_f64(args.dead_after);
    let mut net = NetworkBuilder::new(topo.clone())
        .dead_after(Some(dead_after))
        .rejoin_within(rejoin_limit(args))
        .launch()
        .await?;
    let session = net.session().to_owned();
    let victims = processes(&session, &topo);
    let mut stream =
        net.new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::EqClass)).await?;
    // A wave may wait for the silence limit before a stopped node is cut off.
    let limit = dead_after * 3 + Duration::from_secs(10);
    let mut run = ChaosRun::default();
    let mut faults: Vec<(Instant, Victim, bool)> = Vec::new();
    let mut pending_recovery: Vec<Instant> = Vec::new();
    let mut fault_at: Vec<usize> = (0..args.faults).map(|_| rng.gen_range(0..args.waves.max(1))).collect();
    fault_at.sort_unstable();
    let mut lost = RankSet::new();
    for wave in 0..args.waves {
        while fault_at.first() == Some(&wave) {
            fault_at.remove(0);
            let candidates: Vec<&Victim> =
                victims.iter().filter(|v| !faults.iter().any(|(_, f, _)| f.pid == v.pid)).collect();
            if candidates.is_empty() {
                // This wave's other faults have no victim either; later waves keep theirs.
                fault_at.retain(|&w| w > wave);
                break;
            }
            let victim = candidates[rng.gen_range(0..candidates.len())].clone();
            let stop = rng.gen_bool(args.stop_fraction);
            let signal = if stop { "-STOP" } else { "-KILL" };
            signal_process(signal, victim.pid);
            run.faults.push(format!("SIG{} {}", &signal[1..], victim.what));
            faults.push((Instant::now(), victim, stop));
            pending_recovery.push(Instant::now());
        }
        let x = rng.gen_range(0..1_000_000);
        let sent_lost = net.lost().ranks().clone();
        stream.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await?;
        match stream.recv_timeout(limit).await {
            Ok(packet) => {
                run.waves += 1;
                for class in packet.eq_classes()? {
                    let value = class.values.first().and_then(Value::as_i64);
                    for r in class.ranks.iter() {
                        if value != Some(i64::from(x) + i64::from(r)) || sent_lost.contains(r) {
                            run.wrong += 1;
                        }
                    }
                }
                let now = Instant::now();
                run.recovery_s.extend(pending_recovery.drain(..).map(|t| (now - t).as_secs_f64()));
            }
            // Every rank the request reached was cut off with its comm node; the
            // stream goes on for the orphans that rejoin.
            Err(treecast_api::ApiError::NoAnswer(_)) => run.waves += 1,
            Err(treecast_api::ApiError::StreamClosed(_)) => break,
            Err(_) => {
                run.hangs += 1;
                break;
            }
        }
        while let Some(event) = net.try_event() {
            match event {
                Event::RanksLost { ranks, .. } => lost.union_with(&ranks),
                Event::RanksRejoined { ranks, .. } => run.rejoined_ranks += ranks.len(),
                _ => {}
            }
        }
    }
    lost.union_with(net.lost().ranks());
    // Which lost ranks were alive: not killed or stopped themselves, nor under a node that was.
    let mut faulted_backends = RankSet::new();
    let mut under_faulted_node = RankSet::new();
    for (_, v, _) in &faults {
        if v.what.starts_with("back-end") {
            faulted_backends.union_with(&v.ranks);
        } else {
            under_faulted_node.union_with(&v.ranks);
        }
    }
    let collateral = lost.difference(&faulted_backends);
    run.orphaned_ranks = collateral.intersection(&under_faulted_node).len();
    run.live_ranks_lost = collateral.difference(&under_faulted_node).len();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.close()).await;
    shutdown(net).await;
    // Stopped processes that are still there are continued, so that they can see
    // their links closed and end; then whatever is left is counted.
    for (_, v, stopped) in &faults {
        if *stopped {
            signal_process("-CONT", v.pid);
        }
    }
    run.left = wait_for_none(&session, Duration::from_secs(10)).await;
    // Counted, then ended: the benchmark leaves nothing behind either.
    for (pid, _) in session_processes(&session) {
        signal_process("-KILL", pid);
    }
    Ok(run)
}

/// Sends a signal with kill(1); a process that is already gone is not an error here.
fn signal_process(signal: &str, pid: u32) {
    let _ = std::process::Command::new("kill")
        .args([signal, &pid.to_string()])
        .stderr(std::process::Stdio::null())
        .status();
}

async fn shutdown(net: Network) {
    let _ = tokio::time::timeout(Duration::from_secs(30), net.shutdown()).await;
}

/// The comm nodes and back-ends of a session, from `/proc`.
fn processes(session: &str, topo: &Topology) -> Vec<Victim> {
    let mut found = BTreeMap::new();
    for (pid, env) in session_processes(session) {
        let get = |k: &str| {
            env.iter().find_map(|kv| kv.strip_prefix(k).and_then(|v| v.strip_prefix('=')).map(str::to_owned))
        };
        let Some(id) = get("TREECAST_NODE_ID").and_then(|s| s.parse::<usize>().ok()) else { continue };
        if id == 0 || id >= topo.len() {
            continue;
        }
        let range = topo.rank_range(id);
        let ranks = RankSet::range(range.start, range.end.saturating_sub(range.start));
        let what = match topo.backend_rank(id) {
            Some(r) => format!("back-end rank {r}"),
            None => format!("comm node {id}"),
        };
        found.insert(id, Victim { pid, what, ranks });
    }
    found.into_values().collect()
}

/// Pids and environments of the live processes of a session (this one excepted).
fn session_processes(session: &str) -> Vec<(u32, Vec<String>)> {
    let needle = format!("TREECAST_SESSION={session}");
    let me = std::process::id();
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    let mut out = Vec::new();
    for entry in dir.flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else { continue };
        if pid == me {
            continue;
        }
        let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
        let vars: Vec<String> =
            env.split(|b| *b == 0).map(|kv| String::from_utf8_lossy(kv).into_owned()).collect();
        let zombie = std::fs::read_to_string(entry.path().join("stat"))
            .ok()
            .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('Z')))
            .unwrap_or(true);
        if !zombie && vars.contains(&needle) {
            out.push((pid, vars));
        }
    }
    out
}

/// Waits up to `limit` for every process of the session to end; returns how many remain.
async fn wait_for_none(session: &str, limit: Duration) -> usize {
    let deadline = Instant::now() + limit;
    loop {
        let left = session_processes(session).len();
        if left == 0 || Instant::now() >= deadline {
            return left;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
