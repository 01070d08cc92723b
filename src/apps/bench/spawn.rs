//! `treecast bench spawn` and `treecast bench merge`: processes started while the
//! tree runs, timed against MPI-2 dynamic process management measured in the same
//! run (Open MPI or MPICH through `mpicc` and `mpirun`, with the program in
//! `tools/mpi-spawn/spawn_bench.c`).

use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use serde::Serialize;
use treecast_api::{JoinMode, Network, SpawnOptions, StreamOptions, TransformKind, Value, LIGHT_JOIN_UP_TO};

use crate::apps::cli::{BenchIntergroupArgs, BenchMergeArgs, BenchSpawnArgs, TreeArgs};
use crate::apps::protocol::{TAG_ADD_RANK, TAG_PEER_PING};

use super::shared::{request_stream, stop_and_wait, MpiReference, Reference, Timings, STEP_LIMIT};

/// One row: treecast's figure for `n` processes and MPI's.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Processes per spawn (per group, for a merge).
    pub n: u32,
    /// treecast's timings.
    pub treecast: Timings,
    /// MPI's, in the same run.
    pub mpi: Reference,
    /// treecast's median over MPI's (below 1: treecast is faster).
    pub ratio: Option<f64>,
}

/// One spawn-rate row.
#[derive(Debug, Clone, Serialize)]
pub struct RateRow {
    /// Processes per spawn.
    pub n: u32,
    /// treecast's spawns per second, the processes kept running until the end.
    pub treecast_per_s: f64,
    /// MPI's, in the same run.
    pub mpi: Reference,
    /// treecast's rate over MPI's.
    pub ratio: Option<f64>,
}

/// The report of `bench spawn`.
#[derive(Debug, Clone, Serialize)]
pub struct SpawnBench {
    /// The tree the spawns ran from.
    pub topology: String,
    /// Its back-ends at launch.
    pub backends: u32,
    /// The MPI library of the reference, as `mpirun --version` names it.
    pub mpi_library: Option<String>,
    /// Latency of `spawn(n)`.
    pub latency: Vec<Row>,
    /// Sustained spawns per second.
    pub rate: Vec<RateRow>,
    /// What joining by connection costs a spawned process (connect and
    /// authenticate over a Unix socket, both ends in this process), or why it
    /// was not measured: the most a join by datagram could save.
    pub join_by_connection: Result<Timings, String>,
    /// Spawn latency joining by connection against joining by announcement, the
    /// two alternating run by run (the latency rows above are the mode
    /// [`JoinMode::Auto`] picks for each size).
    pub joins: Vec<JoinRow>,
    /// Spawn rates in both modes, one after the other.
    pub join_rates: Vec<JoinRateRow>,
}

/// Spawn latency of one size in both join modes.
#[derive(Debug, Clone, Serialize)]
pub struct JoinRow {
    /// Processes per spawn.
    pub n: u32,
    /// Joining by connection.
    pub connect: Timings,
    /// Joining by announcement (one datagram).
    pub announce: Timings,
    /// Announcement's median over connection's (below 1: announcing is faster).
    pub ratio: f64,
}

/// Spawn rate of one size in both join modes.
#[derive(Debug, Clone, Serialize)]
pub struct JoinRateRow {
    /// Processes per spawn.
    pub n: u32,
    /// Spawns per second joining by connection.
    pub connect_per_s: f64,
    /// Spawns per second joining by announcement.
    pub announce_per_s: f64,
}

/// The report of `bench merge`.
#[derive(Debug, Clone, Serialize)]
pub struct MergeBench {
    /// The tree the groups were spawned from.
    pub topology: String,
    /// Its back-ends at launch.
    pub backends: u32,
    /// The MPI library of the reference.
    pub mpi_library: Option<String>,
    /// Merge of two groups of n (merge, a stream over the merged group and one wave
    /// through it, as `MPI_Intercomm_merge` followed by a barrier).
    pub merge: Vec<Row>,
}

/// One message size of `bench intergroup`: one-way latencies, microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct PeerRow {
    /// Message size, bytes.
    pub bytes: u32,
    /// Round trips timed.
    pub rounds: u32,
    /// Two ranks of the launch's group under one comm node.
    pub intra_us: f64,
    /// A rank of the launch's group and a spawned one, under one comm node.
    pub inter_us: f64,
    /// A rank of the launch's group and a spawned one under another comm node
    /// (through the front-end, their common ancestor here).
    pub inter_far_us: f64,
    /// `inter_us` over `intra_us`.
    pub inter_vs_intra: f64,
    /// Rank 0 and rank 0 of a second network linked to this one
    /// (`Network::connect_network`): up to this front-end, across to the other's,
    /// and down.
    pub network_us: f64,
    /// `network_us` over `inter_far_us` (which turns at this front-end alone).
    pub network_vs_far: f64,
    /// `inter_us` over MPI's inter-group median, when MPI was measured.
    pub inter_vs_mpi: Option<f64>,
    /// MPI, in the same run: a process and one it spawned (an intercommunicator).
    pub mpi_inter: Reference,
    /// MPI, in the same run: two processes of one job.
    pub mpi_intra: Reference,
}

/// The report of `bench intergroup`.
#[derive(Debug, Clone, Serialize)]
pub struct IntergroupBench {
    /// The tree.
    pub topology: String,
    /// The MPI library of the reference.
    pub mpi_library: Option<String>,
    /// One row per message size.
    pub point_to_point: Vec<PeerRow>,
    /// Collective operations over both groups.
    pub collectives: super::collectives::CollectiveBench,
}

/// Runs `treecast bench intergroup`.
pub async fn intergroup_main(args: BenchIntergroupArgs) -> anyhow::Result<ExitCode> {
    let sizes = parse_bytes(&args.sizes)?;
    let tree = default_tree(&args.tree);
    let mut net = crate::apps::run::launch(&tree).await?;
    let topology = tree.topology.clone().unwrap_or_default();
    let coll_sizes = parse_bytes(&args.coll_sizes)?;
    let mut measured = measure_peers(&mut net, &sizes).await;
    if let Ok(rows) = &mut measured {
        if let Err(e) = measure_networks(&net, &tree, rows).await {
            measured = Err(e.context("timing messages to a second network"));
        }
    }
    let mpi = if args.no_mpi { Err("--no-mpi".to_owned()) } else { MpiReference::build() };
    let collectives = match measured {
        Ok(_) => super::collectives::measure(&mut net, &coll_sizes, mpi.as_ref().map_err(Clone::clone)).await,
        Err(_) => Err(anyhow::anyhow!("not measured")),
    };
    net.shutdown().await;
    let mut rows = measured?;
    let collectives = collectives?;
    for row in &mut rows {
        let reference = |mode: &str, procs: u32| match &mpi {
            Ok(m) => m.one_way(mode, procs, row.bytes, row.rounds),
            Err(why) => Reference::Missing(why.clone()),
        };
        row.mpi_inter = reference("pingpong-inter", 1);
        row.mpi_intra = reference("pingpong-intra", 2);
        row.inter_vs_mpi = row.mpi_inter.median_ms().map(|ms| row.inter_us / (ms * 1e3));
    }
    let bench = IntergroupBench {
        topology,
        mpi_library: mpi.as_ref().ok().map(|m| m.library.clone()),
        point_to_point: rows,
        collectives,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        print!("{}", render_intergroup(&bench));
    }
    Ok(ExitCode::SUCCESS)
}

/// Sizes in bytes, comma-separated, with K and M suffixes (powers of 1024).
fn parse_bytes(text: &str) -> anyhow::Result<Vec<u32>> {
    text.split(',')
        .map(|s| {
            let s = s.trim();
            let (digits, unit) = match s.strip_suffix(['K', 'k']) {
                Some(d) => (d, 1u64 << 10),
                None => s.strip_suffix(['M', 'm']).map_or((s, 1), |d| (d, 1 << 20)),
            };
            let n = digits
                .parse::<u64>()
                .with_context(|| format!("--sizes: {s:?} is not a size such as 64, 4K or 1M"))?;
            let bytes = n * unit;
            ensure!(bytes <= 16 << 20, "--sizes: {s} is over 16M, the most a sender may have unread");
            Ok(bytes as u32)
        })
        .collect()
}

/// Round trips per size: many for small messages, fewer for large ones.
fn rounds_for(bytes: u32) -> u32 {
    (u64::from(64u32 << 20) / u64::from(bytes.max(1))).clamp(10, 200) as u32
}

/// Times ping-pongs between three pairs of ranks, for each size.
async fn measure_peers(net: &mut Network, sizes: &[u32]) -> anyhow::Result<Vec<PeerRow>> {
    ensure!(net.topology().comm_nodes() >= 2, "bench intergroup needs a tree with at least two comm nodes");
    let topo = net.topology().clone();
    // Ranks 0 and 1 under one comm node; spawned ranks next to rank 0 and elsewhere.
    let first = topo.leaf_of_rank(0).and_then(|l| topo.node(l).parent).context("rank 0 has no parent")?;
    // A block spawn of one goes under the first node with back-ends: rank 0's, unless
    // the front-end has back-ends of its own.
    ensure!(
        topo.node(topo.root()).children.iter().all(|&c| !topo.is_leaf(c)),
        "bench intergroup needs a tree whose front-end has only comm nodes below it (e.g. balanced:4x4)"
    );
    ensure!(
        topo.leaf_of_rank(1).and_then(|l| topo.node(l).parent) == Some(first),
        "ranks 0 and 1 must share a comm node"
    );
    let options = SpawnOptions { placement: treecast_api::Placement::Block, ..SpawnOptions::default() };
    let near = net.spawn(1, &[], &options).await?;
    let far = net.spawn(1, &[], &SpawnOptions::default()).await?;
    let mut stream = request_stream(net).await?;
    let mut rows = Vec::new();
    for &bytes in sizes {
        let rounds = rounds_for(bytes);
        let mut one_way = Vec::new();
        for peer in [1, near.ranks()[0], far.ranks()[0]] {
            one_way.push(one_way_us(&mut stream, peer, bytes, rounds).await?);
        }
        rows.push(PeerRow {
            bytes,
            rounds,
            intra_us: one_way[0],
            inter_us: one_way[1],
            inter_far_us: one_way[2],
            inter_vs_intra: one_way[1] / one_way[0],
            network_us: f64::NAN,
            network_vs_far: f64::NAN,
            inter_vs_mpi: None,
            mpi_inter: Reference::Missing("not measured yet".into()),
            mpi_intra: Reference::Missing("not measured yet".into()),
        });
    }
    stream.close().await;
    stop_and_wait(net, &[near, far]).await?;
    Ok(rows)
}

/// Rank 0 plays ping-pong with `peer` (through `stream`, a [`request_stream`]):
/// one warm-up round, then `rounds` timed; the mean one-way latency, microseconds.
async fn one_way_us(
    stream: &mut treecast_api::Stream,
    peer: u32,
    bytes: u32,
    rounds: u32,
) -> anyhow::Result<f64> {
    let mut mean_round_trip = f64::NAN;
    for n in [1, rounds] {
        let request = [Value::UInt(peer), Value::UInt(bytes), Value::UInt(n)];
        stream.send_to(0, TAG_PEER_PING, "%ud %ud %ud", &request).await?;
        let v = stream.recv_timeout(STEP_LIMIT).await?.unpack("%lf %ud")?;
        ensure!(v[1] == Value::UInt(n), "rank {peer} echoed {:?} of {n} messages intact", v[1]);
        mean_round_trip = v[0].as_f64().unwrap_or(f64::NAN);
    }
    Ok(mean_round_trip / 2.0)
}

/// Launches a second network (two back-ends under their front-end), links it to
/// `net` and times ping-pongs from `net`'s rank 0 to its rank 0, for each row's size.
async fn measure_networks(net: &Network, tree: &TreeArgs, rows: &mut [PeerRow]) -> anyhow::Result<()> {
    let mut other_tree = tree.clone();
    (other_tree.local, other_tree.hosts, other_tree.topology) = (Some(2), None, Some("flat".to_owned()));
    let other = crate::apps::run::launch(&other_tree).await?;
    let dir = tempfile::tempdir().context("making a directory for the network port")?;
    let path = dir.path().join("network.port");
    let timed = async {
        let port = net.open_network_port(&path, None).await?;
        let (remote, linked) =
            tokio::join!(port.accept(net, STEP_LIMIT), other.connect_network(&path, STEP_LIMIT));
        let (remote, _) = (remote?, linked?);
        let peer = remote.rank(0).context("the second network has no rank 0")?;
        let mut stream = request_stream(net).await?;
        for row in rows.iter_mut() {
            row.network_us = one_way_us(&mut stream, peer, row.bytes, row.rounds).await?;
            row.network_vs_far = row.network_us / row.inter_far_us;
        }
        stream.close().await;
        net.disconnect_network(&remote)?;
        anyhow::Ok(())
    }
    .await;
    other.shutdown().await;
    timed
}

/// Runs `treecast bench spawn`.
pub async fn spawn_main(args: BenchSpawnArgs) -> anyhow::Result<ExitCode> {
    let sizes = parse_sizes(&args.sizes)?;
    ensure!(args.runs > 0, "--runs needs at least 1");
    ensure!(args.rate_secs > 0.0 && args.rate_secs <= 600.0, "--rate-secs takes 0 to 600 seconds");
    let tree = default_tree(&args.tree);
    let mut net = crate::apps::run::launch(&tree).await?;
    let topology = tree.topology.clone().unwrap_or_default();
    let backends = net.backends();
    let measured = measure_spawns(&mut net, &sizes, args.runs, args.rate_secs).await;
    net.shutdown().await;
    let (joins, join_rates) = measured?;
    let mpi = if args.no_mpi { Err("--no-mpi".to_owned()) } else { MpiReference::build() };
    let mut latency = Vec::new();
    for row in &joins {
        let t = auto_pick(row.n, &row.connect, &row.announce).clone();
        let reference = match &mpi {
            Ok(m) => m.latency(row.n, args.runs.min(10)),
            Err(why) => Reference::Missing(why.clone()),
        };
        let ratio = reference.median_ms().map(|m| t.median_ms / m);
        latency.push(Row { n: row.n, treecast: t, mpi: reference, ratio });
    }
    let mut rate = Vec::new();
    for r in &join_rates {
        let per_s = *auto_pick(r.n, &r.connect_per_s, &r.announce_per_s);
        let reference = match &mpi {
            Ok(m) => m.rate(r.n, args.rate_secs),
            Err(why) => Reference::Missing(why.clone()),
        };
        let ratio = match &reference {
            Reference::Rate(mpi) if *mpi > 0.0 => Some(per_s / mpi),
            _ => None,
        };
        rate.push(RateRow { n: r.n, treecast_per_s: per_s, mpi: reference, ratio });
    }
    let bench = SpawnBench {
        topology,
        backends,
        mpi_library: mpi.as_ref().ok().map(|m| m.library.clone()),
        latency,
        rate,
        join_by_connection: super::joincost::measure().await.map_err(|e| e.to_string()),
        joins,
        join_rates,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        print!("{}", render_spawn(&bench));
    }
    Ok(ExitCode::SUCCESS)
}

/// Runs `treecast bench merge`.
pub async fn merge_main(args: BenchMergeArgs) -> anyhow::Result<ExitCode> {
    let sizes = parse_sizes(&args.sizes)?;
    ensure!(args.runs > 0, "--runs needs at least 1");
    let tree = default_tree(&args.tree);
    let mut net = crate::apps::run::launch(&tree).await?;
    let topology = tree.topology.clone().unwrap_or_default();
    let backends = net.backends();
    let measured = measure_merges(&mut net, &sizes, args.runs).await;
    net.shutdown().await;
    let mpi = if args.no_mpi { Err("--no-mpi".to_owned()) } else { MpiReference::build() };
    let mut bench = MergeBench {
        topology,
        backends,
        mpi_library: mpi.as_ref().ok().map(|m| m.library.clone()),
        merge: Vec::new(),
    };
    for (n, t) in measured? {
        let reference = match &mpi {
            Ok(m) => m.merge(n),
            Err(why) => Reference::Missing(why.clone()),
        };
        let ratio = reference.median_ms().map(|m| t.median_ms / m);
        bench.merge.push(Row { n, treecast: t, mpi: reference, ratio });
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&bench)?);
    } else {
        print!("{}", render_merge(&bench));
    }
    Ok(ExitCode::SUCCESS)
}

/// The tree of the published benchmark unless one is given: 16 back-ends under 4 comm nodes.
fn default_tree(tree: &TreeArgs) -> TreeArgs {
    let mut tree = tree.clone();
    if tree.local.is_none() && tree.hosts.is_none() {
        tree.local = Some(16);
        tree.topology.get_or_insert_with(|| "balanced:4x4".to_owned());
    }
    tree.topology.get_or_insert_with(|| crate::apps::run::DEFAULT_TOPOLOGY.to_owned());
    tree
}

fn parse_sizes(text: &str) -> anyhow::Result<Vec<u32>> {
    let sizes: Vec<u32> = text
        .split(',')
        .map(|s| s.trim().parse::<u32>().with_context(|| format!("--sizes: {s:?} is not a number")))
        .collect::<anyhow::Result<_>>()?;
    if let Some(bad) = sizes.iter().find(|&&n| n == 0 || n > 1024) {
        bail!("--sizes: {bad} is not between 1 and 1024 processes");
    }
    Ok(sizes)
}

/// Of a figure measured in both join modes, the one of the mode
/// [`JoinMode::Auto`] picks for spawns of `n`.
fn auto_pick<'a, T>(n: u32, connect: &'a T, announce: &'a T) -> &'a T {
    if JoinMode::Auto.announces(n) {
        announce
    } else {
        connect
    }
}

/// Times `spawn(n)` for each size in both join modes, alternating run by run
/// (stopping each group before the next spawn), then spawns back to back,
/// keeping every process, for `rate_secs` at n = 1 and 4 in each mode.
async fn measure_spawns(
    net: &mut Network,
    sizes: &[u32],
    runs: usize,
    rate_secs: f64,
) -> anyhow::Result<(Vec<JoinRow>, Vec<JoinRateRow>)> {
    let mode = |join| SpawnOptions { join, ..SpawnOptions::default() };
    let (connect, announce) = (mode(JoinMode::Connect), mode(JoinMode::Announce));
    // One spawn of each before timing: the binary in the page cache, the sockets open.
    for options in [&connect, &announce] {
        let warm = net.spawn(1, &[], options).await?;
        stop_and_wait(net, &[warm]).await?;
    }
    let mut joins = Vec::new();
    for &n in sizes {
        let (mut by_connect, mut by_announce) = (Vec::with_capacity(runs), Vec::with_capacity(runs));
        for run in 0..runs {
            // Alternating which goes first, so that a drift of the machine favours neither.
            let order = if run % 2 == 0 { [&connect, &announce] } else { [&announce, &connect] };
            for options in order {
                let t0 = Instant::now();
                let group = net.spawn(n, &[], options).await?;
                let ms = t0.elapsed().as_secs_f64() * 1e3;
                stop_and_wait(net, &[group]).await?;
                if options.join == JoinMode::Connect { &mut by_connect } else { &mut by_announce }.push(ms);
            }
        }
        if let (Some(connect), Some(announce)) = (Timings::of(&by_connect), Timings::of(&by_announce)) {
            let ratio = announce.median_ms / connect.median_ms;
            joins.push(JoinRow { n, connect, announce, ratio });
        }
    }
    let mut rates = Vec::new();
    for n in [1, 4] {
        // Spawns and seconds per mode, in halves ordered connect, announce, announce,
        // connect, so that neither mode always runs on a fuller machine.
        let mut tally = [(0usize, 0.0f64); 2];
        for i in [0, 1, 1, 0] {
            let options = if i == 0 { &connect } else { &announce };
            let mut kept = Vec::new();
            let t0 = Instant::now();
            while t0.elapsed().as_secs_f64() < rate_secs / 2.0 {
                kept.push(net.spawn(n, &[], options).await?);
            }
            tally[i].0 += kept.len();
            tally[i].1 += t0.elapsed().as_secs_f64();
            stop_and_wait(net, &kept).await?;
        }
        let per_s = tally.map(|(spawns, secs)| spawns as f64 / secs);
        rates.push(JoinRateRow { n, connect_per_s: per_s[0], announce_per_s: per_s[1] });
    }
    Ok((joins, rates))
}

/// Times the merge of two groups of n: the merge, a stream over the merged group,
/// and one wave through it whose sum is checked.
async fn measure_merges(
    net: &mut Network,
    sizes: &[u32],
    runs: usize,
) -> anyhow::Result<Vec<(u32, Timings)>> {
    let options = SpawnOptions::default();
    let mut rows = Vec::new();
    for &n in sizes {
        let a = net.spawn(n, &[], &options).await?;
        let b = net.spawn(n, &[], &options).await?;
        let mut ms = Vec::with_capacity(runs);
        for _ in 0..runs {
            let t0 = Instant::now();
            let merged = net.merge(&a, &b, false);
            let opts = StreamOptions::reduce(TransformKind::Sum);
            let stream = net.new_stream(&merged.communicator(), opts).await?;
            stream.send(TAG_ADD_RANK, "%d", &[Value::Int(0)]).await?;
            let p = stream.recv_timeout(STEP_LIMIT).await?;
            ms.push(t0.elapsed().as_secs_f64() * 1e3);
            let want: i64 = merged.ranks().iter().map(|&r| i64::from(r)).sum();
            let got = p.values()?.first().and_then(Value::as_i64);
            ensure!(got == Some(want), "the merged group's sum was {got:?}, not {want}");
            stream.close().await;
        }
        stop_and_wait(net, &[a, b]).await?;
        rows.extend(Timings::of(&ms).map(|t| (n, t)));
    }
    Ok(rows)
}

fn reference_text(r: &Reference) -> String {
    match r {
        Reference::Timings(t) => format!("{:.2}", t.median_ms),
        Reference::Rate(per_s) => format!("{per_s:.1}"),
        Reference::Missing(_) => "-".to_owned(),
    }
}

fn ratio_text(r: Option<f64>) -> String {
    r.map_or_else(|| "-".to_owned(), |r| format!("{r:.3}"))
}

/// Why references are missing, once each.
fn missing_notes<'a>(refs: impl Iterator<Item = &'a Reference>) -> String {
    let mut notes: Vec<&str> = Vec::new();
    for r in refs {
        if let Reference::Missing(why) = r {
            if !notes.contains(&why.as_str()) {
                notes.push(why);
            }
        }
    }
    notes.iter().map(|n| format!("  MPI reference missing: {n}\n")).collect()
}

fn header(topology: &str, backends: u32, library: Option<&str>) -> String {
    format!(
        "tree {topology} ({backends} back-ends at launch); MPI reference: {}\n",
        library.unwrap_or("none")
    )
}

/// A table of timings per n, with MPI's median and the ratio, under `title`.
fn timings_table(title: &str, rows: &[Row]) -> String {
    let mut out = format!("{title}\n");
    out.push_str(&format!(
        "{:>5} {:>8} {:>8} {:>8} {:>8} {:>10} {:>8}\n",
        "n", "min", "mean", "median", "max", "MPI", "ratio"
    ));
    for r in rows {
        let t = &r.treecast;
        out.push_str(&format!(
            "{:>5} {:>8.2} {:>8.2} {:>8.2} {:>8.2} {:>10} {:>8}\n",
            r.n,
            t.min_ms,
            t.mean_ms,
            t.median_ms,
            t.max_ms,
            reference_text(&r.mpi),
            ratio_text(r.ratio)
        ));
    }
    out
}

fn render_spawn(b: &SpawnBench) -> String {
    let mut out = header(&b.topology, b.backends, b.mpi_library.as_deref());
    let title = "spawn latency, ms (treecast: min/mean/median/max; MPI_Comm_spawn: median)";
    out.push_str(&timings_table(title, &b.latency));
    out.push_str("spawn rate, spawns/s (processes kept running until the end)\n");
    out.push_str(&format!("{:>5} {:>10} {:>10} {:>8}\n", "n", "treecast", "MPI", "ratio"));
    for r in &b.rate {
        let ratio = r.ratio.map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"));
        out.push_str(&format!(
            "{:>5} {:>10.1} {:>10} {:>8}\n",
            r.n,
            r.treecast_per_s,
            reference_text(&r.mpi),
            ratio
        ));
    }
    match (&b.join_by_connection, b.latency.iter().find(|r| r.n == 1)) {
        (Ok(join), Some(one)) => out.push_str(&format!(
            "joining by connection (connect + authenticate, Unix socket): median {:.1} us, {:.1} % of spawn(1)'s median:\n  \
             the most a join by one datagram could save\n",
            join.median_ms * 1e3,
            join.median_ms / one.treecast.median_ms * 100.0
        )),
        (Err(why), _) => out.push_str(&format!("joining by connection: not measured ({why})\n")),
        _ => {}
    }
    out.push_str(&format!(
        "joining by connection against by announcement (one datagram), alternating run by run; \
         the rows above are what `auto` picks (announcement up to {LIGHT_JOIN_UP_TO} processes)\n"
    ));
    out.push_str(&format!(
        "{:>5} {:>16} {:>16} {:>10}\n",
        "n", "connect median", "announce median", "ann/conn"
    ));
    for j in &b.joins {
        out.push_str(&format!(
            "{:>5} {:>13.3} ms {:>13.3} ms {:>10.3}\n",
            j.n, j.connect.median_ms, j.announce.median_ms, j.ratio
        ));
    }
    for r in &b.join_rates {
        out.push_str(&format!(
            "rate n={}: {:.1} spawns/s by connection, {:.1} by announcement (ann/conn {:.3})\n",
            r.n,
            r.connect_per_s,
            r.announce_per_s,
            r.announce_per_s / r.connect_per_s
        ));
    }
    out.push_str(&missing_notes(b.latency.iter().map(|r| &r.mpi).chain(b.rate.iter().map(|r| &r.mpi))));
    out
}

fn render_intergroup(b: &IntergroupBench) -> String {
    let mut out =
        format!("tree {}; MPI reference: {}\n", b.topology, b.mpi_library.as_deref().unwrap_or("none"));
    out.push_str("point-to-point one-way latency, us (ping-pong round trip / 2)\n");
    out.push_str(&format!(
        "{:>9} {:>7} {:>10} {:>10} {:>10} {:>8} {:>10} {:>8} {:>10} {:>10} {:>9}\n",
        "bytes",
        "rounds",
        "intra",
        "inter",
        "inter-far",
        "int/intra",
        "network",
        "net/far",
        "MPI inter",
        "MPI intra",
        "inter/MPI"
    ));
    let us = |r: &Reference| match r {
        Reference::Timings(t) => format!("{:.1}", t.median_ms * 1e3),
        _ => "-".to_owned(),
    };
    for r in &b.point_to_point {
        out.push_str(&format!(
            "{:>9} {:>7} {:>10.1} {:>10.1} {:>10.1} {:>8.2} {:>10.1} {:>8.2} {:>10} {:>10} {:>9}\n",
            r.bytes,
            r.rounds,
            r.intra_us,
            r.inter_us,
            r.inter_far_us,
            r.inter_vs_intra,
            r.network_us,
            r.network_vs_far,
            us(&r.mpi_inter),
            us(&r.mpi_intra),
            r.inter_vs_mpi.map_or_else(|| "-".to_owned(), |x| format!("{x:.1}"))
        ));
    }
    out.push_str(
        "  intra: ranks 0 and 1 under one comm node; inter: rank 0 and a spawned rank under the same\n",
    );
    out.push_str(
        "  comm node; inter-far: rank 0 and a spawned rank under another comm node; network: rank 0\n",
    );
    out.push_str("  and rank 0 of a second network linked to this one (through both front-ends).\n");
    out.push_str(&missing_notes(b.point_to_point.iter().flat_map(|r| [&r.mpi_inter, &r.mpi_intra])));
    out.push_str(&super::collectives::render(&b.collectives));
    out
}

fn render_merge(b: &MergeBench) -> String {
    let mut out = header(&b.topology, b.backends, b.mpi_library.as_deref());
    let title =
        "merge of two groups of n, ms (treecast: merge + stream + one wave; MPI: Intercomm_merge + barrier)";
    out.push_str(&timings_table(title, &b.merge));
    out.push_str(&missing_notes(b.merge.iter().map(|r| &r.mpi)));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::super::shared::values;
    use super::*;

    #[test]
    fn timings_and_sizes() {
        let t = Timings::of(&[3.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!((t.min_ms, t.median_ms, t.max_ms, t.mean_ms), (1.0, 3.0, 10.0, 4.0));
        assert!(Timings::of(&[]).is_none());
        assert_eq!(parse_sizes("1, 4,16").unwrap(), vec![1, 4, 16]);
        assert!(parse_sizes("1,0").unwrap_err().to_string().contains("0 is not between"));
        assert!(parse_sizes("x").unwrap_err().to_string().contains("\"x\" is not a number"));
        assert_eq!(parse_bytes("1, 4K,1M").unwrap(), vec![1, 4096, 1 << 20]);
        assert!(parse_bytes("17M").unwrap_err().to_string().contains("over 16M"));
        assert!(parse_bytes("4Q").unwrap_err().to_string().contains("not a size"));
        assert_eq!((rounds_for(1), rounds_for(4 << 20)), (200, 16));
        let lines = vec!["latency_ms 2.5".to_owned(), "other 1".into(), "latency_ms 3".into()];
        assert_eq!(values(&lines, "latency_ms"), vec![2.5, 3.0]);
    }
}
