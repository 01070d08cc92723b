//! The striped link's bookkeeping, with no I/O: which pieces went out on which
//! connection and are not acknowledged yet ([`Outgoing`]), and the pieces that
//! came in, put back in order with duplicates dropped ([`Incoming`]).

use std::collections::{BTreeMap, VecDeque};

use bytes::{Bytes, BytesMut};

/// A piece sent and not yet acknowledged.
#[derive(Debug)]
struct Sent {
    seq: u64,
    conn: usize,
    data: Bytes,
}

/// The sending half of one striped link.
#[derive(Debug, Default)]
pub(crate) struct Outgoing {
    next_seq: u64,
    /// In number order.
    unacked: VecDeque<Sent>,
    unacked_bytes: usize,
    /// Pieces sent again after their connection failed.
    pub(crate) resent: u64,
}

impl Outgoing {
    /// Numbers `data` as the next piece, sent on `conn`; returns its number.
    pub(crate) fn sent(&mut self, conn: usize, data: Bytes) -> u64 {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.unacked_bytes += data.len();
        self.unacked.push_back(Sent { seq, conn, data });
        seq
    }

    /// The peer holds every piece before `next`: they are forgotten.
    pub(crate) fn acked(&mut self, next: u64) {
        while self.unacked.front().is_some_and(|s| s.seq < next) {
            if let Some(s) = self.unacked.pop_front() {
                self.unacked_bytes -= s.data.len();
            }
        }
    }

    /// Connection `conn` failed: its pieces not acknowledged go again, each on the
    /// connection `pick` names for it (under the same number, so the peer drops a
    /// copy it had). Returns `(connection, number, data)` in number order.
    pub(crate) fn failed(
        &mut self,
        conn: usize,
        mut pick: impl FnMut(usize) -> usize,
    ) -> Vec<(usize, u64, Bytes)> {
        let mut again = Vec::new();
        for s in self.unacked.iter_mut().filter(|s| s.conn == conn) {
            s.conn = pick(s.data.len());
            again.push((s.conn, s.seq, s.data.clone()));
            self.resent += 1;
        }
        again
    }

    /// Bytes sent and not acknowledged.
    pub(crate) fn unacked_bytes(&self) -> usize {
        self.unacked_bytes
    }
}

/// Why the pieces that came in cannot be put back together.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IncomingError {
    /// More bytes wait behind a missing piece than allowed.
    TooMuchHeld { held: usize, max: usize },
}

impl std::fmt::Display for IncomingError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            IncomingError::TooMuchHeld { held, max } => write!(
                f,
                "{held} bytes of a striped link wait behind a missing piece (at most {max}): a connection stalls"
            ),
        }
    }
}

/// The receiving half of one striped link.
#[derive(Debug)]
pub(crate) struct Incoming {
    /// The next piece in order.
    next: u64,
    /// Pieces past a gap.
    held: BTreeMap<u64, Bytes>,
    held_bytes: usize,
    max_held: usize,
    /// What the last acknowledgement said.
    acked: u64,
    /// Copies dropped (pieces sent again after a connection failed).
    pub(crate) duplicates: u64,
}

impl Incoming {
    /// Holds at most `max_held` bytes behind a missing piece.
    pub(crate) fn new(max_held: usize) -> Self {
        Incoming { next: 0, held: BTreeMap::new(), held_bytes: 0, max_held, acked: 0, duplicates: 0 }
    }

    /// Takes piece `seq`, appending to `out` every byte now in order.
    ///
    /// # Errors
    /// Too many bytes wait behind a gap.
    pub(crate) fn piece(&mut self, seq: u64, data: Bytes, out: &mut BytesMut) -> Result<(), IncomingError> {
        if seq < self.next || self.held.contains_key(&seq) {
            self.duplicates += 1;
            return Ok(());
        }
        if seq > self.next {
            self.held_bytes += data.len();
            self.held.insert(seq, data);
            if self.held_bytes > self.max_held {
                return Err(IncomingError::TooMuchHeld { held: self.held_bytes, max: self.max_held });
            }
            return Ok(());
        }
        out.extend_from_slice(&data);
        self.next += 1;
        while let Some(data) = self.held.remove(&self.next) {
            self.held_bytes -= data.len();
            out.extend_from_slice(&data);
            self.next += 1;
        }
        Ok(())
    }

    /// The acknowledgement to send, if the last one said less.
    pub(crate) fn ack_due(&mut self) -> Option<u64> {
        (self.next > self.acked).then(|| {
            self.acked = self.next;
            self.next
        })
    }

    /// The next piece in order: how many arrived in order so far.
    pub(crate) fn in_order(&self) -> u64 {
        self.next
    }

    /// True when no piece waits behind a gap.
    pub(crate) fn is_whole(&self) -> bool {
        self.held.is_empty()
    }
}

/// Where to cut a message of `len` bytes: one piece up to `small`, else pieces of
/// `piece` bytes (the last may be shorter). Returns the end of each piece.
pub(crate) fn cuts(len: usize, small: usize, piece: usize) -> impl Iterator<Item = std::ops::Range<usize>> {
    let step = if len <= small { len.max(1) } else { piece.max(1) };
    (0..len).step_by(step).map(move |at| at..(at + step).min(len))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn small_messages_are_one_piece_and_large_ones_are_cut() {
        assert_eq!(cuts(10, 64, 4).collect::<Vec<_>>(), vec![0..10]);
        assert_eq!(cuts(10, 8, 4).collect::<Vec<_>>(), vec![0..4, 4..8, 8..10]);
        assert_eq!(cuts(0, 8, 4).count(), 0);
    }

    #[test]
    fn acknowledged_pieces_are_forgotten_and_a_failed_connections_go_again_in_order() {
        let mut out = Outgoing::default();
        for i in 0..6u8 {
            out.sent(usize::from(i % 2), Bytes::from(vec![i; 10]));
        }
        out.acked(2);
        assert_eq!(out.unacked_bytes(), 40);
        let again = out.failed(1, |_| 0);
        assert_eq!(again.iter().map(|(c, s, _)| (*c, *s)).collect::<Vec<_>>(), vec![(0, 3), (0, 5)]);
        // Now on connection 0: a second failure of 1 sends nothing.
        assert!(out.failed(1, |_| 0).is_empty());
        out.acked(6);
        assert_eq!(out.unacked_bytes(), 0);
    }

    #[test]
    fn too_much_behind_a_gap_is_an_error() {
        let mut inc = Incoming::new(15);
        let mut buf = BytesMut::new();
        inc.piece(1, Bytes::from_static(&[1; 10]), &mut buf).unwrap();
        let err = inc.piece(2, Bytes::from_static(&[1; 10]), &mut buf).unwrap_err();
        assert!(err.to_string().contains("missing piece"), "{err}");
    }

    proptest! {
        /// Pieces cut from a stream, sent on several connections, one of which fails
        /// at a random point (its pieces not acknowledged go again on the others,
        /// and some of those the peer had already), arriving in any interleaving:
        /// the stream comes out whole, in order, once.
        #[test]
        fn any_interleaving_and_failure_reassembles_the_stream_once(
            len in 1usize..5000,
            conns in 1usize..5,
            piece in 1usize..300,
            fail_at in 0usize..200,
            delivered_before in 0usize..200,
            order in proptest::collection::vec(any::<u16>(), 0..400),
        ) {
            let stream: Vec<u8> = (0..len).map(|i| (i * 7 + i / 251) as u8).collect();
            let mut out = Outgoing::default();
            // What each connection carries, in the order it carries it.
            let mut wires: Vec<VecDeque<(u64, Bytes)>> = vec![VecDeque::new(); conns];
            let data = Bytes::from(stream.clone());
            for (i, r) in cuts(len, 0, piece).enumerate() {
                let c = i % conns;
                let seq = out.sent(c, data.slice(r.clone()));
                wires[c].push_back((seq, data.slice(r)));
            }
            let mut inc = Incoming::new(usize::MAX);
            let mut got = BytesMut::new();
            let mut step = 0usize;
            let mut failed = false;
            let mut picks = order.iter().copied().cycle();
            loop {
                if !failed && conns > 1 && step == fail_at {
                    failed = true;
                    // Connection 0 fails: some of what it carried reached the peer.
                    let reached: Vec<_> = wires[0].drain(..).take(delivered_before).collect();
                    for (seq, d) in reached {
                        inc.piece(seq, d, &mut got).unwrap();
                    }
                    let mut n = 0usize;
                    for (c, seq, d) in out.failed(0, |_| { n += 1; 1 + n % (conns - 1) }) {
                        wires[c].push_back((seq, d));
                    }
                }
                let live: Vec<usize> = (0..conns).filter(|&c| !wires[c].is_empty()).collect();
                if live.is_empty() {
                    break;
                }
                let c = live[usize::from(picks.next().unwrap_or(0)) % live.len()];
                let (seq, d) = wires[c].pop_front().unwrap();
                inc.piece(seq, d, &mut got).unwrap();
                if let Some(next) = inc.ack_due() {
                    if step % 3 == 0 {
                        out.acked(next);
                    }
                }
                step += 1;
            }
            prop_assert_eq!(&got[..], &stream[..]);
            prop_assert!(inc.is_whole());
        }
    }
}
