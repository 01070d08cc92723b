//! `treecast bench route`: the reliable UDP multicast route per message size and
//! group size. With `--sim` the protocol runs in a simulated LAN (virtual time, a
//! line rate per uplink, seeded loss); each row sets beside it what sending one
//! copy per child at the same line rate would take, as TCP does. Without it, a
//! local tree on real sockets is timed per route (`route_live.rs`).

use std::process::ExitCode;
use std::time::Duration;

use anyhow::{ensure, Context};
use bytes::Bytes;
use serde::Serialize;
use treecast_transport::mcast::sim::{Faults, Lan, LanConfig};
use treecast_transport::mcast::McastConfig;

use crate::apps::cli::{RouteBenchArgs, RouteKind};

use super::shared::parse_size;

/// Longest a message may take in virtual time before the row reports a hang.
const LIMIT: Duration = Duration::from_secs(3_600);

/// Bytes a TCP segment takes on an Ethernet wire besides its payload (the model's):
/// IPv4 and TCP headers with timestamps, and Ethernet framing.
const TCP_OVERHEAD: u64 = 52 + 38;
const TCP_SEGMENT: u64 = 1448;

/// One row: one message of one size to one group.
#[derive(Debug, Clone, Serialize)]
pub struct RouteRow {
    /// Receivers in the group.
    pub receivers: usize,
    /// Message bytes.
    pub bytes: u64,
    /// Virtual time from queueing the message to every receiver's final ACK.
    pub time_us: f64,
    /// Bytes per second delivered to each receiver.
    pub rate_mb_s: f64,
    /// Fragments multicast per fragment of the message.
    pub fragments_per_fragment: f64,
    /// Retransmitted fragments.
    pub retransmitted: u64,
    /// NACKs the sender got.
    pub nacks: u64,
    /// Times the acker changed.
    pub acker_changes: u64,
    /// Sender and receiver time-outs that fired (each a wait of the time-out).
    pub timeouts: u64,
    /// The model's time to send one copy per receiver at the same line rate (one
    /// TCP connection per child, no loss, the window never limiting), plus the
    /// latency there and back (the last ACK), as the row's time counts the final ACKs.
    pub per_child_copies_us: f64,
    /// How many times longer the per-child copies take.
    pub per_child_ratio: f64,
    /// Receivers reported lost.
    pub lost: usize,
}

/// Runs the benchmark.
pub async fn main(args: RouteBenchArgs) -> anyhow::Result<ExitCode> {
    if let Some(addr) = &args.serve {
        return super::route_pair::serve(addr).await;
    }
    if let Some(to) = &args.to {
        return super::route_pair::client(&args, to).await;
    }
    if !args.sim {
        return super::route_live::main(args).await;
    }
    ensure!(
        matches!(args.route, None | Some(RouteKind::Udp)),
        "--sim models the UDP multicast route only; per-child TCP copies are the model column of each row"
    );
    ensure!((0.0..1.0).contains(&args.loss), "--loss {} must be at least 0 and below 1", args.loss);
    ensure!(args.rate_mbit > 0, "--rate-mbit must be above 0");
    ensure!(
        args.receivers.iter().all(|&n| (1..=1024).contains(&n)),
        "--receivers takes group sizes from 1 to 1024"
    );
    let sizes = args.sizes.iter().map(|s| parse_size(s)).collect::<anyhow::Result<Vec<u64>>>()?;
    let config = McastConfig::from_env(|name| std::env::var(name).ok())?;
    let lan = LanConfig {
        latency: Duration::from_micros(args.latency_us),
        rate_bps: Some(args.rate_mbit * 1_000_000),
        faults: Faults { loss: args.loss, ..Faults::NONE },
        seed: args.seed,
        ..LanConfig::default()
    };
    if !args.json {
        print_header(&args, &config);
    }
    for &receivers in &args.receivers {
        for &bytes in &sizes {
            let row = measure(config, lan, receivers, bytes)?;
            if args.json {
                println!("{}", serde_json::to_string(&row)?);
            } else {
                print_row(&row);
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn measure(config: McastConfig, lan: LanConfig, receivers: usize, bytes: u64) -> anyhow::Result<RouteRow> {
    let len = usize::try_from(bytes).context("message size")?;
    let data: Bytes = (0..len).map(|i| i as u8).collect::<Vec<u8>>().into();
    let mut sim = Lan::new(config, receivers, lan);
    sim.send(data.clone());
    let outcome = sim.run(LIMIT);
    ensure!(
        outcome.settled,
        "{receivers} receivers, {bytes} bytes: did not complete within an hour of virtual time"
    );
    for i in 0..receivers {
        if !outcome.lost.contains(&treecast_transport::mcast::sim::receiver_id(i)) {
            ensure!(sim.delivered(i) == [data.clone()], "receiver {i} got something else than was sent");
        }
    }
    let fragment = u64::from(config.fragment);
    let fragments = bytes.div_ceil(fragment).max(1);
    let time = outcome.elapsed.as_secs_f64();
    let copies = per_child_copies(receivers as u64, bytes, lan).as_secs_f64();
    Ok(RouteRow {
        receivers,
        bytes,
        time_us: time * 1e6,
        rate_mb_s: bytes as f64 / time / 1e6,
        fragments_per_fragment: outcome.sender.fragments as f64 / fragments as f64,
        retransmitted: outcome.sender.retransmitted,
        nacks: outcome.sender.nacks,
        acker_changes: outcome.sender.acker_changes,
        timeouts: outcome.sender.timeouts + outcome.receivers.timeouts,
        per_child_copies_us: copies * 1e6,
        per_child_ratio: copies / time,
        lost: outcome.lost.len(),
    })
}

/// The model's time for one copy per child over TCP at the line rate: every
/// segment crosses the sender's uplink once per child; then the last segment's
/// latency and its ACK's.
fn per_child_copies(receivers: u64, bytes: u64, lan: LanConfig) -> Duration {
    let rate = lan.rate_bps.unwrap_or(u64::MAX).max(1);
    let segments = bytes.div_ceil(TCP_SEGMENT).max(1);
    let wire_bits = (bytes + segments * TCP_OVERHEAD) * 8 * receivers;
    Duration::from_nanos(
        u64::try_from(u128::from(wire_bits) * 1_000_000_000 / u128::from(rate)).unwrap_or(u64::MAX),
    ) + lan.latency * 2
}

fn print_header(args: &RouteBenchArgs, config: &McastConfig) {
    println!(
        "simulated LAN: {} Mbit/s uplinks, {} us latency, {:.1} % loss, seed {}; fragments of {} B; virtual time",
        args.rate_mbit,
        args.latency_us,
        args.loss * 100.0,
        args.seed,
        config.fragment
    );
    println!(
        "{:>5} {:>10} {:>12} {:>9} {:>8} {:>7} {:>6} {:>6} {:>6} {:>14} {:>7}",
        "recv",
        "bytes",
        "time us",
        "MB/s",
        "frag/fr",
        "resent",
        "nacks",
        "acker",
        "t-outs",
        "per-child us",
        "ratio"
    );
}

fn print_row(r: &RouteRow) {
    println!(
        "{:>5} {:>10} {:>12.1} {:>9.1} {:>8.3} {:>7} {:>6} {:>6} {:>6} {:>14.1} {:>6.2}x{}",
        r.receivers,
        r.bytes,
        r.time_us,
        r.rate_mb_s,
        r.fragments_per_fragment,
        r.retransmitted,
        r.nacks,
        r.acker_changes,
        r.timeouts,
        r.per_child_copies_us,
        r.per_child_ratio,
        if r.lost > 0 { format!("  {} lost", r.lost) } else { String::new() }
    );
}
