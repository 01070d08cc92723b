//! Starting the children of a node: launch, authenticate, hand down sub-trees, collect reports.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use treecast_launch::{Launched, LocalLauncher, ProcessSpec, Remote};
use treecast_topology::Topology;
use treecast_transport::{
    handshake, spawn_link, spawn_socket_link, Inbound, LinkEvent, LinkSender, Listener, Secret, Stream,
    SECRET_ENV,
};
use treecast_wire::{ControlMsg, FrameKind, RankSet};

use crate::{control_frame, env, NodeError};

/// Inbound queue depth (each entry is a batch of frames from one read).
const INBOUND_BATCHES: usize = 128;
/// Time allowed for one handshake.
const HANDSHAKE_LIMIT: Duration = Duration::from_secs(10);
/// How often unconnected children are checked for an early exit.
const EXIT_POLL: Duration = Duration::from_millis(25);

/// Everything a node needs to start the sub-tree below it.
#[derive(Debug, Clone)]
pub struct LaunchPlan {
    /// The sub-tree rooted at this node (local id 0 is this node).
    pub topology: Topology,
    /// Global node id of this node.
    pub first_id: u32,
    /// Global rank of the first back-end below this node.
    pub first_rank: u32,
    /// Back-ends in the whole network.
    pub total_backends: u32,
    /// Back-end program and arguments; empty means `treecast backend`.
    pub backend: Vec<String>,
    /// Extra environment for back-ends.
    pub env: Vec<(String, String)>,
    /// Time allowed for each child to connect and for its sub-tree to report ready.
    pub startup_timeout: Duration,
    /// The `treecast` binary that comm nodes (and generic back-ends) run.
    pub treecast_exe: PathBuf,
    /// The session secret.
    pub secret: Secret,
    /// The session id.
    pub session: String,
    /// Address this node listens on for children on this host when `unix_links` is off.
    pub listen: IpAddr,
    /// Link to children on this host through a Unix socket instead of TCP.
    pub unix_links: bool,
    /// How to start children on other hosts (with Slurm: every child); `None` allows only this host.
    pub remote: Option<Remote>,
    /// Address children on other hosts connect to; `None` finds it from the route to them.
    pub remote_listen: Option<IpAddr>,
    /// Start without children that fail to start (they are reported in [`ChildSet::missing`]).
    pub allow_missing: bool,
    /// Attach mode: back-ends are started by someone else and have this long to connect.
    pub attach: Option<Duration>,
}

impl LaunchPlan {
    /// The host this node runs on, as the topology names it.
    pub fn own_host(&self) -> &str {
        &self.topology.node(self.topology.root()).host
    }

    /// True when a child on `host` runs on this node's host.
    pub fn is_local(&self, host: &str) -> bool {
        if self.remote.as_ref().is_some_and(Remote::takes_local_hosts) {
            return false;
        }
        host == self.own_host() || host == "localhost"
    }
}

/// One connected, ready child.
#[derive(Debug)]
pub struct ChildLink {
    /// Name for messages, e.g. `comm node localhost:3`.
    pub name: String,
    /// Global node id.
    pub id: u32,
    /// True for a back-end, false for a comm node.
    pub is_backend: bool,
    /// Back-end ranks reached through this child.
    pub ranks: RankSet,
    /// Comm nodes in its sub-tree, itself included.
    pub commnodes: u32,
    /// Where frames for it are queued.
    pub sender: LinkSender,
    /// Its writer task; it ends once every sender is dropped.
    pub writer: JoinHandle<()>,
    /// Its process (local launcher).
    pub process: Option<Launched>,
}

/// The children of a node, ready to route, and the queue their frames arrive on.
#[derive(Debug)]
pub struct ChildSet {
    /// Children in topology order; [`Inbound::link`] indexes this.
    pub children: Vec<ChildLink>,
    /// Frames and closures from every child.
    pub inbound: mpsc::Receiver<Inbound>,
    /// Ranks below this node that did not start, and why (only with `allow_missing`).
    pub missing: Vec<(RankSet, String)>,
}

impl ChildSet {
    /// Ranks reached through all children.
    pub fn ranks(&self) -> RankSet {
        let mut all = RankSet::new();
        for c in &self.children {
            all.union_with(&c.ranks);
        }
        all
    }

    /// Comm nodes below this node.
    pub fn commnodes(&self) -> u32 {
        self.children.iter().map(|c| c.commnodes).sum()
    }

    /// Waits up to `grace` for the children to exit (after a shutdown was sent),
    /// kills those still running, then closes every link.
    ///
    /// Cancel safety: not cancel safe; processes left are still killed when dropped.
    pub async fn shut_down(self, grace: Duration) {
        let deadline = Instant::now() + grace;
        let mut writers = Vec::new();
        for c in self.children {
            drop(c.sender);
            writers.push(c.writer);
            if let Some(mut p) = c.process {
                if tokio::time::timeout_at(deadline, p.wait()).await.is_err() {
                    tracing::debug!("{} did not exit in time; killing it", p.name());
                    p.kill().await;
                }
            }
        }
        drop(self.inbound);
        // Give writers a moment to deliver what is queued (a Shutdown to an attached
        // back-end, which has no process to wait for), then stop them.
        let flush = Instant::now() + Duration::from_millis(200);
        for mut w in writers {
            if tokio::time::timeout_at(flush, &mut w).await.is_err() {
                w.abort();
            }
        }
    }
}

struct Pending {
    name: String,
    id: u32,
    host: String,
    is_backend: bool,
    ranks: RankSet,
    sub: Option<Topology>,
    first_rank: u32,
    process: Option<Launched>,
    stream: Option<Stream>,
    failed: Option<String>,
    /// Attach mode: a back-end slot that someone else starts.
    attach: bool,
    /// Its link is running.
    connected: bool,
}

impl Pending {
    fn failure(&mut self, what: &str) -> String {
        let mut msg = format!("{} (node id {}) on {} {what}", self.name, self.id, self.host);
        if let Some(p) = self.process.as_mut() {
            if let Some(status) = p.try_wait() {
                msg.push_str(&format!("; the process {status}"));
            }
            let tail = p.stderr_tail();
            if !tail.trim().is_empty() {
                msg.push_str(&format!("; its stderr:\n{tail}"));
            }
        }
        msg
    }
}

/// Receives the attach points of a sub-tree (attach mode): `(rank, node id, address)`.
/// An error stops the start-up (the front-end could not write its attach file).
pub type AttachSink<'a> = &'a (dyn Fn(Vec<(u32, u32, String)>) -> Result<(), NodeError> + Sync);

/// Launches the children of the plan's root, authenticates them, hands each
/// comm node its sub-tree, and waits until every child reports ready.
///
/// In attach mode (`plan.attach`), back-ends are not launched: once every comm
/// node below has bound its listeners, the places where each rank must connect
/// are handed to `attach_sink`, and the back-ends started by someone else are
/// then awaited; when the sink fails, everything started is killed and its error
/// returned at once.
///
/// # Errors
/// [`NodeError::Startup`] naming the first node that failed (with its host,
/// exit status and stderr), after killing everything this call started. With
/// `allow_missing`, failed children are left out and listed in
/// [`ChildSet::missing`] instead; only a node with no child left fails.
///
/// Cancel safety: not cancel safe; started processes are killed when dropped.
pub async fn start_children(
    plan: &LaunchPlan,
    attach_sink: Option<AttachSink<'_>>,
) -> Result<ChildSet, NodeError> {
    let listeners = Listeners::open(plan).await?;
    let mut pending = launch_all(plan, &listeners)?;
    let deadline = Instant::now() + plan.startup_timeout;
    accept_all(&listeners, plan, &mut pending, deadline, false).await?;
    let (in_tx, inbound) = mpsc::channel(INBOUND_BATCHES);
    let mut set = ChildSet { children: Vec::new(), inbound, missing: Vec::new() };
    for (link, p) in pending.iter_mut().enumerate() {
        set.children.push(connect_child(plan, p, link, &in_tx).await?);
    }
    let mut backlog = Vec::new();
    if let Some(limit) = plan.attach {
        // Each comm-node level below first accepts its own children: allow for the depth.
        let depth = plan.topology.depth().max(1) as u32;
        let gather_deadline = deadline + plan.startup_timeout * depth;
        let points =
            gather_attach_points(plan, &listeners, &pending, &mut set, &mut backlog, gather_deadline).await?;
        if let Some(sink) = attach_sink {
            // Waiting for back-ends that cannot know where to connect would only hang.
            sink(points)?;
        }
        accept_all(&listeners, plan, &mut pending, Instant::now() + limit, true).await?;
        for (link, p) in pending.iter_mut().enumerate().filter(|(_, p)| p.stream.is_some()) {
            set.children[link] = connect_child(plan, p, link, &in_tx).await?;
        }
    }
    drop(listeners);
    drop(in_tx);
    for p in pending.iter().filter(|p| !p.connected) {
        let reason = p
            .failed
            .clone()
            .unwrap_or_else(|| format!("{} (node id {}) on {} did not start", p.name, p.id, p.host));
        set.missing.push((p.ranks.clone(), reason));
    }
    // Deeper levels start their own children before reporting: allow for the depth below.
    let depth = plan.topology.depth().max(1) as u32;
    let ready_deadline = Instant::now() + plan.startup_timeout * depth + plan.attach.unwrap_or_default();
    let mut live: Vec<&mut Pending> = pending.iter_mut().collect();
    let failed = collect_ready(&mut set, &mut live, backlog, ready_deadline, plan.allow_missing).await;
    if let Err(e) = failed {
        set.shut_down(Duration::from_millis(200)).await;
        return Err(e);
    }
    for (c, p) in set.children.iter_mut().zip(pending.iter_mut()) {
        c.process = p.process.take();
    }
    if set.children.iter().all(|c| c.ranks.is_empty()) {
        let why: Vec<String> = set.missing.iter().map(|(_, r)| r.clone()).collect();
        set.shut_down(Duration::from_millis(200)).await;
        return Err(NodeError::Startup(format!("no child of this node started: {}", why.join("; "))));
    }
    Ok(set)
}

/// Starts the link of a connected child (handing a comm node its sub-tree), or a
/// closed stand-in with no ranks for a child that is not (yet) connected.
async fn connect_child(
    plan: &LaunchPlan,
    p: &mut Pending,
    link: usize,
    in_tx: &mpsc::Sender<Inbound>,
) -> Result<ChildLink, NodeError> {
    let Some(stream) = p.stream.take() else {
        let (sender, _) =
            spawn_link(tokio::io::empty(), tokio::io::sink(), link, p.name.clone(), mpsc::channel(1).0);
        let writer = tokio::spawn(async {});
        return Ok(ChildLink {
            name: p.name.clone(),
            id: p.id,
            is_backend: p.is_backend,
            ranks: RankSet::new(),
            commnodes: 0,
            sender,
            writer,
            process: None,
        });
    };
    let io = |what: &str| {
        let what = format!("{what} {}", p.name);
        move |source| NodeError::Io { what, source }
    };
    let socket = stream.into_socket().map_err(io("taking over the link to"))?;
    let (sender, writer) = spawn_socket_link(socket, link, p.name.clone(), in_tx.clone())
        .map_err(io("registering the link to"))?;
    if let Some(sub) = &p.sub {
        let _ = sender.send(control_frame(&subtree_msg(plan, p, sub))).await;
    }
    p.connected = true;
    Ok(ChildLink {
        name: p.name.clone(),
        id: p.id,
        is_backend: p.is_backend,
        ranks: p.ranks.clone(),
        commnodes: 0,
        sender,
        writer,
        process: None,
    })
}

/// Attach mode: this node's own back-end slots plus those every comm-node child reports.
async fn gather_attach_points(
    plan: &LaunchPlan,
    listeners: &Listeners,
    pending: &[Pending],
    set: &mut ChildSet,
    backlog: &mut Vec<Inbound>,
    deadline: Instant,
) -> Result<Vec<(u32, u32, String)>, NodeError> {
    let mut points = Vec::new();
    for p in pending.iter().filter(|p| p.attach) {
        points.push((p.first_rank, p.id, listeners.address_for(plan.is_local(&p.host))?));
    }
    let mut waiting: Vec<bool> = pending.iter().map(|p| p.sub.is_some() && p.connected).collect();
    while waiting.iter().any(|w| *w) {
        let Ok(Some(inbound)) = tokio::time::timeout_at(deadline, set.inbound.recv()).await else {
            let late = waiting.iter().position(|w| *w).map(|i| pending[i].name.clone()).unwrap_or_default();
            return Err(NodeError::Startup(format!(
                "{late} did not report where its back-ends attach in time"
            )));
        };
        let link = inbound.link;
        match &inbound.event {
            LinkEvent::Frames(frames) => {
                for f in frames.iter().filter(|f| f.header.kind == FrameKind::Control) {
                    if let Ok(ControlMsg::AttachPoints { points: theirs }) = ControlMsg::decode(&f.payload) {
                        points.extend(theirs);
                        waiting[link] = false;
                    }
                }
            }
            LinkEvent::Closed(_) => waiting[link] = false,
        }
        backlog.push(inbound);
    }
    points.sort();
    Ok(points)
}

fn subtree_msg(plan: &LaunchPlan, p: &Pending, sub: &Topology) -> ControlMsg {
    ControlMsg::Subtree {
        topology: sub.to_mrnet(),
        first_id: p.id,
        first_rank: p.first_rank,
        total_backends: plan.total_backends,
        backend: plan.backend.clone(),
        env: plan.env.clone(),
        startup_timeout_ms: plan.startup_timeout.as_millis().min(u32::MAX as u128) as u32,
    }
}

/// The address of this host that the first resolvable child host can reach;
/// children whose host does not resolve fail on their own when ssh cannot reach them.
async fn remote_address(ssh: &Remote, hosts: &[&str]) -> Result<IpAddr, NodeError> {
    let mut errors = Vec::new();
    for host in hosts {
        match ssh.local_address_towards(host).await {
            Ok(ip) => return Ok(ip),
            Err(e) => errors.push(e),
        }
    }
    Err(NodeError::Startup(format!(
        "cannot tell which address the other hosts can reach this host on ({}); set TREECAST_LISTEN",
        errors.join("; ")
    )))
}

/// Where children connect: a local listener for this host, a TCP one for other hosts.
struct Listeners {
    local: Option<Listener>,
    remote: Option<Listener>,
    /// Why there is no remote listener although remote children exist.
    remote_error: Option<String>,
}

impl Listeners {
    async fn open(plan: &LaunchPlan) -> Result<Listeners, NodeError> {
        let children: Vec<&str> = plan
            .topology
            .node(plan.topology.root())
            .children
            .iter()
            .map(|&c| plan.topology.node(c).host.as_str())
            .collect();
        let local = match children.iter().any(|h| plan.is_local(h)) {
            false => None,
            true if plan.unix_links => Some(Listener::unix()?),
            true => Some(Listener::tcp(plan.listen).await?),
        };
        let remote_hosts: Vec<&str> = children.iter().copied().filter(|h| !plan.is_local(h)).collect();
        let remote = match remote_hosts.first() {
            None => None,
            Some(host) => {
                let Some(ssh) = &plan.remote else {
                    return Err(NodeError::Startup(format!(
                                "host {host} is not this host ({}) and no launcher for other hosts was chosen (use --launcher ssh or slurm)",
                        plan.own_host()
                    )));
                };
                let ip = match plan.remote_listen {
                    Some(ip) => Ok(ip),
                    None => remote_address(ssh, &remote_hosts).await,
                };
                match ip {
                    Ok(ip) => Some(Listener::tcp(ip).await?),
                    Err(e) if plan.allow_missing => {
                        return Ok(Listeners { local, remote: None, remote_error: Some(e.to_string()) })
                    }
                    Err(e) => return Err(e),
                }
            }
        };
        Ok(Listeners { local, remote, remote_error: None })
    }

    fn address_for(&self, local: bool) -> Result<String, NodeError> {
        let l = if local { &self.local } else { &self.remote };
        match (l, &self.remote_error) {
            (Some(l), _) => Ok(l.address()?),
            (None, Some(e)) => Err(NodeError::Startup(e.clone())),
            (None, None) => Err(NodeError::Startup("no listener for this child".into())),
        }
    }

    /// Waits for the next connection on any listener.
    ///
    /// Cancel safety: cancel safe.
    async fn accept(&self) -> Result<(Stream, String), NodeError> {
        let r = match (&self.local, &self.remote) {
            (Some(a), Some(b)) => tokio::select! { r = a.accept() => r, r = b.accept() => r },
            (Some(a), None) | (None, Some(a)) => a.accept().await,
            (None, None) => std::future::pending().await,
        };
        Ok(r?)
    }
}

fn launch_all(plan: &LaunchPlan, listeners: &Listeners) -> Result<Vec<Pending>, NodeError> {
    let topo = &plan.topology;
    let mut pending = Vec::new();
    for &c in &topo.node(topo.root()).children {
        let node = topo.node(c);
        let local = plan.is_local(&node.host);
        let id = plan.first_id + c as u32;
        let first_rank = plan.first_rank + topo.first_rank(c);
        let is_backend = topo.is_leaf(c);
        let name = if is_backend {
            format!("back-end rank {first_rank} ({}:{})", node.host, node.index)
        } else {
            format!("comm node {}:{}", node.host, node.index)
        };
        let mut p = Pending {
            name,
            id,
            host: node.host.clone(),
            is_backend,
            ranks: RankSet::range(first_rank, topo.subtree_backends(c) as u32),
            sub: (!is_backend).then(|| topo.subtree(c)),
            first_rank,
            process: None,
            stream: None,
            failed: None,
            attach: is_backend && plan.attach.is_some(),
            connected: false,
        };
        if p.attach {
            pending.push(p);
            continue;
        }
        let launched = listeners.address_for(local).and_then(|parent| {
            let spec = process_spec(plan, &p, parent, local);
            match (local, &plan.remote) {
                (false, Some(remote)) => Ok(remote.launch(&spec)?),
                _ => Ok(LocalLauncher.launch(&spec)?),
            }
        });
        match launched {
            Ok(process) => p.process = Some(process),
            Err(e) => {
                let reason = format!("{} on {}: {e}", p.name, p.host);
                fail(&mut p, reason, plan.allow_missing)?
            }
        }
        pending.push(p);
    }
    Ok(pending)
}

/// What to run for a child, with its environment (the secret apart).
fn process_spec(plan: &LaunchPlan, p: &Pending, parent: String, local: bool) -> ProcessSpec {
    let mut envs = vec![
        (env::PARENT.to_owned(), parent),
        (env::NODE_ID.to_owned(), p.id.to_string()),
        (env::SESSION.to_owned(), plan.session.clone()),
    ];
    let exe = match (&plan.remote, local) {
        (Some(remote), false) => PathBuf::from(remote.remote_path()),
        _ => plan.treecast_exe.clone(),
    };
    let (program, args) = if p.is_backend {
        envs.push((env::RANK.to_owned(), p.first_rank.to_string()));
        envs.push((env::SIZE.to_owned(), plan.total_backends.to_string()));
        envs.extend(plan.env.iter().cloned());
        match plan.backend.split_first() {
            Some((prog, args)) => (PathBuf::from(prog), args.to_vec()),
            None => (exe, vec!["backend".to_owned()]),
        }
    } else {
        envs.extend(launch_env(plan, local));
        (exe, vec!["node".to_owned()])
    };
    ProcessSpec {
        name: p.name.clone(),
        host: p.host.clone(),
        program,
        args,
        env: envs,
        secret: Some((SECRET_ENV.to_owned(), plan.secret.to_hex())),
        forward_stderr: true,
    }
}

/// The launch settings a comm node passes on to the comm nodes it starts.
fn launch_env(plan: &LaunchPlan, local: bool) -> Vec<(String, String)> {
    let mut envs = vec![(env::ROUTE.to_owned(), if plan.unix_links { "unix" } else { "tcp" }.to_owned())];
    if local {
        envs.push((env::LISTEN.to_owned(), plan.listen.to_string()));
    }
    if plan.allow_missing {
        envs.push((env::ALLOW_MISSING.to_owned(), "1".to_owned()));
    }
    if let Some(limit) = plan.attach {
        envs.push((env::ATTACH_MS.to_owned(), limit.as_millis().to_string()));
    }
    if let Some(remote) = &plan.remote {
        envs.extend(remote.env());
    }
    envs
}

async fn accept_all(
    listeners: &Listeners,
    plan: &LaunchPlan,
    pending: &mut [Pending],
    deadline: Instant,
    attach_phase: bool,
) -> Result<(), NodeError> {
    let by_id: HashMap<u32, usize> = pending.iter().enumerate().map(|(i, p)| (p.id, i)).collect();
    let (hs_tx, mut hs_rx) = mpsc::channel::<(Result<u32, String>, Stream)>(64);
    let mut poll = tokio::time::interval(EXIT_POLL);
    // A child is awaited in the phase it belongs to: launched ones first, attaching back-ends after.
    let awaited = move |p: &Pending| {
        p.stream.is_none() && !p.connected && p.failed.is_none() && p.attach == attach_phase
    };
    while pending.iter().any(awaited) {
        tokio::select! {
            accepted = listeners.accept() => {
                let (mut stream, peer) = match accepted {
                    Ok(conn) => conn,
                    Err(e) => {
                        // Out of descriptors or an aborted connection: not fatal for the others.
                        tracing::warn!("accepting a connection failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let secret = plan.secret.clone();
                let tx = hs_tx.clone();
                tokio::spawn(async move {
                    let r = handshake::accept(&mut stream, &secret, &peer, HANDSHAKE_LIMIT).await;
                    let _ = tx.send((r.map_err(|e| e.to_string()), stream)).await;
                });
            }
            Some((result, stream)) = hs_rx.recv() => match result {
                Ok(id) => match by_id.get(&id) {
                    Some(&i) if pending[i].stream.is_none() && !pending[i].connected && pending[i].failed.is_none() => {
                        pending[i].stream = Some(stream);
                    }
                    _ => tracing::warn!("refusing a link that claims node id {id}: not an expected child or already connected"),
                },
                Err(reason) => tracing::warn!("refused a connection: {reason}"),
            },
            _ = poll.tick() => {
                for p in pending.iter_mut().filter(|p| awaited(p)) {
                    let exited = p.process.as_mut().and_then(Launched::try_wait).is_some();
                    if exited {
                        tokio::time::sleep(Duration::from_millis(20)).await; // let stderr drain
                        let reason = p.failure("exited before connecting");
                        fail(p, reason, plan.allow_missing)?;
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                let secs = plan.startup_timeout.as_secs_f64();
                let secs = if attach_phase { plan.attach.unwrap_or_default().as_secs_f64() } else { secs };
                for p in pending.iter_mut().filter(|p| awaited(p)) {
                    let reason = p.failure(&format!("did not connect within {secs:.1} s"));
                    fail(p, reason, plan.allow_missing)?;
                }
            }
        }
    }
    Ok(())
}

/// Records a child's failure, or turns it into the error when missing children are not allowed.
fn fail(p: &mut Pending, reason: String, allow_missing: bool) -> Result<(), NodeError> {
    if !allow_missing {
        return Err(NodeError::Startup(reason));
    }
    tracing::warn!("{reason}; going on without it");
    p.failed = Some(reason);
    if let Some(process) = p.process.as_mut() {
        let _ = process.try_wait();
    }
    p.process = None; // dropping kills it
    Ok(())
}

async fn collect_ready(
    set: &mut ChildSet,
    pending: &mut [&mut Pending],
    backlog: Vec<Inbound>,
    deadline: Instant,
    allow_missing: bool,
) -> Result<(), NodeError> {
    // Children that never connected have no ranks and nothing to report.
    let mut ready: Vec<bool> = set.children.iter().map(|c| c.ranks.is_empty()).collect();
    let mut backlog = backlog.into_iter();
    while ready.iter().any(|r| !r) {
        let inbound = match backlog.next() {
            Some(b) => Ok(Some(b)),
            None => tokio::time::timeout_at(deadline, set.inbound.recv()).await,
        };
        let Ok(Some(Inbound { link, event })) = inbound else {
            for i in 0..ready.len() {
                if !ready[i] {
                    let reason = pending[i].failure("did not report ready in time");
                    drop_child(set, i, reason, allow_missing)?;
                    ready[i] = true;
                }
            }
            break;
        };
        let frames = match event {
            LinkEvent::Frames(frames) => frames,
            // A child that dies before every sibling is ready, even one that reported, is lost.
            LinkEvent::Closed(_) if set.children[link].ranks.is_empty() => continue,
            LinkEvent::Closed(reason) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let why = reason.unwrap_or_else(|| "closed its link".into());
                drop_child(
                    set,
                    link,
                    pending[link].failure(&format!("failed during start-up: {why}")),
                    allow_missing,
                )?;
                ready[link] = true;
                continue;
            }
        };
        for f in frames.into_iter().filter(|f| f.header.kind == FrameKind::Control) {
            match ControlMsg::decode(&f.payload) {
                Ok(ControlMsg::Ready { ranks, commnodes }) if !ready[link] => {
                    let child = &mut set.children[link];
                    let extra = ranks.difference(&child.ranks);
                    if !extra.is_empty() || (ranks != child.ranks && !allow_missing) {
                        return Err(NodeError::Startup(format!(
                            "{} reported ranks {ranks} but was given {}",
                            child.name, child.ranks
                        )));
                    }
                    let unreported = child.ranks.difference(&ranks);
                    let reported: RankSet = set.missing.iter().fold(RankSet::new(), |mut acc, (r, _)| {
                        acc.union_with(r);
                        acc
                    });
                    let silent = unreported.difference(&reported);
                    if !silent.is_empty() {
                        set.missing.push((silent, format!("{} did not start them", child.name)));
                    }
                    child.ranks = ranks;
                    child.commnodes = commnodes;
                    ready[link] = true;
                }
                // A comm node reports the ranks it could not start before its own Ready.
                Ok(ControlMsg::RanksLost { ranks, reason }) => {
                    let child = &mut set.children[link];
                    child.ranks = child.ranks.difference(&ranks);
                    set.missing.push((ranks, reason));
                }
                Ok(ControlMsg::AttachPoints { .. }) => {}
                Ok(ControlMsg::LaunchFailed { message }) if !ready[link] => {
                    drop_child(set, link, message, allow_missing)?;
                    ready[link] = true;
                }
                Ok(other) => tracing::debug!("ignoring {other:?} during start-up"),
                Err(e) => {
                    let reason = pending[link].failure(&format!("sent a malformed control message: {e}"));
                    drop_child(set, link, reason, allow_missing)?;
                    ready[link] = true;
                }
            }
        }
    }
    Ok(())
}

/// Takes a child that failed during start-up out of service (its ranks become missing).
fn drop_child(set: &mut ChildSet, link: usize, reason: String, allow_missing: bool) -> Result<(), NodeError> {
    if !allow_missing {
        return Err(NodeError::Startup(reason));
    }
    tracing::warn!("{reason}; going on without it");
    // Closing the link makes a child that is still alive exit (its parent is gone).
    let (dead, _) = spawn_link(
        tokio::io::empty(),
        tokio::io::sink(),
        link,
        set.children[link].name.clone(),
        mpsc::channel(1).0,
    );
    set.children[link].sender = dead;
    let child = &mut set.children[link];
    let ranks = std::mem::take(&mut child.ranks);
    set.missing.push((ranks, reason));
    Ok(())
}
