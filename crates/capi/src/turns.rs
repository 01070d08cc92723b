//! The order in which a stream's requests of one kind are served: a leaf that the
//! stream holds and the requests use.

use tokio::sync::watch;

/// Requests of one kind (sends, or receives) on one stream, started in the order they
/// were made: MPI's non-overtaking rule, so that two sends posted one after the other
/// arrive in that order and two receives get packets in the order they were posted.
#[derive(Debug)]
pub(crate) struct Turns {
    pub(crate) next: std::sync::atomic::AtomicU64,
    pub(crate) serving: watch::Sender<u64>,
}

impl Default for Turns {
    fn default() -> Self {
        Turns { next: std::sync::atomic::AtomicU64::new(0), serving: watch::Sender::new(0) }
    }
}
