//! `treecast node`: a comm node's whole life.

use std::net::{IpAddr, Ipv4Addr};
use std::path::PathBuf;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use treecast_topology::Topology;
use treecast_transport::{handshake, spawn_socket_link, Inbound, LinkEvent, LinkSender, Secret, Stream};
use treecast_wire::{ControlMsg, Frame, FrameHeader, FrameKind};

use treecast_launch::Remote;

use crate::{
    control_frame, env, start_children, ChildSet, Downstream, LaunchPlan, NodeError, StreamSpec, UpOutput,
    Upstream,
};

/// How long a new node waits for its sub-tree after connecting.
const SUBTREE_WAIT: Duration = Duration::from_secs(30);
/// How long a node waits for its children to exit after a shutdown.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

fn env_var(var: &'static str) -> Result<String, NodeError> {
    std::env::var(var).map_err(|_| NodeError::Env { var, reason: "not set".into() })
}

fn env_parse<T: std::str::FromStr>(var: &'static str) -> Result<T, NodeError>
where
    T::Err: std::fmt::Display,
{
    env_var(var)?.parse().map_err(|e: T::Err| NodeError::Env { var, reason: e.to_string() })
}

/// Connects to the parent named in the environment and authenticates as `node_id`.
///
/// The secret is taken out of the environment once read, also from the block that
/// `/proc/PID/environ` shows, so the commands this process runs cannot read it there.
///
/// # Errors
/// Missing environment, connection failure, or a failed handshake.
pub async fn connect_parent(limit: Duration) -> Result<(Stream, String, u32, Secret), NodeError> {
    let parent = env_var(env::PARENT)?;
    let node_id: u32 = env_parse(env::NODE_ID)?;
    // The environment wins: a local parent puts the secret there; over ssh it comes on stdin.
    let secret = match Secret::from_env() {
        Ok(secret) => {
            treecast_launch::clear_env_var(treecast_transport::SECRET_ENV);
            secret
        }
        Err(env_err) => match treecast_launch::secret_from_stdin() {
            Some(line) => {
                let line = line.map_err(|source| NodeError::Io {
                    what: "reading the secret from stdin".into(),
                    source,
                })?;
                Secret::from_hex(&line)?
            }
            None => return Err(env_err.into()),
        },
    };
    let stream = connect_to(&parent, node_id, &secret, limit).await?;
    Ok((stream, parent, node_id, secret))
}

/// Connects to a parent at `addr` and authenticates as `node_id`.
///
/// # Errors
/// Connection failure or a failed handshake.
pub async fn connect_to(
    addr: &str,
    node_id: u32,
    secret: &Secret,
    limit: Duration,
) -> Result<Stream, NodeError> {
    let mut stream = Stream::connect(addr, limit).await?;
    handshake::connect(&mut stream, secret, node_id, addr, limit).await?;
    Ok(stream)
}

/// How this node starts children on other hosts, as its parent set it (`TREECAST_LAUNCHER`).
pub fn remote_from_env() -> Option<Remote> {
    Remote::from_env()
}

/// Whether this node links to its children through Unix sockets (`TREECAST_ROUTE`, default `unix`).
pub fn unix_links_from_env() -> bool {
    std::env::var(env::ROUTE).map(|r| r != "tcp").unwrap_or(true)
}

/// Runs a comm node: connect to the parent, start the sub-tree it sends,
/// report ready, then route until the parent goes away or says shut down.
///
/// # Errors
/// Failures before the node is ready (they are also reported to the parent
/// when the link allows).
pub async fn run_comm_node() -> Result<(), NodeError> {
    let (stream, parent_addr, node_id, secret) = connect_parent(SUBTREE_WAIT).await?;
    let (ptx, mut from_parent) = mpsc::channel::<Inbound>(128);
    let io = |what: &'static str| move |source| NodeError::Io { what: what.into(), source };
    let socket = stream.into_socket().map_err(io("taking over the parent link"))?;
    let (parent, parent_writer) = spawn_socket_link(socket, 0, format!("parent {parent_addr}"), ptx)
        .map_err(io("registering the parent link"))?;
    let plan = receive_plan(&mut from_parent, node_id, secret).await?;
    let name = format!("comm node {} (id {node_id})", plan.topology.node(0).host);
    let report_points = |points: Vec<(u32, u32, String)>| {
        if parent.try_send(control_frame(&ControlMsg::AttachPoints { points })).is_err() {
            tracing::warn!("could not report attach points to the parent");
        }
        Ok(())
    };
    let sink: Option<crate::AttachSink<'_>> = if plan.attach.is_some() { Some(&report_points) } else { None };
    let children = match start_children(&plan, sink).await {
        Ok(c) => c,
        Err(e) => {
            let _ = parent.send(control_frame(&ControlMsg::LaunchFailed { message: e.to_string() })).await;
            drop(parent);
            let _ = tokio::time::timeout(SHUTDOWN_GRACE, parent_writer).await;
            return Err(e);
        }
    };
    for (ranks, reason) in &children.missing {
        let lost = ControlMsg::RanksLost { ranks: ranks.clone(), reason: reason.clone() };
        let _ = parent.send(control_frame(&lost)).await;
    }
    let ready = ControlMsg::Ready { ranks: children.ranks(), commnodes: 1 + children.commnodes() };
    if parent.send(control_frame(&ready)).await.is_err() {
        children.shut_down(SHUTDOWN_GRACE).await;
        return Ok(());
    }
    route(name, parent, from_parent, children).await;
    let _ = tokio::time::timeout(SHUTDOWN_GRACE, parent_writer).await;
    Ok(())
}

async fn receive_plan(
    from_parent: &mut mpsc::Receiver<Inbound>,
    node_id: u32,
    secret: Secret,
) -> Result<LaunchPlan, NodeError> {
    let protocol = |reason: String| NodeError::Protocol { peer: "parent".into(), reason };
    let first = tokio::time::timeout(SUBTREE_WAIT, from_parent.recv())
        .await
        .map_err(|_| protocol("no sub-tree received in time".into()))?;
    let frame = match first {
        Some(Inbound { event: LinkEvent::Frames(mut f), .. }) if !f.is_empty() => f.remove(0),
        _ => return Err(protocol("the link closed before a sub-tree arrived".into())),
    };
    let msg = ControlMsg::decode(&frame.payload).map_err(|e| protocol(format!("malformed sub-tree: {e}")))?;
    let ControlMsg::Subtree {
        topology,
        first_id,
        first_rank,
        total_backends,
        backend,
        env,
        startup_timeout_ms,
    } = msg
    else {
        return Err(protocol(format!("expected a sub-tree, got {msg:?}")));
    };
    if first_id != node_id {
        return Err(protocol(format!("sub-tree is for node {first_id}, this is node {node_id}")));
    }
    let listen: IpAddr = std::env::var(env::LISTEN)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    // TREECAST_PATH wins so a wrapper (a profiler, a debugger) can stand in for the binary.
    let treecast_exe: PathBuf = match std::env::var_os("TREECAST_PATH") {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()
            .map_err(|source| NodeError::Io { what: "finding the treecast binary".into(), source })?,
    };
    Ok(LaunchPlan {
        topology: Topology::parse(&topology)?,
        first_id,
        first_rank,
        total_backends,
        backend,
        env,
        startup_timeout: Duration::from_millis(u64::from(startup_timeout_ms)),
        treecast_exe,
        secret,
        session: std::env::var(env::SESSION).unwrap_or_default(),
        listen,
        unix_links: unix_links_from_env(),
        remote: remote_from_env(),
        remote_listen: None,
        allow_missing: std::env::var(env::ALLOW_MISSING).is_ok_and(|v| v == "1"),
        attach: std::env::var(env::ATTACH_MS).ok().and_then(|v| v.parse().ok()).map(Duration::from_millis),
    })
}

enum UpCtl {
    Add(StreamSpec),
    Remove(u32),
    /// The parent granted credits on a stream.
    Credit(u32, u32),
}

/// Routes both directions until the parent link ends, then takes the sub-tree down.
async fn route(name: String, parent: LinkSender, from_parent: mpsc::Receiver<Inbound>, children: ChildSet) {
    let ChildSet { children: links, inbound, .. } = children;
    let senders: Vec<LinkSender> = links.iter().map(|c| c.sender.clone()).collect();
    let ranks: Vec<_> = links.iter().map(|c| (c.name.clone(), c.ranks.clone())).collect();
    let (ctl_tx, ctl_rx) = mpsc::channel(64);
    let up = Upstream::new(name.clone(), false, ranks.clone());
    let down = Downstream::new(ranks.into_iter().map(|(_, r)| r).collect());
    let up_task = tokio::spawn(up_loop(up, inbound, ctl_rx, parent, senders.clone()));
    down_loop(&name, down, from_parent, &senders, ctl_tx).await;
    drop(senders);
    up_task.abort();
    let set = ChildSet { children: links, inbound: mpsc::channel(1).1, missing: Vec::new() };
    set.shut_down(SHUTDOWN_GRACE).await;
}

async fn down_loop(
    name: &str,
    mut down: Downstream,
    mut from_parent: mpsc::Receiver<Inbound>,
    children: &[LinkSender],
    up_ctl: mpsc::Sender<UpCtl>,
) {
    while let Some(Inbound { event, .. }) = from_parent.recv().await {
        let frames = match event {
            LinkEvent::Frames(f) => f,
            LinkEvent::Closed(reason) => {
                tracing::info!(
                    node = name,
                    "parent link closed ({}); shutting down",
                    reason.as_deref().unwrap_or("orderly")
                );
                return;
            }
        };
        for frame in frames {
            if frame.header.kind == FrameKind::Credit {
                if up_ctl.send(UpCtl::Credit(frame.header.stream, frame.header.credits())).await.is_err() {
                    return;
                }
                continue;
            }
            if frame.header.kind == FrameKind::Data {
                match down.route(frame) {
                    Ok(out) => {
                        for (child, f) in out {
                            let _ = children[child].send(f).await;
                        }
                    }
                    Err(e) => tracing::warn!(node = name, "dropping downstream frame: {e}"),
                }
                continue;
            }
            match ControlMsg::decode(&frame.payload) {
                Ok(ControlMsg::NewStream { id, ranks, sync, up, down: d }) => {
                    let spec = StreamSpec { id, ranks, sync, up, down: d };
                    let targets = down.add_stream(&spec, true);
                    if up_ctl.send(UpCtl::Add(spec)).await.is_err() {
                        return;
                    }
                    broadcast(children, &targets, &frame).await;
                }
                Ok(ControlMsg::CloseStream { id }) => {
                    let targets = down.remove_stream(id);
                    let _ = up_ctl.send(UpCtl::Remove(id)).await;
                    broadcast(children, &targets, &frame).await;
                }
                Ok(ControlMsg::Shutdown) => {
                    broadcast_shutdown(children, &frame).await;
                    return;
                }
                Ok(other) => {
                    tracing::warn!(node = name, "ignoring unexpected control message from parent: {other:?}")
                }
                Err(e) => {
                    tracing::warn!(node = name, "malformed control frame from parent: {e}; shutting down");
                    return;
                }
            }
        }
    }
}

async fn broadcast(children: &[LinkSender], targets: &[usize], frame: &Frame) {
    for &c in targets {
        let _ = children[c].send(frame.clone()).await;
    }
}

/// Sends a shutdown to every child without waiting long on one that stopped reading.
async fn broadcast_shutdown(children: &[LinkSender], frame: &Frame) {
    let deadline = Instant::now() + SHUTDOWN_GRACE;
    for c in children {
        let _ = tokio::time::timeout_at(deadline, c.send(frame.clone())).await;
    }
}

async fn up_loop(
    mut up: Upstream,
    mut inbound: mpsc::Receiver<Inbound>,
    mut ctl: mpsc::Receiver<UpCtl>,
    parent: LinkSender,
    children: Vec<LinkSender>,
) {
    loop {
        let deadline = up.next_deadline();
        let out = tokio::select! {
            biased;
            c = ctl.recv() => match c {
                Some(UpCtl::Add(spec)) => { up.add_stream(&spec); continue; }
                Some(UpCtl::Remove(id)) => { up.remove_stream(id); continue; }
                Some(UpCtl::Credit(stream, packets)) => up.on_credit(stream, packets),
                None => return,
            },
            ev = inbound.recv() => match ev {
                Some(Inbound { link, event: LinkEvent::Frames(frames) }) => {
                    let now = std::time::Instant::now();
                    frames.into_iter().flat_map(|f| up.on_frame(link, f, now)).collect::<Vec<_>>()
                }
                Some(Inbound { link, event: LinkEvent::Closed(reason) }) => {
                    up.on_child_closed(link, reason.as_deref(), std::time::Instant::now())
                }
                None => return,
            },
            _ = sleep_until_opt(deadline) => up.poll(std::time::Instant::now()),
        };
        for o in out {
            let frame = match o {
                UpOutput::Data(f) => f,
                UpOutput::Control(msg) => control_frame(&msg),
                UpOutput::StreamDone(_) => continue,
                UpOutput::Credit { child, stream, packets } => {
                    // A child that is gone has its ranks reported lost already.
                    if let Some(link) = children.get(child) {
                        send_credit(link, stream, packets);
                    }
                    continue;
                }
            };
            if parent.send(frame).await.is_err() {
                return;
            }
        }
    }
}

/// A frame granting `packets` more data frames on `stream` to the child that receives it.
fn credit_frame(stream: u32, packets: u32) -> Frame {
    Frame::new(FrameHeader::credit(stream, packets), bytes::Bytes::new())
}

/// Grants a child credits without making the caller wait.
///
/// The upward loop must never wait on one child's send queue (it may be full of file
/// chunks for a slow child): that would stop every stream. Credits add up, so when
/// the queue is full a task delivers this grant whenever the queue has room; it ends
/// when the link closes.
pub fn send_credit(link: &LinkSender, stream: u32, packets: u32) {
    if let Err(frame) = link.try_send(credit_frame(stream, packets)) {
        if !link.is_closed() {
            let link = link.clone();
            tokio::spawn(async move {
                let _ = link.send(frame).await;
            });
        }
    }
}

/// Sleeps until `deadline`, or forever when there is none.
pub async fn sleep_until_opt(deadline: Option<std::time::Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(Instant::from_std(d)).await,
        None => std::future::pending().await,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use treecast_transport::spawn_link;

    use super::*;

    #[tokio::test]
    async fn a_credit_for_a_child_whose_queue_is_full_does_not_wait_and_still_arrives() {
        // Regression: the upward loop awaited the child's full send queue (file chunks
        // for a slow child), which stopped every stream of the node.
        let (near, far) = tokio::io::duplex(64);
        let (near_read, near_write) = tokio::io::split(near);
        let (far_read, far_write) = tokio::io::split(far);
        let (to_child, _writer) = spawn_link(near_read, near_write, 0, "child".into(), mpsc::channel(1).0);
        let big = Frame::new(FrameHeader::data(1, 0, 0), vec![0u8; 1 << 20]);
        while to_child.try_send(big.clone()).is_ok() {}
        send_credit(&to_child, 7, 128);

        let (in_tx, mut in_rx) = mpsc::channel(64);
        let (_parent, _w) = spawn_link(far_read, far_write, 0, "parent".into(), in_tx);
        let credit = tokio::time::timeout(Duration::from_secs(20), async {
            while let Some(Inbound { event: LinkEvent::Frames(frames), .. }) = in_rx.recv().await {
                if let Some(f) = frames.into_iter().find(|f| f.header.kind == FrameKind::Credit) {
                    return f.header;
                }
            }
            panic!("link closed before the credit arrived");
        })
        .await
        .unwrap();
        assert_eq!((credit.stream, credit.credits()), (7, 128));
    }
}
