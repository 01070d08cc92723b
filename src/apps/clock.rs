//! `treecast clock`: starts a tree, lets the global clock measure it, and prints every
//! node's offset to the front-end's clock, its drift and the error bound. With the
//! `TREECAST_CLOCK_DISTORT` test knob it also prints the distortion each node was
//! given and how far the estimate is from it.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use treecast_api::NodeClock;
use treecast_node::env::{clock_distortion, CLOCK_DISTORT};

use super::cli::ClockArgs;

/// Runs `treecast clock`.
pub async fn main(args: ClockArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.rounds > 0, "--rounds needs at least 1");
    let limit = Duration::try_from_secs_f64(args.wait)
        .with_context(|| format!("--wait {} is not a number of seconds", args.wait))?;
    let knob = std::env::var(CLOCK_DISTORT).ok();
    if let Some(knob) = &knob {
        // Checked here, once: otherwise every node would only log it and run undistorted.
        clock_distortion(knob, 1, 0).map_err(anyhow::Error::msg)?;
    }
    let net = super::run::launch(&args.tree).await?;
    let table = net.wait_clock(args.rounds, limit).await;
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    net.shutdown().await;
    let table = table?;
    let injected = |id: u32| -> Option<i64> {
        let d = clock_distortion(knob.as_deref()?, id, now_ns).ok()??;
        Some(d.at(now_ns))
    };
    if args.json {
        let rows: Vec<serde_json::Value> = table
            .iter()
            .map(|c| {
                serde_json::json!({
                    "node_id": c.node_id, "name": c.name, "offset_ns": c.offset_ns, "drift_ppm": c.drift_ppm,
                    "error_bound_ns": c.error_ns, "rtt_ns": c.rtt_ns, "age_s": c.age_s, "rounds": c.rounds,
                    "injected_ns": injected(c.node_id),
                    "estimate_error_ns": injected(c.node_id).map(|i| c.offset_ns - i),
                })
            })
            .collect();
        println!("{}", serde_json::json!({ "nodes": rows, "summary": summary(&table, &injected) }));
    } else {
        print!("{}", render(&table, &injected));
    }
    Ok(ExitCode::SUCCESS)
}

/// Error statistics against the injected distortion, when there is one.
fn summary(table: &[NodeClock], injected: &dyn Fn(u32) -> Option<i64>) -> serde_json::Value {
    let mut errors: Vec<i64> =
        table.iter().filter_map(|c| injected(c.node_id).map(|i| (c.offset_ns - i).abs())).collect();
    errors.sort_unstable();
    let pick = |q: f64| errors.get(((errors.len() as f64 - 1.0) * q).round() as usize).copied();
    let within = table
        .iter()
        .filter(|c| injected(c.node_id).is_some_and(|i| (c.offset_ns - i).unsigned_abs() <= c.error_ns))
        .count();
    serde_json::json!({
        "nodes": table.len(),
        "compared": errors.len(),
        "error_ns_median": pick(0.5),
        "error_ns_p99": pick(0.99),
        "error_ns_max": errors.last(),
        "within_bound": within,
    })
}

fn render(table: &[NodeClock], injected: &dyn Fn(u32) -> Option<i64>) -> String {
    let mut out =
        String::from("node  name                        offset us    drift ppm  bound us    rtt us   age s");
    let distorted = table.iter().any(|c| injected(c.node_id).is_some());
    if distorted {
        out.push_str("   injected us   error us");
    }
    out.push('\n');
    for c in table {
        out.push_str(&format!(
            "{:4}  {:26} {:12.3} {:10.3} {:9.3} {:9.3} {:7.1}",
            c.node_id,
            c.name,
            c.offset_ns as f64 / 1e3,
            c.drift_ppm,
            c.error_ns as f64 / 1e3,
            c.rtt_ns as f64 / 1e3,
            c.age_s
        ));
        if let Some(i) = injected(c.node_id) {
            out.push_str(&format!(" {:13.3} {:10.3}", i as f64 / 1e3, (c.offset_ns - i) as f64 / 1e3));
        }
        out.push('\n');
    }
    if distorted {
        let s = summary(table, injected);
        out.push_str(&format!(
            "against the injected distortion: median error {} ns, p99 {} ns, max {} ns; {} of {} within their bound\n",
            s["error_ns_median"], s["error_ns_p99"], s["error_ns_max"], s["within_bound"], s["compared"]
        ));
    }
    out
}
