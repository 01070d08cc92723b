//! [`NetworkBuilder`]: the options of a network, turned into the front-end's launch
//! plan, and the launch itself.

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::RngCore;
use treecast_driver::{drive, lock, Driver, Launching};
use treecast_driver::{env, DEFAULT_MAX_FRAME};
use treecast_filters::FilterRegistry;
use treecast_launch::{LauncherRegistry, SrunOptions, SshOptions};
use treecast_plugin::Plugin;
use treecast_proto::{Command, LivenessLimits, Node, NodeConfig, Role};
use treecast_topology::Topology;
use treecast_transport::mcast::McastConfig;
use treecast_transport::striped::stall::LIMIT_RANGE as STRIPE_STALL_RANGE;
use treecast_transport::Secret;
use treecast_wire::{
    ClockPlan, LaunchPlan, LauncherSpec, LocalRoute, Window, DEFAULT_MAX_CONTROL, MAX_PAYLOAD_LEN,
    SLURM_LAUNCHER, SSH_LAUNCHER,
};

use crate::frontend::{launched, AttachTarget, FeTool};
use crate::{ApiError, Network};

/// Default time each level of the tree may take to start.
const DEFAULT_STARTUP: Duration = Duration::from_secs(30);
/// Default of [`NetworkBuilder::receive_window`]: what the front-end keeps per
/// stream for a tool that does not read (more than enough for 10,000 small packets).
pub const DEFAULT_RECEIVE_WINDOW: Window = Window { packets: 1 << 16, bytes: 64 << 20 };

/// Configures and launches a [`Network`].
#[derive(Debug, Clone)]
pub struct NetworkBuilder {
    topology: Topology,
    backend: Vec<String>,
    env: Vec<(String, String)>,
    startup_timeout: Duration,
    treecast_path: Option<PathBuf>,
    listen: IpAddr,
    unix_links: bool,
    /// How children on other hosts are started (the plan carries it down the tree).
    launcher: LauncherSpec,
    /// The launchers the front-end can make, by name.
    launchers: LauncherRegistry,
    remote_listen: Option<IpAddr>,
    allow_missing: bool,
    attach: Option<(PathBuf, Duration)>,
    receive_window: Window,
    max_frame: usize,
    max_control: usize,
    registry: FilterRegistry,
    plugins: Vec<PathBuf>,
    liveness: Option<LivenessLimits>,
    rejoin: Option<Duration>,
    udp_route: bool,
    stripes: u8,
    mptcp: bool,
    udp_settings: Vec<(String, String)>,
    /// The log filter every process of the tree uses (`TREECAST_LOG`'s syntax).
    log: String,
    /// The global clock's settings, for every node.
    clock: ClockPlan,
    /// Payload size from which frames between processes of one host go as memory files.
    zero_copy_min: Option<usize>,
    /// How long a connection of a striped link may stall while another moves.
    stripe_stall: Option<Duration>,
    rails: Vec<String>,
}

impl NetworkBuilder {
    /// The smallest frame limit ([`NetworkBuilder::max_frame`]): a frame must hold a
    /// file chunk of the default size with its header, and the launch plan of a large tree.
    pub const MIN_MAX_FRAME: usize = crate::DEFAULT_CHUNK + (64 << 10);
    /// The smallest control frame limit ([`NetworkBuilder::max_control`]): a back-end's
    /// join, clock and failure reports must fit in it.
    pub const MIN_MAX_CONTROL: usize = 64 << 10;

    /// A network of the given shape whose back-ends run `treecast backend`.
    pub fn new(topology: Topology) -> Self {
        NetworkBuilder {
            topology,
            backend: Vec::new(),
            env: Vec::new(),
            startup_timeout: DEFAULT_STARTUP,
            treecast_path: None,
            listen: IpAddr::V4(Ipv4Addr::LOCALHOST),
            unix_links: true,
            launcher: LauncherSpec::local(),
            launchers: LauncherRegistry::builtin(),
            remote_listen: None,
            allow_missing: false,
            attach: None,
            receive_window: DEFAULT_RECEIVE_WINDOW,
            max_frame: DEFAULT_MAX_FRAME,
            max_control: DEFAULT_MAX_CONTROL as usize,
            registry: FilterRegistry::builtin(),
            plugins: Vec::new(),
            liveness: Some(LivenessLimits::default()),
            rejoin: Some(env::DEFAULT_REJOIN_WITHIN),
            udp_route: false,
            stripes: 0,
            mptcp: false,
            udp_settings: Vec::new(),
            log: String::new(),
            clock: ClockPlan::default(),
            zero_copy_min: None,
            stripe_stall: None,
            rails: Vec::new(),
        }
    }

    /// The global clock's settings for every node (what `plan` leaves unset keeps its
    /// default; the `treecast` command reads them from `TREECAST_CLOCK_*`).
    pub fn clock(mut self, plan: ClockPlan) -> Self {
        self.clock = plan;
        self
    }

    /// Cuts off a node after `limit` without a frame or heartbeat from it (stopped,
    /// hung, unreachable): its ranks are reported lost, as if it had died, so it stalls
    /// its parent and siblings no longer than that. `None` switches heartbeats and the
    /// check off. Default 30 s (the `treecast` command applies `TREECAST_DEAD_AFTER`).
    ///
    /// A tool's own back-end that blocks its thread (no `.await`) for longer than the
    /// limit sends no heartbeat meanwhile and is cut off: run long computations with
    /// `tokio::task::spawn_blocking` or on a multi-threaded runtime.
    pub fn dead_after(mut self, limit: Option<Duration>) -> Self {
        self.liveness = limit.filter(|d| !d.is_zero()).map(LivenessLimits::for_dead_after);
        self
    }

    /// When a comm node is lost, its children (comm nodes and back-ends) rejoin the
    /// tree under its parent within `limit`: their ranks are reported
    /// [`crate::Event::NodeLost`] at once, [`crate::Event::RanksRejoined`] as they come
    /// back, and [`crate::Event::RanksLost`] if they do not. `None` switches recovery
    /// off (the lost node's sub-tree is lost with it). Default: 10 s (the `treecast`
    /// command applies `TREECAST_REJOIN_WITHIN`).
    pub fn rejoin_within(mut self, limit: Option<Duration>) -> Self {
        self.rejoin = limit.filter(|d| !d.is_zero());
        self
    }

    /// Attach mode: start the comm nodes only, write `file` (mode 0600) with where
    /// each rank connects and the session secret, and wait up to `limit` for
    /// back-ends started by someone else (`BackEnd::attach`, `treecast backend --attach`).
    pub fn attach(mut self, file: impl Into<PathBuf>, limit: Duration) -> Self {
        self.attach = Some((file.into(), limit));
        self
    }

    /// Starts processes on other hosts of the topology with ssh.
    pub fn ssh(mut self, options: SshOptions) -> Self {
        self.launcher = LauncherSpec {
            name: SSH_LAUNCHER.into(),
            program: options.program,
            args: options.args,
            connect_timeout_s: options.connect_timeout,
            remote_path: options.remote_path,
            remote_prefix: options.remote_prefix,
        };
        self
    }

    /// Starts every comm node and back-end as a Slurm job step (`srun`); the
    /// front-end must run inside the allocation.
    pub fn slurm(mut self, options: SrunOptions) -> Self {
        self.launcher = LauncherSpec {
            name: SLURM_LAUNCHER.into(),
            program: options.program,
            args: options.args,
            connect_timeout_s: 0,
            remote_path: options.remote_path,
            remote_prefix: String::new(),
        };
        self
    }

    /// Starts children with the launcher `spec` names (its name in
    /// [`NetworkBuilder::launchers`], and its options): a launcher of the tool's own,
    /// which every comm node must know by the same name
    /// ([`crate::run_comm_node_with_launchers`]). [`NetworkBuilder::ssh`] and
    /// [`NetworkBuilder::slurm`] are this for the built-in ones.
    pub fn launcher(mut self, spec: LauncherSpec) -> Self {
        self.launcher = spec;
        self
    }

    /// The launchers the front-end makes the one [`NetworkBuilder::launcher`] names
    /// from (default: the built-ins, `local`, `ssh`, `slurm`). A new launcher is one
    /// type implementing [`crate::Launcher`] and one
    /// [`LauncherRegistry::register`] call, here and in the tool's comm nodes.
    pub fn launchers(mut self, registry: LauncherRegistry) -> Self {
        self.launchers = registry;
        self
    }

    /// The address processes on other hosts connect back to (default: found from the
    /// route to them; the `treecast` command applies `TREECAST_LISTEN`).
    pub fn remote_listen(mut self, addr: IpAddr) -> Self {
        self.remote_listen = Some(addr);
        self
    }

    /// Starts without the nodes that fail to start; their ranks are reported as
    /// [`crate::Event::RanksLost`] right away instead of failing the launch.
    pub fn allow_missing(mut self, yes: bool) -> Self {
        self.allow_missing = yes;
        self
    }

    /// Runs this program (with arguments) as the back-end instead of `treecast backend`.
    pub fn backend_command(mut self, command: impl IntoIterator<Item = impl Into<String>>) -> Self {
        self.backend = command.into_iter().map(Into::into).collect();
        self
    }

    /// Adds an environment variable for the back-ends.
    pub fn env(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    /// How long each level of the tree may take to start (default 30 s; the `treecast`
    /// command applies `TREECAST_STARTUP_TIMEOUT`).
    pub fn startup_timeout(mut self, limit: Duration) -> Self {
        self.startup_timeout = limit;
        self
    }

    /// The program comm nodes run, as `<program> node`: the `treecast` binary, or this
    /// tool's own program if it calls [`crate::run_comm_node`] when started that way.
    ///
    /// Default: this program if its file is named `treecast`; else a file named
    /// `treecast` in this program's folder or the one above it (where cargo puts a
    /// workspace's examples and tests); else `treecast` on `PATH`, as `execvp` would
    /// find it. `PATH` is the one variable the library reads for a setting (the
    /// system's program search, not a treecast setting; taking it from every caller
    /// would only move the same lookup into each of them). The library reads no
    /// `TREECAST_PATH`: the `treecast` command and the C API apply it here; a Rust
    /// tool that wants it reads it itself.
    /// [`NetworkBuilder::launch`] fails with [`ApiError::NoBinary`] when none is found.
    pub fn treecast_path(mut self, path: impl Into<PathBuf>) -> Self {
        self.treecast_path = Some(path.into());
        self
    }

    /// Address the front-end and comm nodes listen on for TCP links within one host (default 127.0.0.1).
    pub fn listen(mut self, addr: IpAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Links processes of this host through Unix sockets (`true`, the default; the
    /// `treecast` command applies `TREECAST_ROUTE=tcp`) or through TCP on the listen address.
    pub fn unix_links(mut self, yes: bool) -> Self {
        self.unix_links = yes;
        self
    }

    /// What the front-end keeps per stream for the tool before it holds the tree back
    /// (default [`DEFAULT_RECEIVE_WINDOW`]). A tool that sends more than this on a
    /// stream before reading it waits in `send` until it reads.
    pub fn receive_window(mut self, window: Window) -> Self {
        self.receive_window = window;
        self
    }

    /// Largest frame payload any node accepts (default 64 MiB and 64 KiB; the `treecast`
    /// command applies `TREECAST_MAX_FRAME`); a peer sending a larger frame loses its link.
    /// [`NetworkBuilder::launch`] refuses a limit below [`NetworkBuilder::MIN_MAX_FRAME`].
    pub fn max_frame(mut self, bytes: usize) -> Self {
        self.max_frame = bytes.clamp(1, MAX_PAYLOAD_LEN);
        self
    }

    /// Largest control frame a child may send its parent, in bytes per back-end the
    /// child reaches (default 4 MiB; the `treecast` command applies
    /// `TREECAST_MAX_CONTROL`); a child sending a larger one loses its link, so that
    /// what a parent buffers for a child grows with the child's sub-tree, not up to
    /// the frame limit. [`NetworkBuilder::launch`] refuses a limit below
    /// [`NetworkBuilder::MIN_MAX_CONTROL`].
    pub fn max_control(mut self, bytes: usize) -> Self {
        self.max_control = bytes.clamp(1, MAX_PAYLOAD_LEN);
        self
    }

    /// Sends payloads of at least `bytes` bytes between processes of one host as
    /// sealed memory files instead of through their socket, in every process of the
    /// tree (default `None`: never, the socket was faster wherever it was measured;
    /// docs/processes.md). The `treecast` command applies `TREECAST_ZERO_COPY_MIN`.
    pub fn zero_copy_min(mut self, bytes: Option<usize>) -> Self {
        self.zero_copy_min = bytes;
        self
    }

    /// The filters this front-end can make (default: the built-ins).
    pub fn filters(mut self, registry: FilterRegistry) -> Self {
        self.registry = registry;
        self
    }

    /// Loads the plug-in filter (a shared object, docs/filter-abi.md) at `path` when
    /// the network launches, registers it with this front-end's filters under its own
    /// name and version, and has every comm node load it from the same path (the
    /// launch plan names it), so streams can use it at every level. Repeat for more.
    pub fn plugin(mut self, path: impl Into<PathBuf>) -> Self {
        self.plugins.push(path.into());
        self
    }

    /// Sends large downstream frames (multicasts, file chunks) by reliable UDP
    /// multicast from each node to its children on its subnet, one datagram for all
    /// of them, instead of once over each child's link (docs/multicast.md). The
    /// [`NetworkBuilder::udp_setting`] sets the protocol for every node (the `treecast`
    /// command applies this process's `TREECAST_UDP_*` variables).
    pub fn udp_route(mut self, yes: bool) -> Self {
        self.udp_route = yes;
        self
    }

    /// Carries every link of the tree over `n` connections to the same peer (a
    /// striped link: large frames cut across them, a failed one's share sent on
    /// the others; docs/routes.md); 0 or 1: one connection. At most 16.
    pub fn stripes(mut self, n: u8) -> Self {
        self.stripes = n.min(treecast_wire::MAX_STRIPES);
        self
    }

    /// Gives up a connection of a striped link ([`NetworkBuilder::stripes`]) that held
    /// bytes this long without delivering any while another connection of the link
    /// moved (a rail brought down), at every node; default 5 s (docs/routes.md). The
    /// `treecast` command reads it from `TREECAST_STRIPE_STALL`.
    pub fn stripe_stall(mut self, limit: Duration) -> Self {
        self.stripe_stall = Some(limit);
        self
    }

    /// Spreads the connections of every striped link ([`NetworkBuilder::stripes`])
    /// over these rails, connection `i` on rail `i` modulo their number: each an IP
    /// subnet (`10.1.0.0/16`) or an interface name (`ib1`) that every host of the tree
    /// has. Each node listens for children on other hosts on its own address on each
    /// rail and hands them all (docs/routes.md); without rails, one address. At most
    /// 16. The `treecast` command reads them from `TREECAST_RAILS` (comma-separated).
    pub fn rails<S: Into<String>>(mut self, rails: impl IntoIterator<Item = S>) -> Self {
        self.rails = rails.into_iter().map(Into::into).collect();
        self
    }

    /// Opens the tree's TCP links by Multipath TCP, plain TCP where the kernel
    /// refuses it (logged once; docs/routes.md).
    pub fn mptcp(mut self, yes: bool) -> Self {
        self.mptcp = yes;
        self
    }

    /// Sets one `TREECAST_UDP_*` setting of the UDP route for every node
    /// (docs/multicast.md lists them).
    pub fn udp_setting(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        let name = name.into();
        self.udp_settings.retain(|(k, _)| *k != name);
        self.udp_settings.push((name, value.into()));
        self
    }

    /// The log filter of every process of the tree (`TREECAST_LOG`'s syntax, e.g.
    /// `debug` or `treecast_proto=trace`); empty, the default, logs warnings.
    pub fn log_filter(mut self, filter: impl Into<String>) -> Self {
        self.log = filter.into();
        self
    }

    /// The UDP route's settings, as [`NetworkBuilder::udp_setting`] gave them.
    fn udp_settings(&self) -> Vec<(String, String)> {
        self.udp_settings.clone()
    }

    /// Refuses rails that do not parse, too many, or rails this host has no address
    /// on when it has children on other hosts to reach over them (each comm node
    /// checks its own when it starts its children).
    fn check_rails(&self) -> Result<(), ApiError> {
        let refuse = |reason: String| {
            ApiError::Env(format!(
                "{reason} (NetworkBuilder::rails, tc_network_options_set_rails or TREECAST_RAILS)"
            ))
        };
        treecast_transport::striped::rails::check_rails(&self.rails).map_err(|e| refuse(e.to_string()))?;
        if let (false, true, Some(ip)) =
            (self.rails.is_empty(), self.stripes > 1 && !self.mptcp, self.remote_listen)
        {
            tracing::warn!(
                "the remote listen address {ip} (TREECAST_LISTEN) is not used: with rails, each node \
                 listens for children on other hosts on its own address on each rail"
            );
        }
        if !self.rails.is_empty() && (self.stripes < 2 || self.mptcp) {
            tracing::warn!(
                "{} rails are named but the links are not striped (--route striped:N): each link \
                 uses one address",
                self.rails.len()
            );
        }
        Ok(())
    }

    fn plan(&self, session: &str) -> LaunchPlan {
        let ms = |d: Duration| d.as_millis().clamp(1, u128::from(u32::MAX)) as u32;
        let mut plan = LaunchPlan::local(session, self.topology.to_mrnet(), self.topology.backends() as u32);
        plan.backend = self.backend.clone();
        plan.env = self.env.clone();
        plan.startup_timeout_ms = ms(self.startup_timeout);
        plan.attach_ms = self.attach.as_ref().map_or(0, |(_, limit)| ms(*limit));
        plan.allow_missing = self.allow_missing;
        plan.local_route = if self.unix_links { LocalRoute::Unix } else { LocalRoute::Tcp };
        plan.listen = self.listen.to_string();
        plan.remote_listen = self.remote_listen.map(|ip| ip.to_string()).unwrap_or_default();
        plan.launcher = self.launcher.clone();
        plan.max_frame = self.max_frame as u32;
        plan.max_control = self.max_control as u32;
        plan.log = self.log.clone();
        let ms = |d: Duration| u32::try_from(d.as_millis()).unwrap_or(u32::MAX).max(1);
        (plan.heartbeat_ms, plan.dead_after_ms) =
            self.liveness.map_or((0, 0), |l| (ms(l.heartbeat), ms(l.dead_after)));
        plan.rejoin_ms = self.rejoin.map_or(0, ms);
        plan.udp = self.udp_route.then(|| self.udp_settings());
        plan.stripes = self.stripes;
        plan.mptcp = self.mptcp;
        plan.clock = self.clock.clone();
        plan.zero_copy_min = self.zero_copy_min.map_or(0, |n| n.clamp(1, u32::MAX as usize) as u32);
        plan.stripe_stall_ms = self.stripe_stall.map_or(0, ms);
        plan.rails = self.rails.clone();
        plan
    }

    /// Starts every comm node and back-end and waits until all have reported.
    ///
    /// # Errors
    /// An empty topology, a missing `treecast` binary, an attach file that cannot be
    /// written, or a node that failed to start (named, with its host and stderr).
    /// Nothing is left running.
    ///
    /// Cancel safety: not cancel safe; processes already started are killed when dropped.
    pub async fn launch(self) -> Result<Network, ApiError> {
        let backends = self.topology.backends();
        if backends == 0 {
            return Err(ApiError::NoBackends);
        }
        if !(Self::MIN_MAX_FRAME..=MAX_PAYLOAD_LEN).contains(&self.max_frame) {
            return Err(ApiError::Env(format!(
                "a frame limit of {} bytes is not from {} to {MAX_PAYLOAD_LEN}: every frame, a file chunk or \
                 the launch plan, must fit in it (default {DEFAULT_MAX_FRAME})",
                self.max_frame,
                Self::MIN_MAX_FRAME
            )));
        }
        if !(Self::MIN_MAX_CONTROL..=MAX_PAYLOAD_LEN).contains(&self.max_control) {
            return Err(ApiError::Env(format!(
                "a control frame limit of {} bytes per back-end is not from {} to {MAX_PAYLOAD_LEN} \
                 (default {DEFAULT_MAX_CONTROL})",
                self.max_control,
                Self::MIN_MAX_CONTROL
            )));
        }
        if let Some(limit) = self.stripe_stall.filter(|l| !STRIPE_STALL_RANGE.contains(l)) {
            return Err(ApiError::Env(format!(
                "a stripe stall limit of {limit:?} is not from {:?} to {:?} (default {:?}; set by \
                 NetworkBuilder::stripe_stall, tc_network_options_set_stripe_stall or TREECAST_STRIPE_STALL)",
                STRIPE_STALL_RANGE.start(),
                STRIPE_STALL_RANGE.end(),
                treecast_transport::striped::stall::DEFAULT_LIMIT
            )));
        }
        self.check_rails()?;
        if !self.log.is_empty() {
            // Every process of the tree refuses a filter that does not parse: refused
            // here, before one starts.
            tracing_subscriber::EnvFilter::try_new(&self.log).map_err(|e| {
                ApiError::Env(format!(
                    "the log filter {:?} (NetworkBuilder::log_filter) does not parse ({e}): give one \
                     as TREECAST_LOG takes it, e.g. \"info\" or \"treecast_driver=debug\"",
                    self.log
                ))
            })?;
        }
        if self.udp_route {
            // Refused here, once, rather than by every node of the tree.
            let settings = self.udp_settings();
            McastConfig::from_env(|k| settings.iter().find(|(s, _)| s == k).map(|(_, v)| v.clone()))
                .map_err(|e| ApiError::Env(e.to_string()))?;
        }
        // Made here once first: a name the front-end does not know stops the launch
        // before a process starts (each comm node makes its own from the plan).
        self.launchers.make(&self.launcher)?;
        let exe = resolve_treecast(self.treecast_path.as_deref())?;
        // Loaded here first: a plug-in the front-end cannot load is refused before a
        // process starts. Comm nodes get whole paths, whatever their working folder.
        let mut registry = self.registry.clone();
        let mut plugin_paths = Vec::with_capacity(self.plugins.len());
        for path in &self.plugins {
            let full = std::path::absolute(path).unwrap_or_else(|_| path.clone());
            Plugin::load(&full)?.register(&mut registry);
            plugin_paths.push(full.to_string_lossy().into_owned());
        }
        let mut session = [0u8; 8];
        rand::rngs::OsRng.fill_bytes(&mut session);
        let session = hex::encode(session);
        let secret = Secret::generate();
        let mut plan = self.plan(&session);
        plan.filters = plugin_paths;
        let attach = self.attach.as_ref().map(|(path, _)| AttachTarget {
            path: path.clone(),
            session: session.clone(),
            secret: secret.clone(),
            size: backends as u32,
        });
        let (tool, lost) = FeTool::new(attach, session.clone(), secret.clone());
        let mut core = Node::new(NodeConfig {
            role: Role::FrontEnd,
            node_id: 0,
            name: "front-end".into(),
            registry,
            tool_window: self.receive_window,
        });
        // The schedule's settings come with the plan.
        core.set_clock(env::system_clock(), treecast_proto::ClockConfig::default());
        let launching = Launching::new(secret, exe).with_launchers(self.launchers.clone());
        let shared = Arc::new(Mutex::new(Driver::new(core, tool, launching, self.max_frame)));
        let task = tokio::spawn(drive(shared.clone()));
        let started = Instant::now();
        let started_launch = lock(&shared).command(Command::Launch(Box::new(plan)));
        let outcome = match started_launch {
            Ok(()) => launched(&shared).await,
            Err(e) => Err(ApiError::Refused(Box::new(e))),
        };
        match outcome {
            Ok(done) => {
                let carried = crate::network::Carried { udp: self.udp_route, stripes: self.stripes };
                let mut net =
                    Network::new(shared, task, self.topology, session, done, started.elapsed(), lost);
                net.carried = carried;
                Ok(net)
            }
            Err(e) => {
                // Take down whatever started, and wait for it: nothing is left running.
                let _ = lock(&shared).command(Command::Shutdown);
                let limit = treecast_driver::SHUTDOWN_GRACE + Duration::from_secs(3);
                if tokio::time::timeout(limit, task).await.is_err() {
                    lock(&shared).kill_children();
                }
                // Dropping the front-end's state removes an attach file it wrote.
                Err(e)
            }
        }
    }
}

/// The program comm nodes run: see [`NetworkBuilder::treecast_path`].
fn resolve_treecast(explicit: Option<&Path>) -> Result<PathBuf, ApiError> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let me = std::env::current_exe().map_err(|e| {
        ApiError::NoBinary(format!("none was named, and this program's own path is unknown ({e})"))
    })?;
    find_treecast(&me, std::env::var_os("PATH").as_deref())
}

/// Looks for `treecast` where [`NetworkBuilder::treecast_path`] says, for the program
/// at `me`, given the value of `PATH`.
fn find_treecast(me: &Path, path: Option<&std::ffi::OsStr>) -> Result<PathBuf, ApiError> {
    if me.file_name().is_some_and(|n| n == "treecast") {
        return Ok(me.to_path_buf());
    }
    // An example or test binary of this workspace: target/<profile>/{examples,deps}/x.
    let near: Vec<&Path> = me.ancestors().skip(1).take(2).collect();
    let on_path = path.map(|p| std::env::split_paths(p).collect::<Vec<_>>()).unwrap_or_default();
    let dirs = near.iter().copied().chain(on_path.iter().map(PathBuf::as_path));
    if let Some(found) = dirs.map(|d| d.join("treecast")).find(|c| c.is_file()) {
        return Ok(found);
    }
    let near: Vec<String> = near.iter().map(|d| d.display().to_string()).collect();
    Err(ApiError::NoBinary(format!(
        "none was named, this program ({}) is not named treecast, and no file named treecast \
         is in {} or on PATH",
        me.display(),
        near.join(" or ")
    )))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_treecast_binary_is_found_beside_the_program_or_on_path_and_a_miss_says_what_to_do() {
        let dir = tempfile::tempdir().unwrap();
        let bin = dir.path().join("target/debug");
        std::fs::create_dir_all(bin.join("examples")).unwrap();
        let me = bin.join("examples/tool");
        let elsewhere = dir.path().join("bin");
        std::fs::create_dir_all(&elsewhere).unwrap();

        let err = find_treecast(&me, Some(elsewhere.as_os_str())).unwrap_err();
        // What `main() -> Result<(), Box<dyn Error>>` prints is the Debug form: it must
        // carry the hint, not `NoBinary("…")`.
        let shown = format!("{err:?}");
        assert!(shown.starts_with("cannot find the treecast binary that comm nodes run"), "{shown}");
        assert!(shown.contains(&format!("this program ({})", me.display())), "{shown}");
        assert!(shown.contains(&bin.join("examples").display().to_string()), "{shown}");
        assert!(
            shown.contains("NetworkBuilder::treecast_path") && shown.contains("run_comm_node"),
            "{shown}"
        );
        assert_eq!(shown, err.to_string());

        std::fs::write(elsewhere.join("treecast"), "").unwrap();
        let found = find_treecast(&me, Some(elsewhere.as_os_str())).unwrap();
        assert_eq!(found, elsewhere.join("treecast"));
        std::fs::write(bin.join("treecast"), "").unwrap();
        assert_eq!(find_treecast(&me, None).unwrap(), bin.join("treecast"), "beside comes first");
        let named = dir.path().join("treecast");
        assert_eq!(find_treecast(&named, None).unwrap(), named, "a program named treecast is its own");
    }

    /// What every process of the tree would refuse is refused before one starts.
    #[tokio::test]
    async fn a_log_filter_or_launcher_name_the_tree_would_refuse_stops_the_launch_first() {
        let topo = || Topology::from_spec("flat", Some(1)).unwrap();
        let e = NetworkBuilder::new(topo()).log_filter("info,[{").launch().await.unwrap_err().to_string();
        assert!(e.contains("log filter") && e.contains("NetworkBuilder::log_filter"), "{e}");
        let long = "x".repeat(treecast_wire::MAX_LAUNCHER_NAME + 1);
        let mut launchers = LauncherRegistry::builtin();
        launchers.register(long.clone(), |_| Ok(std::sync::Arc::new(treecast_launch::LocalLauncher)));
        let spec = LauncherSpec::named(long);
        let e = NetworkBuilder::new(topo()).launchers(launchers).launcher(spec).launch().await.unwrap_err();
        assert!(e.to_string().contains("1 to 64 bytes"), "{e}");
    }
}
