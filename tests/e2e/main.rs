//! End-to-end tests: real comm nodes and back-ends started from this build's binary,
//! on loopback, in network namespaces and under a real Slurm. One binary with a
//! module per area, so the suite links once.
//!
//! The tests of every module run as threads of one process: each test finds what it
//! started by its session id or a tag of its own in the environment of processes,
//! never by being the only one running (see `common`).

#![allow(clippy::unwrap_used)]

mod common;

mod attach;
mod cli;
mod cluster;
mod cluster_rails;
mod cluster_udp;
mod files;
mod flow_control;
mod hosts;
mod monitor;
mod networks;
mod plugins;
mod processes;
mod recovery;
mod routes;
mod run;
mod scenarios;
mod security;
mod slurm;
mod spawn;
mod startup;
mod streams;
mod striped;
