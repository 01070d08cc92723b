//! `treecast demo`: the embedded default, a local tree showing what treecast does.

use std::process::ExitCode;
use std::time::Instant;

use anyhow::ensure;
use treecast_api::{StreamOptions, TransformKind, Value};

use super::cli::DemoArgs;
use super::protocol::DEFAULT_OUTPUT_LIMIT;
use super::protocol::{TAG_ADD_RANK, TAG_WHERE};
use super::run::{render, run_on};

/// Starts a local tree, shows a broadcast + sum, equivalence classes and a run.
pub async fn main(args: DemoArgs) -> anyhow::Result<ExitCode> {
    let topology = crate::apps::run::topology_from_spec(&args.topology, None)?;
    let n = topology.backends() as u32;
    println!(
        "treecast demo: starting a local {} tree ({} back-ends, {} comm nodes)",
        args.topology,
        n,
        topology.comm_nodes()
    );
    let net = super::settings::builder(topology)?.launch().await?;
    println!(
        "  tree up in {:.1} ms; every link authenticated with this session's secret",
        ms(net.startup_time())
    );

    let comm = net.broadcast_communicator();
    let sum = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await?;
    let x = 1000;
    let t = Instant::now();
    sum.send(TAG_ADD_RANK, "%d", &[Value::Int(x)]).await?;
    let total = sum.recv().await?.unpack("%d")?[0].as_i64().unwrap_or(0);
    let expected = i64::from(x) * i64::from(n) + i64::from(n) * i64::from(n - 1) / 2;
    println!(
        "  broadcast {x} to {n} back-ends; each answered {x} + its rank; the tree summed them: {total} (expected {expected}) in {:.2} ms",
        ms(t.elapsed())
    );
    ensure!(total == expected, "the sum reduction gave {total}, expected {expected}");

    let eq = net.new_stream(&comm, StreamOptions::reduce(TransformKind::EqClass)).await?;
    eq.send(TAG_WHERE, "", &[]).await?;
    let classes = eq.recv().await?.eq_classes()?;
    println!("  equivalence classes of \"which comm node am I under\" ({} classes):", classes.len());
    for c in &classes {
        let what = c.values.first().and_then(Value::as_str).unwrap_or("?");
        println!("    [{}] {what}", c.ranks);
    }

    println!("  run `hostname` on every back-end, outputs grouped in the tree:");
    let report = run_on(net, &["hostname".to_owned()], None, DEFAULT_OUTPUT_LIMIT).await?;
    for line in String::from_utf8_lossy(&render(&report)).lines() {
        println!("    {line}");
    }
    ensure!(report.ok, "the run did not succeed on every rank");
    println!("treecast demo: done; every process of the tree has exited");
    Ok(ExitCode::SUCCESS)
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
