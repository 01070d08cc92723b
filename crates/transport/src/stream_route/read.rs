//! Reading a ready link: its bytes into its read buffer, cut into frames, handed
//! to the route's sink in order.

use std::collections::VecDeque;
use std::io;
use std::os::fd::OwnedFd;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::BytesMut;
use treecast_wire::{cut_frames_into, Frame, MAX_FRAMES_GUESS, READ_CHUNK};

use super::payload::{ReceivedFiles, MAX_WAITING_FILES};
use super::{control_limit, Conn, State, StreamRoute, DRAIN_AFTER_WRITE_FAILURE, READ_BUDGET};
use crate::recording::Monitoring;
use crate::route::RouteEvent;
use crate::{LinkId, Socket};

thread_local! {
    // One read buffer per thread, not per link: a node with many children stays
    // small. It is borrowed only for the duration of one read syscall.
    static SCRATCH: std::cell::RefCell<Box<[u8]>> = std::cell::RefCell::new(vec![0u8; READ_CHUNK].into_boxed_slice());
    // The list a read's frames are cut into, taken and given back empty (at most
    // `MAX_FRAMES_GUESS` frames' room is kept).
    static FRAME_LIST: std::cell::Cell<Vec<Frame>> = const { std::cell::Cell::new(Vec::new()) };
}

impl StreamRoute {
    /// Reads from one ready link; returns what to report, if it closed.
    pub(super) fn read_link(
        &mut self,
        link: LinkId,
        sink: &mut dyn FnMut(LinkId, RouteEvent),
        any: &mut bool,
    ) -> Option<Option<String>> {
        let limits = (self.max_frame, self.max_control);
        let c = self.conns.get_mut(link)?;
        if c.write_failed.is_some() {
            return self.drain_link(link, sink, any);
        }
        let mut budget = READ_BUDGET;
        loop {
            if budget == 0 {
                // Fair to the other links: come back to this one on the next turn.
                self.ready.push(link);
                return None;
            }
            let mut guard = match c.read_fd.poll_read_ready(&mut Context::from_waker(&c.waker)) {
                Poll::Pending => return None,
                Poll::Ready(Err(e)) => return Some(Some(format!("read error: {e}"))),
                Poll::Ready(Ok(g)) => g,
            };
            let result = guard.try_io(|inner| read_some(inner.get_ref(), &mut c.rbuf, &mut c.files));
            match result {
                Ok(Ok((0, _))) => return Some(end_of_stream(&c.rbuf)),
                Ok(Ok((n, drained))) => {
                    budget = budget.saturating_sub(n);
                    // A short read drained the socket: edge-triggered epoll will report new data.
                    if drained {
                        guard.clear_ready();
                    }
                }
                Ok(Err(e)) if e.kind() == io::ErrorKind::Interrupted => continue,
                Ok(Err(e)) => return Some(Some(format!("read error: {e}"))),
                Err(_would_block) => continue,
            }
            if let Err(reason) = deliver(link, c, &mut self.monitor, limits, sink, any) {
                return Some(Some(reason));
            }
        }
    }

    /// Reads a link whose write failed straight from its socket, not waiting for the
    /// reactor to report it readable (the peer's last bytes may be there already),
    /// until nothing is left; then it is reported closed with the write's failure.
    fn drain_link(
        &mut self,
        link: LinkId,
        sink: &mut dyn FnMut(LinkId, RouteEvent),
        any: &mut bool,
    ) -> Option<Option<String>> {
        let limits = (self.max_frame, self.max_control);
        let c = self.conns.get_mut(link)?;
        let mut budget = READ_BUDGET;
        loop {
            let (reason, drained) = c.write_failed.as_mut()?;
            if *drained >= DRAIN_AFTER_WRITE_FAILURE {
                return Some(Some(format!("{reason}; the peer kept sending after it")));
            }
            if budget == 0 {
                self.ready.push(link);
                return None;
            }
            match read_some(&c.sock, &mut c.rbuf, &mut c.files) {
                // The peer closed first; our write failed only because of that.
                Ok((0, _)) => return Some(end_of_stream(&c.rbuf)),
                Ok((n, _)) => {
                    *drained += n;
                    budget = budget.saturating_sub(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_would_block_or_failed) => return Some(Some(reason.clone())),
            }
            if let Err(reason) = deliver(link, c, &mut self.monitor, limits, sink, any) {
                return Some(Some(reason));
            }
        }
    }
}

/// Reads what `sock` has, up to a chunk, onto the end of `rbuf`; says how much and
/// whether that drained the socket.
///
/// While a large frame arrives, [`cut_frames_into`] has made room in `rbuf` for it, and
/// the read goes straight there. Otherwise it goes through the thread's scratch
/// buffer, so that an idle link keeps no read room of its own.
///
/// A Unix socket returns no more than one payload file per read, and stops there:
/// a short read that brought a file does not say the socket is drained.
pub(super) fn read_some(
    sock: &Socket,
    rbuf: &mut BytesMut,
    files: &mut VecDeque<OwnedFd>,
) -> io::Result<(usize, bool)> {
    let room = rbuf.capacity() - rbuf.len();
    let files_before = files.len();
    let (n, asked) = if room >= READ_CHUNK {
        (sock.read_into_spare(rbuf, files)?, room)
    } else {
        SCRATCH.with(|scratch| {
            let mut scratch = scratch.borrow_mut();
            let n = sock.read_with_fds(&mut scratch, files)?;
            rbuf.extend_from_slice(&scratch[..n]);
            Ok::<_, io::Error>((n, scratch.len()))
        })?
    };
    Ok((n, n < asked && files.len() == files_before))
}

/// What a link's end of stream reports: a clean close, or a frame cut short.
pub(super) fn end_of_stream(rbuf: &BytesMut) -> Option<String> {
    (!rbuf.is_empty())
        .then(|| format!("the peer closed the link in the middle of a frame ({} bytes)", rbuf.len()))
}

/// Hands the whole frames `c` has read to `sink` (and records them while
/// monitoring); a link no longer open reads but delivers nothing. `limits` are the
/// route's frame limit and its control allowance per back-end.
pub(super) fn deliver(
    link: LinkId,
    c: &mut Conn,
    monitor: &mut Monitoring,
    (max_frame, max_control): (usize, usize),
    sink: &mut dyn FnMut(LinkId, RouteEvent),
    any: &mut bool,
) -> Result<(), String> {
    let read_at = monitor.recording.then(|| monitor.ticker.now());
    // The list keeps its room from one read to the next: no allocation per read.
    let mut frames = FRAME_LIST.take();
    let max_control = control_limit(c, max_frame, max_control);
    cut_frames_into(&mut c.rbuf, max_frame, max_control, &mut ReceivedFiles(&mut c.files), &mut frames)
        .map_err(|e| e.to_string())?;
    // A clock probe needs the read's end, as the `Instant` the core measures with,
    // whether or not anything records; cutting small frames takes far less than the
    // clock's error bound.
    let timed_at = frames.iter().any(|f| f.header.is_timed()).then(Instant::now);
    if c.files.len() > MAX_WAITING_FILES {
        return Err(format!("the peer sent {} files no frame claims", c.files.len()));
    }
    if c.state != State::Open {
        frames.clear();
        FRAME_LIST.set(frames);
        return Ok(());
    }
    // The frames of one read reach the core together (it then takes them in order:
    // a frame's wait for the ones before it is the core's time, not the link's).
    if let Some(at) = read_at {
        let handed = monitor.ticker.now();
        monitor.read_deferred(link, &frames, at, handed);
    }
    for f in frames.drain(..) {
        *any = true;
        match timed_at {
            Some(at) if f.header.is_timed() => sink(link, RouteEvent::Timed(f, at)),
            _ => sink(link, RouteEvent::Frame(f)),
        }
    }
    if frames.capacity() <= MAX_FRAMES_GUESS {
        FRAME_LIST.set(frames);
    }
    Ok(())
}
