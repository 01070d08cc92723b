//! The apps layer of treecast: what the `treecast` command offers, one module per
//! subcommand (`run`, `demo`, `topo`, `node`, `backend`), usable from other programs.
//!
//! The layers below are separate crates: `treecast-wire`, `treecast-topology`,
//! `treecast-monitor`, `treecast-filters`, `treecast-proto` (the protocol core),
//! `treecast-transport`, `treecast-launch`, `treecast-driver`, `treecast-api` (what
//! tools link against) and `treecast-sim`; `docs/architecture.md` draws them.

#![forbid(unsafe_code)]

pub mod apps;
