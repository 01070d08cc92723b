//! `treecast bench bcast`: the transfer of `treecast bcast` alone, on a tree started
//! once (warm): a random file sent `--runs` times, each to a fresh destination,
//! with the median time, the start-up time apart, what each node's multicast route
//! did, and the front-end's CPU time (the sender's, with a flat tree). With
//! `--route udp` the same transfers over TCP, on a second tree of the same shape,
//! are the reference, and the ratio is printed.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{ensure, Context};
use rand::RngCore;
use serde::Serialize;
use treecast_api::Network;
use treecast_files::{bcast_files, FileEntry, FileOptions};
use treecast_monitor::RouteReport;

use crate::apps::cli::{BenchBcastArgs, RouteKind, TreeArgs};

/// The figures of one `treecast bench bcast`.
#[derive(Debug, Clone, Serialize)]
pub struct BcastBench {
    /// Back-ends the file went to.
    pub backends: u32,
    /// File size in bytes.
    pub bytes: u64,
    /// Seconds to start the tree (not in the transfers).
    pub startup_s: f64,
    /// Seconds of each transfer.
    pub runs_s: Vec<f64>,
    /// Their median (the upper one of an even count).
    pub median_s: f64,
    /// Bytes per second each back-end received, at the median.
    pub rate_mb_s: f64,
    /// CPU seconds (user and system) the front-end spent in all transfers.
    pub front_end_cpu_s: f64,
    /// Fragments multicast per distinct fragment, over every node's groups (1.0: none resent).
    pub fragments_per_fragment: Option<f64>,
    /// What each node's multicast route did over all runs (empty over TCP).
    pub routes: Vec<RouteReport>,
    /// With --route udp, the reference: the median of the same transfers over TCP,
    /// on a tree of the same shape started after it, in the same run.
    pub tcp_median_s: Option<f64>,
    /// This route's median over the TCP one.
    pub vs_tcp: Option<f64>,
}

/// One tree's transfers.
struct Measured {
    backends: u32,
    startup_s: f64,
    runs_s: Vec<f64>,
    front_end_cpu_s: f64,
    routes: Vec<RouteReport>,
}

impl Measured {
    /// The median (the upper one of an even count).
    fn median_s(&self) -> f64 {
        let mut sorted = self.runs_s.clone();
        sorted.sort_by(f64::total_cmp);
        sorted[sorted.len() / 2]
    }
}

/// Runs the benchmark.
pub async fn main(args: BenchBcastArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.runs > 0, "--runs needs at least 1");
    ensure!((1..=4096).contains(&args.size), "--size takes 1 to 4096 MiB");
    let options = FileOptions { chunk: args.chunk, ..FileOptions::default() };
    options.validate()?;
    let work = tempfile::Builder::new().prefix("treecast-bench-bcast-").tempdir()?;
    let src = work.path().join("src.bin");
    write_random(&src, args.size << 20)?;
    let m = measure_tree(&args.tree, &args, &options, work.path()).await?;
    let reference = if args.tree.route == RouteKind::Udp {
        let tcp = TreeArgs { route: RouteKind::Tcp, ..args.tree.clone() };
        Some(measure_tree(&tcp, &args, &options, work.path()).await?.median_s())
    } else {
        None
    };
    let median_s = m.median_s();
    let sent: u64 = m.routes.iter().map(|r| r.fragments).sum();
    let resent: u64 = m.routes.iter().map(|r| r.retransmitted).sum();
    let bench = BcastBench {
        backends: m.backends,
        bytes: args.size << 20,
        startup_s: m.startup_s,
        median_s,
        rate_mb_s: (args.size << 20) as f64 / median_s / 1e6,
        runs_s: m.runs_s,
        front_end_cpu_s: m.front_end_cpu_s,
        fragments_per_fragment: (sent > resent).then(|| sent as f64 / (sent - resent) as f64),
        routes: m.routes,
        tcp_median_s: reference,
        vs_tcp: reference.map(|tcp| median_s / tcp),
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        print!("{}", render(&bench));
    }
    Ok(ExitCode::SUCCESS)
}

/// Starts the tree `tree` describes, times the transfers on it, and stops it.
async fn measure_tree(
    tree: &TreeArgs,
    args: &BenchBcastArgs,
    options: &FileOptions,
    work: &std::path::Path,
) -> anyhow::Result<Measured> {
    let started = Instant::now();
    let mut net = crate::apps::run::launch(tree).await?;
    let startup_s = started.elapsed().as_secs_f64();
    let result = transfers(&mut net, args, options, work).await;
    let routes = if result.is_ok() { crate::apps::bcast::route_reports(&net).await } else { Vec::new() };
    let backends = net.backends();
    net.shutdown().await;
    let (runs_s, front_end_cpu_s) = result?;
    Ok(Measured { backends, startup_s, runs_s, front_end_cpu_s, routes })
}

/// Times each transfer; returns the seconds and the front-end's CPU seconds in them.
async fn transfers(
    net: &mut Network,
    args: &BenchBcastArgs,
    options: &FileOptions,
    work: &std::path::Path,
) -> anyhow::Result<(Vec<f64>, f64)> {
    let comm = net.broadcast_communicator();
    let src = work.join("src.bin");
    let mut runs = Vec::with_capacity(args.runs);
    let mut cpu = 0.0;
    for run in 0..args.runs {
        // A fresh destination each time: no rank finds the file there already.
        let dst = work.join(format!("run{run}"));
        std::fs::create_dir(&dst)?;
        let entry = [FileEntry::file(&src, Some(dst.join("copy.bin")))];
        let cpu0 = own_cpu_s();
        let t0 = Instant::now();
        let report = bcast_files(net, &comm, &entry, options, |_| {}).await?.pop().context("no report")?;
        runs.push(t0.elapsed().as_secs_f64());
        cpu += own_cpu_s() - cpu0;
        ensure!(report.ok(), "run {run}: not every rank got the file: {:?}", report);
        std::fs::remove_dir_all(&dst)?;
    }
    Ok((runs, cpu))
}

fn write_random(path: &std::path::Path, bytes: u64) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    let mut block = vec![0u8; 1 << 20];
    let mut left = bytes;
    while left > 0 {
        let n = left.min(block.len() as u64) as usize;
        rand::thread_rng().fill_bytes(&mut block[..n]);
        out.write_all(&block[..n])?;
        left -= n as u64;
    }
    out.flush()?;
    Ok(())
}

/// User and system CPU seconds of this process (`/proc/self/stat`, in the kernel's
/// fixed 100 ticks per second); 0 where it cannot be read.
fn own_cpu_s() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else { return 0.0 };
    // Fields after the command name, which is in parentheses and may hold spaces.
    let Some((_, rest)) = stat.rsplit_once(')') else { return 0.0 };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok()).unwrap_or(0.0);
    // utime and stime are the 14th and 15th fields of the line: 12th and 13th here.
    (ticks(11) + ticks(12)) / 100.0
}

fn render(b: &BcastBench) -> String {
    let runs: Vec<String> = b.runs_s.iter().map(|s| format!("{s:.3}")).collect();
    let mut out = format!(
        "{} MiB to {} back-ends on a running tree (started in {:.2} s): median {:.3} s ({:.1} MB/s per back-end); runs {}\n",
        b.bytes >> 20,
        b.backends,
        b.startup_s,
        b.median_s,
        b.rate_mb_s,
        runs.join(", ")
    );
    if let (Some(tcp), Some(ratio)) = (b.tcp_median_s, b.vs_tcp) {
        out.push_str(&format!(
            "reference, the same over TCP in this run: median {tcp:.3} s; udp/tcp {ratio:.2}x\n"
        ));
    }
    out.push_str(&format!("front-end CPU: {:.2} s in all runs\n", b.front_end_cpu_s));
    if let Some(f) = b.fragments_per_fragment {
        out.push_str(&format!("fragments multicast per fragment: {f:.3}\n"));
    }
    out.push_str(&crate::apps::bcast::render_routes(&b.routes));
    out
}
