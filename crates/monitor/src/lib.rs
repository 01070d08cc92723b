//! The monitor layer: where a frame's time goes on each link, kept as histograms.
//!
//! A frame's path over one link is cut into four [`Component`]s (queue, send, net,
//! deliver; `docs/monitoring.md` says where each stamp is taken). Every sample is
//! binned by the frame's size class and kept under a [`Key`]: the link and the
//! direction, the frame's tag and the program tag. A [`Recorder`] holds the
//! histograms of one node within a stated memory bound; its [`Report`] travels up
//! the tree, where reports merge without losing anything a flat merge would keep.
//! A [`Signature`] sums a report into mean latency per component and size, compares
//! it with a baseline and draws it as SVG.
//!
//! Pure data: no I/O, no clock. The drivers take the stamps and call
//! [`Recorder::record`].

pub mod clock;
mod collection;
mod oneway;
mod plot;
mod recorder;
mod report;
mod signature;

pub use collection::Collection;
pub use oneway::{one_way, OneWay};
pub use plot::{signature_svg, BASELINE_COLOR, RUN_COLOR};
pub use recorder::{Recorder, Slot, CELL_BYTES, DEFAULT_MAX_CELLS, HIGHEST_NS, SIGNIFICANT_DIGITS};
pub use report::{CellReport, MonitorError, Report, RouteReport, MERGE_MAX_CELLS};
pub use signature::{compare, size_class_label, Deviation, Point, Series, Signature};

use serde::{Deserialize, Serialize};

/// One part of a frame's path over a link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Component {
    /// From the node handing the frame to the link to the start of the flush that
    /// encodes it for writing.
    Queue,
    /// From that start to the end of the write that carries the frame's last byte.
    Send,
    /// From that same start at the sender to the end of the read at the receiver,
    /// corrected by the global clock.
    Net,
    /// From the read to the frame being handed to the filter or the tool.
    Deliver,
}

impl Component {
    /// Every component, in path order.
    pub const ALL: [Component; 4] = [Component::Queue, Component::Send, Component::Net, Component::Deliver];

    /// Its name in reports and plots.
    pub fn name(self) -> &'static str {
        match self {
            Component::Queue => "queue",
            Component::Send => "send",
            Component::Net => "net",
            Component::Deliver => "deliver",
        }
    }
}

/// What a sample is kept under, besides its component and size class.
///
/// A link of the tree is named by the node id of its lower end (the child), so the
/// same link has the same name in the reports of both its ends, and cells of the
/// whole tree merge without clashing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Key {
    /// Node id of the link's lower end.
    pub link: u32,
    /// True for frames going up the link (child to parent).
    pub up: bool,
    /// The frame's tag (the tool's stream tag; control frames carry their own).
    pub tag: i32,
    /// The program tag the frame was recorded under (0: none).
    pub program: u32,
}

impl Key {
    /// Where samples go once a recorder holds as many histograms as it may: kept,
    /// but no longer told apart by link, direction, tag or program.
    pub const OTHER: Key = Key { link: u32::MAX, up: false, tag: i32::MIN, program: u32::MAX };
}

/// Number of size classes: class 0 holds empty frames, class `k` (1 to 33) holds
/// sizes from 2^(k-1) to 2^k − 1 bytes; the last also holds everything larger.
pub const SIZE_CLASSES: u8 = 34;

/// The size class of a frame of `bytes` bytes.
pub fn size_class(bytes: u64) -> u8 {
    let class = 64 - bytes.leading_zeros() as u8;
    class.min(SIZE_CLASSES - 1)
}

/// The smallest and largest size (bytes) of a size class.
pub fn size_class_bounds(class: u8) -> (u64, u64) {
    match class {
        0 => (0, 0),
        c if c >= SIZE_CLASSES - 1 => (1 << (SIZE_CLASSES - 2), u64::MAX),
        c => (1 << (c - 1), (1 << c) - 1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_are_powers_of_two_and_cover_every_size() {
        assert_eq!(size_class(0), 0);
        assert_eq!(size_class(1), 1);
        assert_eq!(size_class(2), 2);
        assert_eq!(size_class(3), 2);
        assert_eq!(size_class(1024), 11);
        assert_eq!(size_class(u64::MAX), SIZE_CLASSES - 1);
        for bytes in [0u64, 1, 2, 3, 4, 1000, 1 << 20, (1 << 32) - 1, 1 << 32, 1 << 40] {
            let (lo, hi) = size_class_bounds(size_class(bytes));
            assert!(lo <= bytes && bytes <= hi, "{bytes} outside {lo}..={hi}");
        }
    }
}
