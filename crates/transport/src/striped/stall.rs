//! Finds a connection of a striped link that stopped moving while another one of
//! the same link still moves: a rail brought down (a cable pulled, a switch port
//! off) resets nothing, the kernel only retransmits into the void, so the
//! connection neither fails nor drains and would hold its pieces until the core's
//! heartbeat gives the whole link up. When every connection stands still, the peer
//! is not reading (or every rail is down): that is the heartbeat's to judge, and no
//! connection is given up here.
//!
//! `StallWatch` is the judgement, with no I/O; `watch` is the task that feeds it
//! what the kernel and the connection's tasks report.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::mpsc;

use super::{Event, Queue};
use crate::{LinkId, Socket};

/// Seconds a connection of a striped link may hold bytes without any of them
/// reaching the peer, while another connection of the link moves, before it is
/// given up and its pieces go on the others (default [`DEFAULT_LIMIT`]). The
/// `treecast` command reads it (and `treecast bench route --serve`), checks it is in
/// [`LIMIT_RANGE`], and the plans carry it to every node; the library reads no
/// environment ([`StripedRoute::set_stall_limit`](super::StripedRoute::set_stall_limit)).
pub const STALL_ENV: &str = "TREECAST_STRIPE_STALL";
/// Far below the core's default silence limit (30 s), far above a live rail's
/// longest pause (a few retransmission time-outs of a lossy path).
pub const DEFAULT_LIMIT: Duration = Duration::from_secs(5);
/// The limits a stall limit may be: the watch looks four times per limit, and not
/// more often than every 10 ms; past an hour the heartbeat judges the link first.
pub const LIMIT_RANGE: std::ops::RangeInclusive<Duration> =
    Duration::from_millis(10)..=Duration::from_secs(3600);

/// The stall limit a route shares with the watches of its links, in microseconds:
/// set after a link came up (a node's parent link comes before its plan), every
/// watch takes it at its next look.
#[derive(Debug, Clone)]
pub(super) struct SharedLimit(Arc<AtomicU64>);

impl Default for SharedLimit {
    fn default() -> Self {
        SharedLimit(Arc::new(AtomicU64::new(DEFAULT_LIMIT.as_micros() as u64)))
    }
}

impl SharedLimit {
    pub(super) fn set(&self, limit: Duration) {
        let clamped = limit.clamp(*LIMIT_RANGE.start(), *LIMIT_RANGE.end());
        self.0.store(clamped.as_micros() as u64, Ordering::Relaxed);
    }

    pub(super) fn get(&self) -> Duration {
        Duration::from_micros(self.0.load(Ordering::Relaxed))
    }
}

/// What a connection's tasks moved so far, counted as they go.
#[derive(Debug, Default)]
pub(super) struct Progress {
    /// Bytes the writer handed to the kernel.
    pub(super) written: AtomicU64,
    /// Pieces (and acknowledgements) the reader took off the connection.
    pub(super) heard: AtomicU64,
    /// The route gave the connection up (it failed, or this watch reported it).
    pub(super) ended: std::sync::atomic::AtomicBool,
}

/// One look at a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Seen {
    /// Bytes queued for it or held by the kernel and not yet acknowledged by the peer.
    pub(super) outstanding: usize,
    /// Bytes the peer acknowledged so far (written minus what the kernel still holds).
    pub(super) delivered: u64,
    /// What its reader took so far.
    pub(super) heard: u64,
    /// The route gave it up.
    pub(super) ended: bool,
}

#[derive(Debug)]
struct ConnWatch {
    /// The most ever seen delivered: a write cut short by a full buffer makes the
    /// difference dip, and a dip followed by its own recovery is no progress.
    best: u64,
    heard: u64,
    /// Since when it has held bytes without delivering any.
    stuck_since: Instant,
    /// When it last delivered or heard anything.
    moved_at: Instant,
    /// It holds nothing now.
    idle: bool,
    given_up: bool,
}

/// The connections of one link, judged look by look.
#[derive(Debug)]
pub(super) struct StallWatch {
    limit: Duration,
    conns: Vec<ConnWatch>,
}

impl StallWatch {
    /// `count` connections, all taken to have moved at `now`.
    pub(super) fn new(count: usize, limit: Duration, now: Instant) -> Self {
        let fresh =
            || ConnWatch { best: 0, heard: 0, stuck_since: now, moved_at: now, idle: true, given_up: false };
        StallWatch { limit, conns: (0..count).map(|_| fresh()).collect() }
    }

    /// Judges by `limit` from the next look on.
    pub(super) fn set_limit(&mut self, limit: Duration) {
        self.limit = limit;
    }

    /// Takes one look at every connection (`seen`, in connection order); returns
    /// those to give up now: stuck for the limit while another one moved within it,
    /// or moved after it got stuck and holds nothing now (it delivered all it had:
    /// the peer reads, and the stuck one's pieces are what it waits for).
    pub(super) fn look(&mut self, seen: &[Seen], now: Instant) -> Vec<usize> {
        for (c, s) in self.conns.iter_mut().zip(seen) {
            c.given_up |= s.ended;
            if s.delivered > c.best {
                c.best = s.delivered;
                c.stuck_since = now;
                c.moved_at = now;
            }
            if s.heard != c.heard {
                c.heard = s.heard;
                c.moved_at = now;
            }
            c.idle = s.outstanding == 0;
            if c.idle {
                c.stuck_since = now;
            }
        }
        let limit = self.limit;
        let stuck: Vec<usize> = (0..self.conns.len())
            .filter(|&i| {
                let c = &self.conns[i];
                // One that hears but cannot deliver is stuck too, and proves nothing.
                let moves = |d: &ConnWatch| {
                    let stuck = now.duration_since(d.stuck_since) >= limit;
                    !stuck
                        && (now.duration_since(d.moved_at) < limit || (d.idle && d.moved_at > c.stuck_since))
                };
                !c.given_up
                    && now.duration_since(c.stuck_since) >= limit
                    && self.conns.iter().enumerate().any(|(j, d)| j != i && !d.given_up && moves(d))
            })
            .collect();
        for &i in &stuck {
            self.conns[i].given_up = true;
        }
        stuck
    }

    /// True when at most one connection is left to watch: nothing to compare it with.
    pub(super) fn is_done(&self) -> bool {
        self.conns.iter().filter(|c| !c.given_up).count() <= 1
    }
}

/// What the watch task reads of one connection.
#[derive(Debug)]
pub(super) struct Watched {
    pub(super) queue: Arc<Queue>,
    pub(super) progress: Arc<Progress>,
    /// The connection's socket, to ask the kernel what it holds.
    pub(super) ctl: Arc<Socket>,
}

impl Watched {
    fn look(&self) -> Seen {
        let held = self.ctl.unacknowledged().unwrap_or(0);
        Seen {
            outstanding: self.queue.pending.load(Ordering::Acquire) + held,
            delivered: self.progress.written.load(Ordering::Acquire).saturating_sub(held as u64),
            heard: self.progress.heard.load(Ordering::Acquire),
            ended: self.progress.ended.load(Ordering::Acquire),
        }
    }
}

/// Looks at `conns` four times per `limit` and reports each one stuck as ended, so
/// that the route gives it up and sends its pieces on the others. Ends when at most
/// one connection is left to watch or the route is gone.
pub(super) async fn watch(
    conns: Vec<Watched>,
    link: LinkId,
    name: String,
    shared: SharedLimit,
    tx: mpsc::Sender<Event>,
) {
    let mut limit = shared.get();
    let mut stall = StallWatch::new(conns.len(), limit, Instant::now());
    let period = |limit: Duration| (limit / 4).clamp(Duration::from_millis(10), Duration::from_secs(1));
    let mut tick = tokio::time::interval(period(limit));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    while !stall.is_done() {
        tick.tick().await;
        if shared.get() != limit {
            limit = shared.get();
            stall.set_limit(limit);
            tick = tokio::time::interval_at(tokio::time::Instant::now() + period(limit), period(limit));
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        }
        let seen: Vec<Seen> = conns.iter().map(Watched::look).collect();
        for conn in stall.look(&seen, Instant::now()) {
            let reason = format!(
                "{} bytes moved nothing for {:.1} s while another connection of the link moved \
                 (a rail down, or a path that stalls; the limit is set by {STALL_ENV} or \
                 NetworkBuilder::stripe_stall)",
                seen[conn].outstanding,
                limit.as_secs_f64()
            );
            tracing::warn!(peer = %name, "giving up connection {conn} of a striped link: {reason}");
            if tx.send(Event::Stalled { link, conn, reason }).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMIT: Duration = Duration::from_secs(5);

    fn seen(outstanding: usize, delivered: u64, heard: u64) -> Seen {
        Seen { outstanding, delivered, heard, ended: false }
    }

    #[test]
    fn a_connection_stuck_while_another_moves_is_given_up_once() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(2, LIMIT, t0);
        for s in 1..=5u64 {
            let at = t0 + Duration::from_secs(s);
            let got = w.look(&[seen(100, s * 1000, 0), seen(500, 0, 0)], at);
            assert_eq!(got, if s == 5 { vec![1] } else { vec![] }, "at {s} s");
        }
        assert!(w.is_done());
        assert!(w.look(&[seen(100, 9000, 0), seen(500, 0, 0)], t0 + Duration::from_secs(9)).is_empty());
    }

    #[test]
    fn when_every_connection_stands_still_none_is_given_up() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(3, LIMIT, t0);
        for s in 1..=20u64 {
            let none = w.look(&[seen(9, 0, 0), seen(9, 0, 0), seen(0, 0, 0)], t0 + Duration::from_secs(s));
            assert!(none.is_empty(), "at {s} s");
        }
    }

    #[test]
    fn an_idle_connection_or_one_that_drains_slowly_is_kept() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(2, LIMIT, t0);
        for s in 1..=20u64 {
            let at = t0 + Duration::from_secs(s);
            // 0 moves fast; 1 is idle, then slow: a byte every 4 s.
            let slow = if s < 10 { seen(0, 0, 0) } else { seen(1000, s / 4, 0) };
            assert!(w.look(&[seen(10, s * 1000, 0), slow], at).is_empty(), "at {s} s");
        }
    }

    #[test]
    fn a_dip_in_delivered_and_its_recovery_are_no_progress() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(2, LIMIT, t0);
        let one = [5000, 4000, 5000, 5000, 5000, 5000];
        let mut given_up = Vec::new();
        for (s, &delivered) in (1u64..).zip(&one) {
            let at = t0 + Duration::from_secs(s);
            let got = w.look(&[seen(10, s * 100_000, 0), seen(10, delivered, 0)], at);
            // 5000 at 1 s was progress; the dip to 4000 and back is not.
            assert_eq!(got.is_empty(), s < 6, "at {s} s");
            given_up.extend(got);
        }
        assert_eq!(given_up, vec![1]);
    }

    #[test]
    fn one_stuck_after_the_other_delivered_all_it_had_is_given_up_even_when_looked_at_late() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(2, LIMIT, t0);
        let at = |s| t0 + Duration::from_secs(s);
        // 1 delivers a little and is stuck from 1 s; 0 delivers until 2 s, then holds nothing.
        assert!(w.look(&[seen(10, 1000, 0), seen(64, 100, 0)], at(1)).is_empty());
        assert!(w.look(&[seen(0, 2000, 0), seen(64, 100, 0)], at(2)).is_empty());
        // A busy machine looks next at 10 s: 0 last moved 8 s ago, but after 1 got stuck.
        assert_eq!(w.look(&[seen(0, 2000, 0), seen(64, 100, 0)], at(10)), vec![1]);
    }

    #[test]
    fn an_ended_connection_or_one_that_hears_but_cannot_deliver_proves_nothing() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(3, LIMIT, t0);
        for s in 1..=8u64 {
            let ended = Seen { outstanding: 0, delivered: s * 1000, heard: s, ended: true };
            // 0 holds bytes it cannot deliver but hears the peer; 1 holds bytes too.
            let got = w.look(&[seen(64, 0, s), seen(64, 0, 0), ended], t0 + Duration::from_secs(s));
            assert!(got.is_empty(), "at {s} s: {got:?}");
        }
    }

    #[test]
    fn hearing_from_the_peer_on_another_connection_counts_as_it_moving() {
        let t0 = Instant::now();
        let mut w = StallWatch::new(2, LIMIT, t0);
        let mut given_up = Vec::new();
        for s in 1..=6u64 {
            // 0 sends nothing but hears acknowledgements; 1 holds bytes it cannot deliver.
            given_up.extend(w.look(&[seen(0, 0, s), seen(64, 0, 0)], t0 + Duration::from_secs(s)));
        }
        assert_eq!(given_up, vec![1]);
    }
}
