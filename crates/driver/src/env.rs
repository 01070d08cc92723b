//! Environment variables a parent sets for the processes it starts, and the
//! settings those processes read there.
//!
//! A parent sets where it listens, who the child is, the session and (in
//! [`treecast_transport::SECRET_ENV`], never on a command line) the session
//! secret; for back-ends also their rank, the network's size and their group.
//! Launcher, routes, time limits and sizes reach a comm node in its launch plan;
//! back-ends, and comm nodes for the clock, still read their time limits and clock
//! settings here (the functions `*_from_env`), as do the route and log filter. A
//! process clears the secret once it has read it ([`crate::read_secret`]), also
//! from the block `/proc/PID/environ` shows.

/// Address of the parent's listener: `ip:port`, or `unix:@name`.
pub const PARENT: &str = "TREECAST_PARENT";
/// Node id of the process in the whole tree (pre-order index); it authenticates as this.
pub const NODE_ID: &str = "TREECAST_NODE_ID";
/// Back-end rank (back-ends only).
pub const RANK: &str = "TREECAST_RANK";
/// Number of back-ends in the network (back-ends only).
pub const SIZE: &str = "TREECAST_SIZE";
/// Group a back-end started while the tree runs belongs to (its spawn's id).
pub const GROUP: &str = "TREECAST_GROUP";
/// A spawned back-end's rank within its group (0 for the group's first).
pub const GROUP_RANK: &str = "TREECAST_GROUP_RANK";
/// Number of back-ends in a spawned back-end's group.
pub const GROUP_SIZE: &str = "TREECAST_GROUP_SIZE";
/// Session id shared by every process of one network; tests find leftovers by it.
pub const SESSION: &str = "TREECAST_SESSION";
/// Where a spawned back-end announces itself before connecting (a light join):
/// its comm node's join socket, `@name`. Absent: it joins by connecting.
pub const JOIN_ANNOUNCE: &str = "TREECAST_JOIN_ANNOUNCE";
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
/// Largest control frame a child may send, in bytes per back-end it reaches.
pub const MAX_CONTROL: &str = "TREECAST_MAX_CONTROL";
/// Bytes from which a payload goes between two processes of one host as a sealed
/// memory file instead of through their Unix socket; unset or `off`: never (the
/// socket was faster wherever it was measured). Read by every process for what it
/// sends.
pub const ZERO_COPY_MIN: &str = "TREECAST_ZERO_COPY_MIN";

/// The smallest size `TREECAST_ZERO_COPY_MIN` may ask for.
const ZERO_COPY_FLOOR: usize = 4096;

/// The size `TREECAST_ZERO_COPY_MIN` asks for (at least 4096); `None` when it is unset, `off`, or not
/// a number of bytes (said as a warning).
pub fn zero_copy_min_from_env() -> Option<usize> {
    let text = std::env::var(ZERO_COPY_MIN).ok()?;
    match text.trim() {
        "off" => None,
        t => match t.parse::<usize>() {
            Ok(n) if n >= ZERO_COPY_FLOOR => Some(n),
            Ok(_) => {
                tracing::warn!("{ZERO_COPY_MIN}={text:?} is under {ZERO_COPY_FLOOR} bytes, which cost less to copy than to pass as a file; using {ZERO_COPY_FLOOR}");
                Some(ZERO_COPY_FLOOR)
            }
            Err(_) => {
                tracing::warn!("{ZERO_COPY_MIN}={text:?} is not a number of bytes or `off`; large payloads go through the socket");
                None
            }
        },
    }
}

/// Seconds a link may stay silent (no data, no heartbeat) before it is cut off as
/// failed; `0` switches heartbeats and the check off. Read by the front-end, and set
/// by parents for the back-ends they start.
pub const DEAD_AFTER: &str = "TREECAST_DEAD_AFTER";

/// Seconds a silence limit (`--dead-after`, [`DEAD_AFTER`]) or a rejoin limit
/// (`--rejoin-within`, [`REJOIN_WITHIN`]) may be, `0` (off) aside: shorter, and
/// scheduling delays alone would cut healthy nodes off.
pub const LIMIT_SECS: std::ops::RangeInclusive<f64> = 0.1..=1e6;

/// Seconds a comm node or back-end takes from [`DEAD_AFTER`] and [`REJOIN_WITHIN`]:
/// what its parent sets (whole milliseconds of its plan, so 0.001 at least) or the
/// front-end's user checked against [`LIMIT_SECS`] already.
const CHILD_LIMIT_SECS: std::ops::RangeInclusive<f64> = 0.001..=1e6;

/// Seconds a process may take to start and connect ([`STARTUP_TIMEOUT`]).
pub const STARTUP_SECS: std::ops::RangeInclusive<f64> = 0.1..=86_400.0;

/// Seconds a node may take to connect to its parent (default 30); a comm node gets
/// twice that per level below it to hear from its whole sub-tree.
pub const STARTUP_TIMEOUT: &str = "TREECAST_STARTUP_TIMEOUT";

/// `text`, the value of `var`, as seconds within `range`; `Ok(None)` for `0` when
/// `zero_off` (the variable switches something off).
///
/// # Errors
/// Not a number, or out of the range: a sentence naming the variable, its value and
/// the range.
pub fn secs_in(
    var: &str,
    text: &str,
    range: std::ops::RangeInclusive<f64>,
    zero_off: bool,
) -> Result<Option<std::time::Duration>, String> {
    match text.trim().parse::<f64>() {
        Ok(0.0) if zero_off => Ok(None),
        Ok(secs) if range.contains(&secs) => Ok(Some(std::time::Duration::from_secs_f64(secs))),
        _ => Err(format!(
            "{var}={text:?} is not {}a number of seconds from {} to {}",
            if zero_off { "0 (off) or " } else { "" },
            range.start(),
            range.end()
        )),
    }
}

/// The heartbeat and silence limits `TREECAST_DEAD_AFTER` asks for: the default when
/// it is unset or not a number of seconds from 0.001 to 1000000 (said as a warning),
/// `None` for `0`. Heartbeats go four times per limit, at most once a second.
pub fn liveness_from_env() -> Option<treecast_proto::LivenessLimits> {
    let default = treecast_proto::LivenessLimits::default();
    let Ok(text) = std::env::var(DEAD_AFTER) else { return Some(default) };
    match secs_in(DEAD_AFTER, &text, CHILD_LIMIT_SECS, true) {
        Ok(limit) => limit.map(treecast_proto::LivenessLimits::for_dead_after),
        Err(e) => {
            tracing::warn!("{e}; using {} s", default.dead_after.as_secs_f64());
            Some(default)
        }
    }
}

/// Seconds the children of a lost comm node have to rejoin the tree under its
/// parent (`0`: no recovery); a back-end takes it from here, comm nodes from their plan.
pub const REJOIN_WITHIN: &str = "TREECAST_REJOIN_WITHIN";
pub use treecast_proto::DEFAULT_REJOIN_WITHIN;

/// The rejoin limit `TREECAST_REJOIN_WITHIN` asks for: [`DEFAULT_REJOIN_WITHIN`] when
/// it is unset or not a number of seconds (said once, as a warning), `None`
/// (recovery off) for `0`.
pub fn rejoin_from_env() -> Option<std::time::Duration> {
    let Ok(text) = std::env::var(REJOIN_WITHIN) else { return Some(DEFAULT_REJOIN_WITHIN) };
    match secs_in(REJOIN_WITHIN, &text, CHILD_LIMIT_SECS, true) {
        Ok(limit) => limit,
        Err(e) => {
            tracing::warn!("{e}; using {} s", DEFAULT_REJOIN_WITHIN.as_secs_f64());
            Some(DEFAULT_REJOIN_WITHIN)
        }
    }
}

pub use treecast_proto::{clock_distortion, Distortion, CLOCK_DISTORT};
/// Seconds between clock re-synchronisations after the first two rounds (default 300).
pub const CLOCK_RESYNC: &str = "TREECAST_CLOCK_RESYNC";
/// Probes per round of the global clock, 1 to 1024 (default 32): each bounds the
/// offset, and the estimate is where all the bounds meet.
pub const CLOCK_PROBES: &str = "TREECAST_CLOCK_PROBES";
/// Probes of a round sent back to back, each as soon as the last is answered, 1 to
/// 1024 (default 32).
pub const CLOCK_PROBE_BURST: &str = "TREECAST_CLOCK_PROBE_BURST";
/// Milliseconds between the bursts of a round (default 2).
pub const CLOCK_PROBE_GAP_MS: &str = "TREECAST_CLOCK_PROBE_GAP_MS";

/// Node `node_id`'s clock and probing schedule: the system's real-time clock, with
/// the distortion of [`CLOCK_DISTORT`] if it is set (a malformed knob is logged and
/// ignored), and [`CLOCK_RESYNC`].
pub fn clock_from_env(node_id: u32) -> (treecast_proto::ClockSource, treecast_proto::ClockConfig) {
    let base = std::time::Instant::now();
    let base_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    let mut source = treecast_proto::ClockSource::new(base, base_ns);
    if let Ok(knob) = std::env::var(CLOCK_DISTORT) {
        match clock_distortion(&knob, node_id, base_ns) {
            Ok(Some(d)) => source.distortion = d,
            Ok(None) => {}
            // Said once, by the front-end; every other node would repeat it.
            Err(e) if node_id == 0 => tracing::warn!("{e}; the clocks are not distorted"),
            Err(e) => tracing::debug!("{e}; the clock is not distorted"),
        }
    }
    let mut config = treecast_proto::ClockConfig::default();
    // Said once, by the front-end: every other node would repeat it.
    let warn = |knob: &str, text: &str, wanted: &str, default: String| {
        if node_id == 0 {
            tracing::warn!("{knob}={text:?} is not {wanted}; using {default}");
        }
    };
    if let Ok(text) = std::env::var(CLOCK_RESYNC) {
        match text.trim().parse::<f64>() {
            Ok(secs) if secs > 0.0 && secs.is_finite() => {
                config.resync = std::time::Duration::from_secs_f64(secs.min(1e7));
            }
            _ => warn(
                CLOCK_RESYNC,
                &text,
                "a number of seconds above 0",
                format!("{} s", config.resync.as_secs_f64()),
            ),
        }
    }
    for (knob, count) in [(CLOCK_PROBES, &mut config.probes), (CLOCK_PROBE_BURST, &mut config.probe_burst)] {
        if let Ok(text) = std::env::var(knob) {
            match text.trim().parse::<u32>() {
                Ok(n) if (1..=1024).contains(&n) => *count = n,
                _ => warn(knob, &text, "a count from 1 to 1024", count.to_string()),
            }
        }
    }
    if let Ok(text) = std::env::var(CLOCK_PROBE_GAP_MS) {
        match text.trim().parse::<f64>() {
            Ok(ms) if (0.0..=60_000.0).contains(&ms) => {
                config.probe_gap = std::time::Duration::from_secs_f64(ms / 1e3)
            }
            _ => warn(
                CLOCK_PROBE_GAP_MS,
                &text,
                "a number of milliseconds from 0 to 60000",
                format!("{} ms", config.probe_gap.as_secs_f64() * 1e3),
            ),
        }
    }
    (source, config)
}
