//! A link's out-queue: small frames gathered into one buffer, large payloads by
//! reference; frames staged for the stamp of the write that takes them, runs of
//! frames recorded while monitoring, and the writes that stamp and record them.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::os::fd::OwnedFd;
use std::sync::Arc;

use bytes::{Buf, Bytes, BytesMut};
use treecast_wire::{Frame, FrameHeader, FLAG_PAYLOAD_FD, FLAG_STAMPED, HEADER_LEN, TIMESTAMP_AT};

use super::payload::{before_next_file, files_for, slices_up_to};
use super::{Conn, MAX_IOV, ZERO_COPY_MIN};
use crate::recording::{mono_now, FrameRun, Monitoring, Mono};
use crate::{LinkId, Socket};

/// Frames queued for one link: small ones gathered into one buffer, large payloads
/// by reference.
#[derive(Debug, Default)]
pub(super) struct OutQueue {
    pub(super) segments: VecDeque<Bytes>,
    pub(super) small: BytesMut,
    pub(super) bytes: usize,
    /// Frames to be stamped (while monitoring, and clock probes) not yet encoded;
    /// their header stamp is the start of the write that takes them (see `timing`).
    pub(super) staged: Vec<Staged>,
    /// Runs of frames queued while recording, oldest first, until the end of the
    /// write that takes them records their queue and send. Small frames are encoded
    /// in `small` at once, and their header stamp written in place at the start of
    /// that write: no copy of the frame is kept. Staged frames are encoded and
    /// stamped at that start, and listed after them. The last run is `open`.
    pub(super) recorded: Vec<RecordedRun>,
    /// The run the next frame encoded while recording joins if it is like it:
    /// kept apart from `recorded` so that joining is four comparisons and a count.
    pub(super) open: Option<RecordedRun>,
    /// Payload files not sent yet, with where their frame's header starts in the
    /// byte stream: each goes with the write that carries that header, or earlier.
    pub(super) files: VecDeque<(u64, Arc<OwnedFd>)>,
    /// Where the header of the last file sent ends: no file goes until the stream is
    /// written that far, so the receiver holds at most one write's files unclaimed.
    pub(super) files_sent_to: u64,
    /// Bytes ever encoded and ever written: where each frame ends in the link's
    /// byte stream, to tell which write carried its last byte.
    pub(super) pushed: u64,
    pub(super) written: u64,
    /// Where the last run left in the link's in-flight list ([`LinkTiming`]) ends
    /// in the byte stream: a write that starts before it carries bytes of those
    /// runs, and its end is recorded for them. Kept here, where every write looks,
    /// so that a link with nothing in flight never touches its timing on a write.
    pub(super) in_flight_to: u64,
}

/// Frames queued while recording, alike, one after another in the byte stream.
#[derive(Debug)]
pub(super) struct RecordedRun {
    /// Where the first one's header starts in the buffer of small frames, until the
    /// write's start stamps it; `None` for frames staged, stamped when encoded.
    pub(super) header_at: Option<usize>,
    pub(super) run: FrameRun,
    /// When they were queued.
    pub(super) at: Mono,
}

/// Writes `stamp` into the headers of run `u`'s frames in `small`, if they were
/// encoded there unstamped (once: the run then no longer says where they are).
#[inline]
fn stamp_run(small: &mut BytesMut, u: &mut RecordedRun, stamp: [u8; 8]) {
    let Some(header_at) = u.header_at.take() else { return };
    let (len, count) = (u.run.wire_len as usize, u.run.count as usize);
    if let Some(frames) = small.get_mut(header_at..header_at + len * count) {
        for f in frames.chunks_exact_mut(len) {
            f[TIMESTAMP_AT..TIMESTAMP_AT + stamp.len()].copy_from_slice(&stamp);
        }
    }
}

/// A frame waiting for the write that stamps it.
#[derive(Debug)]
pub(super) struct Staged {
    pub(super) frame: Frame,
    /// When it was queued.
    pub(super) at: Mono,
    /// The file its payload goes in, if any.
    pub(super) file: Option<Arc<OwnedFd>>,
    /// Queued while recording: its queue and send times are recorded.
    pub(super) record: bool,
}

impl OutQueue {
    /// Encodes `frame`, with `stamp` as its timestamp when this hop took one while
    /// recording, and its payload in `file` if it goes as one (header only, then).
    /// Returns the bytes it adds to the link's byte stream.
    pub(super) fn push(&mut self, frame: &Frame, stamp: Option<u64>, file: Option<Arc<OwnedFd>>) -> u64 {
        // A frame encoded otherwise ends the open run: its frames are contiguous.
        self.close_run();
        let mut header = stamped_header(frame, stamp);
        if let Some(file) = file {
            header.flags |= FLAG_PAYLOAD_FD;
            self.files.push_back((self.pushed, file));
            header.encode(frame.payload.len(), &mut self.small);
            self.bytes += HEADER_LEN;
            self.pushed += HEADER_LEN as u64;
            return HEADER_LEN as u64;
        }
        if frame.payload.len() < ZERO_COPY_MIN {
            return self.append_small(&header, &frame.payload);
        }
        self.bytes += frame.wire_len();
        self.pushed += frame.wire_len() as u64;
        header.encode(frame.payload.len(), &mut self.small);
        self.segments.push_back(self.small.split().freeze());
        self.segments.push_back(frame.payload.clone());
        frame.wire_len() as u64
    }

    /// Encodes a frame of `header` and a small `payload` into the buffer of small
    /// frames; returns the bytes it adds to the link's byte stream.
    #[inline]
    pub(super) fn append_small(&mut self, header: &FrameHeader, payload: &[u8]) -> u64 {
        let wire_len = HEADER_LEN + payload.len();
        header.encode(payload.len(), &mut self.small);
        self.small.extend_from_slice(payload);
        self.bytes += wire_len;
        self.pushed += wire_len as u64;
        wire_len as u64
    }

    /// True when frames wait for the stamp of the next write.
    pub(super) fn has_unstamped(&self) -> bool {
        !self.staged.is_empty() || !self.recorded.is_empty() || self.open.is_some()
    }

    /// Encodes `frame`, queued at `at` while recording, at once: its header stamp is
    /// written in place by [`OutQueue::stamp_queued`]. Only for a small frame
    /// without a file when nothing is staged, so that it stays in `small` in order.
    pub(super) fn push_unstamped(&mut self, frame: &Frame, at: Mono) {
        let header_at = self.small.len();
        let wire_len = frame.wire_len() as u64;
        let like = |o: &&mut RecordedRun| {
            (o.at, o.run.wire_len, o.run.stream, o.run.tag)
                == (at, wire_len, frame.header.stream, frame.header.tag)
        };
        match self.open.as_mut().filter(like) {
            Some(o) => o.run.count += 1,
            None => {
                self.close_run();
                // Where it ends is set when the run closes: joining counts, no more.
                let run = FrameRun::one(frame, wire_len, 0);
                self.open = Some(RecordedRun { header_at: Some(header_at), run, at });
            }
        }
        self.append_small(&stamped_header(frame, Some(0)), &frame.payload);
    }

    /// Moves the open run to the list of runs waiting for their write, with where it
    /// ends in the link's byte stream (everything encoded since it opened is its).
    pub(super) fn close_run(&mut self) {
        if let Some(o) = self.take_open() {
            self.recorded.push(o);
        }
    }

    /// The open run, closed: everything encoded since it opened is its.
    pub(super) fn take_open(&mut self) -> Option<RecordedRun> {
        let pushed = self.pushed;
        self.open.take().map(|mut o| {
            o.run.last_end = pushed;
            o
        })
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bytes == 0 && self.staged.is_empty()
    }

    /// Writes header stamp `stamp` into the frames encoded while recording and
    /// encodes the staged frames with it; the runs recorded stay listed, for
    /// the end of the write to record.
    pub(super) fn stamp_queued(&mut self, stamp: u64) {
        let stamp_bytes = stamp.to_le_bytes();
        // The open run stays open (most flushes take one run per link, and then the
        // list is not touched); a staged frame encoded below closes it.
        for u in self.recorded.iter_mut().chain(self.open.as_mut()) {
            stamp_run(&mut self.small, u, stamp_bytes);
        }
        if self.staged.is_empty() {
            return;
        }
        // Taken and given back, so the staging vector keeps its capacity: no
        // allocation per flush while recording.
        let mut staged = std::mem::take(&mut self.staged);
        for s in staged.drain(..) {
            // A frame staged only to keep its place behind a probe takes no stamp.
            let stamp = (s.record || s.frame.header.is_timed()).then_some(stamp);
            let wire_len = self.push(&s.frame, stamp, s.file);
            if s.record {
                let run = FrameRun::one(&s.frame, wire_len, self.pushed);
                // Like frames staged one after another make one run: one sample.
                let joined = self
                    .recorded
                    .last_mut()
                    .is_some_and(|last| last.header_at.is_none() && last.at == s.at && last.run.absorb(&run));
                if !joined {
                    self.recorded.push(RecordedRun { header_at: None, run, at: s.at });
                }
            }
        }
        self.staged = staged;
    }

    /// Writes header stamp `stamp` into the frames of the open run (under
    /// [`write_open_run`]'s condition, the only frames waiting for a stamp).
    #[inline]
    pub(super) fn stamp_open(&mut self, stamp: u64) {
        if let Some(o) = self.open.as_mut() {
            stamp_run(&mut self.small, o, stamp.to_le_bytes());
        }
    }

    /// Writes as much as the socket takes; true when everything went.
    pub(super) fn write(&mut self, sock: &Socket) -> io::Result<bool> {
        loop {
            if self.segments.is_empty() && self.small.is_empty() {
                self.bytes = 0;
                return Ok(true);
            }
            if !self.segments.is_empty() && !self.small.is_empty() {
                self.segments.push_back(self.small.split().freeze());
            }
            let result = if self.segments.is_empty() && self.files.is_empty() {
                // The common case: small frames only, written from the one buffer it keeps.
                sock.write_vectored(&[IoSlice::new(&self.small)])
            } else {
                let sources: Vec<&[u8]> = if self.segments.is_empty() {
                    vec![&self.small]
                } else {
                    self.segments.iter().take(MAX_IOV).map(|b| &b[..]).collect()
                };
                let total = sources.iter().map(|b| b.len() as u64).sum();
                let (files, limit) = if self.written < self.files_sent_to {
                    (Vec::new(), before_next_file(&self.files, self.written, total))
                } else {
                    files_for(&self.files, self.written, total)
                };
                let slices = slices_up_to(&sources, limit);
                if files.is_empty() {
                    sock.write_vectored(&slices)
                } else {
                    sock.send_with_fds(&slices, &files).inspect(|_| {
                        // Gone with the write's first byte, whatever its length.
                        if let Some((at, _)) = self.files.drain(..files.len()).next_back() {
                            self.files_sent_to = at + HEADER_LEN as u64;
                        }
                    })
                }
            };
            match result {
                Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
                Ok(n) => self.advance(n),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }

    /// Drops the first `n` bytes queued: they were written.
    pub(super) fn advance(&mut self, mut n: usize) {
        self.bytes -= n;
        self.written += n as u64;
        if self.segments.is_empty() {
            self.small.advance(n);
            if self.small.is_empty() {
                self.small.clear();
            }
            return;
        }
        while n > 0 {
            let Some(front) = self.segments.front_mut() else { break };
            if n >= front.len() {
                n -= front.len();
                self.segments.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
}

/// `frame`'s header as this hop sends it: stamped with `stamp` when this hop took
/// one while recording, otherwise unstamped (a forwarded frame keeps the previous
/// hop's stamp in its header, which measures nothing for this hop); no payload file.
#[inline]
pub(super) fn stamped_header(frame: &Frame, stamp: Option<u64>) -> FrameHeader {
    let mut header = frame.header;
    header.flags &= !FLAG_PAYLOAD_FD;
    match stamp {
        Some(ns) => {
            header.timestamp_ns = ns;
            header.flags |= FLAG_STAMPED;
        }
        None => header.flags &= !FLAG_STAMPED,
    }
    header
}

/// Writes what `c` (the link `link`) has queued, stamping its frames while
/// monitoring; their queue and send are counted later (see [`record_write`]).
pub(super) fn write_timed(link: LinkId, c: &mut Conn, monitor: &mut Monitoring) -> io::Result<bool> {
    // The first test's conditions are tested in this order, each only if the one
    // before passed: the common case when not recording reads no more than it must.
    if !c.out.has_unstamped() && !monitor.recording && c.out.written >= c.out.in_flight_to {
        return c.out.write(&c.sock);
    }
    if c.out.staged.is_empty() && c.out.recorded.is_empty() && c.out.written >= c.out.in_flight_to {
        return match c.out.open.is_some() {
            true => write_open_run(link, c, monitor),
            // Nothing to stamp and nothing in flight: nothing of this write is recorded.
            false => c.out.write(&c.sock),
        };
    }
    let (unstamped, in_flight) = (c.out.has_unstamped(), c.out.written < c.out.in_flight_to);
    // A clock probe's stamp is read exactly: the global clock is measured with it.
    let start = match c.out.staged.iter().any(|s| s.frame.header.is_timed()) {
        true => mono_now(),
        false => monitor.ticker.now(),
    };
    if unstamped {
        c.out.stamp_queued(monitor.stamp(start));
    }
    let result = c.out.write(&c.sock);
    let end = monitor.ticker.now();
    record_write(link, c, monitor, in_flight, start, end);
    result
}

/// The common write while recording: one run of frames encoded in place, nothing
/// staged, listed or in flight before it. What [`write_timed`] does then, without
/// the lists' bookkeeping (a third of the instructions recording added per write).
#[inline]
fn write_open_run(link: LinkId, c: &mut Conn, monitor: &mut Monitoring) -> io::Result<bool> {
    let start = monitor.ticker.now();
    c.out.stamp_open(monitor.stamp(start));
    let result = c.out.write(&c.sock);
    let end = monitor.ticker.now();
    if let Some(r) = c.out.take_open() {
        record_run(link, c, monitor, r, start, end);
    }
    // A write cut short left the run in flight: its end counts for it.
    if c.out.written < c.out.in_flight_to {
        monitor.write_deferred(link, c.out.written, end);
    }
    result
}

/// Records the write from `start` to `end` on `link`: each run it stamped that it
/// carried whole is deferred with its queue and send at once (the common case:
/// the link's timing is not touched); a run it cut waits in the link's in-flight
/// list, and so does what was there before it (`in_flight`), until the writes
/// that carry their last bytes are counted ([`Monitoring::write_deferred`]).
fn record_write(
    link: LinkId,
    c: &mut Conn,
    monitor: &mut Monitoring,
    in_flight: bool,
    start: Mono,
    end: Mono,
) {
    drain_runs(c, &mut |c, r| record_run(link, c, monitor, r, start, end));
    if in_flight || c.out.written < c.out.in_flight_to {
        monitor.write_deferred(link, c.out.written, end);
    }
}

/// Records run `r`, stamped by the write from `start` to `end` on `link` (see
/// [`record_write`]).
#[inline]
fn record_run(link: LinkId, c: &mut Conn, monitor: &mut Monitoring, r: RecordedRun, start: Mono, end: Mono) {
    let waited = start.since(r.at);
    if r.run.last_end <= c.out.written {
        monitor.sent_deferred(link, &r.run, waited, end.since(start));
    } else {
        leave_in_flight(c, monitor, r.run, waited, start);
    }
}

/// Puts `run`, queued `waited` ns before the write start `start` that stamped it,
/// in the in-flight list of `c`'s link: the writes that carry it count its send.
/// Out of line: only a write cut short or a stop comes here, and its code would
/// otherwise sit among the frame path's.
#[cold]
#[inline(never)]
fn leave_in_flight(c: &mut Conn, monitor: &mut Monitoring, run: FrameRun, waited: u64, start: Mono) {
    c.out.in_flight_to = run.last_end;
    monitor.queued(&mut c.timing, run, waited, start);
}

/// Stamps the frames `c` queued for a stamp with `start` without writing them (a
/// stop: frames sent after it must not overtake them), their runs left in flight.
pub(super) fn stamp_in_flight(c: &mut Conn, monitor: &mut Monitoring, start: Mono) {
    if !c.out.has_unstamped() {
        return;
    }
    c.out.stamp_queued(monitor.stamp(start));
    drain_runs(c, &mut |c, r| leave_in_flight(c, monitor, r.run, start.since(r.at), start));
}

/// Hands `each` the runs of `c` that [`OutQueue::stamp_queued`] stamped, oldest
/// first: those listed, then the open one. The list keeps its room from one write
/// to the next.
fn drain_runs(c: &mut Conn, each: &mut dyn FnMut(&mut Conn, RecordedRun)) {
    let open = c.out.take_open();
    let mut runs = std::mem::take(&mut c.out.recorded);
    for r in runs.drain(..) {
        each(c, r);
    }
    c.out.recorded = runs;
    if let Some(r) = open {
        each(c, r);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use treecast_wire::{cut_frames, MAX_PAYLOAD_LEN};

    /// Like frames staged together (behind a large frame or a probe) make one run,
    /// so one sample, not one per frame.
    #[test]
    fn like_frames_staged_together_make_one_run() {
        let mut q = OutQueue::default();
        let at = Mono::from_nanos(100);
        for tag in [1, 1, 1, 2] {
            let frame = Frame::new(FrameHeader::data(3, tag, 0), vec![7; 10]);
            q.staged.push(Staged { frame, at, file: None, record: true });
        }
        q.stamp_queued(0xABCD);
        q.close_run();
        let runs: Vec<_> = q.recorded.drain(..).map(|r| (r.run.tag, r.run.count)).collect();
        assert_eq!(runs, [(1, 3), (2, 1)]);
    }

    /// Frames encoded while recording form runs of like frames queued together; a
    /// frame encoded otherwise ends a run. Every recorded frame gets the flush's
    /// stamp in its header and the plain one keeps none.
    #[test]
    fn frames_encoded_while_recording_form_runs_and_all_get_the_stamp() {
        let mut q = OutQueue::default();
        let like = |tag| Frame::new(FrameHeader::data(3, tag, 0), vec![7; 10]);
        let (t0, t1) = (Mono::from_nanos(100), Mono::from_nanos(200));
        for (tag, at) in [(1, t0), (1, t0), (1, t0), (2, t0), (2, t1), (2, t1)] {
            q.push_unstamped(&like(tag), at);
        }
        q.push(&like(2), None, None);
        q.push_unstamped(&like(2), t1);
        q.stamp_queued(0xABCD);
        q.close_run();
        let start = Mono::from_nanos(1_000);
        let runs: Vec<_> = q
            .recorded
            .drain(..)
            .map(|r| (r.run.tag, r.run.count, r.run.last_end, start.since(r.at)))
            .collect();
        let len = (HEADER_LEN + 10) as u64;
        assert_eq!(
            runs,
            [(1, 3, 3 * len, 900), (2, 1, 4 * len, 900), (2, 2, 6 * len, 800), (2, 1, 8 * len, 800)]
        );
        let frames = cut_frames(&mut q.small.clone(), MAX_PAYLOAD_LEN).unwrap();
        let stamps: Vec<_> = frames.iter().map(|f| f.header.stamp()).collect();
        let stamped = Some(0xABCD);
        assert_eq!(stamps, [stamped, stamped, stamped, stamped, stamped, stamped, None, stamped]);
        assert!(!q.has_unstamped());
    }
}
