//! One chaos run on a real tree: start it (under fire in the start-up phase), send a
//! file (under fire in the bcast phase), run reductions (under fire in the reduce
//! phase), shut down, and count what went wrong.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, RngCore, SeedableRng};
use treecast_api::{
    ApiError, Event, Network, NetworkBuilder, RankSet, StreamOptions, Topology, TransformKind, Value,
};
use treecast_files::{bcast_files, FileEntry, FileOptions, FileReport, Outcome, Progress};
use treecast_sim::chaos::fault_count;

use super::procs::{self, env_value, Victim};
use super::ChaosRun;
use crate::apps::cli::{ChaosArgs, ChaosPhase};
use crate::apps::protocol::TAG_ADD_RANK;

/// How long each level of a tree under test may take to start: a node stopped while
/// it starts holds its level up this long before the start-up goes on without it.
const STARTUP_LIMIT: Duration = Duration::from_secs(10);
/// A start-up fault strikes its process up to this long after the process appears:
/// a back-end takes a few tens of milliseconds to connect and be counted.
const STARTUP_SPREAD: Duration = Duration::from_millis(30);
/// How often the start-up strikes look for new processes.
const SCAN_EVERY: Duration = Duration::from_millis(2);

/// A process struck during the run.
struct Strike {
    victim: Victim,
    stop: bool,
}

/// A run under way: what it struck and what it found so far.
struct Trial<'a> {
    args: &'a ChaosArgs,
    topo: Topology,
    rng: StdRng,
    run: ChaosRun,
    strikes: Vec<Strike>,
    /// When each fault since the last complete wave struck.
    pending_recovery: Vec<Instant>,
    /// Ranks reported lost, or failed by the file transfer.
    lost: RankSet,
    /// Ranks reported back after their comm node was lost.
    rejoined: RankSet,
}

/// Runs one chaos run with `seed` whose faults strike during `phase`.
pub(super) async fn one_run(
    topo: Topology,
    args: &ChaosArgs,
    seed: u64,
    phase: ChaosPhase,
) -> anyhow::Result<ChaosRun> {
    let mut rng = StdRng::seed_from_u64(seed);
    let count = fault_count(args.faults, args.kill_rate, topo.len() - 1, &mut rng).min(topo.len() - 1);
    let run = ChaosRun { phase: phase.name(), ..ChaosRun::default() };
    let mut t = Trial {
        args,
        topo,
        rng,
        run,
        strikes: Vec::new(),
        pending_recovery: Vec::new(),
        lost: RankSet::new(),
        rejoined: RankSet::new(),
    };
    let builder = crate::apps::settings::builder(t.topo.clone())?
        .dead_after(Some(t.dead_after()))
        .rejoin_within(super::rejoin_limit(args))
        .startup_timeout(STARTUP_LIMIT);
    let mut net = match phase {
        ChaosPhase::Startup => match launch_under_fire(builder.allow_missing(true), count, &mut t).await {
            Ok(net) => net,
            Err((message, session)) => {
                // Going on without what failed, a start-up may fail only when nothing
                // is left to start.
                if t.strikes.is_empty() || !message.contains("no child of front-end started") {
                    t.run.wrong += 1;
                    t.run.notes.push(format!("the start-up failed although the tree could go on: {message}"));
                }
                t.run.startup_failed = Some(message);
                t.finish(session.as_deref()).await;
                return Ok(t.run);
            }
        },
        _ => builder.launch().await?,
    };
    let session = net.session().to_owned();
    let victims = procs::processes(&session, &t.topo);
    let mut hung = false;
    if phase == ChaosPhase::Bcast {
        hung = transfer_under_fire(&mut net, &victims, count, &mut t).await?;
    }
    if !hung {
        let strikes = if phase == ChaosPhase::Reduce { count } else { 0 };
        t.reduce(&mut net, &victims, strikes).await;
    }
    t.settle_orphans(&mut net).await;
    t.classify(&mut net);
    shutdown(net).await;
    t.finish(Some(&session)).await;
    Ok(t.run)
}

impl Trial<'_> {
    fn dead_after(&self) -> Duration {
        Duration::from_secs_f64(self.args.dead_after)
    }

    /// How long one wave or one transfer step may take before it counts as a hang: a
    /// stopped node may hold it up for the silence limit before it is cut off.
    fn limit(&self) -> Duration {
        self.dead_after() * 3 + Duration::from_secs(10)
    }

    /// Records a strike already made (`SIGKILL back-end rank 3 during start-up`).
    fn record(&mut self, victim: Victim, stop: bool, when: &str) {
        self.run.faults.push(format!("SIG{} {}{when}", if stop { "STOP" } else { "KILL" }, victim.what));
        self.strikes.push(Strike { victim, stop });
    }

    /// Kills or stops a random process of `victims` not struck yet; false when none is left.
    fn strike_any(&mut self, victims: &[Victim], when: &str) -> bool {
        let candidates: Vec<&Victim> =
            victims.iter().filter(|v| !self.strikes.iter().any(|s| s.victim.pid == v.pid)).collect();
        if candidates.is_empty() {
            return false;
        }
        let victim = candidates[self.rng.gen_range(0..candidates.len())].clone();
        let stop = self.rng.gen_bool(self.args.stop_fraction);
        procs::signal_process(if stop { "-STOP" } else { "-KILL" }, victim.pid);
        self.record(victim, stop, when);
        // Recovery is measured to the next complete wave; a transfer in between would count too.
        if when.is_empty() {
            self.pending_recovery.push(Instant::now());
        }
        true
    }

    /// Runs the waves, striking `strikes` processes before random ones. Each wave asks
    /// every rank for `x + rank` through the equivalence-class filter.
    async fn reduce(&mut self, net: &mut Network, victims: &[Victim], strikes: usize) {
        let comm = net.broadcast_communicator();
        let stream = match net.new_stream(&comm, StreamOptions::reduce(TransformKind::EqClass)).await {
            Ok(s) => s,
            Err(e) => {
                self.run.wrong += 1;
                self.run.notes.push(format!("the stream of the waves was refused: {e}"));
                return;
            }
        };
        let waves = self.args.waves;
        let mut fault_at: Vec<usize> = (0..strikes).map(|_| self.rng.gen_range(0..waves)).collect();
        fault_at.sort_unstable();
        for wave in 0..waves {
            while fault_at.first() == Some(&wave) {
                fault_at.remove(0);
                if !self.strike_any(victims, "") {
                    // This wave's other faults have no victim either; later waves keep theirs.
                    fault_at.retain(|&w| w > wave);
                    break;
                }
            }
            let x = self.rng.gen_range(0..1_000_000);
            let sent_lost = net.lost().ranks().clone();
            if let Err(e) = stream.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await {
                self.run.notes.push(format!("wave {wave}: the request was refused: {e}"));
                self.run.wrong += 1;
                break;
            }
            match stream.recv_timeout(self.limit()).await {
                Ok(packet) => {
                    self.run.waves += 1;
                    self.check_wave(&packet, x, &sent_lost);
                    let now = Instant::now();
                    self.run
                        .recovery_s
                        .extend(self.pending_recovery.drain(..).map(|t| (now - t).as_secs_f64()));
                }
                // Every rank the request reached was cut off with its comm node; the
                // stream goes on for the orphans that rejoin.
                Err(ApiError::NoAnswer(_)) => self.run.waves += 1,
                Err(ApiError::StreamClosed(_)) => break,
                Err(e) => {
                    self.run.notes.push(format!("wave {wave}: {e}"));
                    self.run.hangs += 1;
                    break;
                }
            }
            self.take_events(net);
        }
        let _ = tokio::time::timeout(Duration::from_secs(10), stream.close()).await;
    }

    /// Counts the wrong answers of one wave: a value other than `x + rank`, or an
    /// answer from a rank reported lost before the request went out.
    fn check_wave(&mut self, packet: &treecast_api::Packet, x: i32, sent_lost: &RankSet) {
        let Ok(classes) = packet.eq_classes() else {
            self.run.wrong += self.topo.backends() as u64;
            self.run.notes.push("an answer did not decode as equivalence classes".into());
            return;
        };
        for class in classes {
            let value = class.values.first().and_then(Value::as_i64);
            for r in class.ranks.iter() {
                if value != Some(i64::from(x) + i64::from(r)) || sent_lost.contains(r) {
                    self.run.wrong += 1;
                }
            }
        }
    }

    fn take_events(&mut self, net: &mut Network) {
        while let Some(event) = net.try_event() {
            match event {
                Event::RanksLost { ranks, .. } => self.lost.union_with(&ranks),
                Event::RanksRejoined { ranks, .. } => self.rejoined.union_with(&ranks),
                _ => {}
            }
        }
    }

    /// Waits until every orphan of a lost comm node has rejoined or been reported lost
    /// (at most the rejoin and silence limits, and a margin): counted while they were
    /// still on their way, they showed as neither (0 orphaned, 0 rejoined after a kill).
    async fn settle_orphans(&mut self, net: &mut Network) {
        let rejoin = super::rejoin_limit(self.args).unwrap_or_default();
        let deadline = Instant::now() + rejoin + self.dead_after() + Duration::from_secs(5);
        loop {
            self.take_events(net);
            let mut pending = RankSet::new();
            for (ranks, _) in net.orphaned() {
                pending.union_with(&ranks);
            }
            let pending =
                pending.difference(&self.rejoined).difference(&self.lost).difference(net.lost().ranks());
            if pending.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                self.run.notes.push(format!(
                    "orphans {pending} neither rejoined nor were reported lost within {:.1} s",
                    (rejoin + self.dead_after()).as_secs_f64()
                ));
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sorts the ranks reported lost: struck back-ends are expected; ranks under a
    /// struck comm node are orphans; any other rank was alive and must not be lost.
    fn classify(&mut self, net: &mut Network) {
        self.take_events(net);
        self.lost.union_with(net.lost().ranks());
        let mut struck_backends = RankSet::new();
        let mut under_struck_node = RankSet::new();
        for s in &self.strikes {
            if s.victim.backend {
                struck_backends.union_with(&s.victim.ranks);
            } else {
                under_struck_node.union_with(&s.victim.ranks);
            }
        }
        self.run.rejoined_ranks = self.rejoined.len();
        let collateral = self.lost.difference(&struck_backends);
        self.run.orphaned_ranks = collateral.intersection(&under_struck_node).len();
        self.run.live_ranks_lost = collateral.difference(&under_struck_node).len();
    }

    /// Continues the stopped processes still there, so that they see their links
    /// closed and end; then counts what is left of the session, and ends it.
    async fn finish(&mut self, session: Option<&str>) {
        for s in &self.strikes {
            if s.stop {
                procs::signal_process("-CONT", s.victim.pid);
            }
        }
        let Some(session) = session else { return };
        self.run.left = procs::wait_for_none(session, Duration::from_secs(10)).await;
        // Counted, then ended: the benchmark leaves nothing behind either.
        for (pid, _) in procs::session_processes(session) {
            procs::signal_process("-KILL", pid);
        }
    }
}

async fn shutdown(net: Network) {
    let _ = tokio::time::timeout(Duration::from_secs(30), net.shutdown()).await;
}

/// Starts the tree while a thread strikes `count` of its processes, each a random
/// moment after it appears. Returns the network, or why the start-up failed and the
/// session, if a process of it was seen.
async fn launch_under_fire(
    builder: NetworkBuilder,
    count: usize,
    t: &mut Trial<'_>,
) -> Result<Network, (String, Option<String>)> {
    let mut ids: Vec<usize> = (1..t.topo.len()).collect();
    ids.shuffle(&mut t.rng);
    ids.truncate(count);
    let plan: Vec<(usize, Duration, bool)> = ids
        .into_iter()
        .map(|id| {
            (id, t.rng.gen_range(Duration::ZERO..=STARTUP_SPREAD), t.rng.gen_bool(t.args.stop_fraction))
        })
        .collect();
    let over = Arc::new(AtomicBool::new(false));
    let sniper = {
        let (over, topo) = (over.clone(), t.topo.clone());
        tokio::task::spawn_blocking(move || snipe(plan, &topo, &over))
    };
    // Two start-up limits per level at most (a level to connect, one to join).
    let limit = STARTUP_LIMIT * (2 * t.topo.depth() as u32 + 2) + Duration::from_secs(10);
    let outcome = tokio::time::timeout(limit, builder.launch()).await;
    over.store(true, Ordering::Relaxed);
    let (struck, session) = sniper.await.unwrap_or_default();
    for (victim, stop) in struck {
        t.record(victim, stop, " during start-up");
    }
    match outcome {
        Ok(Ok(net)) => Ok(net),
        Ok(Err(e)) => Err((e.to_string().lines().next().unwrap_or_default().to_owned(), session)),
        Err(_) => {
            t.run.hangs += 1;
            Err((format!("the start-up took more than {limit:?}"), session))
        }
    }
}

/// Strikes node `id` of each `(id, delay, stop)` of `plan` `delay` after its process
/// appears among this process's descendants, until all are struck or `over` is set.
/// Returns what it struck and the session of the processes it saw.
fn snipe(
    mut plan: Vec<(usize, Duration, bool)>,
    topo: &Topology,
    over: &AtomicBool,
) -> (Vec<(Victim, bool)>, Option<String>) {
    let mut seen: HashMap<usize, (u32, Instant)> = HashMap::new();
    let mut struck = Vec::new();
    let mut session = None;
    while !over.load(Ordering::Relaxed) {
        for (pid, env) in procs::descendants() {
            if session.is_none() {
                session = env_value(&env, "TREECAST_SESSION");
            }
            if let Some(id) = env_value(&env, "TREECAST_NODE_ID").and_then(|s| s.parse::<usize>().ok()) {
                seen.entry(id).or_insert((pid, Instant::now()));
            }
        }
        let now = Instant::now();
        plan.retain(|&(id, delay, stop)| match seen.get(&id) {
            Some(&(pid, since)) if now >= since + delay => {
                procs::signal_process(if stop { "-STOP" } else { "-KILL" }, pid);
                struck.push((Victim::new(pid, id, topo), stop));
                false
            }
            _ => true,
        });
        if plan.is_empty() {
            break;
        }
        std::thread::sleep(SCAN_EVERY);
    }
    (struck, session)
}

/// Sends a random file of `--file-size` bytes to every rank while `count` processes
/// are struck at random points of it, and checks the report and the copy. Returns
/// true when the transfer hung.
async fn transfer_under_fire(
    net: &mut Network,
    victims: &[Victim],
    count: usize,
    t: &mut Trial<'_>,
) -> anyhow::Result<bool> {
    let dir = tempfile::Builder::new().prefix("treecast-chaos-").tempdir()?;
    let src = dir.path().join("source");
    let mut data = vec![0u8; usize::try_from(t.args.file_size)?];
    t.rng.fill_bytes(&mut data);
    std::fs::write(&src, &data)?;
    let dst = dir.path().join("copy");
    let mut marks: Vec<u64> = (0..count).map(|_| t.rng.gen_range(0..=t.args.file_size)).collect();
    marks.sort_unstable();
    let comm = net.broadcast_communicator();
    let entry = [FileEntry::file_at(&src, &dst)];
    let options = FileOptions::default();
    let limit = options.timeout * 4 + t.limit();
    let transfer = bcast_files(net, &comm, &entry, &options, |p| {
        if let Progress::Sent { sent, .. } = p {
            while marks.first().is_some_and(|&m| sent >= m) {
                marks.remove(0);
                t.strike_any(victims, " mid-transfer");
            }
        }
    });
    // Bound first: the progress closure borrows the trial until the transfer is dropped.
    let outcome = tokio::time::timeout(limit, transfer).await;
    match outcome {
        Err(_) => {
            t.run.hangs += 1;
            t.run.notes.push(format!("the transfer took more than {limit:?}"));
            return Ok(true);
        }
        Ok(Err(e)) => {
            t.run.wrong += 1;
            t.run.notes.push(format!("the transfer failed as a whole: {e}"));
        }
        Ok(Ok(mut reports)) => match reports.pop() {
            Some(report) => t.check_transfer(&report, &data, &dst),
            None => t.run.notes.push("the transfer returned no report".into()),
        },
    }
    Ok(false)
}

impl Trial<'_> {
    /// Every rank must be in the report; a copy reported written must be the source,
    /// byte for byte; the ranks that failed join the lost ones, to be sorted.
    fn check_transfer(&mut self, report: &FileReport, data: &[u8], dst: &Path) {
        let all = RankSet::range(0, self.topo.backends() as u32);
        let mut reported = RankSet::new();
        for o in &report.outcomes {
            reported.union_with(&o.ranks);
        }
        let mut failed = report.ranks_with(Outcome::Failed);
        for (ranks, _) in &report.lost {
            failed.union_with(ranks);
            reported.union_with(ranks);
        }
        let forgotten = all.difference(&reported);
        if !forgotten.is_empty() {
            self.run.wrong += forgotten.len();
            self.run.notes.push(format!("the transfer report has no outcome for ranks {forgotten}"));
        }
        let mut done = report.ranks_with(Outcome::Written);
        done.union_with(&report.ranks_with(Outcome::SkippedShared));
        if !done.is_empty() && std::fs::read(dst).ok().as_deref() != Some(data) {
            self.run.wrong += done.len();
            self.run
                .notes
                .push(format!("ranks {done} reported the copy written, but it differs from the source"));
        }
        for o in report.outcomes.iter().filter(|o| o.outcome == Outcome::Failed) {
            self.run.notes.push(format!("the transfer failed ranks {}: {}", o.ranks, o.detail));
        }
        for (ranks, why) in &report.lost {
            self.run.notes.push(format!("the transfer lost ranks {ranks}: {why}"));
        }
        self.run.transfer_failed += failed.len();
        self.lost.union_with(&failed);
    }
}
