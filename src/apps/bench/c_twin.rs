//! `treecast bench microbench --c-twin`: the C API's twin of the micro-benchmark
//! (examples/c/microbench.c) against the Rust API on the same shape in the same run,
//! in rounds that alternate which of the two goes first, and the medians of the
//! rounds' ratios against the C API's targets.

use std::path::Path;
use std::process::ExitCode;

use anyhow::{ensure, Context};
use serde::{Deserialize, Serialize};

use super::microbench::{render, run_case, MicrobenchResult};
use crate::apps::cli::MicrobenchArgs;

/// The C API's reductions/s must be at least this share of the Rust API's.
const REDUCTIONS_TARGET: f64 = 0.95;
/// The C API's round trip must be at most this multiple of the Rust API's.
const ROUND_TRIP_TARGET: f64 = 1.05;

/// The figures the C twin prints (one JSON line).
#[derive(Debug, Clone, Serialize, Deserialize)]
struct TwinResult {
    api: String,
    topology: String,
    backends: u64,
    instantiation_s: f64,
    rtt_us_median: f64,
    rtt_us_mean: f64,
    rtt_us_p99: f64,
    reductions_per_s: f64,
}

/// Both measurements of one round.
struct Round {
    rust: MicrobenchResult,
    c: TwinResult,
    /// Whether the C twin ran before the Rust measurement.
    c_first: bool,
}

impl Round {
    fn round_trip_ratio(&self) -> f64 {
        self.c.rtt_us_median / self.rust.rtt_us_median
    }

    fn reductions_ratio(&self) -> f64 {
        self.c.reductions_per_s / self.rust.reductions_per_s
    }
}

/// The medians over the rounds, as `--json` prints them.
#[derive(Debug, Serialize)]
struct Summary {
    topology: String,
    rounds: usize,
    rust_rtt_us_median: f64,
    c_rtt_us_median: f64,
    rust_reductions_per_s: f64,
    c_reductions_per_s: f64,
    /// Median over the rounds of the C round trip over the Rust one.
    rtt_ratio: f64,
    /// Median over the rounds of the C reductions/s over the Rust ones.
    reductions_ratio: f64,
    targets_met: bool,
}

/// Measures the Rust API and its C twin `--twin-rounds` times on `spec` and prints
/// every round, then, over several, the medians against the targets.
pub(super) async fn against_rust(
    program: &Path,
    spec: &str,
    args: &MicrobenchArgs,
) -> anyhow::Result<ExitCode> {
    let rounds = args.twin_rounds;
    ensure!(rounds > 0, "--twin-rounds needs at least 1 round");
    let mut done = Vec::with_capacity(rounds);
    for i in 0..rounds {
        // Every other round runs the C twin first: what going second costs (the
        // processes of the first still exiting, caches) then falls on both.
        let round = measure_round(program, spec, args, i % 2 == 1).await?;
        print_round(&round, args.json)?;
        done.push(round);
    }
    if rounds > 1 {
        let summary = summarize(spec, &done);
        if args.json {
            println!("{}", serde_json::json!({ "summary": summary }));
        } else {
            print!("{}", render_summary(&summary, &done));
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn measure_round(
    program: &Path,
    spec: &str,
    args: &MicrobenchArgs,
    c_first: bool,
) -> anyhow::Result<Round> {
    let topology = crate::apps::run::topology_from_spec(spec, args.local)?;
    let backends = topology.backends();
    let (rust, c) = if c_first {
        let c = run_twin(program, spec, backends, args).await?;
        (run_case(spec, topology, args, None).await?, c)
    } else {
        let rust = run_case(spec, topology, args, None).await?;
        (rust, run_twin(program, spec, backends, args).await?)
    };
    Ok(Round { rust, c, c_first })
}

/// Runs the C twin on `spec` with the same iterations, over this binary's comm nodes
/// and back-ends.
async fn run_twin(
    program: &Path,
    spec: &str,
    backends: usize,
    args: &MicrobenchArgs,
) -> anyhow::Result<TwinResult> {
    let me = std::env::current_exe().context("finding this program, for the C twin's comm nodes")?;
    let output = tokio::process::Command::new(program)
        .arg(&me)
        .arg(spec)
        .arg(backends.to_string())
        .arg(args.rt.to_string())
        .arg(args.tp.to_string())
        .kill_on_drop(true)
        .output()
        .await
        .with_context(|| format!("starting the C twin {}", program.display()))?;
    ensure!(
        output.status.success(),
        "the C twin {} failed ({}): {}",
        program.display(),
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    let text = String::from_utf8_lossy(&output.stdout);
    serde_json::from_str(text.trim())
        .with_context(|| format!("the C twin printed {:?}, not its JSON line", text.trim()))
}

fn print_round(round: &Round, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(&round.rust)?);
        println!("{}", serde_json::to_string(&round.c)?);
    } else {
        print!("{}{}", render(&round.rust), render_twin(round));
    }
    Ok(())
}

fn render_twin(round: &Round) -> String {
    let (c, rust) = (&round.c, &round.rust);
    format!(
        "C API ({}, same shape, {} the Rust API):\n  \
         round trip      {:.1} us median ({:.2}x the Rust API's {:.1} us), mean {:.1} us, p99 {:.1} us\n  \
         throughput      {:.0} reductions/s ({:.2}x the Rust API's {:.0})\n",
        c.topology,
        if round.c_first { "before" } else { "after" },
        c.rtt_us_median,
        round.round_trip_ratio(),
        rust.rtt_us_median,
        c.rtt_us_mean,
        c.rtt_us_p99,
        c.reductions_per_s,
        round.reductions_ratio(),
        rust.reductions_per_s,
    )
}

/// The middle value; the mean of the two middle ones for an even count.
fn median(values: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = values.collect();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 0 => (v[n / 2 - 1] + v[n / 2]) / 2.0,
        n => v[n / 2],
    }
}

fn summarize(spec: &str, rounds: &[Round]) -> Summary {
    // Ratios are taken round by round (both halves saw the same moment of the
    // machine), then their median: steadier than a ratio of medians.
    let rtt_ratio = median(rounds.iter().map(Round::round_trip_ratio));
    let reductions_ratio = median(rounds.iter().map(Round::reductions_ratio));
    Summary {
        topology: spec.to_owned(),
        rounds: rounds.len(),
        rust_rtt_us_median: median(rounds.iter().map(|r| r.rust.rtt_us_median)),
        c_rtt_us_median: median(rounds.iter().map(|r| r.c.rtt_us_median)),
        rust_reductions_per_s: median(rounds.iter().map(|r| r.rust.reductions_per_s)),
        c_reductions_per_s: median(rounds.iter().map(|r| r.c.reductions_per_s)),
        rtt_ratio,
        reductions_ratio,
        targets_met: rtt_ratio <= ROUND_TRIP_TARGET && reductions_ratio >= REDUCTIONS_TARGET,
    }
}

fn render_summary(s: &Summary, rounds: &[Round]) -> String {
    let listed = |ratio: fn(&Round) -> f64| {
        rounds.iter().map(|r| format!("{:.2}", ratio(r))).collect::<Vec<_>>().join(" ")
    };
    let verdict = |met: bool| if met { "met" } else { "NOT met" };
    let c_first = rounds.iter().filter(|r| r.c_first).count();
    format!(
        "C API against the Rust API ({}, {} rounds, the C twin first in {c_first}):\n  \
         round trip      C/Rust by round {}; median {:.2}x (target at most {ROUND_TRIP_TARGET:.2}x: {})\n  \
         throughput      C/Rust by round {}; median {:.2}x (target at least {REDUCTIONS_TARGET:.2}x: {})\n  \
         medians         Rust {:.1} us, {:.0} reductions/s; C {:.1} us, {:.0} reductions/s\n",
        s.topology,
        s.rounds,
        listed(Round::round_trip_ratio),
        s.rtt_ratio,
        verdict(s.rtt_ratio <= ROUND_TRIP_TARGET),
        listed(Round::reductions_ratio),
        s.reductions_ratio,
        verdict(s.reductions_ratio >= REDUCTIONS_TARGET),
        s.rust_rtt_us_median,
        s.rust_reductions_per_s,
        s.c_rtt_us_median,
        s.c_reductions_per_s,
    )
}

#[cfg(test)]
mod tests {
    use super::median;

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median([1.27, 1.10].into_iter()), 1.185);
        assert_eq!(median([3.0, 1.0, 2.0].into_iter()), 2.0);
        assert!(median(std::iter::empty()).is_nan());
    }
}
