//! Environment variables a parent sets for the processes it starts, and the
//! `TREECAST_*` settings the `treecast` command reads for its front-end.
//!
//! Inputs a process started by treecast reads: [`PARENT`], [`NODE_ID`], [`SESSION`]
//! and (in [`treecast_transport::SECRET_ENV`], never on a command line) the secret;
//! a back-end started for a light join also [`JOIN_ANNOUNCE`], its parent's second
//! address, and the `treecast` binary (not the library) the log filter [`LOG`], which
//! must hold before the plan arrives. Everything else a comm node or a back-end needs
//! (launcher, routes, time limits, zero-copy threshold, stripe stall limit, rank,
//! size, group, clock settings) arrives from its parent in its plan
//! (`LaunchPlan`, `MemberPlan`), attach mode included. The other variables a
//! library reads: the per-process test hooks of [`treecast_transport::testing`],
//! `TREECAST_SECRET_STDIN` (a process started over ssh reads the secret from its
//! standard input), `TREECAST_ATTACH` and the rank for `BackEnd::attach`, and
//! `PATH` where `NetworkBuilder` looks for `treecast`. [`RANK`], [`SIZE`], [`GROUP`],
//! [`GROUP_RANK`] and [`GROUP_SIZE`] are set for the back-end's command as
//! information only (scripts read `$TREECAST_RANK`); the back-end library does not
//! read them. The other variables here are read by the `treecast` command, which
//! turns them into the front-end's configuration, naming a malformed one. A process
//! clears the secret once it has read it ([`crate::read_secret`]), also from the
//! block `/proc/PID/environ` shows.

/// Address of the parent's listener: `ip:port`, or `unix:@name`.
pub const PARENT: &str = "TREECAST_PARENT";
/// Node id of the process in the whole tree (pre-order index); it authenticates as this.
pub const NODE_ID: &str = "TREECAST_NODE_ID";
/// Back-end rank, for the back-end's command (information: the library takes it from the plan).
pub const RANK: &str = "TREECAST_RANK";
/// Number of back-ends in the network, for the back-end's command (information).
pub const SIZE: &str = "TREECAST_SIZE";
/// Group a back-end started while the tree runs belongs to (its spawn's id; information).
pub const GROUP: &str = "TREECAST_GROUP";
/// A spawned back-end's rank within its group (0 for the group's first; information).
pub const GROUP_RANK: &str = "TREECAST_GROUP_RANK";
/// Number of back-ends in a spawned back-end's group (information).
pub const GROUP_SIZE: &str = "TREECAST_GROUP_SIZE";
/// Session id shared by every process of one network; tests find leftovers by it.
pub const SESSION: &str = "TREECAST_SESSION";
/// Where a spawned back-end announces itself before connecting (a light join):
/// its comm node's join socket, `@name`. Absent: it joins by connecting.
pub const JOIN_ANNOUNCE: &str = "TREECAST_JOIN_ANNOUNCE";
/// Address comm nodes listen on for TCP links within one host (default loopback).
pub const LISTEN: &str = "TREECAST_LISTEN";
/// Rails striped links spread their connections over, comma-separated: subnets
/// (`10.1.0.0/16`) or interface names (`ib1`); read by the `treecast` command.
pub const RAILS: &str = "TREECAST_RAILS";
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
/// socket was faster wherever it was measured). Read by the `treecast` command; the
/// plans carry it to every process, for what it sends.
pub const ZERO_COPY_MIN: &str = "TREECAST_ZERO_COPY_MIN";

/// The smallest size `TREECAST_ZERO_COPY_MIN` may ask for: smaller payloads cost
/// less to copy than to pass as a file.
pub const ZERO_COPY_FLOOR: usize = 4096;

/// The size [`ZERO_COPY_MIN`]'s value `text` asks for; `None` for `off`.
///
/// # Errors
/// Not `off` nor a number of bytes from [`ZERO_COPY_FLOOR`] to 4 GiB, said with the variable.
pub fn zero_copy_min_in(text: &str) -> Result<Option<usize>, String> {
    match text.trim() {
        "off" => Ok(None),
        t => match t.parse::<u32>() {
            Ok(n) if n as usize >= ZERO_COPY_FLOOR => Ok(Some(n as usize)),
            _ => Err(format!(
                "{ZERO_COPY_MIN}={text:?} is not `off` or a number of bytes from {ZERO_COPY_FLOOR} \
                 (smaller payloads cost less to copy than to pass as a file) to {}",
                u32::MAX
            )),
        },
    }
}

/// Seconds a link may stay silent (no data, no heartbeat) before it is cut off as
/// failed; `0` switches heartbeats and the check off. Read by the `treecast`
/// command; the plans carry it down the tree.
pub const DEAD_AFTER: &str = "TREECAST_DEAD_AFTER";

/// Seconds a silence limit (`--dead-after`, [`DEAD_AFTER`]) or a rejoin limit
/// (`--rejoin-within`, [`REJOIN_WITHIN`]) may be, `0` (off) aside: shorter, and
/// scheduling delays alone would cut healthy nodes off.
pub const LIMIT_SECS: std::ops::RangeInclusive<f64> = 0.1..=1e6;

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

/// Seconds the children of a lost comm node have to rejoin the tree under its
/// parent (`0`: no recovery). Read by the `treecast` command; the plans carry it down.
pub const REJOIN_WITHIN: &str = "TREECAST_REJOIN_WITHIN";
pub use treecast_proto::DEFAULT_REJOIN_WITHIN;

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

/// This process's clock: the system's real-time clock, read now. The plan's clock
/// settings (its distortion knob among them) apply when the plan arrives.
pub fn system_clock() -> treecast_proto::ClockSource {
    let base = std::time::Instant::now();
    let base_ns = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    treecast_proto::ClockSource::new(base, base_ns)
}

/// The clock settings the `TREECAST_CLOCK_*` variables ask for, read through `lookup`
/// (the front-end's environment): unset ones keep the nodes' defaults.
///
/// # Errors
/// A set variable that is malformed or out of range: a sentence naming it, its value
/// and what it takes.
pub fn clock_plan_from(lookup: impl Fn(&str) -> Option<String>) -> Result<treecast_wire::ClockPlan, String> {
    let mut plan = treecast_wire::ClockPlan::default();
    let bad = |var: &str, text: &str, wanted: &str| format!("{var}={text:?} is not {wanted}");
    if let Some(text) = lookup(CLOCK_RESYNC) {
        plan.resync_ms = match text.trim().parse::<f64>() {
            Ok(secs) if secs >= 0.001 && secs <= f64::from(u32::MAX) / 1e3 => {
                Some((secs * 1e3).round() as u32)
            }
            _ => return Err(bad(CLOCK_RESYNC, &text, "a number of seconds from 0.001 to 4294967")),
        };
    }
    for (var, count) in [(CLOCK_PROBES, &mut plan.probes), (CLOCK_PROBE_BURST, &mut plan.probe_burst)] {
        if let Some(text) = lookup(var) {
            match text.trim().parse::<u32>() {
                Ok(n) if (1..=treecast_proto::MAX_PROBES).contains(&n) => *count = Some(n),
                _ => return Err(bad(var, &text, "a count from 1 to 1024")),
            }
        }
    }
    if let Some(text) = lookup(CLOCK_PROBE_GAP_MS) {
        plan.probe_gap_us = match text.trim().parse::<f64>() {
            Ok(ms) if (0.0..=60_000.0).contains(&ms) => Some((ms * 1e3).round() as u32),
            _ => return Err(bad(CLOCK_PROBE_GAP_MS, &text, "a number of milliseconds from 0 to 60000")),
        };
    }
    if let Some(knob) = lookup(CLOCK_DISTORT) {
        clock_distortion(&knob, 1, 0).map_err(|e| format!("{e} ({CLOCK_DISTORT} is {knob:?})"))?;
        plan.distort = knob;
    }
    Ok(plan)
}
