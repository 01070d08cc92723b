//! The apps layer of treecast: what the `treecast` command offers, one module per
//! subcommand (`run`, `demo`, `topo`, `node`, `backend`), usable from other programs.
//!
//! The layers below are separate crates: `treecast-wire`, `treecast-topology`,
//! `treecast-transport`, `treecast-filters`, `treecast-launch`, `treecast-node`
//! and `treecast-api` (what tools link against).

#![forbid(unsafe_code)]

pub mod apps;
