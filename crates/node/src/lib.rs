//! The node layer of treecast.

#![forbid(unsafe_code)]

pub mod core;
pub mod env;
