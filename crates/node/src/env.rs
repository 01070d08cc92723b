//! Environment variables through which a parent configures the processes it starts.
//!
//! The session secret travels in [`treecast_transport::SECRET_ENV`]; nothing
//! secret is ever put on a command line. A process clears the variable once it has
//! read it ([`crate::connect_parent`]), also from the block `/proc/PID/environ` shows.

/// Address of the parent's listener: `ip:port`, or `unix:PATH`.
pub const PARENT: &str = "TREECAST_PARENT";
/// Node id of the process in the whole tree (pre-order index).
pub const NODE_ID: &str = "TREECAST_NODE_ID";
/// Back-end rank (back-ends only).
pub const RANK: &str = "TREECAST_RANK";
/// Number of back-ends in the network (back-ends only).
pub const SIZE: &str = "TREECAST_SIZE";
/// Session id shared by every process of one network; tests find leftovers by it.
pub const SESSION: &str = "TREECAST_SESSION";
/// Address comm nodes listen on (default loopback).
pub const LISTEN: &str = "TREECAST_LISTEN";
/// Log filter for comm nodes and back-ends (tracing's env-filter syntax).
pub const LOG: &str = "TREECAST_LOG";
/// Route comm nodes use to their own children: `unix` (default, same host) or `tcp`.
pub const ROUTE: &str = "TREECAST_ROUTE";
/// `1` to start without children that fail to start (they are reported lost).
pub const ALLOW_MISSING: &str = "TREECAST_ALLOW_MISSING";
/// Launcher for children on other hosts: `ssh` or `slurm` (unset: this host only).
pub const LAUNCHER: &str = treecast_launch::LAUNCHER_ENV;
/// Path of `treecast` where children run.
pub const REMOTE_PATH: &str = treecast_launch::REMOTE_PATH_ENV;
/// Attach mode: milliseconds back-ends started by someone else have to connect.
pub const ATTACH_MS: &str = "TREECAST_ATTACH_MS";
/// Path of the attach file a back-end joins through (`BackEnd::attach`).
pub const ATTACH_FILE: &str = "TREECAST_ATTACH";
