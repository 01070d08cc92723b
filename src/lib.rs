//! The apps layer of treecast: what the `treecast` command offers, usable from other
//! programs. [`apps`] has a module per subcommand (`run`, `bcast`, `demo`, `topo`,
//! `hosts`, `clock`, `monitor`, and the internal `node`, `backend` and `guard`),
//! `bench` with every benchmark under it, the flags in `cli`, and the request tags
//! the generic back-end answers in `protocol`.
//!
//! The layers below are separate crates: `treecast-wire`, `treecast-topology`,
//! `treecast-monitor`, `treecast-filters`, `treecast-proto` (the protocol core),
//! `treecast-transport`, `treecast-launch`, `treecast-driver`, `treecast-api` (what
//! tools link against), `treecast-files` (file distribution, on top of the api) and
//! `treecast-sim` (the simulated tree); `docs/architecture.md` draws them.

#![forbid(unsafe_code)]

pub mod apps;
