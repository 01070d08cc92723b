//! `treecast run`: a command on every back-end, outputs grouped by equivalence class.

use std::io::Write;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use base64::Engine;
use serde::Serialize;
use treecast_api::{
    Network, RankSet, SrunOptions, SshOptions, StreamOptions, Topology, TransformKind, Value,
};
use treecast_topology::{hostlist, Shape};

use super::cli::{LauncherKind, RunArgs, TreeArgs};
use super::guard::signal_name;
use super::protocol::{
    DEFAULT_OUTPUT_LIMIT, MAX_OUTPUT_LIMIT, RUN_AGAIN_REQUEST, RUN_ANSWER, RUN_REQUEST, TAG_RUN,
    TAG_RUN_AGAIN,
};

/// Fan-out used when no topology is given.
pub const DEFAULT_TOPOLOGY: &str = "kary:16";

/// One distinct output (stdout, stderr, how the command ended) and the ranks that
/// produced it. Ranks are grouped by the exact bytes they wrote, all of them, even
/// past the part kept here.
#[derive(Debug, Clone)]
pub struct OutputClass {
    /// Ranks, compact (`0-15,32`).
    pub ranks: String,
    /// Number of ranks.
    pub count: u64,
    /// Exit status of the command, or 128 + the signal that killed it (as shells report it).
    pub exit_code: i32,
    /// The signal that killed the command, or 0.
    pub signal: i32,
    /// Standard output: its first bytes, up to the output limit.
    pub stdout: Vec<u8>,
    /// Bytes the command wrote to stdout in all.
    pub stdout_bytes: u64,
    /// Standard error: its first bytes, up to the output limit.
    pub stderr: Vec<u8>,
    /// Bytes the command wrote to stderr in all.
    pub stderr_bytes: u64,
    /// The hosts of these ranks, as a host list.
    pub hosts: String,
}

impl OutputClass {
    /// How the command ended, for people: `exit 3`, `killed by SIGKILL`.
    pub fn status(&self) -> String {
        if self.signal == 0 {
            format!("exit {}", self.exit_code)
        } else {
            format!("killed by {}", signal_name(self.signal))
        }
    }

    /// Standard error as text (invalid UTF-8 replaced), for messages.
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// Output bytes for JSON: the text when it is UTF-8, else base64; and which it is.
fn json_text(bytes: &[u8]) -> (String, &'static str) {
    match std::str::from_utf8(bytes) {
        Ok(text) => (text.to_owned(), "utf-8"),
        Err(_) => (base64::engine::general_purpose::STANDARD.encode(bytes), "base64"),
    }
}

impl Serialize for OutputClass {
    /// `stdout`/`stderr` are text when the bytes are UTF-8 and base64 otherwise, as
    /// `stdout_encoding`/`stderr_encoding` say, so no byte is lost.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let (stdout, stdout_encoding) = json_text(&self.stdout);
        let (stderr, stderr_encoding) = json_text(&self.stderr);
        let signal = (self.signal != 0).then(|| signal_name(self.signal));
        let mut st = s.serialize_struct("OutputClass", 13)?;
        st.serialize_field("ranks", &self.ranks)?;
        st.serialize_field("count", &self.count)?;
        st.serialize_field("status", &self.status())?;
        st.serialize_field("exit_code", &self.exit_code)?;
        st.serialize_field("signal", &signal)?;
        st.serialize_field("stdout", &stdout)?;
        st.serialize_field("stdout_encoding", stdout_encoding)?;
        st.serialize_field("stdout_bytes", &self.stdout_bytes)?;
        st.serialize_field("stderr", &stderr)?;
        st.serialize_field("stderr_encoding", stderr_encoding)?;
        st.serialize_field("stderr_bytes", &self.stderr_bytes)?;
        st.serialize_field("hosts", &self.hosts)?;
        st.end()
    }
}

/// Ranks that never answered.
#[derive(Debug, Clone, Serialize)]
#[non_exhaustive]
pub struct Lost {
    /// Ranks, compact.
    pub ranks: String,
    /// The hosts those ranks ran on, as a compact host list (what pdsh and clush
    /// name); ranks spawned while the tree ran are not in the launch's topology,
    /// and add no host here.
    pub hosts: String,
    /// Why, as the node that noticed said it.
    pub reason: String,
}

/// A group of back-ends: the launch's (id 0) or one spawned while the tree ran.
#[derive(Debug, Clone, Serialize)]
pub struct GroupReport {
    /// The group's id.
    pub id: u32,
    /// Its ranks, compact.
    pub ranks: String,
    /// True for back-ends started while the tree ran.
    pub spawned: bool,
}

/// What `run` found.
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// Back-ends started.
    pub backends: u32,
    /// The groups the back-ends belong to.
    pub groups: Vec<GroupReport>,
    /// Distinct outputs, by lowest rank.
    pub classes: Vec<OutputClass>,
    /// Ranks lost before answering.
    pub lost: Vec<Lost>,
    /// Ranks still connected that did not answer in time, and why (empty without a limit).
    pub no_answer: Vec<Lost>,
    /// True when every rank answered with exit code 0.
    pub ok: bool,
    /// What `treecast run` exits with: the largest exit status of any rank (128 + N
    /// for a signal), or [`EXIT_LOST`] if a rank was lost or did not answer and no
    /// rank's status is larger.
    pub exit_status: u8,
}

impl RunReport {
    /// The hosts of the ranks that failed, were lost or did not answer, as one
    /// compact host list (`node[03,07]`), each host once: what pdsh and clush name.
    pub fn failed_hosts(&self) -> String {
        let failed = self.classes.iter().filter(|c| c.exit_code != 0).map(|c| c.hosts.as_str());
        let missing = self.lost.iter().chain(&self.no_answer).map(|l| l.hosts.as_str());
        let hosts: std::collections::BTreeSet<String> = failed
            .chain(missing)
            .filter(|h| !h.is_empty())
            .flat_map(|h| hostlist::expand(h).unwrap_or_else(|_| vec![h.to_owned()]))
            .collect();
        hostlist::compress(&hosts.into_iter().collect::<Vec<_>>())
    }
}

/// `treecast run`'s exit status when a rank was lost or did not answer (as ssh, pdsh
/// and clush report a host they could not run on).
pub const EXIT_LOST: u8 = 255;

/// Time the back-ends get to answer after a command's limit, on top of it: they kill
/// the command at the limit, then answer through the tree.
const ANSWER_GRACE: Duration = Duration::from_secs(10);
/// Longest wait for the tree to take the message that closes the stream.
const CLOSE_LIMIT: Duration = Duration::from_secs(10);

/// Starts the tree, runs the command, prints the grouped output.
pub async fn main(args: RunArgs) -> anyhow::Result<ExitCode> {
    let limit = args.timeout.map(|secs| secs_flag("--timeout", secs, 0.001, 1e6)).transpose()?;
    let settings = super::settings::EnvSettings::read_unless(&overridden(&args.tree))?;
    anyhow::ensure!(
        (1..=MAX_OUTPUT_LIMIT).contains(&args.output_limit),
        "--output-limit {} is not between 1 and {MAX_OUTPUT_LIMIT} bytes (both streams of a rank travel in one frame)",
        args.output_limit
    );
    let tree = args.tree;
    // The command's limit leaves liveness alone (a loaded machine is not a hung one):
    // the answers are awaited long enough for a hung node to be cut off instead.
    let cut_off = match tree.dead_after {
        Some(secs) => (secs > 0.0).then(|| Duration::from_secs_f64(secs.min(1e6))),
        None => settings.dead_after.unwrap_or(Some(treecast_proto::LivenessLimits::default().dead_after)),
    };
    let mut net = launch(&tree).await?;
    let labels = rank_labels(net.topology());
    let spawned = match args.spawn {
        Some(n) => Some(net.spawn(n, &[], &treecast_api::SpawnOptions::default()).await?),
        None => None,
    };
    let rejoin = match tree.rejoin_within {
        Some(secs) => (secs > 0.0).then(|| Duration::from_secs_f64(secs.min(1e6))),
        None => settings.rejoin_within.unwrap_or(Some(treecast_driver::env::DEFAULT_REJOIN_WITHIN)),
    };
    let wait = AnswerWait { limit, cut_off, rejoin };
    if let Some(filter) = &args.filter {
        let reduced = run_filtered(&mut net, filter, &args.command, wait, args.output_limit).await;
        net.shutdown().await;
        return reduced;
    }
    let report = run_command_waiting(&net, &args.command, wait, args.output_limit).await;
    net.shutdown().await;
    let mut report = report?;
    if let Some(g) = spawned {
        report.groups.push(GroupReport { id: g.id(), ranks: g.rank_set().to_string(), spawned: true });
    }
    if args.lines {
        let (stdout, stderr) = render_lines(&report, &labels);
        std::io::stderr().write_all(&stderr)?;
        let mut out = std::io::stdout().lock();
        out.write_all(&stdout)?;
        out.flush()?;
        return Ok(ExitCode::from(report.exit_status));
    }
    let mut out = std::io::stdout().lock();
    if args.json {
        writeln!(out, "{}", serde_json::to_string_pretty(&report)?)?;
    } else {
        // The bytes the commands wrote, unchanged: a pipe gets them exactly.
        out.write_all(&render(&report))?;
    }
    out.flush()?;
    Ok(ExitCode::from(report.exit_status))
}

/// This machine's host name, as other hosts' names are compared with it.
pub fn this_host() -> String {
    treecast_launch::this_host_name()
}

/// The topology `spec` (a shape or a topology file) makes for `backends`; an error
/// that does not name the spec already (a back-end count that does not fit, say) is
/// given it, so that a message never names it twice.
///
/// # Errors
/// As [`Topology::from_spec`].
pub fn topology_from_spec(spec: &str, backends: Option<usize>) -> anyhow::Result<Topology> {
    Topology::from_spec(spec, backends).map_err(|e| {
        let names_it = e.to_string().contains(spec);
        let e = anyhow::Error::new(e);
        if names_it {
            e
        } else {
            e.context(format!("topology {spec:?}"))
        }
    })
}

/// The topology the tree flags describe: a topology file alone (it names every host
/// and its leaves are the back-ends), local back-ends in a generated shape, or a host list.
///
/// # Errors
/// Bad or contradictory flags, a bad host list, or a bad topology.
pub fn topology_of(args: &TreeArgs) -> anyhow::Result<Topology> {
    if args.local == Some(0) {
        anyhow::bail!("a local tree needs at least 1 back-end, not 0");
    }
    let shape = args.topology.as_deref().map(|spec| (spec, spec.parse::<Shape>()));
    let is_file = matches!(shape, Some((_, Err(_))));
    if args.user.is_some() && (args.local.is_some() || is_file) {
        anyhow::bail!("--user (-l) logs in on the hosts of --hosts; --local trees run as you, and a topology file names its users as user@host");
    }
    if !args.exclude.is_empty() && (args.local.is_some() || is_file) {
        anyhow::bail!("--exclude leaves hosts out of --hosts or the Slurm allocation; it cannot change --local trees or topology files");
    }
    match (shape, &args.hosts, args.local) {
        (Some((file, Err(_))), Some(_), _) => anyhow::bail!(
            "--hosts and the topology file {file} both say where processes run: drop --hosts \
             (the file names every host), or give a shape such as kary:16 instead of the file"
        ),
        // A file names its own hosts and back-ends; --local N only checks the count.
        // Its errors name the file, line and column already.
        (Some((file, Err(_))), None, local) => Ok(Topology::from_spec(file, local)?),
        (shape, None, Some(n)) => {
            let spec = shape.map_or(DEFAULT_TOPOLOGY, |(spec, _)| spec);
            topology_from_spec(spec, Some(n))
        }
        (shape, Some(hosts), _) => {
            let fanout = hosts_fanout(shape.map(|(spec, s)| (spec, s.ok())), args.fanout)?;
            hosts_topology(hosts, fanout, args).with_context(|| format!("hosts {hosts:?}"))
        }
        (shape, None, None) if args.launcher == LauncherKind::Slurm => {
            let nodes = std::env::var("SLURM_JOB_NODELIST").map_err(|_| {
                anyhow::anyhow!("--launcher slurm needs an allocation (SLURM_JOB_NODELIST is not set): run inside salloc or sbatch, or give --hosts")
            })?;
            let fanout = hosts_fanout(shape.map(|(spec, s)| (spec, s.ok())), args.fanout)?;
            hosts_topology(&nodes, fanout, args).with_context(|| format!("SLURM_JOB_NODELIST {nodes:?}"))
        }
        (Some((spec, Ok(_))), None, None) => anyhow::bail!(
            "{spec} is a shape, not a topology file: say how many back-ends with --local N, \
             or where they run with --hosts LIST"
        ),
        (None, None, None) => anyhow::bail!("give --local N, --hosts LIST or --topology FILE"),
    }
}

/// The fan-out of a tree over a host list: `--fanout`, or the K of `--topology kary:K`
/// (or `fanout:K`, or `flat`); other shapes need the hosts in a topology file.
fn hosts_fanout(shape: Option<(&str, Option<Shape>)>, fanout: usize) -> anyhow::Result<usize> {
    match shape {
        None => Ok(fanout),
        Some((_, Some(Shape::Kary(k) | Shape::Fanout(k)))) => Ok(k),
        Some((_, Some(Shape::Flat))) => Ok(usize::MAX),
        Some((spec, _)) => anyhow::bail!(
            "--topology {spec} cannot be laid over --hosts: with a host list the tree is kary:K \
             (--fanout K); for another shape write a topology file that names the hosts"
        ),
    }
}

/// The tree over a host list minus `--exclude`; repeated hosts are dropped with a warning.
fn hosts_topology(hosts: &str, fanout: usize, args: &TreeArgs) -> anyhow::Result<Topology> {
    let exclude: Vec<&str> = args.exclude.iter().map(String::as_str).collect();
    let mut list = hostlist::HostList::new(&[hosts], &exclude)?;
    if let Some(user) = &args.user {
        anyhow::ensure!(
            !user.is_empty() && !user.contains(['@', ' ', '/']),
            "--user {user:?} is not a user name"
        );
        for host in list.hosts.iter_mut().filter(|h| !h.contains('@')) {
            *host = format!("{user}@{host}");
        }
    }
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
    Ok(Topology::from_hosts(&list.hosts, fanout, args.per_host, &this_host())?)
}

/// Launches the network the tree flags describe.
///
/// # Errors
/// Bad flags or a failed start-up.
pub async fn launch(args: &TreeArgs) -> anyhow::Result<Network> {
    Ok(builder(args, None)?.launch().await?)
}

/// The builder of the network the tree flags describe, its comm nodes (and Slurm
/// steps) running the `treecast` binary at `treecast`, or, when `None`, the one
/// `NetworkBuilder` finds (this program under Slurm): what a binding that ships its
/// own binary (the Python package) starts trees with, so they behave as the CLI's.
///
/// # Errors
/// Bad flags.
pub fn builder(
    args: &TreeArgs,
    treecast: Option<&std::path::Path>,
) -> anyhow::Result<treecast_api::NetworkBuilder> {
    let topology = topology_of(args)?;
    let backends = topology.backends();
    let mut builder = super::settings::builder_unless(topology, &overridden(args))?
        .allow_missing(args.allow_missing)
        .udp_route(args.route == super::cli::RouteKind::Udp)
        .stripes(args.route.stripes())
        .mptcp(args.route == super::cli::RouteKind::Mptcp);
    if let Some(secs) = args.dead_after {
        // Shorter, and scheduling delays alone would cut healthy nodes off.
        anyhow::ensure!(
            secs == 0.0 || (0.1..=1e6).contains(&secs),
            "--dead-after {secs} is not 0 (off) or a number of seconds between 0.1 and 1000000"
        );
        builder = builder.dead_after(Some(Duration::from_secs_f64(secs)));
    }
    if let Some(secs) = args.connect_timeout {
        let limit = secs_flag("--connect-timeout", secs, 0.1, 86_400.0)?;
        builder = builder.startup_timeout(limit);
    }
    if let Some(secs) = args.rejoin_within {
        anyhow::ensure!(
            secs == 0.0 || (0.1..=1e6).contains(&secs),
            "--rejoin-within {secs} is not 0 (off) or a number of seconds between 0.1 and 1000000"
        );
        builder = builder.rejoin_within(Some(Duration::from_secs_f64(secs)));
    }
    if let Some(file) = &args.attach {
        let limit = secs_flag("--attach-timeout", args.attach_timeout, 0.1, 1e6)?;
        eprintln!(
            "treecast: waiting up to {:.0} s for {backends} back-ends; start them with: treecast backend --attach {}",
            args.attach_timeout,
            file.display()
        );
        builder = builder.attach(file, limit);
    }
    if let Some(path) = treecast {
        builder = builder.treecast_path(path);
    }
    match args.launcher {
        LauncherKind::Local => {}
        LauncherKind::Ssh => {
            let text = super::settings::var(treecast_launch::SSH_ARGS_ENV)?;
            let mut ssh = SshOptions::with_args(text.as_deref()).map_err(anyhow::Error::msg)?;
            if let Some(extra) = &args.ssh_args {
                ssh.args =
                    treecast_launch::split_args(extra).map_err(|e| anyhow::anyhow!("--ssh-args: {e}"))?;
            }
            if let Some(path) = &args.remote_path {
                ssh.remote_path = path.clone();
            }
            if let Some(secs) = args.connect_timeout {
                // ssh counts whole seconds; the tree's own limit above is exact.
                ssh.connect_timeout = secs.ceil().clamp(1.0, 86_400.0) as u32;
            }
            builder = builder.ssh(ssh);
        }
        LauncherKind::Slurm => {
            let me = match treecast {
                Some(path) => path.to_path_buf(),
                None => std::env::current_exe().context("finding this treecast binary")?,
            };
            let path = args.remote_path.clone().unwrap_or_else(|| me.to_string_lossy().into_owned());
            let text = super::settings::var(treecast_launch::SRUN_ARGS_ENV)?;
            builder = builder.slurm(SrunOptions::with_args(path, text.as_deref())?);
        }
    }
    Ok(builder)
}

/// The `TREECAST_*` variables that flags given in `args` replace.
fn overridden(args: &TreeArgs) -> Vec<&'static str> {
    use treecast_driver::env;
    [
        (env::DEAD_AFTER, args.dead_after.is_some()),
        (env::REJOIN_WITHIN, args.rejoin_within.is_some()),
        (env::STARTUP_TIMEOUT, args.connect_timeout.is_some()),
    ]
    .into_iter()
    .filter_map(|(var, given)| given.then_some(var))
    .collect()
}

/// `secs` as a duration when it lies between `min` and `max` seconds; else an error
/// naming the flag and the range.
///
/// # Errors
/// Not a number, or out of the range.
pub fn secs_flag(flag: &str, secs: f64, min: f64, max: f64) -> anyhow::Result<Duration> {
    if !(min..=max).contains(&secs) {
        anyhow::bail!("{flag} {secs} is not a number of seconds between {min} and {max}");
    }
    Ok(Duration::from_secs_f64(secs))
}

/// Runs `command` on every back-end of `net`, then shuts it down.
///
/// # Errors
/// The stream could not be used or answers were malformed.
pub async fn run_on(
    net: Network,
    command: &[String],
    limit: Option<Duration>,
    output_limit: u64,
) -> anyhow::Result<RunReport> {
    let report = run_command_keeping(&net, command, limit, output_limit).await?;
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
    net: &Network,
    command: &[String],
    limit: Option<Duration>,
) -> anyhow::Result<RunReport> {
    run_command_keeping(net, command, limit, DEFAULT_OUTPUT_LIMIT).await
}

/// [`run_command`], keeping up to `output_limit` bytes of each rank's stdout and
/// stderr; ranks are grouped by everything they wrote all the same.
///
/// # Errors
/// The stream could not be used or answers were malformed.
pub async fn run_command_keeping(
    net: &Network,
    command: &[String],
    limit: Option<Duration>,
    output_limit: u64,
) -> anyhow::Result<RunReport> {
    run_command_waiting(net, command, AnswerWait { limit, cut_off: None, rejoin: None }, output_limit).await
}

/// The command's time limit, and how long the tree takes to cut off a silent node:
/// together they say how long the answers are awaited.
#[derive(Debug, Clone, Copy)]
pub struct AnswerWait {
    /// The command's limit (`--timeout`); `None`: wait until every rank answered or was lost.
    pub limit: Option<Duration>,
    /// The tree's silence limit (`--dead-after`); `None` when off or not to be waited for.
    pub cut_off: Option<Duration>,
    /// How long the orphans of a lost comm node have to rejoin (`--rejoin-within`):
    /// those that do are asked again for the answer that went with that node. `None`:
    /// they are reported lost.
    pub rejoin: Option<Duration>,
}

impl AnswerWait {
    /// How long the answers are awaited, and where that figure comes from: the
    /// command's limit, or the silence limit when it is longer (so that the ranks
    /// under a hung node are reported lost, and those that answered are shown), plus
    /// `ANSWER_GRACE` for the answers to come up the tree.
    pub fn total(&self) -> Option<(Duration, String)> {
        let limit = self.limit?;
        let grace = ANSWER_GRACE.as_secs();
        Some(match self.cut_off {
            Some(cut) if cut > limit => (
                cut.saturating_add(ANSWER_GRACE),
                format!(
                    "the {} s after which a silent node is cut off (--dead-after), longer than --timeout {}, plus {grace} s for the answers to come up the tree",
                    cut.as_secs_f64(),
                    limit.as_secs_f64()
                ),
            ),
            _ => (
                limit.saturating_add(ANSWER_GRACE),
                format!("--timeout {}, plus {grace} s for the answers to come up the tree", limit.as_secs_f64()),
            ),
        })
    }
}

/// [`run_command_keeping`], awaiting the answers as `wait` says.
///
/// # Errors
/// The stream could not be used or answers were malformed.
pub async fn run_command_waiting(
    net: &Network,
    command: &[String],
    wait: AnswerWait,
    output_limit: u64,
) -> anyhow::Result<RunReport> {
    let limit = wait.limit;
    let comm = net.communicator(present_ranks(net))?;
    let stream = net.new_stream(&comm, StreamOptions::reduce(TransformKind::EqClass)).await?;
    let limit_ms = limit.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0);
    let request = [command.to_vec().into(), Value::ULong(limit_ms), Value::ULong(output_limit)];
    let orphaned_before = net.orphaned().len();
    stream.send(TAG_RUN, RUN_REQUEST, &request).await?;
    let answer = match wait.total() {
        Some((total, _)) => stream.recv_timeout(total).await,
        None => stream.recv().await,
    };
    // Ranks whose links closed leave the wave at once: an answer without them, or a
    // stream ended because none was left, comes before the news of their loss.
    let answer_came = !matches!(answer, Err(treecast_api::ApiError::Timeout(_)));
    let mut raw: Vec<(RankSet, Vec<Value>)> = Vec::new();
    if let Ok(packet) = answer {
        add_classes(&mut raw, &packet)?;
    }
    let mut answered = RankSet::new();
    for (ranks, _) in &raw {
        answered.union_with(ranks);
    }
    // Ranks whose comm node was lost while the command ran: what they had sent went
    // with that node. Those that rejoin are asked again, before the request's stream
    // closes (their back-ends keep the answer until then).
    let mut orphans = RankSet::new();
    for (ranks, _) in net.orphaned().into_iter().skip(orphaned_before) {
        orphans.union_with(&ranks);
    }
    let orphans = orphans.intersection(&comm.ranks().difference(&answered));
    if let (false, Some(rejoin)) = (orphans.is_empty(), wait.rejoin) {
        if let Some(packet) = ask_again(net, &stream, &orphans, rejoin, wait).await {
            add_classes(&mut raw, &packet)?;
            for (ranks, _) in &raw {
                answered.union_with(ranks);
            }
        }
    }
    if answer_came {
        // The answer came without these ranks: their links closed (or their comm
        // node's, whose orphans were handled above), and the news of their loss,
        // which waits for how each process ended, follows.
        let gone = comm.ranks().difference(&answered).difference(&orphans);
        await_loss_news(net, &gone).await;
    }
    // A tree that takes nothing more is left as it is; the caller shuts it down.
    let _ = tokio::time::timeout(CLOSE_LIMIT, stream.close()).await;
    let mut classes = Vec::new();
    for (ranks, values) in raw {
        classes.push(output_class(net.topology(), &ranks, &values)?);
    }
    let missing = comm.ranks().difference(&answered);
    let known_lost = net.lost();
    let mut lost: Vec<Lost> = known_lost
        .among(&missing)
        .into_iter()
        .map(|(ranks, reason)| Lost {
            hosts: hosts_of(net.topology(), &ranks),
            ranks: ranks.to_string(),
            reason,
        })
        .collect();
    let mut silent = missing.difference(known_lost.ranks());
    for (ranks, why) in net.orphaned().into_iter().skip(orphaned_before) {
        let mine = ranks.intersection(&silent);
        if !mine.is_empty() {
            silent = silent.difference(&mine);
            let reason = if wait.rejoin.is_some() && net.rejoined_ranks().intersection(&mine) == mine {
                format!("{why}; they rejoined the tree but did not answer again")
            } else {
                format!("{why}; their answers were lost with it")
            };
            lost.push(Lost { hosts: hosts_of(net.topology(), &mine), ranks: mine.to_string(), reason });
        }
    }
    let mut no_answer = Vec::new();
    if !silent.is_empty() {
        let reason = match wait.total() {
            Some((total, why)) => format!(
                "no answer within {} s ({why}); still connected: the command or the back-end hangs?",
                total.as_secs_f64()
            ),
            None => "no answer (still connected: the command or the back-end hangs?)".to_owned(),
        };
        no_answer.push(Lost { hosts: hosts_of(net.topology(), &silent), ranks: silent.to_string(), reason });
    }
    let ok = lost.is_empty() && no_answer.is_empty() && classes.iter().all(|c| c.exit_code == 0);
    let worst = classes.iter().map(|c| u8::try_from(c.exit_code.clamp(0, 255)).unwrap_or(u8::MAX)).max();
    let missing = if lost.is_empty() && no_answer.is_empty() { 0 } else { EXIT_LOST };
    let exit_status = worst.unwrap_or(0).max(missing);
    let launch = net.launch_group();
    let groups = vec![GroupReport { id: launch.id(), ranks: launch.rank_set().to_string(), spawned: false }];
    Ok(RunReport { backends: net.backends(), groups, classes, lost, no_answer, ok, exit_status })
}

/// `run --filter PATH:NAME`: ships the plug-in down the tree, runs the command with
/// the answers reduced by it, and prints the values it sends up, one per line; filter
/// errors (a rank whose answer it refused) go to stderr and make the exit status 1.
async fn run_filtered(
    net: &mut Network,
    filter: &str,
    command: &[String],
    wait: AnswerWait,
    output_limit: u64,
) -> anyhow::Result<ExitCode> {
    let (path, name) =
        filter.rsplit_once(':').filter(|(p, n)| !p.is_empty() && !n.is_empty()).ok_or_else(|| {
            anyhow::anyhow!("--filter {filter:?} is not PATH:NAME (a shared object and the filter's name)")
        })?;
    let plugin = net.load_filter(path).await?;
    anyhow::ensure!(
        plugin.name() == name,
        "--filter {filter:?}: {path} holds the filter {:?}, not {name:?}",
        plugin.name()
    );
    let up = treecast_api::FilterSpec::new(name, plugin.version());
    let stream = net
        .new_stream(&net.broadcast_communicator(), StreamOptions { up, ..StreamOptions::default() })
        .await?;
    let limit_ms = wait.limit.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0);
    let request = [command.to_vec().into(), Value::ULong(limit_ms), Value::ULong(output_limit)];
    stream.send(TAG_RUN, RUN_REQUEST, &request).await?;
    let answer = match wait.total() {
        Some((total, _)) => stream.recv_timeout(total).await,
        None => stream.recv().await,
    };
    let mut refused = false;
    while let Some(event) = net.try_event() {
        if let treecast_api::Event::FilterError { message, .. } = &event {
            eprintln!("treecast: {message}");
            refused = true;
        }
    }
    let packet = answer.map_err(|e| anyhow::anyhow!("no answer reduced by {name}: {e}"))?;
    let mut out = std::io::stdout().lock();
    for value in packet.values()? {
        match &value {
            Value::Str(s) => writeln!(out, "{s}")?,
            Value::Bytes(b) => out.write_all(b)?,
            other => writeln!(out, "{}", value_text(other))?,
        }
    }
    out.flush()?;
    Ok(if refused { ExitCode::from(1) } else { ExitCode::SUCCESS })
}

/// A number or an array of numbers as text (arrays space-separated).
fn value_text(value: &Value) -> String {
    if let Some(v) = value.as_i64() {
        return v.to_string();
    }
    if let Some(v) = value.as_u64() {
        return v.to_string();
    }
    if let Some(v) = value.as_f64() {
        return v.to_string();
    }
    if let Some(vs) = value.to_i64_vec() {
        return vs.iter().map(i64::to_string).collect::<Vec<_>>().join(" ");
    }
    if let Some(vs) = value.to_f64_vec() {
        return vs.iter().map(f64::to_string).collect::<Vec<_>>().join(" ");
    }
    format!("{value:?}")
}

/// Adds a packet's equivalence classes to `raw`, merged with equal answers already there.
fn add_classes(raw: &mut Vec<(RankSet, Vec<Value>)>, packet: &treecast_api::Packet) -> anyhow::Result<()> {
    for class in packet.eq_classes()? {
        match raw.iter_mut().find(|(_, v)| *v == class.values) {
            Some((ranks, _)) => ranks.union_with(&class.ranks),
            None => raw.push((class.ranks, class.values)),
        }
    }
    raw.sort_by_key(|(ranks, _)| ranks.iter().next());
    Ok(())
}

/// One class of answers as `run` shows it.
fn output_class(topo: &Topology, ranks: &RankSet, values: &[Value]) -> anyhow::Result<OutputClass> {
    let [Value::Bytes(stdout), Value::Bytes(stderr), Value::Int(code), Value::Int(signal), Value::ULong(stdout_bytes), Value::ULong(stderr_bytes), Value::Bytes(_digest)] =
        values
    else {
        anyhow::bail!(
            "malformed answer from ranks {ranks}: expected {RUN_ANSWER} (is treecast the same version on every host?)"
        );
    };
    Ok(OutputClass {
        ranks: ranks.to_string(),
        count: ranks.len(),
        exit_code: *code,
        signal: *signal,
        stdout: stdout.clone(),
        stdout_bytes: *stdout_bytes,
        stderr: stderr.clone(),
        stderr_bytes: *stderr_bytes,
        hosts: hosts_of(topo, ranks),
    })
}

/// Waits (up to `rejoin` and a margin) for `orphans` to rejoin or be lost, then asks
/// those back for the answer they gave to `stream`'s request ([`TAG_RUN_AGAIN`]).
async fn ask_again(
    net: &Network,
    stream: &treecast_api::Stream,
    orphans: &RankSet,
    rejoin: Duration,
    wait: AnswerWait,
) -> Option<treecast_api::Packet> {
    let deadline = tokio::time::Instant::now() + rejoin + REJOIN_MARGIN;
    let back = loop {
        let back = orphans.intersection(&net.rejoined_ranks()).difference(&net.lost_ranks());
        let mut settled = back.clone();
        settled.union_with(&orphans.intersection(&net.lost_ranks()));
        if settled == *orphans || tokio::time::Instant::now() >= deadline {
            break back;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    if back.is_empty() {
        return None;
    }
    let comm = net.communicator(back).ok()?;
    let again = net.new_stream(&comm, StreamOptions::reduce(TransformKind::EqClass)).await.ok()?;
    again.send(TAG_RUN_AGAIN, RUN_AGAIN_REQUEST, &[Value::UInt(stream.id())]).await.ok()?;
    let answer = match wait.total() {
        Some((total, _)) => again.recv_timeout(total).await.ok(),
        None => again.recv().await.ok(),
    };
    let _ = tokio::time::timeout(CLOSE_LIMIT, again.close()).await;
    answer
}

/// Time past the rejoin limit for the news that an orphan rejoined or was lost.
const REJOIN_MARGIN: Duration = Duration::from_secs(2);

/// How long a run waits, once its answer came without some ranks, for the news that
/// they were lost: a node holds that report up to `treecast_proto::EXIT_WAIT` (0.5 s)
/// to say how the process ended, and it may cross comm nodes on its way up.
const LOSS_NEWS_WAIT: Duration = Duration::from_secs(3);

/// Waits (at most [`LOSS_NEWS_WAIT`]) until every rank of `ranks` is among the lost:
/// a rank whose answer is missing is then reported lost with why, not as silent.
async fn await_loss_news(net: &Network, ranks: &RankSet) {
    if ranks.is_empty() {
        return;
    }
    let mut lost = net.lost_watch();
    let _ =
        tokio::time::timeout(LOSS_NEWS_WAIT, lost.wait_for(|l| ranks.difference(l.ranks()).is_empty())).await;
}

/// The ranks a run asks: those launched and those spawned that joined, less those
/// that left the tree (they answer nothing, and are no news); lost ones stay, to be
/// reported lost.
fn present_ranks(net: &Network) -> RankSet {
    let mut ranks = net.launch_group().rank_set();
    ranks.union_with(&net.joined_ranks());
    ranks.difference(&net.left_ranks())
}

/// The hosts that run `ranks`, as a compact host list, in the order of their
/// lowest rank.
fn hosts_of(topo: &Topology, ranks: &RankSet) -> String {
    let mut seen = std::collections::HashSet::new();
    let hosts: Vec<String> = ranks
        .iter()
        .filter_map(|r| topo.leaf_of_rank(r))
        .map(|leaf| hostlist::bare_host(&topo.node(leaf).host))
        .filter(|h| seen.insert(*h))
        .map(str::to_owned)
        .collect();
    hostlist::compress(&hosts)
}

/// What `--lines` writes before each line of a rank: its host, or `HOST#RANK` where a
/// host runs several back-ends. Indexed by rank.
pub fn rank_labels(topo: &Topology) -> Vec<String> {
    let hosts: Vec<String> = (0..topo.backends() as u32)
        .map(|r| {
            topo.leaf_of_rank(r)
                .map_or_else(String::new, |leaf| hostlist::bare_host(&topo.node(leaf).host).to_owned())
        })
        .collect();
    let mut per_host = std::collections::HashMap::<&str, usize>::new();
    for h in &hosts {
        *per_host.entry(h.as_str()).or_default() += 1;
    }
    hosts
        .iter()
        .enumerate()
        .map(
            |(rank, h)| {
                if per_host[h.as_str()] == 1 && !h.is_empty() {
                    h.clone()
                } else {
                    format!("{h}#{rank}")
                }
            },
        )
        .collect()
}

/// The `--lines` report, as pdsh prints without dshbak: every line of every rank as
/// `LABEL: line`, in rank order; stdout's lines for stdout, and for stderr its lines,
/// how commands that failed ended, cut outputs, and lost ranks.
pub fn render_lines(report: &RunReport, labels: &[String]) -> (Vec<u8>, Vec<u8>) {
    let mut by_rank: Vec<(u32, &OutputClass)> = Vec::new();
    for c in &report.classes {
        let ranks: RankSet = c.ranks.parse().unwrap_or_default();
        by_rank.extend(ranks.iter().map(|r| (r, c)));
    }
    by_rank.sort_by_key(|(r, _)| *r);
    let (mut out, mut err) = (Vec::new(), Vec::new());
    for (rank, c) in by_rank {
        let mut notes = Vec::new();
        let label = labels.get(rank as usize).cloned().unwrap_or_else(|| format!("rank {rank}"));
        for (shown, total, name, sink) in
            [(&c.stdout, c.stdout_bytes, "stdout", &mut out), (&c.stderr, c.stderr_bytes, "stderr", &mut err)]
        {
            let text = shown.strip_suffix(b"\n").unwrap_or(shown);
            if !shown.is_empty() {
                for line in text.split(|b| *b == b'\n') {
                    sink.extend_from_slice(format!("{label}: ").as_bytes());
                    sink.extend_from_slice(line);
                    sink.push(b'\n');
                }
            }
            if total > shown.len() as u64 {
                notes.extend_from_slice(
                    format!(
                        "treecast: {label}: {name} cut: {} of {total} bytes shown; --output-limit BYTES shows more\n",
                        shown.len()
                    )
                    .as_bytes(),
                );
            }
        }
        err.append(&mut notes);
        if c.exit_code != 0 || c.signal != 0 {
            err.extend_from_slice(format!("treecast: {label}: {}\n", c.status()).as_bytes());
        }
    }
    for l in &report.lost {
        err.extend_from_slice(format!("treecast: lost [{}]: {}\n", l.ranks, l.reason).as_bytes());
    }
    for l in &report.no_answer {
        err.extend_from_slice(format!("treecast: no answer [{}]: {}\n", l.ranks, l.reason).as_bytes());
    }
    (out, err)
}

/// The human-readable report: each distinct output once, exactly as the ranks wrote
/// it (bytes, not text), then a summary.
pub fn render(report: &RunReport) -> Vec<u8> {
    let mut out = Vec::new();
    for c in &report.classes {
        let exit = if c.exit_code == 0 && c.signal == 0 { String::new() } else { format!(" {}", c.status()) };
        let hosts = if c.hosts.is_empty() || c.hosts == "localhost" {
            String::new()
        } else {
            format!(" on {}", c.hosts)
        };
        out.extend_from_slice(
            format!("---- [{}] ({} rank{}){hosts}{exit} ----\n", c.ranks, c.count, plural(c.count))
                .as_bytes(),
        );
        push_output(&mut out, &c.stdout, c.stdout_bytes, "stdout");
        if c.stderr_bytes > 0 {
            out.extend_from_slice(b"[stderr]\n");
            push_output(&mut out, &c.stderr, c.stderr_bytes, "stderr");
        }
    }
    out.extend_from_slice(summary(report).as_bytes());
    out
}

/// One output stream, ending in a newline, and a note if it was cut.
fn push_output(out: &mut Vec<u8>, shown: &[u8], total: u64, name: &str) {
    out.extend_from_slice(shown);
    if !shown.is_empty() && !shown.ends_with(b"\n") {
        out.push(b'\n');
    }
    if total > shown.len() as u64 {
        out.extend_from_slice(
            format!(
                "[treecast: {name} cut: {} of {total} bytes shown; --output-limit BYTES shows more]\n",
                shown.len()
            )
            .as_bytes(),
        );
    }
}

fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

fn summary(report: &RunReport) -> String {
    let mut by_status: Vec<((i32, i32), String, RankSet)> = Vec::new();
    for c in &report.classes {
        let ranks: RankSet = c.ranks.parse().unwrap_or_default();
        let key = (c.signal, c.exit_code);
        match by_status.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, _, set)) => set.union_with(&ranks),
            None => by_status.push((key, c.status(), ranks)),
        }
    }
    by_status.sort_by_key(|(key, _, _)| *key);
    let mut parts: Vec<String> =
        by_status.iter().map(|(_, status, set)| format!("{status}: {} [{set}]", set.len())).collect();
    // Every outcome is counted on the line, not only the commands that ended.
    for (name, lines) in [("lost", &report.lost), ("no answer", &report.no_answer)] {
        let mut set = RankSet::new();
        for l in lines.iter() {
            set.union_with(&l.ranks.parse().unwrap_or_default());
        }
        if !set.is_empty() {
            parts.push(format!("{name}: {} [{set}]", set.len()));
        }
    }
    let mut s =
        format!("{} back-end{}; {}\n", report.backends, plural(report.backends.into()), parts.join(", "));
    for (ranks, reports, reason) in fold_lost(&report.lost) {
        let like =
            if reports > 1 { format!(" (the first of {reports} such reports)") } else { String::new() };
        s.push_str(&format!("lost [{ranks}]: {reason}{like}\n"));
    }
    for l in &report.no_answer {
        s.push_str(&format!("no answer [{}]: {}\n", l.ranks, l.reason));
    }
    s
}

/// Lost ranks, one entry per kind of reason: reasons that differ only in their
/// numbers (node ids, host numbers, seconds) are one kind, shown by its first
/// report; each entry has the ranks of all and how many reports it stands for.
pub fn fold_lost(lost: &[Lost]) -> Vec<(RankSet, usize, String)> {
    let kind = |reason: &str| -> String {
        let mut k = String::new();
        for c in reason.chars() {
            if c.is_ascii_digit() || c == '.' && k.ends_with('#') {
                if !k.ends_with('#') {
                    k.push('#');
                }
            } else {
                k.push(c);
            }
        }
        k
    };
    let mut folded: Vec<(String, RankSet, usize, String)> = Vec::new();
    for l in lost {
        let key = kind(&l.reason);
        let ranks: RankSet = l.ranks.parse().unwrap_or_default();
        match folded.iter_mut().find(|(k, ..)| *k == key) {
            Some((_, set, n, _)) => {
                set.union_with(&ranks);
                *n += 1;
            }
            None => folded.push((key, ranks, 1, l.reason.clone())),
        }
    }
    folded.into_iter().map(|(_, set, n, reason)| (set, n, reason)).collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::apps::cli::{Cli, Command};
    use clap::Parser;

    fn run_args(args: &[&str]) -> RunArgs {
        let cli = Cli::try_parse_from([&["treecast", "run"][..], args, &["--", "true"]].concat()).unwrap();
        match cli.command {
            Command::Run(a) => a,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn pdsh_and_clush_flags_mean_what_they_mean_there() {
        let a =
            run_args(&["-w", "n[1-4]", "-x", "n2", "-f", "2", "-t", "7", "-u", "9", "-b", "-S", "-l", "bob"]);
        assert_eq!(a.tree.hosts.as_deref(), Some("n[1-4]"));
        assert_eq!(a.tree.exclude, ["n2"]);
        assert_eq!((a.tree.fanout, a.tree.connect_timeout, a.timeout), (2, Some(7.0), Some(9.0)));
        assert!(a.grouped && a.max_status && !a.lines);
        let topo = topology_of(&a.tree).unwrap();
        let hosts: BTreeSetOfHosts =
            (0..3).map(|r| topo.node(topo.leaf_of_rank(r).unwrap()).host.clone()).collect();
        assert_eq!(hosts, ["bob@n1", "bob@n3", "bob@n4"].map(String::from).into_iter().collect());
        // clush's long names.
        let a = run_args(&["--nodes", "n1", "--connect_timeout", "3", "--command_timeout", "4", "-L"]);
        assert_eq!(
            (a.tree.hosts.as_deref(), a.tree.connect_timeout, a.timeout),
            (Some("n1"), Some(3.0), Some(4.0))
        );
        assert!(a.lines);
        // Names written with a user keep it.
        let a = run_args(&["-w", "amy@n1,n2", "-l", "bob"]);
        let topo = topology_of(&a.tree).unwrap();
        assert_eq!(topo.node(topo.leaf_of_rank(0).unwrap()).host, "amy@n1");
        assert!(topology_of(&run_args(&["--local", "2", "-l", "bob"]).tree).is_err());
    }

    type BTreeSetOfHosts = std::collections::BTreeSet<String>;

    #[test]
    fn unknown_pdsh_flags_get_a_tip_naming_the_treecast_flag() {
        use crate::apps::cli::tip_for_unknown_flag;
        assert!(tip_for_unknown_flag("-R").unwrap().contains("--launcher"));
        assert!(tip_for_unknown_flag("-Rssh").unwrap().contains("--launcher"));
        assert!(tip_for_unknown_flag("--options=-q").unwrap().contains("--ssh-args"));
        assert!(tip_for_unknown_flag("-g").unwrap().contains("--hosts"));
        assert!(tip_for_unknown_flag("-é").is_none());
        assert!(tip_for_unknown_flag("--frobnicate").is_none());
    }

    /// The tip for `arg` on the command line `line`, its words split at spaces.
    fn tip(arg: &str, line: &str) -> String {
        let args: Vec<String> = line.split(' ').map(String::from).collect();
        crate::apps::cli::unknown_argument_tip(arg, &args)
    }

    #[test]
    fn a_command_without_its_separator_is_shown_with_one() {
        for (arg, line, shown) in [
            ("hostname", "/x/treecast run --local 4 hostname -f", "treecast run --local 4 -- hostname -f"),
            ("uname", "treecast -v run -w n[1-4] uname", "treecast -v run -w n[1-4] -- uname"),
            // A word that is also the value of a flag before it: the later one is the command.
            ("4", "treecast run --local 4 4", "treecast run --local 4 -- 4"),
            // After a flag that takes no value.
            ("date", "treecast run --json date", "treecast run --json -- date"),
        ] {
            assert_eq!(tip(arg, line), format!("put `--` before the command: `{shown}`"), "{line}");
        }
        // Quoted as the shell must read it back.
        let args: Vec<String> =
            ["treecast", "run", "--local", "2", "sh", "-c", "uname -r", "it's"].map(String::from).into();
        assert_eq!(
            crate::apps::cli::unknown_argument_tip("sh", &args),
            r"put `--` before the command: `treecast run --local 2 -- sh -c 'uname -r' 'it'\''s'`"
        );
        let flag = tip("--frob", "treecast run --frob a b");
        assert!(flag.starts_with("`treecast run --help` lists its flags"), "{flag}");
        assert!(flag.contains("-- COMMAND --frob"), "{flag}");
        assert!(tip("-R", "treecast run -R ssh").contains("--launcher"));
    }

    #[test]
    fn a_subcommand_that_runs_no_command_is_not_told_to_take_one() {
        for (arg, line, said) in [
            ("extra", "treecast topo balanced:2x2 extra", "`treecast topo --help` says what it takes"),
            (
                "--frob",
                "treecast bench microbench --frob",
                "`treecast bench microbench --help` lists its flags",
            ),
            ("frob", "treecast frob", "`treecast --help` says what it takes"),
        ] {
            assert_eq!(tip(arg, line), said, "{line}");
        }
    }

    fn class(ranks: &str, stdout: &[u8], stderr: &[u8], exit_code: i32) -> OutputClass {
        OutputClass {
            ranks: ranks.into(),
            count: ranks.parse::<RankSet>().unwrap().len(),
            exit_code,
            signal: 0,
            stdout: stdout.to_vec(),
            stdout_bytes: stdout.len() as u64,
            stderr: stderr.to_vec(),
            stderr_bytes: stderr.len() as u64,
            hosts: String::new(),
        }
    }

    #[test]
    fn lines_print_every_line_as_host_colon_line_in_rank_order() {
        let report = RunReport {
            backends: 3,
            groups: Vec::new(),
            classes: vec![class("0,2", b"a\nb\n", b"", 0), class("1", b"c", b"oops\n", 3)],
            lost: vec![Lost { ranks: "3".into(), hosts: "n04".into(), reason: "gone".into() }],
            no_answer: Vec::new(),
            ok: false,
            exit_status: 255,
        };
        let labels: Vec<String> = ["n1", "n2", "n3"].map(String::from).to_vec();
        let (out, err) = render_lines(&report, &labels);
        assert_eq!(String::from_utf8(out).unwrap(), "n1: a\nn1: b\nn2: c\nn3: a\nn3: b\n");
        assert_eq!(
            String::from_utf8(err).unwrap(),
            "n2: oops\ntreecast: n2: exit 3\ntreecast: lost [3]: gone\n"
        );
    }

    #[test]
    fn the_answers_are_awaited_past_the_silence_limit_and_the_wait_says_where_it_comes_from() {
        // Regression: `--timeout 5` lowered --dead-after to 5 s (healthy ranks of a loaded
        // machine were cut off), and "no answer within 15 s" named no 10 s grace.
        let s = Duration::from_secs;
        let (total, why) =
            AnswerWait { limit: Some(s(5)), cut_off: Some(s(30)), rejoin: None }.total().unwrap();
        assert_eq!(total, s(40));
        assert!(why.contains("--dead-after") && why.contains("plus 10 s for the answers"), "{why}");
        let (total, why) =
            AnswerWait { limit: Some(s(60)), cut_off: Some(s(30)), rejoin: None }.total().unwrap();
        assert_eq!(total, s(70));
        assert!(why.starts_with("--timeout 60, plus 10 s"), "{why}");
        assert!(AnswerWait { limit: None, cut_off: Some(s(30)), rejoin: None }.total().is_none());
        let a = run_args(&["--local", "4", "--timeout", "5"]);
        assert_eq!(a.tree.dead_after, None, "--timeout leaves liveness alone");
    }

    #[test]
    fn the_summary_counts_every_outcome_and_folds_lost_ranks_by_reason() {
        let lost = |ranks: &str, node: u32, secs: &str| {
            Lost {
            ranks: ranks.into(),
            hosts: "localhost".into(),
            reason: format!("comm node localhost:{node} (node {node}): nothing arrived for {secs} s, not even a heartbeat"),
        }
        };
        let report = RunReport {
            backends: 10,
            groups: Vec::new(),
            classes: vec![class("0-1", b"", b"", 0), class("2", b"", b"", 124)],
            lost: vec![
                lost("3-4", 2, "5.0"),
                lost("5", 3, "5.1"),
                Lost {
                    ranks: "6".into(),
                    hosts: "localhost".into(),
                    reason: "back-end rank 6 exited".into(),
                },
            ],
            no_answer: vec![Lost {
                ranks: "7-9".into(),
                hosts: "localhost".into(),
                reason: "no answer within 15 s".into(),
            }],
            ok: false,
            exit_status: 255,
        };
        let text = summary(&report);
        assert!(
            text.starts_with(
                "10 back-ends; exit 0: 2 [0-1], exit 124: 1 [2], lost: 4 [3-6], no answer: 3 [7-9]\n"
            ),
            "{text}"
        );
        assert!(text.contains("lost [3-5]: comm node localhost:2 (node 2): nothing arrived for 5.0 s, not even a heartbeat (the first of 2 such reports)\n"), "{text}");
        assert!(text.contains("lost [6]: back-end rank 6 exited\n"), "{text}");
        assert_eq!(text.matches("lost [").count(), 2, "{text}");
    }

    #[test]
    fn a_host_with_several_back_ends_is_labelled_with_each_rank() {
        let topo = Topology::from_spec("kary:2", Some(3)).unwrap();
        let labels = rank_labels(&topo);
        assert_eq!(labels.len(), 3);
        assert!(labels[1].ends_with("#1"), "{labels:?}");
    }
}
