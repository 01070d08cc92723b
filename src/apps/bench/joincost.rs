//! What joining by connection costs a spawned process, measured for `bench spawn`:
//! a connect to a comm node's Unix socket and the challenge-response handshake,
//! both ends in this process. A join by one datagram (announcing the process and
//! opening its connection later) could save at most this much of a spawn.

use std::time::{Duration, Instant};

use treecast_transport::{handshake, Listener, Secret, Stream};

use super::shared::Timings;

/// Connections timed.
const JOINS: usize = 200;
/// Limit of one handshake.
const LIMIT: Duration = Duration::from_secs(5);

/// Times `JOINS` connects and handshakes to a local Unix socket, in milliseconds.
///
/// # Errors
/// A socket that cannot be opened or a handshake that fails.
pub async fn measure() -> anyhow::Result<Timings> {
    let listener = Listener::unix()?;
    let address = listener.address()?;
    let secret = Secret::generate();
    let parent_secret = secret.clone();
    let accepting = tokio::spawn(async move {
        for _ in 0..JOINS {
            let (mut stream, peer) = listener.accept().await?;
            handshake::accept(&mut stream, &parent_secret, &peer, LIMIT).await?;
        }
        Ok::<_, treecast_transport::TransportError>(())
    });
    let mut ms = Vec::with_capacity(JOINS);
    for node_id in 0..JOINS as u32 {
        let started = Instant::now();
        let mut stream = Stream::connect(&address, LIMIT).await?;
        handshake::connect(&mut stream, &secret, node_id + 1, "the comm node", LIMIT).await?;
        ms.push(started.elapsed().as_secs_f64() * 1e3);
    }
    accepting.await??;
    Timings::of(&ms).ok_or_else(|| anyhow::anyhow!("no join timed"))
}
