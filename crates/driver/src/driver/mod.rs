//! The tokio driver around a [`Node`]: one per process, whatever its role.
//!
//! A [`Driver`] owns the node's core, its route (a [`MonitoredRoute`]: every link's
//! socket, and the multicast groups) and its timer, and runs them from one task: a
//! frame goes from the socket read straight into the core, and from the core straight
//! into the socket write, with no channel or task in between. Starting children
//! (processes, listeners, handshakes) runs beside it in a task of its own
//! (`children.rs`), which hands over each authenticated link and each exit.
//!
//! The front-end and the back-ends share their driver with the tool through a
//! mutex never held across an `.await` (the tool's calls go straight into the core
//! and out to the sockets); a comm node has no tool. What the driver does not handle
//! itself goes to the role's [`Tool`].

pub(crate) mod children;
mod launching;
pub(crate) mod node_route;
mod refusals;

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use treecast_transport::recording::{mono_now, LinkPlace, Mono};
use treecast_transport::{Close, LinkId, LinkPeer, LinkTable, MonitoredRoute, RouteEvent, Socket};

use treecast_wire::{ControlMsg, Frame, FrameKind, RankSet};

use children::{ChildNews, ChildOrder, ChildrenTask};
pub use launching::Launching;
use treecast_proto::{control_frame, Command, CommandError, EndReason, Event, Node, Peer};

/// How long a node waits for its children to exit after a shutdown before killing them.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long a last flush may wait per link when the process is about to end.
pub const LAST_FLUSH: Duration = Duration::from_secs(5);
/// Most payload bytes kept for one announced child until its link connects; past
/// this the child is given up on.
pub const MAX_AWAITING_BYTES: usize = 64 << 20;

/// What a role does with the events its driver does not handle itself.
pub trait Tool: Send + 'static {
    /// An event for the tool (packets ready, writable again, lost ranks, launch done …).
    fn event(&mut self, event: Event);
}

/// A comm node's tool: there is none; events are logged.
#[derive(Debug, Default)]
pub struct NoTool;

impl Tool for NoTool {
    fn event(&mut self, event: Event) {
        match event {
            // Already reported to the parent, which passes it up to the front-end: the
            // user sees it there once, not once per level through forwarded stderr.
            Event::StartupFailed { message } => tracing::debug!("start-up failed: {message}"),
            Event::Shutdown { reason } => tracing::info!("shutting down: {reason}"),
            other => tracing::debug!("{other:?}"),
        }
    }
}

/// A node's core, links and timer, driven from one task. See the module documentation.
///
/// Generic over its route, chosen once when the node starts (`node_route.rs`: the
/// same for every node today), rather than a `dyn Route`: every frame read and
/// every frame sent goes through the route, and the per-frame path is counted to
/// the instruction (docs/monitoring.md), so the route's calls stay direct and can
/// be inlined. A route chosen at run time among several would be an enum over
/// them, matched once per call, still with no indirect call.
pub struct Driver<T: Tool, R: MonitoredRoute> {
    core: Node,
    route: R,
    links: LinkTable<()>,
    tool: T,
    launching: Launching,
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    timer_at: Option<Instant>,
    news: Option<mpsc::Receiver<ChildNews>>,
    orders: Option<mpsc::UnboundedSender<ChildOrder>>,
    children_task: Option<JoinHandle<()>>,
    /// The driving task, to wake after the tool gave the core something to do.
    task: Option<Waker>,
    /// The driving task was woken and has not polled since: a loop of sends wakes
    /// it once, not once per send (each wake is an atomic update of the task).
    task_woken: bool,
    /// Tools waiting until what they sent is written out ([`Driver::poll_flushed`]).
    flush_waiters: Vec<Waker>,
    /// The node is over: links are flushed and closed, children are stopped.
    ending: bool,
    /// When a peer that does not read stops holding up the end: what is still queued
    /// is dropped then.
    flush_deadline: Option<Instant>,
    flush_timer: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A connection to a new parent under way (this node's parent was lost).
    rejoin: Option<Rejoin>,
    /// The node is over but its multicast is not: links close (flushed) once every
    /// member holds every message, so that the end of a link does not overtake the
    /// frames multicast before it.
    close_after_multicast: bool,
    /// Children that announced themselves (light joins) and have not connected:
    /// the link id the core knows them by, with what it sent them meanwhile.
    awaiting: HashMap<LinkId, AwaitedLink>,
    /// Links that brought control frames in one read pass (kept empty, with its room).
    control_from: Vec<LinkId>,
}

/// A child's link the core already uses while its connection is on the way.
#[derive(Debug)]
struct AwaitedLink {
    node_id: u32,
    frames: Vec<Frame>,
    bytes: usize,
    /// The core retired the child: its link closes once what waited is written.
    retired: bool,
}

/// A connection to a new parent under way.
struct Rejoin {
    address: String,
    done: tokio::sync::oneshot::Receiver<Result<Socket, String>>,
    task: JoinHandle<()>,
}

impl<T: Tool, R: MonitoredRoute> std::fmt::Debug for Driver<T, R> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").field("core", &self.core).field("route", &self.route).finish()
    }
}

/// Gives `route` the clock of `core`, if it has one: monitoring stamps frames on the
/// global clock's time base.
fn clock_to_route(core: &Node, route: &mut impl MonitoredRoute) {
    let Some(source) = core.clock_source() else { return };
    // The monotonic reading at the source's Instant base (Instant reads the same
    // clock on Linux), within the tens of nanoseconds between the two.
    let (now, mono) = (Instant::now(), mono_now());
    let since = u64::try_from(now.saturating_duration_since(source.base).as_nanos()).unwrap_or(u64::MAX);
    let base_mono = Mono::from_nanos(mono.nanos().saturating_sub(since));
    route.set_clock(source.node_clock(base_mono));
}

impl<T: Tool, R: MonitoredRoute> Driver<T, R> {
    /// A driver for `core` over `route` (with no link yet).
    pub fn with_route(core: Node, tool: T, launching: Launching, mut route: R) -> Self {
        clock_to_route(&core, &mut route);
        Driver {
            core,
            route,
            close_after_multicast: false,
            links: LinkTable::new(),
            tool,
            launching,
            timer: None,
            timer_at: None,
            news: None,
            orders: None,
            children_task: None,
            task: None,
            task_woken: false,
            flush_waiters: Vec::new(),
            ending: false,
            flush_deadline: None,
            flush_timer: None,
            rejoin: None,
            awaiting: HashMap::new(),
            control_from: Vec::new(),
        }
    }

    /// The core, to read its state.
    pub fn core(&self) -> &Node {
        &self.core
    }

    /// The filters the core can make, to register a tool's plug-ins.
    pub fn registry_mut(&mut self) -> &mut treecast_filters::FilterRegistry {
        self.core.registry_mut()
    }

    /// Front-end: takes the comm nodes' refusals of the shipped plug-in whose bytes
    /// hash to `sha256`.
    pub fn take_filter_refusals(&mut self, sha256: &[u8; 32]) -> Vec<treecast_proto::FilterRefusal> {
        self.core.take_filter_refusals(sha256)
    }

    /// Front-end: takes monitoring collection `id` once complete.
    pub fn take_monitor_collection(&mut self, id: u32) -> Option<treecast_monitor::Collection> {
        self.core.take_monitor_collection(id)
    }

    /// Ready once everything the tool sent so far is written to the kernel (or its
    /// link is gone): a tool's flush. Otherwise `cx` is woken when the driving task
    /// has written it; a peer that stops reading keeps it pending, so callers bound
    /// the wait.
    pub fn poll_flushed(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        self.drain();
        if self.route.is_flushed() {
            return Poll::Ready(());
        }
        if !self.flush_waiters.iter().any(|w| w.will_wake(cx.waker())) {
            self.flush_waiters.push(cx.waker().clone());
        }
        if let Some(task) = &self.task {
            task.wake_by_ref();
        }
        Poll::Pending
    }

    /// The tool.
    pub fn tool(&mut self) -> &mut T {
        &mut self.tool
    }

    /// Links `socket` (authenticated already) to `peer`.
    ///
    /// # Errors
    /// The socket could not be registered with the runtime.
    pub fn add_link(&mut self, socket: Socket, peer: Peer, name: String) -> std::io::Result<LinkId> {
        self.add_links(vec![socket], peer, name)
    }

    /// Links `sockets` (each authenticated already, all to `peer`) as one striped
    /// link; one socket is a plain link.
    ///
    /// # Errors
    /// The sockets could not be registered with the runtime, or the route carries
    /// one connection per link.
    pub fn add_links(&mut self, sockets: Vec<Socket>, peer: Peer, name: String) -> std::io::Result<LinkId> {
        let link = self.links.insert(());
        if let Err(e) = self.attach_socket(link, sockets, peer, name) {
            self.links.remove(link);
            return Err(e);
        }
        self.core.handle_link_up(link, peer, Instant::now());
        self.refresh_reach(link);
        self.after_input();
        Ok(link)
    }

    /// Tells the route how many back-ends the child on `link` reaches (nothing for
    /// other links), which bounds the control frames it may send.
    fn refresh_reach(&mut self, link: LinkId) {
        if let Some(backends) = self.core.child_reach(link) {
            self.route.set_reach(link, backends);
        }
    }

    /// Gives `link` its socket in the route.
    fn attach_socket(
        &mut self,
        link: LinkId,
        sockets: Vec<Socket>,
        peer: Peer,
        name: String,
    ) -> std::io::Result<()> {
        // The route logs why it closes a link: a child is named as the tree knows it.
        let name = match &peer {
            Peer::Child { node_id } => format!("child node {node_id} ({name})"),
            _ => name,
        };
        let (to, place) = match peer {
            Peer::Parent => {
                (LinkPeer::Parent, LinkPlace { lower_node: self.core.node_id(), to_parent: true })
            }
            Peer::Child { node_id } => {
                (LinkPeer::Child { node_id }, LinkPlace { lower_node: node_id, to_parent: false })
            }
            // Named apart from every node of the tree: by where the other network's
            // ranks are numbered here.
            Peer::Remote(spec) => {
                let lower_node = treecast_proto::remote_base(spec.index);
                (LinkPeer::Remote, LinkPlace { lower_node, to_parent: true })
            }
        };
        // The route's own first frames (a multicast offer) go ahead of the core's.
        self.route.add_links(link, sockets, to, name)?;
        self.route.place_link(link, place);
        Ok(())
    }

    /// A child announced itself (a light join): the core gets its link and its
    /// join now, and what the core sends on that link waits here until the child
    /// connects. If it connected first, the join goes on its link.
    fn child_announced(&mut self, node_id: u32, rank: u32) {
        let now = Instant::now();
        let join = control_frame(&ControlMsg::Join { ranks: RankSet::single(rank), commnodes: 0 });
        if let Some(link) = self.core.child_link(node_id) {
            self.core.handle_frame(link, join, now);
            return self.after_input();
        }
        let link = self.links.insert(());
        self.awaiting.insert(link, AwaitedLink { node_id, frames: Vec::new(), bytes: 0, retired: false });
        self.core.handle_link_up(link, Peer::Child { node_id }, now);
        self.core.handle_frame(link, join, now);
        self.after_input();
    }

    /// A child connected: an announced one's link gets its socket and what waited
    /// for it, in order; any other is a new link.
    fn child_connected(&mut self, node_id: u32, sockets: Vec<Socket>, peer: String) -> std::io::Result<()> {
        let Some((link, awaited)) = self.awaited_link(node_id).and_then(|l| self.awaiting.remove_entry(&l))
        else {
            return self.add_links(sockets, Peer::Child { node_id }, peer).map(drop);
        };
        if let Err(e) = self.attach_socket(link, sockets, Peer::Child { node_id }, peer) {
            self.links.remove(link);
            self.core.handle_link_closed(
                link,
                Some(format!("its link could not be taken over: {e}")),
                Instant::now(),
            );
            self.after_input();
            return Ok(());
        }
        self.refresh_reach(link);
        for frame in &awaited.frames {
            self.route.send(&[link], frame);
        }
        if awaited.retired {
            self.route.close(link, Close::Flush);
            self.links.remove(link);
        }
        self.after_input();
        Ok(())
    }

    /// The link of the announced child `node_id` that has not connected yet.
    fn awaited_link(&self, node_id: u32) -> Option<LinkId> {
        self.awaiting.iter().find(|(_, a)| a.node_id == node_id).map(|(&l, _)| l)
    }

    /// Drops an announced child's link that never connected.
    fn give_up_awaited(&mut self, link: LinkId, reason: String) {
        if self.awaiting.remove(&link).is_some() {
            self.links.remove(link);
            self.core.handle_link_closed(link, Some(reason), Instant::now());
        }
    }

    /// Sends `frame` to `links`: through the route, or kept for announced
    /// children that have not connected yet.
    fn transmit(&mut self, links: &[LinkId], frame: &Frame) {
        if self.awaiting.is_empty() || !links.iter().any(|l| self.awaiting.contains_key(l)) {
            return self.route.send(links, frame);
        }
        let mut live = Vec::with_capacity(links.len());
        let mut over = Vec::new();
        for &link in links {
            match self.awaiting.get_mut(&link) {
                Some(a) => {
                    a.bytes += frame.payload.len();
                    a.frames.push(frame.clone());
                    if a.bytes > MAX_AWAITING_BYTES {
                        over.push(link);
                    }
                }
                None => live.push(link),
            }
        }
        if !live.is_empty() {
            self.route.send(&live, frame);
        }
        for link in over {
            let reason = format!(
                "announced itself but did not connect before {MAX_AWAITING_BYTES} bytes waited for it"
            );
            self.give_up_awaited(link, reason);
        }
    }

    /// Gives the core a command from the tool and sends what comes of it at once.
    ///
    /// # Errors
    /// What the core refused.
    pub fn command(&mut self, cmd: Command) -> Result<(), CommandError> {
        let r = self.core.handle_command(cmd, Instant::now());
        self.after_input();
        r
    }

    /// [`Driver::command`] for [`Command::Send`]'s frame, without reading the clock
    /// (the core takes no time for a send; the precise clock read for nothing was 4 %
    /// of a back-end's CPU in a burst).
    ///
    /// # Errors
    /// As [`Node::handle_send`].
    pub fn send(&mut self, frame: Frame) -> Result<(), CommandError> {
        let r = self.core.handle_send(frame);
        self.after_input();
        r
    }

    /// Takes the next thing the tool reads (see [`Node::poll_delivery`]), sending the
    /// credit its reading gives back.
    pub fn deliver(&mut self, stream: Option<u32>) -> Option<treecast_proto::Delivery> {
        let d = self.core.poll_delivery(stream);
        if d.is_some() {
            self.after_input();
        }
        d
    }

    /// Queues and handles what the core produced, and wakes the driving task, which
    /// writes it out and re-arms the timer. Writes wait for the task rather than go
    /// out here so that a tool sending many packets in a row has them written together,
    /// in one system call, when it next yields.
    fn after_input(&mut self) {
        self.drain();
        if let Some(w) = self.task.as_ref().filter(|_| !self.task_woken) {
            w.wake_by_ref();
            self.task_woken = true;
        }
    }

    /// Moves the core's transmits to the route and handles its events.
    fn drain(&mut self) -> bool {
        let mut any = false;
        loop {
            // Members join and leave: frames wait for the whole group only while it multicasts.
            self.core.send_together(self.route.send_together());
            let mut progressed = false;
            // A new stream's choice before its first frames.
            while let Some((stream, route)) = self.core.poll_stream_route() {
                self.route.set_stream_route(stream, route);
            }
            while let Some(t) = self.core.poll_transmit() {
                self.transmit(t.to.links(), &t.frame);
                progressed = true;
            }
            // Outside the runtime (a C caller's send that only looked) events wait
            // for the driving task, which this input woke: handling some starts tasks
            // or timers, which need the runtime.
            if self.core.has_event() && tokio::runtime::Handle::try_current().is_ok() {
                while let Some(e) = self.core.poll_event() {
                    self.on_event(e);
                    progressed = true;
                }
            }
            if !progressed {
                return any;
            }
            any = true;
        }
    }

    fn on_event(&mut self, event: Event) {
        match event {
            Event::ClockChanged => clock_to_route(&self.core, &mut self.route),
            Event::StartChildren { children, .. } if self.children_task.is_some() => {
                self.order(ChildOrder::Start(children));
            }
            Event::StartChildren { plan, own_host, children } => {
                self.route.apply_plan(&plan);
                let (news_tx, news_rx) = mpsc::channel(64);
                let (orders_tx, orders_rx) = mpsc::unbounded_channel();
                let task = ChildrenTask {
                    plan,
                    own_host,
                    children,
                    launching: self.launching.clone(),
                    local_hosts: treecast_launch::LocalHosts::new(),
                    news: news_tx,
                    orders: orders_rx,
                };
                self.children_task = Some(tokio::spawn(task.run()));
                self.news = Some(news_rx);
                self.orders = Some(orders_tx);
            }
            Event::CloseLink { link, reason } => {
                tracing::debug!(node = %self.core.name(), "closing {link}: {reason}");
                self.awaiting.remove(&link);
                self.route.close(link, Close::Now);
                self.links.remove(link);
            }
            Event::AbandonChild { node_id } => self.order(ChildOrder::Abandon(node_id)),
            Event::RetireChild { node_id, link } => {
                // A child still to connect gets what waited for it (its stop) first.
                if let Some(a) = self.awaiting.get_mut(&link) {
                    a.retired = true;
                    return self.order(ChildOrder::Retire(node_id));
                }
                self.route.close(link, Close::Flush);
                self.links.remove(link);
                self.order(ChildOrder::Retire(node_id));
            }
            Event::Ready { .. } => {
                // With recovery on, the orphans of a lost child connect here to rejoin.
                if self.core.rejoin_limit().is_none() {
                    self.order(ChildOrder::StopAccepting);
                }
                self.tool.event(event);
            }
            Event::Rejoin { address, within } => self.start_rejoin(address, within),
            Event::LinkClock { link, clock } => self.route.set_peer_clock(link, clock),
            Event::MonitorStart { program } => self.route.monitor_start(program),
            Event::MonitorStop => self.route.monitor_stop(),
            Event::StreamProgram { stream, program } => self.route.set_stream_program(stream, program),
            Event::MonitorCollectLocal { id } => {
                let report = self.route.monitor_report();
                // Only the front-end refuses monitoring commands, and not this one.
                let _ = self.core.handle_command(Command::MonitorLocal { id, report }, Instant::now());
            }
            Event::ParentChanged { .. } => self.tool.event(event),
            Event::Placed { .. } => {
                self.route.set_zero_copy_min(self.core.zero_copy_min());
                if let Some(limit) = self.core.stripe_stall() {
                    self.route.set_stripe_stall(limit);
                }
                self.tool.event(event);
            }
            Event::Shutdown { .. } | Event::StartupFailed { .. } => {
                self.begin_end();
                self.tool.event(event);
            }
            other => self.tool.event(other),
        }
    }

    /// Connects to a new parent in a task of its own; [`Driver::poll_rejoin`] takes the link.
    fn start_rejoin(&mut self, address: String, within: Duration) {
        let (tx, done) = tokio::sync::oneshot::channel();
        let secret = self.launching.secret.clone();
        let node_id = self.core.node_id();
        let to = address.clone();
        let task = tokio::spawn(async move {
            let linked = match crate::join::connect_to(&to, node_id, &secret, within).await {
                Ok(stream) => stream.into_socket().map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            let _ = tx.send(linked);
        });
        if let Some(old) = self.rejoin.replace(Rejoin { address, done, task }) {
            old.task.abort();
        }
    }

    /// Takes the link to the new parent once connected, or reports the failure.
    fn poll_rejoin(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(r) = self.rejoin.as_mut() else { return false };
        let Poll::Ready(linked) = Pin::new(&mut r.done).poll(cx) else { return false };
        let address = r.address.clone();
        self.rejoin = None;
        let now = Instant::now();
        let result = linked.map_err(|_| "the connecting task ended".to_owned()).and_then(|r| r);
        match result {
            Ok(socket) => {
                if let Err(e) = self.add_link(socket, Peer::Parent, format!("parent {address}")) {
                    let reason = format!("the link could not be taken over: {e}");
                    let _ = self.core.handle_command(Command::RejoinFailed { reason }, now);
                }
            }
            Err(reason) => {
                let _ = self.core.handle_command(Command::RejoinFailed { reason }, now);
            }
        }
        true
    }

    fn order(&self, order: ChildOrder) {
        if let Some(tx) = &self.orders {
            let _ = tx.send(order);
        }
    }

    /// The node is over: every link closes once flushed, children get time to exit.
    fn begin_end(&mut self) {
        if self.ending {
            return;
        }
        self.ending = true;
        if let Some(r) = self.rejoin.take() {
            r.task.abort();
        }
        let deadline = Instant::now() + LAST_FLUSH;
        self.flush_deadline = Some(deadline);
        self.flush_timer = Some(Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(deadline))));
        self.drain();
        if self.route.is_settled() {
            self.close_links_flushed();
        } else {
            self.close_after_multicast = true;
        }
        self.order(ChildOrder::Shutdown { grace: SHUTDOWN_GRACE });
    }

    fn close_links_flushed(&mut self) {
        self.close_after_multicast = false;
        let links: Vec<LinkId> = self.links.iter().map(|(l, _)| l).collect();
        for link in links {
            self.route.close(link, Close::Flush);
        }
    }

    /// Drives the node: reads the links, fires the timer, writes what the core sends.
    /// Ready once the node is over, its links flushed and its children stopped.
    pub fn poll_drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if !self.task.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
            self.task = Some(cx.waker().clone());
        }
        // Under the lock, so input after this poll wakes the task again.
        self.task_woken = false;
        loop {
            let mut progressed = self.poll_news(cx);
            progressed |= self.poll_rejoin(cx);
            let mut now = Instant::now();
            let core = &mut self.core;
            let links = &mut self.links;
            let mut told = std::mem::take(&mut self.control_from);
            progressed |= self.route.poll_recv(cx, &mut |link, event| match event {
                RouteEvent::Frame(frame) => {
                    if frame.header.kind == FrameKind::Control {
                        told.push(link);
                    }
                    core.handle_frame(link, frame, now)
                }
                RouteEvent::Timed(frame, read_at) => {
                    // A clock probe is measured from the end of its read; the time the
                    // core sees never goes back.
                    now = now.max(read_at);
                    core.handle_frame(link, frame, now)
                }
                RouteEvent::Closed(reason) => {
                    links.remove(link);
                    core.handle_link_closed(link, reason, now);
                }
            });
            // A join or rejoin may have changed what a child reaches.
            for link in told.drain(..) {
                self.refresh_reach(link);
            }
            self.control_from = told;
            if let Some(timer) = self.timer.as_mut() {
                if timer.as_mut().poll(cx).is_ready() {
                    self.timer = None;
                    self.timer_at = None;
                    self.core.handle_timeout(Instant::now());
                    progressed = true;
                }
            }
            progressed |= self.drain();
            self.route.flush();
            if !progressed {
                break;
            }
        }
        if !self.flush_waiters.is_empty() && self.route.is_flushed() {
            self.flush_waiters.drain(..).for_each(Waker::wake);
        }
        self.arm_timer(cx);
        if self.close_after_multicast && (self.route.is_settled() || self.flush_expired(cx)) {
            self.close_links_flushed();
            self.route.flush();
        }
        if self.ending && !self.route.is_flushed() && self.flush_expired(cx) {
            // A peer that stopped reading must not keep this node alive.
            tracing::warn!(node = %self.core.name(), "dropping what peers did not take within {LAST_FLUSH:?}");
            let links: Vec<LinkId> = self.links.iter().map(|(l, _)| l).collect();
            for link in links {
                self.route.close(link, Close::Now);
                self.links.remove(link);
            }
        }
        if self.ending && !self.close_after_multicast && self.route.is_flushed() && self.children_done(cx) {
            return Poll::Ready(());
        }
        Poll::Pending
    }

    fn poll_news(&mut self, cx: &mut Context<'_>) -> bool {
        let mut progressed = false;
        while let Some(rx) = self.news.as_mut() {
            match rx.poll_recv(cx) {
                Poll::Ready(Some(news)) => {
                    progressed = true;
                    self.on_news(news);
                }
                Poll::Ready(None) => self.news = None,
                Poll::Pending => break,
            }
        }
        progressed
    }

    fn on_news(&mut self, news: ChildNews) {
        let now = Instant::now();
        match news {
            ChildNews::Announced { node_id, rank } => self.child_announced(node_id, rank),
            ChildNews::Connected { node_id, sockets, peer } => {
                if let Err(e) = self.child_connected(node_id, sockets, peer) {
                    let reason = format!("its link could not be taken over: {e}");
                    let _ = self.core.handle_command(Command::ChildNotStarted { node_id, reason }, now);
                }
            }
            ChildNews::Exited { node_id, detail } => {
                if let Some(link) = self.awaited_link(node_id) {
                    self.give_up_awaited(link, "announced itself, then exited before connecting".into());
                }
                let _ = self.core.handle_command(Command::ChildExited { node_id, detail }, now);
            }
            ChildNews::NotStarted { node_id, reason } => {
                let _ = self.core.handle_command(Command::ChildNotStarted { node_id, reason }, now);
            }
            ChildNews::AttachPoints(points) => {
                let _ = self.core.handle_command(Command::OwnAttachPoints(points), now);
            }
        }
    }

    fn arm_timer(&mut self, cx: &mut Context<'_>) {
        let at = self.core.poll_timeout();
        if at == self.timer_at {
            return;
        }
        self.timer_at = at;
        self.timer = at.map(|at| Box::pin(tokio::time::sleep_until(tokio::time::Instant::from_std(at))));
        if let Some(timer) = self.timer.as_mut() {
            if timer.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
        }
    }

    /// True once the time for the last flush is over (and arms the wake-up until then).
    fn flush_expired(&mut self, cx: &mut Context<'_>) -> bool {
        match self.flush_timer.as_mut() {
            Some(t) => t.as_mut().poll(cx).is_ready(),
            None => self.flush_deadline.is_some_and(|d| d <= Instant::now()),
        }
    }

    fn children_done(&mut self, cx: &mut Context<'_>) -> bool {
        match self.children_task.as_mut() {
            None => true,
            Some(task) => match Pin::new(task).poll(cx) {
                Poll::Ready(_) => {
                    self.children_task = None;
                    true
                }
                Poll::Pending => false,
            },
        }
    }

    /// Writes what is still queued, waiting at most `limit` per link: for a process
    /// about to end, when no event loop will run again.
    pub fn flush_blocking(&mut self, limit: Duration) {
        self.drain();
        self.route.flush_blocking(limit);
    }

    /// Bytes written on TCP links that the peers have not acknowledged yet.
    pub fn unacknowledged(&self) -> usize {
        self.route.unacknowledged()
    }

    /// Stops the children at once (the tool is gone): their processes are killed.
    pub fn kill_children(&mut self) {
        if let Some(task) = self.children_task.take() {
            task.abort();
        }
    }
}

/// Locks a shared driver; a panic while it was held left it usable (no code panics
/// half-way through an update it could observe).
pub fn lock<T: Tool, R: MonitoredRoute>(shared: &Arc<Mutex<Driver<T, R>>>) -> MutexGuard<'_, Driver<T, R>> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Drives a shared driver until its node is over.
///
/// Cancel safety: cancel safe; the driver keeps its state and can be driven again.
pub async fn drive<T: Tool, R: MonitoredRoute>(shared: Arc<Mutex<Driver<T, R>>>) {
    let on_panic = EndToolOnPanic(&shared);
    std::future::poll_fn(|cx| lock(&shared).poll_drive(cx)).await;
    drop(on_panic);
}

/// Tells the tool its node is over when the driving task unwinds from a panic: the
/// runtime catches the panic and the process lives on, so without this a back-end
/// would wait on `recv` forever with nothing driving its links.
struct EndToolOnPanic<'a, T: Tool, R: MonitoredRoute>(&'a Arc<Mutex<Driver<T, R>>>);

impl<T: Tool, R: MonitoredRoute> Drop for EndToolOnPanic<'_, T, R> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let error = "its driver panicked (the panic message is in its log)".to_owned();
            lock(self.0).tool().event(Event::Shutdown { reason: EndReason::Internal { error } });
        }
    }
}
