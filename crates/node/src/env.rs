//! Environment variables a parent sets for the processes it starts.
//!
//! They carry only what a process needs before it can read its launch plan: where
//! its parent listens, who it is, and (in [`treecast_transport::SECRET_ENV`], never
//! on a command line) the session secret. Everything else (launcher, routes, time
//! limits, sizes) travels in the plan. A process clears the secret once it has read
//! it ([`crate::read_secret`]), also from the block `/proc/PID/environ` shows.

/// Address of the parent's listener: `ip:port`, or `unix:@name`.
pub const PARENT: &str = "TREECAST_PARENT";
/// Node id of the process in the whole tree (pre-order index); it authenticates as this.
pub const NODE_ID: &str = "TREECAST_NODE_ID";
/// Back-end rank (back-ends only).
pub const RANK: &str = "TREECAST_RANK";
/// Number of back-ends in the network (back-ends only).
pub const SIZE: &str = "TREECAST_SIZE";
/// Session id shared by every process of one network; tests find leftovers by it.
pub const SESSION: &str = "TREECAST_SESSION";
/// Address comm nodes listen on for TCP links within one host (default loopback).
pub const LISTEN: &str = "TREECAST_LISTEN";
/// Log filter for comm nodes and back-ends (tracing's env-filter syntax).
pub const LOG: &str = "TREECAST_LOG";
/// Route within one host: `unix` (default) or `tcp`.
pub const ROUTE: &str = "TREECAST_ROUTE";
/// Path of the attach file a back-end joins through (`BackEnd::attach`).
pub const ATTACH_FILE: &str = "TREECAST_ATTACH";
/// Largest frame payload a node accepts, in bytes.
pub const MAX_FRAME: &str = "TREECAST_MAX_FRAME";
/// Seconds a link may stay silent (no data, no heartbeat) before it is cut off as
/// failed; `0` switches heartbeats and the check off. Read by the front-end, and set
/// by parents for the back-ends they start.
pub const DEAD_AFTER: &str = "TREECAST_DEAD_AFTER";

/// The heartbeat and silence limits `TREECAST_DEAD_AFTER` asks for: the default when
/// it is unset or not a number, `None` for `0`. Heartbeats go four times per limit,
/// at most once a second.
pub fn liveness_from_env() -> Option<crate::core::LivenessLimits> {
    let secs = std::env::var(DEAD_AFTER).ok().and_then(|s| s.trim().parse::<f64>().ok());
    match secs {
        None => Some(crate::core::LivenessLimits::default()),
        Some(s) if s.is_finite() && s > 0.0 => {
            Some(liveness_for(std::time::Duration::from_secs_f64(s.min(1e6))))
        }
        Some(_) => None,
    }
}

/// Limits that cut a link off after `dead_after` of silence.
pub fn liveness_for(dead_after: std::time::Duration) -> crate::core::LivenessLimits {
    crate::core::LivenessLimits {
        heartbeat: (dead_after / 4)
            .min(crate::core::DEFAULT_HEARTBEAT)
            .max(std::time::Duration::from_millis(1)),
        dead_after,
    }
}
