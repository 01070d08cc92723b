//! Where a frame's time goes on a link, while monitoring is on: the stamps a
//! [`crate::StreamRoute`] takes around its writes and reads, recorded into a
//! [`Recorder`] (`docs/monitoring.md`, "Where the stamps are taken").
//!
//! * **queue**: from [`crate::Route::send`] to the start of the flush that encodes
//!   the frame; the frame's header gets that start as its stamp, on the node's clock.
//! * **send**: from that start to the end of the write that carries its last byte.
//! * **net**: from the header stamp to the end of the read that completed the frame
//!   at the receiver, the peer's clock turned into the receiver's by [`PeerClock`].
//! * **deliver**: from the end of that read to the frame being handed to the node's
//!   core, which runs the filters or queues it for the tool.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use treecast_monitor::{Component, Key, Recorder, Report};
use treecast_wire::Frame;

/// How a node reads its clock, nanoseconds, at an instant: the global clock's time
/// base, so that stamps of different nodes can be compared.
pub type ClockFn = Box<dyn Fn(Instant) -> i64 + Send>;

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
    let moved = since_ns.saturating_mul(i128::from(drift_ppb)) / 1_000_000_000;
    let at = i128::from(offset_ns).saturating_add(moved);
    i64::try_from(at.clamp(i128::from(i64::MIN), i128::from(i64::MAX))).unwrap_or(0)
}

/// A link's part of the monitoring state.
#[derive(Debug, Default)]
pub(crate) struct LinkTiming {
    pub(crate) place: Option<LinkPlace>,
    pub(crate) peer_clock: PeerClock,
    /// Frames encoded and not yet fully written, in byte-stream order.
    in_flight: VecDeque<InFlight>,
}

#[derive(Debug)]
struct InFlight {
    /// Where the frame ends in the link's byte stream.
    end: u64,
    /// The start of the flush that encoded it.
    start: Instant,
    bytes: u64,
    stream: u32,
    tag: i32,
}

impl LinkTiming {
    /// Frames recorded as queued whose last byte is not written yet: their send is
    /// still to be recorded, even after recording stopped.
    pub(crate) fn has_in_flight(&self) -> bool {
        !self.in_flight.is_empty()
    }
}

/// A route's monitoring state: its clock, whether it records, and what it recorded.
pub(crate) struct Monitoring {
    pub(crate) clock: ClockFn,
    pub(crate) recording: bool,
    program: u32,
    /// Streams opened with a program tag of their own, which their frames are kept
    /// under instead of `program`.
    stream_programs: HashMap<u32, u32>,
    recorder: Recorder,
}

impl std::fmt::Debug for Monitoring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitoring")
            .field("recording", &self.recording)
            .field("cells", &self.recorder.len())
            .finish()
    }
}

impl Monitoring {
    /// Not recording yet, stamping with the wall clock until a node sets its own.
    pub(crate) fn new() -> Monitoring {
        Monitoring {
            clock: Box::new(wall_clock),
            recording: false,
            program: 0,
            stream_programs: HashMap::new(),
            recorder: Recorder::default(),
        }
    }

    pub(crate) fn start(&mut self, program: u32) {
        self.program = program;
        self.recording = true;
    }

    /// Frames of `stream` are kept under `program` from now on; `None` when the
    /// stream is gone (its frames, if any still come, fall back to the recording's tag).
    pub(crate) fn set_stream_program(&mut self, stream: u32, program: Option<u32>) {
        match program {
            Some(p) => self.stream_programs.insert(stream, p),
            None => self.stream_programs.remove(&stream),
        };
    }

    pub(crate) fn report(&mut self) -> Report {
        self.recorder.report()
    }

    pub(crate) fn clear(&mut self) {
        self.recorder.clear();
    }

    /// The header stamp of a flush that starts at `start`.
    pub(crate) fn stamp(&self, start: Instant) -> u64 {
        u64::try_from((self.clock)(start)).unwrap_or(0)
    }

    fn key(&self, t: &LinkTiming, sending: bool, stream: u32, tag: i32) -> Key {
        let place = t.place.unwrap_or(LinkPlace { lower_node: u32::MAX, to_parent: false });
        // Most trees tag no stream: no lookup then.
        let program = if self.stream_programs.is_empty() {
            self.program
        } else {
            self.stream_programs.get(&stream).copied().unwrap_or(self.program)
        };
        Key { link: place.lower_node, up: place.to_parent == sending, tag, program }
    }

    /// A frame was encoded by the flush that started at `start`, after waiting `waited`.
    pub(crate) fn queued(
        &mut self,
        t: &mut LinkTiming,
        frame: &Frame,
        waited: Duration,
        end: u64,
        start: Instant,
    ) {
        let bytes = frame.payload.len() as u64;
        let (stream, tag) = (frame.header.stream, frame.header.tag);
        self.recorder.record(self.key(t, true, stream, tag), Component::Queue, bytes, nanos(waited));
        t.in_flight.push_back(InFlight { end, start, bytes, stream, tag });
    }

    /// The link's byte stream was written up to `written` by a write that ended at `now`.
    pub(crate) fn written(&mut self, t: &mut LinkTiming, written: u64, now: Instant) {
        while let Some(f) = t.in_flight.front() {
            if f.end > written {
                break;
            }
            let key = self.key(t, true, f.stream, f.tag);
            self.recorder.record(
                key,
                Component::Send,
                f.bytes,
                nanos(now.saturating_duration_since(f.start)),
            );
            t.in_flight.pop_front();
        }
    }

    /// The clocks of a read that ended at `at`, read once for every frame it completed.
    pub(crate) fn read_clock(&self, t: &LinkTiming, at: Instant) -> ReadClock {
        let ns = (self.clock)(at);
        ReadClock { at, ns, peer_offset: t.peer_clock.at(ns) }
    }

    /// A frame completed by the read `read` is handed to the core at `handed`.
    pub(crate) fn read(&mut self, t: &LinkTiming, frame: &Frame, read: &ReadClock, handed: Instant) {
        let bytes = frame.payload.len() as u64;
        let key = self.key(t, false, frame.header.stream, frame.header.tag);
        if let Some(sent) = frame.header.stamp() {
            let sent = i64::try_from(sent).unwrap_or(i64::MAX);
            // The sender's stamp on this node's clock: its clock minus the difference.
            let net = read.ns.saturating_sub(sent).saturating_add(read.peer_offset);
            self.recorder.record(key, Component::Net, bytes, u64::try_from(net).unwrap_or(0));
        }
        self.recorder.record(
            key,
            Component::Deliver,
            bytes,
            nanos(handed.saturating_duration_since(read.at)),
        );
    }
}

/// When a read ended, on the monotonic clock and on the node's clock, and the
/// peer's clock minus the node's at that moment.
pub(crate) struct ReadClock {
    at: Instant,
    ns: i64,
    peer_offset: i64,
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The wall clock, nanoseconds since the Unix epoch.
pub(crate) fn wall_clock(_: Instant) -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_clock_moves_with_its_drift() {
        let c = PeerClock { offset_ns: 1_000, drift_ppb: 100_000, at_ns: 5_000_000_000 };
        assert_eq!(c.at(5_000_000_000), 1_000);
        // 100 ppm over 10 s is 1 ms.
        assert_eq!(c.at(15_000_000_000), 1_001_000);
        assert_eq!(c.at(0), 1_000 - 500_000);
    }
}
