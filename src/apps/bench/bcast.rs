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

use std::path::Path;

use crate::apps::cli::{BenchBcastArgs, RouteKind, TreeArgs, WriteFloorArgs};

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
    /// The floor, for a local tree: the median time of as many processes as there
    /// are back-ends each copying the file chunk by chunk and syncing it, with no
    /// network, in the same run.
    pub floor_median_s: Option<f64>,
    /// The median over the floor.
    pub vs_floor: Option<f64>,
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
    // The floor goes to the same file system the back-ends wrote to, after the trees are gone.
    let floor = match args.tree.local {
        Some(_) => Some(write_floor(&src, work.path(), m.backends, args.chunk, args.runs)?),
        None => None,
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
        floor_median_s: floor,
        vs_floor: floor.map(|f| median_s / f),
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

/// Times `runs` rounds of `writers` processes (`treecast bench write`) each copying
/// `src` into a fresh folder under `work` and syncing it; returns the median seconds.
fn write_floor(src: &Path, work: &Path, writers: u32, chunk: usize, runs: usize) -> anyhow::Result<f64> {
    let me = std::env::current_exe().context("finding this program for the floor's writers")?;
    let mut times = Vec::with_capacity(runs);
    for run in 0..runs {
        let dir = work.join(format!("floor{run}"));
        std::fs::create_dir(&dir)?;
        let t0 = Instant::now();
        let children = (0..writers)
            .map(|i| {
                std::process::Command::new(&me)
                    .args(["bench", "write", "--chunk", &chunk.to_string(), "--src"])
                    .arg(src)
                    .arg("--dst")
                    .arg(dir.join(format!("copy{i}.bin")))
                    .spawn()
                    .context("starting a writer of the floor")
            })
            .collect::<anyhow::Result<Vec<_>>>();
        // Reaps every writer started, even when a later one could not start.
        let mut failed = None;
        for mut child in children? {
            match child.wait() {
                Ok(status) if status.success() => {}
                Ok(status) => failed = Some(format!("a writer of the floor ended with {status}")),
                Err(e) => failed = Some(format!("waiting for a writer of the floor: {e}")),
            }
        }
        times.push(t0.elapsed().as_secs_f64());
        std::fs::remove_dir_all(&dir)?;
        if let Some(why) = failed {
            anyhow::bail!(why);
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// `treecast bench write`: one writer of the floor.
pub(super) fn write_floor_worker(args: &WriteFloorArgs) -> anyhow::Result<ExitCode> {
    use std::io::{Read, Write};
    ensure!(args.chunk > 0, "--chunk needs at least 1 byte");
    let mut input =
        std::fs::File::open(&args.src).with_context(|| format!("opening {}", args.src.display()))?;
    let mut output =
        std::fs::File::create(&args.dst).with_context(|| format!("creating {}", args.dst.display()))?;
    let mut block = vec![0u8; args.chunk];
    loop {
        let n = input.read(&mut block)?;
        if n == 0 {
            break;
        }
        output.write_all(&block[..n])?;
    }
    output.sync_all().with_context(|| format!("syncing {}", args.dst.display()))?;
    Ok(ExitCode::SUCCESS)
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
    match (b.floor_median_s, b.vs_floor) {
        (Some(floor), Some(ratio)) => out.push_str(&format!(
            "floor, in this run: {} local processes each copying the file and syncing it, no network: median {floor:.3} s; push/floor {ratio:.2}x\n",
            b.backends
        )),
        _ => out.push_str("floor: measured for a --local tree only (the back-ends' disks are elsewhere)\n"),
    }
    out.push_str(&format!("front-end CPU: {:.2} s in all runs\n", b.front_end_cpu_s));
    if let Some(f) = b.fragments_per_fragment {
        out.push_str(&format!("fragments multicast per fragment: {f:.3}\n"));
    }
    out.push_str(&crate::apps::bcast::render_routes(&b.routes));
    out
}
