//! `treecast run`: a command on every back-end, outputs grouped by equivalence class.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;
use treecast_api::{
    Network, NetworkBuilder, RankSet, SrunOptions, SshOptions, StreamOptions, Topology, TransformKind, Value,
};
use treecast_topology::hostlist;

use super::cli::{LauncherKind, RunArgs, TreeArgs};
use super::protocol::TAG_RUN;

/// Fan-out used when no topology is given.
pub const DEFAULT_TOPOLOGY: &str = "kary:16";

/// One distinct (stdout, stderr, exit code) and the ranks that produced it.
#[derive(Debug, Clone, Serialize)]
pub struct OutputClass {
    /// Ranks, compact (`0-15,32`).
    pub ranks: String,
    /// Number of ranks.
    pub count: u64,
    /// Exit code of the command.
    pub exit_code: i32,
    /// Standard output.
    pub stdout: String,
    /// Standard error.
    pub stderr: String,
    /// The hosts of these ranks, as a host list.
    pub hosts: String,
}

/// Ranks that never answered.
#[derive(Debug, Clone, Serialize)]
pub struct Lost {
    /// Ranks, compact.
    pub ranks: String,
    /// Why, as the node that noticed said it.
    pub reason: String,
}

/// What `run` found.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Back-ends started.
    pub backends: u32,
    /// Distinct outputs, by lowest rank.
    pub classes: Vec<OutputClass>,
    /// Ranks lost before answering.
    pub lost: Vec<Lost>,
    /// Ranks still connected that did not answer in time, and why (empty without a limit).
    pub no_answer: Vec<Lost>,
    /// True when every rank answered with exit code 0.
    pub ok: bool,
}

/// Time the back-ends get to answer after a command's limit, on top of it: they kill
/// the command at the limit, then answer through the tree.
const ANSWER_GRACE: Duration = Duration::from_secs(10);
/// Longest wait for the tree to take the message that closes the stream.
const CLOSE_LIMIT: Duration = Duration::from_secs(10);

/// Starts the tree, runs the command, prints the grouped output.
pub async fn main(args: RunArgs) -> anyhow::Result<ExitCode> {
    let limit = args
        .timeout
        .map(|secs| {
            Duration::try_from_secs_f64(secs)
                .ok()
                .filter(|d| !d.is_zero())
                .with_context(|| format!("--timeout {secs} is not a positive number of seconds"))
        })
        .transpose()?;
    let net = launch(&args.tree).await?;
    let report = run_on(net, &args.command, limit).await?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(if report.ok { ExitCode::SUCCESS } else { ExitCode::from(1) })
}

/// This machine's host name, as other hosts' names are compared with it.
pub fn this_host() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_else(|_| "localhost".into())
}

/// The topology the tree flags describe: local back-ends, a host list, or a topology file.
///
/// # Errors
/// Bad flags, a bad host list, or a bad topology.
pub fn topology_of(args: &TreeArgs) -> anyhow::Result<Topology> {
    if !args.exclude.is_empty() && (args.local.is_some() || args.topology.is_some()) {
        anyhow::bail!("--exclude leaves hosts out of --hosts or the Slurm allocation; it cannot change --local or --topology trees");
    }
    match (&args.hosts, args.local) {
        (_, Some(0)) => anyhow::bail!("--local needs at least 1 back-end"),
        (None, Some(n)) => {
            let spec = args.topology.as_deref().unwrap_or(DEFAULT_TOPOLOGY);
            Topology::from_spec(spec, Some(n)).with_context(|| format!("topology {spec:?}"))
        }
        (Some(_), _) if args.topology.is_some() => {
            let spec = args.topology.as_deref().unwrap_or_default();
            Topology::from_spec(spec, None).with_context(|| format!("topology {spec:?}"))
        }
        (Some(hosts), _) => hosts_topology(hosts, args).with_context(|| format!("hosts {hosts:?}")),
        (None, None) if args.launcher == LauncherKind::Slurm => {
            let nodes = std::env::var("SLURM_JOB_NODELIST").map_err(|_| {
                anyhow::anyhow!("--launcher slurm needs an allocation (SLURM_JOB_NODELIST is not set): run inside salloc or sbatch, or give --hosts")
            })?;
            hosts_topology(&nodes, args).with_context(|| format!("SLURM_JOB_NODELIST {nodes:?}"))
        }
        (None, None) => anyhow::bail!("give --local N or --hosts LIST"),
    }
}

/// The tree over a host list minus `--exclude`; repeated hosts are dropped with a warning.
fn hosts_topology(hosts: &str, args: &TreeArgs) -> anyhow::Result<Topology> {
    let exclude: Vec<&str> = args.exclude.iter().map(String::as_str).collect();
    let list = hostlist::HostList::new(&[hosts], &exclude)?;
    for warning in &list.warnings {
        eprintln!("treecast: warning: {warning}");
    }
    if list.hosts.is_empty() {
        anyhow::bail!("no host left: the exclusions remove every host of the list");
    }
    if args.launcher == LauncherKind::Slurm {
        if let Some(host) = list.hosts.iter().find(|h| h.contains('@')) {
            anyhow::bail!(
                "{host}: srun runs every step as the job's user, so `user@` cannot be honoured; drop it"
            );
        }
    }
    Ok(Topology::from_hosts(&list.hosts, args.fanout, args.per_host, &this_host())?)
}

/// Launches the network the tree flags describe.
///
/// # Errors
/// Bad flags or a failed start-up.
pub async fn launch(args: &TreeArgs) -> anyhow::Result<Network> {
    let topology = topology_of(args)?;
    let backends = topology.backends();
    let mut builder = NetworkBuilder::new(topology).allow_missing(args.allow_missing);
    if let Some(file) = &args.attach {
        eprintln!(
            "treecast: waiting up to {:.0} s for {backends} back-ends; start them with: treecast backend --attach {}",
            args.attach_timeout,
            file.display()
        );
        let limit = Duration::try_from_secs_f64(args.attach_timeout).with_context(|| {
            format!("--attach-timeout {} is not a number of seconds", args.attach_timeout)
        })?;
        builder = builder.attach(file, limit);
    }
    match args.launcher {
        LauncherKind::Local => {}
        LauncherKind::Ssh => {
            let mut ssh = SshOptions::from_env().map_err(anyhow::Error::msg)?;
            if let Some(extra) = &args.ssh_args {
                ssh.args =
                    treecast_launch::split_args(extra).map_err(|e| anyhow::anyhow!("--ssh-args: {e}"))?;
            }
            if let Some(path) = &args.remote_path {
                ssh.remote_path = path.clone();
            }
            builder = builder.ssh(ssh);
        }
        LauncherKind::Slurm => {
            let me = std::env::current_exe().context("finding this treecast binary")?;
            let path = args.remote_path.clone().unwrap_or_else(|| me.to_string_lossy().into_owned());
            builder = builder.slurm(SrunOptions::from_env(path)?);
        }
    }
    Ok(builder.launch().await?)
}

/// Runs `command` on every back-end of `net`, then shuts it down.
///
/// # Errors
/// The stream could not be used or answers were malformed.
pub async fn run_on(
    mut net: Network,
    command: &[String],
    limit: Option<Duration>,
) -> anyhow::Result<RunReport> {
    let report = run_command(&mut net, command, limit).await?;
    net.shutdown().await;
    Ok(report)
}

/// Runs `command` on every back-end of a running `net` and gathers the outputs.
///
/// With a `limit`, the back-ends kill the command after it, and ranks that have not
/// answered a little after it are reported in [`RunReport::no_answer`]; without one,
/// this waits until every rank answered or was lost. Lost ranks come from
/// [`Network::lost`]; the network's events are left for the caller.
///
/// # Errors
/// The stream could not be used or answers were malformed.
pub async fn run_command(
    net: &mut Network,
    command: &[String],
    limit: Option<Duration>,
) -> anyhow::Result<RunReport> {
    let comm = net.broadcast_communicator();
    let mut stream = net.new_stream(&comm, StreamOptions::reduce(TransformKind::EqClass)).await?;
    let limit_ms = limit.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0);
    stream.send(TAG_RUN, "%as %uld", &[command.to_vec().into(), Value::ULong(limit_ms)]).await?;
    let answer = match limit {
        Some(limit) => stream.recv_timeout(limit.saturating_add(ANSWER_GRACE)).await,
        None => stream.recv().await,
    };
    let mut classes = Vec::new();
    let mut answered = RankSet::new();
    if let Ok(packet) = answer {
        for class in packet.eq_classes()? {
            answered.union_with(&class.ranks);
            let [Value::Str(stdout), Value::Str(stderr), Value::Int(code)] = class.values.as_slice() else {
                anyhow::bail!("malformed answer from ranks {}", class.ranks);
            };
            classes.push(OutputClass {
                ranks: class.ranks.to_string(),
                count: class.ranks.len(),
                exit_code: *code,
                stdout: stdout.clone(),
                stderr: stderr.clone(),
                hosts: hosts_of(net.topology(), &class.ranks),
            });
        }
    }
    // A tree that takes nothing more is left as it is; the caller shuts it down.
    let _ = tokio::time::timeout(CLOSE_LIMIT, stream.close()).await;
    let missing = comm.ranks().difference(&answered);
    let known_lost = net.lost();
    let lost: Vec<Lost> = known_lost
        .among(&missing)
        .into_iter()
        .map(|(ranks, reason)| Lost { ranks: ranks.to_string(), reason })
        .collect();
    let silent = missing.difference(known_lost.ranks());
    let mut no_answer = Vec::new();
    if !silent.is_empty() {
        let waited = limit.map_or(0.0, |l| l.saturating_add(ANSWER_GRACE).as_secs_f64());
        let reason =
            format!("no answer within {waited} s (still connected: the command or the back-end hangs?)");
        no_answer.push(Lost { ranks: silent.to_string(), reason });
    }
    let ok = lost.is_empty() && no_answer.is_empty() && classes.iter().all(|c| c.exit_code == 0);
    Ok(RunReport { backends: net.backends(), classes, lost, no_answer, ok })
}

/// The hosts that run `ranks`, as a compact host list.
fn hosts_of(topo: &Topology, ranks: &RankSet) -> String {
    let mut hosts: Vec<String> = Vec::new();
    for r in ranks.iter() {
        if let Some(leaf) = topo.leaf_of_rank(r) {
            let h = hostlist::bare_host(&topo.node(leaf).host).to_owned();
            if !hosts.contains(&h) {
                hosts.push(h);
            }
        }
    }
    hostlist::compress(&hosts)
}

/// The human-readable report: each distinct output once, then a summary.
pub fn render(report: &RunReport) -> String {
    let mut out = String::new();
    for c in &report.classes {
        let exit = if c.exit_code == 0 { String::new() } else { format!(" exit {}", c.exit_code) };
        let hosts = if c.hosts.is_empty() || c.hosts == "localhost" {
            String::new()
        } else {
            format!(" on {}", c.hosts)
        };
        out.push_str(&format!(
            "---- [{}] ({} rank{}){hosts}{exit} ----\n",
            c.ranks,
            c.count,
            plural(c.count)
        ));
        out.push_str(&c.stdout);
        if !c.stdout.is_empty() && !c.stdout.ends_with('\n') {
            out.push('\n');
        }
        if !c.stderr.is_empty() {
            out.push_str("[stderr]\n");
            out.push_str(&c.stderr);
            if !c.stderr.ends_with('\n') {
                out.push('\n');
            }
        }
    }
    out.push_str(&summary(report));
    out
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn summary(report: &RunReport) -> String {
    let mut by_code: Vec<(i32, RankSet)> = Vec::new();
    for c in &report.classes {
        let ranks: RankSet = c.ranks.parse().unwrap_or_default();
        match by_code.iter_mut().find(|(code, _)| *code == c.exit_code) {
            Some((_, set)) => set.union_with(&ranks),
            None => by_code.push((c.exit_code, ranks)),
        }
    }
    by_code.sort_by_key(|(code, _)| *code);
    let parts: Vec<String> =
        by_code.iter().map(|(code, set)| format!("exit {code}: {} [{set}]", set.len())).collect();
    let mut s =
        format!("{} back-end{}; {}\n", report.backends, plural(report.backends.into()), parts.join(", "));
    for l in &report.lost {
        s.push_str(&format!("lost [{}]: {}\n", l.ranks, l.reason));
    }
    for l in &report.no_answer {
        s.push_str(&format!("no answer [{}]: {}\n", l.ranks, l.reason));
    }
    s
}
