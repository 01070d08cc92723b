//! Command-line flags, parsed by clap.

use clap::{Args, Parser, Subcommand};

/// treecast: a tree-based overlay network for scalable cluster tools.
#[derive(Debug, Parser)]
#[command(name = "treecast", version, about, long_about = None)]
pub struct Cli {
    /// More log output on stderr (-v info, -vv debug); TREECAST_LOG overrides.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    pub verbose: u8,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Start a local tree and show a broadcast, a sum reduction, equivalence classes and a run.
    Demo(DemoArgs),
    /// Run a command on every back-end and print each distinct output once, with its ranks.
    Run(RunArgs),
    /// Copy a file to every back-end's host (skipping hosts that already see it), verified end to end.
    Bcast(BcastArgs),
    /// Benchmarks, each against a reference measured in the same run: MRNet's
    /// micro-benchmarks, `run` against a cold start, the simulated tree, routes, file
    /// transfers, spawns, merges, messages between groups, and chaos runs.
    Bench(BenchArgs),
    /// Print a topology (generated from a spec or read from a file), or why it is invalid.
    Topo(TopoArgs),
    /// Start a tree and print every node's clock against the front-end's: offset,
    /// drift, error bound and round trip (the global clock; replaces MRNet's skew detection).
    Clock(ClockArgs),
    /// Performance signature of a recorded run: mean latency per component and frame
    /// size, against a baseline run, as a table and as SVG plots.
    Monitor(MonitorArgs),
    /// Expand (-e), fold (-f, the default) or count (-c) host lists, as --hosts reads them.
    ///
    /// Like ClusterShell's `nodeset`, so that a list can be checked before running on it.
    /// Items are separated by commas or spaces: `node[01-16,20]`, stepped ranges
    /// `n[1-9/2]`, `user@host` (ssh logs in as user), `^FILE` (hosts from a file, one or
    /// more per line, `#` comments), and `-ITEM`, which excludes hosts from the whole list
    /// wherever it stands (as in pdsh). Several EXPRs are joined. A host named twice is
    /// kept once, where it first appears, with a warning. Hosts are printed in the order
    /// treecast gives them ranks (nodeset sorts them). To start an EXPR with `-`, put it
    /// after `--`: `treecast hosts -- 'n[1-8]' -n3`.
    Hosts(HostsArgs),
    /// Internal: a comm node, started by its parent.
    #[command(hide = true)]
    Node,
    /// The generic back-end: started by its parent, or by another launcher (mpirun, a
    /// batch system) with `--attach FILE` to join a tree `run --attach FILE` started.
    Backend(BackendArgs),
    /// Internal: runs one command for the generic back-end and kills its process
    /// group when the back-end goes away.
    #[command(hide = true)]
    Guard(GuardArgs),
}

/// Flags of `treecast monitor`.
#[derive(Debug, Args)]
pub struct MonitorArgs {
    /// The recorded run: what `treecast bench microbench --monitor` writes (a
    /// collection of reports) or one report.
    #[arg(value_name = "REPORT.json")]
    pub report: std::path::PathBuf,
    /// A run to compare with (same kind of file): prints where REPORT deviates from it.
    #[arg(long, value_name = "BASE.json")]
    pub baseline: Option<std::path::PathBuf>,
    /// Draws the signature (and the baseline's) into this SVG file.
    #[arg(long, value_name = "OUT.svg")]
    pub svg: Option<std::path::PathBuf>,
    /// Only frames recorded under this program tag (in both files).
    #[arg(long, value_name = "TAG")]
    pub program: Option<u32>,
    /// With --baseline: list the points whose mean moved by at least this many
    /// percent, and those found in one run only.
    #[arg(long, value_name = "PERCENT", default_value_t = 10.0)]
    pub threshold: f64,
    /// Print the signature (and the comparison) as one JSON object.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `treecast guard`.
#[derive(Debug, Args)]
pub struct GuardArgs {
    /// The command and its arguments.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, required = true)]
    pub command: Vec<String>,
}

/// Flags of `treecast hosts`.
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("mode").args(["expand", "fold", "count"])))]
pub struct HostsArgs {
    /// Print every host, separated by spaces (like `nodeset -e`).
    #[arg(short, long)]
    pub expand: bool,
    /// Print the list folded into ranges (the default; like `nodeset -f`).
    #[arg(short, long)]
    pub fold: bool,
    /// Print the number of hosts (like `nodeset -c`).
    #[arg(short, long)]
    pub count: bool,
    /// Hosts to leave out, as a host list (like `nodeset -x`); may be repeated.
    #[arg(short = 'x', long, value_name = "LIST")]
    pub exclude: Vec<String>,
    /// Host lists.
    #[arg(required = true, value_name = "EXPR")]
    pub exprs: Vec<String>,
}

/// Flags of `treecast demo`.
#[derive(Debug, Args)]
pub struct DemoArgs {
    /// Shape of the demo tree.
    #[arg(long, default_value = "balanced:4x4")]
    pub topology: String,
}

/// Where the back-ends run and how the tree is started: shared by `run`, `bcast` and `bench run`.
#[derive(Debug, Clone, Args)]
pub struct TreeArgs {
    /// Number of back-ends to start on this machine.
    #[arg(long, value_name = "N", conflicts_with = "hosts")]
    pub local: Option<usize>,
    /// Hosts, as a host list (`node[01-16,20]`, `h[1-4],login1`, `n[1-9/2] -n5`, `bob@n1`,
    /// `^FILE`; see `treecast hosts --help`); one back-end per host by default.
    /// With `--launcher slurm` the default is the allocation's nodes (SLURM_JOB_NODELIST).
    /// `-w` (and clush's `--nodes`) as in pdsh and clush.
    #[arg(short = 'w', long, alias = "nodes", value_name = "LIST")]
    pub hosts: Option<String>,
    /// Hosts to leave out of --hosts or of the Slurm allocation, as a host list (like
    /// `pdsh -x` and `clush -x`); may be repeated. Excluding a host that is not listed is fine.
    #[arg(short = 'x', long, value_name = "LIST")]
    pub exclude: Vec<String>,
    /// With --hosts: the largest number of children of any node (`-f` as in pdsh and
    /// clush: here it bounds what each node starts and talks to, not the whole run).
    #[arg(short = 'f', long, value_name = "F", default_value_t = 16)]
    pub fanout: usize,
    /// Seconds a process may take to start and connect to its parent (ssh's connect
    /// time included), as `pdsh -t` and `clush -t`; default 30, or
    /// TREECAST_STARTUP_TIMEOUT.
    #[arg(short = 't', long, alias = "connect_timeout", value_name = "SECS")]
    pub connect_timeout: Option<f64>,
    /// With --hosts: log in as USER on hosts written without `user@` (as `pdsh -l` and
    /// `clush -l`).
    #[arg(short = 'l', long, value_name = "USER")]
    pub user: Option<String>,
    /// With --hosts: back-ends started on each host.
    #[arg(long, value_name = "K", default_value_t = 1)]
    pub per_host: usize,
    /// Tree shape: flat, kary:K, knomial:K, balanced:AxB..., fanout:F, or a topology file (which names its hosts).
    #[arg(long, value_name = "SPEC")]
    pub topology: Option<String>,
    /// How processes on other hosts are started.
    #[arg(long, value_enum, default_value_t = LauncherKind::Ssh)]
    pub launcher: LauncherKind,
    /// Extra ssh arguments (split on spaces); default from TREECAST_SSH_ARGS.
    #[arg(long, value_name = "ARGS", allow_hyphen_values = true)]
    pub ssh_args: Option<String>,
    /// Path of treecast on the other hosts (default: `treecast` on their PATH for ssh, this binary for slurm).
    #[arg(long, value_name = "PATH")]
    pub remote_path: Option<String>,
    /// Start even if some hosts cannot be reached; they are reported as lost.
    #[arg(long)]
    pub allow_missing: bool,
    /// Attach mode: start the comm nodes only, write FILE, and wait for back-ends
    /// started by someone else (`treecast backend --attach FILE`, e.g. under mpirun).
    /// FILE holds the session secret: put it in a directory only you can write
    /// ($XDG_RUNTIME_DIR, or one made by `mktemp -d`); it is removed at the end.
    #[arg(long, value_name = "FILE")]
    pub attach: Option<std::path::PathBuf>,
    /// With --attach: seconds the back-ends have to connect.
    #[arg(long, value_name = "SECS", default_value_t = 300.0, requires = "attach")]
    pub attach_timeout: f64,
    /// Cut off a node (stopped, hung, unreachable) after this many seconds without a
    /// frame or heartbeat from it; its ranks are reported lost. 0: never. Default 30,
    /// or TREECAST_DEAD_AFTER (`run --timeout` leaves it alone).
    #[arg(long, value_name = "SECS")]
    pub dead_after: Option<f64>,
    /// When a comm node is lost, its children rejoin the tree under its parent within
    /// this many seconds, and their ranks go on; those that do not are reported lost.
    /// 0: no recovery (a lost comm node's sub-tree is lost with it). Default 10, or
    /// TREECAST_REJOIN_WITHIN.
    #[arg(long, value_name = "SECS")]
    pub rejoin_within: Option<f64>,
    /// How large downstream frames (file chunks, big multicasts) reach the children of
    /// each node: over each child's link (tcp), or by reliable UDP multicast to the
    /// children on the node's subnet, one datagram for all (udp; TREECAST_UDP_*
    /// variables tune it, see docs/multicast.md); over N connections per link, large
    /// frames cut across them (striped:N, N from 2 to 16; docs/routes.md); or over
    /// Multipath TCP links, plain TCP where the kernel refuses it (mptcp).
    #[arg(long, default_value_t = RouteKind::Tcp)]
    pub route: RouteKind,
}

/// Flags of `treecast run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// Where the back-ends run.
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// The command's time limit: each back-end kills its command after SECS (exit 124,
    /// as timeout(1)). The answers are awaited SECS + 10 s (or --dead-after + 10 s when
    /// that is longer, so that ranks under a hung node are reported lost); ranks still
    /// silent then are reported. Liveness (--dead-after) is not changed by it.
    /// `-u` (and clush's `--command_timeout`) as in pdsh and clush.
    #[arg(short = 'u', long, alias = "command_timeout", value_name = "SECS")]
    pub timeout: Option<f64>,
    /// Print each line of output as `HOST: line` (stderr's on stderr), as pdsh does
    /// without dshbak, instead of each distinct output once; a host that runs several
    /// back-ends is written `HOST#RANK`. Failures and lost ranks go to stderr.
    #[arg(short = 'L', long, conflicts_with = "json")]
    pub lines: bool,
    /// Grouped output, as `pdsh | dshbak -c` and `clush -b` give it: the default, so
    /// this flag changes nothing.
    #[arg(short = 'b', long = "dshbak")]
    pub grouped: bool,
    /// Exit with the largest exit status of any rank, as `pdsh -S` and `clush -S`
    /// (`--maxrc`): what treecast always does (see the README's table).
    #[arg(short = 'S', long = "maxrc")]
    pub max_status: bool,
    /// Bytes of each rank's stdout and of its stderr to show (ranks are grouped by all
    /// they wrote, even past this).
    #[arg(long, value_name = "BYTES", default_value_t = super::protocol::DEFAULT_OUTPUT_LIMIT)]
    pub output_limit: u64,
    /// After the launch, start N more back-ends while the tree runs (placed under
    /// the least loaded comm nodes) and run the command on them too; --json lists
    /// the groups.
    #[arg(long, value_name = "N")]
    pub spawn: Option<u32>,
    /// Hand the answers to the plug-in filter NAME in the shared object PATH
    /// (docs/filter-abi.md), shipped down the tree and run at every node, instead of
    /// grouping outputs: prints the values of the one packet it sends up, one per
    /// line (e.g. a sum of the number every host printed).
    #[arg(long, value_name = "PATH:NAME", conflicts_with_all = ["json", "lines", "spawn"])]
    pub filter: Option<String>,
    /// The command and its arguments.
    #[arg(last = true, required = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// For a flag treecast does not know that pdsh, pdcp or clush users type: the tip
/// naming what treecast offers instead (clap's own tip would send it to the command).
pub fn tip_for_unknown_flag(flag: &str) -> Option<&'static str> {
    let name = flag.split_once('=').map_or(flag, |(name, _)| name);
    // `-Rssh`: a short flag with its value attached.
    let name = if name.starts_with("--") { name } else { name.get(..2).unwrap_or(name) };
    Some(match name {
        "-R" => "treecast starts processes with --launcher ssh|slurm|local (pdsh's -R)",
        "-N" => "treecast run shows each distinct output once; --lines (-L) prints `HOST: line`",
        "-g" | "--group" | "-a" | "--all" | "-A" | "-X" => {
            "name the hosts with --hosts (-w): a host list, or ^FILE for the hosts in a file"
        }
        "-o" | "--options" => "extra ssh options go in --ssh-args 'OPTIONS' (or TREECAST_SSH_ARGS)",
        "-d" | "--debug" => "-v (info) and -vv (debug) print more log output on stderr",
        "-c" | "--copy" => "files are copied with `treecast bcast SRC... DST` (see docs/files.md)",
        "-p" | "--preserve" => "treecast bcast always keeps the mode bits and mtime",
        _ => return None,
    })
}

/// The tip for `arg`, an argument clap does not know on the command line `args`
/// (the program first): treecast's flag for a pdsh or clush one; for a word given to
/// a subcommand that runs a command, the line again with `--` before it (`treecast
/// run --local 4 hostname` forgot it, and clap's own tip would hand `hostname` to
/// `--`, not the command); else where to read what the subcommand takes.
pub fn unknown_argument_tip(arg: &str, args: &[String]) -> String {
    if let Some(tip) = tip_for_unknown_flag(arg) {
        return tip.to_owned();
    }
    let (path, end, takes_command) = subcommand_of(args);
    let name = if path.is_empty() { "treecast".to_owned() } else { format!("treecast {path}") };
    match (arg.starts_with('-'), takes_command) {
        (true, true) => {
            return format!(
                "`{name} --help` lists its flags; a flag of the command itself goes after `--` and the \
                 command (`{name} ... -- COMMAND {arg}`)"
            )
        }
        (true, false) => return format!("`{name} --help` lists its flags"),
        (false, false) => return format!("`{name} --help` says what it takes"),
        (false, true) => {}
    }
    // Where `arg` stands: not as the value of a flag before it (`--local 4 4`), unless
    // every place is after a flag (`--json hostname`: a flag that takes no value).
    let places: Vec<usize> = (end..args.len()).filter(|&i| args[i] == arg).collect();
    let after_a_flag = |i: &usize| args[i - 1].starts_with('-');
    let Some(at) = places.iter().find(|i| !after_a_flag(i)).or(places.first()).copied() else {
        return format!("put `--` before the command: `{name} ... -- {}`", shell_word(arg));
    };
    let mut line: Vec<std::borrow::Cow<'_, str>> = vec!["treecast".into()];
    line.extend(args[1..at].iter().map(|a| shell_word(a)));
    line.push("--".into());
    line.extend(args[at..].iter().map(|a| shell_word(a)));
    format!("put `--` before the command: `{}`", line.join(" "))
}

/// The subcommand `args` names, as its words (`bench microbench`; empty for none),
/// the index past its last word, and whether it runs a command given after `--`.
fn subcommand_of(args: &[String]) -> (String, usize, bool) {
    let mut command = <Cli as clap::CommandFactory>::command();
    let (mut words, mut end) = (Vec::new(), 1);
    for (i, arg) in args.iter().enumerate().skip(1) {
        if arg == "--" {
            break;
        }
        if let Some(sub) = command.find_subcommand(arg).cloned() {
            words.push(arg.as_str());
            end = i + 1;
            command = sub;
        }
    }
    let takes_command = !words.is_empty() && command.get_positionals().any(|a| a.is_last_set());
    (words.join(" "), end, takes_command)
}

/// `word` as a shell reads it back: as it is when it holds nothing a shell would
/// change, else in single quotes.
fn shell_word(word: &str) -> std::borrow::Cow<'_, str> {
    let plain =
        !word.is_empty() && word.bytes().all(|b| b.is_ascii_alphanumeric() || b"@%+=:,./-_[]^".contains(&b));
    if plain {
        word.into()
    } else {
        format!("'{}'", word.replace('\'', r"'\''")).into()
    }
}

/// How processes on other hosts are started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LauncherKind {
    /// Everything on this host (fork/exec); other host names are an error.
    Local,
    /// The system `ssh`, recursively: comm nodes start their own children.
    Ssh,
    /// Slurm job steps (`srun`) inside the current allocation, for every process.
    Slurm,
}

/// Flags of `treecast topo`.
#[derive(Debug, Args)]
pub struct TopoArgs {
    /// flat, kary:K, knomial:K, balanced:AxB..., fanout:F, or a topology file.
    pub spec: String,
    /// Number of back-ends for generated shapes.
    #[arg(long, value_name = "N")]
    pub backends: Option<usize>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = TopoFormat::Tree)]
    pub format: TopoFormat,
}

/// How `treecast topo` prints a tree.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TopoFormat {
    /// An indented drawing.
    Tree,
    /// MRNet's topology file format.
    Mrnet,
}

/// Flags of `treecast backend`.
#[derive(Debug, Args)]
pub struct BackendArgs {
    /// Join a network in attach mode through this attach file, or a running one
    /// through the port file of its `Network::accept` (default: started by a parent).
    #[arg(long, value_name = "FILE")]
    pub attach: Option<std::path::PathBuf>,
    /// With --attach: this back-end's rank, counted from the file's first (default:
    /// TREECAST_RANK, OMPI_COMM_WORLD_RANK, PMIX_RANK, PMI_RANK or SLURM_PROCID).
    #[arg(long, value_name = "R", requires = "attach")]
    pub rank: Option<u32>,
}

/// Flags of `treecast bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// Which benchmark.
    #[command(subcommand)]
    pub command: BenchCommand,
}

/// The benchmarks.
#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Instantiation latency, broadcast + sum round trips, back-to-back reduction throughput.
    Microbench(MicrobenchArgs),
    /// `treecast run`'s cost: start-up plus a first command, then more commands on the running tree.
    Run(RunArgs),
    /// A plug-in filter's reductions per second against the built-in sum's, on the
    /// same tree in the same run (back-ends send `%d`; the plug-in must add them, as
    /// examples/filters/sum.c does), rounds alternating; prints both and the ratio.
    Filter(BenchFilterArgs),
    /// A STAT-like merge of call-graph prefix trees (examples/filters/prefix_tree.cpp)
    /// at every comm node, time per wave, against the same merge done by the
    /// front-end alone over a flat tree of the same back-ends, in the same run.
    PrefixTree(BenchPrefixTreeArgs),
    /// The protocol cores of a whole tree in one process, with virtual time: work and
    /// bytes per node per wave at each level, and the wall time per wave.
    Sim(SimArgs),
    /// The reliable UDP multicast route: time and rate per message size and group
    /// size (with --sim, in a simulated LAN with virtual time and a line rate).
    Route(RouteBenchArgs),
    /// `treecast bcast`'s transfer alone, on a tree started once: a file of --size MiB
    /// sent --runs times (warm, as against daemons already running), with what each
    /// node's multicast route did and the front-end's CPU time.
    Bcast(BenchBcastArgs),
    /// Latency of spawning n back-ends while the tree runs, and spawns per second,
    /// against MPI_Comm_spawn measured in the same run.
    Spawn(BenchSpawnArgs),
    /// Latency of merging two spawned groups and reducing over the merged group,
    /// against MPI_Intercomm_merge measured in the same run.
    Merge(BenchMergeArgs),
    /// Latency of messages between back-ends of one group and of two groups (one
    /// spawned), against MPI point-to-point measured in the same run.
    Intergroup(BenchIntergroupArgs),
    /// Reductions on a real tree while comm nodes and back-ends are killed (SIGKILL)
    /// or stopped (SIGSTOP) at random: hangs, wrong answers, live ranks reported lost,
    /// processes left behind, recovery time.
    Chaos(ChaosArgs),
    /// Internal: echoes standard input to standard output, byte by byte (the raw
    /// socket ping-pong that `microbench` measures as the floor).
    #[command(hide = true)]
    Echo,
    /// Internal: one process of the raw tree `microbench` measures as the floor of its
    /// shape: relays a byte to its children (the sub-tree in `TREECAST_RELAY_TREE`) and
    /// a byte back up once each child answered.
    #[command(hide = true)]
    Relay,
    /// Internal: one process of `bench bcast`'s floor: copies a file as a back-end
    /// writes one (chunk by chunk), then syncs it.
    #[command(hide = true)]
    Write(WriteFloorArgs),
}

/// Flags of the hidden `treecast bench write`.
#[derive(Debug, Args)]
pub struct WriteFloorArgs {
    /// The file to copy.
    #[arg(long, value_name = "PATH")]
    pub src: std::path::PathBuf,
    /// The copy, made anew.
    #[arg(long, value_name = "PATH")]
    pub dst: std::path::PathBuf,
    /// Bytes per write.
    #[arg(long, value_name = "BYTES")]
    pub chunk: usize,
}

/// Flags of `treecast bench bcast`.
#[derive(Debug, Args)]
pub struct BenchBcastArgs {
    /// Where the back-ends run (with --route udp, by multicast).
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Size of the file sent, MiB.
    #[arg(long, value_name = "MIB", default_value_t = 20)]
    pub size: u64,
    /// Transfers timed; the median is reported.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Bytes per chunk sent down the tree.
    #[arg(long, value_name = "BYTES", default_value_t = treecast_files::DEFAULT_CHUNK)]
    pub chunk: usize,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `treecast bench spawn`.
#[derive(Debug, Args)]
pub struct BenchSpawnArgs {
    /// The running tree the spawns come from (default: 16 back-ends, balanced:4x4).
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Processes per spawn, comma-separated.
    #[arg(long, value_name = "N,N,...", default_value = "1,4,16,64")]
    pub sizes: String,
    /// Spawns timed per size.
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Seconds of back-to-back spawns for the rate (n = 1 and 4).
    #[arg(long, value_name = "SECS", default_value_t = 3.0)]
    pub rate_secs: f64,
    /// Leave the MPI reference out.
    #[arg(long)]
    pub no_mpi: bool,
    /// One JSON object instead of tables.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `treecast bench merge`.
#[derive(Debug, Args)]
pub struct BenchMergeArgs {
    /// The running tree the groups are spawned from (default: 16 back-ends, balanced:4x4).
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Processes per group, comma-separated.
    #[arg(long, value_name = "N,N,...", default_value = "1,4,16,64")]
    pub sizes: String,
    /// Merges timed per size.
    #[arg(long, default_value_t = 20)]
    pub runs: usize,
    /// Leave the MPI reference out.
    #[arg(long)]
    pub no_mpi: bool,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `treecast bench intergroup`.
#[derive(Debug, Args)]
pub struct BenchIntergroupArgs {
    /// The running tree (default: 16 back-ends, balanced:4x4).
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Message sizes, comma-separated, with K and M suffixes.
    #[arg(long, value_name = "SIZES", default_value = "1,1K,64K,1M,4M")]
    pub sizes: String,
    /// Bytes each member contributes to the collective operations, comma-separated.
    #[arg(long, value_name = "SIZES", default_value = "8,1K,64K,1M")]
    pub coll_sizes: String,
    /// Leave the MPI reference out.
    #[arg(long)]
    pub no_mpi: bool,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `treecast clock`.
#[derive(Debug, Args)]
pub struct ClockArgs {
    /// Where the back-ends run.
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Rounds of probes to wait for on every link: 1 gives offsets, 2 (2 s later) drifts
    /// too; 3 and more come only every TREECAST_CLOCK_RESYNC seconds (300), so raise --wait.
    #[arg(long, default_value_t = 2)]
    pub rounds: u32,
    /// Longest wait for the rounds, seconds.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub wait: f64,
    /// Then check the clock on every link the published way: WAVES equal-size
    /// requests down and answers up, recorded, and each link's shortest one-way
    /// latency down against up (half their difference should stay within the
    /// link's error bound).
    #[arg(long, value_name = "WAVES", num_args = 0..=1, default_missing_value = "200")]
    pub cross_check: Option<u32>,
    /// Measure in the simulated tree instead (virtual time and clocks, distorted as
    /// TREECAST_CLOCK_DISTORT says, by default offsets to ±1 s and drifts to ±100 ppm;
    /// default tree balanced:4x4x4 of 64 back-ends); give --rounds 3 for a drift
    /// measured over a resync period.
    #[arg(long, conflicts_with = "cross_check")]
    pub sim: bool,
    /// With --sim: also show the estimate this many seconds after the last round.
    #[arg(long, value_name = "SECS", default_value_t = 600.0, requires = "sim")]
    pub later: f64,
    /// With --sim: each frame's delay varies by up to this many microseconds.
    #[arg(long, value_name = "US", default_value_t = 10.0, requires = "sim")]
    pub jitter_us: f64,
    /// One JSON object instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `treecast bench chaos`.
#[derive(Debug, Clone, Args)]
pub struct ChaosArgs {
    /// Number of back-ends to start on this machine (with --sim: of the given topology).
    #[arg(long, value_name = "N", required_unless_present = "sim")]
    pub local: Option<usize>,
    /// Tree shape: flat, kary:K, knomial:K, balanced:AxB..., fanout:F, or a topology file
    /// (default kary:4; with --sim, a new random tree every run).
    #[arg(long, value_name = "SPEC")]
    pub topology: Option<String>,
    /// Runs, each on a fresh tree (default 10, or 1000 with --sim).
    #[arg(long)]
    pub runs: Option<usize>,
    /// Reductions per run.
    #[arg(long, default_value_t = 50)]
    pub waves: usize,
    /// Processes killed or stopped per run: before random waves, at random points of
    /// the file transfer, or while the tree starts (see --during).
    #[arg(long, default_value_t = 1)]
    pub faults: usize,
    /// Instead of --faults: each comm node and back-end is killed or stopped during a
    /// run with this probability (0 to 1).
    #[arg(long, value_name = "P", conflicts_with = "faults")]
    pub kill_rate: Option<f64>,
    /// When the faults strike: reduce (reductions), bcast (a file transfer, then
    /// reductions), startup (while the tree starts; it goes on without what failed,
    /// then reductions). A comma list: the run with seed S takes entry S mod its
    /// length. Default all three; with --sim reduce,startup (the simulated tree runs
    /// no file transfers).
    #[arg(long, value_name = "PHASES", value_delimiter = ',')]
    pub during: Vec<ChaosPhase>,
    /// Bytes of the file each bcast run sends.
    #[arg(long, value_name = "BYTES", default_value_t = 4 << 20)]
    pub file_size: u64,
    /// Share of the faults that stop (SIGSTOP) rather than kill (SIGKILL).
    #[arg(long, default_value_t = 0.3)]
    pub stop_fraction: f64,
    /// Silence limit of the trees under test, seconds (see `--dead-after` of `run`);
    /// virtual seconds with --sim.
    #[arg(long, value_name = "SECS", default_value_t = 2.0)]
    pub dead_after: f64,
    /// Rejoin limit of the trees under test, seconds (see `--rejoin-within` of `run`;
    /// 0: recovery off); virtual seconds with --sim.
    #[arg(long, value_name = "SECS")]
    pub rejoin_within: Option<f64>,
    /// Seed of the first run (run k uses seed + k), so a run can be repeated.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Run in the simulated tree (every node's protocol core in this process, virtual
    /// time) instead of real processes; without --topology, on random trees of depth 1
    /// to 5 and fan-out 1 to 32.
    #[arg(long)]
    pub sim: bool,
    /// With --sim and no --topology: the largest random tree, in nodes.
    #[arg(long, value_name = "N", default_value_t = treecast_sim::chaos::DEFAULT_MAX_NODES, requires = "sim")]
    pub max_nodes: usize,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// When the faults of a chaos run strike.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ChaosPhase {
    /// Before random waves of reductions.
    Reduce,
    /// During a file transfer (`bcast`).
    Bcast,
    /// While the tree starts.
    Startup,
}

impl ChaosPhase {
    /// The same phase in the simulated tree, which runs no file transfers.
    pub fn simulated(self) -> Option<treecast_sim::chaos::FaultPhase> {
        use treecast_sim::chaos::FaultPhase;
        match self {
            ChaosPhase::Reduce => Some(FaultPhase::Reduce),
            ChaosPhase::Bcast => None,
            ChaosPhase::Startup => Some(FaultPhase::Startup),
        }
    }

    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            ChaosPhase::Reduce => "reduce",
            ChaosPhase::Bcast => "bcast",
            ChaosPhase::Startup => "startup",
        }
    }
}

/// Flags of `treecast bench sim`.
#[derive(Debug, Args)]
pub struct SimArgs {
    /// Number of back-ends.
    #[arg(long, value_name = "N")]
    pub backends: usize,
    /// Tree shape: flat, kary:K, knomial:K, balanced:AxB..., fanout:F, or a topology file.
    #[arg(long, value_name = "SPEC", default_value = "kary:32")]
    pub topology: String,
    /// Waves (a broadcast and a sum reduction each) to run.
    #[arg(long, default_value_t = 10)]
    pub waves: usize,
    /// Also watch the same tree idle, with heartbeats and the global clock on, for
    /// this many virtual seconds: timer wake-ups and links visited per node per
    /// second (0: not measured).
    #[arg(long, value_name = "SECS", default_value_t = 10)]
    pub idle: u64,
    /// One JSON object instead of text.
    #[arg(long)]
    pub json: bool,
}

/// Flags of `treecast bench route`.
#[derive(Debug, Args)]
pub struct RouteBenchArgs {
    /// The route to measure (default: both on real sockets, the TCP rows being the
    /// reference of the UDP rows; udp with --sim).
    #[arg(long)]
    pub route: Option<RouteKind>,
    /// Run the protocol in a simulated LAN (virtual time) instead of a local tree on
    /// real sockets.
    #[arg(long)]
    pub sim: bool,
    /// Between two hosts: answer clients at ADDR (treecast links) and its port + 1
    /// (the raw TCP floor) until killed; the secret comes from TREECAST_SECRET.
    #[arg(long, value_name = "ADDR", conflicts_with_all = ["sim", "to"])]
    pub serve: Option<String>,
    /// Between two hosts: measure tcp, the raw TCP floor and --route (default
    /// striped:2 and mptcp) against a `--serve` at ADDR (one per rail, comma-separated).
    #[arg(long, value_name = "ADDR[,ADDR]", conflicts_with = "sim")]
    pub to: Option<String>,
    /// Real sockets: round trips timed per row (fewer for messages over 8 MiB).
    #[arg(long, default_value_t = 20)]
    pub rounds: usize,
    /// Group sizes (receivers per sender), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,4,16")]
    pub receivers: Vec<usize>,
    /// Message sizes in bytes (K, M suffixes: powers of 1024), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,1K,64K,1M,64M")]
    pub sizes: Vec<String>,
    /// Chance that a datagram does not reach one of its destinations.
    #[arg(long, default_value_t = 0.0)]
    pub loss: f64,
    /// Line rate of every uplink of the simulated LAN, Mbit/s.
    #[arg(long, value_name = "MBIT", default_value_t = 1000)]
    pub rate_mbit: u64,
    /// One-way latency of the simulated LAN, microseconds.
    #[arg(long, value_name = "US", default_value_t = 50)]
    pub latency_us: u64,
    /// Seed of the simulated LAN's random draws.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// One JSON object per row instead of a table.
    #[arg(long)]
    pub json: bool,
}

/// A route a tree's links take (`--route`), and that `treecast bench route` measures.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteKind {
    /// One TCP (or Unix) connection per child.
    Tcp,
    /// The reliable multicast route over UDP.
    Udp,
    /// N connections per link (`striped:N`), large frames cut across them.
    Striped(u8),
    /// One Multipath TCP connection per child (plain TCP where the kernel refuses it).
    Mptcp,
}

impl std::str::FromStr for RouteKind {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tcp" => Ok(RouteKind::Tcp),
            "udp" => Ok(RouteKind::Udp),
            "mptcp" => Ok(RouteKind::Mptcp),
            _ => match s.strip_prefix("striped:").map(str::parse::<u8>) {
                Some(Ok(n)) if (2..=treecast_wire::MAX_STRIPES).contains(&n) => Ok(RouteKind::Striped(n)),
                Some(_) => Err(format!("{s:?}: striped:N takes N from 2 to {}", treecast_wire::MAX_STRIPES)),
                None => Err(format!("{s:?} is not a route: tcp, udp, striped:N or mptcp")),
            },
        }
    }
}

impl std::fmt::Display for RouteKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RouteKind::Tcp => f.write_str("tcp"),
            RouteKind::Udp => f.write_str("udp"),
            RouteKind::Striped(n) => write!(f, "striped:{n}"),
            RouteKind::Mptcp => f.write_str("mptcp"),
        }
    }
}

impl RouteKind {
    /// Connections per link in the launch plan (0: one).
    pub fn stripes(self) -> u8 {
        match self {
            RouteKind::Striped(n) => n,
            _ => 0,
        }
    }
}

/// Flags of `treecast bench filter`.
#[derive(Debug, Args)]
pub struct BenchFilterArgs {
    /// Back-ends on this host.
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub local: usize,
    /// Tree shape (default kary:16).
    #[arg(long, value_name = "SPEC")]
    pub topology: Option<String>,
    /// Reductions per round and filter.
    #[arg(long, default_value_t = 2000)]
    pub tp: usize,
    /// Rounds, each measuring both filters.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// The plug-in: its shared object and the filter's name.
    #[arg(value_name = "PATH:NAME")]
    pub filter: String,
}

/// Flags of `treecast bench prefix-tree`.
#[derive(Debug, Args)]
pub struct BenchPrefixTreeArgs {
    /// Back-ends on this host.
    #[arg(long, value_name = "N", default_value_t = 1000)]
    pub local: usize,
    /// Tree shape the merge runs in (the reference is always flat).
    #[arg(long, value_name = "SPEC", default_value = "kary:16")]
    pub topology: String,
    /// Waves timed on each tree (after one to warm up).
    #[arg(long, default_value_t = 20)]
    pub waves: usize,
    /// Frames in each back-end's stack.
    #[arg(long, default_value_t = 8)]
    pub depth: u32,
    /// Distinct stacks among the back-ends (ranks with equal rank % CLASSES share one).
    #[arg(long, default_value_t = 16)]
    pub classes: u32,
    /// The prefix-tree plug-in, built as examples/filters/prefix_tree.cpp says.
    #[arg(value_name = "PLUGIN.so")]
    pub plugin: std::path::PathBuf,
}

/// Flags of `treecast bench microbench`.
#[derive(Debug, Args)]
pub struct MicrobenchArgs {
    /// Number of back-ends to start on this machine (with a topology file: its leaves by default).
    #[arg(long, value_name = "N", required_unless_present = "topology")]
    pub local: Option<usize>,
    /// Tree shape: flat, kary:K, knomial:K, balanced:AxB..., fanout:F (kary:16 by default),
    /// or a topology file.
    #[arg(long, value_name = "SPEC")]
    pub topology: Option<String>,
    /// Round trips to time.
    #[arg(long, default_value_t = 1000)]
    pub rt: usize,
    /// Back-to-back reductions to time.
    #[arg(long, default_value_t = 2000)]
    pub tp: usize,
    /// Time from right after start-up, while the global clock's first two rounds still
    /// probe every link (by default the timing waits until they are over: on a large
    /// tree they take the CPU the first seconds' round trips would need).
    #[arg(long)]
    pub at_once: bool,
    /// Measure this shape too, with the same back-ends, and print the ratios (e.g. `flat`).
    #[arg(long, value_name = "SPEC")]
    pub compare: Option<String>,
    /// One JSON object per case instead of text.
    #[arg(long)]
    pub json: bool,
    /// Record the latency components of every link of the tree (not of the `--compare`
    /// shape) while it is measured, and write them here: one report per node (JSON).
    #[arg(long, value_name = "REPORT.json")]
    pub monitor: Option<std::path::PathBuf>,
    /// Measure what monitoring costs: the tree's round trips and reductions with
    /// recording off and on, in ROUNDS pairs (order alternating), each measurement
    /// between two confirmed orders (start or stop), and print the medians and the
    /// median of the pairs' changes.
    #[arg(long, value_name = "ROUNDS", num_args = 0..=1, default_missing_value = "3", conflicts_with_all = ["monitor", "compare"])]
    pub overhead: Option<usize>,
    /// With --overhead: also measure as many pairs with recording off in both
    /// halves, and print their changes: how large a change this machine's noise makes.
    #[arg(long, requires = "overhead")]
    pub overhead_null: bool,
    /// Run the C API's twin of this benchmark (examples/c/microbench.c, built; see
    /// tools/microbench-c) on the same shape beside the Rust measurement, and print its
    /// figures against the Rust API's.
    #[arg(long, value_name = "PROGRAM", conflicts_with_all = ["overhead", "compare", "monitor"])]
    pub c_twin: Option<std::path::PathBuf>,
    /// With --c-twin: measure both this many times, the C twin first in every other
    /// round, then print the medians of the rounds' ratios against the C API's
    /// targets (round trip at most 1.05x, reductions/s at least 0.95x the Rust API's).
    #[arg(long, value_name = "N", default_value_t = 1, requires = "c_twin")]
    pub twin_rounds: usize,
}

/// Flags of `treecast bcast`.
#[derive(Debug, Args)]
pub struct BcastArgs {
    /// SRC... \[DST\]: the files (and with -r directories) to send, then where to write them on
    /// each host. With one SRC, DST defaults to the same absolute path and an existing
    /// directory takes the file under its name; a DST ending in `/` is a directory, which
    /// takes the file under its name; with several sources or a directory, DST is a
    /// directory, and each source goes under its own name. A directory that does not
    /// exist on a host fails it there, unless --mkdir creates it.
    #[arg(required = true, num_args = 1.., value_name = "PATH")]
    pub paths: Vec<std::path::PathBuf>,
    /// Copy directories: recreate each source directory's tree under DST (files, symbolic
    /// links, empty directories; directory modes and mtimes last).
    #[arg(short, long)]
    pub recursive: bool,
    /// Create the destination directory on every host first (`mkdir -p`): DST when it
    /// ends in `/` or several sources go into it, else the directory DST is in. Without
    /// it a missing directory fails those ranks with "… does not exist".
    #[arg(long)]
    pub mkdir: bool,
    /// What to do with an existing destination: leave it, overwrite it if the source is newer, or overwrite it.
    #[arg(long, value_name = "MODE", default_value = "leave", value_parser = ["leave", "newer", "overwrite"])]
    pub mode: String,
    /// Bytes per chunk sent down the tree.
    #[arg(long, value_name = "BYTES", default_value_t = 1 << 20)]
    pub chunk: usize,
    /// Seconds to wait for the ranks at each step: for their answers to a file's status,
    /// for the tree to take each chunk, and for their answers after the last chunk (plus
    /// 1 s per 32 MiB for flushing to disk). The whole transfer has no limit. Ranks that
    /// miss it (still connected) fail with "no answer within".
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    pub timeout: f64,
    /// Where the back-ends run.
    #[command(flatten)]
    pub tree: TreeArgs,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
    /// No progress bar, even on a terminal.
    #[arg(long)]
    pub quiet: bool,
}
