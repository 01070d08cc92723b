//! The one error type of this crate.

use thiserror::Error;

/// Why a transformation filter could not reduce a wave, or why a format is not
/// accepted by a filter.
///
/// Every variant raised while reducing a wave names the source rank of the
/// offending packet (the `rank` field of its header, see [`FilterError::rank`]),
/// so the caller can drop that packet and reduce the rest of the wave again
/// (see [`crate::apply_dropping_bad`]).
#[derive(Error, Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum FilterError {
    /// A packet's format differs from the format of the wave (the first packet's).
    #[error(
        "stream {stream}: {filter} filter: the packet from rank {rank} has format \"{found}\" \
         but the wave's format is \"{expected}\""
    )]
    FormatMismatch {
        /// The filter's name, e.g. `sum`.
        filter: &'static str,
        /// The stream of the wave.
        stream: u32,
        /// Source rank of the mismatching packet.
        rank: u32,
        /// The wave's format string (the first packet's).
        expected: String,
        /// The mismatching packet's format string.
        found: String,
    },
    /// A packet holds a value of a type the filter cannot handle.
    #[error(
        "stream {stream}: {filter} cannot {action} {found} (value {index}) in the packet from rank {rank}"
    )]
    UnsupportedType {
        /// The filter's name.
        filter: &'static str,
        /// What the filter does with values, e.g. `add`.
        action: &'static str,
        /// The stream of the wave.
        stream: u32,
        /// Source rank of the packet.
        rank: u32,
        /// 0-based position of the value in the payload.
        index: usize,
        /// The value's specifier, e.g. `%s`.
        found: String,
    },
    /// A format names a value type the filter cannot handle (raised by
    /// [`crate::check_format`], before any packet exists; it has no rank).
    #[error("{filter} cannot {action} {found} (value {index}) in format \"{format}\"")]
    UnsupportedFormat {
        /// The filter's name.
        filter: &'static str,
        /// What the filter does with values, e.g. `add`.
        action: &'static str,
        /// The whole format string.
        format: String,
        /// 0-based position of the offending specifier.
        index: usize,
        /// The offending specifier, e.g. `%s`.
        found: String,
    },
    /// Two arrays combined element-wise have different lengths.
    #[error(
        "stream {stream}: {filter} filter: value {index} is an array of {expected} elements from rank \
         {expected_rank} but of {found} elements from rank {rank}"
    )]
    LengthMismatch {
        /// The filter's name.
        filter: &'static str,
        /// The stream of the wave.
        stream: u32,
        /// Source rank of the packet whose array differs.
        rank: u32,
        /// Source rank of the wave's first packet, whose length is the reference.
        expected_rank: u32,
        /// 0-based position of the array in the payload.
        index: usize,
        /// Length of the reference array.
        expected: usize,
        /// Length of the differing array.
        found: usize,
    },
    /// A payload does not decode as typed values.
    #[error("stream {stream}: {filter} filter: cannot decode the packet from rank {rank}: {detail}")]
    Decode {
        /// The filter's name.
        filter: &'static str,
        /// The stream of the wave.
        stream: u32,
        /// Source rank of the packet.
        rank: u32,
        /// The decoder's error text.
        detail: String,
    },
    /// A payload decodes but does not have the layout its flags promise (a partial
    /// average or an equivalence-class table).
    #[error("stream {stream}: {filter} filter: malformed packet from rank {rank}: {detail}")]
    Malformed {
        /// The filter's name.
        filter: &'static str,
        /// The stream of the wave.
        stream: u32,
        /// Source rank of the packet.
        rank: u32,
        /// What is wrong with the layout.
        detail: String,
    },
    /// A plug-in filter returned an error (or, for one written with
    /// `treecast-filter`, panicked and caught it).
    #[error("stream {stream}: plug-in filter {filter:?} failed{}: {message} (code {code})", on_rank(*.rank))]
    Plugin {
        /// The filter's name.
        filter: String,
        /// The stream of the wave.
        stream: u32,
        /// Source rank of the packet at fault, when the filter named one.
        rank: Option<u32>,
        /// The filter's error code (docs/filter-abi.md).
        code: i32,
        /// The filter's message.
        message: String,
    },
}

fn on_rank(rank: Option<u32>) -> String {
    rank.map(|r| format!(" on the packet from rank {r}")).unwrap_or_default()
}

impl FilterError {
    /// The source rank of the packet that caused the error, if a packet did.
    ///
    /// `None` for [`FilterError::UnsupportedFormat`], which is about a format, not a
    /// packet, and for a [`FilterError::Plugin`] failure that names no packet.
    pub fn rank(&self) -> Option<u32> {
        match self {
            FilterError::FormatMismatch { rank, .. }
            | FilterError::UnsupportedType { rank, .. }
            | FilterError::LengthMismatch { rank, .. }
            | FilterError::Decode { rank, .. }
            | FilterError::Malformed { rank, .. } => Some(*rank),
            FilterError::Plugin { rank, .. } => *rank,
            FilterError::UnsupportedFormat { .. } => None,
        }
    }
}

/// Why a stream's filter could not be made on a node: what refuses a stream at creation.
#[derive(Error, Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RegistryError {
    /// No filter of this name is registered on the node.
    #[error(
        "unknown filter {name:?}: this node has {known}; load the plug-in on every node or pick one of these"
    )]
    Unknown {
        /// The name asked for.
        name: String,
        /// The names the node has, comma-separated.
        known: String,
    },
    /// The filter exists but not in the version the stream asks for.
    #[error("filter {name:?} version {found} is not available (this node has versions {low} to {high}); run the same version on every node")]
    Version {
        /// The filter.
        name: String,
        /// The version asked for.
        found: u16,
        /// Oldest version available.
        low: u16,
        /// Newest version available.
        high: u16,
    },
    /// The filter refused the stream's parameters.
    #[error("filter {name:?} refused its parameters: {detail}")]
    Params {
        /// The filter.
        name: String,
        /// Why, in the filter's words.
        detail: String,
    },
    /// The filter cannot take packets of the given format.
    #[error(transparent)]
    Format(FilterError),
}
