//! Requests that both the generic back-end (`treecast backend`) and the simulated
//! tree's back-ends answer, by tag: one scenario written against these runs in a
//! simulated tree and on real processes alike. Each is answered on the request's
//! stream with the request's tag, so filters reduce the answers on the way up.
//!
//! The generic back-end understands more (running commands, files, messages between
//! back-ends: `src/apps/protocol.rs`); their tags never reuse these numbers.
//!
//! Every tag treecast gives a meaning lies in one block at the top of the tag space,
//! from [`FIRST_RESERVED_TAG`] up: a tool's own tags (small numbers, MRNet's 100 and
//! up) never collide with them, and the generic back-end echoes any tag outside it.

/// The first of the tags treecast keeps for itself (the top 256 of `i32`): the
/// generic back-end's requests and file transfers. Any lower tag is the tool's.
pub const FIRST_RESERVED_TAG: i32 = 0x7fff_ff00;

/// `%d x` → `%d` (x + rank).
pub const TAG_ADD_RANK: i32 = FIRST_RESERVED_TAG + 3;
/// `%d count` → `count` packets `%d 1` back to back (reduction throughput).
pub const TAG_BURST: i32 = FIRST_RESERVED_TAG + 7;
/// `%d count %d size` → `count` packets `%s`, each a string of `size` bytes (memory
/// bounds in bytes, not only in packets).
pub const TAG_BURST_BYTES: i32 = FIRST_RESERVED_TAG + 9;
/// `%d x` → `%aud %ad`: the back-end's own rank and `x`, each alone in an array, so
/// that a concatenation says which ranks answered which request.
pub const TAG_RANK: i32 = FIRST_RESERVED_TAG + 21;
