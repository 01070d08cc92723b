//! The front-end's calls that grow and shrink the tree while it runs: spawn, accept,
//! stop, and the groups they give.

use std::path::Path;

use crate::spawn::merged;
use crate::{ApiError, Group, Network, SpawnOptions};

impl Network {
    /// Starts `n` new back-ends running `command` (program first; empty: the
    /// launch's back-end command) while the tree runs, under the comm nodes
    /// `options.placement` picks, and waits until every one has joined. Their ranks
    /// follow the highest given so far; streams can be created over them at once.
    /// Each process finds its group in `TREECAST_GROUP`, `TREECAST_GROUP_RANK` and
    /// `TREECAST_GROUP_SIZE`, besides the usual `TREECAST_RANK` and `TREECAST_SIZE`.
    ///
    /// # Errors
    /// [`ApiError::Placement`] when no comm node fits the placement;
    /// [`ApiError::SpawnFailed`] naming each process that did not join (a bad
    /// command, a process that exited, the time limit), after stopping the others of
    /// the spawn, so that nothing of a failed spawn is left running.
    ///
    /// Cancel safety: not cancel safe: processes of a spawn dropped while it waits
    /// stay in the tree.
    pub async fn spawn(&self, n: u32, command: &[String], options: &SpawnOptions) -> Result<Group, ApiError> {
        self.spawner.spawn(n, command, options).await
    }

    /// Accepts `n` back-ends started by someone else (another job, a debugger, a batch
    /// system) as a new group: it places them like a spawn, writes a port file at
    /// `port` (private to this user: it holds the session secret, and no secret
    /// goes on a command line) once the comm nodes chosen listen for them, and
    /// waits until every one has joined (`options.limit`). Each process joins with
    /// `BackEnd::connect_port(port, index)`, its index 0 to n-1 given or read from
    /// its launcher's environment (`OMPI_COMM_WORLD_RANK`, `PMI_RANK`, …). The file
    /// is removed when this returns. Processes must run on the hosts placed: those of
    /// the comm nodes chosen, or the hosts [`Placement::Hosts`](crate::Placement::Hosts) names.
    ///
    /// # Errors
    /// As [`Network::spawn`]; [`ApiError::Attach`] when the port file cannot be
    /// written; [`ApiError::Timeout`] when the comm nodes did not say where to
    /// connect within the limit.
    ///
    /// Cancel safety: not cancel safe.
    pub async fn accept(&self, port: &Path, n: u32, options: &SpawnOptions) -> Result<Group, ApiError> {
        self.spawner.accept(port, n, options).await
    }

    /// Stops every process of `group` (a pool that shrinks); their ranks leave the
    /// streams gracefully ([`crate::Event::RanksLeft`]), not as failures.
    ///
    /// # Errors
    /// [`ApiError::Closed`] when the network is gone.
    pub fn stop(&self, group: &Group, reason: &str) -> Result<(), ApiError> {
        self.spawner.stop(&group.rank_set(), reason)
    }

    /// One group of `a`'s and `b`'s processes, as `MPI_Intercomm_merge` orders them:
    /// `a`'s first unless `a_high`, then `b`'s first. A process in both is kept once,
    /// where it comes first.
    pub fn merge(&self, a: &Group, b: &Group, a_high: bool) -> Group {
        merged(a, b, a_high, self.spawner.group_id())
    }

    /// Splits `group` by colour (see [`Group::split_with`]), with new group ids. A
    /// group is a plain value: dropping one frees it; its processes run on until
    /// they are stopped or leave.
    pub fn split(&self, group: &Group, colour_of: impl Fn(usize, u32) -> Option<u32>) -> Vec<(u32, Group)> {
        let mut parts = group.split_with(0, colour_of);
        for (_, g) in &mut parts {
            g.id = self.spawner.group_id();
        }
        parts
    }

    /// The back-ends of the launch as a group (id 0), to merge spawned groups with.
    pub fn launch_group(&self) -> Group {
        Group { id: 0, ranks: (0..self.topology().backends() as u32).collect() }
    }
}
