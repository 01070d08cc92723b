//! Upward flow control at a sender: the credits its parent granted, per stream.
//!
//! A sender starts every stream with [`UP_WINDOW`] credits and spends one per data
//! frame it sends up; the link's reader adds those the parent returns in
//! [`treecast_wire::FrameKind::Credit`] frames. Back-ends wait here; comm nodes keep
//! their own count in their upward state machine instead, so that one stream out
//! of credits never holds up another.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use treecast_wire::UP_WINDOW;

/// Per-stream send credits of one link, shared by its reader (which grants) and its senders.
#[derive(Debug, Default)]
pub struct SendCredits {
    streams: Mutex<HashMap<u32, Arc<Semaphore>>>,
}

/// One credit, taken but not yet spent: dropping it gives it back, [`Credit::spend`] uses it.
#[derive(Debug)]
pub struct Credit(OwnedSemaphorePermit);

impl Credit {
    /// Uses the credit up (call once the frame is queued on the link).
    pub fn spend(self) {
        self.0.forget();
    }
}

impl SendCredits {
    /// A table where every stream starts with [`UP_WINDOW`] credits.
    pub fn new() -> Arc<Self> {
        Arc::new(SendCredits::default())
    }

    fn stream(&self, id: u32) -> Arc<Semaphore> {
        // A poisoned table is still consistent: no code panics half-way through an insert.
        let mut streams = self.streams.lock().unwrap_or_else(PoisonError::into_inner);
        streams.entry(id).or_insert_with(|| Arc::new(Semaphore::new(UP_WINDOW as usize))).clone()
    }

    /// Waits for a credit on stream `id`. `None` would mean the table was closed,
    /// which it never is; a caller then sends without flow control rather than hang.
    ///
    /// Cancel safety: cancel safe; nothing is taken unless the call completes.
    pub async fn acquire(&self, id: u32) -> Option<Credit> {
        self.stream(id).acquire_owned().await.ok().map(Credit)
    }

    /// Adds `n` credits to stream `id` (from a credit frame).
    pub fn grant(&self, id: u32, n: u32) {
        let room = Semaphore::MAX_PERMITS / 2;
        let semaphore = self.stream(id);
        if semaphore.available_permits() < room {
            semaphore.add_permits(n as usize);
        }
    }

    /// Forgets stream `id` (closed): its credits are no longer needed.
    pub fn remove(&self, id: u32) {
        self.streams.lock().unwrap_or_else(PoisonError::into_inner).remove(&id);
    }

    /// Credits left on stream `id`.
    #[cfg(test)]
    fn available(&self, id: u32) -> usize {
        self.stream(id).available_permits()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_sender_waits_after_its_window_until_credits_come() {
        let credits = SendCredits::new();
        for _ in 0..UP_WINDOW {
            credits.acquire(7).await.unwrap().spend();
        }
        assert_eq!(credits.available(7), 0);
        assert_eq!(credits.available(8), UP_WINDOW as usize, "streams are independent");
        let waiting = tokio::time::timeout(Duration::from_millis(20), credits.acquire(7)).await;
        assert!(waiting.is_err(), "no credit left");
        credits.grant(7, 2);
        credits.acquire(7).await.unwrap().spend();
        let unspent = credits.acquire(7).await.unwrap();
        drop(unspent);
        assert_eq!(credits.available(7), 1, "a dropped credit goes back");
    }
}
