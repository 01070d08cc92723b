//! `treecast bench route --serve ADDR` / `--to ADDR[,ADDR]`: one route between two
//! hosts, measured from the connecting side. The server answers every frame with
//! an empty one on the same link (a frame tagged [`DIGEST_TAG`] with the SHA-256 of
//! its payload instead, which tests use to check what arrived); the client sends one
//! message of each size at a time and times it until the answer came (a transfer
//! plus one small frame back).
//! Beside each route's rows it prints the raw socket floor: a plain TCP stream
//! between the same hosts carrying the same bytes, on the server's port + 1.
//!
//! Both sides take the session secret from `TREECAST_SECRET` (64 hex digits).

use std::future::poll_fn;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::task::Poll;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use sha2::Digest;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use treecast_transport::striped::{self, Rails, WithStriped};
use treecast_transport::{handshake, LinkPeer, Listener, Route, RouteEvent, Secret, Stream, StreamRoute};
use treecast_wire::{Frame, FrameHeader, LinkId, LinkTable, MAX_PAYLOAD_LEN};

use super::shared::parse_size;
use crate::apps::cli::{RouteBenchArgs, RouteKind};

const LIMIT: Duration = Duration::from_secs(120);
/// A frame with this tag is answered with the SHA-256 of its payload.
pub const DIGEST_TAG: i32 = 8;

/// Serves clients at `addr` (treecast links) and its port + 1 (raw TCP) until killed.
pub async fn serve(addr: &str) -> anyhow::Result<ExitCode> {
    let secret = Secret::from_env()?;
    let stall = crate::apps::settings::stripe_stall_from(|v| std::env::var(v).ok())?;
    let at: SocketAddr = addr.parse().with_context(|| format!("--serve {addr}"))?;
    // Multipath TCP where the kernel has it: it takes plain TCP clients too.
    let links = Listener::mptcp_at(at)?;
    let raw = tokio::net::TcpListener::bind(SocketAddr::new(at.ip(), at.port() + 1)).await?;
    eprintln!("serving treecast links on {at} and raw TCP on port {}", at.port() + 1);
    tokio::spawn(async move {
        while let Ok((mut s, _)) = raw.accept().await {
            let _ = s.set_nodelay(true);
            tokio::spawn(async move {
                let mut buf = vec![0u8; 1 << 20];
                while let Ok(len) = s.read_u64_le().await {
                    let mut left = len;
                    while left > 0 {
                        let n = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                        if s.read_exact(&mut buf[..n]).await.is_err() {
                            return;
                        }
                        left -= n as u64;
                    }
                    if s.write_all(&[1]).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<treecast_transport::Socket>>(16);
    tokio::spawn(async move {
        let mut rails = Rails::default();
        loop {
            let Ok((mut stream, peer)) = links.accept().await else { continue };
            let Ok(got) = handshake::accept_any(&mut stream, &secret, &peer, LIMIT).await else {
                continue;
            };
            let Ok(socket) = stream.into_socket() else { continue };
            let group = match got {
                handshake::Accepted::Link { .. } => Some(vec![socket]),
                handshake::Accepted::Rail { node_id, token, index, count } => {
                    rails.arrived((node_id, token), (index, count), socket, Instant::now())
                }
            };
            if let Some(group) = group {
                if tx.send(group).await.is_err() {
                    return;
                }
            }
        }
    });
    let mut route = WithStriped::new(StreamRoute::new(MAX_PAYLOAD_LEN), MAX_PAYLOAD_LEN);
    if let Some(limit) = stall {
        route.striped().set_stall_limit(limit);
    }
    let mut ids = LinkTable::new();
    poll_fn(|cx| loop {
        let mut any = false;
        while let Poll::Ready(Some(group)) = rx.poll_recv(cx) {
            let link = ids.insert(());
            if let Err(e) = route.add_links(link, group, LinkPeer::Parent, "client".into()) {
                eprintln!("could not take a client's link: {e}");
            }
            any = true;
        }
        let mut answers = Vec::new();
        any |= route.poll_recv(cx, &mut |link, e| match e {
            RouteEvent::Frame(f) | RouteEvent::Timed(f, _) => {
                let answer = match f.header.tag {
                    DIGEST_TAG => sha2::Sha256::digest(&f.payload).to_vec(),
                    _ => Vec::new(),
                };
                answers.push((link, f.header.tag, answer));
            }
            RouteEvent::Closed(_) => {
                ids.remove(link);
            }
        });
        for (link, tag, answer) in answers {
            route.send(&[link], &Frame::new(FrameHeader::data(0, tag, 0), answer));
        }
        route.flush();
        if !any {
            return Poll::<()>::Pending;
        }
    })
    .await;
    Ok(ExitCode::SUCCESS)
}

/// One row: a route, a size, the median time of a message and its answer.
struct Row {
    route: String,
    bytes: u64,
    secs: f64,
}

/// Measures the routes against the server at `to` (one address per rail).
pub async fn client(args: &RouteBenchArgs, to: &str) -> anyhow::Result<ExitCode> {
    let secret = Secret::from_env()?;
    let addrs: Vec<String> = to.split(',').map(str::to_owned).collect();
    let first: SocketAddr = addrs[0].parse().with_context(|| format!("--to {to}"))?;
    let sizes = args.sizes.iter().map(|s| parse_size(s)).collect::<anyhow::Result<Vec<u64>>>()?;
    ensure!(args.rounds > 0, "--rounds needs at least 1");
    let routes = match args.route {
        Some(r) => vec![RouteKind::Tcp, r],
        None => vec![RouteKind::Tcp, RouteKind::Striped(2), RouteKind::Mptcp],
    };
    println!(
        "{:>10} {:>10} {:>12} {:>10} {:>10} {:>9}",
        "route", "bytes", "time us", "MB/s", "raw MB/s", "vs raw"
    );
    let raw_addr = SocketAddr::new(first.ip(), first.port() + 1);
    let mut raw = tokio::net::TcpStream::connect(raw_addr).await.context("the raw TCP port")?;
    raw.set_nodelay(true)?;
    let mut floor = Vec::new();
    for &bytes in &sizes {
        let payload = vec![0xa5u8; usize::try_from(bytes)?];
        let mut times = Vec::new();
        for _ in 0..args.rounds + 1 {
            let t = Instant::now();
            raw.write_u64_le(bytes).await?;
            raw.write_all(&payload).await?;
            let mut one = [0u8; 1];
            raw.read_exact(&mut one).await?;
            times.push(t.elapsed().as_secs_f64());
        }
        floor.push((bytes, median(&mut times[1..].to_vec())));
    }
    let stall = crate::apps::settings::stripe_stall_from(|v| std::env::var(v).ok())?;
    for route in routes {
        let mut r = WithStriped::new(StreamRoute::new(MAX_PAYLOAD_LEN), MAX_PAYLOAD_LEN);
        if let Some(limit) = stall {
            r.striped().set_stall_limit(limit);
        }
        let mut ids = LinkTable::new();
        let link = ids.insert(());
        let sockets = match route {
            RouteKind::Striped(n) => striped::connect(&addrs, n, 1, &secret, LIMIT).await?,
            RouteKind::Mptcp | RouteKind::Tcp => {
                let a = match route {
                    RouteKind::Mptcp => format!("{}{}", treecast_transport::MPTCP_PREFIX, addrs[0]),
                    _ => addrs[0].clone(),
                };
                let mut s = Stream::connect(&a, LIMIT).await?;
                if let (RouteKind::Mptcp, Stream::Tcp(t)) = (route, &s) {
                    eprintln!("mptcp: the link runs Multipath TCP: {}", treecast_transport::is_mptcp(t));
                }
                handshake::connect(&mut s, &secret, 1, &a, LIMIT).await?;
                vec![s.into_socket()?]
            }
            RouteKind::Udp => anyhow::bail!("--to measures tcp, striped:N and mptcp"),
        };
        r.add_links(link, sockets, LinkPeer::Parent, "server".into())?;
        for (&bytes, &(_, raw_secs)) in sizes.iter().zip(&floor) {
            let frame = Frame::new(FrameHeader::data(1, 7, 0), vec![0xa5u8; usize::try_from(bytes)?]);
            let mut times = Vec::new();
            for _ in 0..args.rounds + 1 {
                times.push(exchange(&mut r, link, &frame).await?);
            }
            let row = Row { route: route.to_string(), bytes, secs: median(&mut times[1..].to_vec()) };
            println!(
                "{:>10} {:>10} {:>12.1} {:>10.1} {:>10.1} {:>8.2}x",
                row.route,
                row.bytes,
                row.secs * 1e6,
                row.bytes as f64 / row.secs / 1e6,
                bytes as f64 / raw_secs / 1e6,
                raw_secs / row.secs
            );
        }
        r.close(link, treecast_transport::Close::Now);
    }
    Ok(ExitCode::SUCCESS)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Sends `frame` on `link` and waits for the answer; returns the seconds it took.
async fn exchange(r: &mut WithStriped<StreamRoute>, link: LinkId, frame: &Frame) -> anyhow::Result<f64> {
    let t = Instant::now();
    r.send(&[link], frame);
    r.flush();
    let mut closed = None;
    let answered = poll_fn(|cx| loop {
        let mut got = false;
        let any = r.poll_recv(cx, &mut |_, e| match e {
            RouteEvent::Frame(_) | RouteEvent::Timed(..) => got = true,
            RouteEvent::Closed(why) => closed = Some(why.unwrap_or_else(|| "closed".into())),
        });
        r.flush();
        if got || closed.is_some() {
            return Poll::Ready(());
        }
        if !any {
            return Poll::Pending;
        }
    });
    tokio::time::timeout(LIMIT, answered).await.context("no answer within two minutes")?;
    if let Some(why) = closed {
        anyhow::bail!("the server closed the link: {why}");
    }
    Ok(t.elapsed().as_secs_f64())
}
