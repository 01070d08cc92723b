//! Starting the children of a node: launch, authenticate, hand down sub-trees, collect reports.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;
use treecast_launch::{Launched, LocalLauncher, ProcessSpec};
use treecast_topology::Topology;
use treecast_transport::{
    handshake, spawn_socket_link, Inbound, LinkEvent, LinkSender, Listener, Secret, Stream, SECRET_ENV,
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
    /// Address this node listens on for its children (TCP route).
    pub listen: IpAddr,
    /// Link to children through a Unix socket instead of TCP (they run on this host).
    pub unix_links: bool,
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
        for w in writers {
            w.abort();
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

/// Launches the children of the plan's root, authenticates them, hands each
/// comm node its sub-tree, and waits until every child reports ready.
///
/// # Errors
/// [`NodeError::Startup`] naming the first node that failed (with its host,
/// exit status and stderr), after killing everything this call started.
///
/// Cancel safety: not cancel safe; started processes are killed when dropped.
pub async fn start_children(plan: &LaunchPlan) -> Result<ChildSet, NodeError> {
    let listener = if plan.unix_links { Listener::unix()? } else { Listener::tcp(plan.listen).await? };
    let addr = listener.address()?;
    let mut pending = launch_all(plan, addr)?;
    let deadline = Instant::now() + plan.startup_timeout;
    accept_all(&listener, plan, &mut pending, deadline).await?;
    drop(listener);
    let (in_tx, inbound) = mpsc::channel(INBOUND_BATCHES);
    let mut links = Vec::with_capacity(pending.len());
    for (i, p) in pending.iter_mut().enumerate() {
        let Some(stream) = p.stream.take() else { continue };
        let socket = stream.into_socket().map_err(|source| NodeError::Io {
            what: format!("taking over the link to {}", p.name),
            source,
        })?;
        let (sender, writer) =
            spawn_socket_link(socket, i, p.name.clone(), in_tx.clone()).map_err(|source| NodeError::Io {
                what: format!("registering the link to {}", p.name),
                source,
            })?;
        links.push((sender, writer));
    }
    drop(in_tx);
    let mut set = ChildSet { children: Vec::new(), inbound };
    for (p, (sender, writer)) in pending.iter_mut().zip(links) {
        if let Some(sub) = &p.sub {
            let msg = ControlMsg::Subtree {
                topology: sub.to_mrnet(),
                first_id: p.id,
                first_rank: p.first_rank,
                total_backends: plan.total_backends,
                backend: plan.backend.clone(),
                env: plan.env.clone(),
                startup_timeout_ms: plan.startup_timeout.as_millis().min(u32::MAX as u128) as u32,
            };
            let _ = sender.send(control_frame(&msg)).await;
        }
        set.children.push(ChildLink {
            name: p.name.clone(),
            id: p.id,
            is_backend: p.is_backend,
            ranks: p.ranks.clone(),
            commnodes: 0,
            sender,
            writer,
            process: None,
        });
    }
    // Deeper levels start their own children before reporting: allow for the depth below.
    let depth = plan.topology.depth().max(1) as u32;
    let ready_deadline = deadline + plan.startup_timeout * depth.saturating_sub(1);
    if let Err(e) = collect_ready(&mut set, &mut pending, ready_deadline).await {
        set.shut_down(Duration::from_millis(200)).await;
        return Err(e);
    }
    for (c, p) in set.children.iter_mut().zip(pending.iter_mut()) {
        c.process = p.process.take();
    }
    Ok(set)
}

fn launch_all(plan: &LaunchPlan, parent: String) -> Result<Vec<Pending>, NodeError> {
    let topo = &plan.topology;
    let root = topo.root();
    let mut pending = Vec::new();
    for &c in &topo.node(root).children {
        let node = topo.node(c);
        let id = plan.first_id + c as u32;
        let first_rank = plan.first_rank + topo.first_rank(c);
        let is_backend = topo.is_leaf(c);
        let count = topo.subtree_backends(c) as u32;
        let role = if is_backend { "back-end" } else { "comm node" };
        let name = if is_backend {
            format!("{role} rank {first_rank} ({}:{})", node.host, node.index)
        } else {
            format!("{role} {}:{}", node.host, node.index)
        };
        let mut envs = vec![
            (env::PARENT.to_owned(), parent.clone()),
            (env::NODE_ID.to_owned(), id.to_string()),
            (SECRET_ENV.to_owned(), plan.secret.to_hex()),
            (env::SESSION.to_owned(), plan.session.clone()),
        ];
        let (program, args) = if is_backend {
            envs.push((env::RANK.to_owned(), first_rank.to_string()));
            envs.push((env::SIZE.to_owned(), plan.total_backends.to_string()));
            envs.extend(plan.env.iter().cloned());
            match plan.backend.split_first() {
                Some((prog, args)) => (PathBuf::from(prog), args.to_vec()),
                None => (plan.treecast_exe.clone(), vec!["backend".to_owned()]),
            }
        } else {
            envs.push((env::LISTEN.to_owned(), plan.listen.to_string()));
            envs.push((env::ROUTE.to_owned(), if plan.unix_links { "unix" } else { "tcp" }.to_owned()));
            (plan.treecast_exe.clone(), vec!["node".to_owned()])
        };
        let spec = ProcessSpec {
            name: name.clone(),
            host: node.host.clone(),
            program,
            args,
            env: envs,
            forward_stderr: true,
        };
        let process = LocalLauncher.launch(&spec)?;
        pending.push(Pending {
            name,
            id,
            host: node.host.clone(),
            is_backend,
            ranks: RankSet::range(first_rank, count),
            sub: (!is_backend).then(|| topo.subtree(c)),
            first_rank,
            process: Some(process),
            stream: None,
        });
    }
    Ok(pending)
}

async fn accept_all(
    listener: &Listener,
    plan: &LaunchPlan,
    pending: &mut [Pending],
    deadline: Instant,
) -> Result<(), NodeError> {
    let by_id: HashMap<u32, usize> = pending.iter().enumerate().map(|(i, p)| (p.id, i)).collect();
    let (hs_tx, mut hs_rx) = mpsc::channel::<(Result<u32, String>, Stream)>(64);
    let mut connected = 0;
    let mut poll = tokio::time::interval(EXIT_POLL);
    while connected < pending.len() {
        tokio::select! {
            accepted = listener.accept() => {
                let (mut stream, peer) = accepted?;
                let secret = plan.secret.clone();
                let tx = hs_tx.clone();
                tokio::spawn(async move {
                    let r = handshake::accept(&mut stream, &secret, &peer, HANDSHAKE_LIMIT).await;
                    let _ = tx.send((r.map_err(|e| e.to_string()), stream)).await;
                });
            }
            Some((result, stream)) = hs_rx.recv() => match result {
                Ok(id) => match by_id.get(&id) {
                    Some(&i) if pending[i].stream.is_none() => {
                        pending[i].stream = Some(stream);
                        connected += 1;
                    }
                    _ => tracing::warn!("refusing a link that claims node id {id}: not an expected child or already connected"),
                },
                Err(reason) => tracing::warn!("refused a connection: {reason}"),
            },
            _ = poll.tick() => {
                for p in pending.iter_mut().filter(|p| p.stream.is_none()) {
                    let exited = p.process.as_mut().and_then(Launched::try_wait).is_some();
                    if exited {
                        tokio::time::sleep(Duration::from_millis(20)).await; // let stderr drain
                        return Err(NodeError::Startup(p.failure("exited before connecting")));
                    }
                }
            }
            _ = tokio::time::sleep_until(deadline) => {
                let secs = plan.startup_timeout.as_secs_f64();
                let late = pending.iter_mut().find(|p| p.stream.is_none());
                let msg = match late {
                    Some(p) => p.failure(&format!("did not connect within {secs:.1} s")),
                    None => "start-up timed out".to_owned(),
                };
                return Err(NodeError::Startup(msg));
            }
        }
    }
    Ok(())
}

async fn collect_ready(
    set: &mut ChildSet,
    pending: &mut [Pending],
    deadline: Instant,
) -> Result<(), NodeError> {
    let mut ready = vec![false; set.children.len()];
    let mut left = set.children.len();
    while left > 0 {
        let inbound = tokio::time::timeout_at(deadline, set.inbound.recv()).await;
        let Ok(Some(Inbound { link, event })) = inbound else {
            let i = ready.iter().position(|r| !r).unwrap_or(0);
            return Err(NodeError::Startup(pending[i].failure("did not report ready in time")));
        };
        match event {
            LinkEvent::Frames(frames) => {
                for f in frames.into_iter().filter(|f| f.header.kind == FrameKind::Control) {
                    match ControlMsg::decode(&f.payload) {
                        Ok(ControlMsg::Ready { ranks, commnodes }) if !ready[link] => {
                            let child = &mut set.children[link];
                            if ranks != child.ranks {
                                return Err(NodeError::Startup(format!(
                                    "{} reported ranks {ranks} but was given {}",
                                    child.name, child.ranks
                                )));
                            }
                            child.commnodes = commnodes;
                            ready[link] = true;
                            left -= 1;
                        }
                        Ok(ControlMsg::LaunchFailed { message }) => return Err(NodeError::Startup(message)),
                        Ok(other) => tracing::debug!("ignoring {other:?} during start-up"),
                        Err(e) => {
                            return Err(NodeError::Startup(
                                pending[link].failure(&format!("sent a malformed control message: {e}")),
                            ))
                        }
                    }
                }
            }
            LinkEvent::Closed(reason) => {
                tokio::time::sleep(Duration::from_millis(20)).await;
                let why = reason.unwrap_or_else(|| "closed its link".into());
                return Err(NodeError::Startup(
                    pending[link].failure(&format!("failed during start-up: {why}")),
                ));
            }
        }
    }
    Ok(())
}
