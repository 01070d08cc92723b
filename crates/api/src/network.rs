//! The front-end's handle on a running tree: communicators, streams, events, shutdown.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use treecast_driver::{lock, Shared};
use treecast_proto::{Command, LostRanks};
use treecast_topology::Topology;
use treecast_wire::{FilterSpec, RankSet, RouteChoice, StreamSpec, MAX_FILTER_NAME};

use crate::frontend::{FeTool, Launched};
use crate::{ApiError, Communicator, Event, Stream, StreamOptions};

/// How long [`Network::monitor_start`] and [`Network::monitor_stop`] wait for every
/// node to confirm.
pub const MONITOR_ORDER_LIMIT: Duration = Duration::from_secs(10);

/// A running tree, seen from the front-end that launched it.
///
/// Dropping it kills the processes it started (the tree's first level); the nodes
/// below find their parent gone and end once their rejoin limit has passed (10 s
/// by default). [`Network::shutdown`] stops every process at once, in order.
pub struct Network {
    pub(crate) shared: Shared<FeTool>,
    task: Option<JoinHandle<()>>,
    topology: Topology,
    session: String,
    startup: Duration,
    commnodes: u32,
    /// Spawns: ids, ranks, placement, and the ranks given out.
    pub(crate) spawner: crate::spawn::Spawner,
    /// Serves back-ends' spawn requests.
    spawn_server: Option<JoinHandle<()>>,
    next_stream: AtomicU32,
    /// Ids of monitoring collections.
    pub(crate) next_collect: AtomicU32,
    lost: watch::Receiver<LostRanks>,
    /// What the links carry besides one connection each (set by the builder).
    pub(crate) carried: Carried,
}

/// What the network's links carry besides one connection each, which bounds the
/// routes a stream may choose.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Carried {
    /// UDP multicast groups (the udp route).
    pub(crate) udp: bool,
    /// Connections per link (striped links when 2 or more).
    pub(crate) stripes: u8,
}

impl Carried {
    /// Refuses a stream route the links cannot take, saying how to launch one that can.
    fn check(self, route: RouteChoice) -> Result<(), ApiError> {
        let why = match route {
            RouteChoice::Udp if !self.udp => {
                "the network has no multicast groups; launch it with the udp route (--route udp; \
                 NetworkBuilder::udp_route, tc_network_options_set_route, Network(route=\"udp\") in \
                 Python) and its streams may then choose udp or tcp"
            }
            RouteChoice::Striped if self.stripes < 2 => {
                "the network's links are one connection each; launch it with striped links \
                 (--route striped:N; NetworkBuilder::stripes, tc_network_options_set_route, \
                 Network(route=\"striped:N\") in Python) and its streams may then choose striped or tcp"
            }
            _ => return Ok(()),
        };
        Err(ApiError::RouteNotCarried { route, why })
    }
}

impl std::fmt::Debug for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Network").field("session", &self.session).field("backends", &self.backends()).finish()
    }
}

fn check_filter_name(spec: &FilterSpec) -> Result<(), ApiError> {
    if spec.name.is_empty() || spec.name.len() > MAX_FILTER_NAME {
        return Err(ApiError::FilterName {
            name: spec.name.clone(),
            len: spec.name.len(),
            max: MAX_FILTER_NAME,
        });
    }
    Ok(())
}

impl Network {
    pub(crate) fn new(
        shared: Shared<FeTool>,
        task: JoinHandle<()>,
        topology: Topology,
        session: String,
        launched: Launched,
        startup: Duration,
        lost: watch::Receiver<LostRanks>,
    ) -> Network {
        let backends = topology.backends() as u32;
        let spawner = crate::spawn::Spawner {
            shared: shared.clone(),
            book: std::sync::Arc::new(std::sync::Mutex::new(crate::spawn::SpawnBook::new(
                &topology, backends,
            ))),
        };
        Network {
            shared,
            task: Some(task),
            spawn_server: Some(tokio::spawn(crate::spawn::serve_requests(spawner.clone()))),
            spawner,
            topology,
            session,
            startup,
            commnodes: launched.commnodes,
            next_stream: AtomicU32::new(1),
            next_collect: AtomicU32::new(1),
            lost,
            carried: Carried::default(),
        }
    }

    /// Number of ranks given out (ranks `0..backends()`): the launch's back-ends and
    /// every spawned one, including those that left or were lost since.
    pub fn backends(&self) -> u32 {
        self.spawner.ranks_given()
    }

    /// Number of comm nodes (the front-end not included).
    pub fn commnodes(&self) -> u32 {
        self.commnodes
    }

    /// The tree this network was launched from.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Session id, also in every process's `TREECAST_SESSION`.
    pub fn session(&self) -> &str {
        &self.session
    }

    /// Time from launch until every back-end had reported.
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// The communicator of every back-end.
    pub fn broadcast_communicator(&self) -> Communicator {
        Communicator::over(RankSet::range(0, self.backends()))
    }

    /// A communicator over some back-ends.
    ///
    /// # Errors
    /// [`ApiError::NoSuchRanks`] for ranks outside `0..backends()` or an empty set.
    pub fn communicator(&self, ranks: RankSet) -> Result<Communicator, ApiError> {
        let outside = ranks.difference(&RankSet::range(0, self.backends()));
        if !outside.is_empty() || ranks.is_empty() {
            return Err(ApiError::NoSuchRanks { ranks: outside, last: self.backends().saturating_sub(1) });
        }
        Ok(Communicator::over(ranks))
    }

    /// Creates a stream over `comm` with the given filters.
    ///
    /// # Errors
    /// A filter this front-end does not have or that refuses its parameters, empty
    /// windows, a route the network's links do not carry
    /// ([`ApiError::RouteNotCarried`]: udp without the udp route, striped without
    /// striped links), or [`ApiError::Closed`] when the network is gone. A comm node that
    /// cannot make the filters later refuses the stream: [`Event::StreamRefused`], and
    /// the stream's `recv` fails with [`ApiError::StreamRefused`].
    ///
    /// Cancel safety: cancel safe (it does not wait).
    pub async fn new_stream(&self, comm: &Communicator, options: StreamOptions) -> Result<Stream, ApiError> {
        check_filter_name(&options.up)?;
        check_filter_name(&options.down)?;
        for (what, w) in [("upward", options.up_window), ("downward", options.down_window)] {
            if w.packets == 0 || w.bytes == 0 {
                return Err(ApiError::EmptyWindow { which: what });
            }
        }
        self.carried.check(options.route)?;
        // The id is taken under the lock: the core wants ids in increasing order, and two
        // calls racing for the lock must not reach it out of order.
        let mut d = lock(&self.shared);
        let id = self.next_stream.fetch_add(1, Ordering::Relaxed);
        let spec = StreamSpec {
            id,
            ranks: comm.ranks().clone(),
            sync: options.sync,
            up: options.up.clone(),
            down: options.down.clone(),
            up_window: options.up_window,
            down_window: options.down_window,
            program: options.program,
            route: options.route,
        };
        d.command(Command::NewStream(spec)).map_err(|e| ApiError::from_command(id, e))?;
        drop(d);
        Ok(Stream::new(id, self.shared.clone(), comm.clone(), options, self.backends()))
    }

    /// Loads the plug-in filter at `path` here and ships its bytes down the tree: every
    /// comm node checks their SHA-256, loads them from a sealed memory file (no shared
    /// file system is needed; the file may go once this returns) and registers the
    /// filter under its own name and version. Returns once every node has confirmed
    /// that it handled them (within [`crate::MONITOR_ORDER_LIMIT`]), so a stream made
    /// afterwards finds the filter at every node, or fails naming a node that refused
    /// it; that node also reports an [`crate::Event::FilterError`] and refuses streams
    /// that use the filter, so none is made half-way.
    ///
    /// # Errors
    /// The file cannot be read or is not a plug-in this front-end can load
    /// ([`ApiError::Plugin`]), a comm node refused it ([`ApiError::FilterRefused`],
    /// naming the node and its reason), nodes did not confirm in time
    /// ([`ApiError::FilterUnconfirmed`]), or the network is not running.
    ///
    /// Cancel safety: cancelling stops the wait only; the plug-in is shipped anyway.
    pub async fn load_filter(
        &self,
        path: impl AsRef<std::path::Path>,
    ) -> Result<treecast_plugin::Plugin, ApiError> {
        use sha2::Digest;
        use treecast_plugin::{Plugin, PluginError};
        let path = path.as_ref();
        let bytes =
            std::fs::read(path).map_err(|source| PluginError::Read { path: path.to_owned(), source })?;
        let label =
            path.file_name().map_or_else(|| path.display().to_string(), |n| n.to_string_lossy().into_owned());
        let plugin = Plugin::load_bytes(&bytes, &label)?;
        let sha256: [u8; 32] = sha2::Sha256::digest(&bytes).into();
        {
            let mut d = lock(&self.shared);
            plugin.register(d.registry_mut());
            d.command(Command::ShipFilter { label: label.clone(), sha256, bytes })
                .map_err(|e| ApiError::Refused(Box::new(e)))?;
        }
        // A confirmation travels behind the bytes on every link, and a refusal goes up
        // ahead of the refusing node's confirmation: once all confirmed, every refusal is here.
        let missing = self.confirmed().await?;
        let mut refusals = lock(&self.shared).take_filter_refusals(&sha256).into_iter();
        if let Some(first) = refusals.next() {
            let others = refusals.count();
            return Err(ApiError::FilterRefused {
                filter: label,
                node: first.node,
                reason: first.reason,
                others,
            });
        }
        if !missing.is_empty() {
            let nodes = missing.join(", ");
            return Err(ApiError::FilterUnconfirmed { filter: label, nodes, limit: MONITOR_ORDER_LIMIT });
        }
        Ok(plugin)
    }

    /// Waits until everything sent so far (packets, stream commands) is written out
    /// to the links: what MRNet's `flush` promises. Sends go out as soon as the
    /// kernel takes them, so this only waits where a link is full (a peer reading
    /// slowly); bound it with a timeout, as a peer that stops reading never lets it end.
    ///
    /// Cancel safety: cancel safe.
    pub async fn flush(&self) {
        std::future::poll_fn(|cx| lock(&self.shared).poll_flushed(cx)).await
    }

    /// Payload bytes the front-end holds now: reductions the tool has not read, and
    /// packets from its children waiting for their wave or for the tool to read.
    /// Flow control bounds it by the receive window plus one upward window per child
    /// and stream.
    pub fn held_bytes(&self) -> u64 {
        lock(&self.shared).core().held_bytes()
    }

    /// Every rank lost so far (including ranks missing at launch), whoever read the events.
    pub fn lost_ranks(&self) -> RankSet {
        self.lost.borrow().ranks().clone()
    }

    /// Every rank lost so far, with the reasons; see [`Network::lost_ranks`].
    pub fn lost(&self) -> LostRanks {
        self.lost.borrow().clone()
    }

    /// The ranks of every comm node lost so far ([`Event::NodeLost`]), one entry per
    /// loss in order, with why, whether or not they rejoined since: what they had
    /// sent up through that node went with it, so an answer they gave then is missing.
    pub fn orphaned(&self) -> Vec<(RankSet, String)> {
        lock(&self.shared).tool().orphaned.clone()
    }

    /// Every rank that rejoined the tree after its comm node was lost, whoever read the
    /// events ([`Event::RanksRejoined`]); see [`Network::orphaned`] for what it lost.
    pub fn rejoined_ranks(&self) -> RankSet {
        lock(&self.shared).tool().rejoined.borrow().1.clone()
    }

    /// Every rank spawned while the tree runs that joined it, whoever read the events
    /// ([`Event::RanksJoined`]).
    pub fn joined_ranks(&self) -> RankSet {
        lock(&self.shared).tool().joined.borrow().clone()
    }

    /// Every rank that left the tree in order, whoever read the events
    /// ([`Event::RanksLeft`]): they are gone, not lost, and answer nothing.
    pub fn left_ranks(&self) -> RankSet {
        lock(&self.shared).tool().left.clone()
    }

    /// A receiver that sees each rejoin: their count and every rank that rejoined.
    pub fn rejoined_watch(&self) -> watch::Receiver<(u64, RankSet)> {
        lock(&self.shared).tool().rejoined.subscribe()
    }

    /// A receiver that sees each change of the lost ranks (for waits that must end
    /// when a rank is lost without reading the events).
    pub fn lost_watch(&self) -> watch::Receiver<LostRanks> {
        self.lost.clone()
    }

    /// Waits for the next event; `None` once the network is shut down and every event was read.
    /// Several tasks may wait at once: each event goes to one of them.
    ///
    /// Cancel safety: cancel safe.
    pub async fn next_event(&self) -> Option<Event> {
        std::future::poll_fn(|cx| lock(&self.shared).tool().poll_event(Some(cx))).await
    }

    /// Calls `hook` whenever a packet for any stream or an event arrives, and when the
    /// network ends, so that a tool's own event loop (`poll`, `epoll`) can wake and
    /// read with [`Stream::try_recv`](crate::Stream::try_recv) and
    /// [`Network::try_event`]. It runs on the network's task: it must return at once
    /// (write to a pipe or an eventfd) and not call into the network. Replaces any
    /// hook set before.
    pub fn on_ready(&self, hook: impl Fn() + Send + Sync + 'static) {
        let hook = crate::frontend::ReadyHook(std::sync::Arc::new(hook));
        lock(&self.shared).tool().ready = Some(hook);
    }

    /// Returns the next event if one is queued.
    pub fn try_event(&self) -> Option<Event> {
        match lock(&self.shared).tool().poll_event(None) {
            std::task::Poll::Ready(e) => e,
            std::task::Poll::Pending => None,
        }
    }

    /// Tells every node to exit, waits up to `grace` for the processes, then kills what is left.
    ///
    /// Cancel safety: not cancel safe; processes left are killed when dropped.
    pub async fn shutdown_with(mut self, grace: Duration) {
        if let Some(server) = self.spawn_server.take() {
            server.abort();
        }
        let _ = lock(&self.shared).command(Command::Shutdown);
        if let Some(task) = self.task.take() {
            // The driver gives the processes its own grace before it kills them.
            let limit = grace.max(treecast_driver::SHUTDOWN_GRACE) + Duration::from_secs(3);
            if tokio::time::timeout(limit, task).await.is_err() {
                lock(&self.shared).kill_children();
            }
        }
    }

    /// [`Network::shutdown_with`] a grace of 5 s.
    ///
    /// Cancel safety: not cancel safe.
    pub async fn shutdown(self) {
        self.shutdown_with(Duration::from_secs(5)).await;
    }
}

impl Drop for Network {
    /// Kills the processes this front-end started (if still running; the rest end
    /// within their rejoin limit) and removes the attach file.
    fn drop(&mut self) {
        if let Some(server) = self.spawn_server.take() {
            server.abort();
        }
        let mut d = lock(&self.shared);
        if let Some(task) = self.task.take() {
            d.kill_children();
            task.abort();
        }
        drop(d.tool().attach_written.take());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_read_as_sentences() {
        let lost = Event::RanksLost {
            ranks: RankSet::single(5),
            reason: "comm node n3 (node 2): link to back-end rank 5 on n3 (node 8) closed".into(),
        };
        assert_eq!(
            lost.to_string(),
            "lost rank 5: comm node n3 (node 2): link to back-end rank 5 on n3 (node 8) closed"
        );
        assert_eq!(Event::RanksJoined { ranks: RankSet::range(3, 3) }.to_string(), "ranks 3-5 joined");
        let left = Event::RanksLeft { ranks: RankSet::range(0, 2), reason: "back-end rank 0 left".into() };
        assert_eq!(left.to_string(), "ranks 0-1 left: back-end rank 0 left");
        let refused = Event::FilterError { stream: 2, rank: 7, message: "sum cannot add %s".into() };
        assert_eq!(refused.to_string(), "stream 2: the packet of rank 7 was refused: sum cannot add %s");
        let down = Event::FilterError { stream: 2, rank: u32::MAX, message: "downstream filter".into() };
        assert_eq!(down.to_string(), "stream 2: a filter failed: downstream filter");
        let node = "comm node h (node 1)".to_owned();
        let stream = Event::StreamRefused { stream: 4, node, message: "no filter median".into() };
        assert_eq!(stream.to_string(), "stream 4 was refused by comm node h (node 1): no filter median");
    }
}
