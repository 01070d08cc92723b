//! The global clock's values: a node's clock ([`NodeClock`]) read from the
//! monotonic clock ([`Mono`]), a peer's clock against this one ([`PeerClock`]),
//! how an offset moves with drift ([`drifted`]) and where a link sits in the tree
//! ([`LinkPlace`]). Plain numbers with no clock of their own: the protocol core
//! computes them and a route's recording stamps frames with them; the monotonic
//! clock itself is read by whoever owns the I/O.

/// How a node reads its clock from the monotonic clock: the global clock's time
/// base, so that stamps of different nodes can be compared. The node's clock read
/// `base_ns` at monotonic reading `base`; a distortion (the clock's test knob) adds
/// `offset_ns` at clock reading `epoch_ns`, moving by `drift_ppb`. Plain numbers, so
/// that the route reads it inline on every flush and read while recording.
// In this order (`repr(C)`): the first four, which every stamp reads, share one
// cache line with the hot head of [`Monitoring`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(C)]
pub struct NodeClock {
    /// A monotonic reading.
    pub base: Mono,
    /// The node's clock at `base`, nanoseconds.
    pub base_ns: i64,
    /// The distortion's offset at `epoch_ns`, nanoseconds (0: none).
    pub offset_ns: i64,
    /// How fast the distortion grows, parts per billion.
    pub drift_ppb: i64,
    /// The clock reading (nanoseconds) from which the distortion grows.
    pub epoch_ns: i64,
}

impl NodeClock {
    /// The node's clock at monotonic reading `now`, nanoseconds; saturates rather
    /// than wrapping.
    #[inline]
    pub fn at(&self, now: Mono) -> i64 {
        // Monotonic readings stay below 2^63 ns (292 years of uptime): the
        // difference fits an i64, and no wider arithmetic is needed on every stamp.
        let (now, base) = (clamped(now.nanos()), clamped(self.base.nanos()));
        let true_ns = self.base_ns.saturating_add(now - base);
        let added = match self.drift_ppb {
            0 => self.offset_ns,
            _ => drifted(self.offset_ns, self.drift_ppb, i128::from(true_ns) - i128::from(self.epoch_ns)),
        };
        true_ns.saturating_add(added)
    }
}

/// `n` as an i64, at most `i64::MAX`.
#[inline]
fn clamped(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// A reading of the monotonic clock (`CLOCK_MONOTONIC`, the clock `Instant` reads
/// on Linux), in nanoseconds. Recording takes five per hop and subtracts them:
/// read and subtracted as plain integers, they cost a fraction of what `Instant`'s
/// checked conversions do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Mono(u64);

impl Mono {
    /// A reading `nanos` nanoseconds into the clock (for tests and simulations).
    pub fn from_nanos(nanos: u64) -> Mono {
        Mono(nanos)
    }

    /// Nanoseconds since the clock's origin.
    pub fn nanos(self) -> u64 {
        self.0
    }

    /// Nanoseconds from `earlier` to this reading; 0 if `earlier` is later.
    pub fn since(self, earlier: Mono) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

/// Where a link sits in the tree, which names its samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkPlace {
    /// Node id of the link's lower end (the child).
    pub lower_node: u32,
    /// True at the child's end: frames sent on the link go up.
    pub to_parent: bool,
}

/// The peer's clock minus this node's, as the global clock measured it: `offset_ns`
/// when this node's clock read `at_ns`, moving by `drift_ppb`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeerClock {
    /// Peer's clock minus this node's, nanoseconds, at `at_ns`.
    pub offset_ns: i64,
    /// How fast the difference moves, parts per billion.
    pub drift_ppb: i64,
    /// This node's clock when the offset was measured, nanoseconds.
    pub at_ns: i64,
}

impl PeerClock {
    /// The peer's clock minus this node's when this node's clock reads `own_ns`.
    pub fn at(&self, own_ns: i64) -> i64 {
        drifted(self.offset_ns, self.drift_ppb, i128::from(own_ns) - i128::from(self.at_ns))
    }
}

/// A clock offset `since_ns` after it was `offset_ns`, moving by `drift_ppb`: how
/// every offset of the global clock is carried forward. Saturates instead of
/// wrapping, as offsets may come from the network.
pub fn drifted(offset_ns: i64, drift_ppb: i64, since_ns: i128) -> i64 {
    // Read for every stamp: the common cases skip the slow 128-bit division.
    if drift_ppb == 0 {
        return offset_ns;
    }
    if let Some(moved) = i64::try_from(since_ns).ok().and_then(|s| s.checked_mul(drift_ppb)) {
        return offset_ns.saturating_add(moved / 1_000_000_000);
    }
    let moved = since_ns.saturating_mul(i128::from(drift_ppb)) / 1_000_000_000;
    let at = i128::from(offset_ns).saturating_add(moved);
    i64::try_from(at.clamp(i128::from(i64::MIN), i128::from(i64::MAX))).unwrap_or(0)
}
