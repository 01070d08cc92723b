//! What a node needs to reach its parent, and what a parent tells a child to reach
//! it: parent addresses (plain, MPTCP, striped), the authenticated connection, and
//! the argument a comm node is started with.

use std::time::Duration;

use treecast_transport::{handshake, Secret, Stream, TransportError};

use crate::{env, NodeError};

/// Prefix of a parent address whose children link over several connections.
const STRIPED_PREFIX: &str = "striped:";

/// The parent address a child is given: `addr` as it is, or with `stripes` > 1
/// `striped:N@addr`, which makes the child open a striped link of N connections.
pub fn striped_address(stripes: u8, addr: String) -> String {
    match stripes {
        0 | 1 => addr,
        n => format!("{STRIPED_PREFIX}{n}@{addr}"),
    }
}

/// The parent address a child of a node with launch plan `plan` is given: with
/// `plan.mptcp` a TCP address as `mptcp:ADDR`, with `plan.stripes` > 1 as
/// [`striped_address`] says.
pub fn child_parent_address(plan: &treecast_wire::LaunchPlan, addr: String) -> String {
    let addr = match plan.mptcp && !addr.starts_with("unix:") {
        true => format!("{}{addr}", treecast_transport::MPTCP_PREFIX),
        false => addr,
    };
    striped_address(plan.stripes, addr)
}

/// A striped parent address: the connections per link and the parent's address
/// on each of its rails (comma-separated). `None` for a plain address.
///
/// # Errors
/// A `striped:` address with no count from 1 to 16, or no address.
pub fn parse_striped(addr: &str) -> Result<Option<(u8, Vec<String>)>, NodeError> {
    let Some(rest) = addr.strip_prefix(STRIPED_PREFIX) else { return Ok(None) };
    let bad = |reason: &str| NodeError::Env { var: env::PARENT, reason: format!("{addr:?}: {reason}") };
    let (count, addrs) = rest.split_once('@').ok_or_else(|| bad("no '@' after the connection count"))?;
    let count: u8 = count
        .parse()
        .ok()
        .filter(|n| (1..=treecast_wire::MAX_STRIPES).contains(n))
        .ok_or_else(|| bad("the connection count is not a number from 1 to 16"))?;
    let addrs: Vec<String> = addrs.split(',').filter(|a| !a.is_empty()).map(str::to_owned).collect();
    if addrs.is_empty() {
        return Err(bad("no address after '@'"));
    }
    Ok(Some((count, addrs)))
}

/// Connects to a parent at `addr` and authenticates as `node_id`.
///
/// # Errors
/// Connection failure or a failed handshake.
///
/// A parent flooded with connections turns the oldest handshakes still under way
/// away, so a handshake turned away or cut off (end of stream, reset) is tried
/// again, backing off, until `limit`; a refused connection or a failed proof is not.
pub async fn connect_to(
    addr: &str,
    node_id: u32,
    secret: &Secret,
    limit: Duration,
) -> Result<Stream, NodeError> {
    // A striped parent address: one plain connection to its first address (a
    // rejoin, a tool's own connection).
    let first = match parse_striped(addr)? {
        Some((_, addrs)) => addrs.into_iter().next(),
        None => None,
    };
    let addr = first.as_deref().unwrap_or(addr);
    let deadline = tokio::time::Instant::now() + limit;
    let mut backoff = Duration::from_millis(10);
    loop {
        let left = deadline.saturating_duration_since(tokio::time::Instant::now());
        let mut stream = Stream::connect(addr, left).await?;
        match handshake::connect(&mut stream, secret, node_id, addr, left).await {
            Ok(()) => return Ok(stream),
            Err(e @ (TransportError::Io { .. } | TransportError::Busy { .. })) if left > backoff => {
                tracing::debug!("handshake with {addr} cut off ({e}); trying again");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_millis(500));
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The argument a comm node is started with: `treecast node`, or `<tool> node` for a
/// tool that serves as its own comm node (it then calls [`run_comm_node`](crate::run_comm_node)).
pub const COMM_NODE_ARG: &str = "node";
