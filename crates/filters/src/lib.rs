//! The filters of treecast: what every comm node and the front-end do with the
//! packets coming up a stream.
//!
//! Two steps, as in MRNet:
//!
//! 1. **Synchronization.** A [`Synchronizer`] per stream per node groups the packets
//!    arriving from the node's children into *waves* according to the stream's
//!    [`SyncMode`](treecast_wire::SyncMode) (wait-for-all, time-out, do-not-wait). It
//!    is a pure state machine: packets, child failures and the current time go in,
//!    complete waves come out; the caller arms a timer at
//!    [`Synchronizer::next_deadline`].
//! 2. **Transformation.** Each wave goes to the stream's [`Transform`], a boxed
//!    state machine per stream per node made by [`builtin`] for the built-in
//!    [`TransformKind`]s (null, sum, min, max, avg, concat, eqclass). It returns the
//!    frames to send on up (usually one), or a [`FilterError`] naming the rank of the
//!    offending packet; [`apply_dropping_bad`] drops such packets and reduces the rest.
//!
//! The wire names filters by name, version and parameters; a [`FilterRegistry`]
//! (built-ins by [`TransformKind`] name, plug-ins later) turns those names into
//! instances when a stream is created, and refuses unknown names and bad parameters
//! with a [`RegistryError`].
//!
//! A [`FilterContext`] tells the transform which stream it serves and whether the node
//! is the root (the front-end), where the average is finished. Back-ends call
//! [`check_format`] before sending, so a bad format fails at the source.
//! [`decode_eq_classes`] reads the equivalence-class tables the eqclass filter emits.
//!
//! Wire layouts of the filter-specific payloads (partial averages, class tables) are
//! documented in the [`avg`] and [`eqclass`] modules.

mod arith;
pub mod avg;
mod concat;
pub mod eqclass;
mod error;
mod kind;
mod registry;
mod spec;
mod sync;

use treecast_wire::{Format, Frame};

pub use eqclass::{decode_eq_classes, eq_classes_frame};
pub use error::{FilterError, RegistryError};
pub use kind::{TransformKind, BUILTIN_VERSION};
pub use registry::{FilterFactory, FilterRegistry, FormatCheck, PlacedFactory};
pub use sync::{Synchronizer, Wave};

/// Where a filter instance runs, as its factory is told when a stream is made
/// (what MRNet calls a filter's local topology information).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FilterPlace {
    /// The stream the instance serves.
    pub stream: u32,
    /// The node's id in the tree (pre-order; 0 is the front-end).
    pub rank: u32,
    /// What the node is.
    pub role: PlaceRole,
    /// Children of the node that are members of the stream.
    pub children: u32,
    /// The node's depth in the tree (0 at the front-end).
    pub depth: u32,
    /// Back-end ranks of the stream below the node.
    pub leaves: u32,
}

/// The role of the node a filter instance runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PlaceRole {
    /// The root, in the tool's process.
    #[default]
    FrontEnd,
    /// An interior node.
    CommNode,
    /// A leaf.
    BackEnd,
}

/// What a transformation filter knows about where it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FilterContext {
    /// The stream whose wave is reduced.
    pub stream: u32,
    /// True at the front-end (the root of the tree), where the average is finished.
    pub is_root: bool,
}

/// A filter instance that can move between threads with its node.
pub type BoxedTransform = Box<dyn Transform>;

/// A transformation filter: a wave of packets in, the packets to send on up out.
///
/// One instance exists per stream per node and keeps whatever state it needs across
/// waves.
pub trait Transform: Send {
    /// Reduces one wave (its packets in child order).
    ///
    /// The wave is consumed; clone it first (cheap: payloads are shared) to retry
    /// without a bad packet, or use [`apply_dropping_bad`].
    ///
    /// # Errors
    /// A [`FilterError`] naming the source rank of the first offending packet.
    fn apply(&mut self, wave: Vec<Frame>, ctx: &FilterContext) -> Result<Vec<Frame>, FilterError>;

    /// [`Transform::apply`] of a wave the caller keeps, for a retry without a bad
    /// packet. The default copies the wave; a filter that only reads its packets
    /// implements it to save the copy (a copy of each packet that its read left
    /// unshared makes it shared: an allocation and atomic counts per packet).
    ///
    /// # Errors
    /// As [`Transform::apply`].
    fn apply_borrowed(&mut self, wave: &[Frame], ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        self.apply(wave.to_vec(), ctx)
    }

    /// The instance's state as bytes, for a new instance to take over after a
    /// recovery; `None` (the default) for filters that keep none.
    ///
    /// # Errors
    /// The filter's own failure, as a [`FilterError`].
    fn state(&mut self) -> Result<Option<Vec<u8>>, FilterError> {
        Ok(None)
    }

    /// Takes new parameters (typed values, as at creation) while the stream runs.
    ///
    /// # Errors
    /// The filter's refusal, in its words; by default every filter refuses.
    fn set_params(&mut self, params: &[u8]) -> Result<(), String> {
        Err(format!("takes no parameters while the stream runs ({} bytes given)", params.len()))
    }

    /// Takes over `state`, what [`Transform::state`] of a lost instance of the same
    /// filter reported, when the lost node's children rejoin this node.
    ///
    /// # Errors
    /// The filter's refusal, in its words; by default every filter refuses.
    fn adopt_state(&mut self, state: &[u8]) -> Result<(), String> {
        Err(format!("cannot take over a lost instance's state ({} bytes)", state.len()))
    }

    /// Packets the last [`Transform::apply`] sends back down the stream to this
    /// node's children (MRNet's `packets_out_reverse`); none by default.
    fn take_down(&mut self) -> Vec<Frame> {
        Vec::new()
    }
}

/// The null filter: every packet passes unchanged (zero copy).
#[derive(Debug, Default)]
struct Null;

impl Transform for Null {
    fn apply(&mut self, wave: Vec<Frame>, _ctx: &FilterContext) -> Result<Vec<Frame>, FilterError> {
        Ok(wave)
    }
}

/// A fresh instance of a built-in transformation filter, for one stream on one node.
///
/// Output frames (except null's) are data frames with the stream and tag of the
/// wave's first packet, the lowest source rank of the wave and no timestamp. See
/// [`TransformKind`] for what each filter computes, and the module docs of [`avg`]
/// and [`eqclass`] for their layouts. Integer sums wrap around.
pub fn builtin(kind: TransformKind) -> Box<dyn Transform> {
    match kind {
        TransformKind::Null => Box::new(Null),
        TransformKind::Sum => Box::new(arith::Arith::new(arith::Op::Sum)),
        TransformKind::Min => Box::new(arith::Arith::new(arith::Op::Min)),
        TransformKind::Max => Box::new(arith::Arith::new(arith::Op::Max)),
        TransformKind::Avg => Box::new(avg::Avg),
        TransformKind::Concat => Box::new(concat::Concat),
        TransformKind::EqClass => Box::new(eqclass::EqClass),
    }
}

/// Checks that packets of `format` can go through the filter `kind`: what a back-end
/// checks before it sends. Sum, min, max and avg need numeric scalars or numeric
/// arrays only (no `%s`, `%as` or `%b`); the other filters take any format.
///
/// # Errors
/// [`FilterError::UnsupportedFormat`] naming the first value the filter cannot handle.
pub fn check_format(kind: TransformKind, format: &Format) -> Result<(), FilterError> {
    let action = match kind {
        TransformKind::Sum => "add",
        TransformKind::Min | TransformKind::Max => "compare",
        TransformKind::Avg => "average",
        TransformKind::Null | TransformKind::Concat | TransformKind::EqClass => return Ok(()),
    };
    match format.types.iter().position(|t| !spec::is_numeric_type(*t)) {
        None => Ok(()),
        Some(index) => Err(FilterError::UnsupportedFormat {
            filter: kind.name(),
            action,
            format: spec::format_string(format),
            index,
            found: spec::type_spec(format.types[index]),
        }),
    }
}

/// Applies `transform` to `wave`; when it fails on a packet, drops the packets of that
/// source rank and reduces the rest again, until it succeeds or no packet is left.
///
/// Returns the output frames and the error of every dropped packet, in the order
/// they occurred. If an error names no rank, or a rank not in the wave, the whole
/// remaining wave is dropped with that error (the output is empty).
pub fn apply_dropping_bad(
    transform: &mut dyn Transform,
    mut wave: Vec<Frame>,
    ctx: &FilterContext,
) -> (Vec<Frame>, Vec<FilterError>) {
    let mut errors = Vec::new();
    while !wave.is_empty() {
        match transform.apply_borrowed(&wave, ctx) {
            Ok(out) => return (out, errors),
            Err(e) => {
                let before = wave.len();
                if let Some(rank) = e.rank() {
                    wave.retain(|f| f.header.rank != rank);
                }
                let progressed = wave.len() < before;
                errors.push(e);
                if !progressed {
                    break;
                }
            }
        }
    }
    (Vec::new(), errors)
}
