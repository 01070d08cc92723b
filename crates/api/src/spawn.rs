//! Back-ends started while the tree runs: placement, groups, and the front-end's
//! calls that spawn and stop them.
//!
//! A spawn is one control message down the tree to each comm node chosen to start
//! part of it (the daemons are already there, so no login or job step is needed).
//! Each such node starts its share through its launcher, like the back-ends of the
//! launch; their ranks join with the usual join messages, and the spawn returns when
//! every new rank joined, or fails naming each process that did not.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use treecast_driver::lock;
use treecast_proto::Command;
use treecast_topology::hostlist::bare_host;
use treecast_topology::Topology;
use treecast_wire::{RankSet, SpawnOrder};

use crate::{ApiError, Communicator};

/// How long [`Network::spawn`](crate::Network::spawn) waits for every new process to join, by default.
pub const DEFAULT_SPAWN_LIMIT: Duration = Duration::from_secs(30);

/// Which comm nodes start the processes of a spawn.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Placement {
    /// Each process under the comm node with the fewest back-ends at that moment.
    #[default]
    LeastLoaded,
    /// Consecutive ranks under one comm node: the processes are split into as many
    /// equal blocks as there are comm nodes with back-ends, in node order.
    Block,
    /// One process per comm node in turn, going on where the last cyclic spawn ended.
    Cyclic,
    /// Least loaded among the comm nodes that run on these hosts; on a host without
    /// one, the least loaded node of the tree starts them there through its
    /// launcher (ssh, Slurm), as at start-up.
    Hosts(Vec<String>),
}

/// What a spawn starts and how long it may take.
#[derive(Debug, Clone)]
pub struct SpawnOptions {
    /// Where the processes go.
    pub placement: Placement,
    /// How long to wait for every process to join.
    pub limit: Duration,
    /// How the processes join: announced by a datagram or by connecting.
    pub join: JoinMode,
}

impl Default for SpawnOptions {
    fn default() -> SpawnOptions {
        SpawnOptions { placement: Placement::LeastLoaded, limit: DEFAULT_SPAWN_LIMIT, join: JoinMode::Auto }
    }
}

/// How a spawned process joins its comm node (docs/processes.md, "Light joins").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum JoinMode {
    /// [`JoinMode::Announce`] for spawns of at most [`LIGHT_JOIN_UP_TO`]
    /// processes, [`JoinMode::Connect`] for larger ones.
    #[default]
    Auto,
    /// Each process counts as joined once its link is connected and authenticated.
    Connect,
    /// Each process announces itself with one signed datagram and counts as joined
    /// from then on; what is sent to it waits at its comm node until its link
    /// connects. Processes started on a host without a comm node connect.
    Announce,
}

/// Largest spawn [`JoinMode::Auto`] joins by announcement.
pub const LIGHT_JOIN_UP_TO: u32 = 4;

impl JoinMode {
    /// Whether a spawn of `n` processes joins by announcement.
    pub fn announces(self, n: u32) -> bool {
        match self {
            JoinMode::Auto => n <= LIGHT_JOIN_UP_TO,
            JoinMode::Connect => false,
            JoinMode::Announce => true,
        }
    }
}

/// Back-ends that belong together: those of one spawn, or a merge of groups.
/// The order is the group's own: the process at index `i` has group rank `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Group {
    pub(crate) id: u32,
    pub(crate) ranks: Vec<u32>,
}

impl Group {
    pub(crate) fn new(id: u32, ranks: Vec<u32>) -> Group {
        Group { id, ranks }
    }

    /// A group of `ranks` in this order, as a back-end names the members of a
    /// collective operation (the launch's back-ends: `0..size`; a spawned group:
    /// the ranks its spawn returned).
    pub fn from_ranks(id: u32, ranks: impl IntoIterator<Item = u32>) -> Group {
        Group { id, ranks: ranks.into_iter().collect() }
    }

    /// The group's id (a spawned process reads it in `TREECAST_GROUP`).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// Processes in the group.
    pub fn size(&self) -> usize {
        self.ranks.len()
    }

    /// The network rank of each group rank, in group order.
    pub fn ranks(&self) -> &[u32] {
        &self.ranks
    }

    /// The group rank of network rank `rank`, if it is a member.
    pub fn group_rank(&self, rank: u32) -> Option<usize> {
        self.ranks.iter().position(|&r| r == rank)
    }

    /// The members as a set.
    pub fn rank_set(&self) -> RankSet {
        self.ranks.iter().copied().collect()
    }

    /// Splits the group as `MPI_Comm_split` does: one group per colour that
    /// `colour_of(group rank, rank)` gives, in order of colour, each keeping this
    /// group's order; members given `None` are in none. The new groups' ids are
    /// `first_id`, `first_id + 1`, … (use [`Network::split`](crate::Network::split) to have the network
    /// give them out).
    pub fn split_with(
        &self,
        first_id: u32,
        colour_of: impl Fn(usize, u32) -> Option<u32>,
    ) -> Vec<(u32, Group)> {
        let mut by_colour: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
        for (i, &r) in self.ranks.iter().enumerate() {
            if let Some(c) = colour_of(i, r) {
                by_colour.entry(c).or_default().push(r);
            }
        }
        by_colour
            .into_iter()
            .enumerate()
            .map(|(k, (colour, ranks))| (colour, Group { id: first_id.wrapping_add(k as u32), ranks }))
            .collect()
    }

    /// A communicator over the members, to create streams over the group.
    pub fn communicator(&self) -> Communicator {
        Communicator::over(self.rank_set())
    }
}

/// What spawns need, shared by the tool's calls and the task that serves back-ends'
/// requests.
#[derive(Clone)]
pub(crate) struct Spawner {
    pub(crate) shared: treecast_driver::Shared<crate::frontend::FeTool>,
    pub(crate) book: std::sync::Arc<std::sync::Mutex<SpawnBook>>,
}

/// The front-end's book of spawns: ids, ranks and node ids to give out, and the
/// back-ends each comm node has, for placement.
#[derive(Debug)]
pub(crate) struct SpawnBook {
    next_rank: u32,
    next_node_id: u32,
    next_group: u32,
    /// Back-ends under each node that has back-end children (node id → count).
    load: BTreeMap<u32, u32>,
    /// Host of each of those nodes.
    hosts: BTreeMap<u32, String>,
    /// Where the next cyclic spawn begins (an index into `load`).
    cyclic_next: usize,
    /// The spawned ranks under each node, while they are there.
    placed: Vec<(u32, RankSet)>,
}

impl SpawnBook {
    /// The book of a tree launched from `topology` with ranks `0..backends`.
    pub(crate) fn new(topology: &Topology, backends: u32) -> SpawnBook {
        let mut load = BTreeMap::new();
        let mut hosts = BTreeMap::new();
        for (id, node) in topology.nodes().iter().enumerate() {
            let leaves = node.children.iter().filter(|&&c| topology.is_leaf(c)).count() as u32;
            let is_root = id == topology.root();
            // A root with only comm nodes below starts nothing itself.
            if leaves > 0 || (is_root && node.children.is_empty()) {
                load.insert(id as u32, leaves);
                hosts.insert(id as u32, node.host.clone());
            }
        }
        SpawnBook {
            next_rank: backends,
            next_node_id: topology.len() as u32,
            next_group: 1,
            load,
            hosts,
            cyclic_next: 0,
            placed: Vec::new(),
        }
    }

    /// Ranks given out so far (the launch's and every spawn's).
    pub(crate) fn ranks_given(&self) -> u32 {
        self.next_rank
    }

    /// How many of `n` processes each node starts, and on which host (empty: its
    /// own), in node order.
    fn place(&mut self, n: u32, placement: &Placement) -> Result<Vec<(u32, String, u32)>, ApiError> {
        let candidates: Vec<(u32, String)> = match placement {
            Placement::Hosts(hosts) => self.host_slots(hosts)?,
            _ => self.load.keys().map(|&id| (id, String::new())).collect(),
        };
        if candidates.is_empty() {
            return Err(ApiError::Placement("this tree has no node that starts back-ends".into()));
        }
        let mut counts: BTreeMap<(u32, String), u32> = BTreeMap::new();
        let k = candidates.len() as u32;
        match placement {
            Placement::Block => {
                let per = n.div_ceil(k);
                let mut left = n;
                for slot in &candidates {
                    let take = per.min(left);
                    if take > 0 {
                        counts.insert(slot.clone(), take);
                    }
                    left -= take;
                }
            }
            Placement::Cyclic => {
                for i in 0..n as usize {
                    let slot = &candidates[(self.cyclic_next + i) % candidates.len()];
                    *counts.entry(slot.clone()).or_default() += 1;
                }
                self.cyclic_next = (self.cyclic_next + n as usize) % candidates.len();
            }
            Placement::LeastLoaded | Placement::Hosts(_) => {
                let mut load: Vec<(u32, &(u32, String))> =
                    candidates.iter().map(|slot| (self.load[&slot.0], slot)).collect();
                for _ in 0..n {
                    let Some(least) = load.iter_mut().min() else { break };
                    least.0 += 1;
                    *counts.entry(least.1.clone()).or_default() += 1;
                }
            }
        }
        for ((id, _), &c) in &counts {
            *self.load.entry(*id).or_default() += c;
        }
        Ok(counts.into_iter().map(|((id, host), c)| (id, host, c)).collect())
    }

    /// Where processes for `hosts` can start: the nodes with back-ends on each host,
    /// or, on a host without one, the least loaded node, which starts them there
    /// through its launcher (ssh, Slurm).
    fn host_slots(&self, hosts: &[String]) -> Result<Vec<(u32, String)>, ApiError> {
        if hosts.is_empty() {
            return Err(ApiError::Placement("Placement::Hosts names no host: give at least one".into()));
        }
        let least = self.load.iter().min_by_key(|(&id, &load)| (load, id)).map(|(&id, _)| id);
        let mut slots = Vec::new();
        for host in hosts {
            let on: Vec<u32> = self
                .hosts
                .iter()
                .filter(|(_, h)| bare_host(h) == bare_host(host))
                .map(|(&id, _)| id)
                .collect();
            match (on.is_empty(), least) {
                (false, _) => slots.extend(on.into_iter().map(|id| (id, String::new()))),
                (true, Some(id)) => slots.push((id, host.clone())),
                (true, None) => {
                    return Err(ApiError::Placement("this tree has no node that starts back-ends".into()))
                }
            }
        }
        slots.sort();
        slots.dedup();
        Ok(slots)
    }

    /// The orders of a spawn of `n` processes running `command`, and its group.
    fn orders(
        &mut self,
        n: u32,
        command: &[String],
        placement: &Placement,
        attach: bool,
        light: bool,
    ) -> Result<(Vec<SpawnOrder>, Group), ApiError> {
        if u64::from(self.next_rank) + u64::from(n) > u64::from(treecast_proto::REMOTE_BASE) {
            return Err(ApiError::Placement(format!(
                "{} ranks are given out already: a network has at most {} (ranks above are other networks')",
                self.next_rank,
                treecast_proto::REMOTE_BASE
            )));
        }
        let counts = self.place(n, placement)?;
        let group = self.next_group;
        let group_first = self.next_rank;
        self.next_group += 1;
        let size = self.next_rank + n;
        let mut orders = Vec::with_capacity(counts.len());
        for (target, host, count) in counts {
            orders.push(SpawnOrder {
                target,
                first_node_id: self.next_node_id,
                first_rank: self.next_rank,
                count,
                size,
                group,
                group_first,
                group_size: n,
                command: command.to_vec(),
                attach,
                host,
                light: light && !attach,
            });
            self.placed.push((target, RankSet::range(self.next_rank, count)));
            self.next_node_id += count;
            self.next_rank += count;
        }
        Ok((orders, Group { id: group, ranks: (group_first..group_first + n).collect() }))
    }

    /// A new group id for a merge.
    fn group_id(&mut self) -> u32 {
        let id = self.next_group;
        self.next_group += 1;
        id
    }

    /// Spawned processes stopped or failed no longer weigh on their node.
    fn unload(&mut self, gone: &RankSet) {
        for (target, ranks) in &mut self.placed {
            let n = ranks.intersection(gone).len() as u32;
            if n > 0 {
                *ranks = ranks.difference(gone);
                if let Some(l) = self.load.get_mut(target) {
                    *l = l.saturating_sub(n);
                }
            }
        }
        self.placed.retain(|(_, ranks)| !ranks.is_empty());
    }
}

/// `a` and `b` in one group named `id`; see [`Network::merge`](crate::Network::merge).
pub(crate) fn merged(a: &Group, b: &Group, a_high: bool, id: u32) -> Group {
    let (first, second) = if a_high { (b, a) } else { (a, b) };
    let mut ranks = first.ranks.clone();
    ranks.extend(second.ranks.iter().filter(|r| !first.ranks.contains(r)));
    Group { id, ranks }
}

impl Spawner {
    /// See [`Network::spawn`](crate::Network::spawn).
    pub(crate) async fn spawn(
        &self,
        n: u32,
        command: &[String],
        options: &SpawnOptions,
    ) -> Result<Group, ApiError> {
        self.start(n, command, options, None).await
    }

    /// See [`Network::accept`](crate::Network::accept).
    pub(crate) async fn accept(
        &self,
        port: &Path,
        n: u32,
        options: &SpawnOptions,
    ) -> Result<Group, ApiError> {
        self.start(n, &[], options, Some(port)).await
    }

    /// Places `n` back-ends and waits for them to join: started by the chosen
    /// nodes, or, with a `port`, by whoever reads the port file written there.
    async fn start(
        &self,
        n: u32,
        command: &[String],
        options: &SpawnOptions,
        port: Option<&Path>,
    ) -> Result<Group, ApiError> {
        let deadline = tokio::time::Instant::now() + options.limit;
        if n == 0 || n > treecast_proto::MAX_SPAWN {
            return Err(ApiError::Placement(format!(
                "a spawn starts 1 to {} processes, not {n}",
                treecast_proto::MAX_SPAWN
            )));
        }
        // Spawned processes lost since no longer weigh on their nodes.
        let lost = self.lost().ranks().clone();
        let (orders, group) = {
            let mut book = self.spawn_book();
            book.unload(&lost);
            book.orders(n, command, &options.placement, port.is_some(), options.join.announces(n))?
        };
        let mut joined = self.joined_watch();
        let mut lost = self.lost_watch();
        let mut points = lock(&self.shared).tool().port_points.subscribe();
        {
            let mut d = lock(&self.shared);
            for order in &orders {
                if let Err(e) = d.command(Command::Spawn(order.clone())) {
                    // What the orders already sent start is stopped again.
                    let _ = d.command(Command::Stop { ranks: group.rank_set(), reason: e.to_string() });
                    drop(d);
                    self.spawn_book().unload(&group.rank_set());
                    return Err(ApiError::Refused(Box::new(e)));
                }
            }
        }
        let want = group.rank_set();
        // Accepting: the port file, once every slot has a place; removed when this ends.
        let _port_file = match port {
            Some(path) => match self.write_port(path, &group, &mut points, (deadline, options.limit)).await {
                Ok(file) => Some(file),
                Err(e) => {
                    let _ = lock(&self.shared)
                        .command(Command::Stop { ranks: want.clone(), reason: e.to_string() });
                    self.spawn_book().unload(&want);
                    return Err(e);
                }
            },
            None => None,
        };
        let settled = async {
            loop {
                let done_joined = joined.borrow_and_update().intersection(&want);
                let done_lost = lost.borrow_and_update().ranks().intersection(&want);
                if done_joined.len() + done_lost.len() >= want.len() {
                    return (done_joined, done_lost);
                }
                tokio::select! {
                    r = joined.changed() => if r.is_err() { return (done_joined, done_lost) },
                    r = lost.changed() => if r.is_err() { return (done_joined, done_lost) },
                }
            }
        };
        let (in_tree, failed) = match tokio::time::timeout_at(deadline, settled).await {
            Ok(outcome) => outcome,
            Err(_) => {
                let j = self.joined_watch().borrow().intersection(&want);
                let l = self.lost_watch().borrow().ranks().intersection(&want);
                (j, l)
            }
        };
        if in_tree == want {
            return Ok(group);
        }
        let mut failures = self.lost().among(&want);
        let silent = want.difference(&in_tree).difference(&failed);
        if !silent.is_empty() {
            let why = format!("did not join within {:.1} s", options.limit.as_secs_f64());
            failures.push((silent, why));
        }
        let reason = format!("spawn of group {} failed", group.id);
        let _ = lock(&self.shared).command(Command::Stop { ranks: want.difference(&failed), reason });
        self.spawn_book().unload(&want);
        Err(ApiError::SpawnFailed { n, failures })
    }

    /// Waits (until `deadline`) for where every rank of `group` connects, then writes
    /// the port file: private to this user, removed when the guard is dropped.
    async fn write_port(
        &self,
        path: &Path,
        group: &Group,
        points: &mut tokio::sync::watch::Receiver<Vec<treecast_wire::AttachPoint>>,
        (deadline, limit): (tokio::time::Instant, Duration),
    ) -> Result<crate::attach::AttachFile, ApiError> {
        let want = group.rank_set();
        let mut lost = self.lost_watch();
        let placed = loop {
            let mine: Vec<(u32, u32, String)> = points
                .borrow_and_update()
                .iter()
                .filter(|p| want.contains(p.rank))
                .map(|p| (p.rank, p.node_id, p.address.clone()))
                .collect();
            if mine.len() as u64 >= want.len() {
                break mine;
            }
            let failed = lost.borrow_and_update().ranks().intersection(&want);
            if !failed.is_empty() {
                let failures = self.lost().among(&want);
                return Err(ApiError::SpawnFailed { n: group.size() as u32, failures });
            }
            // A slot that cannot be opened is reported lost, not placed: wait for either.
            let changed = async {
                tokio::select! {
                    r = points.changed() => r.is_ok(),
                    r = lost.changed() => r.is_ok(),
                }
            };
            if !matches!(tokio::time::timeout_at(deadline, changed).await, Ok(true)) {
                return Err(ApiError::Timeout(limit));
            }
        };
        let (session, secret) = {
            let mut d = lock(&self.shared);
            (d.tool().session.clone(), d.tool().secret.clone())
        };
        let size = self.ranks_given();
        let base = group.ranks.first().copied().unwrap_or(0);
        let info = crate::AttachInfo { session, secret, size, points: placed, base, network: None };
        info.write(path)?;
        Ok(crate::attach::AttachFile::written(path)?)
    }

    /// A new group id: for a merge, a split, a remote network's group.
    pub(crate) fn group_id(&self) -> u32 {
        self.spawn_book().group_id()
    }

    fn spawn_book(&self) -> std::sync::MutexGuard<'_, SpawnBook> {
        // A poisoned lock is taken over: the book holds no invariant a panic
        // elsewhere could break half-way.
        self.book.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Ranks given out so far: the launch's and every spawn's.
    pub(crate) fn ranks_given(&self) -> u32 {
        self.spawn_book().ranks_given()
    }

    fn joined_watch(&self) -> tokio::sync::watch::Receiver<RankSet> {
        lock(&self.shared).tool().joined.subscribe()
    }

    fn lost_watch(&self) -> tokio::sync::watch::Receiver<treecast_proto::LostRanks> {
        lock(&self.shared).tool().lost_watch()
    }

    fn lost(&self) -> treecast_proto::LostRanks {
        self.lost_watch().borrow().clone()
    }

    /// Stops `ranks` and forgets them for placement.
    pub(crate) fn stop(&self, ranks: &RankSet, reason: &str) -> Result<(), ApiError> {
        lock(&self.shared)
            .command(Command::Stop { ranks: ranks.clone(), reason: reason.to_owned() })
            .map_err(|e| ApiError::from_command(0, e))?;
        self.spawn_book().unload(ranks);
        Ok(())
    }
}

/// Back-ends' spawn requests served at once; more wait for one of them to end.
const CONCURRENT_REQUESTS: usize = 8;

/// Serves the spawn requests of back-ends ([`crate::BackEnd::spawn`]), several at
/// once, as the tool's own spawns are served, until the network ends.
pub(crate) async fn serve_requests(spawner: Spawner) {
    let mut serving = tokio::task::JoinSet::new();
    loop {
        if serving.len() >= CONCURRENT_REQUESTS {
            serving.join_next().await;
            continue;
        }
        let next = std::future::poll_fn(|cx| lock(&spawner.shared).tool().poll_spawn_request(cx));
        let req = tokio::select! {
            req = next => match req {
                Some(r) => r,
                None => return,
            },
            Some(_) = serving.join_next() => continue,
        };
        let spawner = spawner.clone();
        serving.spawn(async move {
            let options = SpawnOptions::default();
            let (group, ranks, error) = match spawner.spawn(req.n, &req.command, &options).await {
                Ok(g) => (g.id(), g.rank_set(), String::new()),
                Err(e) => (0, RankSet::new(), e.to_string()),
            };
            let reply = Command::SpawnReply { id: req.id, rank: req.rank, group, ranks, error };
            let _ = lock(&spawner.shared).command(reply);
        });
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn book(spec: &str, backends: usize) -> SpawnBook {
        let topo = Topology::from_spec(spec, Some(backends)).unwrap();
        SpawnBook::new(&topo, topo.backends() as u32)
    }

    #[test]
    fn least_loaded_fills_the_emptiest_comm_nodes_first() {
        let mut b = book("balanced:4x4", 16);
        let ids: Vec<u32> = b.load.keys().copied().collect();
        // One more under each of the first three: 5, 5, 5, 4.
        b.place(3, &Placement::Block).unwrap();
        assert_eq!(b.place(1, &Placement::LeastLoaded).unwrap(), vec![(ids[3], String::new(), 1)]);
        b.place(4, &Placement::LeastLoaded).unwrap();
        assert_eq!(b.load.values().copied().collect::<Vec<_>>(), vec![6, 6, 6, 6]);
    }

    #[test]
    fn block_and_cyclic_split_as_named() {
        let mut b = book("balanced:4x4", 16);
        let ids: Vec<u32> = b.load.keys().copied().collect();
        assert_eq!(b.place(6, &Placement::Block).unwrap(), own(&[(ids[0], 2), (ids[1], 2), (ids[2], 2)]));
        assert_eq!(b.place(2, &Placement::Cyclic).unwrap(), own(&[(ids[0], 1), (ids[1], 1)]));
        // The next cyclic spawn goes on where this one ended.
        assert_eq!(b.place(3, &Placement::Cyclic).unwrap(), own(&[(ids[0], 1), (ids[2], 1), (ids[3], 1)]));
    }

    #[test]
    fn a_flat_tree_spawns_under_the_front_end() {
        let mut b = book("flat", 4);
        let (orders, group) = b.orders(3, &[], &Placement::LeastLoaded, false, false).unwrap();
        assert_eq!(orders.len(), 1);
        assert_eq!((orders[0].target, orders[0].first_rank, orders[0].first_node_id), (0, 4, 5));
        assert_eq!((orders[0].size, orders[0].group_first, orders[0].group_size), (7, 4, 3));
        assert_eq!(group.ranks(), &[4, 5, 6]);
    }

    #[test]
    fn spawns_give_out_new_ranks_and_node_ids_in_order() {
        let mut b = book("balanced:2x2", 4);
        let (first, g1) = b.orders(3, &["w".into()], &Placement::Cyclic, true, false).unwrap();
        let (second, g2) = b.orders(1, &[], &Placement::LeastLoaded, false, false).unwrap();
        assert_eq!(g1.ranks(), &[4, 5, 6]);
        assert_eq!(g2.ranks(), &[7]);
        assert_ne!(g1.id(), g2.id());
        let all: Vec<(u32, u32, u32)> =
            first.iter().chain(&second).map(|o| (o.first_rank, o.count, o.first_node_id)).collect();
        // balanced:2x2 has 7 nodes (ids 0-6): new node ids start at 7.
        assert_eq!(all, vec![(4, 2, 7), (6, 1, 9), (7, 1, 10)]);
        assert!(second.iter().all(|o| o.size == 8 && o.group_size == 1 && !o.attach));
        assert!(first.iter().all(|o| o.attach && o.command == ["w"]));
    }

    #[test]
    fn processes_that_went_no_longer_count_for_placement() {
        let mut b = book("balanced:2x2", 4);
        let ids: Vec<u32> = b.load.keys().copied().collect();
        let (_, g) = b.orders(2, &[], &Placement::Block, false, false).unwrap();
        assert_eq!(b.load.values().copied().collect::<Vec<_>>(), vec![3, 3]);
        b.unload(&RankSet::single(g.ranks()[0]));
        b.unload(&RankSet::single(g.ranks()[0]));
        assert_eq!(b.load[&ids[0]], 2, "once, however often it is reported");
        assert_eq!(b.place(1, &Placement::LeastLoaded).unwrap(), vec![(ids[0], String::new(), 1)]);
    }

    /// Placements on the nodes' own hosts.
    fn own(counts: &[(u32, u32)]) -> Vec<(u32, String, u32)> {
        counts.iter().map(|&(id, c)| (id, String::new(), c)).collect()
    }

    #[test]
    fn hosts_without_a_comm_node_are_started_by_the_least_loaded_node() {
        let mut b = book("balanced:2x2", 4);
        let ids: Vec<u32> = b.load.keys().copied().collect();
        b.place(1, &Placement::Block).unwrap();
        // ids[1] is the least loaded now: it starts them on the host asked for.
        let placed = b.place(3, &Placement::Hosts(vec!["n9".into()])).unwrap();
        assert_eq!(placed, vec![(ids[1], "n9".to_owned(), 3)]);
        let (orders, _) =
            b.orders(2, &[], &Placement::Hosts(vec!["n9".into(), "localhost".into()]), false, false).unwrap();
        assert!(orders.iter().all(|o| o.host.is_empty() || o.host == "n9"), "{orders:?}");
        assert_eq!(orders.iter().map(|o| o.count).sum::<u32>(), 2);
        let err = b.place(1, &Placement::Hosts(Vec::new())).unwrap_err();
        assert!(err.to_string().contains("names no host"), "{err}");
    }

    #[test]
    fn split_groups_by_colour_in_colour_order_keeping_the_order() {
        let g = Group { id: 1, ranks: vec![9, 3, 7, 4, 5] };
        let parts = g.split_with(10, |i, r| (r != 7).then_some((i % 2) as u32 * 5));
        assert_eq!(parts.len(), 2);
        assert_eq!((parts[0].0, parts[0].1.ranks(), parts[0].1.id()), (0, &[9, 5][..], 10));
        assert_eq!((parts[1].0, parts[1].1.ranks(), parts[1].1.id()), (5, &[3, 4][..], 11));
        assert!(g.split_with(0, |_, _| None).is_empty());
    }

    #[test]
    fn merge_orders_as_mpi_does() {
        let a = Group { id: 1, ranks: vec![4, 5] };
        let b = Group { id: 2, ranks: vec![0, 1, 2] };
        assert_eq!(merged(&a, &b, false, 3).ranks(), &[4, 5, 0, 1, 2]);
        let high = merged(&a, &b, true, 3);
        assert_eq!(high.ranks(), &[0, 1, 2, 4, 5]);
        assert_eq!(high.group_rank(4), Some(3));
        assert_eq!(high.rank_set(), {
            let mut s = RankSet::range(0, 3);
            s.union_with(&RankSet::range(4, 2));
            s
        });
        // A rank in both counts once, where it comes first.
        let c = Group { id: 4, ranks: vec![5, 6] };
        assert_eq!(merged(&a, &c, false, 5).ranks(), &[4, 5, 6]);
    }
}
