//! Unit tests of the core: one node at a time, frames in, outputs checked.
