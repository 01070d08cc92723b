//! Flow-control windows, both ends.
//!
//! A *sender* keeps a [`Budget`]: what its receiver still allows on one stream of
//! one link. It may send while at least one packet and one byte are left, so one
//! frame may overshoot the byte budget (a frame larger than the whole window still
//! goes, alone). A *receiver* keeps a [`Ledger`] of the same window: what it has
//! received and not yet given back. It checks every data frame against it (a
//! sender that goes beyond its window breaks the protocol and loses its link), and
//! returns credit in batches of about half a window as frames are consumed, so a
//! node holds at most a window per link and stream whatever its peers do.

use treecast_wire::{Grant, Window};

/// What a sender may still send on one stream of one link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Budget {
    packets: i64,
    bytes: i64,
}

impl Budget {
    /// A full window.
    pub(crate) fn new(window: Window) -> Self {
        Budget { packets: i64::from(window.packets), bytes: clamp(window.bytes) }
    }

    /// True when a frame may go now.
    pub(crate) fn open(&self) -> bool {
        self.packets > 0 && self.bytes > 0
    }

    /// Counts one frame of `len` payload bytes as sent.
    pub(crate) fn spend(&mut self, len: usize) {
        self.packets -= 1;
        self.bytes -= len as i64;
    }

    /// Counts `packets` frames of `bytes` payload bytes in all as sent (one message
    /// for several receivers).
    pub(crate) fn spend_many(&mut self, packets: u32, bytes: u64) {
        self.packets -= i64::from(packets);
        self.bytes = self.bytes.saturating_sub(clamp(bytes));
    }

    /// As [`Budget::grant`], never above a full `window`.
    pub(crate) fn grant_within(&mut self, g: Grant, window: Window) -> bool {
        let reopened = self.grant(g);
        self.packets = self.packets.min(i64::from(window.packets));
        self.bytes = self.bytes.min(clamp(window.bytes));
        reopened
    }

    /// Adds what the receiver gave back; returns true when this reopened a closed budget.
    pub(crate) fn grant(&mut self, g: Grant) -> bool {
        let was_open = self.open();
        self.packets = self.packets.saturating_add(i64::from(g.packets));
        self.bytes = self.bytes.saturating_add(clamp(g.bytes));
        !was_open && self.open()
    }
}

fn clamp(bytes: u64) -> i64 {
    i64::try_from(bytes).unwrap_or(i64::MAX)
}

/// A sender broke its window: it sent with no credit left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Overrun {
    /// Frames it had outstanding.
    pub(crate) packets: u32,
    /// Bytes it had outstanding.
    pub(crate) bytes: u64,
}

/// A receiver's account of one stream of one link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Ledger {
    window: Window,
    /// Received and not yet given back (consumed or not).
    outstanding_packets: u32,
    outstanding_bytes: u64,
    /// Consumed and not yet given back.
    owed_packets: u32,
    owed_bytes: u64,
}

impl Ledger {
    /// A ledger for a sender that starts with a full `window`.
    pub(crate) fn new(window: Window) -> Self {
        Ledger { window, outstanding_packets: 0, outstanding_bytes: 0, owed_packets: 0, owed_bytes: 0 }
    }

    /// True when the sender may send now (what its budget says, seen from here).
    pub(crate) fn open(&self) -> bool {
        self.outstanding_packets < self.window.packets && self.outstanding_bytes < self.window.bytes
    }

    /// Records a frame of `len` payload bytes.
    ///
    /// # Errors
    /// The sender had no credit left: it broke the protocol.
    pub(crate) fn receive(&mut self, len: usize) -> Result<(), Overrun> {
        if !self.open() {
            return Err(Overrun { packets: self.outstanding_packets, bytes: self.outstanding_bytes });
        }
        self.outstanding_packets += 1;
        self.outstanding_bytes += len as u64;
        Ok(())
    }

    /// Counts a received frame of `len` bytes as consumed (sent on, reduced, read).
    /// Never more than was received: a frame this ledger did not count (one from
    /// before a child rejoined a stream) gives no credit back.
    pub(crate) fn consume(&mut self, len: usize) {
        if self.owed_packets >= self.outstanding_packets {
            return;
        }
        self.owed_packets += 1;
        self.owed_bytes = (self.owed_bytes + len as u64).min(self.outstanding_bytes);
    }

    /// The credit to send back now, if enough is owed to be worth a frame: half a
    /// window of packets or of bytes.
    pub(crate) fn take_grant(&mut self) -> Option<Grant> {
        let due = self.owed_packets >= self.window.packets.div_ceil(2)
            || self.owed_bytes >= self.window.bytes.div_ceil(2);
        if due {
            self.take_all()
        } else {
            None
        }
    }

    /// Everything owed, at once (for a local sender such as the tool, which needs no batching).
    pub(crate) fn take_all(&mut self) -> Option<Grant> {
        if self.owed_packets == 0 && self.owed_bytes == 0 {
            return None;
        }
        let g = Grant { packets: self.owed_packets, bytes: self.owed_bytes };
        self.outstanding_packets -= self.owed_packets;
        self.outstanding_bytes -= self.owed_bytes;
        self.owed_packets = 0;
        self.owed_bytes = 0;
        Some(g)
    }

    /// Frames received and not yet consumed.
    pub(crate) fn held(&self) -> (u32, u64) {
        (self.outstanding_packets - self.owed_packets, self.outstanding_bytes - self.owed_bytes)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const W: Window = Window { packets: 4, bytes: 100 };

    #[test]
    fn sender_and_receiver_agree_on_when_the_window_is_full() {
        let mut budget = Budget::new(W);
        let mut ledger = Ledger::new(W);
        let mut sent = 0;
        while budget.open() {
            budget.spend(30);
            ledger.receive(30).unwrap();
            sent += 1;
        }
        assert_eq!(sent, 4, "the fourth frame overshoots the bytes, a fifth may not go");
        assert!(!ledger.open());
        assert!(ledger.receive(1).is_err(), "a frame beyond the window is an overrun");
        ledger.consume(30);
        assert_eq!(ledger.take_grant(), None, "one packet is less than half a window");
        ledger.consume(30);
        let g = ledger.take_grant().unwrap();
        assert_eq!(g, Grant { packets: 2, bytes: 60 });
        assert!(budget.grant(g), "the grant reopens the sender");
        assert!(ledger.open());
        assert_eq!(ledger.held(), (2, 60));
    }

    #[test]
    fn one_frame_larger_than_the_window_goes_alone() {
        let mut budget = Budget::new(W);
        let mut ledger = Ledger::new(W);
        budget.spend(1000);
        ledger.receive(1000).unwrap();
        assert!(!budget.open() && !ledger.open());
        ledger.consume(1000);
        assert!(budget.grant(ledger.take_grant().unwrap()));
    }
}
