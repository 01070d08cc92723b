//! What the generic back-end (`treecast backend`) understands: requests by tag.
//!
//! Each request arrives on a stream and is answered on the same stream with the
//! same tag, so filters reduce the answers on the way up. The requests the simulated
//! tree's back-ends answer too (`TAG_ADD_RANK`, `TAG_RANK`, `TAG_BURST`,
//! `TAG_BURST_BYTES`) are defined once, in `treecast_wire::requests`.
//!
//! Every request's tag lies in treecast's reserved block (`FIRST_RESERVED_TAG` and
//! up), so that a tool's own tags reach the generic back-end as plain packets, which
//! it echoes, and never as a request by accident (tag 5 once made ranks exit).

pub use treecast_wire::requests::{FIRST_RESERVED_TAG, TAG_ADD_RANK, TAG_BURST, TAG_BURST_BYTES, TAG_RANK};

/// `%ud depth %ud classes` → `%as`: a synthetic call stack of `depth` frames,
/// outermost first, shared by the ranks equal modulo `classes` and branching one
/// level further down for each bit of that class (`bench prefix-tree`).
pub const TAG_STACK: i32 = FIRST_RESERVED_TAG + 22;

/// The stack [`TAG_STACK`] answers for `rank`: `main`, then frames that tell more
/// classes apart the deeper they are.
pub fn synthetic_stack(rank: u32, depth: u32, classes: u32) -> Vec<String> {
    let class = rank % classes.max(1);
    let mut frames = vec!["main".to_owned()];
    for k in 1..depth {
        let bits = k.min(31);
        frames.push(format!("f{k}_{}", class & ((1u32 << bits) - 1)));
    }
    frames
}

/// Run a command: [`RUN_REQUEST`] → [`RUN_ANSWER`].
pub const TAG_RUN: i32 = FIRST_RESERVED_TAG + 1;
/// What [`TAG_RUN`] asks: argv, time limit in ms (0 for none), bytes of each output
/// stream to send back.
pub const RUN_REQUEST: &str = "%as %uld %uld";
/// What [`TAG_RUN`] answers: the first bytes of stdout and of stderr, the exit status
/// (128 + N for a signal, as shells report it), the signal that killed the command (0
/// for none), the bytes written to stdout and to stderr in all, and the SHA-256 of all
/// of stdout then of all of stderr (64 bytes). Equal answers mean equal outputs, even
/// past the part sent.
pub const RUN_ANSWER: &str = "%b %b %d %d %uld %uld %b";
/// Answer with the values received, unchanged.
#[allow(dead_code)] // answered by the catch-all arm; named for tools and tests
pub const TAG_ECHO: i32 = FIRST_RESERVED_TAG + 2;
/// Answer `%s` naming the parent this back-end is connected to.
pub const TAG_WHERE: i32 = FIRST_RESERVED_TAG + 4;
/// `%ad ranks` → the listed ranks exit at once without answering; the others answer `%d` rank.
pub const TAG_DIE: i32 = FIRST_RESERVED_TAG + 5;
/// `%d ms` → sleep that long, then answer `%d` rank.
pub const TAG_SLEEP: i32 = FIRST_RESERVED_TAG + 6;

/// `%ad ranks %d ms` → the listed ranks stop reading packets for `ms` (their links stay
/// up), then every rank answers `%d` rank: a rank that hangs, for tests of time limits.
pub const TAG_STALL: i32 = FIRST_RESERVED_TAG + 8;

/// `%b data` of any size → `%d 1`: a message taken and acknowledged, for the route
/// benchmark (`treecast bench route`).
pub const TAG_SINK: i32 = FIRST_RESERVED_TAG + 10;

/// `%ud peer %ud bytes %ud rounds` → this rank sends `bytes` to rank `peer` as a
/// message (not on a stream) and waits for it back, `rounds` times, then answers
/// `%lf %ud`: the mean round trip in microseconds and how many echoes came back
/// identical. Between back-ends the message and its echo carry this tag and
/// [`TAG_PEER_ECHO`].
pub const TAG_PEER_PING: i32 = FIRST_RESERVED_TAG + 11;
/// A message's echo (see [`TAG_PEER_PING`]).
pub const TAG_PEER_ECHO: i32 = FIRST_RESERVED_TAG + 12;
/// `%aud ranks %ud bytes` → this rank sends one message of `bytes` to all of
/// `ranks` at once (`BackEnd::send_to_ranks`); each receiver answers on the
/// request's stream `%ud %ud`: the sender's rank and the bytes it got.
pub const TAG_PEER_CAST: i32 = FIRST_RESERVED_TAG + 13;
/// `%ud n` → this rank asks the front-end to spawn `n` generic back-ends
/// (`BackEnd::spawn`) and answers `%aud` with their ranks, or `%s` with why not.
pub const TAG_SPAWN_HELPERS: i32 = FIRST_RESERVED_TAG + 14;

/// [`COLLECTIVE_REQUEST`] → this rank enters `rounds` collective operations among
/// back-ends (`op`: 1 reduce, 2 all-reduce, 3 all-gather, 4 reduce-scatter, 5
/// barrier; `combine`: 1 sum, 2 min, 3 max, 4 average) over `members` in that order, with
/// `%ald` values `rank * 1000 + i` for i below `elements`, and answers
/// [`COLLECTIVE_ANSWER`]: the mean time of one operation in microseconds, the last
/// result (a gather's arrays one after another), the ranks a gather returned in
/// order, and how many members contributed; or `%s` with why it failed.
pub const TAG_COLLECTIVE: i32 = FIRST_RESERVED_TAG + 15;
/// `%ud stream` → the [`RUN_ANSWER`] this back-end gave (or gives, once its command
/// ends) to the [`TAG_RUN`] request of `stream`, answered on the stream this request
/// came on: `run` asks the orphans of a lost comm node again once they rejoined, since
/// what they had sent went with that node. Answers are kept until their stream
/// closes; a back-end the request never reached answers exit 127, saying so.
/// (`FIRST_RESERVED_TAG` + 16 to 19 are the file transfer's tags.)
pub const TAG_RUN_AGAIN: i32 = FIRST_RESERVED_TAG + 20;
/// What [`TAG_RUN_AGAIN`] asks: the stream of the [`TAG_RUN`] request.
pub const RUN_AGAIN_REQUEST: &str = "%ud";

/// What [`TAG_COLLECTIVE`] asks: op, combine, members, root, elements, rounds.
pub const COLLECTIVE_REQUEST: &str = "%ud %ud %aud %ud %ud %ud";
/// What [`TAG_COLLECTIVE`] answers.
pub const COLLECTIVE_ANSWER: &str = "%lf %ald %aud %ud";

/// File distribution (see `treecast_files::bcast_files`, handled by `FileReceivers`): the
/// status packet that opens a transfer, and every rank's first answer.
pub const TAG_FILE_STATUS: i32 = treecast_files::FILE_STATUS;
/// File distribution: one chunk, `%uld %b` (offset, bytes).
pub const TAG_FILE_CHUNK: i32 = treecast_files::FILE_CHUNK;
/// File distribution: the end of a transfer; also the tag of the final answer `%s %s` (outcome, detail).
pub const TAG_FILE_END: i32 = treecast_files::FILE_END;
/// File distribution: the end of the status phase (data stream and receiving ranks).
pub const TAG_FILE_OPEN: i32 = treecast_files::FILE_OPEN;

/// Exit code reported for a command stopped by the time limit (as `timeout(1)` does).
pub const EXIT_TIMED_OUT: i32 = 124;
/// Exit code reported for a command that could not be started (as shells do).
pub const EXIT_NOT_STARTED: i32 = 127;
/// Default of `treecast run --output-limit`: bytes of each output stream shown per group.
pub const DEFAULT_OUTPUT_LIMIT: u64 = 1 << 20;
/// Largest `--output-limit`: a rank's answer (both streams) must fit a frame
/// (`TREECAST_MAX_FRAME`, 64 MiB by default) with room to spare.
pub const MAX_OUTPUT_LIMIT: u64 = 16 << 20;
