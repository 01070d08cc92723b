//! `treecast bench route` on real sockets: a local flat tree of N back-ends per
//! group size, once with every frame over the links (tcp) and once with every
//! frame multicast (udp); per message size, the round trip of one message down and
//! its acknowledgements summed up, and the rate of messages sent back to back. The
//! TCP rows are the reference of the UDP rows, measured in the same run.
//!
//! On one machine the loopback interface has no wire to share: the rows say what
//! the route costs in processing, not what it saves on a LAN (docs/multicast.md).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use serde::Serialize;
use treecast_api::{Network, Stream, StreamOptions, Topology, TransformKind, Value};

use super::shared::parse_size;
use crate::apps::cli::{RouteBenchArgs, RouteKind};
use crate::apps::protocol::TAG_SINK;

/// Longest wait for one answer.
const ANSWER_LIMIT: Duration = Duration::from_secs(120);
/// Bytes a rate row sends at least, in messages of its size.
const RATE_BYTES: u64 = 64 << 20;
/// Messages per rate row, at most and at least.
const RATE_MESSAGES: (u64, u64) = (4, 2000);
/// Largest message: what a frame can carry with its encoding.
const MAX_MESSAGE: u64 = 64 << 20;

/// One row: one route, one group size, one message size.
#[derive(Debug, Clone, Serialize)]
pub struct LiveRow {
    /// `tcp` or `udp`.
    pub route: String,
    /// Receivers (back-ends under the front-end).
    pub receivers: usize,
    /// Message bytes.
    pub bytes: u64,
    /// Median round trip (the upper one of an even count): the message down, every
    /// receiver's acknowledgement summed up.
    pub rtt_us: f64,
    /// Round trips timed.
    pub rounds: usize,
    /// Bytes per second each receiver took, messages sent back to back.
    pub rate_mb_s: f64,
    /// Messages in the rate measurement.
    pub messages: u64,
    /// Messages the front-end multicast, of all it sent in this row (udp; 0 for tcp).
    pub multicast: u64,
    /// Fragments resent by the front-end's group in this row.
    pub resent: u64,
    /// This row's round trip over the TCP row's of the same group and size (udp rows).
    pub rtt_vs_tcp: Option<f64>,
    /// This row's rate over the TCP row's (udp rows).
    pub rate_vs_tcp: Option<f64>,
}

/// Runs the benchmark on a local tree.
pub async fn main(args: RouteBenchArgs) -> anyhow::Result<ExitCode> {
    ensure!(args.rounds > 0, "--rounds needs at least 1");
    ensure!(
        args.receivers.iter().all(|&n| (1..=256).contains(&n)),
        "--receivers takes group sizes from 1 to 256 on one machine"
    );
    let sizes = args.sizes.iter().map(|s| parse_size(s)).collect::<anyhow::Result<Vec<u64>>>()?;
    ensure!(sizes.iter().all(|&b| b <= MAX_MESSAGE), "--sizes: at most 64M on real sockets");
    let routes = match args.route {
        Some(RouteKind::Tcp) => vec![RouteKind::Tcp],
        Some(RouteKind::Udp) => vec![RouteKind::Udp],
        // TCP first, the reference of the other route's rows.
        Some(other) => vec![RouteKind::Tcp, other],
        None => vec![RouteKind::Tcp, RouteKind::Udp],
    };
    if !args.json {
        println!(
            "local flat trees on this machine (loopback): round trip = one message down, the acknowledgements \
             summed up; rate = messages back to back"
        );
        println!(
            "{:>10} {:>5} {:>10} {:>12} {:>6} {:>10} {:>7} {:>10} {:>7} {:>9} {:>9}",
            "route",
            "recv",
            "bytes",
            "rtt us",
            "rounds",
            "MB/s",
            "msgs",
            "multicast",
            "resent",
            "rtt/tcp",
            "rate/tcp"
        );
    }
    let mut tcp_rows: Vec<LiveRow> = Vec::new();
    for &receivers in &args.receivers {
        for &route in &routes {
            let mut net = launch(route, receivers).await?;
            let result = measure_sizes(&mut net, route, receivers, &sizes, args.rounds).await;
            net.shutdown().await;
            for mut row in result? {
                if let Some(tcp) =
                    tcp_rows.iter().find(|t| t.receivers == row.receivers && t.bytes == row.bytes)
                {
                    row.rtt_vs_tcp = Some(row.rtt_us / tcp.rtt_us);
                    row.rate_vs_tcp = Some(row.rate_mb_s / tcp.rate_mb_s);
                }
                print_row(&row, args.json)?;
                if route == RouteKind::Tcp {
                    tcp_rows.push(row);
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

async fn launch(route: RouteKind, receivers: usize) -> anyhow::Result<Network> {
    let topology = Topology::from_spec("flat", Some(receivers))?;
    // Every message goes by multicast on the udp route, however small, even to one child.
    let builder = crate::apps::settings::builder(topology)?
        .udp_route(route == RouteKind::Udp)
        .stripes(route.stripes())
        .mptcp(route == RouteKind::Mptcp)
        .udp_setting("TREECAST_UDP_MIN_FRAME", "0")
        .udp_setting("TREECAST_UDP_MIN_MEMBERS", "1");
    builder.launch().await.with_context(|| format!("starting {receivers} back-ends"))
}

async fn measure_sizes(
    net: &mut Network,
    route: RouteKind,
    receivers: usize,
    sizes: &[u64],
    rounds: usize,
) -> anyhow::Result<Vec<LiveRow>> {
    let comm = net.broadcast_communicator();
    let mut stream = net.new_stream(&comm, StreamOptions::reduce(TransformKind::Sum)).await?;
    let mut rows = Vec::new();
    for &bytes in sizes {
        let message = Value::Bytes(vec![0xa5; usize::try_from(bytes)?]);
        // A first round trip warms the links (and joins every member); not counted.
        round_trip(&mut stream, &message, receivers).await?;
        let before = front_end_route(net).await;
        let rounds = if bytes > 8 << 20 { rounds.min(5) } else { rounds };
        let mut times = Vec::with_capacity(rounds);
        for _ in 0..rounds {
            times.push(round_trip(&mut stream, &message, receivers).await?);
        }
        times.sort_by(f64::total_cmp);
        let messages = (RATE_BYTES / bytes.max(1)).clamp(RATE_MESSAGES.0, RATE_MESSAGES.1);
        let started = Instant::now();
        for _ in 0..messages {
            stream.send(TAG_SINK, "%b", std::slice::from_ref(&message)).await?;
        }
        for _ in 0..messages {
            expect_sum(&mut stream, receivers).await?;
        }
        let rate_time = started.elapsed().as_secs_f64();
        let after = front_end_route(net).await;
        rows.push(LiveRow {
            route: route.to_string(),
            receivers,
            bytes,
            rtt_us: times[times.len() / 2] * 1e6,
            rounds,
            rate_mb_s: (messages * bytes) as f64 / rate_time / 1e6,
            messages,
            multicast: after.0.saturating_sub(before.0),
            resent: after.1.saturating_sub(before.1),
            rtt_vs_tcp: None,
            rate_vs_tcp: None,
        });
    }
    Ok(rows)
}

/// Seconds for one message down and the summed acknowledgements up.
async fn round_trip(stream: &mut Stream, message: &Value, receivers: usize) -> anyhow::Result<f64> {
    let started = Instant::now();
    stream.send(TAG_SINK, "%b", std::slice::from_ref(message)).await?;
    expect_sum(stream, receivers).await?;
    Ok(started.elapsed().as_secs_f64())
}

async fn expect_sum(stream: &mut Stream, receivers: usize) -> anyhow::Result<()> {
    let packet = stream.recv_timeout(ANSWER_LIMIT).await?;
    let sum = packet.unpack("%d")?.first().and_then(Value::as_i64);
    ensure!(sum == Some(receivers as i64), "expected {receivers} acknowledgements, got {sum:?}");
    Ok(())
}

/// Frames multicast and fragments resent so far by the front-end's groups.
async fn front_end_route(net: &Network) -> (u64, u64) {
    let Ok(c) = net.monitor_collect(true, Duration::from_secs(5)).await else { return (0, 0) };
    c.reports
        .get(&0)
        .map(|r| r.routes.iter().fold((0, 0), |(f, s), g| (f + g.frames, s + g.retransmitted)))
        .unwrap_or((0, 0))
}

fn print_row(r: &LiveRow, json: bool) -> anyhow::Result<()> {
    if json {
        println!("{}", serde_json::to_string(r)?);
        return Ok(());
    }
    let ratio = |x: Option<f64>| x.map_or_else(|| "-".to_owned(), |v| format!("{v:.2}x"));
    println!(
        "{:>10} {:>5} {:>10} {:>12.1} {:>6} {:>10.1} {:>7} {:>10} {:>7} {:>9} {:>9}",
        r.route,
        r.receivers,
        r.bytes,
        r.rtt_us,
        r.rounds,
        r.rate_mb_s,
        r.messages,
        r.multicast,
        r.resent,
        ratio(r.rtt_vs_tcp),
        ratio(r.rate_vs_tcp)
    );
    Ok(())
}
