//! `treecast bench`: micro-benchmarks that print figures and ratios against a
//! reference measured in the same run.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde::Serialize;
use treecast_api::{Network, NetworkBuilder, StreamOptions, Topology, TransformKind, Value};

use super::cli::{BenchArgs, BenchCommand, MicrobenchArgs};
use super::protocol::{TAG_ADD_RANK, TAG_BURST};

/// Round trips run before timing starts, to warm caches and connections.
const WARMUP: usize = 10;
/// Longest a single measured step may take before the benchmark gives up.
const STEP_LIMIT: Duration = Duration::from_secs(60);

/// Peak resident memory of the processes of one network.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct PeakRss {
    /// The front-end (this process).
    pub frontend: u64,
    /// The largest comm node.
    pub commnode_max: u64,
    /// The largest back-end.
    pub backend_max: u64,
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
}

/// Dispatches `treecast bench ...`.
pub async fn main(args: BenchArgs) -> anyhow::Result<ExitCode> {
    match args.command {
        BenchCommand::Microbench(m) => microbench(m).await,
        BenchCommand::Run(r) => bench_run(r).await,
        BenchCommand::Sim(s) => super::simbench::main(s),
    }
}

async fn microbench(args: MicrobenchArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.rt > 0 && args.tp > 0, "--rt and --tp need at least 1 iteration");
    let mut results = vec![run_case(&args.topology, &args).await?];
    if let Some(reference) = &args.compare {
        results.push(run_case(reference, &args).await?);
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

async fn run_case(spec: &str, args: &MicrobenchArgs) -> anyhow::Result<MicrobenchResult> {
    let topology =
        Topology::from_spec(spec, Some(args.local)).with_context(|| format!("topology {spec:?}"))?;
    let net = NetworkBuilder::new(topology).launch().await?;
    let outcome = measure(&net, spec, args).await;
    net.shutdown().await;
    outcome
}

async fn measure(net: &Network, spec: &str, args: &MicrobenchArgs) -> anyhow::Result<MicrobenchResult> {
    let n = i64::from(net.backends());
    let comm = net.broadcast_communicator();
    let mut stream = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await?;
    let expected = n * (n - 1) / 2;
    let mut rtts = Vec::with_capacity(args.rt);
    for i in 0..WARMUP + args.rt {
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
        rtt_us_mean: rtts.iter().sum::<f64>() / rtts.len() as f64,
        rtt_us_median: percentile(&rtts, 0.5),
        rtt_us_p99: percentile(&rtts, 0.99),
        reductions_per_s: args.tp as f64 / tp_secs,
        peak_rss_kb: peak_rss(net.session()),
        rt_iterations: args.rt,
        tp_iterations: args.tp,
    })
}

/// Times start-up plus a first command, then the same command three times on the running tree.
async fn bench_run(args: super::cli::RunArgs) -> anyhow::Result<ExitCode> {
    let t = Instant::now();
    let mut net = super::run::launch(&args.tree).await?;
    let first = super::run::run_command(&mut net, &args.command, None).await?;
    let cold = t.elapsed().as_secs_f64();
    let mut warm = Vec::new();
    for _ in 0..3 {
        let t = Instant::now();
        let again = super::run::run_command(&mut net, &args.command, None).await?;
        warm.push(t.elapsed().as_secs_f64());
        ensure!(again.ok, "a later command failed on the running tree");
    }
    net.shutdown().await;
    ensure!(first.ok, "the first command failed: {}", super::run::render(&first));
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

/// Peak RSS (VmHWM) of this process and of every process of the session.
fn peak_rss(session: &str) -> PeakRss {
    let needle = format!("TREECAST_SESSION={session}");
    let mut rss = PeakRss { frontend: vm_hwm("self").unwrap_or(0), ..PeakRss::default() };
    let Ok(dir) = std::fs::read_dir("/proc") else { return rss };
    for entry in dir.flatten() {
        let name = entry.file_name();
        let Some(pid) = name.to_str().filter(|s| s.bytes().all(|b| b.is_ascii_digit())) else { continue };
        let Ok(env) = std::fs::read(entry.path().join("environ")) else { continue };
        if !env.split(|b| *b == 0).any(|kv| kv == needle.as_bytes()) {
            continue;
        }
        let cmdline = std::fs::read(entry.path().join("cmdline")).unwrap_or_default();
        let kb = vm_hwm(pid).unwrap_or(0);
        if cmdline.ends_with(b"node\0") {
            rss.commnode_max = rss.commnode_max.max(kb);
        } else if cmdline.ends_with(b"backend\0") {
            rss.backend_max = rss.backend_max.max(kb);
        }
    }
    rss
}

fn vm_hwm(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

fn render(r: &MicrobenchResult) -> String {
    format!(
        "microbench {topo}: {be} back-ends, {cn} comm nodes\n  \
         instantiation   {inst:.3} s\n  \
         round trip      mean {mean:.1} us, median {med:.1} us, p99 {p99:.1} us ({rt} broadcasts + sum reductions)\n  \
         throughput      {tp:.0} reductions/s ({tpn} back-to-back)\n  \
         peak RSS        front-end {fe} KiB, comm node max {cnm} KiB, back-end max {bem} KiB\n",
        topo = r.topology,
        be = r.backends,
        cn = r.commnodes,
        inst = r.instantiation_s,
        mean = r.rtt_us_mean,
        med = r.rtt_us_median,
        p99 = r.rtt_us_p99,
        rt = r.rt_iterations,
        tp = r.reductions_per_s,
        tpn = r.tp_iterations,
        fe = r.peak_rss_kb.frontend,
        cnm = r.peak_rss_kb.commnode_max,
        bem = r.peak_rss_kb.backend_max,
    )
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
