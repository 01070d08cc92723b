//! Where a frame's time goes on a link, while monitoring is on: the stamps a
//! [`crate::StreamRoute`] takes around its writes and reads, recorded into a
//! [`Recorder`] (`docs/monitoring.md`, "Where the stamps are taken").
//!
//! * **queue**: from [`crate::Route::send`] to the start of the flush that encodes
//!   the frame; the frame's header gets that start as its stamp, on the node's clock.
//! * **send**: from that start to the end of the write that carries its last byte.
//! * **net**: from the header stamp to the end of the read that completed the frame
//!   at the receiver, the peer's clock turned into the receiver's by [`PeerClock`].
//! * **deliver**: from the end of that read to the frames it completed being handed
//!   to the node's core, which runs the filters or queues them for the tool.
//!
//! Each is read once per batch, not per frame: frames queued in one pass of the
//! node's loop share their queue start, frames written by one write their send,
//! frames read by one read their net end and their deliver. Equal samples are then
//! counted by the recorder, not added one by one.
//!
//! The stamps are read where the frames are; the samples are counted at the end of
//! a pass of the node's loop, once what it sends is written, by batches (`Deferred`).

use std::collections::{HashMap, VecDeque};
use std::time::{SystemTime, UNIX_EPOCH};

pub use treecast_monitor::clock::{drifted, LinkPlace, Mono, NodeClock, PeerClock};
use treecast_monitor::{size_class, Component, Key, Recorder, Report, Slot};
use treecast_wire::{Frame, FLAG_STAMPED};

use crate::{LinkId, LinkMap};

/// The monotonic clock now (`CLOCK_MONOTONIC`, the clock `Instant` reads on Linux).
pub fn mono_now() -> Mono {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime writes one timespec at the pointer it is given, which
    // points to a live local; CLOCK_MONOTONIC exists on every Linux.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    if rc != 0 {
        return Mono::from_nanos(0);
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    Mono::from_nanos(secs.saturating_mul(1_000_000_000).saturating_add(nanos))
}

/// The wall clock (nanoseconds since the Unix epoch) as read now, carried forward
/// by the monotonic clock.
pub fn wall_clock() -> NodeClock {
    let base = mono_now();
    let base_ns = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
    NodeClock { base, base_ns, offset_ns: 0, drift_ppb: 0, epoch_ns: 0 }
}

/// Readings of the monotonic clock for recording, from the CPU's time-stamp counter
/// where that is safe to use: one instruction (about 10 ns here) where
/// `clock_gettime` takes about 20, and recording takes five per hop.
///
/// The counter is turned into nanoseconds against an anchor (a `clock_gettime`
/// reading with the counter read close on both sides of it), taken again once the
/// last is [`ANCHOR_SPAN_NS`] old, at a rate measured from the first anchor: the
/// longer the recording, the more exact the rate. Each new anchor checks what the
/// last one predicted: a counter that ran on while the clock stood still (a
/// suspend) or a clock slewed hard makes the prediction miss, and the rate is
/// measured anew. Until the first anchor is [`CALIBRATION_NS`] old, and wherever
/// the counter is not invariant or the kernel does not keep time with it, every
/// reading is a `clock_gettime`. Readings never go back.
// In this order (`repr(C)`): what every reading uses fills the first 48 bytes,
// which in [`Monitoring`] share one cache line with the end of its clock.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Ticker {
    /// The counter can be used: x86-64, invariant, and the kernel's clocksource.
    tsc: bool,
    /// The latest anchor: (counter, clock).
    anchor: (u64, Mono),
    /// Nanoseconds per tick, fixed point (32 fractional bits); 0 until calibrated.
    rate: u64,
    /// Ticks after the latest anchor within which a reading is derived from it.
    span: u64,
    /// The last reading given: none later is earlier.
    last: Mono,
    /// The first anchor of the rate's measurement: (counter, clock).
    first: Option<(u64, Mono)>,
}

/// The age at which an anchor is replaced: the rate's error grows with the
/// distance from the anchor, about 1 ns per millisecond after the first 10 ms.
pub(crate) const ANCHOR_SPAN_NS: u64 = 1_000_000;
/// How long the first anchor must be old before the rate is trusted.
pub(crate) const CALIBRATION_NS: u64 = 10_000_000;
/// An anchor whose two counter readings lie further apart than this (the thread
/// was preempted or interrupted between them) is read again, and never calibrates.
const TIGHT_ANCHOR_TICKS: u64 = 4_000;
/// How far an anchor may miss what the last one predicted before the rate is
/// measured anew: 2 µs, or 0.1 % of the time since the last anchor.
const MISS_NS: u64 = 2_000;

/// One anchor reading: the counter before, the clock, the counter after.
type AnchorRead<'a> = &'a mut dyn FnMut() -> (u64, Mono, u64);

impl Ticker {
    pub(crate) fn new() -> Ticker {
        Ticker {
            tsc: tsc_usable(),
            first: None,
            anchor: (0, Mono::from_nanos(0)),
            rate: 0,
            span: 0,
            last: Mono::from_nanos(0),
        }
    }

    /// The monotonic clock now, within a few nanoseconds.
    #[inline]
    pub(crate) fn now(&mut self) -> Mono {
        if !self.tsc {
            return mono_now();
        }
        let counter = read_tsc();
        let ticks = counter.wrapping_sub(self.anchor.0);
        if ticks < self.span {
            return self.derived(ticks);
        }
        self.at(counter, &mut || (read_tsc(), mono_now(), read_tsc()))
    }

    /// The reading for counter value `counter`, anchored again with `read` if the
    /// anchor is too old (what [`Ticker::now`] does, with readings given).
    fn at(&mut self, counter: u64, read: AnchorRead<'_>) -> Mono {
        let ticks = counter.wrapping_sub(self.anchor.0);
        if ticks < self.span {
            return self.derived(ticks);
        }
        let reading = self.anchor_again(read);
        self.last = self.last.max(reading);
        self.last
    }

    /// The reading `ticks` after the anchor, at the rate: `ticks` is under the span,
    /// so `ticks × rate` is under [`ANCHOR_SPAN_NS`] × 2³² and fits in 64 bits (no
    /// 128-bit product here: this runs five times per hop while recording).
    #[inline]
    fn derived(&mut self, ticks: u64) -> Mono {
        debug_assert!(ticks < self.span);
        let reading = Mono::from_nanos(self.anchor.1.nanos() + (ticks.wrapping_mul(self.rate) >> 32));
        self.last = self.last.max(reading);
        self.last
    }

    /// Takes a new anchor and measures the rate again from the first.
    #[inline(never)]
    fn anchor_again(&mut self, read: AnchorRead<'_>) -> Mono {
        let (mut tight, mut best) = (false, (0, Mono::from_nanos(0)));
        let mut best_gap = u64::MAX;
        for _ in 0..3 {
            let (before, clock, after) = read();
            let gap = after.wrapping_sub(before);
            if gap < best_gap {
                best_gap = gap;
                best = (before / 2 + after / 2 + (before % 2 + after % 2) / 2, clock);
            }
            if gap <= TIGHT_ANCHOR_TICKS {
                tight = true;
                break;
            }
        }
        let (ticks, clock) = best;
        if !tight {
            // Good enough to derive from for a millisecond, not to measure with.
            self.anchor = (ticks, clock);
            return clock;
        }
        if self.rate > 0 && self.missed(ticks, clock) {
            (self.first, self.rate, self.span) = (None, 0, 0);
        }
        self.anchor = (ticks, clock);
        let (first_ticks, first_clock) = *self.first.get_or_insert((ticks, clock));
        let (elapsed, counted) = (clock.since(first_clock), ticks.wrapping_sub(first_ticks));
        if elapsed >= CALIBRATION_NS && counted > 0 && counted < u64::MAX / 2 {
            self.rate = u64::try_from((u128::from(elapsed) << 32) / u128::from(counted)).unwrap_or(0);
            self.span = match self.rate {
                0 => 0,
                rate => u64::try_from((u128::from(ANCHOR_SPAN_NS) << 32) / u128::from(rate)).unwrap_or(0),
            };
        }
        clock
    }

    /// Nanoseconds that `ticks` counter ticks make at the rate (saturating).
    #[inline]
    fn ns_of(&self, ticks: u64) -> u64 {
        u64::try_from((u128::from(ticks) * u128::from(self.rate)) >> 32).unwrap_or(u64::MAX)
    }

    /// The last anchor, carried forward at the rate to counter value `ticks`, misses
    /// `clock` by more than [`MISS_NS`] or 0.1 % of the time between them.
    fn missed(&self, ticks: u64, clock: Mono) -> bool {
        let counted = ticks.wrapping_sub(self.anchor.0);
        if counted >= u64::MAX / 2 {
            return true;
        }
        let predicted = self.anchor.1.nanos().saturating_add(self.ns_of(counted));
        let elapsed = clock.since(self.anchor.1);
        predicted.abs_diff(clock.nanos()) > MISS_NS.max(elapsed / 1_000)
    }
}

/// The time-stamp counter.
#[cfg(target_arch = "x86_64")]
fn read_tsc() -> u64 {
    // SAFETY: RDTSC reads a register and touches no memory; x86-64 always has it.
    #[allow(unsafe_code)]
    unsafe {
        core::arch::x86_64::_rdtsc()
    }
}

#[cfg(not(target_arch = "x86_64"))]
fn read_tsc() -> u64 {
    0
}

/// The counter ticks at a constant rate through sleep states (CPUID's invariant
/// TSC) and the kernel keeps time with it, so it agrees across CPUs.
#[cfg(target_arch = "x86_64")]
fn tsc_usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(tsc_checked)
}

#[cfg(target_arch = "x86_64")]
fn tsc_checked() -> bool {
    let invariant = core::arch::x86_64::__cpuid(0x8000_0000).eax >= 0x8000_0007
        && core::arch::x86_64::__cpuid(0x8000_0007).edx & (1 << 8) != 0;
    let source = std::fs::read_to_string("/sys/devices/system/clocksource/clocksource0/current_clocksource");
    invariant && source.is_ok_and(|s| s.trim() == "tsc")
}

#[cfg(not(target_arch = "x86_64"))]
fn tsc_usable() -> bool {
    false
}

/// A link's part of the monitoring state.
#[derive(Debug, Default)]
pub(crate) struct LinkTiming {
    place: Option<LinkPlace>,
    pub(crate) peer_clock: PeerClock,
    /// Runs of frames a write cut short or a stop stamped, in byte-stream order,
    /// until the write that carried their last byte is counted (runs a write
    /// carried whole never come here).
    in_flight: InFlightList,
    /// The cells of the frames last sent ([`Component::Queue`], [`Component::Send`])
    /// and last received ([`Component::Net`], [`Component::Deliver`]).
    sent: Option<LinkCells>,
    received: Option<LinkCells>,
}

/// The cells a link's frames of one stream, tag and size class go to, one way,
/// found under the [`Monitoring`] epoch they were found in.
#[derive(Debug, Clone, Copy)]
struct LinkCells {
    epoch: u64,
    stream: u32,
    tag: i32,
    size_class: u8,
    /// Each component's cell, found when the first sample of it came: a link whose
    /// frames come unstamped never opens a net cell.
    slots: [Option<Slot>; 2],
}

impl LinkCells {
    /// True when these are the cells of frames like `frames` of size class
    /// `size_class`, found under `epoch`.
    fn hold(&self, epoch: u64, frames: &Frames, size_class: u8) -> bool {
        (self.epoch, self.stream, self.tag, self.size_class) == (epoch, frames.stream, frames.tag, size_class)
    }
}

/// Frames one after another in a link's byte stream that make the same samples
/// (same stream, tag and size, queued together): counted, not listed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct FrameRun {
    /// Where the last one ends in the link's byte stream (kept rather than where the
    /// first ends: a write that takes them all needs no division).
    pub(crate) last_end: u64,
    /// Bytes each one takes in the byte stream.
    pub(crate) wire_len: u64,
    pub(crate) count: u64,
    /// Payload bytes of each.
    pub(crate) bytes: u64,
    pub(crate) stream: u32,
    pub(crate) tag: i32,
}

impl FrameRun {
    /// One frame of `wire_len` bytes that ends at `end` in the byte stream.
    pub(crate) fn one(frame: &Frame, wire_len: u64, end: u64) -> FrameRun {
        let (stream, tag) = (frame.header.stream, frame.header.tag);
        FrameRun { last_end: end, wire_len, count: 1, bytes: frame.payload.len() as u64, stream, tag }
    }

    /// Where the first one ends.
    fn first_end(&self) -> u64 {
        self.last_end - (self.count - 1) * self.wire_len
    }

    /// Takes `next` in if it comes right after these frames and is like them.
    pub(crate) fn absorb(&mut self, next: &FrameRun) -> bool {
        let like = (next.wire_len, next.bytes, next.stream, next.tag)
            == (self.wire_len, self.bytes, self.stream, self.tag);
        if like && next.first_end() == self.last_end + self.wire_len {
            self.count += next.count;
            self.last_end = next.last_end;
            return true;
        }
        false
    }
}

/// Frames encoded by the flush that started at `start`, not yet fully written,
/// after waiting `waited_ns` in the queue: both components are counted when the
/// write that ends them is.
#[derive(Debug)]
struct InFlight {
    run: FrameRun,
    start: Mono,
    waited_ns: u64,
}

/// Runs in flight, oldest first: the first kept inline, since a link seldom holds
/// more than one (no heap line to fetch), the rest behind it.
#[derive(Debug, Default)]
struct InFlightList {
    first: Option<InFlight>,
    rest: VecDeque<InFlight>,
}

impl InFlightList {
    fn front_mut(&mut self) -> Option<&mut InFlight> {
        self.first.as_mut()
    }

    fn back_mut(&mut self) -> Option<&mut InFlight> {
        match self.rest.back_mut() {
            Some(last) => Some(last),
            None => self.first.as_mut(),
        }
    }

    fn push_back(&mut self, f: InFlight) {
        match self.first {
            None => self.first = Some(f),
            Some(_) => self.rest.push_back(f),
        }
    }

    fn pop_front(&mut self) {
        self.first = self.rest.pop_front();
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        usize::from(self.first.is_some()) + self.rest.len()
    }
}

impl LinkTiming {
    /// Names the link's samples from now on.
    pub(crate) fn set_place(&mut self, place: LinkPlace) {
        self.place = Some(place);
        (self.sent, self.received) = (None, None);
    }
}

/// A route's monitoring state: its clock, whether it records, and what it recorded.
///
/// What a frame's path reads and writes while recording comes first, in this order
/// (`repr(C)`), in two cache lines: a node that wakes for a frame finds its caches
/// cold, and every other line this state spread over cost a fetch per read and per
/// write (`cargo bench -p treecast-transport --bench hop`, `HOP_THRASH_KB`).
#[repr(C, align(64))]
pub(crate) struct Monitoring {
    pub(crate) recording: bool,
    /// Samples taken and not counted yet, oldest first (see [`Deferred`]).
    pub(crate) deferred: Vec<Waiting>,
    pub(crate) clock: NodeClock,
    /// Where the stamps of recording are read.
    pub(crate) ticker: Ticker,
    program: u32,
    /// Streams opened with a program tag of their own, which their frames are kept
    /// under instead of `program`.
    stream_programs: HashMap<u32, u32>,
    recorder: Recorder,
    /// Moves whenever what keys a frame's samples may change (the program tags) or
    /// the recorder is cleared: the cells links found before are looked up again.
    epoch: u64,
}

/// Samples deferred before they are counted whatever the route does: a route
/// whose user never flushes still counts, within bounded memory (one read or
/// write of many unlike runs of frames may pass it by those runs).
pub(crate) const MAX_DEFERRED: usize = 1024;

/// Samples that wait before the end of a pass counts them. Counted a few at a
/// time, at the end of every pass, the counting's code and cells came cold from
/// memory each time in a process that had slept; counted by hundreds, once.
/// Anything that reads or renames them (a report, a clear, a start, a stream's
/// program tag, a link's new place or its removal) counts those waiting first.
pub(crate) const COUNT_BATCH: usize = 512;

/// A sample taken on a frame's path and counted at the end of a pass of the
/// node's loop, after the pass has written what it sends, once [`COUNT_BATCH`]
/// wait: the stamps are read where the frames are, but the counting (cells looked
/// up, histograms touched, each a likely cache miss in a process that just woke)
/// delays no frame. Counted in the order taken.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Deferred {
    /// The link's byte stream was written up to `written` by a write that ended at
    /// `end`: it completes frames of the link's in-flight list.
    Written { written: u64, end: Mono },
    /// Frames like `frames` were carried whole by one write, after `queue_ns` in the
    /// queue and `send_ns` in the write (no in-flight entry was made for them).
    Sent { frames: Frames, queue_ns: u64, send_ns: u64 },
    /// Frames like `frames` were read from the link by a read that ended at `at`,
    /// stamped `sent` by their sender (its clock, if it was recording), and handed
    /// to the core `deliver_ns` after the read.
    Read { frames: Frames, sent: Option<u64>, at: Mono, deliver_ns: u64 },
}

/// A deferred sample and the link it was taken on, one per cache line (`align(64)`):
/// an entry that straddled two lines cost two fetches when it was written on a
/// frame's path in a node whose caches had gone cold.
#[derive(Debug, Clone, Copy)]
#[repr(C, align(64))]
pub(crate) struct Waiting(pub(crate) LinkId, pub(crate) Deferred);

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
            clock: wall_clock(),
            ticker: Ticker::new(),
            recording: false,
            program: 0,
            stream_programs: HashMap::new(),
            recorder: Recorder::default(),
            epoch: 0,
            deferred: Vec::new(),
        }
    }

    /// Counts every sample deferred so far, each on its link's timing in `links`
    /// (`timing` finds it); samples of a link gone count nothing. The list keeps its
    /// room from pass to pass, unless one pass made it large.
    pub(crate) fn count_waiting<T>(&mut self, links: &mut LinkMap<T>, timing: fn(&mut T) -> &mut LinkTiming) {
        let mut deferred = std::mem::take(&mut self.deferred);
        for Waiting(link, sample) in deferred.drain(..) {
            if let Some(l) = links.get_mut(link) {
                self.count_deferred(timing(l), sample);
            }
        }
        if deferred.capacity() <= MAX_DEFERRED {
            self.deferred = deferred;
        }
    }

    /// Counts a sample deferred on the link of `t`. A read's net is worked out
    /// here, with the clocks in effect when it was taken (a route counts what
    /// waits before either clock changes).
    pub(crate) fn count_deferred(&mut self, t: &mut LinkTiming, sample: Deferred) {
        match sample {
            Deferred::Written { written, end } => self.written(t, written, end),
            Deferred::Sent { frames, queue_ns, send_ns } => {
                self.count(t, true, frames, Some(queue_ns), send_ns)
            }
            Deferred::Read { frames, sent, at, deliver_ns } => {
                let net_ns = sent.map(|sent| self.net_ns(t, sent, at));
                self.count(t, false, frames, net_ns, deliver_ns);
            }
        }
    }

    /// From stamp `sent` on the peer's clock to the end of the read at `at` on
    /// this node's: the sender's stamp turned to this node's clock by the peer's
    /// offset.
    fn net_ns(&self, t: &LinkTiming, sent: u64, at: Mono) -> u64 {
        let read_ns = self.clock.at(at);
        let sent = i64::try_from(sent).unwrap_or(i64::MAX);
        let net = read_ns.saturating_sub(sent).saturating_add(t.peer_clock.at(read_ns));
        u64::try_from(net).unwrap_or(0)
    }

    pub(crate) fn start(&mut self, program: u32) {
        self.program = program;
        self.recording = true;
        self.epoch += 1;
    }

    /// Frames of `stream` are kept under `program` from now on; `None` when the
    /// stream is gone (its frames, if any still come, fall back to the recording's tag).
    pub(crate) fn set_stream_program(&mut self, stream: u32, program: Option<u32>) {
        match program {
            Some(p) => self.stream_programs.insert(stream, p),
            None => self.stream_programs.remove(&stream),
        };
        self.epoch += 1;
    }

    pub(crate) fn report(&mut self) -> Report {
        self.recorder.report()
    }

    pub(crate) fn clear(&mut self) {
        self.recorder.clear();
        self.epoch += 1;
    }

    /// The header stamp of a flush that starts at `start`.
    pub(crate) fn stamp(&self, start: Mono) -> u64 {
        u64::try_from(self.clock.at(start)).unwrap_or(0)
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

    /// Counts `frames`, sent on (`sending`) or received from the link of `t`, which
    /// spent `first_ns` in their side's first component (queue, or net when the
    /// sender stamped them) and `second_ns` in its second (send, or deliver). The
    /// link remembers the cells it counted in last, each way: a hash lookup only
    /// when its frames change stream, tag or size class. Inlined into its two
    /// callers: each knows its side, and the call itself cost as much as the counting.
    #[inline(always)]
    fn count(
        &mut self,
        t: &mut LinkTiming,
        sending: bool,
        frames: Frames,
        first_ns: Option<u64>,
        second_ns: u64,
    ) {
        let size_class = size_class(frames.bytes);
        let cached = if sending { &t.sent } else { &t.received };
        let slots = match cached {
            Some(c) if c.hold(self.epoch, &frames, size_class) => c.slots,
            _ => [None, None],
        };
        let n = frames.count;
        let first_missed = first_ns.filter(|&ns| !slots[0].is_some_and(|s| self.recorder.add_at(s, ns, n)));
        let second_missed = !slots[1].is_some_and(|s| self.recorder.add_at(s, second_ns, n));
        if first_missed.is_some() || second_missed {
            self.count_missed(
                t,
                sending,
                frames,
                size_class,
                first_missed,
                second_missed.then_some(second_ns),
            );
        }
    }

    /// Counts the components the link's remembered cells could not take (none
    /// found yet, or found before a clear), finding their cells again.
    #[inline(never)]
    fn count_missed(
        &mut self,
        t: &mut LinkTiming,
        sending: bool,
        frames: Frames,
        size_class: u8,
        first_ns: Option<u64>,
        second_ns: Option<u64>,
    ) {
        for (which, ns) in [(0, first_ns), (1, second_ns)] {
            if let Some(ns) = ns {
                let slot = self.find_cell(t, sending, frames, size_class, which);
                self.recorder.add_at(slot, ns, frames.count);
            }
        }
    }

    /// Looks up the cell of one component (`which` of its side's two) of the link's
    /// frames like `frames`, one way, and remembers it.
    fn find_cell(
        &mut self,
        t: &mut LinkTiming,
        sending: bool,
        frames: Frames,
        size_class: u8,
        which: usize,
    ) -> Slot {
        let key = self.key(t, sending, frames.stream, frames.tag);
        let component = match (sending, which) {
            (true, 0) => Component::Queue,
            (true, _) => Component::Send,
            (false, 0) => Component::Net,
            (false, _) => Component::Deliver,
        };
        let slot = self.recorder.slot(key, component, frames.bytes);
        let cached = if sending { &mut t.sent } else { &mut t.received };
        let cells = match cached {
            Some(c) if c.hold(self.epoch, &frames, size_class) => c,
            _ => cached.insert(LinkCells {
                epoch: self.epoch,
                stream: frames.stream,
                tag: frames.tag,
                size_class,
                slots: [None, None],
            }),
        };
        cells.slots[which % 2] = Some(slot);
        slot
    }

    /// Frames were encoded by the flush that started at `start`, after waiting
    /// `waited_ns`; they are counted once written.
    pub(crate) fn queued(&mut self, t: &mut LinkTiming, run: FrameRun, waited_ns: u64, start: Mono) {
        if let Some(last) = t.in_flight.back_mut() {
            if last.start == start && last.waited_ns == waited_ns && last.run.absorb(&run) {
                return;
            }
        }
        t.in_flight.push_back(InFlight { run, start, waited_ns });
    }

    /// The link's byte stream was written up to `written` by a write that ended at `now`.
    pub(crate) fn written(&mut self, t: &mut LinkTiming, written: u64, now: Mono) {
        while let Some(f) = t.in_flight.front_mut() {
            // Most writes take every frame queued: no division then.
            let done = match written >= f.run.last_end {
                true => f.run.count,
                false if f.run.first_end() > written => break,
                false => (written - f.run.first_end()) / f.run.wire_len + 1,
            };
            let (start, waited_ns, run) = (f.start, f.waited_ns, f.run);
            let all = done == run.count;
            if all {
                t.in_flight.pop_front();
            } else {
                f.run.count -= done;
            }
            self.count(t, true, Frames::of_run(&run, done), Some(waited_ns), now.since(start));
            if !all {
                break;
            }
        }
    }

    /// The byte stream of `link` was written up to `written` by a write that ended
    /// at `end`: the send of the frames it completed is deferred until the node's
    /// pass has written what it sends (see [`Deferred`]).
    pub(crate) fn write_deferred(&mut self, link: LinkId, written: u64, end: Mono) {
        self.deferred.push(Waiting(link, Deferred::Written { written, end }));
    }

    /// The frames of `run`, queued `queue_ns` before the start of the write that
    /// carried them whole, which took `send_ns`: deferred on `link` (see [`Deferred`]).
    pub(crate) fn sent_deferred(&mut self, link: LinkId, run: &FrameRun, queue_ns: u64, send_ns: u64) {
        let frames = Frames::of_run(run, run.count);
        self.deferred.push(Waiting(link, Deferred::Sent { frames, queue_ns, send_ns }));
    }

    /// The frames completed by a read that ended at `at` are handed to the core at
    /// `handed`: their samples are deferred on `link` until the node's pass has
    /// written what it sends (see [`Deferred`]), and their net worked out then.
    /// Frames one after another that make the same samples (same stream, tag, size
    /// and stamp: sent by one flush) make one.
    pub(crate) fn read_deferred(&mut self, link: LinkId, frames: &[Frame], at: Mono, handed: Mono) {
        let deliver_ns = handed.since(at);
        let mut rest = frames;
        while let Some((f, after)) = rest.split_first() {
            // Each frame is compared with the run's first, whose fields stay in
            // registers: a neighbour's would be loaded again for every frame.
            let count = 1 + after.iter().take_while(|g| same_samples(f, g)).count();
            rest = rest.get(count..).unwrap_or_default();
            let like = Frames {
                stream: f.header.stream,
                tag: f.header.tag,
                bytes: f.payload.len() as u64,
                count: count as u64,
            };
            let sent = f.header.stamp();
            self.deferred.push(Waiting(link, Deferred::Read { frames: like, sent, at, deliver_ns }));
        }
    }
}

/// Frames alike in what keys their samples, counted together.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Frames {
    stream: u32,
    tag: i32,
    /// Payload bytes of each.
    bytes: u64,
    count: u64,
}

impl Frames {
    /// `count` frames of `run`.
    fn of_run(run: &FrameRun, count: u64) -> Frames {
        Frames { stream: run.stream, tag: run.tag, bytes: run.bytes, count }
    }
}

/// Two frames of one read give the same samples.
fn same_samples(a: &Frame, b: &Frame) -> bool {
    let (x, y) = (&a.header, &b.header);
    // Raw stamps compared: unstamped frames that keep different old stamps are
    // recorded apart, which gives the same samples. Every field is compared, with
    // no branch between: on every frame of a read, and most often all are equal.
    (x.timestamp_ns == y.timestamp_ns)
        & (x.stream == y.stream)
        & (x.tag == y.tag)
        & ((x.flags ^ y.flags) & FLAG_STAMPED == 0)
        & (a.payload.len() == b.payload.len())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
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

    #[test]
    fn frames_of_a_run_cut_by_a_write_take_the_send_time_of_the_write_that_ended_each() {
        let (mut m, mut t, frame, start) = recording();
        let later = |us: u64| Mono::from_nanos(start.nanos() + us * 1_000);
        // Ten frames of 128 bytes, queued in two runs that join into one.
        let first = FrameRun { count: 4, ..FrameRun::one(&frame, 128, 4 * 128) };
        let second = FrameRun { count: 6, ..FrameRun::one(&frame, 128, 10 * 128) };
        m.queued(&mut t, first, 3_000, start);
        m.queued(&mut t, second, 3_000, start);
        assert_eq!(t.in_flight.len(), 1, "the runs join");
        // The first write ends inside the sixth frame, the second writes the rest.
        m.written(&mut t, 5 * 128 + 60, later(10));
        m.written(&mut t, 10 * 128, later(25));
        assert_eq!(t.in_flight.len(), 0);
        let report = m.report();
        let send: Vec<(u64, u64)> = report
            .cells
            .iter()
            .filter(|c| c.component == Component::Send)
            .map(|c| (c.count, c.sum_ns))
            .collect();
        assert_eq!(send, [(10, 5 * 10_000 + 5 * 25_000)]);
        assert_eq!(count_and_sum(&report, Component::Queue), (10, 30_000));
    }

    /// A recording route's monitoring, a link's timing, a 100-byte frame and a start.
    fn recording() -> (Monitoring, LinkTiming, Frame, Mono) {
        let mut m = Monitoring::new();
        m.start(1);
        let frame = Frame::new(treecast_wire::FrameHeader::data(1, 7, 0), vec![0; 100]);
        (m, LinkTiming::default(), frame, Mono::from_nanos(1_000_000_000))
    }

    /// The count and sum of the first cell of `component`.
    fn count_and_sum(report: &Report, component: Component) -> (u64, u64) {
        let cell = report.cells.iter().find(|c| c.component == component).unwrap();
        (cell.count, cell.sum_ns)
    }

    #[test]
    fn a_read_makes_one_sample_per_run_of_frames_alike_and_counts_them_once_recorded() {
        let (mut m, mut t, frame, start) = recording();
        let stamped = |ts: u64| {
            let mut f = frame.clone();
            f.header.flags |= FLAG_STAMPED;
            f.header.timestamp_ns = ts;
            f
        };
        let other_tag =
            Frame { header: treecast_wire::FrameHeader { tag: 8, ..frame.header }, ..frame.clone() };
        let longer = Frame::new(frame.header, vec![0; 101]);
        let frames =
            [stamped(5), stamped(5), other_tag, stamped(5), stamped(6), frame.clone(), frame.clone(), longer];
        let link = crate::LinkTable::new().insert(());
        let handed = Mono::from_nanos(start.nanos() + 2_000);
        m.read_deferred(link, &frames, start, handed);
        let runs: Vec<(u64, bool)> = m
            .deferred
            .iter()
            .map(|Waiting(_, d)| match d {
                Deferred::Read { frames, sent, deliver_ns, .. } => {
                    assert_eq!(*deliver_ns, 2_000);
                    (frames.count, sent.is_some())
                }
                other => panic!("a read defers reads only: {other:?}"),
            })
            .collect();
        assert_eq!(runs, [(2, true), (1, false), (1, true), (1, true), (2, false), (1, false)]);
        assert!(m.report().cells.is_empty(), "nothing counted while deferred");
        for Waiting(_, d) in std::mem::take(&mut m.deferred) {
            m.count_deferred(&mut t, d);
        }
        let report = m.report();
        assert_eq!(report.count(), 8 + 4, "a deliver for each frame, a net for each stamped one");
    }

    #[test]
    fn runs_queued_after_different_waits_stay_apart_in_flight() {
        let (mut m, mut t, frame, start) = recording();
        m.queued(&mut t, FrameRun::one(&frame, 128, 128), 1_000, start);
        m.queued(&mut t, FrameRun::one(&frame, 128, 256), 2_000, start);
        assert_eq!(t.in_flight.len(), 2, "each keeps its own wait");
        m.written(&mut t, 256, Mono::from_nanos(start.nanos() + 10_000));
        let report = m.report();
        assert_eq!(count_and_sum(&report, Component::Queue), (2, 3_000));
        assert_eq!(count_and_sum(&report, Component::Send), (2, 20_000));
    }

    #[test]
    fn the_ticker_reads_the_monotonic_clock_within_a_microsecond() {
        let mut ticker = Ticker::new();
        let began = mono_now();
        let mut checked = 0;
        // Past the calibration, each reading of the ticker taken between two
        // readings of the clock less than a microsecond apart (not preempted)
        // must lie between them, give or take a microsecond.
        while mono_now().since(began) < 3 * CALIBRATION_NS {
            let (before, read, after) = (mono_now(), ticker.now(), mono_now());
            if before.since(began) > CALIBRATION_NS + ANCHOR_SPAN_NS && after.since(before) < 1_000 {
                assert!(
                    read.nanos() + 1_000 >= before.nanos() && read.nanos() <= after.nanos() + 1_000,
                    "{before:?} {read:?} {after:?} {ticker:?}"
                );
                checked += 1;
            }
        }
        assert!(checked > 0, "no two readings of the clock came within a microsecond");
        if ticker.tsc {
            assert!(ticker.rate > 0 && ticker.span > 0, "calibrated: {ticker:?}");
        }
    }

    /// A ticker on a fake counter and clock, whatever this machine's counter.
    fn fake_ticker() -> Ticker {
        Ticker {
            tsc: true,
            first: None,
            anchor: (0, Mono::from_nanos(0)),
            rate: 0,
            span: 0,
            last: Mono::from_nanos(0),
        }
    }

    /// Anchor readings of a counter at `ticks` and a clock at `clock`, `gap` ticks apart.
    fn read_at(ticks: u64, clock: u64, gap: u64) -> impl FnMut() -> (u64, Mono, u64) {
        move || (ticks, Mono::from_nanos(clock), ticks + gap)
    }

    #[test]
    fn a_calibrated_ticker_derives_readings_and_anchors_again_every_millisecond() {
        let mut t = fake_ticker();
        // 3 ticks per ns; anchors every 100 µs until calibrated.
        for step in 0..=100u64 {
            let ns = 1_000_000 + step * 100_000;
            assert_eq!(t.at(3 * ns, &mut read_at(3 * ns, ns, 0)), Mono::from_nanos(ns));
        }
        assert!(t.rate > 0 && t.span > 0, "calibrated: {t:?}");
        // Half a millisecond on: derived, not read.
        let ns = 11_000_000 + 500_000;
        let derived = t.at(3 * ns, &mut || panic!("no anchor needed"));
        assert!(derived.nanos().abs_diff(ns) <= 1, "{derived:?}");
        // Two milliseconds on: anchored again.
        let ns = 13_000_000;
        assert_eq!(t.at(3 * ns, &mut read_at(3 * ns, ns, 0)), Mono::from_nanos(ns));
    }

    #[test]
    fn a_counter_that_ran_on_while_the_clock_stood_still_is_measured_anew() {
        let mut t = fake_ticker();
        for step in 0..=100u64 {
            let ns = step * 100_000;
            t.at(ns, &mut read_at(ns, ns, 0));
        }
        let rate = t.rate;
        assert!(rate > 0);
        // A suspend: the counter moved an hour, the clock a millisecond.
        let (ticks, ns) = (10_000_000 + 3_600_000_000_000, 11_000_000);
        assert_eq!(t.at(ticks, &mut read_at(ticks, ns, 0)), Mono::from_nanos(ns));
        assert_eq!((t.rate, t.span), (0, 0), "the rate is measured anew: {t:?}");
        // Until it is, every reading is the clock's.
        let later = t.at(ticks + 10, &mut read_at(ticks + 10, ns + 10, 0));
        assert_eq!(later, Mono::from_nanos(ns + 10));
    }

    #[test]
    fn a_loose_anchor_is_read_again_and_never_calibrates_and_readings_never_go_back() {
        let mut t = fake_ticker();
        let mut tries = 0;
        // Every try preempted: the anchor is used but measures nothing.
        let reading = t.at(5, &mut || {
            tries += 1;
            (5, Mono::from_nanos(1_000), 5 + 10 * TIGHT_ANCHOR_TICKS)
        });
        assert_eq!((reading, tries, t.first), (Mono::from_nanos(1_000), 3, None));
        // A counter gone back: anchored again, and the reading held at the last.
        let back = t.at(1, &mut read_at(1, 900, 0));
        assert_eq!(back, Mono::from_nanos(1_000));
    }

    #[test]
    fn monotonic_readings_keep_their_order_and_their_differences_saturate() {
        let (a, b) = (mono_now(), mono_now());
        assert!(a.nanos() > 0 && a <= b);
        assert_eq!(a.since(b), 0);
        assert_eq!(Mono::from_nanos(5).since(Mono::from_nanos(2)), 3);
    }

    #[test]
    fn the_short_ways_of_carrying_an_offset_give_what_the_long_one_gives() {
        let long = |offset: i64, drift: i64, since: i128| {
            let moved = since * i128::from(drift) / 1_000_000_000;
            i64::try_from((i128::from(offset) + moved).clamp(i128::from(i64::MIN), i128::from(i64::MAX)))
                .unwrap()
        };
        for (offset, drift, since) in [
            (5, 0, 1_000_000_000_000i128),
            (-7, 123_456, 9_999_999_999),
            (1 << 40, -99_999, -3_000_000_000_001),
            (0, 1_000_000_000, i128::from(i64::MAX)),
            (i64::MAX - 3, 1_000, 10_000_000_000),
        ] {
            assert_eq!(drifted(offset, drift, since), long(offset, drift, since), "{offset} {drift} {since}");
        }
    }
}
