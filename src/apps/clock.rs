//! `treecast clock`: starts a tree, lets the global clock measure it, and prints every
//! node's offset to the front-end's clock, its drift and the error bound. With the
//! `TREECAST_CLOCK_DISTORT` test knob it also prints the distortion each node was
//! given and how far the estimate is from it.

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use treecast_api::{Network, NodeClock, StreamOptions, TransformKind, Value};
use treecast_driver::env::{clock_distortion, CLOCK_DISTORT};
use treecast_monitor::{one_way, size_class_label, OneWay};

use super::cli::ClockArgs;
use super::protocol::TAG_ADD_RANK;

/// Runs `treecast clock`.
pub async fn main(args: ClockArgs) -> anyhow::Result<ExitCode> {
    anyhow::ensure!(args.rounds > 0, "--rounds needs at least 1");
    if args.sim {
        return super::clocksim::main(&args);
    }
    anyhow::ensure!(args.cross_check != Some(0), "--cross-check needs at least 1 wave");
    let limit = super::run::secs_flag("--wait", args.wait, 0.1, 1e6)?;
    let knob = std::env::var(CLOCK_DISTORT).ok();
    if let Some(knob) = &knob {
        // Checked here, once: otherwise every node would only log it and run undistorted.
        clock_distortion(knob, 1, 0).map_err(anyhow::Error::msg)?;
    }
    let net = super::run::launch(&args.tree).await?;
    let table = net.wait_clock(args.rounds, limit).await;
    // The instant the estimates are for: the injected truth is read at it too, not
    // after the cross-check (0.3 s later, 30 µs of a 100 ppm drift).
    let now_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let crossed = match (&table, args.cross_check) {
        (Ok(_), Some(waves)) => Some(cross_check(&net, waves, limit).await),
        _ => None,
    };
    net.shutdown().await;
    let table = table?;
    let crossed = crossed.transpose()?;
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
        let mut shown = serde_json::json!({ "nodes": rows, "summary": summary(&table, &injected) });
        if let Some(pairs) = &crossed {
            shown["cross_check"] = cross_check_json(pairs, &table);
        }
        println!("{shown}");
    } else {
        print!("{}", render(&table, &injected));
        if let Some(pairs) = &crossed {
            print!("{}", render_cross_check(pairs, &table));
        }
    }
    Ok(ExitCode::SUCCESS)
}

/// Records `waves` sum requests down every link and their answers up, and returns
/// each link's shortest net latency both ways.
async fn cross_check(net: &Network, waves: u32, limit: Duration) -> anyhow::Result<Vec<OneWay>> {
    let stream =
        net.new_stream(&net.broadcast_communicator(), StreamOptions::reduce(TransformKind::Sum)).await?;
    let unconfirmed = net.monitor_start(0).await?;
    anyhow::ensure!(unconfirmed.is_empty(), "cross-check: nodes did not start recording: {unconfirmed:?}");
    // One wave at a time: the links are quiet, so the shortest times are the links'.
    for wave in 0..waves {
        stream.send(TAG_ADD_RANK, "%d", &[Value::Int(wave as i32)]).await?;
        stream.recv_timeout(limit).await.context("cross-check: waiting for a sum")?;
    }
    net.monitor_stop().await?;
    let collection = net.monitor_collect(false, limit).await?;
    anyhow::ensure!(collection.missing.is_empty(), "cross-check: no report from {:?}", collection.missing);
    Ok(one_way(&collection.merged()?, u64::from(waves / 2).max(1)))
}

/// A link's error bound: half the shortest probe round trip of its lower node.
fn link_bound_ns(table: &[NodeClock], link: u32) -> Option<u64> {
    table.iter().find(|c| c.node_id == link).map(|c| c.rtt_ns / 2)
}

fn within_bound(p: &OneWay, table: &[NodeClock]) -> Option<bool> {
    link_bound_ns(table, p.link).map(|b| p.skew_ns().unsigned_abs() <= b)
}

fn cross_check_json(pairs: &[OneWay], table: &[NodeClock]) -> serde_json::Value {
    let links: Vec<serde_json::Value> = pairs
        .iter()
        .map(|p| {
            serde_json::json!({
                "link": p.link, "size_class": p.size_class, "down_min_ns": p.down_min_ns, "down_frames": p.down_frames,
                "up_min_ns": p.up_min_ns, "up_frames": p.up_frames, "down_early": p.down_early, "up_early": p.up_early,
                "skew_ns": p.skew_ns(),
                "bound_ns": link_bound_ns(table, p.link), "within_bound": within_bound(p, table),
                "breaks_causality": p.breaks_causality(),
            })
        })
        .collect();
    serde_json::json!({
        "links": links,
        "compared": pairs.len(),
        "within_bound": pairs.iter().filter(|p| within_bound(p, table) == Some(true)).count(),
        "breaking_causality": pairs.iter().filter(|p| p.breaks_causality()).count(),
    })
}

fn render_cross_check(pairs: &[OneWay], table: &[NodeClock]) -> String {
    let mut out = String::from(
        "\none-way cross-check: shortest net latency of equal-size frames, down and up each link\n\
         link  frame size         down us     up us   skew us  bound us\n",
    );
    for p in pairs {
        let bound = link_bound_ns(table, p.link).map_or("-".into(), |b| format!("{:.3}", b as f64 / 1e3));
        let flag = match (p.breaks_causality(), within_bound(p, table)) {
            (true, _) => "  a frame arrived before it was sent",
            (false, Some(false)) => "  outside the bound",
            _ => "",
        };
        out.push_str(&format!(
            "{:4}  {:16} {:9.3} {:9.3} {:9.3} {:>9}{flag}\n",
            p.link,
            size_class_label(p.size_class),
            p.down_min_ns as f64 / 1e3,
            p.up_min_ns as f64 / 1e3,
            p.skew_ns() as f64 / 1e3,
            bound
        ));
    }
    let within = pairs.iter().filter(|p| within_bound(p, table) == Some(true)).count();
    let broken = pairs.iter().filter(|p| p.breaks_causality()).count();
    out.push_str(&format!(
        "{within} of {} links within their bound; {broken} with a frame that arrived before it was sent\n",
        pairs.len()
    ));
    out
}

/// Error statistics against the injected distortion, when there is one.
pub(super) fn summary(table: &[NodeClock], injected: &dyn Fn(u32) -> Option<i64>) -> serde_json::Value {
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

pub(super) fn render(table: &[NodeClock], injected: &dyn Fn(u32) -> Option<i64>) -> String {
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
