//! `treecast bench microbench`: round trips and back-to-back reductions on a running
//! tree, against a socket ping-pong and a raw tree of relay processes measured in
//! the same run; what recording costs (`--overhead`); and `treecast bench run`, a
//! command on a running tree against a cold start.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde::Serialize;
use treecast_api::{Network, StreamOptions, Topology, TransformKind, Value};

use super::costs::{own_cpu_s, PerRound, Place, RoundCosts, Tracked};
use super::shared::STEP_LIMIT;
use crate::apps::cli::MicrobenchArgs;
use crate::apps::protocol::{TAG_ADD_RANK, TAG_BURST};
use crate::apps::run::DEFAULT_TOPOLOGY;

/// Round trips run before timing starts, to warm caches and connections.
const WARMUP: usize = 10;

/// Peak resident memory of the processes of one network.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PeakRss {
    /// The front-end (this process).
    pub frontend: u64,
    /// The largest comm node.
    pub commnode_max: u64,
    /// The largest back-end.
    pub backend_max: u64,
    /// The largest comm node's private memory at the end of the run (what it does not
    /// share with the other processes: its heap and stacks, not the binary's code pages).
    pub commnode_private: u64,
}

/// The figures of one tree shape.
#[derive(Debug, Clone, Serialize)]
pub struct MicrobenchResult {
    /// The topology spec.
    pub topology: String,
    /// Back-ends.
    pub backends: u32,
    /// Comm nodes (front-end excluded).
    pub commnodes: u32,
    /// Launch until every back-end reported, seconds.
    pub instantiation_s: f64,
    /// CPU seconds the tree's processes had used, and the front-end since the launch
    /// began, read as soon as start-up was over: against `instantiation_s` times the
    /// cores, whether start-up waited for the CPU. It includes what the tree did
    /// while it was read (`startup_cpu_read_s`) and the front-end's search of
    /// `/proc` for the tree's processes.
    pub startup_cpu_s: f64,
    /// Seconds from the end of start-up to the end of that reading.
    pub startup_cpu_read_s: f64,
    /// Seconds waited after start-up, before the first round trip, for the global
    /// clock's first two rounds to be over (0 with `--at-once`).
    pub clock_settle_s: f64,
    /// Round-trip latency (broadcast + sum reduction), mean, microseconds.
    pub rtt_us_mean: f64,
    /// Median round trip, microseconds.
    pub rtt_us_median: f64,
    /// 99th percentile round trip, microseconds.
    pub rtt_us_p99: f64,
    /// Back-to-back sum reductions per second seen at the front-end.
    pub reductions_per_s: f64,
    /// Peak RSS in KiB.
    pub peak_rss_kb: PeakRss,
    /// Round trips measured.
    pub rt_iterations: usize,
    /// Reductions measured.
    pub tp_iterations: usize,
    /// One-way latency of a raw Unix-socket ping-pong between two processes, measured
    /// in the same run, microseconds.
    pub floor_one_way_us: f64,
    /// Links a round trip crosses: twice the depth of the tree.
    pub hops: usize,
    /// The physical floor of a round trip: the ping-pong's one-way latency times the hops.
    pub floor_us: f64,
    /// Median round trip of the same tree made of raw relay processes (a byte down,
    /// a byte up, no protocol), measured in the same run, microseconds.
    pub raw_tree_us: f64,
    /// CPU time and wake-ups per round trip of each level of the tree.
    pub round_costs: RoundCosts,
    /// The same of the raw tree.
    pub raw_round_costs: RoundCosts,
}

/// Runs `treecast bench microbench`.
pub(super) async fn microbench(args: MicrobenchArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.rt > 0 && args.tp > 0, "--rt and --tp need at least 1 iteration");
    let spec = args.topology.as_deref().unwrap_or(DEFAULT_TOPOLOGY);
    let topology = crate::apps::run::topology_from_spec(spec, args.local)?;
    // The reference shape gets as many back-ends as the tree measured.
    let backends = topology.backends();
    if let Some(rounds) = args.overhead {
        return monitoring_overhead(spec, topology, &args, rounds).await;
    }
    if let Some(program) = &args.c_twin {
        return super::c_twin::against_rust(program, spec, &args).await;
    }
    let mut results = vec![run_case(spec, topology, &args, args.monitor.as_deref()).await?];
    if let Some(reference) = &args.compare {
        let topology = crate::apps::run::topology_from_spec(reference, Some(backends))?;
        results.push(run_case(reference, topology, &args, None).await?);
    }
    if args.json {
        for r in &results {
            println!("{}", serde_json::to_string(r)?);
        }
    } else {
        for r in &results {
            print!("{}", render(r));
        }
        if let [tree, reference] = results.as_slice() {
            print!("{}", render_ratios(tree, reference));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub(super) async fn run_case(
    spec: &str,
    topology: Topology,
    args: &MicrobenchArgs,
    monitor: Option<&std::path::Path>,
) -> anyhow::Result<MicrobenchResult> {
    let hops = 2 * topology.depth();
    let raw_text = topology.to_mrnet();
    let before_launch = own_cpu_s();
    let net = crate::apps::settings::builder(topology)?.launch().await?;
    let launched = Instant::now();
    // At once, before anything else runs on the tree: what it reads is start-up's
    // work plus what the tree did while it was read.
    let tracked = Tracked::session(net.session());
    let startup_cpu_s = tracked.cpu_so_far_s() - before_launch;
    let startup_cpu_read_s = launched.elapsed().as_secs_f64();
    let outcome = match monitor {
        Some(path) => measure_monitored(&net, spec, args, &tracked, path).await,
        None => measure(&net, spec, args, &tracked).await,
    };
    net.shutdown().await;
    let mut result = outcome?;
    (result.startup_cpu_s, result.startup_cpu_read_s) = (startup_cpu_s, startup_cpu_read_s);
    let one_way = tokio::task::spawn_blocking(ping_pong_one_way).await??;
    result.floor_one_way_us = one_way.as_secs_f64() * 1e6;
    result.hops = hops;
    result.floor_us = result.floor_one_way_us * hops as f64;
    let rounds = args.rt;
    let (raw, raw_costs) =
        tokio::task::spawn_blocking(move || raw_tree_round_trip(&raw_text, rounds)).await??;
    result.raw_tree_us = raw.as_secs_f64() * 1e6;
    result.raw_round_costs = raw_costs;
    Ok(result)
}

/// Program tag of the frames a monitored microbench records.
const MICROBENCH_PROGRAM: u32 = 1;

/// [`measure`] with every node recording, then the reports collected into `path`.
async fn measure_monitored(
    net: &treecast_api::Network,
    spec: &str,
    args: &MicrobenchArgs,
    tracked: &Tracked,
    path: &std::path::Path,
) -> anyhow::Result<MicrobenchResult> {
    warn_unconfirmed(net.monitor_start(MICROBENCH_PROGRAM).await?);
    let result = measure(net, spec, args, tracked).await;
    warn_unconfirmed(net.monitor_stop().await?);
    let collection = net.monitor_collect(true, Duration::from_secs(30)).await?;
    for missing in &collection.missing {
        eprintln!("monitor: no report from {missing}");
    }
    std::fs::write(path, collection.to_json()).with_context(|| format!("writing {}", path.display()))?;
    let samples = collection.merged()?.count();
    eprintln!(
        "monitor: {samples} samples from {} nodes written to {}",
        collection.reports.len(),
        path.display()
    );
    result
}

/// Medians of the rounds with monitoring off and on, and what recording took.
#[derive(Debug, Clone, Serialize)]
struct Overhead {
    topology: String,
    backends: u32,
    rounds: usize,
    rtt_us_median_off: f64,
    rtt_us_median_on: f64,
    /// Round trip on over off, minus 1, percent (positive: slower): the median of
    /// the rounds' own ratios.
    rtt_change_percent: f64,
    reductions_per_s_off: f64,
    reductions_per_s_on: f64,
    /// Reductions/s on over off, minus 1, percent (negative: fewer).
    reductions_change_percent: f64,
    /// The same two changes with recording off in both halves of every pair: how
    /// far apart two measurements of the same thing fall on this machine now.
    null_rtt_change_percent: Option<f64>,
    null_reductions_change_percent: Option<f64>,
    /// Samples every node recorded over all the rounds with monitoring on.
    samples: u64,
}

/// Runs [`measure`] on one tree `rounds` times with recording off and `rounds`
/// times with it on, in pairs, so that both see the same machine.
async fn monitoring_overhead(
    spec: &str,
    topology: Topology,
    args: &MicrobenchArgs,
    rounds: usize,
) -> anyhow::Result<ExitCode> {
    ensure!(rounds > 0, "--overhead needs at least 1 round");
    let net = crate::apps::settings::builder(topology)?.launch().await?;
    let outcome = overhead_rounds(&net, spec, args, rounds).await;
    net.shutdown().await;
    let overhead = outcome?;
    if args.json {
        println!("{}", serde_json::to_string(&overhead)?);
    } else {
        print!("{}", render_overhead(&overhead));
    }
    Ok(ExitCode::SUCCESS)
}

/// Measurements taken in pairs, one of each kind, in alternating order (a slow
/// drift of the machine then favours neither).
#[derive(Default)]
struct Paired {
    off: Vec<MicrobenchResult>,
    on: Vec<MicrobenchResult>,
}

impl Paired {
    /// Median of one figure over each kind's measurements.
    fn medians(&self, field: fn(&MicrobenchResult) -> f64) -> (f64, f64) {
        let median = |runs: &[MicrobenchResult]| {
            let mut v: Vec<f64> = runs.iter().map(field).collect();
            v.sort_by(f64::total_cmp);
            percentile(&v, 0.5)
        };
        (median(&self.off), median(&self.on))
    }

    /// Median over the pairs of on over off, minus 1, percent: each pair saw the
    /// same moment of the machine, so this is steadier than a ratio of medians.
    fn change_percent(&self, field: fn(&MicrobenchResult) -> f64) -> f64 {
        let mut v: Vec<f64> =
            self.off.iter().zip(&self.on).map(|(a, b)| (field(b) / field(a) - 1.0) * 100.0).collect();
        v.sort_by(f64::total_cmp);
        percentile(&v, 0.5)
    }
}

/// The order every node confirms before one half of a pair: a start before the half
/// that records, a stop before any other (a stop changes nothing where nothing
/// records). A stop follows every half.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    Start,
    Stop,
}

/// The two halves of pair `round`, in the order measured: whether each is the
/// half with recording on (with `record`), and the order sent before it. The
/// first half alternates from pair to pair.
///
/// Both halves are framed alike: on a tree of few processes, an order's traffic
/// just before a short measurement slows it by a percent or two, which is the
/// price of starting a recording, paid once, not of recording each frame.
fn pair_plan(round: usize, record: bool) -> [(bool, Order); 2] {
    [round % 2 == 1, round % 2 == 0].map(|on| (on, if on && record { Order::Start } else { Order::Stop }))
}

/// `rounds` pairs of measurements; with `record`, the half marked on records.
async fn paired_rounds(
    net: &Network,
    spec: &str,
    args: &MicrobenchArgs,
    rounds: usize,
    record: bool,
) -> anyhow::Result<Paired> {
    let mut pairs = Paired::default();
    let tracked = Tracked::session(net.session());
    for round in 0..rounds {
        for (on, before) in pair_plan(round, record) {
            warn_unconfirmed(match before {
                Order::Start => net.monitor_start(MICROBENCH_PROGRAM).await?,
                Order::Stop => net.monitor_stop().await?,
            });
            let result = measure(net, spec, args, &tracked).await?;
            warn_unconfirmed(net.monitor_stop().await?);
            match on {
                true => pairs.on.push(result),
                false => pairs.off.push(result),
            }
        }
    }
    Ok(pairs)
}

async fn overhead_rounds(
    net: &Network,
    spec: &str,
    args: &MicrobenchArgs,
    rounds: usize,
) -> anyhow::Result<Overhead> {
    let pairs = paired_rounds(net, spec, args, rounds, true).await?;
    let collection = net.monitor_collect(false, Duration::from_secs(30)).await?;
    for missing in &collection.missing {
        eprintln!("monitor: no report from {missing}");
    }
    let rtt = |r: &MicrobenchResult| r.rtt_us_median;
    let tp = |r: &MicrobenchResult| r.reductions_per_s;
    let null = match args.overhead_null {
        true => Some(paired_rounds(net, spec, args, rounds, false).await?),
        false => None,
    };
    let (rtt_off, rtt_on) = pairs.medians(rtt);
    let (tp_off, tp_on) = pairs.medians(tp);
    Ok(Overhead {
        topology: spec.to_owned(),
        backends: net.backends(),
        rounds,
        rtt_us_median_off: rtt_off,
        rtt_us_median_on: rtt_on,
        rtt_change_percent: pairs.change_percent(rtt),
        reductions_per_s_off: tp_off,
        reductions_per_s_on: tp_on,
        reductions_change_percent: pairs.change_percent(tp),
        null_rtt_change_percent: null.as_ref().map(|n| n.change_percent(rtt)),
        null_reductions_change_percent: null.as_ref().map(|n| n.change_percent(tp)),
        samples: collection.merged()?.count(),
    })
}

fn render_overhead(o: &Overhead) -> String {
    let null = match (o.null_rtt_change_percent, o.null_reductions_change_percent) {
        (Some(rtt), Some(tp)) => format!(
            "  null pairs      round trip {rtt:+.1} %, throughput {tp:+.1} % (off against off: the noise)\n"
        ),
        _ => String::new(),
    };
    format!(
        "monitoring overhead {topo}: {be} back-ends, {rounds} pairs off and on, order alternating; medians, \
         change = median of the pairs' own changes\n  \
         round trip      off {rtt_off:.1} us, on {rtt_on:.1} us ({rtt_pc:+.1} %)\n  \
         throughput      off {tp_off:.0} reductions/s, on {tp_on:.0} reductions/s ({tp_pc:+.1} %)\n\
         {null}  \
         recorded        {samples} samples\n\
         {why}",
        topo = o.topology,
        be = o.backends,
        rounds = o.rounds,
        rtt_off = o.rtt_us_median_off,
        rtt_on = o.rtt_us_median_on,
        rtt_pc = o.rtt_change_percent,
        tp_off = o.reductions_per_s_off,
        tp_on = o.reductions_per_s_on,
        tp_pc = o.reductions_change_percent,
        samples = o.samples,
        why = disagreement_note(o),
    )
}

/// A word on why the medians of the two sides and the median change can point in
/// opposite directions, when they do: the change is paired, the medians are not.
fn disagreement_note(o: &Overhead) -> String {
    let sides = |off: f64, on: f64| (on - off).signum();
    let rtt = sides(o.rtt_us_median_off, o.rtt_us_median_on) * o.rtt_change_percent.signum() < 0.0;
    let tp =
        sides(o.reductions_per_s_off, o.reductions_per_s_on) * o.reductions_change_percent.signum() < 0.0;
    if !(rtt || tp) {
        return String::new();
    }
    "  note            the medians of each side and the median change disagree in sign: the change \
     compares each pair's halves, measured side by side, so drift across pairs cancels in it and not \
     in the medians; read the change (and, with --overhead-null, set it against the noise)\n"
        .to_owned()
}

fn warn_unconfirmed(missing: Vec<String>) {
    for node in missing {
        eprintln!("monitor: {node} did not confirm the order");
    }
}

/// The environment variable that hands a relay its sub-tree.
const RELAY_TREE: &str = "TREECAST_RELAY_TREE";

/// A relay's children: a socket to each, and the process.
struct RelayChildren {
    links: Vec<std::os::unix::net::UnixStream>,
    processes: Vec<std::process::Child>,
}

impl Drop for RelayChildren {
    fn drop(&mut self) {
        // Closing the links ends the children (they read end of input), then they are reaped.
        self.links.clear();
        for p in &mut self.processes {
            let _ = p.wait();
        }
    }
}

/// Starts one relay per child of the root of `tree` (MRNet text), each with its sub-tree.
fn start_relays(tree: &str) -> anyhow::Result<RelayChildren> {
    let topo = Topology::parse(tree).context("the relay's sub-tree")?;
    let me = std::env::current_exe().context("finding this program")?;
    let mut children = RelayChildren { links: Vec::new(), processes: Vec::new() };
    for &c in &topo.node(topo.root()).children {
        let (here, there) = std::os::unix::net::UnixStream::pair().context("making a socket pair")?;
        let there_out = there.try_clone().context("duplicating the socket")?;
        let child = std::process::Command::new(&me)
            .args(["bench", "relay"])
            .env(RELAY_TREE, topo.subtree(c).to_mrnet())
            .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(there)))
            .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(there_out)))
            .spawn()
            .context("starting a relay")?;
        children.links.push(here);
        children.processes.push(child);
    }
    Ok(children)
}

/// Sends a byte to every child, then waits for a byte from each.
fn relay_round(children: &mut RelayChildren) -> std::io::Result<()> {
    use std::io::{Read, Write};
    for l in &mut children.links {
        l.write_all(&[1])?;
    }
    let mut byte = [0u8; 1];
    for l in &mut children.links {
        l.read_exact(&mut byte)?;
    }
    Ok(())
}

/// Median round trip of `tree` built from raw relays: the same processes and links
/// as the tree, doing nothing but pass one byte down and one up.
fn raw_tree_round_trip(tree: &str, rounds: usize) -> anyhow::Result<(Duration, RoundCosts)> {
    let mut children = start_relays(tree)?;
    for _ in 0..WARMUP {
        relay_round(&mut children).context("the raw tree failed")?;
    }
    let rounds = rounds.max(1);
    let tracked = Tracked::relays(RELAY_TREE);
    let before = tracked.before();
    let mut times = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let t = Instant::now();
        relay_round(&mut children).context("the raw tree failed")?;
        times.push(t.elapsed());
    }
    let costs = tracked.after(&before, rounds);
    times.sort();
    Ok((times[times.len() / 2], costs))
}

/// `treecast bench relay`: one process of the raw tree.
pub(super) fn relay() -> anyhow::Result<ExitCode> {
    use std::io::{Read, Write};
    let tree = std::env::var(RELAY_TREE).with_context(|| format!("{RELAY_TREE} is not set"))?;
    let mut children = start_relays(&tree)?;
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    let mut byte = [0u8; 1];
    while input.read(&mut byte)? == 1 {
        relay_round(&mut children)?;
        output.write_all(&byte)?;
        output.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

/// Round trips of the raw ping-pong (after as many to warm up).
const PING_PONGS: u32 = 2000;

/// One-way latency of a 1-byte ping-pong over a Unix socket between this process and
/// a child (`treecast bench echo`): what any two processes of the tree pay per hop.
fn ping_pong_one_way() -> anyhow::Result<Duration> {
    use std::io::{Read, Write};
    let (mut here, there) = std::os::unix::net::UnixStream::pair().context("making a socket pair")?;
    let there_out = there.try_clone().context("duplicating the socket")?;
    let me = std::env::current_exe().context("finding this program")?;
    let mut child = std::process::Command::new(me)
        .args(["bench", "echo"])
        .stdin(std::process::Stdio::from(std::os::fd::OwnedFd::from(there)))
        .stdout(std::process::Stdio::from(std::os::fd::OwnedFd::from(there_out)))
        .spawn()
        .context("starting the echo process")?;
    let mut byte = [0u8; 1];
    let mut round = |here: &mut std::os::unix::net::UnixStream| -> std::io::Result<()> {
        here.write_all(&byte)?;
        here.read_exact(&mut byte)
    };
    let result = (|| {
        for _ in 0..PING_PONGS {
            round(&mut here)?;
        }
        let t = Instant::now();
        for _ in 0..PING_PONGS {
            round(&mut here)?;
        }
        Ok::<_, std::io::Error>(t.elapsed() / (2 * PING_PONGS))
    })();
    drop(here);
    let _ = child.wait();
    result.context("the ping-pong failed")
}

/// `treecast bench echo`: writes back every byte it reads, until end of input.
pub(super) fn echo() -> anyhow::Result<ExitCode> {
    use std::io::{Read, Write};
    let (mut input, mut output) = (std::io::stdin().lock(), std::io::stdout().lock());
    let mut byte = [0u8; 1];
    while input.read(&mut byte)? == 1 {
        output.write_all(&byte)?;
        output.flush()?;
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure(
    net: &Network,
    spec: &str,
    args: &MicrobenchArgs,
    tracked: &Tracked,
) -> anyhow::Result<MicrobenchResult> {
    let n = i64::from(net.backends());
    let comm = net.broadcast_communicator();
    let stream = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await?;
    let expected = n * (n - 1) / 2;
    let clock_settle_s = if args.at_once { 0.0 } else { settle_clock(net).await };
    let mut rtts = Vec::with_capacity(args.rt);
    let mut before = None;
    for i in 0..WARMUP + args.rt {
        if i == WARMUP {
            before = Some(tracked.before());
        }
        let t = Instant::now();
        stream.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await?;
        let p = stream.recv_timeout(STEP_LIMIT).await?;
        let elapsed = t.elapsed();
        let sum = p.unpack("%d")?[0].as_i64().unwrap_or(-1);
        ensure!(
            sum == expected,
            "round trip {i}: the sum is {sum}, expected {expected}: a back-end is missing"
        );
        if i >= WARMUP {
            rtts.push(elapsed.as_secs_f64() * 1e6);
        }
    }
    let round_costs = before.map(|b| tracked.after(&b, args.rt)).unwrap_or_default();
    let count = i32::try_from(args.tp).context("--tp is too large")?;
    let t = Instant::now();
    stream.send(TAG_BURST, "%d", &[Value::Int(count)]).await?;
    for i in 0..args.tp {
        let p = stream.recv_timeout(STEP_LIMIT).await?;
        let sum = p.unpack("%d")?[0].as_i64().unwrap_or(-1);
        ensure!(sum == n, "reduction {i}: the sum is {sum}, expected {n}");
    }
    let tp_secs = t.elapsed().as_secs_f64();
    rtts.sort_by(f64::total_cmp);
    Ok(MicrobenchResult {
        topology: spec.to_owned(),
        backends: net.backends(),
        commnodes: net.commnodes(),
        instantiation_s: net.startup_time().as_secs_f64(),
        startup_cpu_s: 0.0,
        startup_cpu_read_s: 0.0,
        clock_settle_s,
        rtt_us_mean: rtts.iter().sum::<f64>() / rtts.len() as f64,
        rtt_us_median: percentile(&rtts, 0.5),
        rtt_us_p99: percentile(&rtts, 0.99),
        reductions_per_s: args.tp as f64 / tp_secs,
        peak_rss_kb: peak_rss(tracked),
        rt_iterations: args.rt,
        tp_iterations: args.tp,
        floor_one_way_us: 0.0,
        hops: 0,
        floor_us: 0.0,
        raw_tree_us: 0.0,
        round_costs,
        raw_round_costs: RoundCosts::default(),
    })
}

/// How long the global clock's first two rounds may take before the timing starts anyway.
const CLOCK_SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// Waits until every node's link has been measured in the clock's first two rounds
/// (each probes every link 32 times: at 10,000 back-ends, seconds of CPU), and returns
/// the seconds waited; past [`CLOCK_SETTLE_LIMIT`] it says so and returns.
async fn settle_clock(net: &Network) -> f64 {
    let t = Instant::now();
    if let Err(e) = net.wait_clock(2, CLOCK_SETTLE_LIMIT).await {
        eprintln!("microbench: warning: timing while the clock's first rounds may still run: {e}");
    }
    t.elapsed().as_secs_f64()
}

/// Reductions per second of a plug-in filter against the built-in sum, rounds
/// alternating on one tree; the plug-in ships down the tree first.
pub(super) async fn bench_filter(args: crate::apps::cli::BenchFilterArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.tp > 0 && args.rounds > 0, "--tp and --rounds need at least 1");
    let (path, name) =
        args.filter.rsplit_once(':').filter(|(p, n)| !p.is_empty() && !n.is_empty()).ok_or_else(|| {
            anyhow::anyhow!("{:?} is not PATH:NAME (a shared object and the filter's name)", args.filter)
        })?;
    let spec = args.topology.as_deref().unwrap_or(DEFAULT_TOPOLOGY);
    let topology = crate::apps::run::topology_from_spec(spec, Some(args.local))?;
    let net = crate::apps::settings::builder(topology)?.launch().await?;
    let plugin = net.load_filter(path).await?;
    ensure!(plugin.name() == name, "{path} holds the filter {:?}, not {name:?}", plugin.name());
    let n = i64::from(net.backends());
    let count = i32::try_from(args.tp).context("--tp is too large")?;
    let comm = net.broadcast_communicator();
    let plugin_up = treecast_api::FilterSpec::new(name, plugin.version());
    let mut streams = [
        net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await?,
        net.new_stream(&comm, StreamOptions { up: plugin_up, ..StreamOptions::reduce(TransformKind::Sum) })
            .await?,
    ];
    let mut rates = [Vec::new(), Vec::new()];
    for _ in 0..args.rounds {
        for (stream, rate) in streams.iter_mut().zip(&mut rates) {
            let t = Instant::now();
            stream.send(TAG_BURST, "%d", &[Value::Int(count)]).await?;
            for i in 0..args.tp {
                let p = stream.recv_timeout(STEP_LIMIT).await?;
                let sum = p.unpack("%d")?[0].as_i64().unwrap_or(-1);
                ensure!(sum == n, "reduction {i}: the sum is {sum}, expected {n}");
            }
            rate.push(args.tp as f64 / t.elapsed().as_secs_f64());
        }
    }
    net.shutdown().await;
    let median = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let (builtin, plugged) = (median(&mut rates[0]), median(&mut rates[1]));
    println!(
        "{spec}, {n} back-ends, {} rounds of {}: built-in sum {builtin:.0} reductions/s, plug-in {name} {plugged:.0} reductions/s, ratio {:.2}",
        args.rounds,
        args.tp,
        plugged / builtin
    );
    Ok(ExitCode::SUCCESS)
}

/// `treecast bench run`: times start-up plus a first command, then the same command
/// three times on the running tree.
pub(super) async fn bench_run(args: crate::apps::cli::RunArgs) -> anyhow::Result<ExitCode> {
    let t = Instant::now();
    let net = crate::apps::run::launch(&args.tree).await?;
    let first = crate::apps::run::run_command(&net, &args.command, None).await?;
    let cold = t.elapsed().as_secs_f64();
    let mut warm = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let again = crate::apps::run::run_command(&net, &args.command, None).await?;
        warm.push(t.elapsed().as_secs_f64());
        ensure!(again.ok, "a later command failed on the running tree");
    }
    net.shutdown().await;
    ensure!(
        first.ok,
        "the first command failed: {}",
        String::from_utf8_lossy(&crate::apps::run::render(&first))
    );
    warm.sort_by(f64::total_cmp);
    let median = warm[warm.len() / 2];
    if args.json {
        let v = serde_json::json!({"backends": first.backends, "first_s": cold, "next_s_median": median, "ratio": median / cold});
        println!("{v}");
    } else {
        println!("bench run: {} back-ends, command {:?}", first.backends, args.command.join(" "));
        println!("  start-up + first command     {cold:.3} s");
        println!(
            "  next command on the tree     {median:.4} s (median of 3; {:.3}x of the first)",
            median / cold
        );
    }
    Ok(ExitCode::SUCCESS)
}

fn percentile(sorted: &[f64], q: f64) -> f64 {
    let idx = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted.get(idx).copied().unwrap_or(f64::NAN)
}

/// Peak RSS (VmHWM) of this process and of every process of the tree.
fn peak_rss(tracked: &Tracked) -> PeakRss {
    let mut rss = PeakRss { frontend: vm_hwm("self").unwrap_or(0), ..PeakRss::default() };
    for &(pid, place) in tracked.processes() {
        let pid = pid.to_string();
        let kb = vm_hwm(&pid).unwrap_or(0);
        match place {
            Place::Inner => {
                rss.commnode_max = rss.commnode_max.max(kb);
                rss.commnode_private = rss.commnode_private.max(private_kb(&pid).unwrap_or(0));
            }
            Place::Leaf => rss.backend_max = rss.backend_max.max(kb),
            Place::FrontEnd => {}
        }
    }
    rss
}

/// Private memory of a process (clean and dirty pages no other process maps), KiB.
fn private_kb(pid: &str) -> Option<u64> {
    let rollup = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let field = |name: &str| -> Option<u64> {
        rollup.lines().find(|l| l.starts_with(name))?.split_whitespace().nth(1)?.parse().ok()
    };
    Some(field("Private_Clean:")? + field("Private_Dirty:")?)
}

fn vm_hwm(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

pub(super) fn render(r: &MicrobenchResult) -> String {
    format!(
        "microbench {topo}: {be} back-ends, {cn} comm nodes\n  \
         instantiation   {inst:.3} s ({cpu:.2} s of CPU in all processes, read within {read:.2} s){settle}\n  \
         round trip      mean {mean:.1} us, median {med:.1} us, p99 {p99:.1} us ({rt} broadcasts + sum reductions)\n  \
         floor           {floor:.1} us = {one_way:.1} us one way (raw Unix-socket ping-pong) x {hops} hops; round trip {ratio:.1}x the floor\n  \
         raw tree        {raw:.1} us median round trip of the same tree of processes relaying one byte; round trip {raw_ratio:.2}x the raw tree\n  \
         per round trip  {costs}\n  \
         throughput      {tp:.0} reductions/s ({tpn} back-to-back)\n  \
         peak RSS        front-end {fe} KiB, {cn_rss}back-end max {bem} KiB\n",
        topo = r.topology,
        be = r.backends,
        cn = r.commnodes,
        inst = r.instantiation_s,
        cpu = r.startup_cpu_s,
        read = r.startup_cpu_read_s,
        settle = if r.clock_settle_s > 0.0 {
            format!(", then {:.3} s until the clock's first two rounds were over", r.clock_settle_s)
        } else {
            String::new()
        },
        mean = r.rtt_us_mean,
        med = r.rtt_us_median,
        p99 = r.rtt_us_p99,
        rt = r.rt_iterations,
        floor = r.floor_us,
        one_way = r.floor_one_way_us,
        hops = r.hops,
        ratio = r.rtt_us_median / r.floor_us,
        raw = r.raw_tree_us,
        raw_ratio = r.rtt_us_median / r.raw_tree_us,
        costs = render_costs(r),
        tp = r.reductions_per_s,
        tpn = r.tp_iterations,
        fe = r.peak_rss_kb.frontend,
        // A tree without comm nodes has no comm node figure (not one of 0 KiB).
        cn_rss = if r.commnodes == 0 {
            String::new()
        } else {
            format!(
                "comm node max {} KiB (private {} KiB at the end), ",
                r.peak_rss_kb.commnode_max, r.peak_rss_kb.commnode_private
            )
        },
        bem = r.peak_rss_kb.backend_max,
    )
}

/// CPU time and wake-ups per round trip, level by level, the raw tree's beside.
fn render_costs(r: &MicrobenchResult) -> String {
    let level = |name: &str, tree: &PerRound, raw: &PerRound| {
        format!(
            "{name} {:.1} us CPU, {:.1} wake-ups (raw {:.1} us, {:.1})",
            tree.cpu_us, tree.wakeups, raw.cpu_us, raw.wakeups
        )
    };
    let (t, raw) = (&r.round_costs, &r.raw_round_costs);
    let mut parts = vec![level("front-end", &t.frontend, &raw.frontend)];
    if r.commnodes > 0 {
        parts.push(level("comm node (mean)", &t.inner, &raw.inner));
    }
    parts.push(level("back-end (mean)", &t.leaf, &raw.leaf));
    parts.push(format!("read over {:.2} s (raw {:.2} s)", t.window_s, raw.window_s));
    parts.join("; ")
}

fn render_ratios(tree: &MicrobenchResult, reference: &MicrobenchResult) -> String {
    format!(
        "{} vs {}: round trip {:.2}x, throughput {:.2}x, instantiation {:.2}x (below 1 is faster for time, above 1 is better for throughput)\n",
        tree.topology,
        reference.topology,
        tree.rtt_us_median / reference.rtt_us_median,
        tree.reductions_per_s / reference.reductions_per_s,
        tree.instantiation_s / reference.instantiation_s,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn result(commnodes: u32) -> MicrobenchResult {
        MicrobenchResult {
            topology: "kary:16".into(),
            backends: 16,
            commnodes,
            instantiation_s: 0.1,
            startup_cpu_s: 0.5,
            startup_cpu_read_s: 0.01,
            clock_settle_s: 0.0,
            rtt_us_mean: 50.0,
            rtt_us_median: 50.0,
            rtt_us_p99: 60.0,
            reductions_per_s: 1e4,
            peak_rss_kb: PeakRss { frontend: 100, commnode_max: 200, commnode_private: 50, backend_max: 300 },
            rt_iterations: 10,
            tp_iterations: 10,
            floor_one_way_us: 5.0,
            hops: 2,
            floor_us: 10.0,
            raw_tree_us: 20.0,
            round_costs: RoundCosts::default(),
            raw_round_costs: RoundCosts::default(),
        }
    }

    #[test]
    fn a_tree_without_comm_nodes_shows_no_comm_node_memory() {
        // Regression: `bench microbench --local 16` printed "0 comm nodes", then "comm node max 0 KiB".
        let text = render(&result(0));
        assert!(text.contains("0 comm nodes") && !text.contains("comm node max"), "{text}");
        assert!(render(&result(4)).contains("comm node max 200 KiB (private 50 KiB at the end)"));
    }

    #[test]
    fn the_costs_line_puts_each_level_beside_its_raw_relay() {
        let mut r = result(4);
        r.round_costs.inner = PerRound { cpu_us: 12.34, wakeups: 2.5 };
        r.raw_round_costs.inner = PerRound { cpu_us: 3.0, wakeups: 1.0 };
        (r.round_costs.window_s, r.raw_round_costs.window_s) = (1.5, 0.25);
        let text = render(&r);
        assert!(text.contains("comm node (mean) 12.3 us CPU, 2.5 wake-ups (raw 3.0 us, 1.0)"), "{text}");
        assert!(text.contains("read over 1.50 s (raw 0.25 s)"), "{text}");
        assert!(!render(&result(0)).contains("comm node (mean)"));
    }

    fn overhead(rtt_on: f64, rtt_change: f64) -> Overhead {
        Overhead {
            topology: "balanced:2x2".into(),
            backends: 4,
            rounds: 3,
            rtt_us_median_off: 100.0,
            rtt_us_median_on: rtt_on,
            rtt_change_percent: rtt_change,
            reductions_per_s_off: 1000.0,
            reductions_per_s_on: 990.0,
            reductions_change_percent: -1.0,
            null_rtt_change_percent: None,
            null_reductions_change_percent: None,
            samples: 10,
        }
    }

    #[test]
    fn medians_and_a_change_that_disagree_are_explained() {
        // Regression: "on" faster by the medians next to a change saying slower, and no word on why.
        assert!(render_overhead(&overhead(98.0, 1.5)).contains("disagree in sign"));
        assert!(!render_overhead(&overhead(102.0, 1.5)).contains("disagree"));
    }

    #[test]
    fn the_help_says_what_bench_holds_and_shows_the_back_end() {
        use clap::CommandFactory;
        let cli = crate::apps::cli::Cli::command();
        let bench = cli.find_subcommand("bench").unwrap();
        let about = bench.get_about().unwrap().to_string();
        assert!(about.contains("chaos") && !about.starts_with("Micro-benchmarks"), "{about}");
        assert!(
            !cli.find_subcommand("backend").unwrap().is_hide_set(),
            "the README's attach example runs it"
        );
    }

    #[test]
    fn both_halves_of_a_pair_follow_an_order_and_only_the_recording_half_a_start() {
        for record in [true, false] {
            for round in 0..4 {
                let plan = pair_plan(round, record);
                assert_eq!(plan[0].0, round % 2 == 1, "the first half alternates");
                assert_ne!(plan[0].0, plan[1].0, "one half of each kind");
                for (on, before) in plan {
                    let start = on && record;
                    assert_eq!(before, if start { Order::Start } else { Order::Stop }, "{plan:?}");
                }
            }
        }
    }
}
