//! Starting a node's children, beside its driver: listeners, processes, handshakes.
//!
//! The task opens the listeners the children connect to, starts their processes
//! through a [`Launcher`], authenticates every connection and hands each link to
//! the driver with the node id it proved. It reports every process that ends, and
//! stops processes when told (a child given up on, the node shutting down). The
//! protocol decisions (who is expected, deadlines, what a failure means) are the
//! core's; this task only does the I/O.

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use tokio::sync::{mpsc, oneshot};
use tokio::task::{AbortHandle, JoinSet};
use treecast_launch::{Launched, Launcher, LocalHosts, LocalLauncher, ProcessSpec};
use treecast_transport::announce::{Announce, JoinSocket};
use treecast_transport::handshake::Accepted;
use treecast_transport::striped::Rails;
use treecast_transport::{handshake, Listener, Secret, Socket, TransportError, SECRET_ENV};
use treecast_wire::{AttachPoint, LaunchPlan, LocalRoute};

use super::launching::Launching;
use super::refusals::Refusals;
use crate::{env, NodeError};
use treecast_proto::ChildLaunch;

/// Handshakes under way a listener admits while `awaited` of this node's children have
/// not linked yet: one place for each of them, and [`MAX_PENDING_HANDSHAKES`] more
/// (strangers, children that retry). A node with more children than the margin
/// (kary:32 at 10,000 back-ends, a flat tree of 1,000) must not turn its own children
/// away as a flood while they all connect at once; strangers still hold at most this
/// many places, a number the plan sets and not they.
fn admission_capacity(awaited: usize) -> usize {
    MAX_PENDING_HANDSHAKES.saturating_add(awaited)
}

/// Time allowed for one handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// Handshakes a listener runs at once beyond the children it still expects; a new
/// connection past [`admission_capacity`] closes the oldest one still under way.
/// Bounds the descriptors and memory strangers can hold.
const MAX_PENDING_HANDSHAKES: usize = 64;
/// Time a retired child has to exit on its own before it is killed.
const RETIRE_GRACE: Duration = Duration::from_secs(2);
/// Time a dead child's stderr gets to drain before it is reported.
const STDERR_DRAIN: Duration = Duration::from_millis(20);

/// What the task tells the driver.
#[derive(Debug)]
pub(crate) enum ChildNews {
    /// A child proved its node id; its link is ready.
    Connected {
        /// The id it proved.
        node_id: u32,
        /// Its connections: one, or those of a striped link.
        sockets: Vec<Socket>,
        /// Who it is, for logs.
        peer: String,
    },
    /// A spawned back-end announced itself (a light join): it counts as joined,
    /// and its link follows with [`ChildNews::Connected`].
    Announced {
        /// The node id it was started as.
        node_id: u32,
        /// Its rank.
        rank: u32,
    },
    /// A child's process ended.
    Exited {
        /// Its node id.
        node_id: u32,
        /// How: exit status and the end of its stderr.
        detail: String,
    },
    /// A child could not be started at all.
    NotStarted {
        /// Its node id.
        node_id: u32,
        /// Why: no listener, no launcher, the launcher's error.
        reason: String,
    },
    /// Attach mode: where this node's own back-end slots connect.
    AttachPoints(Vec<AttachPoint>),
}

/// What the driver tells the task.
#[derive(Debug)]
pub(crate) enum ChildOrder {
    /// Stop this child's process.
    Abandon(u32),
    /// This child was told to shut down: stop its process if it has not exited
    /// within [`RETIRE_GRACE`].
    Retire(u32),
    /// Every child is linked: stop listening.
    StopAccepting,
    /// Start more children (adopted while the tree runs).
    Start(Vec<ChildLaunch>),
    /// The node is over: give the processes `grace` to exit, then kill them.
    Shutdown {
        /// How long to wait.
        grace: Duration,
    },
}

/// The task's inputs.
pub(crate) struct ChildrenTask {
    pub(crate) plan: Arc<LaunchPlan>,
    pub(crate) own_host: String,
    pub(crate) children: Vec<ChildLaunch>,
    pub(crate) launching: Launching,
    /// Which children's hosts are this machine, resolved once per name.
    pub(crate) local_hosts: LocalHosts,
    pub(crate) news: mpsc::Sender<ChildNews>,
    pub(crate) orders: mpsc::UnboundedReceiver<ChildOrder>,
}

/// One running child process, watched by a task of its own.
struct Watched {
    node_id: u32,
    stop: Option<oneshot::Sender<()>>,
}

/// What the task keeps while the node runs.
struct Running {
    /// Built once from the plan: it starts the children on other hosts (and, for
    /// Slurm, on this one).
    launcher: Arc<dyn Launcher>,
    listeners: Option<Listeners>,
    /// One task per process; dropping the set kills them all.
    processes: JoinSet<()>,
    watched: Vec<Watched>,
    /// Timers that stop retired children which outstay [`RETIRE_GRACE`]; never
    /// awaited (dropping one stops its child at once).
    retiring: JoinSet<()>,
    /// Where light-joining children announce themselves, once one was started.
    join: Option<JoinSocket>,
    /// Light-joining children not heard from yet: node id to rank.
    announcing: HashMap<u32, u32>,
    /// Children started (or waiting to attach) whose link is not up yet: each has a
    /// place among the handshakes under way ([`admission_capacity`]).
    awaited: HashSet<u32>,
}

impl Running {
    /// Stops one child's process.
    fn stop(&mut self, node_id: u32) {
        self.awaited.remove(&node_id);
        if let Some(stop) = self.watched.iter_mut().find(|w| w.node_id == node_id).and_then(|w| w.stop.take())
        {
            let _ = stop.send(());
        }
    }

    /// Stops one child's process unless it exits within [`RETIRE_GRACE`].
    fn retire(&mut self, node_id: u32) {
        if let Some(stop) = self.watched.iter_mut().find(|w| w.node_id == node_id).and_then(|w| w.stop.take())
        {
            // A process gone by then ignores it.
            self.retiring.spawn(async move {
                tokio::time::sleep(RETIRE_GRACE).await;
                let _ = stop.send(());
            });
        }
    }

    /// Gives the processes `grace` to exit, then kills what is left.
    async fn shut_down(mut self, grace: Duration) {
        let _ =
            tokio::time::timeout(grace, async { while self.processes.join_next().await.is_some() {} }).await;
        for w in &mut self.watched {
            if let Some(stop) = w.stop.take() {
                let _ = stop.send(());
            }
        }
        let limit = Duration::from_secs(2);
        let _ =
            tokio::time::timeout(limit, async { while self.processes.join_next().await.is_some() {} }).await;
    }
}

impl ChildrenTask {
    /// Runs until the node shuts down (or the driver is gone).
    ///
    /// Cancel safety: aborting it kills every process it started.
    pub(crate) async fn run(mut self) {
        let launcher = match self.launching.launchers.make(&self.plan.launcher) {
            Ok(l) => l,
            Err(e) => return self.fail_all(&e.to_string()).await,
        };
        let mut running = Running {
            launcher,
            listeners: None,
            processes: JoinSet::new(),
            watched: Vec::new(),
            retiring: JoinSet::new(),
            join: None,
            announcing: HashMap::new(),
            awaited: HashSet::new(),
        };
        let children = std::mem::take(&mut self.children);
        let own_points = self.start(&mut running, children).await;
        if self.plan.attach_ms > 0 {
            let _ = self.news.send(ChildNews::AttachPoints(own_points)).await;
        }
        self.serve(running).await;
    }

    /// True when `host` is started with fork/exec: any name of this machine, unless the
    /// launcher starts every process itself (Slurm steps, so the allocation owns them).
    /// Names were resolved by [`ChildrenTask::resolve_hosts`].
    /// Hosts are compared without their `user@`, which only tells ssh whom to log in as.
    fn is_local(&self, launcher: &dyn Launcher, host: &str) -> bool {
        use treecast_topology::hostlist::bare_host;
        !launcher.takes_local_hosts()
            && (bare_host(host) == bare_host(&self.own_host)
                || self.local_hosts.cached(host).unwrap_or(false))
    }

    /// Finds out, off the async threads, which of the children's hosts are this machine
    /// (all names at once). Not needed when the launcher starts every process itself.
    async fn resolve_hosts(&mut self, children: &[ChildLaunch], launcher: &dyn Launcher) {
        use treecast_topology::hostlist::bare_host;
        if launcher.takes_local_hosts() {
            return;
        }
        let own = bare_host(&self.own_host).to_owned();
        let names: Vec<String> =
            children.iter().filter(|c| bare_host(&c.host) != own).map(|c| c.host.clone()).collect();
        if names.is_empty() {
            return;
        }
        let mut hosts = std::mem::take(&mut self.local_hosts);
        let resolved = tokio::task::spawn_blocking(move || {
            hosts.resolve_all(names.iter().map(String::as_str));
            hosts
        })
        .await;
        // A resolver thread that panicked leaves the names unknown: they go to the launcher.
        self.local_hosts = resolved.unwrap_or_default();
    }

    /// Opens the listeners `children` need (unless open) and starts their processes;
    /// returns where the attach-mode ones connect.
    async fn start(&mut self, running: &mut Running, children: Vec<ChildLaunch>) -> Vec<AttachPoint> {
        let launcher = Arc::clone(&running.launcher);
        self.resolve_hosts(&children, launcher.as_ref()).await;
        let is_local = |h: &str| self.is_local(launcher.as_ref(), h);
        let opened =
            Listeners::ensure(&mut running.listeners, &self.plan, &children, &is_local, launcher.as_ref())
                .await;
        if let Err(e) = opened {
            for child in children {
                self.not_started(child.node_id, e.to_string()).await;
            }
            return Vec::new();
        }
        let mut own_points = Vec::new();
        for child in children {
            let local = self.is_local(launcher.as_ref(), &child.host);
            let address = match running.listeners.as_ref().map(|l| l.address_for(local)) {
                Some(Ok(a)) => a,
                Some(Err(e)) => {
                    self.not_started(child.node_id, e.to_string()).await;
                    continue;
                }
                None => continue,
            };
            running.awaited.insert(child.node_id);
            if child.attach {
                // Back-ends started by someone else connect with one plain link.
                let address = first_address(&address).to_owned();
                own_points.push(AttachPoint { rank: child.first_rank, node_id: child.node_id, address });
                continue;
            }
            let announce = match local && child.spawned.as_ref().is_some_and(|o| o.light) {
                true => join_address(running, self.plan.local_route),
                false => None,
            };
            let mut spec = self.process_spec(&child, address, local, launcher.as_ref());
            if let Some(address) = announce {
                spec.env.push((env::JOIN_ANNOUNCE.to_owned(), address));
                running.announcing.insert(child.node_id, child.first_rank);
            }
            let started = match local {
                true => LocalLauncher.launch(&spec),
                false => launcher.launch(&spec),
            };
            match started {
                Ok(process) => {
                    let w = self.watch(&mut running.processes, child.node_id, process);
                    running.watched.push(w);
                }
                Err(e) => {
                    running.announcing.remove(&child.node_id);
                    running.awaited.remove(&child.node_id);
                    // The core's report names the child and its host already.
                    self.not_started(child.node_id, e.reason()).await;
                }
            }
        }
        own_points
    }

    /// Reports every child failed for one reason (no listener, no launcher).
    async fn fail_all(&mut self, reason: &str) {
        for child in std::mem::take(&mut self.children) {
            self.not_started(child.node_id, reason.to_owned()).await;
        }
        while let Some(order) = self.orders.recv().await {
            if matches!(order, ChildOrder::Shutdown { .. }) {
                return;
            }
        }
    }

    async fn not_started(&self, node_id: u32, reason: String) {
        let _ = self.news.send(ChildNews::NotStarted { node_id, reason }).await;
    }

    /// Watches a process: reports its end, stops it when told. Dropping the set kills it.
    fn watch(&self, set: &mut JoinSet<()>, node_id: u32, mut process: Launched) -> Watched {
        let (stop, mut stopped) = oneshot::channel();
        let news = self.news.clone();
        set.spawn(async move {
            tokio::select! {
                status = process.wait() => {
                    tokio::time::sleep(STDERR_DRAIN).await;
                    let mut detail = status;
                    let tail = process.stderr_tail();
                    if !tail.trim().is_empty() {
                        detail.push_str(&format!("; its stderr:\n{tail}"));
                    }
                    let _ = news.send(ChildNews::Exited { node_id, detail }).await;
                }
                _ = &mut stopped => process.kill().await,
            }
        });
        Watched { node_id, stop: Some(stop) }
    }

    /// Accepts links and follows orders until the node shuts down.
    async fn serve(&mut self, mut running: Running) {
        let mut handshakes = JoinSet::new();
        // Oldest first: a flood of silent peers pushes out its own oldest members,
        // while a real child's handshake takes one round trip.
        let mut pending: VecDeque<(oneshot::Sender<()>, AbortHandle)> = VecDeque::new();
        let mut refusals = Refusals::connections();
        let mut refused_announcements = Refusals::announcements();
        let mut accept_failures = Refusals::accepts();
        let mut rails = Rails::default();
        loop {
            tokio::select! {
                accepted = accept(running.listeners.as_ref()) => match accepted {
                    Ok((mut stream, peer)) => {
                        pending.retain(|(_, h)| !h.is_finished());
                        // A child on striped links makes one handshake per connection.
                        let per_child = usize::from(self.plan.stripes.max(1));
                        if pending.len() >= admission_capacity(running.awaited.len() * per_child) {
                            if let Some((evict, _)) = pending.pop_front() {
                                let _ = evict.send(());
                            }
                        }
                        let secret = self.launching.secret.clone();
                        let (evict, evicted) = oneshot::channel::<()>();
                        let handle = handshakes.spawn(async move {
                            let id = tokio::select! {
                                id = handshake::accept_any(&mut stream, &secret, &peer, HANDSHAKE_LIMIT) => id,
                                Ok(()) = evicted => {
                                    handshake::turn_away(&mut stream).await;
                                    Err(TransportError::Busy { peer: peer.clone() })
                                }
                            };
                            (id, stream, peer)
                        });
                        pending.push_back((evict, handle));
                    }
                    Err(e) => {
                        // Out of descriptors or an aborted connection: not fatal for the others.
                        if let Some(line) = accept_failures.refused(e.to_string(), Instant::now()) {
                            tracing::warn!("{line}");
                        }
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                },
                Some(done) = handshakes.join_next() => {
                    let Ok((result, stream, peer)) = done else { continue };
                    let linked = result
                        .map_err(|e| match e {
                            TransportError::Busy { .. } => {
                                "no handshake before newer connections needed its place".to_owned()
                            }
                            other => other.to_string(),
                        })
                        .and_then(|id| Ok((id, stream.into_socket().map_err(|e| e.to_string())?)));
                    // A striped link's connections wait here until the last one comes.
                    rails.expire(Instant::now() - HANDSHAKE_LIMIT);
                    let linked = linked.map(|(accepted, socket)| match accepted {
                        Accepted::Link { node_id } => (node_id, Some(vec![socket])),
                        Accepted::Rail { node_id, token, index, count } => {
                            (node_id, rails.arrived((node_id, token), (index, count), socket, Instant::now()))
                        }
                    });
                    match linked {
                        Ok((_, None)) => {}
                        Ok((node_id, Some(sockets))) => {
                            running.awaited.remove(&node_id);
                            if self.news.send(ChildNews::Connected { node_id, sockets, peer }).await.is_err() {
                                return;
                            }
                        }
                        Err(reason) => {
                            if let Some(line) = refusals.refused(format!("{peer}: {reason}"), Instant::now()) {
                                tracing::warn!("{line}");
                            }
                        }
                    }
                }
                heard = recv_announce(running.join.as_ref(), &self.launching.secret) => {
                    // A socket that fails to read would fail again at once: as with accept, wait.
                    let failed = matches!(heard, Err(TransportError::Io { .. }));
                    let taken = heard.map_err(|e| e.to_string()).and_then(|a| take_announce(&mut running, a));
                    match taken {
                        Ok(Announce { node_id, rank }) => {
                            if self.news.send(ChildNews::Announced { node_id, rank }).await.is_err() {
                                return;
                            }
                        }
                        Err(reason) => {
                            if let Some(line) = refused_announcements.refused(reason, Instant::now()) {
                                tracing::warn!("{line}");
                            }
                            if failed {
                                tokio::time::sleep(Duration::from_millis(50)).await;
                            }
                        }
                    }
                }
                Some(_) = running.processes.join_next() => {}
                Some(_) = running.retiring.join_next() => {}
                order = self.orders.recv() => match order {
                    Some(ChildOrder::Abandon(node_id)) => {
                        running.announcing.remove(&node_id);
                        running.stop(node_id);
                    }
                    Some(ChildOrder::Retire(node_id)) => {
                        running.announcing.remove(&node_id);
                        running.retire(node_id);
                    }
                    Some(ChildOrder::StopAccepting) => {
                        running.listeners = None;
                        // Handshakes still under way are strangers' now: every child is linked.
                        handshakes.abort_all();
                        pending.clear();
                        if let Some(line) = refusals.flush(Instant::now()) {
                            tracing::warn!("{line}");
                        }
                    }
                    Some(ChildOrder::Start(children)) => {
                        let attach = children.iter().any(|c| c.attach);
                        let points = self.start(&mut running, children).await;
                        if attach && !points.is_empty() {
                            let _ = self.news.send(ChildNews::AttachPoints(points)).await;
                        }
                    }
                    Some(ChildOrder::Shutdown { grace }) => return running.shut_down(grace).await,
                    // The driver is gone: dropping the set kills every process.
                    None => return,
                },
            }
        }
    }

    /// What to run for a child, with its environment (the secret apart).
    fn process_spec(
        &self,
        child: &ChildLaunch,
        parent: String,
        local: bool,
        launcher: &dyn Launcher,
    ) -> ProcessSpec {
        let plan = &self.plan;
        let mrnet_args = || {
            mrnet_backend_args(
                first_address(&parent),
                &self.own_host,
                plan.node_id,
                &child.host,
                child.first_rank,
            )
        };
        let mut envs = vec![
            (env::PARENT.to_owned(), crate::join::child_parent_address(plan, parent.clone())),
            (env::NODE_ID.to_owned(), child.node_id.to_string()),
            (env::SESSION.to_owned(), plan.session.clone()),
        ];
        if !plan.log.is_empty() {
            envs.push((env::LOG.to_owned(), plan.log.clone()));
        }
        let exe = match (launcher.reaches_other_hosts(), local) {
            (true, false) => PathBuf::from(launcher.remote_path()),
            _ => self.launching.treecast_exe.clone(),
        };
        let (program, args) = if child.is_backend {
            // For the back-end's command to read (scripts use $TREECAST_RANK): the
            // back-end itself takes who it is from its member plan.
            envs.push((env::RANK.to_owned(), child.first_rank.to_string()));
            let mut command = &plan.backend;
            match &child.spawned {
                Some(order) => {
                    envs.push((env::SIZE.to_owned(), order.size.to_string()));
                    envs.push((env::GROUP.to_owned(), order.group.to_string()));
                    let group_rank = child.first_rank.saturating_sub(order.group_first);
                    envs.push((env::GROUP_RANK.to_owned(), group_rank.to_string()));
                    envs.push((env::GROUP_SIZE.to_owned(), order.group_size.to_string()));
                    if !order.command.is_empty() {
                        command = &order.command;
                    }
                }
                None => envs.push((env::SIZE.to_owned(), plan.total_backends.to_string())),
            }
            envs.extend(plan.env.iter().cloned());
            match command.split_first() {
                Some((prog, args)) => (PathBuf::from(prog), with_mrnet_args(args, mrnet_args)),
                None => (exe, vec!["backend".to_owned()]),
            }
        } else {
            (exe, vec![crate::join::COMM_NODE_ARG.to_owned()])
        };
        ProcessSpec {
            name: child.name.clone(),
            host: child.host.clone(),
            program,
            args,
            env: envs,
            secret: Some((SECRET_ENV.to_owned(), self.launching.secret.to_hex())),
            forward_stderr: true,
            // With recovery on, a child outlives this node to rejoin the tree.
            die_with_parent: plan.rejoin_ms == 0,
        }
    }
}

/// The address light-joining children announce themselves to, the join socket
/// bound first if need be; `None` (they connect) where children use TCP or the
/// socket cannot be bound.
fn join_address(running: &mut Running, route: LocalRoute) -> Option<String> {
    if route != LocalRoute::Unix {
        return None;
    }
    if running.join.is_none() {
        match JoinSocket::bind() {
            Ok(socket) => running.join = Some(socket),
            Err(e) => {
                tracing::warn!("no light joins: {e}; spawned back-ends join by connecting");
                return None;
            }
        }
    }
    running.join.as_ref().map(JoinSocket::address)
}

/// The next announcement, or forever when there is no join socket.
///
/// Cancel safety: cancel safe.
async fn recv_announce(join: Option<&JoinSocket>, secret: &Secret) -> Result<Announce, TransportError> {
    match join {
        Some(j) => j.recv(secret).await,
        None => std::future::pending().await,
    }
}

/// Takes an announcement from a child started for a light join and not heard from
/// yet, with the rank it was started as (a back-end learns its rank from its member
/// plan, after it announced itself, so the rank it announces is not used); anything
/// else is refused (a replay finds nothing).
fn take_announce(running: &mut Running, a: Announce) -> Result<Announce, String> {
    match running.announcing.remove(&a.node_id) {
        Some(rank) => Ok(Announce { node_id: a.node_id, rank }),
        None => Err(format!("node {} announced itself, but no light join is awaited from it", a.node_id)),
    }
}

/// Waits for the next connection on any listener, or forever when there is none.
async fn accept(listeners: Option<&Listeners>) -> Result<(treecast_transport::Stream, String), NodeError> {
    match listeners {
        Some(l) => l.accept().await,
        None => std::future::pending().await,
    }
}

/// The address of this host that the first resolvable child host can reach;
/// children whose host does not resolve fail on their own when ssh cannot reach them.
async fn remote_address(remote: &dyn Launcher, hosts: &[&str]) -> Result<IpAddr, NodeError> {
    let mut tried = Vec::new();
    for host in hosts {
        match remote.local_address_towards(host).await {
            Ok(ip) => return Ok(ip),
            Err(e) => tried.push(e),
        }
    }
    Err(NodeError::NoAddress { tried })
}

/// The first of the addresses [`Listeners::address_for`] gives (one per rail).
fn first_address(addresses: &str) -> &str {
    addresses.split(',').next().unwrap_or(addresses)
}

/// Where children on other hosts connect: this host's address on each rail of a
/// striped plan that names rails ([`LaunchPlan::rails`]), else the plan's remote
/// address, else the one the route to them leaves from.
async fn remote_ips(
    plan: &LaunchPlan,
    remote: &dyn Launcher,
    hosts: &[&str],
) -> Result<Vec<IpAddr>, NodeError> {
    if plan.stripes > 1 && !plan.rails.is_empty() && !plan.mptcp {
        return Ok(treecast_transport::striped::rails::rail_addresses(&plan.rails)?);
    }
    let ip = match plan.remote_listen.parse::<IpAddr>() {
        Ok(ip) => ip,
        Err(_) => remote_address(remote, hosts).await?,
    };
    Ok(vec![ip])
}

/// Where children connect: a local listener for this host, TCP ones for other hosts
/// (one, or one per rail).
struct Listeners {
    local: Option<Listener>,
    remote: Vec<Listener>,
    /// Why there is no remote listener although remote children exist.
    remote_error: Option<NodeError>,
    /// Counts accepts, to take the listeners in turn.
    turn: std::sync::atomic::AtomicUsize,
}

impl Listeners {
    async fn open(
        plan: &LaunchPlan,
        children: &[ChildLaunch],
        is_local: &(dyn Fn(&str) -> bool + Sync),
        remote: &dyn Launcher,
    ) -> Result<Listeners, NodeError> {
        let listen: IpAddr = plan.listen.parse().unwrap_or(IpAddr::V4(std::net::Ipv4Addr::LOCALHOST));
        let local = match children.iter().any(|c| is_local(&c.host)) {
            false => None,
            true if plan.local_route == LocalRoute::Unix => Some(Listener::unix()?),
            true if plan.mptcp => Some(Listener::mptcp(listen)?),
            true => Some(Listener::tcp(listen).await?),
        };
        let remote_hosts: Vec<&str> =
            children.iter().map(|c| c.host.as_str()).filter(|h| !is_local(h)).collect();
        let Some(first) = remote_hosts.first() else {
            return Ok(Listeners { local, remote: Vec::new(), remote_error: None, turn: Default::default() });
        };
        if !remote.reaches_other_hosts() {
            return Err(NodeError::NoLauncher { host: (*first).to_owned() });
        }
        match remote_ips(plan, remote, &remote_hosts).await {
            Ok(ips) => {
                let mut listeners = Vec::with_capacity(ips.len());
                for ip in ips {
                    listeners.push(match plan.mptcp {
                        true => Listener::mptcp(ip)?,
                        false => Listener::tcp(ip).await?,
                    });
                }
                Ok(Listeners { local, remote: listeners, remote_error: None, turn: Default::default() })
            }
            Err(e) if plan.allow_missing => {
                Ok(Listeners { local, remote: Vec::new(), remote_error: Some(e), turn: Default::default() })
            }
            Err(e) => Err(e),
        }
    }

    /// Opens what `children` need and `slot` lacks: every listener when there are
    /// none, or the one route a child started later needs (a spawn on another host
    /// under a node whose children were all local).
    async fn ensure(
        slot: &mut Option<Listeners>,
        plan: &LaunchPlan,
        children: &[ChildLaunch],
        is_local: &(dyn Fn(&str) -> bool + Sync),
        remote: &dyn Launcher,
    ) -> Result<(), NodeError> {
        let Some(have) = slot else {
            *slot = Some(Listeners::open(plan, children, is_local, remote).await?);
            return Ok(());
        };
        let missing: Vec<ChildLaunch> = children
            .iter()
            .filter(|c| if is_local(&c.host) { have.local.is_none() } else { have.remote.is_empty() })
            .cloned()
            .collect();
        if missing.is_empty() {
            return Ok(());
        }
        let more = Listeners::open(plan, &missing, is_local, remote).await?;
        have.local = have.local.take().or(more.local);
        if have.remote.is_empty() {
            (have.remote, have.remote_error) = (more.remote, more.remote_error);
        }
        Ok(())
    }

    /// The address a child connects to: one, or for a child on another host one per
    /// rail, comma-separated (the striped link's connections take them in turn).
    fn address_for(&self, local: bool) -> Result<String, NodeError> {
        let listeners = if local { self.local.as_slice() } else { self.remote.as_slice() };
        if listeners.is_empty() {
            return Err(match &self.remote_error {
                Some(e) => NodeError::NoListener { reason: e.to_string() },
                None => NodeError::NoListener { reason: "no child was expected on this route".into() },
            });
        }
        let addresses: Result<Vec<String>, _> = listeners.iter().map(Listener::address).collect();
        Ok(addresses?.join(","))
    }

    /// Waits for the next connection on any listener.
    ///
    /// Cancel safety: cancel safe.
    async fn accept(&self) -> Result<(treecast_transport::Stream, String), NodeError> {
        let mut waiting: Vec<_> =
            self.local.iter().chain(&self.remote).map(|l| Box::pin(l.accept())).collect();
        if waiting.is_empty() {
            return std::future::pending().await;
        }
        // Each call looks at another listener first, so that a flood on one (the
        // local socket any local user can reach) does not starve the others.
        let first = self.turn.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % waiting.len();
        waiting.rotate_left(first);
        let r = std::future::poll_fn(|cx| {
            waiting
                .iter_mut()
                .find_map(|w| match w.as_mut().poll(cx) {
                    Poll::Ready(r) => Some(Poll::Ready(r)),
                    Poll::Pending => None,
                })
                .unwrap_or(Poll::Pending)
        })
        .await;
        Ok(r?)
    }
}

/// An argument of a back-end command that stands for MRNet's five back-end arguments
/// (parent host, parent port, parent rank, own host, own rank): MRNet's back-ends are
/// started with them, and some check for them. The MRNet-compatible layer puts it
/// last (docs/mrnet-compat.md); the back-end joins by its environment all the same.
pub(crate) const MRNET_BACKEND_ARGS: &str = "{treecast:mrnet-backend-args}";

/// MRNet's five back-end arguments for a back-end of `rank` on `host`, started by the
/// comm node `node_id` on `own_host` that listens at `parent`. A Unix socket has no
/// port (0), and a wildcard address names no host (`own_host` then). The parent's
/// rank is the MRNet layer's rank of that comm node (compat/mrnet: 1000000 + node id).
fn mrnet_backend_args(parent: &str, own_host: &str, node_id: u32, host: &str, rank: u32) -> [String; 5] {
    use treecast_topology::hostlist::bare_host;
    let (mut parent_host, port) = match parent.rsplit_once(':') {
        Some((h, p)) if !parent.starts_with("unix:") && p.parse::<u16>().is_ok() => {
            (h.trim_start_matches('[').trim_end_matches(']').to_owned(), p.to_owned())
        }
        _ => (own_host.to_owned(), "0".to_owned()),
    };
    if parent_host.parse::<IpAddr>().is_ok_and(|ip| ip.is_unspecified()) {
        parent_host = own_host.to_owned();
    }
    let parent_rank = 1_000_000 + u64::from(node_id);
    [
        bare_host(&parent_host).to_owned(),
        port,
        parent_rank.to_string(),
        bare_host(host).to_owned(),
        rank.to_string(),
    ]
}

/// `args` with [`MRNET_BACKEND_ARGS`] replaced by what `mrnet` makes (only made when
/// the placeholder is there: most commands have none).
fn with_mrnet_args(args: &[String], mrnet: impl FnOnce() -> [String; 5]) -> Vec<String> {
    if !args.iter().any(|a| a == MRNET_BACKEND_ARGS) {
        return args.to_vec();
    }
    let mrnet = mrnet();
    let mut out = Vec::with_capacity(args.len() + 4);
    for a in args {
        match a.as_str() {
            MRNET_BACKEND_ARGS => out.extend(mrnet.iter().cloned()),
            _ => out.push(a.clone()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mrnet_placeholder_becomes_mrnet_s_five_back_end_arguments() {
        let tcp = mrnet_backend_args("10.0.0.5:4101", "n1", 3, "n7", 42);
        assert_eq!(tcp, ["10.0.0.5", "4101", "1000003", "n7", "42"].map(String::from));
        let unix = mrnet_backend_args("unix:@treecast-1-3", "n1.cluster", 3, "n1.cluster", 0);
        assert_eq!(unix, ["n1.cluster", "0", "1000003", "n1.cluster", "0"].map(String::from));
        let v6 = mrnet_backend_args("[::1]:4101", "n1", 0, "me@n2", 5);
        assert_eq!(v6, ["::1", "4101", "1000000", "n2", "5"].map(String::from), "no brackets, no user");
        let any = mrnet_backend_args("0.0.0.0:4101", "n1", 0, "n2", 5);
        assert_eq!(any[0], "n1", "a wildcard address names no host");
        let args = ["-v".to_owned(), MRNET_BACKEND_ARGS.to_owned()];
        let mut want = vec!["-v".to_owned()];
        want.extend(tcp.iter().cloned());
        assert_eq!(with_mrnet_args(&args, || tcp.clone()), want);
        assert_eq!(with_mrnet_args(&args[..1], || tcp.clone()), ["-v"], "no placeholder, no arguments added");
    }

    #[test]
    fn admission_has_a_place_for_every_awaited_child_and_the_strangers_margin() {
        assert_eq!(admission_capacity(0), MAX_PENDING_HANDSHAKES, "no child awaited: the flood guard alone");
        assert_eq!(admission_capacity(200), 200 + MAX_PENDING_HANDSHAKES);
        assert_eq!(admission_capacity(10_000), 10_000 + MAX_PENDING_HANDSHAKES, "kary:32's leaves at 10k");
        assert_eq!(admission_capacity(usize::MAX), usize::MAX);
    }
}
