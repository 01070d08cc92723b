//! `treecast clock --sim`: the global clock in the simulated tree, where every
//! node's clock is virtual time distorted as `TREECAST_CLOCK_DISTORT` says and the
//! truth is known exactly: the estimate right after the last round of probes, and
//! the same samples extrapolated by their drifts a while later (no round between),
//! each against the injected distortion.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use treecast_api::{compose_clock, NodeClock, Topology};
use treecast_driver::env::CLOCK_DISTORT;
use treecast_proto::ClockConfig;
use treecast_sim::{Sim, SimClocks, SimConfig};

use super::cli::ClockArgs;

/// The distortion used when `TREECAST_CLOCK_DISTORT` is not set: the worst
/// case, offsets up to ±1 s and drifts up to ±100 ppm.
pub const DEFAULT_KNOB: &str = "seed:1,offset_us:1000000,drift_ppm:100";

/// The global clock measured in a simulated tree, at two moments.
pub struct SimClock {
    /// Every node's estimate right after the rounds asked for.
    pub after_sync: Vec<NodeClock>,
    /// The same samples, extrapolated `later` on.
    pub later: Vec<NodeClock>,
    /// How much later.
    pub later_by: Duration,
    /// Each node's true offset to the front-end's clock, at each of the two moments.
    truth: [HashMap<u32, i64>; 2],
}

impl SimClock {
    /// Node `id`'s true offset at the first (0) or second (1) moment.
    pub fn truth(&self, moment: usize, id: u32) -> Option<i64> {
        self.truth[moment].get(&id).copied()
    }
}

/// Runs the probing of `topo` in virtual time until every link has `rounds` rounds,
/// with links of 20 to 60 µs each way plus up to `jitter` per frame.
///
/// # Errors
/// A knob that does not parse, or rounds that did not come in time.
pub fn measure(
    topo: Topology,
    knob: &str,
    rounds: u32,
    later_by: Duration,
    jitter: Duration,
) -> anyhow::Result<SimClock> {
    treecast_proto::clock_distortion(knob, 1, 0).map_err(anyhow::Error::msg)?;
    let mut config = SimConfig::new(topo.clone(), 1);
    config.delay = (Duration::from_micros(20), Duration::from_micros(60));
    config.jitter = jitter;
    config.clocks = Some(SimClocks { knob: knob.to_owned(), config: ClockConfig::default() });
    let mut sim = Sim::new(config);
    let missing = sim.launch().map_err(anyhow::Error::msg)?;
    anyhow::ensure!(missing.is_empty(), "the simulated tree did not start whole: {missing:?}");
    let links = topo.len() - 1;
    let measured = |s: &mut Sim| {
        s.core(0).is_some_and(|fe| fe.clock_samples().filter(|(_, r)| *r >= rounds).count() == links)
    };
    sim.run_until(measured, Duration::from_secs(3600)).with_context(|| {
        format!("{rounds} rounds on every link did not come within an hour of virtual time")
    })?;
    let samples: HashMap<_, _> = sim
        .core(0)
        .map(|fe| fe.clock_samples().map(|(s, r)| (s.node_id, (*s, r))).collect())
        .unwrap_or_default();
    let at = |t: Instant| -> anyhow::Result<(Vec<NodeClock>, HashMap<u32, i64>)> {
        let root = sim.core(0).and_then(|fe| fe.clock_now(t)).context("the front-end has no clock")?;
        let mut truth = HashMap::new();
        for id in 1..topo.len() {
            let clock = sim.core(id).and_then(|n| n.clock_now(t)).context("a node has no clock")?;
            truth.insert(id as u32, clock - root);
        }
        Ok((compose_clock(&topo, &samples, root), truth))
    };
    let (after_sync, now_truth) = at(sim.now())?;
    let (later, later_truth) = at(sim.now() + later_by)?;
    Ok(SimClock { after_sync, later, later_by, truth: [now_truth, later_truth] })
}

/// Runs `treecast clock --sim`.
pub fn main(args: &ClockArgs) -> anyhow::Result<ExitCode> {
    let spec = args.tree.topology.as_deref().unwrap_or("balanced:4x4x4");
    let topo = Topology::from_spec(spec, Some(args.tree.local.unwrap_or(64)))?;
    let knob = std::env::var(CLOCK_DISTORT).unwrap_or_else(|_| DEFAULT_KNOB.to_owned());
    let later_by = Duration::try_from_secs_f64(args.later).context("--later takes seconds")?;
    let jitter =
        Duration::try_from_secs_f64(args.jitter_us / 1e6).context("--jitter-us takes microseconds")?;
    let m = measure(topo, &knob, args.rounds, later_by, jitter)?;
    let now = |id| m.truth(0, id);
    let later = |id| m.truth(1, id);
    if args.json {
        let shown = serde_json::json!({
            "topology": spec, "distortion": knob, "rounds": args.rounds, "jitter_us": args.jitter_us,
            "after_sync": super::clock::summary(&m.after_sync, &now),
            "later": { "seconds": m.later_by.as_secs_f64(), "summary": super::clock::summary(&m.later, &later) },
        });
        println!("{shown}");
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "simulated tree {spec}, virtual time; distortion {knob}; links 20-60 us each way plus up to {} us per frame",
        args.jitter_us
    );
    println!("right after {} rounds of probes:", args.rounds);
    print!("{}", super::clock::render(&m.after_sync, &now));
    println!("\n{:.0} s later, by drift interpolation (no round in between):", m.later_by.as_secs_f64());
    print!("{}", super::clock::render(&m.later, &later));
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The p99 of the estimates' errors at `moment`; every estimate within its bound.
    fn p99(m: &SimClock, moment: usize) -> i64 {
        let table = if moment == 0 { &m.after_sync } else { &m.later };
        let mut errors: Vec<i64> = table
            .iter()
            .map(|c| {
                let error = (c.offset_ns - m.truth(moment, c.node_id).expect("a true offset")).abs();
                assert!(
                    error as u64 <= c.error_ns,
                    "node {}: error {error} ns past its bound {}",
                    c.node_id,
                    c.error_ns
                );
                error
            })
            .collect();
        errors.sort_unstable();
        errors[(errors.len() - 1) * 99 / 100]
    }

    #[test]
    fn a_three_level_tree_keeps_its_clocks_within_microseconds_ten_minutes_after_a_sync() {
        let topo = || Topology::from_spec("balanced:4x4x4", Some(64)).expect("a topology");
        let ten_minutes = Duration::from_secs(600);
        let jitter = Duration::from_micros(5);
        let early = measure(topo(), DEFAULT_KNOB, 3, ten_minutes, jitter).expect("measured");
        let settled = measure(topo(), DEFAULT_KNOB, 6, ten_minutes, jitter).expect("measured");
        assert_eq!(settled.after_sync.len(), 84);
        assert!(p99(&settled, 0) <= 2_000, "right after a sync: p99 {} ns", p99(&settled, 0));
        assert!(p99(&settled, 1) <= 5_000, "ten minutes on: p99 {} ns", p99(&settled, 1));
        // The drift measured over 25 minutes extrapolates better than over 5.
        assert!(p99(&settled, 1) < p99(&early, 1), "{} ns against {} ns", p99(&settled, 1), p99(&early, 1));
    }
}
